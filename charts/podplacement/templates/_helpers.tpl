{{/*
The product's namespace. Fixed (DESIGN.md "Names"): the chart puts its objects there whatever
the release's namespace, creates it, and deletes it on `helm uninstall`, which is what runs
the controller's ordered uninstall (README "Uninstall").
*/}}
{{- define "podplacement.namespace" -}}
podplacement-system
{{- end }}

{{/* The label deploy/'s kustomizations put on every object of theirs. */}}
{{- define "podplacement.labels" -}}
app.kubernetes.io/part-of: podplacement
{{- end }}

{{/* The image of both Deployments: repository:tag, the tag defaulting to appVersion. */}}
{{- define "podplacement.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

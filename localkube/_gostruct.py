"""Render pod spec fragments the way kube-apiserver prints Go values in validation messages.

``field.Invalid`` prints a value as the JSON of the *internal* Go type: exported field names
(``MatchExpressions``, ``Key``), every field present (``"MatchFields":null``), map keys sorted.
The "pod updates may not change fields" error embeds a unified diff (3 lines of context, no file
header) of the old and the munged ``PodSpec`` rendered that way with one-space indentation.
The field tables below follow ``k8s.io/kubernetes/pkg/apis/core`` (v1.36) for the types a pod
like those of ``gates-d-mutable-directives-ungated.json`` uses, which makes those messages
byte-identical; other nested types keep their JSON order with capitalised names.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

# Internal Go struct fields, in declaration order: (json name, Go name, kind) where kind is the
# type name of a nested struct, "map", "list:<type>", or "" for a scalar/pointer.
_STRUCTS: dict[str, list[tuple[str, str, str]]] = {
    "PodSpec": [
        ("volumes", "Volumes", "list:Volume"),
        ("initContainers", "InitContainers", "list:Container"),
        ("containers", "Containers", "list:Container"),
        ("ephemeralContainers", "EphemeralContainers", "list:"),
        ("restartPolicy", "RestartPolicy", "str"),
        ("terminationGracePeriodSeconds", "TerminationGracePeriodSeconds", ""),
        ("activeDeadlineSeconds", "ActiveDeadlineSeconds", ""),
        ("dnsPolicy", "DNSPolicy", "str"),
        ("nodeSelector", "NodeSelector", "map"),
        ("serviceAccountName", "ServiceAccountName", "str"),
        ("automountServiceAccountToken", "AutomountServiceAccountToken", ""),
        ("nodeName", "NodeName", "str"),
        ("securityContext", "SecurityContext", "PodSecurityContext"),
        ("imagePullSecrets", "ImagePullSecrets", "list:LocalObjectReference"),
        ("hostname", "Hostname", "str"),
        ("subdomain", "Subdomain", "str"),
        ("setHostnameAsFQDN", "SetHostnameAsFQDN", ""),
        ("affinity", "Affinity", "Affinity"),
        ("schedulerName", "SchedulerName", "str"),
        ("tolerations", "Tolerations", "list:Toleration"),
        ("hostAliases", "HostAliases", "list:"),
        ("priorityClassName", "PriorityClassName", "str"),
        ("priority", "Priority", ""),
        ("preemptionPolicy", "PreemptionPolicy", ""),
        ("dnsConfig", "DNSConfig", ""),
        ("readinessGates", "ReadinessGates", "list:"),
        ("runtimeClassName", "RuntimeClassName", ""),
        ("overhead", "Overhead", "map"),
        ("enableServiceLinks", "EnableServiceLinks", ""),
        ("topologySpreadConstraints", "TopologySpreadConstraints", "list:"),
        ("os", "OS", ""),
        ("schedulingGates", "SchedulingGates", "list:PodSchedulingGate"),
        ("resourceClaims", "ResourceClaims", "list:"),
        ("resources", "Resources", ""),
        ("hostnameOverride", "HostnameOverride", ""),
    ],
    "Affinity": [
        ("nodeAffinity", "NodeAffinity", "NodeAffinity"),
        ("podAffinity", "PodAffinity", ""),
        ("podAntiAffinity", "PodAntiAffinity", ""),
    ],
    "NodeAffinity": [
        (
            "requiredDuringSchedulingIgnoredDuringExecution",
            "RequiredDuringSchedulingIgnoredDuringExecution",
            "NodeSelector",
        ),
        (
            "preferredDuringSchedulingIgnoredDuringExecution",
            "PreferredDuringSchedulingIgnoredDuringExecution",
            "list:PreferredSchedulingTerm",
        ),
    ],
    "NodeSelector": [("nodeSelectorTerms", "NodeSelectorTerms", "list:NodeSelectorTerm")],
    "NodeSelectorTerm": [
        ("matchExpressions", "MatchExpressions", "list:NodeSelectorRequirement"),
        ("matchFields", "MatchFields", "list:NodeSelectorRequirement"),
    ],
    "NodeSelectorRequirement": [
        ("key", "Key", "str"),
        ("operator", "Operator", "str"),
        ("values", "Values", "list:"),
    ],
    "PreferredSchedulingTerm": [
        ("weight", "Weight", "int"),
        ("preference", "Preference", "NodeSelectorTerm"),
    ],
    "Toleration": [
        ("key", "Key", "str"),
        ("operator", "Operator", "str"),
        ("value", "Value", "str"),
        ("effect", "Effect", "str"),
        ("tolerationSeconds", "TolerationSeconds", ""),
    ],
    "PodSchedulingGate": [("name", "Name", "str")],
    "LocalObjectReference": [("name", "Name", "str")],
    "Container": [
        ("name", "Name", "str"),
        ("image", "Image", "str"),
        ("command", "Command", "list:"),
        ("args", "Args", "list:"),
        ("workingDir", "WorkingDir", "str"),
        ("ports", "Ports", "list:ContainerPort"),
        ("envFrom", "EnvFrom", "list:"),
        ("env", "Env", "list:EnvVar"),
        ("resources", "Resources", "ResourceRequirements!"),
        ("resizePolicy", "ResizePolicy", "list:"),
        ("restartPolicy", "RestartPolicy", ""),
        ("restartPolicyRules", "RestartPolicyRules", "list:"),
        ("volumeMounts", "VolumeMounts", "list:VolumeMount"),
        ("volumeDevices", "VolumeDevices", "list:"),
        ("livenessProbe", "LivenessProbe", ""),
        ("readinessProbe", "ReadinessProbe", ""),
        ("startupProbe", "StartupProbe", ""),
        ("lifecycle", "Lifecycle", ""),
        ("terminationMessagePath", "TerminationMessagePath", "str"),
        ("terminationMessagePolicy", "TerminationMessagePolicy", "str"),
        ("imagePullPolicy", "ImagePullPolicy", "str"),
        ("securityContext", "SecurityContext", ""),
        ("stdin", "Stdin", "bool"),
        ("stdinOnce", "StdinOnce", "bool"),
        ("tty", "TTY", "bool"),
    ],
    "ContainerPort": [
        ("name", "Name", "str"),
        ("hostPort", "HostPort", "int"),
        ("containerPort", "ContainerPort", "int"),
        ("protocol", "Protocol", "str"),
        ("hostIP", "HostIP", "str"),
    ],
    "EnvVar": [("name", "Name", "str"), ("value", "Value", "str"), ("valueFrom", "ValueFrom", "")],
    "ResourceRequirements": [
        ("limits", "Limits", "map"),
        ("requests", "Requests", "map"),
        ("claims", "Claims", "list:"),
    ],
    "VolumeMount": [
        ("name", "Name", "str"),
        ("readOnly", "ReadOnly", "bool"),
        ("recursiveReadOnly", "RecursiveReadOnly", ""),
        ("mountPath", "MountPath", "str"),
        ("subPath", "SubPath", "str"),
        ("mountPropagation", "MountPropagation", ""),
        ("subPathExpr", "SubPathExpr", "str"),
    ],
    # The internal type holds the host namespaces that the v1 PodSpec keeps at its top level.
    "PodSecurityContext": [
        ("hostNetwork", "HostNetwork", "bool"),
        ("hostPID", "HostPID", "bool"),
        ("hostIPC", "HostIPC", "bool"),
        ("shareProcessNamespace", "ShareProcessNamespace", ""),
        ("hostUsers", "HostUsers", ""),
        ("seLinuxOptions", "SELinuxOptions", ""),
        ("windowsOptions", "WindowsOptions", ""),
        ("runAsUser", "RunAsUser", ""),
        ("runAsGroup", "RunAsGroup", ""),
        ("runAsNonRoot", "RunAsNonRoot", ""),
        ("supplementalGroups", "SupplementalGroups", "list:"),
        ("supplementalGroupsPolicy", "SupplementalGroupsPolicy", ""),
        ("fsGroup", "FSGroup", ""),
        ("fsGroupChangePolicy", "FSGroupChangePolicy", ""),
        ("sysctls", "Sysctls", "list:"),
        ("seccompProfile", "SeccompProfile", ""),
        ("appArmorProfile", "AppArmorProfile", ""),
        ("seLinuxChangePolicy", "SELinuxChangePolicy", ""),
    ],
}

_VOLUME_SOURCES = (
    "hostPath:HostPath emptyDir:EmptyDir gcePersistentDisk:GCEPersistentDisk "
    "awsElasticBlockStore:AWSElasticBlockStore gitRepo:GitRepo secret:Secret nfs:NFS "
    "iscsi:ISCSI glusterfs:Glusterfs persistentVolumeClaim:PersistentVolumeClaim rbd:RBD "
    "quobyte:Quobyte flexVolume:FlexVolume cinder:Cinder cephfs:CephFS flocker:Flocker "
    "downwardAPI:DownwardAPI fc:FC azureFile:AzureFile configMap:ConfigMap "
    "vsphereVolume:VsphereVolume azureDisk:AzureDisk photonPersistentDisk:PhotonPersistentDisk "
    "projected:Projected portworxVolume:PortworxVolume scaleIO:ScaleIO storageos:StorageOS "
    "csi:CSI ephemeral:Ephemeral image:Image"
)
# Volume embeds VolumeSource: Go's encoder flattens its fields into the volume.
_STRUCTS["Volume"] = [("name", "Name", "str")] + [
    (j, g, "ProjectedVolumeSource" if j == "projected" else "")
    for j, g in (pair.split(":") for pair in _VOLUME_SOURCES.split())
]
_STRUCTS["ProjectedVolumeSource"] = [
    ("sources", "Sources", "list:VolumeProjection"),
    ("defaultMode", "DefaultMode", ""),
]
_STRUCTS["VolumeProjection"] = [
    ("secret", "Secret", ""),
    ("downwardAPI", "DownwardAPI", "DownwardAPIProjection"),
    ("configMap", "ConfigMap", "ConfigMapProjection"),
    ("serviceAccountToken", "ServiceAccountToken", "ServiceAccountTokenProjection"),
    ("clusterTrustBundle", "ClusterTrustBundle", ""),
    ("podCertificate", "PodCertificate", ""),
]
_STRUCTS["ConfigMapProjection"] = [
    ("name", "Name", "str"),
    ("items", "Items", "list:KeyToPath"),
    ("optional", "Optional", ""),
]
_STRUCTS["KeyToPath"] = [("key", "Key", "str"), ("path", "Path", "str"), ("mode", "Mode", "")]
_STRUCTS["DownwardAPIProjection"] = [("items", "Items", "list:DownwardAPIVolumeFile")]
_STRUCTS["DownwardAPIVolumeFile"] = [
    ("path", "Path", "str"),
    ("fieldRef", "FieldRef", "ObjectFieldSelector"),
    ("resourceFieldRef", "ResourceFieldRef", ""),
    ("mode", "Mode", ""),
]
_STRUCTS["ObjectFieldSelector"] = [
    ("apiVersion", "APIVersion", "str"),
    ("fieldPath", "FieldPath", "str"),
]
_STRUCTS["ServiceAccountTokenProjection"] = [
    ("audience", "Audience", "str"),
    ("expirationSeconds", "ExpirationSeconds", ""),
    ("path", "Path", "str"),
]

# v1 PodSpec fields that live in the internal PodSecurityContext.
_HOST_NAMESPACE_FIELDS = ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "hostUsers")

_MAP_FIELDS = frozenset(
    {
        "nodeSelector",
        "overhead",
        "limits",
        "requests",
        "labels",
        "annotations",
        "data",
        "volumeAttributes",
        "claims",
        "allocatedResources",
    }
)
_GO_NAME_EXCEPTIONS = {
    "dnsPolicy": "DNSPolicy",
    "dnsConfig": "DNSConfig",
    "os": "OS",
    "hostIPC": "HostIPC",
    "hostPID": "HostPID",
    "uid": "UID",
    "apiVersion": "APIVersion",
    "ip": "IP",
    "podIPs": "PodIPs",
    "hostIPs": "HostIPs",
    "tty": "TTY",
    "setHostnameAsFQDN": "SetHostnameAsFQDN",
}


def _go_name(json_name: str) -> str:
    return _GO_NAME_EXCEPTIONS.get(json_name, json_name[:1].upper() + json_name[1:])


def _zero(kind: str) -> Any:
    if kind == "str":
        return ""
    if kind == "int":
        return 0
    if kind == "bool":
        return False
    if kind.endswith("!"):  # a struct value (not a pointer): its zero value is rendered
        return to_go({}, kind[:-1])
    return None


def to_go(value: Any, type_name: str = "") -> Any:
    """Convert a JSON API value into the shape Go's ``json.Marshal`` gives the internal type.

    Args:
        value: the value as the JSON API shows it (dicts, lists, scalars).
        type_name: one of the struct names above (``"NodeSelectorTerm"``...), ``"map"`` for a
            map field, or ``""`` for an unknown struct (keys capitalised, order kept).

    Returns:
        a plain value (dicts keep insertion order) ready for :func:`json.dumps`.
    """
    if value is None:
        return None
    if type_name == "map":
        return dict(sorted(value.items())) if isinstance(value, dict) else value
    if isinstance(value, list):
        inner = type_name[5:] if type_name.startswith("list:") else type_name
        return [to_go(v, inner) for v in value]
    if not isinstance(value, dict):
        return value
    struct = type_name.rstrip("!")
    fields = _STRUCTS.get(struct)
    if fields is None:
        return {_go_name(k): to_go(v, "map" if k in _MAP_FIELDS else "") for k, v in value.items()}
    if struct == "PodSpec" and any(k in value for k in _HOST_NAMESPACE_FIELDS):
        value = dict(value)
        security = dict(value.get("securityContext") or {})
        for key in _HOST_NAMESPACE_FIELDS:
            if key in value:
                security[key] = value.pop(key)
        value["securityContext"] = security
    out: dict[str, Any] = {}
    known = set()
    for json_name, go_name, kind in fields:
        known.add(json_name)
        if json_name in value and value[json_name] is not None:
            scalar = kind in ("str", "int", "bool")
            out[go_name] = to_go(value[json_name], "" if scalar else kind)
        else:
            out[go_name] = _zero(kind)
    # Fields newer than this table are still shown, so that no change is invisible.
    for key, sub in value.items():
        if key not in known:
            out[_go_name(key)] = to_go(sub, "map" if key in _MAP_FIELDS else "")
    return out


def go_value(value: Any, type_name: str = "") -> str:
    """Compact Go-style JSON of ``value`` as ``field.Invalid`` prints it (``null`` for nil)."""
    return json.dumps(to_go(value, type_name), separators=(",", ":"), ensure_ascii=False)


def spec_diff(old_spec: dict[str, Any], new_spec: dict[str, Any]) -> str:
    """Unified diff (context 3, no header) of two pod specs rendered as Go internal types.

    Returns:
        the hunks, each line ending in ``\\n`` (empty string when the renderings are equal).
    """
    a = json.dumps(to_go(old_spec, "PodSpec"), indent=1, ensure_ascii=False).split("\n")
    b = json.dumps(to_go(new_spec, "PodSpec"), indent=1, ensure_ascii=False).split("\n")
    lines = list(difflib.unified_diff(a, b, n=3, lineterm=""))
    return "".join(line + "\n" for line in lines[2:])

"""Render pod spec fragments the way kube-apiserver prints Go values in validation messages.

``field.Invalid`` prints a value as the JSON of the *internal* Go type: exported field names
(``MatchExpressions``, ``Key``), every field present (``"MatchFields":null``), map keys sorted.
The "pod updates may not change fields" error embeds a unified diff (3 lines of context, no file
header) of the old and the munged ``PodSpec`` rendered that way with one-space indentation
(``gates-d-mutable-directives-ungated.json``). Field orders below are those of
``k8s.io/kubernetes/pkg/apis/core`` types; nested types not listed keep their JSON order with
capitalised names, so line numbers can differ from the real server's while the changed lines match.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

# Internal Go struct fields, in declaration order: (json name, Go name, kind) where kind is the
# type name of a nested struct, "map", "list:<type>", or "" for a scalar/pointer.
_STRUCTS: dict[str, list[tuple[str, str, str]]] = {
    "PodSpec": [
        ("volumes", "Volumes", "list:"),
        ("initContainers", "InitContainers", "list:"),
        ("containers", "Containers", "list:"),
        ("ephemeralContainers", "EphemeralContainers", "list:"),
        ("restartPolicy", "RestartPolicy", "str"),
        ("terminationGracePeriodSeconds", "TerminationGracePeriodSeconds", ""),
        ("activeDeadlineSeconds", "ActiveDeadlineSeconds", ""),
        ("dnsPolicy", "DNSPolicy", "str"),
        ("nodeSelector", "NodeSelector", "map"),
        ("serviceAccountName", "ServiceAccountName", "str"),
        ("automountServiceAccountToken", "AutomountServiceAccountToken", ""),
        ("nodeName", "NodeName", "str"),
        ("securityContext", "SecurityContext", ""),
        ("imagePullSecrets", "ImagePullSecrets", "list:"),
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
}

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
    fields = _STRUCTS.get(type_name)
    if fields is None:
        return {_go_name(k): to_go(v, "map" if k in _MAP_FIELDS else "") for k, v in value.items()}
    out: dict[str, Any] = {}
    for json_name, go_name, kind in fields:
        if json_name in value and value[json_name] is not None:
            out[go_name] = to_go(value[json_name], kind if kind not in ("str", "int") else "")
        else:
            out[go_name] = _zero(kind)
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

"""Pod defaulting and validation rules of kube-apiserver v1.36 that podplacement depends on.

Pure functions over the JSON ``Pod`` dict (no I/O):

* :func:`prepare_pod_create` - the scheme defaults, the ServiceAccount and
  DefaultTolerationSeconds admission defaults, ``PrepareForCreate`` (``status.phase: Pending``,
  ``qosClass``, the ``PodScheduled=False/SchedulingGated`` condition) and create validation
  (name, containers, scheduling gates). Idempotent: localkube calls it before and after the
  admission webhooks.
* :func:`validate_pod_update` - ``ValidatePodUpdate``: scheduling gates may only be removed
  (KEP-3521), a gated pod's nodeSelector/nodeAffinity may only be narrowed (KEP-3838), every
  other spec change outside the mutable fields is forbidden with a diff.

Messages and field paths are those of ``shared/reference/gates-*.json`` and ``errors.json``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

import localkube._gojson as _gojson
from localkube._gostruct import go_value, spec_diff
from localkube.errors import StatusError, invalid
from podplacement.rules.podspec import compute_qos_class, quantity_exact

# --- Quantities and QoS -------------------------------------------------------------------
# One implementation of the quantity grammar and of the QoS rule: the product's
# (rules.podspec, apimachinery ``ParseQuantity`` and ``pkg/apis/core/helper/qos``).
# Only the canonical text the API server stores (``resource.Quantity.String``) is this
# module's own.

_QUANTITY_SUFFIX_RE = re.compile(
    r"^[+-]?[0-9.]+([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


_DECIMAL_SUFFIXES = {
    -9: "n",
    -6: "u",
    -3: "m",
    0: "",
    3: "k",
    6: "M",
    9: "G",
    12: "T",
    15: "P",
    18: "E",
}
_BINARY_SUFFIXES = {0: "", 1: "Ki", 2: "Mi", 3: "Gi", 4: "Ti", 5: "Pi", 6: "Ei"}


def canonical_quantity(value: str | int | float) -> str:
    """The string kube-apiserver stores for a quantity (``resource.Quantity.String``).

    The suffix family of the input is kept (binary ``Ki``..., decimal ``m``/``k``..., or an
    exponent ``e3``) and the largest unit that keeps the number an integer is chosen:
    ``"1000m"`` → ``"1"``, ``"0.5"`` → ``"500m"``, ``"1024Mi"`` → ``"1Gi"``,
    ``"1536Mi"`` stays, ``"2000"`` → ``"2k"``. Precision below nano-units is rounded up, and a
    binary quantity below 1024 or with a fractional byte count is shown in decimal form.

    Raises:
        rules.podspec.QuantityError (a ValueError): not a quantity.
    """
    number = quantity_exact(value)
    if number == 0:
        return "0"
    text = str(value).strip()
    found = _QUANTITY_SUFFIX_RE.match(text) if isinstance(value, str) else None
    suffix = (found.group(1) or "") if found else ""
    binary = suffix.endswith("i")
    exponent_form = suffix[:1] in ("e", "E")
    sign = "-" if number < 0 else ""
    magnitude = abs(number)
    if binary and magnitude >= 1024 and magnitude.denominator == 1:
        whole = int(magnitude)
        power = 0
        while whole % 1024 == 0 and power < 6:
            whole //= 1024
            power += 1
        return f"{sign}{whole}{_BINARY_SUFFIXES[power]}"
    # Decimal: round up to nano units, then take the largest multiple-of-3 exponent that
    # leaves an integer mantissa.
    nanos = math.ceil(magnitude * 10**9)
    exponent = -9
    while nanos % 1000 == 0 and exponent < 18:
        nanos //= 1000
        exponent += 3
    if exponent_form:
        return f"{sign}{nanos}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{nanos}{_DECIMAL_SUFFIXES[exponent]}"


# --- Defaulting ---------------------------------------------------------------------------

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
DEFAULT_TOLERATION_SECONDS = 300
SCHEDULING_GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"


def image_pull_policy(image: str) -> str:
    """``Always`` for a ``:latest`` or untagged, undigested image, else ``IfNotPresent``.

    Source: ``SetDefaults_Container`` with ``parsers.ParseImageName`` (no tag and no digest
    means tag ``latest``).
    """
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    if not tag and not digest:
        tag = "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _canonical_resources(resources: Any) -> None:
    for key in ("limits", "requests"):
        quantities = resources.get(key) if isinstance(resources, dict) else None
        if not isinstance(quantities, dict):
            continue
        for name, raw in quantities.items():
            try:
                quantities[name] = canonical_quantity(raw)
            except ValueError:
                continue  # left for validation to report


def _default_container(container: dict[str, Any]) -> None:
    resources = container.setdefault("resources", {})
    _canonical_resources(resources)
    limits = resources.get("limits")
    if isinstance(limits, dict) and limits:
        requests = resources.setdefault("requests", {})
        for name, quantity in limits.items():
            requests.setdefault(name, quantity)
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    if "imagePullPolicy" not in container and isinstance(container.get("image"), str):
        container["imagePullPolicy"] = image_pull_policy(container["image"])


def _default_tolerations(spec: dict[str, Any]) -> None:
    """DefaultTolerationSeconds admission: tolerate not-ready/unreachable NoExecute for 300 s
    unless a toleration already covers that taint (same or empty key, NoExecute or empty
    effect; ``plugin/pkg/admission/defaulttolerationseconds``)."""
    tolerations: list[dict[str, Any]] = list(spec.get("tolerations") or [])

    def tolerates(key: str) -> bool:
        # The plugin's test: an empty key tolerates every taint, an empty effect every effect.
        return any(
            t.get("key", "") in ("", key) and t.get("effect", "") in ("", "NoExecute")
            for t in tolerations
        )

    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        if not tolerates(key):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    spec["tolerations"] = tolerations


def default_pod(pod: dict[str, Any]) -> None:
    """Apply in place the defaults a pod gets before the admission webhooks see it.

    Scheme defaults (``SetDefaults_PodSpec``/``_Container``: restartPolicy Always, dnsPolicy
    ClusterFirst, terminationGracePeriodSeconds 30, schedulerName default-scheduler,
    securityContext {}, enableServiceLinks true, termination message path/policy,
    imagePullPolicy, an image volume's pullPolicy alike, port protocol TCP, requests from
    limits), the ServiceAccount admission
    (serviceAccountName/serviceAccount ``default``; no token volume), Priority admission
    (priority 0, preemptionPolicy PreemptLowerPriority) and DefaultTolerationSeconds. Fields
    already set are kept, so calling it twice changes nothing.
    """
    spec = pod.setdefault("spec", {})
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                _default_container(container)
    for volume in spec.get("volumes") or []:
        source = volume.get("image") if isinstance(volume, dict) else None
        # an image volume's pullPolicy is defaulted as a container's imagePullPolicy
        # (KEP-4639; checked on v1.36.2: tests/test_tenant_imagevol_realcluster.py)
        if (isinstance(source, dict) and "pullPolicy" not in source
                and isinstance(source.get("reference"), str)):
            source["pullPolicy"] = image_pull_policy(source["reference"])
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = account
    spec["serviceAccount"] = account
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    _default_tolerations(spec)
    spec.setdefault("priority", 0)
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    normalize_pod(pod)


def normalize_pod(pod: dict[str, Any]) -> None:
    """Drop what Go's ``omitempty`` drops on a round trip: an empty ``spec.schedulingGates``.

    (``gates-b-remove-gate.json``: removing the last gate, or a merge patch with
    ``schedulingGates: []``, leaves no ``schedulingGates`` field.)
    """
    spec = pod.get("spec")
    if isinstance(spec, dict) and "schedulingGates" in spec and not spec["schedulingGates"]:
        del spec["schedulingGates"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _prepare_status(pod: dict[str, Any]) -> None:
    """``podStrategy.PrepareForCreate``: a fresh Pending status with qosClass and, for a gated
    pod, the ``PodScheduled=False`` ``SchedulingGated`` condition. A status already prepared
    (same phase, condition present) is kept so a second call is a no-op."""
    old = pod.get("status") or {}
    status: dict[str, Any] = {"phase": "Pending"}
    if (pod.get("spec") or {}).get("schedulingGates"):
        existing = [
            c
            for c in old.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
        ]
        status["conditions"] = existing or [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": _now(),
                "reason": "SchedulingGated",
                "message": SCHEDULING_GATED_MESSAGE,
            }
        ]
    status["qosClass"] = compute_qos_class(pod)
    pod["status"] = status


# --- Validation helpers (k8s.io/apimachinery/pkg/util/validation) -------------------------

_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN_RE = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_RE = re.compile(f"^{_QUALIFIED_NAME_FMT}$")
_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """``validation.RegexError``, including its double space after each example's comma."""
    out = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            out += " or "
        out += f"'{example}', "
    return out + f"regex used for validation is '{fmt}')"


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: the list of problems (empty when valid)."""
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        errors.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def qualified_name_errors(value: str) -> list[str]:
    """``IsQualifiedName`` (``[prefix/]name``, as used for label keys and scheduling gates)."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + m for m in dns1123_subdomain_errors(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME_RE.match(name):
        errors.append(
            "name part "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def _go_quote(value: Any) -> str:
    """How ``field.Invalid``/``Duplicate`` print a scalar: strings quoted, numbers bare."""
    if isinstance(value, str):
        return go_value(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cause_invalid(field: str, value_text: str, detail: str) -> dict[str, str]:
    return {
        "reason": "FieldValueInvalid",
        "message": f"Invalid value: {value_text}: {detail}",
        "field": field,
    }


def _cause_required(field: str, detail: str = "") -> dict[str, str]:
    message = "Required value" + (f": {detail}" if detail else "")
    return {"reason": "FieldValueRequired", "message": message, "field": field}


def _cause_forbidden(field: str, detail: str) -> dict[str, str]:
    return {"reason": "FieldValueForbidden", "message": f"Forbidden: {detail}", "field": field}


def _cause_duplicate(field: str, value_text: str) -> dict[str, str]:
    return {
        "reason": "FieldValueDuplicate",
        "message": f"Duplicate value: {value_text}",
        "field": field,
    }


def _scheduling_gate_causes(gates: Any) -> list[dict[str, str]]:
    """``validateSchedulingGates``: qualified names, no duplicates."""
    causes: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, gate in enumerate(gates or []):
        name = gate.get("name", "") if isinstance(gate, dict) else ""
        path = f"spec.schedulingGates[{i}]"
        for message in qualified_name_errors(name):
            causes.append(_cause_invalid(path, _go_quote(name), message))
        if name in seen:
            causes.append(_cause_duplicate(path, _go_quote(name)))
        seen.add(name)
    return causes


def _requirement_causes(req: Any, path: str) -> list[dict[str, str]]:
    """``ValidateNodeSelectorRequirement`` (matchExpressions)."""
    causes: list[dict[str, str]] = []
    if not isinstance(req, dict):
        return causes
    operator = req.get("operator", "")
    values = req.get("values") or []
    if operator in ("In", "NotIn"):
        if not values:
            causes.append(
                _cause_required(
                    f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                )
            )
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            causes.append(
                _cause_forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            causes.append(
                _cause_required(
                    f"{path}.values",
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )
            )
    else:
        causes.append(
            _cause_invalid(f"{path}.operator", _go_quote(operator), "not a valid selector operator")
        )
    key = req.get("key", "")
    for message in qualified_name_errors(key):
        causes.append(_cause_invalid(f"{path}.key", _go_quote(key), message))
    return causes


def _field_requirement_causes(req: Any, path: str) -> list[dict[str, str]]:
    """``validateNodeFieldSelectorRequirement`` (matchFields): only ``metadata.name``, and
    ``In``/``NotIn`` with exactly one value."""
    causes: list[dict[str, str]] = []
    if not isinstance(req, dict):
        return causes
    operator = req.get("operator", "")
    values = req.get("values") or []
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            causes.append(
                _cause_required(
                    f"{path}.values",
                    "must be only one value when `operator` is 'In' or 'NotIn' for node field "
                    "selector",
                )
            )
    else:
        causes.append(
            _cause_invalid(f"{path}.operator", _go_quote(operator), "not a valid selector operator")
        )
    key = req.get("key", "")
    if key != "metadata.name":
        causes.append(
            _cause_invalid(f"{path}.key", _go_quote(key), "not a valid field selector key")
        )
    else:
        for i, value in enumerate(values):
            for message in dns1123_subdomain_errors(str(value)):
                causes.append(_cause_invalid(f"{path}.values[{i}]", _go_quote(value), message))
    return causes


def _term_causes(term: Any, path: str) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = []
    if not isinstance(term, dict):
        return causes
    for j, req in enumerate(term.get("matchExpressions") or []):
        causes.extend(_requirement_causes(req, f"{path}.matchExpressions[{j}]"))
    for j, req in enumerate(term.get("matchFields") or []):
        causes.extend(_field_requirement_causes(req, f"{path}.matchFields[{j}]"))
    return causes


def node_affinity_causes(spec: dict[str, Any]) -> list[dict[str, str]]:
    """Validation of ``spec.affinity.nodeAffinity`` (``ValidateNodeSelector``,
    ``ValidatePreferredSchedulingTerms``): at least one required term, valid operators and
    keys, one node name per ``matchFields`` requirement, preferred weights 1-100.

    Returns:
        the field causes (empty when valid).
    """
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if not isinstance(node_affinity, dict):
        return []
    causes: list[dict[str, str]] = []
    base = "spec.affinity.nodeAffinity"
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        terms_path = f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            causes.append(_cause_required(terms_path, "must have at least one node selector term"))
        for i, term in enumerate(terms):
            causes.extend(_term_causes(term, f"{terms_path}[{i}]"))
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    for i, item in enumerate(preferred):
        if not isinstance(item, dict):
            continue
        path = f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        weight = item.get("weight", 0)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            causes.append(
                _cause_invalid(f"{path}.weight", _go_quote(weight), "must be in the range 1-100")
            )
        causes.extend(_term_causes(item.get("preference") or {}, f"{path}.preference"))
    return causes


def validate_pod_create(pod: dict[str, Any]) -> None:
    """The create validation localkube implements (subset of ``ValidatePodCreate``).

    Checks: a name or generateName is given and the name is a DNS-1123 subdomain; at least one
    container; every container has a name and an image; scheduling gates are qualified names
    without duplicates.

    Raises:
        StatusError: 422 ``Pod "<name>" is invalid: ...`` with one cause per problem.
    """
    meta = pod.get("metadata") or {}
    name = meta.get("name") or ""
    spec = pod.get("spec") or {}
    causes: list[dict[str, str]] = []
    if not name and not meta.get("generateName"):
        causes.append(_cause_required("metadata.name", "name or generateName is required"))
    elif name:
        for message in dns1123_subdomain_errors(name):
            causes.append(_cause_invalid("metadata.name", _go_quote(name), message))
    containers = spec.get("containers") or []
    if not containers:
        causes.append(_cause_required("spec.containers"))
    for key in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(key) or []):
            if not isinstance(container, dict):
                continue
            if not container.get("name"):
                causes.append(_cause_required(f"spec.{key}[{i}].name"))
            if not container.get("image"):
                causes.append(_cause_required(f"spec.{key}[{i}].image"))
    causes.extend(_scheduling_gate_causes(spec.get("schedulingGates")))
    causes.extend(node_affinity_causes(spec))
    if causes:
        raise invalid("Pod", name, causes)


def prepare_pod_create(pod: dict[str, Any]) -> None:
    """Default, prepare and validate a new pod in place (idempotent).

    Applies :func:`default_pod`, then ``PrepareForCreate`` (status Pending, qosClass,
    ``PodScheduled=False/SchedulingGated`` when gated), then :func:`validate_pod_create`.

    Raises:
        StatusError: 422 for an invalid pod (``errors.json``; the duplicate gate case of
            ``admission-d-g-webhook-failures.json``).
    """
    default_pod(pod)
    _prepare_status(pod)
    validate_pod_create(pod)


# --- Update validation (ValidatePodUpdate) ------------------------------------------------

UPDATE_FORBIDDEN_MESSAGE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)
_NODE_AFFINITY_PATH = "spec.affinity.nodeAffinity"
_TERMS_PATH = (
    f"{_NODE_AFFINITY_PATH}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
)


def _semantic(value: Any) -> Any:
    """Normalise for ``apiequality.Semantic.DeepEqual``: nil and empty slices are equal."""
    if isinstance(value, dict):
        return {k: _semantic(v) for k, v in value.items() if v is not None and v != []}
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    return value


def _semantically_equal(a: Any, b: Any) -> bool:
    return a == b or bool(_semantic(a) == _semantic(b))


def _term_mutation_causes(
    path: str, new_term: dict[str, Any], old_term: dict[str, Any]
) -> list[dict[str, str]]:
    """``validateNodeSelectorTermMutation``: old expressions/fields must be a prefix of the new."""
    detail = "only additions are allowed (no mutations or deletions)"
    bad = _cause_invalid(path, go_value(new_term, "NodeSelectorTerm"), detail)
    for key in ("matchExpressions", "matchFields"):
        old_list = old_term.get(key) or []
        new_list = new_term.get(key) or []
        if len(old_list) > len(new_list):
            return [bad]
    for key in ("matchExpressions", "matchFields"):
        old_list = old_term.get(key) or []
        new_list = new_term.get(key) or []
        for i, old_expr in enumerate(old_list):
            if not _semantically_equal(old_expr, new_list[i]):
                return [bad]
    return []


def _node_affinity_mutation_causes(new_na: Any, old_na: Any) -> list[dict[str, str]]:
    """``validateNodeAffinityMutation`` (KEP-3838): with non-empty old required terms, the term
    count must stay the same and each term may only gain expressions/fields at its end."""
    if not isinstance(old_na, dict):
        return []
    old_required = old_na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if old_required is None:
        return []
    old_terms = old_required.get("nodeSelectorTerms") or []
    new_terms = None
    if isinstance(new_na, dict):
        new_required = new_na.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(new_required, dict):
            new_terms = new_required.get("nodeSelectorTerms")
    if not old_terms:
        return []
    if len(old_terms) != len(new_terms or []):
        return [
            _cause_invalid(
                _TERMS_PATH,
                go_value(new_terms, "list:NodeSelectorTerm"),
                "no additions/deletions to non-empty NodeSelectorTerms list are allowed",
            )
        ]
    causes: list[dict[str, str]] = []
    for i, old_term in enumerate(old_terms):
        causes.extend(_term_mutation_causes(f"{_TERMS_PATH}[{i}]", (new_terms or [])[i], old_term))
    return causes


def _node_selector_mutation_causes(new_sel: Any, old_sel: Any) -> list[dict[str, str]]:
    """``validateNodeSelectorMutation``: keys may be added, never changed or removed."""
    new_map = new_sel or {}
    for key, value in (old_sel or {}).items():
        if new_map.get(key) != value:
            return [
                _cause_invalid(
                    "spec.nodeSelector",
                    go_value(new_sel, "map"),
                    "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                )
            ]
    return []


def _toleration_causes(new: list[Any], old: list[Any]) -> list[dict[str, str]]:
    """``validateOnlyAddedTolerations``: each old toleration must still be there (its
    tolerationSeconds may change)."""
    for old_tol in old:
        found = False
        for new_tol in new:
            a = {k: v for k, v in old_tol.items() if k != "tolerationSeconds"}
            b = {k: v for k, v in new_tol.items() if k != "tolerationSeconds"}
            if _semantically_equal(a, b):
                found = True
                break
        if not found:
            return [
                _cause_forbidden(
                    "spec.tolerations",
                    "existing toleration can not be modified except its tolerationSeconds",
                )
            ]
    return []


def _gate_causes(new_gates: list[Any], old_gates: list[Any]) -> list[dict[str, str]]:
    """``validateOnlyDeletedSchedulingGates`` (KEP-3521): a gate absent from the old pod is new."""
    old_names = {g.get("name") for g in old_gates if isinstance(g, dict)}
    added: dict[str, int] = {}
    for i, gate in enumerate(new_gates):
        name = gate.get("name", "") if isinstance(gate, dict) else ""
        added[name] = i
    causes = []
    for name, i in sorted(added.items(), key=lambda item: item[1]):
        if name in old_names:
            continue
        causes.append(
            _cause_forbidden(
                f"spec.schedulingGates[{i}].name",
                f"only deletion is allowed, but found new scheduling gate '{name}'",
            )
        )
    return causes


def _metadata_causes(new_meta: dict[str, Any], old_meta: dict[str, Any]) -> list[dict[str, str]]:
    causes = []
    for key in ("name", "namespace", "uid"):
        if key in new_meta and new_meta.get(key) != old_meta.get(key):
            causes.append(
                _cause_invalid(
                    f"metadata.{key}", _go_quote(new_meta.get(key)), "field is immutable"
                )
            )
    return causes


def _munge_scheduling_directives(munged: dict[str, Any], old_spec: dict[str, Any]) -> None:
    """For a gated pod, put the old nodeSelector/nodeAffinity into the munged spec so the final
    equality check ignores the (separately validated) narrowing."""
    if "nodeSelector" in old_spec:
        munged["nodeSelector"] = old_spec["nodeSelector"]
    else:
        munged.pop("nodeSelector", None)
    old_aff = old_spec.get("affinity")
    new_aff = munged.get("affinity")
    old_na = old_aff.get("nodeAffinity") if isinstance(old_aff, dict) else None
    if new_aff is None and old_na is not None:
        munged["affinity"] = {"nodeAffinity": old_na}
    elif (
        isinstance(new_aff, dict)
        and old_aff is None
        and not new_aff.get("podAffinity")
        and not new_aff.get("podAntiAffinity")
    ):
        munged.pop("affinity", None)
    elif isinstance(new_aff, dict) and old_aff is not None:
        new_aff = dict(new_aff)
        if old_na is None:
            new_aff.pop("nodeAffinity", None)
        else:
            new_aff["nodeAffinity"] = old_na
        munged["affinity"] = new_aff


def validate_pod_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Check an update of a pod (PUT or PATCH of the main resource) against the stored pod.

    Rules (``ValidatePodUpdate``, ``gates-a/b/c/d-*.json``): metadata name/namespace/uid are
    immutable; containers cannot be added or removed and need an image; activeDeadlineSeconds
    may only be set or lowered; tolerations may only be added; scheduling gates may only be
    removed; on a pod that *was* gated, nodeSelector may gain keys and required node affinity
    terms may gain trailing expressions/fields (KEP-3838); any other spec change is forbidden
    with the Go-style diff of the spec. ``new`` is normalised in place (an emptied
    ``schedulingGates`` is dropped, as the real server's encoding does).

    Raises:
        StatusError: 422 ``Pod "<name>" is invalid: ...`` (causes as the real server sends them).
    """
    normalize_pod(new)
    name = (new.get("metadata") or {}).get("name") or (old.get("metadata") or {}).get("name", "")
    old_spec: dict[str, Any] = old.get("spec") or {}
    new_spec: dict[str, Any] = new.get("spec") or {}
    causes = _metadata_causes(new.get("metadata") or {}, old.get("metadata") or {})
    causes.extend(_scheduling_gate_causes(new_spec.get("schedulingGates")))
    causes.extend(node_affinity_causes(new_spec))

    for key in ("containers", "initContainers"):
        old_list = old_spec.get(key) or []
        new_list = new_spec.get(key) or []
        if len(old_list) != len(new_list):
            causes.append(
                _cause_forbidden(f"spec.{key}", "pod updates may not add or remove containers")
            )
            raise invalid("Pod", name, causes)
        for i, container in enumerate(new_list):
            if isinstance(container, dict) and not container.get("image"):
                causes.append(_cause_required(f"spec.{key}[{i}].image"))

    new_ads = new_spec.get("activeDeadlineSeconds")
    old_ads = old_spec.get("activeDeadlineSeconds")
    if new_ads is not None:
        if not isinstance(new_ads, int) or new_ads < 0 or new_ads > 2**31 - 1:
            causes.append(
                _cause_invalid(
                    "spec.activeDeadlineSeconds",
                    _go_quote(new_ads),
                    "must be between 0 and 2147483647, inclusive",
                )
            )
            raise invalid("Pod", name, causes)
        if old_ads is not None and old_ads < new_ads:
            causes.append(
                _cause_invalid(
                    "spec.activeDeadlineSeconds",
                    _go_quote(new_ads),
                    "must be less than or equal to previous value",
                )
            )
            raise invalid("Pod", name, causes)
    elif old_ads is not None:
        causes.append(
            _cause_invalid(
                "spec.activeDeadlineSeconds",
                "null",
                "must not update from a positive integer to nil value",
            )
        )

    causes.extend(
        _toleration_causes(new_spec.get("tolerations") or [], old_spec.get("tolerations") or [])
    )
    causes.extend(
        _gate_causes(new_spec.get("schedulingGates") or [], old_spec.get("schedulingGates") or [])
    )

    if not _semantically_equal(new_spec, old_spec):
        munged = _gojson.clone(new_spec)
        for key in ("containers", "initContainers"):
            for container, old_container in zip(
                munged.get(key) or [], old_spec.get(key) or [], strict=False
            ):
                if isinstance(container, dict) and isinstance(old_container, dict):
                    container["image"] = old_container.get("image")
        for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
            if key in old_spec:
                munged[key] = _gojson.clone(old_spec[key])
            else:
                munged.pop(key, None)
        old_tgps = old_spec.get("terminationGracePeriodSeconds")
        if (
            isinstance(old_tgps, int)
            and old_tgps < 0
            and munged.get("terminationGracePeriodSeconds") == 1
        ):
            munged["terminationGracePeriodSeconds"] = old_tgps
        if old_spec.get("schedulingGates"):
            causes.extend(
                _node_selector_mutation_causes(
                    new_spec.get("nodeSelector"), old_spec.get("nodeSelector")
                )
            )
            new_aff = new_spec.get("affinity")
            old_aff = old_spec.get("affinity")
            causes.extend(
                _node_affinity_mutation_causes(
                    new_aff.get("nodeAffinity") if isinstance(new_aff, dict) else None,
                    old_aff.get("nodeAffinity") if isinstance(old_aff, dict) else None,
                )
            )
            _munge_scheduling_directives(munged, old_spec)
        if not _semantically_equal(munged, old_spec):
            diff = spec_diff(old_spec, munged)
            causes.append(_cause_forbidden("spec", f"{UPDATE_FORBIDDEN_MESSAGE}\n{diff}"))
    if causes:
        raise invalid("Pod", name, causes)


__all__ = [
    "StatusError",
    "default_pod",
    "image_pull_policy",
    "normalize_pod",
    "prepare_pod_create",
    "qualified_name_errors",
    "validate_pod_create",
    "validate_pod_update",
]

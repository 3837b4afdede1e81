"""Create/update rules of the built-in types other than pods (pods are :mod:`localkube.podrules`).

What the real kube-apiserver does at create or update for namespaces, nodes
(TaintNodesByCondition, ``node-create.json``), events (core/v1 and events.k8s.io/v1 share one
storage; field mapping and validation from ``events.json``), leases (MicroTime parsing,
``leases.json``), MutatingWebhookConfigurations (defaults from
``admission-webhook-configuration.json``) and CustomResourceDefinitions (status conditions,
``crd-podplacementconfig.json``). Pure functions over plain dicts; they raise
:class:`~localkube.errors.StatusError` with the recorded bodies.
"""

from __future__ import annotations

import re
from typing import Any

from localkube.errors import StatusError, bad_request, invalid
from localkube.schema import supported_rule

MICROTIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_PREFIX_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")
_QUALIFIED_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def check_microtime(kind: str, value: Any) -> None:
    """Parse a ``metav1.MicroTime`` string as Go's RFC3339Micro layout does.

    Raises:
        StatusError: 400 ``<Kind> in version "v1" cannot be handled as a <Kind>: parsing time
            ...`` when the value lacks the 6-digit fraction or is not a time (``leases.json``).
    """
    if value is None or (isinstance(value, str) and _MICRO_RE.match(value)):
        return
    text = str(value)
    m = _PREFIX_RE.match(text)
    if m:
        rest, elem = text[m.end():], ".000000"
    else:
        rest, elem = text, "2006"
    raise bad_request(
        f'{kind} in version "v1" cannot be handled as a {kind}: parsing time "{text}" as '
        f'"{MICROTIME_LAYOUT}": cannot parse "{rest}" as "{elem}"'
    )


# --- namespaces / nodes -----------------------------------------------------------------


def prepare_namespace(ns: dict[str, Any]) -> None:
    """Namespace defaults: the ``kubernetes.io/metadata.name`` label, ``kubernetes``
    finalizer and phase Active."""
    meta = ns["metadata"]
    labels = dict(meta.get("labels") or {})
    labels["kubernetes.io/metadata.name"] = meta["name"]
    meta["labels"] = labels
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns["status"] = {"phase": "Active"}


def prepare_node(node: dict[str, Any]) -> None:
    """TaintNodesByCondition: a new node without a Ready condition gets the
    ``node.kubernetes.io/not-ready:NoSchedule`` taint; status gets the zero nodeInfo."""
    spec = node.setdefault("spec", {})
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if not ready:
        taints = list(spec.get("taints") or [])
        if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
            taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
        spec["taints"] = taints
    status = node.setdefault("status", {})
    status.setdefault("daemonEndpoints", {"kubeletEndpoint": {"Port": 0}})
    status.setdefault("nodeInfo", {k: "" for k in (
        "machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
        "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion", "operatingSystem",
        "architecture")})


# --- events -----------------------------------------------------------------------------

_V1_TO_CORE = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_CORE_TO_V1 = {v: k for k, v in _V1_TO_CORE.items()}


def event_to_core(ev: dict[str, Any]) -> dict[str, Any]:
    """events.k8s.io/v1 Event -> core/v1 Event (the storage form)."""
    out: dict[str, Any] = {"kind": "Event", "apiVersion": "v1"}
    for k, v in ev.items():
        if k in ("kind", "apiVersion"):
            continue
        out[_V1_TO_CORE.get(k, k)] = v
    return out


def event_to_v1(ev: dict[str, Any]) -> dict[str, Any]:
    """core/v1 Event -> events.k8s.io/v1 Event (fields renamed as the real conversion does)."""
    out: dict[str, Any] = {"kind": "Event", "apiVersion": "events.k8s.io/v1"}
    for k, v in ev.items():
        if k in ("kind", "apiVersion"):
            continue
        if k == "count" and not v:
            continue
        out[_CORE_TO_V1.get(k, k)] = v
    return out


def prepare_core_event(ev: dict[str, Any]) -> None:
    """core/v1 Event defaults and validation (``events.json``).

    Raises:
        StatusError: 422 when ``involvedObject.namespace`` differs from the event's namespace.
    """
    meta = ev["metadata"]
    inv = ev.get("involvedObject") or {}
    if inv.get("namespace") and inv["namespace"] != meta.get("namespace"):
        raise invalid("Event", meta.get("name", ""), [{
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "{inv["namespace"]}": does not match event.namespace',
            "field": "involvedObject.namespace"}])
    check_microtime("Event", ev.get("eventTime"))
    ev.setdefault("source", {})
    ev.setdefault("firstTimestamp", None)
    ev.setdefault("lastTimestamp", None)
    ev.setdefault("eventTime", None)
    ev.setdefault("reportingComponent", "")
    ev.setdefault("reportingInstance", "")


def validate_v1_event(ev: dict[str, Any]) -> None:
    """events.k8s.io/v1 create validation (``events.json``).

    Raises:
        StatusError: 400 for a MicroTime without microseconds; 422 for a missing eventTime,
            reportingController or action, a type other than Normal/Warning, a note over 1 kB.
    """
    check_microtime("Event", ev.get("eventTime"))
    check_microtime("Event", (ev.get("series") or {}).get("lastObservedTime"))
    causes: list[dict[str, str]] = []
    if not ev.get("eventTime"):
        causes.append({"reason": "FieldValueRequired", "message": "Required value",
                       "field": "eventTime"})
    rc = ev.get("reportingController") or ""
    if not rc:
        causes.append({"reason": "FieldValueRequired", "message": "Required value",
                       "field": "reportingController"})
    name_part = rc.rsplit("/", 1)[-1]
    if not name_part:
        causes.append({"reason": "FieldValueInvalid",
                       "message": f'Invalid value: "{rc}": name part must be non-empty',
                       "field": "reportingController"})
    if not _QUALIFIED_PART.match(name_part):
        causes.append({"reason": "FieldValueInvalid",
                       "message": f'Invalid value: "{rc}": name part must consist of alphanumeric'
                       " characters, '-', '_' or '.', and must start and end with an alphanumeric"
                       " character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for"
                       " validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                       "field": "reportingController"})
    if not ev.get("action"):
        causes.append({"reason": "FieldValueRequired", "message": "Required value",
                       "field": "action"})
    if ev.get("type") not in ("Normal", "Warning"):
        causes.append({"reason": "FieldValueInvalid",
                       "message": f'Invalid value: "": has invalid value: {ev.get("type", "")}',
                       "field": "type"})
    if len(ev.get("note") or "") > 1024:
        causes.append({"reason": "FieldValueInvalid",
                       "message": 'Invalid value: "": can have at most 1024 characters',
                       "field": "message"})
    if causes:
        raise invalid("Event", ev["metadata"].get("name", ""), causes)


def validate_v1_event_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """events.k8s.io/v1 update: ``note`` (core ``message``) is immutable.

    Both arguments are in the v1 form. Raises: StatusError 422 ``field is immutable``.
    """
    check_microtime("Event", (new.get("series") or {}).get("lastObservedTime"))
    if old.get("note") != new.get("note"):
        raise invalid("Event", new["metadata"].get("name", ""), [{
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "{new.get("note", "")}": field is immutable',
            "field": "message"}])


# --- leases -----------------------------------------------------------------------------


def validate_lease(lease: dict[str, Any]) -> None:
    """Lease checks: MicroTime fields (400) and ``leaseDurationSeconds > 0`` (422)."""
    spec = lease.get("spec") or {}
    for key in ("acquireTime", "renewTime"):
        check_microtime("Lease", spec.get(key))
    dur = spec.get("leaseDurationSeconds")
    if dur is not None and dur <= 0:
        raise invalid("Lease", lease["metadata"].get("name", ""), [{
            "reason": "FieldValueInvalid",
            "message": f"Invalid value: {dur}: must be greater than 0",
            "field": "spec.leaseDurationSeconds"}], group="coordination.k8s.io")


# --- admissionregistration --------------------------------------------------------------


def default_webhook_configuration(cfg: dict[str, Any]) -> None:
    """MutatingWebhookConfiguration defaults (``admission-webhook-configuration.json``)."""
    for wh in cfg.get("webhooks") or []:
        wh.setdefault("failurePolicy", "Fail")
        wh.setdefault("matchPolicy", "Equivalent")
        wh.setdefault("namespaceSelector", {})
        wh.setdefault("objectSelector", {})
        wh.setdefault("timeoutSeconds", 10)
        wh.setdefault("reinvocationPolicy", "Never")
        for rule in wh.get("rules") or []:
            rule.setdefault("scope", "*")
        svc = (wh.get("clientConfig") or {}).get("service")
        if svc is not None:
            svc.setdefault("port", 443)


# --- CRDs -------------------------------------------------------------------------------


def prepare_crd(crd: dict[str, Any], now: str) -> None:
    """Validate what localkube can check of a CRD and set its status as Established.

    Raises:
        StatusError: 422 when a root ``x-kubernetes-validations`` rule carries a ``fieldPath``
            into ``metadata`` (``crd-podplacementconfig.json``).
    """
    spec = crd.get("spec") or {}
    name = crd["metadata"].get("name", "")
    names = spec.get("names") or {}
    expected = f"{names.get('plural', '')}.{spec.get('group', '')}"
    if name != expected:
        raise invalid("CustomResourceDefinition", name, [{
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
            "field": "metadata.name"}], group="apiextensions.k8s.io")
    for v in spec.get("versions") or []:
        schema = (v.get("schema") or {}).get("openAPIV3Schema") or {}
        for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
            fp = rule.get("fieldPath", "")
            if fp.startswith(".metadata"):
                raise invalid("CustomResourceDefinition", name, [{
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{fp}": must be a valid path',
                    "field": f"spec.validation.openAPIV3Schema.x-kubernetes-validations[{i}]"
                    ".fieldPath"}], group="apiextensions.k8s.io")
            if not supported_rule(rule.get("rule", "")):
                # Rules localkube cannot evaluate are accepted and not enforced.
                continue
    spec.setdefault("conversion", {"strategy": "None"})
    accepted = {k: names[k] for k in ("plural", "singular", "shortNames", "kind", "listKind",
                                      "categories") if k in names}
    accepted.setdefault("listKind", names.get("kind", "") + "List")
    accepted.setdefault("singular", names.get("kind", "").lower())
    crd["status"] = {
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now,
             "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now,
             "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "acceptedNames": accepted,
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
    }


def wrong_kind(got_kind: str, got_version: str, want_kind: str) -> StatusError:
    """400 for a body of another kind (``errors.json``: a Service POSTed to pods)."""
    return bad_request(
        f'{got_kind} in version "{got_version}" cannot be handled as a {want_kind}: converting '
        f"({got_version}.{got_kind}) to (core.{want_kind}): unknown conversion"
    )

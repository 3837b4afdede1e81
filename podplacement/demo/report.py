"""The demo's result table: one row per sample pod, built from the pods and Events as the API
server returns them, plus a check of each row against the workload's :class:`Expectation`.

Pure: plain dicts in (Pod JSON, core/v1 or events.k8s.io/v1 Event JSON), strings out. Columns:
pod → images → platforms (the intersection the controller recorded in the
``podplacement.io/decision`` annotation) → injected required node affinity in a compact form
(``arch In [amd64,arm64]``, terms ORed with ``|``, expressions ANDed with ``&``) plus the
architecture preferences → NUMA candidates (or ``waiting``) → node (``spec.nodeName``; ``-``
without a scheduler) → Event reasons. A second table shows the pods bound to the real node:
their phase and the first line of their log (:func:`run_rows`), and :func:`nodes_line` says
which nodes are real and which are simulated.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from podplacement.demo.workloads import Expectation
from podplacement.rules.config import (
    ARCH_LABEL,
    DECISION_ANNOTATION,
    GATE_LABEL,
    HOSTNAME_LABEL,
    NO_SUPPORTED_PLATFORM_KEY,
    NUMA_LABEL,
    NUMA_LABEL_WAITING,
    OS_LABEL,
    SCHEDULING_GATE,
)

#: Short names for the label keys that appear in injected affinity.
SHORT_KEYS: dict[str, str] = {
    ARCH_LABEL: "arch",
    OS_LABEL: "os",
    HOSTNAME_LABEL: "hostname",
    NO_SUPPORTED_PLATFORM_KEY: "no-supported-platform",
}

HEADERS = ("POD", "STATE", "IMAGES", "PLATFORMS", "AFFINITY", "NUMA", "NODE", "EVENTS")

#: Columns wrapped at spaces beyond this many characters (keeps the table ~170 wide).
MAX_WIDTHS: dict[str, int] = {"IMAGES": 26, "PLATFORMS": 26, "AFFINITY": 38, "EVENTS": 26}


@dataclass(frozen=True, slots=True)
class Row:
    """One table row (every field already formatted as text)."""

    pod: str
    state: str
    images: str
    platforms: str
    affinity: str
    numa: str
    node: str
    events: str

    def cells(self) -> tuple[str, ...]:
        """The cells in :data:`HEADERS` order."""
        return (self.pod, self.state, self.images, self.platforms, self.affinity, self.numa,
                self.node, self.events)


def decision_record(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed ``podplacement.io/decision`` annotation (``{}`` when absent or not JSON)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(DECISION_ANNOTATION)
    if not raw:
        return {}
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def short_image(image: str) -> str:
    """``127.0.0.1:5000/demo/busybox:multi`` → ``demo/busybox:multi`` (drops a registry domain:
    a first path component with a dot or colon, or ``localhost``)."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return rest
    return image


def images_cell(pod: Mapping[str, Any]) -> str:
    """Init images prefixed ``init:``, then app images, separated by ``", "``."""
    spec = pod.get("spec") or {}
    parts = [f"init:{short_image(str(c.get('image')))}" for c in spec.get("initContainers") or []]
    parts += [short_image(str(c.get("image"))) for c in spec.get("containers") or []]
    return ", ".join(parts)


def _arch_of(platform: str) -> str:
    """``linux/arm64`` -> ``arm64``; other OSes kept whole; a Windows ``@os.version``
    (the annotation's per-image form) left out."""
    parts = platform.split("@", 1)[0].split("/")
    if len(parts) >= 2 and parts[0] == "linux":
        return "/".join(parts[1:])
    return "/".join(parts)


def platforms_cell(record: Mapping[str, Any]) -> str:
    """The supported platforms of the decision: ``amd64,arm64`` when all linux, full
    ``os/arch`` otherwise; ``none (a | b)`` with each image's platforms when the intersection
    is empty; ``-`` when no decision was recorded."""
    if "platforms" not in record:
        images = record.get("images") or []
        errors = [e for e in images if isinstance(e, Mapping) and e.get("error")]
        if errors:
            return "error: " + str(errors[0].get("error"))[:60]
        return "-"
    plats = [str(p) for p in record.get("platforms") or []]
    if plats:
        return ",".join(_arch_of(p) for p in plats)
    per_image = []
    for entry in record.get("images") or []:
        if isinstance(entry, Mapping):
            name = short_image(str(entry.get("image", "")))
            own = ",".join(_arch_of(str(p)) for p in entry.get("platforms") or []) or "?"
            per_image.append(f"{name.rsplit('/', 1)[-1]}={own}")
    return "none (" + " | ".join(per_image) + ")"


def expression_text(expr: Mapping[str, Any]) -> str:
    """``{key, operator, values}`` → ``arch In [amd64,arm64]`` or
    ``no-supported-platform Exists``."""
    key = str(expr.get("key", ""))
    key = SHORT_KEYS.get(key, key)
    op = str(expr.get("operator", ""))
    values = expr.get("values")
    if values is None or op in ("Exists", "DoesNotExist"):
        return f"{key} {op}"
    return f"{key} {op} [{','.join(str(v) for v in values)}]"


def affinity_cell(pod: Mapping[str, Any]) -> str:
    """Required terms (``&`` inside a term, ``|`` between terms), then the weighted
    architecture preferences as ``; prefer(amd64:50,arm64:30)``; ``-`` when the pod has no
    node affinity."""
    spec = pod.get("spec") or {}
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        exprs = [expression_text(e) for e in term.get("matchExpressions") or []]
        exprs += [f"field:{expression_text(e)}" for e in term.get("matchFields") or []]
        terms.append(" & ".join(exprs) if exprs else "{}")
    text = " | ".join(terms)
    prefs = []
    for pref in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        for expr in (pref.get("preference") or {}).get("matchExpressions") or []:
            if expr.get("key") == ARCH_LABEL and expr.get("operator") == "In":
                values = "+".join(str(v) for v in expr.get("values") or [])
                prefs.append(f"{values}:{pref.get('weight')}")
    if prefs:
        text = (text + "; " if text else "") + "prefer(" + ",".join(prefs) + ")"
    return text or "-"


def state_cell(pod: Mapping[str, Any]) -> str:
    """``gated`` (our scheduling gate present), ``waiting`` (gated and labelled
    ``podplacement.io/numa=waiting``), ``ungated`` (the gate label says ``removed``), or
    ``not-gated`` (the webhook never gated it)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    if SCHEDULING_GATE in gates:
        return "waiting" if labels.get(NUMA_LABEL) == NUMA_LABEL_WAITING else "gated"
    if GATE_LABEL in labels:
        return "ungated"
    return "not-gated"


def numa_cell(pod: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    """NUMA candidate nodes from the decision, ``waiting`` for a pod kept gated for NUMA
    resources, ``none`` when NUMA was considered without a candidate, else ``-``."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(NUMA_LABEL) == NUMA_LABEL_WAITING:
        return "waiting"
    numa = record.get("numa")
    if isinstance(numa, Mapping):
        candidates = [str(c) for c in numa.get("candidates") or []]
        return ",".join(candidates) if candidates else "none"
    return "-"


def event_subject(event: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(kind, namespace, name)`` an Event is about: ``regarding`` (events.k8s.io/v1) or
    ``involvedObject`` (core/v1)."""
    ref = event.get("regarding") or event.get("involvedObject") or {}
    meta = event.get("metadata") or {}
    return (
        str(ref.get("kind", "")),
        str(ref.get("namespace") or meta.get("namespace") or ""),
        str(ref.get("name", "")),
    )


def _event_time(event: Mapping[str, Any]) -> str:
    for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
        value = event.get(key)
        if value:
            return str(value)
    return str((event.get("metadata") or {}).get("creationTimestamp") or "")


def events_by_pod(events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """``(namespace, pod name)`` → distinct Event reasons in time order (both Event APIs may
    report the same Event: the reasons are deduplicated)."""
    out: dict[tuple[str, str], list[str]] = {}
    for event in sorted(events, key=_event_time):
        kind, namespace, name = event_subject(event)
        if kind and kind != "Pod":
            continue
        reason = str(event.get("reason") or "")
        reasons = out.setdefault((namespace, name), [])
        if reason and reason not in reasons:
            reasons.append(reason)
    return out


def build_rows(
    pods: Sequence[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]
) -> list[Row]:
    """One :class:`Row` per pod, in the order given."""
    reasons = events_by_pod(events)
    rows = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        record = decision_record(pod)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        rows.append(
            Row(
                pod=key[1],
                state=state_cell(pod),
                images=images_cell(pod),
                platforms=platforms_cell(record),
                affinity=affinity_cell(pod),
                numa=numa_cell(pod, record),
                node=str((pod.get("spec") or {}).get("nodeName") or "-"),
                events=", ".join(reasons.get(key, [])) or "-",
            )
        )
    return rows


def wrap_cell(cell: str, width: int | None) -> list[str]:
    """Split ``cell`` at spaces into pieces of at most ``width`` characters (a longer word
    stays whole); ``" ".join(pieces) == cell`` for cells with single spaces."""
    if width is None or len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, width, break_long_words=False, break_on_hyphens=False) or [cell]


class _Cells(Protocol):
    def cells(self) -> tuple[str, ...]: ...


#: The columns of the real node's table.
RUN_HEADERS = ("POD", "NODE", "PHASE", "LOG")


@dataclass(frozen=True, slots=True)
class RunRow:
    """A pod on the real node: its phase (``status.phase``) and first log line."""

    pod: str
    node: str
    phase: str
    log: str

    def cells(self) -> tuple[str, ...]:
        """The cells in :data:`RUN_HEADERS` order."""
        return (self.pod, self.node, self.phase, self.log)


def run_rows(pods: Sequence[Mapping[str, Any]], logs: Mapping[str, str]) -> list[RunRow]:
    """One :class:`RunRow` per pod (in the order given), ``logs``: pod name → its log text
    (first line shown; ``-`` when empty)."""
    rows = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        lines = (logs.get(name) or "").strip().splitlines()
        rows.append(RunRow(name, str((pod.get("spec") or {}).get("nodeName") or "-"),
                           str((pod.get("status") or {}).get("phase") or "-"),
                           lines[0] if lines else "-"))
    return rows


def nodes_line(nodes: Sequence[Mapping[str, Any]], real: Collection[str]) -> str:
    """``nodes: real: NAME (arch), ...; simulated (no kubelet): NAME (arch), ...`` for the
    Node objects ``nodes`` (``real``: the real nodes' names, empty when every node is
    simulated)."""
    def label(node: Mapping[str, Any]) -> str:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        return f"{meta.get('name')} ({labels.get(ARCH_LABEL) or '?'})"

    real_nodes = [label(n) for n in nodes if (n.get("metadata") or {}).get("name") in real]
    simulated = [label(n) for n in nodes if (n.get("metadata") or {}).get("name") not in real]
    return (f"nodes: real: {', '.join(real_nodes) or 'none'}; simulated (no kubelet): "
            f"{', '.join(simulated) or 'none'}")


def render_table(rows: Sequence[_Cells], headers: Sequence[str] = HEADERS,
                 max_widths: Mapping[str, int] | None = None) -> str:
    """Left-aligned columns separated by two spaces, a header line first; a cell longer than
    its column's entry in ``max_widths`` (default :data:`MAX_WIDTHS`) continues on the next
    lines of the same column, with the other columns blank. No trailing whitespace; no final
    newline."""
    limits = MAX_WIDTHS if max_widths is None else max_widths
    wrapped = [[wrap_cell(cell, limits.get(headers[i])) for i, cell in enumerate(r.cells())]
               for r in rows]
    widths = [
        max([len(headers[i])] + [len(piece) for row in wrapped for piece in row[i]])
        for i in range(len(headers))
    ]
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for row in wrapped:
        for n in range(max(len(pieces) for pieces in row)):
            cells = [pieces[n] if n < len(pieces) else "" for pieces in row]
            lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip())
    return "\n".join(lines)


def unsatisfiable(pod: Mapping[str, Any]) -> bool:
    """True when the pod carries the ``podplacement.io/no-supported-platform`` marker (no node
    can take it, so no scheduler will bind it)."""
    return bool(_required_values(pod, NO_SUPPORTED_PLATFORM_KEY))


def _required_values(pod: Mapping[str, Any], key: str) -> list[tuple[str, ...]]:
    spec = pod.get("spec") or {}
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    found = []
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == key:
                found.append(tuple(sorted(str(v) for v in expr.get("values") or [])))
    return found


def check(pod: Mapping[str, Any], reasons: Sequence[str], expect: Expectation) -> list[str]:
    """Compare what the product did with ``expect``; returns the mismatches (empty: as
    expected). ``reasons`` are the pod's Event reasons."""
    problems = []
    state = state_cell(pod)
    if expect.waiting:
        if state != "waiting":
            problems.append(f"expected to wait for NUMA resources, state {state}")
    elif state != "ungated":
        problems.append(f"expected to be ungated, state {state}")
    archs = _required_values(pod, ARCH_LABEL)
    if expect.archs is None:
        if archs:
            problems.append(f"unexpected arch requirement {archs}")
    elif not archs or any(a != tuple(sorted(expect.archs)) for a in archs):
        problems.append(f"arch requirement {archs or 'missing'}, expected {list(expect.archs)}")
    hosts = _required_values(pod, HOSTNAME_LABEL)
    if expect.hostnames:
        if not hosts or any(h != tuple(sorted(expect.hostnames)) for h in hosts):
            problems.append(
                f"hostname requirement {hosts or 'missing'}, expected {list(expect.hostnames)}"
            )
    elif hosts:
        problems.append(f"unexpected hostname requirement {hosts}")
    marker = unsatisfiable(pod)
    if marker != expect.no_supported_platform:
        problems.append(
            "missing no-supported-platform marker" if expect.no_supported_platform
            else "unexpected no-supported-platform marker"
        )
    if expect.event not in reasons:
        problems.append(f"no {expect.event} event (got {', '.join(reasons) or 'none'})")
    return problems


def metrics_summary(exposition: str) -> str:
    """One line from the controller's ``/metrics`` (Prometheus text format): pods processed
    by outcome, Kubernetes API requests by verb, registry requests and image-cache hits and
    misses, and the mean seconds from pod creation to the ungating patch. Metrics that are
    absent are left out; "" when none is present."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))

    def by_label(name: str, label: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for labels, value in samples.get(name, []):
            key = labels.get(label, "")
            out[key] = out.get(key, 0) + int(value)
        return {k: v for k, v in sorted(out.items()) if v}

    def total(name: str) -> int | None:
        values = samples.get(name)
        return int(sum(v for _, v in values)) if values else None

    parts = []
    processed = by_label("podplacement_pods_processed_total", "outcome")
    if processed:
        parts.append("pods processed " + " ".join(f"{k}={v}" for k, v in processed.items()))
    api = by_label("podplacement_api_requests_total", "verb")
    if api:
        parts.append("API requests " + " ".join(f"{k}={v}" for k, v in api.items()))
    registry = total("podplacement_registry_requests_total")
    if registry is not None:
        hits = total("podplacement_image_cache_hits_total") or 0
        misses = total("podplacement_image_cache_misses_total") or 0
        parts.append(f"registry requests {registry} (image cache {hits} hits, {misses} misses)")
    count = total("podplacement_ungate_seconds_count")
    seconds = samples.get("podplacement_ungate_seconds_sum")
    if count and seconds:
        mean = sum(v for _, v in seconds) / count
        parts.append(f"creation to ungate {mean:.2f} s mean")
    return "; ".join(parts)

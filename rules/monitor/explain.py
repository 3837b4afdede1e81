"""``podplacement explain``: a dry run of the whole placement decision for one pod, reported
like a scheduler would: the images and their platforms, the architecture decision, one row per
node (feasible or why not, and the NUMA score), and the exact nodeAffinity the controller would
inject.

Pure: the caller supplies the pod, the Nodes, the NRTs (dicts as ``kubectl get -o yaml``
prints them) and the inspection result per image; :func:`explain` runs the same decision code
as the controller (:func:`rules.place.plan.plan`, with the same in-flight NUMA holds when given)
on a gated copy of the pod, applies the resulting JSON patch to that copy and reads the
affinity back. Renderers turn the report into a table, JSON or YAML.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import yaml

from podplacement.rules.config import (
    ARCH_LABEL,
    LINUX,
    OS_LABEL,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.rules.learn import LearnedImage, describe, learned_images
from podplacement.rules.monitor.execformat import recorded
from podplacement.rules.numa import InFlight
from podplacement.rules.place.decision import Decision, NumaLike, Outcome, unique_images
from podplacement.rules.place.placement import (
    RECORD_NO_NODE,
    PlacementInputs,
    allowed_platforms,
    no_node_text,
    toleration_text,
)
from podplacement.rules.place.plan import plan, pod_platforms
from podplacement.rules.platforms import ImageLike, PlatformSet, os_version_of
from podplacement.rules.podspec import has_gate, node_ineligibility, unescape_pointer
from podplacement.rules.policy import PlacementPolicy, policy_for

OUTPUTS = ("table", "json", "yaml")


def _node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _labels(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("metadata") or {}).get("labels") or {}


def _image_entry(image: str, result: ImageLike | BaseException | None) -> dict[str, Any]:
    if result is None or isinstance(result, BaseException):
        error = "not inspected" if result is None else (str(result) or type(result).__name__)
        return {"image": image, "digest": None, "platforms": [], "error": error}
    platforms = []
    for p in result.platforms:
        version = os_version_of(p)
        text = (f"{p.os}/{p.architecture}" + (f"/{p.variant}" if p.variant else "")
                + (f"@{version}" if version else ""))
        if text not in platforms:
            platforms.append(text)
    entry: dict[str, Any] = {"image": image, "digest": getattr(result, "digest", None) or None,
                             "platforms": platforms}
    if isinstance(result, LearnedImage):
        entry["excluded"] = [{"platform": x.platform, "proof": x.proof, "why": describe(x),
                              "digests": list(x.digests)} for x in result.excluded]
    return entry


def _learned_reason(node: Mapping[str, Any],
                    results: Mapping[str, ImageLike | BaseException | None]) -> str | None:
    """Why a node is out because a platform was learned wrong: the node's pair is one an
    exclusion left out of an image (docs/exec-format-errors.md, "Learn")."""
    labels = _labels(node)
    pair = f"{labels.get(OS_LABEL) or LINUX}/{labels.get(ARCH_LABEL) or ''}"
    for image, result in results.items():
        if isinstance(result, LearnedImage):
            for x in result.excluded:
                if x.platform == pair:
                    return f"{describe(x).replace(' excluded:', f' of {image} excluded:', 1)}"
    return None


def _ineligibility(node: Mapping[str, Any], node_selector: Mapping[str, Any],
                   platforms: PlatformSet | None,
                   excluded: Collection[tuple[str, str]] = ()) -> str | None:
    """Why the platform decision (or the pod's nodeSelector) excludes ``node``: a pair no
    image supports, or one the platform requirement left out of every required term
    (``excluded``: one OS group per existing term, KEP-3838)."""
    pairs = set(platforms.pairs) if platforms is not None and platforms.image_count else None
    builds = dict(platforms.builds) if platforms is not None else None
    reason = node_ineligibility(node, node_selector, pairs, builds)
    if reason is None and excluded:
        labels = _labels(node)
        pair = (str(labels.get(OS_LABEL) or LINUX), str(labels.get(ARCH_LABEL) or ""))
        if pair in excluded:
            reason = (f"platform {pair[0]}/{pair[1]} is left out of the pod's required "
                      "nodeSelectorTerms (each keeps one OS: a gated pod's terms can only be "
                      "narrowed, KEP-3838)")
    return reason



def _gated(pod: Mapping[str, Any]) -> dict[str, Any]:
    gated: dict[str, Any] = copy.deepcopy(dict(pod))
    spec = gated.setdefault("spec", {})
    gates = spec.setdefault("schedulingGates", [])
    if not has_gate(gated):
        gates.append({"name": SCHEDULING_GATE})
    meta = gated.setdefault("metadata", {})
    meta.setdefault("resourceVersion", "0")
    return gated


def _pointer(path: str) -> list[str]:
    tokens = unescape_pointer(path)
    if not tokens:  # "" (the whole document) is no target for these ops
        raise ValueError(f"bad JSON pointer {path!r}")
    return tokens


def apply_patch(doc: Any, ops: Sequence[Mapping[str, Any]], *,
                copy_values: bool = True) -> Any:
    """Apply RFC 6902 ``add``/``replace``/``remove``/``test`` ops to a copy of ``doc``.

    ``copy_values`` False puts the ops' values into the result as they are, not copies: for
    a caller that only reads the result and never changes the ops' values (a comparison;
    the deep copies cost most of the time on small documents).

    Raises:
        ValueError: an op does not apply (failing ``test``, missing path, unknown op).
    """
    out = copy.deepcopy(doc)
    for op in ops:
        kind = op.get("op")
        tokens = _pointer(str(op.get("path", "")))
        parent = out
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ValueError(f"test failed at {op.get('path')}")
        elif kind in ("add", "replace"):
            value = copy.deepcopy(op.get("value")) if copy_values else op.get("value")
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif kind == "add":
                    parent.insert(int(last), value)
                else:
                    parent[int(last)] = value
            else:
                parent[last] = value
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise ValueError(f"unsupported JSON patch op {kind!r}")
    return out


def explain(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
            nrts: Mapping[str, Mapping[str, Any]],
            platforms_by_image: Mapping[str, ImageLike | BaseException],
            config: PlacementConfig, *, inflight: InFlight | None = None,
            now: float | None = None,
            policies: Sequence[PlacementPolicy] = ()) -> dict[str, Any]:
    """Explain where ``pod`` would be placed and why.

    Args:
        pod: the Pod dict (gated or not; a gated copy is decided).
        nodes: Node dicts.
        nrts: NodeResourceTopology dicts by node name.
        platforms_by_image: per distinct image reference, the inspection result
            (``imageinspect.ImageInfo`` or anything with ``platforms``) or the exception.
        config: the PodPlacementConfig to apply (``topology`` decides the NUMA part).
        inflight: pods already ungated toward NUMA candidates, held as the controller holds
            them (:func:`rules.place.plan.inflight_from_pods` rebuilds them from the pods).
        now: UNIX seconds (default: the clock), for the NUMA wait of a gated pod.
        policies: the accepted PodPlacementPolicies of the pod's namespace, highest
            priority first (:meth:`rules.policy.Ranking.of`); the one matching the pod
            applies (:func:`rules.policy.policy_for`) and is named in the report.
    Returns:
        ``{"pod": "ns/name", "images": [{"image", "digest", "platforms": ["os/arch[/variant]"]}],
        "platforms": ["os/arch"], "windowsBuilds": {"windows/arch": ["10.0.17763"]},
        "pairs": ["os/arch"], "architectures": [...],
        "policy": {"name", "priority"} | None, "outcome": str, "reason": str,
        "numa": {...} | None,
        "noNodeYet": ["os/arch"], "waiting": str | None,
        "nodes": [{"name", "feasible", "reason", "score", "policy", "scope"}],
        "affinity": {nodeAffinity as injected},
        "tolerations": ["kubernetes.io/arch=arm64:NoSchedule", ...],
        "execFormatErrors": {...} | None}``;
        ``noNodeYet`` lists the pairs the pod may run on when no node of any of them exists
        yet (the decision annotation's ``noNodeYet``,
        :func:`rules.place.placement.platforms_without_node`; empty otherwise), and ``waiting``
        says so in a sentence (``no node of linux/arm64 exists yet: the pod waits for one
        (an autoscaler can create it)``), None otherwise; ``tolerations`` are those added
        for architecture taints (:mod:`rules.tolerations`: the nodes' and the configured
        ones);
        ``execFormatErrors`` is the pod's ``podplacement.io/exec-format-error`` record
        (containers seen failing, and the verification of their digests), when it has one.
        An image whose platform ``config.excluded`` leaves out (learned from exec format
        errors, :func:`rules.learn.learned_images`) lists it under ``excluded``
        (``platform``, ``proof``, ``why``, ``digests``), and a node of that platform says so
        as its reason.
        ``platforms`` is the intersection of
        the images' (os, arch) pairs, ``windowsBuilds`` per windows pair the builds its
        images carry in ``os.version`` (the node label
        ``node.kubernetes.io/windows-build`` must be one; a node of another build says
        "windows build X not supported"), ``pairs`` those the written required terms admit
        (:attr:`rules.place.affinity.PlatformRequirement.pairs`; empty without a platform
        requirement). Image-inspection failures are decided
        as after the last retry (the controller's fallback); the reason then says that
        explain inspected once and how often the controller would retry first.
    Raises:
        ValueError: unknown scoring strategy; QuantityError: invalid pod quantities.
    """
    meta = pod.get("metadata") or {}
    images = list(unique_images(pod))
    known = learned_images({img: r for img in images
                            if (r := platforms_by_image.get(img)) is not None},
                           config.excluded, namespace=str(meta.get("namespace") or ""))
    results = {img: known.get(img) for img in images}
    platforms = pod_platforms(pod, {k: v for k, v in results.items() if v is not None})
    node_selector = (pod.get("spec") or {}).get("nodeSelector") or {}

    gated = _gated(pod)
    policy = policy_for(pod, policies)
    decision = _decide(gated, results, config, nodes, nrts, now, inflight, policy)
    requirement = decision.requirement
    excluded = requirement.excluded if requirement is not None else ()
    # the policy's allowedArchitectures make nodes of the removed pairs ineligible too
    allowed = allowed_platforms(platforms, policy)[0] if platforms is not None else None
    reasons = _node_reasons(nodes, node_selector, allowed, excluded, results)
    numa = decision.numa
    patched = apply_patch(gated, decision.patch) if decision.patch else gated
    affinity = ((patched.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    rows = _node_rows(nodes, reasons, numa)
    numa_info = _numa_info(numa)
    waiting = list(decision.record.get(RECORD_NO_NODE) or ())
    return {
        "pod": f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}",
        "images": [_image_entry(img, results[img]) for img in images],
        "platforms": platforms.strings() if platforms is not None else [],
        "windowsBuilds": (allowed.build_strings() if allowed is not None else {}),
        "pairs": [f"{o}/{a}" for o, a in requirement.pairs] if requirement is not None else [],
        "architectures": list(decision.architectures),
        "policy": ({"name": policy.name, "priority": policy.priority}
                   if policy is not None else None),
        "outcome": str(decision.outcome),
        "reason": _reason(decision, [i for i in images if not _inspected(results[i])],
                          config.image_inspection.max_retries),
        "numa": numa_info,
        "noNodeYet": waiting,
        "waiting": no_node_text(waiting) if waiting else None,
        "nodes": rows,
        "affinity": affinity,
        "tolerations": [toleration_text(t) for t in decision.tolerations],
        "execFormatErrors": _exec_format_errors(pod),
    }


def _decide(gated: Mapping[str, Any], results: Mapping[str, ImageLike | BaseException | None],
            config: PlacementConfig, nodes: Sequence[Mapping[str, Any]],
            nrts: Mapping[str, Mapping[str, Any]], now: float | None,
            inflight: InFlight | None, policy: PlacementPolicy | None) -> Decision:
    """The controller's decision for the gated copy, an image not inspected counting as a
    failure after the last retry (``now``: UNIX seconds, None for the clock)."""
    images = {k: v if v is not None else LookupError("not inspected")
              for k, v in results.items()}
    inputs = PlacementInputs(gated, images, config,
                             failures=config.image_inspection.max_retries, policy=policy)
    return plan(inputs, nodes=nodes, nrts=nrts, now=time.time() if now is None else now,
                inflight=inflight)


def _node_reasons(nodes: Sequence[Mapping[str, Any]], node_selector: Mapping[str, Any],
                  allowed: PlatformSet | None, excluded: Collection[tuple[str, str]],
                  results: Mapping[str, ImageLike | BaseException | None]
                  ) -> dict[str, str | None]:
    """Node name -> why the platform decision or the nodeSelector excludes it (a learned
    exclusion named first), None for an eligible node."""
    reasons = {_node_name(n): _ineligibility(n, node_selector, allowed, excluded)
               for n in nodes}
    for n in nodes:
        if reasons[_node_name(n)] is not None:
            reasons[_node_name(n)] = _learned_reason(n, results) or reasons[_node_name(n)]
    return reasons


def _node_rows(nodes: Sequence[Mapping[str, Any]], reasons: Mapping[str, str | None],
               numa: NumaLike | None) -> list[dict[str, Any]]:
    """The report's node rows, sorted by name: ineligible with its reason, else the NUMA
    verdict, else feasible without score."""
    verdicts = {v.name: v for v in numa.verdicts} if numa is not None else {}
    rows: list[dict[str, Any]] = []
    for node in sorted(nodes, key=_node_name):
        name = _node_name(node)
        verdict = verdicts.get(name)
        if reasons[name] is not None:
            rows.append({"name": name, "feasible": False, "reason": reasons[name],
                         "score": None, "policy": None, "scope": None})
        elif verdict is not None:
            rows.append({"name": name, "feasible": verdict.feasible, "reason": verdict.reason,
                         "score": verdict.score, "policy": verdict.policy,
                         "scope": verdict.scope})
        else:
            rows.append({"name": name, "feasible": True, "reason": None, "score": None,
                         "policy": None, "scope": None})
    return rows


def _numa_info(numa: NumaLike | None) -> dict[str, Any] | None:
    """The report's ``numa`` part (None without a NUMA decision)."""
    if numa is None:
        return None
    return {"needed": numa.needed, "strategy": numa.strategy,
            "candidates": list(numa.candidates), "hostnames": list(numa.hostnames),
            "policies": list(numa.policies())}


def _exec_format_errors(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    record = recorded(pod)
    return record if record["containers"] or record["verified"] else None


def _inspected(result: ImageLike | BaseException | None) -> bool:
    return result is not None and not isinstance(result, BaseException)


def _reason(decision: Decision, failed: Sequence[str], max_retries: int) -> str:
    """The decision's reason, except for a fallback: the controller's sentence counts its
    attempts ("failed after 6 attempts"), but explain inspected each image once, so say
    that and what the controller would do instead."""
    if decision.outcome != Outcome.FALLBACK or not failed:
        return decision.reason
    then = decision.reason.partition("); ")[2] or decision.reason
    retry = (f"the controller would retry {max_retries} more "
             f"time{'s' if max_retries != 1 else ''}, then fall back" if max_retries > 0
             else "the controller would fall back at once (maxRetries 0)")
    return (f"image inspection failed ({', '.join(failed)}; explain inspected once, {retry}): "
            f"{then}")


def render_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON."""
    return json.dumps(report, indent=2) + "\n"


def render_yaml(report: Mapping[str, Any]) -> str:
    """The report as YAML (keys in report order)."""
    return yaml.safe_dump(dict(report), sort_keys=False, default_flow_style=False)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


def render_table(report: Mapping[str, Any]) -> str:
    """The report for humans: images, decision, a node table and the nodeAffinity (YAML)."""
    out = [f"Pod: {report['pod']}", ""]
    out += _table(["IMAGE", "DIGEST", "PLATFORMS"], [
        [i["image"], i.get("digest") or "-",
         ", ".join(i["platforms"]) or f"error: {i.get('error', 'none')}"]
        for i in report["images"]
    ])
    learned = [f"  {i['image']}: {x['why']}" for i in report["images"]
               for x in i.get("excluded") or ()]
    if learned:
        out += ["", "Excluded (learned from exec format errors):", *learned]
    out += ["", f"Architectures: {', '.join(report['architectures']) or '-'}"]
    pairs = report.get("pairs") or []
    if len({p.split("/")[0] for p in pairs}) > 1:
        # several OSes: the architectures alone do not say which node may run the pod
        out.append(f"Platforms: {', '.join(pairs)}")
    for pair, builds in sorted((report.get("windowsBuilds") or {}).items()):
        out.append(f"Windows builds: {pair} on node.kubernetes.io/windows-build "
                   f"{', '.join(builds)}")
    policy = report.get("policy")
    if policy:
        out.append(f"Policy: {policy['name']} (priority {policy['priority']})")
    out.append(f"Outcome: {report['outcome']} ({report['reason']})")
    if report.get("waiting"):
        out.append(f"Nodes: {report['waiting']}")
    if report.get("path"):
        out.append(f"Path: {report['path']}")
    if report.get("tolerations"):
        out.append(f"Tolerations added: {', '.join(report['tolerations'])}")
    numa = report.get("numa")
    if numa:
        out.append(f"NUMA: strategy {numa['strategy']}, alignment needed: "
                   f"{'yes' if numa['needed'] else 'no'}, candidates: "
                   f"{', '.join(numa['candidates']) or 'none'}")
    out.append("")
    out += _table(["NODE", "FEASIBLE", "SCORE", "POLICY", "REASON"], [
        [n["name"], "yes" if n["feasible"] else "no",
         "-" if n["score"] is None else str(n["score"]),
         f"{n['policy']}/{n['scope']}" if n.get("policy") else "-",
         n["reason"] or ""]
        for n in report["nodes"]
    ])
    xfe = report.get("execFormatErrors")
    if xfe:
        out += ["", "Exec format errors:"]
        for name, c in sorted(xfe["containers"].items()):
            out.append(f"  container {name}: restart {c.get('restartCount')}, digest "
                       f"{c.get('digest')}, node {c.get('node')} ({c.get('arch')})")
        for digest, v in sorted(xfe["verified"].items()):
            flagged = ", ".join(v.get("mismatched") or []) or "none"
            out.append(f"  verified {digest}: {v.get('status')} ({v.get('reason')}); "
                       f"platforms flagged: {flagged}")
    out += ["", "nodeAffinity:"]
    if report["affinity"]:
        body = yaml.safe_dump(report["affinity"], sort_keys=False, default_flow_style=False)
        out += ["  " + line for line in body.rstrip().splitlines()]
    else:
        out.append("  (none)")
    return "\n".join(out) + "\n"


def render(report: Mapping[str, Any], output: str) -> str:
    """Render as ``table``, ``json`` or ``yaml``. Raises ValueError for another format."""
    if output == "json":
        return render_json(report)
    if output == "yaml":
        return render_yaml(report)
    if output == "table":
        return render_table(report)
    raise ValueError(f"unknown output {output!r} (want one of {', '.join(OUTPUTS)})")

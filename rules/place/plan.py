"""The one placement pipeline: pod, image results, config and cluster view → :class:`Decision`.

The reconciler and ``podplacement explain`` decide through :func:`plan` (docs/guide/cli.md "explain:
a dry run of the whole decision"), so ``explain`` cannot disagree with what the controller
then does: the supported platforms are computed once per pod, the NUMA candidates come from
:func:`rules.numa.decide_numa` with the same node eligibility (the supported (os,
architecture) pairs, less those the platform requirement of
:func:`rules.place.affinity.platform_requirement` leaves out of every term) and the same
in-flight holds, and :func:`rules.place.decision.decide` builds the one patch. The admission
paths, which have no cluster view (no NUMA), take the same facts directly
(:mod:`rules.place.admission`). Pure: no I/O, no clock (``now`` is an argument).

:func:`inflight_from_pods` rebuilds the in-flight holds from the pods themselves (their
``podplacement.io/numa=placed`` label and decision annotation), for a process that did not
place them (``explain``) but must count them as the controller does.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from podplacement.rules.config import (
    DECISION_ANNOTATION,
    NUMA_LABEL,
    NUMA_LABEL_PLACED,
)
from podplacement.rules.learn import learned_images
from podplacement.rules.numa import (
    InFlight,
    NumaDecision,
    decide_numa,
    effective_requests,
)
from podplacement.rules.place.affinity import platform_requirement
from podplacement.rules.place.decision import Decision, decide, unique_images
from podplacement.rules.place.placement import PlacementInputs, allowed_platforms
from podplacement.rules.platforms import (
    ImageLike,
    PlatformSet,
    node_inventory,
    supported_platforms,
)
from podplacement.rules.podspec import node_eligible
from podplacement.rules.tolerations import node_arch_taints

#: A NUMA decision that failed (odd quantities, unknown strategy) is reported here; without
#: a handler the error propagates (``explain`` shows it), with one the pod is placed without
#: NUMA alignment (the controller never leaves a pod gated for it).
NumaErrorHandler = Callable[[Exception], None]


def parse_time(text: str | None) -> float | None:
    """RFC 3339 timestamp (``2026-11-22T05:50:38Z``) → UNIX seconds, or None."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_platforms(pod: Mapping[str, Any],
                  images: Mapping[str, ImageLike | BaseException]) -> PlatformSet | None:
    """The supported platforms of ``pod``: the intersection over its distinct images
    (:func:`rules.platforms.supported_platforms`), or None when any image has no
    result (not inspected, or failed)."""
    results = [images.get(img) for img in unique_images(pod)]
    good = [r for r in results if r is not None and not isinstance(r, BaseException)]
    if len(good) != len(results):
        return None
    return supported_platforms(good)


def plan(
    inputs: PlacementInputs,
    *,
    nodes: Sequence[Mapping[str, Any]] | None,
    nrts: Mapping[str, Mapping[str, Any]],
    now: float,
    inflight: InFlight | None = None,
    on_numa_error: NumaErrorHandler | None = None,
) -> Decision:
    """Decide the placement of one gated pod.

    Args:
        inputs: what the decision reads (:class:`rules.place.placement.PlacementInputs`):
            the gated Pod, its images' results, the config, ``failures``, ``config_error``,
            ``path``, ``give_up`` and ``policy`` as the caller knows them (``policy``: NUMA
            candidates are then sought only among the pairs it allows). The fields the
            cluster gives (``nodes``, ``numa``, ``numa_waited_seconds``, ``platforms``,
            ``taints``) are filled here from the arguments below, and ``images`` loses the
            platforms ``config.excluded`` names.
        nodes: the cluster's Node dicts, or None when unknown (no NUMA placement and no
            ``PlatformNotInCluster`` Event then; the architecture taints are then those the
            config's status publishes). Their taints keyed ``kubernetes.io/arch``
            (:func:`rules.tolerations.node_arch_taints`) give the tolerations
            (:mod:`rules.tolerations`).
        nrts: NodeResourceTopology dicts by node name.
        now: the current time, UNIX seconds (how long the pod has waited for NUMA
            candidates is ``now`` minus its ``creationTimestamp``).
        inflight: the pods already ungated toward NUMA candidates (their requests are held
            on those nodes; the controller's own accounting, or :func:`inflight_from_pods`).
        on_numa_error: see :data:`NumaErrorHandler`.

    Returns:
        the :class:`rules.place.decision.Decision`; its ``numa`` carries the typed NUMA
        decision (candidates, hostnames, scores, verdicts) when NUMA placement applied.
        The platforms ``config.excluded`` names are left out of the images' results first
        (:func:`rules.learn.learned_images`), for the NUMA eligibility as well.

    Raises:
        ValueError, QuantityError: the NUMA decision failed and ``on_numa_error`` is None.
    """
    pod, config, policy = inputs.pod, inputs.config, inputs.policy
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    images = learned_images(inputs.images, config.excluded, namespace=namespace)
    platforms = pod_platforms(pod, images)
    allowed = allowed_platforms(platforms, policy)[0] if platforms is not None else None
    numa: NumaDecision | None = None
    satisfiable = allowed is not None and not (allowed.empty and allowed.image_count)
    if config.topology.enabled and nodes is not None and satisfiable:
        assert allowed is not None
        # no pairs means no image at all: every node is eligible. A pair the written terms
        # leave out (one OS group per existing term, KEP-3838) is no candidate either.
        pairs = set(allowed.pairs) or None
        if pairs:
            pairs -= set(platform_requirement(pod, allowed.pairs,
                                              dict(allowed.builds)).excluded)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        if not isinstance(selector, Mapping):
            selector = {}

        def eligible(node: Mapping[str, Any]) -> bool:
            return node_eligible(node, selector, pairs, dict(allowed.builds))

        try:
            numa = decide_numa(pod, nodes, nrts, config.topology, node_eligible=eligible,
                               inflight=inflight)
        except Exception as exc:
            if on_numa_error is None:
                raise
            on_numa_error(exc)
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    waited = max(0.0, now - created) if created is not None else 0.0
    return decide(replace(
        inputs, images=images,
        nodes=node_inventory(nodes) if nodes is not None else None,
        numa=numa, numa_waited_seconds=waited, platforms=platforms,
        taints=node_arch_taints(nodes) if nodes is not None else None,
    ))


def hold(inflight: InFlight, pod: Mapping[str, Any], decision: Decision) -> bool:
    """Hold ``pod``'s effective requests on the NUMA candidates of ``decision`` (after its
    patch was written): returns True when a hold was recorded, False when the decision
    placed no NUMA candidates.

    Raises:
        QuantityError: the pod has an invalid quantity.
    """
    if not decision.numa_placed or decision.numa is None or not decision.numa.candidates:
        return False
    meta = pod.get("metadata") or {}
    inflight.add(str(meta.get("uid")), f"{meta.get('namespace')}/{meta.get('name')}",
                 effective_requests(pod), list(decision.numa.candidates))
    return True


def inflight_from_pods(pods: Iterable[Mapping[str, Any]],
                       nrts: Mapping[str, Mapping[str, Any]] | None = None) -> InFlight:
    """The in-flight holds as the controller keeps them, rebuilt from the cluster's pods.

    A pod the controller placed toward NUMA candidates carries the label
    ``podplacement.io/numa=placed`` and its candidates in the ``podplacement.io/decision``
    annotation (``numa.candidates``). Each such pod that is not terminal is held on its
    candidates (or, once bound, on its node) until the node's NRT shows it, exactly as
    :class:`rules.numa.InFlight` does for the pods it added. The NRTs, when given,
    are observed after the pods (so an NRT that already counts a bound pod releases it).
    Pods without the label, or with an unreadable annotation, hold nothing.
    """
    inflight = InFlight()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(NUMA_LABEL) != NUMA_LABEL_PLACED:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            record = json.loads((meta.get("annotations") or {}).get(DECISION_ANNOTATION, ""))
            candidates = [str(c) for c in (record.get("numa") or {}).get("candidates") or []]
            requests = effective_requests(pod)
        except (ValueError, TypeError, AttributeError):
            continue
        if not candidates:
            continue
        inflight.add(str(meta.get("uid")), f"{meta.get('namespace')}/{meta.get('name')}",
                     requests, candidates)
        inflight.observe_pod(pod)
    for nrt in (nrts or {}).values():
        inflight.observe_nrt(nrt)
    return inflight

"""Learn from exec format errors: the platforms placement leaves out, and the one remedy.

Pure (no I/O, no clock: every call takes ``now``). The rule that makes evidence proof is
:func:`rules.findings.proof_of`; here it becomes what every path places with
(docs/exec-format-errors.md, "Learn"):

- :func:`exclusions`: each (digest, architecture) pair of the
  :class:`~rules.findings.FindingsStore` proven wrong becomes an
  :class:`~rules.config.ExcludedPlatform`, in force until its latest evidence is one
  ``imageInspection.cacheTTL`` old (then :meth:`FindingsStore.expire` forgets it). Its
  scope follows its proof (docs/exec-format-errors.md, "Who it applies to"): the
  controller's own verification excludes the platform in every namespace; exec format
  errors alone (words a container can print) only for the pods of the namespace they were
  seen in (:meth:`ExcludedPlatform.applies_to`, applied by :func:`learned_images` and
  :func:`hit` with the pod's namespace).
- :func:`learned_images`: an image result whose digest is one the exclusion names loses
  that (os, architecture) pair before the platforms are intersected, on every path that
  decides: the controller's PATCH (:func:`rules.place.plan.plan`), the webhook's cache and
  admission inspection (:func:`rules.place.admission.admission_placement`, both through
  :func:`rules.place.placement.placement_facts`) and ``explain``. The result keeps what was
  left out (:class:`LearnedImage`), which the decision annotation names. A new digest (the
  tag moved, a rebuilt image) matches nothing: it is placed by what its index says.
- The admission policy's catalog cannot say why, so the controller never publishes an
  image whose result lost a platform (:func:`touches`), and removes an entry already
  published when its digest becomes excluded: those pods are gated and placed by the
  webhook or the controller, whose annotation says why.

Digests: the status ``imageID`` is what the node pulled, usually the index a tag pointed to
when it pulled; placement sees the digest of the reference as written (the index, or a
single manifest). An exclusion therefore names every digest of the same content: the
``imageID`` digest and the index and platform manifest digests the verification read; one
of a single namespace also the digest the pod's decision annotation recorded for its image
(a pod's creator can write that annotation, so it never names content for every namespace).

The remedy (``deleteFailedPods``, :func:`remedy_owner`): a failing pod whose pair is
excluded and whose controlling owner is a ReplicaSet, StatefulSet or Job is deleted, so that
its owner creates a new pod, which is placed without the excluded platform; never a bare pod,
never a second pod of the same owner within one TTL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import (
    MAX_DELETED_PODS,
    MAX_EXCLUSIONS,
    REMEDIABLE_OWNER_KINDS,
    ExcludedPlatform,
)
from podplacement.rules.findings import PROOF_ERRORS, PROOF_VERIFICATION, Evidence, proof_of
from podplacement.rules.platforms import ImageLike, PlatformLike

__all__ = [
    "DeletedPod",
    "LearnedImage",
    "deleted_from_status",
    "describe",
    "excluded_pairs",
    "exclusion_note",
    "exclusions",
    "hit",
    "iso",
    "learned_images",
    "merge",
    "remedy_owner",
    "status_patch",
    "touches",
]


def _reason(e: Evidence, proof: str) -> str:
    if proof == PROOF_VERIFICATION and e.verification is not None:
        return e.verification.reason
    return f"{e.errors} exec format errors on {e.os}/{e.architecture} nodes"


def exclusions(evidence: Iterable[Evidence], *, now: float, ttl: float,
               min_errors: int = 2) -> tuple[ExcludedPlatform, ...]:
    """The exclusions in force at ``now``.

    Args:
        evidence: the store's pairs (:class:`rules.findings.FindingsStore`).
        now: unix seconds.
        ttl: seconds an exclusion lasts after its latest evidence (the config's
            ``imageInspection.cacheTTL``).
        min_errors: errors that prove a pair without verification.
    Returns:
        one :class:`ExcludedPlatform` per entry proven wrong (:func:`proof_of`) whose latest
        evidence is younger than ``ttl``, the most recent first, at most
        :data:`rules.config.MAX_EXCLUSIONS`: proof ``verification`` for every namespace,
        proof ``exec-format-errors`` for the entry's namespace only (left out when one of
        every namespace covers the same platform of the same content). An evidence time
        later than ``now`` counts as ``now``, so no exclusion lasts past ``now`` + ``ttl``.
    """
    out: list[ExcludedPlatform] = []
    for e in evidence:
        proof = proof_of(e, min_errors=min_errors)
        latest = min(e.latest, now)
        if proof is None or latest + ttl <= now:
            continue
        namespace = e.namespace if proof == PROOF_ERRORS else ""
        out.append(ExcludedPlatform(e.digests, e.os, e.architecture, proof, e.errors,
                                    latest, latest + ttl, e.image, _reason(e, proof),
                                    namespace, min(e.since or latest, latest)))
    every = [x for x in out if not x.namespace]
    out = [x for x in out if not x.namespace or not any(
        y.platform == x.platform and set(y.digests) & set(x.digests) for y in every)]
    out.sort(key=lambda x: (-x.last_seen, x.digests, x.platform, x.namespace))
    return tuple(out[:MAX_EXCLUSIONS])


def merge(primary: Sequence[ExcludedPlatform], published: Sequence[ExcludedPlatform], *,
          now: float) -> tuple[ExcludedPlatform, ...]:
    """``primary`` (the leader's own store) and those of ``published`` (the config's
    status) that are still in force at ``now`` and name neither a digest of a ``primary``
    exclusion of the same platform."""
    out = list(primary)
    for x in published:
        if x.expires <= now:
            continue
        if any(p.platform == x.platform and p.namespace == x.namespace
               and set(p.digests) & set(x.digests) for p in primary):
            continue
        out.append(x)
    return tuple(out)


def hit(digest: str | None, os: str, architecture: str,
        excluded: Iterable[ExcludedPlatform], *, namespace: str | None
        ) -> ExcludedPlatform | None:
    """The exclusion of (``digest``, ``os/architecture``) that applies to a pod of
    ``namespace`` (None: any), or None."""
    if not digest:
        return None
    for x in excluded:
        if (x.architecture == architecture and x.os == os and digest in x.digests
                and x.applies_to(namespace)):
            return x
    return None


def excluded_pairs(digest: str | None, excluded: Iterable[ExcludedPlatform], *,
                   namespace: str | None) -> dict[tuple[str, str], ExcludedPlatform]:
    """(os, architecture) → the exclusion, for every exclusion naming ``digest`` that
    applies to a pod of ``namespace`` (None: any); one of every namespace first."""
    if not digest:
        return {}
    out: dict[tuple[str, str], ExcludedPlatform] = {}
    for x in sorted(excluded, key=lambda x: bool(x.namespace)):
        if digest in x.digests and x.applies_to(namespace):
            out.setdefault((x.os, x.architecture), x)
    return out


@dataclass(frozen=True, slots=True)
class LearnedImage:
    """An image result with the platforms proven wrong left out (``imageinspect.ImageInfo``
    shape, plus :attr:`excluded`).

    Attributes:
        reference, digest, media_type, fetched_at: those of the result.
        platforms: its platforms without the excluded (os, architecture) pairs.
        excluded: the exclusions that removed a platform, in the result's order.
    """

    reference: str
    digest: str
    media_type: str
    platforms: tuple[PlatformLike, ...]
    excluded: tuple[ExcludedPlatform, ...]
    fetched_at: float | None = None


def _learned(result: ImageLike, excluded: Sequence[ExcludedPlatform],
             namespace: str | None) -> ImageLike:
    if isinstance(result, LearnedImage):
        return result
    pairs = excluded_pairs(getattr(result, "digest", None), excluded, namespace=namespace)
    if not pairs:
        return result
    kept: list[PlatformLike] = []
    removed: dict[tuple[str, str], ExcludedPlatform] = {}
    for p in result.platforms:
        x = pairs.get((p.os, p.architecture))
        if x is None:
            kept.append(p)
        else:
            removed.setdefault((p.os, p.architecture), x)
    if not removed:
        return result
    return LearnedImage(str(getattr(result, "reference", "")),
                        str(getattr(result, "digest", "")),
                        str(getattr(result, "media_type", "")), tuple(kept),
                        tuple(removed.values()), getattr(result, "fetched_at", None))


def learned_images(images: Mapping[str, ImageLike | BaseException],
                   excluded: Sequence[ExcludedPlatform], *, namespace: str | None
                   ) -> dict[str, ImageLike | BaseException]:
    """``images`` (image reference → result or exception) with every result whose digest an
    exclusion names replaced by a :class:`LearnedImage` without the excluded pairs.

    Args:
        namespace: the namespace of the pod placed with these results: only exclusions
            that apply to it count (:meth:`ExcludedPlatform.applies_to`); None: every
            exclusion (a reader about no one pod).
    Idempotent; with no exclusion, the same results."""
    if not excluded:
        return dict(images)
    return {image: r if isinstance(r, BaseException) else _learned(r, excluded, namespace)
            for image, r in images.items()}


def touches(result: ImageLike, excluded: Sequence[ExcludedPlatform]) -> bool:
    """Whether an exclusion, of any namespace, leaves a platform of ``result`` out (the
    controller then keeps the image out of the admission policy's catalog, whose CEL
    cannot tell namespaces apart: those pods are placed by the webhook or the
    controller)."""
    return isinstance(_learned(result, excluded, None), LearnedImage)


def iso(seconds: float) -> str:
    """Unix seconds → RFC 3339 UTC (``2026-01-01T06:00:00Z``)."""
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(x: ExcludedPlatform) -> str:
    """One phrase on an exclusion, for reasons and Events: ``linux/arm64 excluded: exec
    format error proven by verification (...) until 2026-01-01T06:00:00Z``."""
    why = (f"proven by verification ({x.reason})" if x.proof == PROOF_VERIFICATION
           else f"{x.errors} exec format errors on {x.architecture} nodes"
           f" in namespace {x.namespace}")
    return f"{x.platform} excluded: exec format error {why} until {iso(x.expires)}"


def exclusion_note(image: str, digest: str, x: ExcludedPlatform) -> str:
    """The text of the ``ExecFormatExclusion`` Event of a pod placed without ``x``'s
    platform for ``image`` (docs/reference/labels-events-metrics.md, "Events"), in our own
    words only (no registry text): which digest, which platform, since and until when, and
    on what proof."""
    why = ("the controller's verification of the image's binaries found that platform's "
           "program built for another machine" if x.proof == PROOF_VERIFICATION
           else f"{x.errors} exec format errors of pods of namespace {x.namespace} on "
           f"{x.architecture} nodes")
    return (f"image {image} digest {digest}: platform {x.platform} excluded since "
            f"{iso(x.since or x.last_seen)} until {iso(x.expires)} ({why}); the pod was "
            f"placed without it")


# --- the remedy ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeletedPod:
    """A pod ``deleteFailedPods`` deleted: its owner (kind, name, UID), namespace, name and
    when (unix seconds)."""

    owner_kind: str
    owner_name: str
    owner_uid: str
    namespace: str
    pod: str
    at: float

    def to_status(self) -> dict[str, Any]:
        """The ``status.execFormatErrorMonitor.deletedPods[]`` item."""
        return {"owner": {"kind": self.owner_kind, "name": self.owner_name,
                          "uid": self.owner_uid},
                "namespace": self.namespace, "pod": self.pod, "at": int(self.at)}


def deleted_from_status(obj: Mapping[str, Any]) -> tuple[DeletedPod, ...]:
    """The ``status.execFormatErrorMonitor.deletedPods`` of a PodPlacementConfig object
    (malformed items skipped)."""
    status = obj.get("status")
    monitor = status.get("execFormatErrorMonitor") if isinstance(status, Mapping) else None
    items = monitor.get("deletedPods") if isinstance(monitor, Mapping) else None
    out: list[DeletedPod] = []
    for item in items[:MAX_DELETED_PODS] if isinstance(items, list) else ():
        owner = item.get("owner") if isinstance(item, Mapping) else None
        at = item.get("at") if isinstance(item, Mapping) else None
        if (not isinstance(owner, Mapping) or not owner.get("uid") or isinstance(at, bool)
                or not isinstance(at, int | float)):
            continue
        out.append(DeletedPod(str(owner.get("kind") or ""), str(owner.get("name") or ""),
                              str(owner["uid"]), str(item.get("namespace") or ""),
                              str(item.get("pod") or ""), float(at)))
    return tuple(out)


def status_patch(excluded: Sequence[ExcludedPlatform],
                 deleted: Sequence[DeletedPod]) -> dict[str, Any]:
    """The JSON merge patch of the config's status subresource that publishes the
    exclusions in force and the pods deleted within the TTL (lists: replaced whole)."""
    return {"status": {"execFormatErrorMonitor": {
        "excluded": [x.to_status() for x in excluded[:MAX_EXCLUSIONS]],
        "deletedPods": [d.to_status() for d in deleted[-MAX_DELETED_PODS:]],
    }}}


def remedy_owner(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The pod's controlling owner when ``deleteFailedPods`` may delete it: (kind, name,
    UID) of the ownerReference with ``controller: true`` whose kind is a ReplicaSet,
    StatefulSet or Job (:data:`rules.config.REMEDIABLE_OWNER_KINDS`: their controllers
    create a new pod for a deleted one). None for a bare pod, another owner, or a pod
    already being deleted."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            kind = str(ref.get("kind") or "")
            if kind in REMEDIABLE_OWNER_KINDS and ref.get("uid"):
                return kind, str(ref.get("name") or ""), str(ref["uid"])
            return None
    return None

"""Which platforms a pod can run on, from the platforms of its images.

A pod runs on a node only if every one of its images (init and app containers) has a
manifest for the node's (os, architecture). So the supported set is the intersection over
images of their (os, architecture) pairs, and a node is admissible only when its own pair is
one of them (:func:`rules.affinity.platform_requirement` writes that into the pod).
Variants (``arm64/v8``, ``arm/v7``) are recorded for the decision annotation but never
matched: nodes carry no variant label (``kubernetes.io/arch`` and ``kubernetes.io/os``
only). Pure code, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from podplacement.rules.config import ARCH_LABEL, LINUX, OS_LABEL


class PlatformLike(Protocol):
    """Anything with ``os``, ``architecture`` and ``variant`` (``imageinspect.Platform``)."""

    @property
    def os(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def variant(self) -> str | None: ...


class ImageLike(Protocol):
    """Anything with ``platforms`` (``imageinspect.ImageInfo``)."""

    @property
    def platforms(self) -> Sequence[PlatformLike]: ...


@dataclass(frozen=True, slots=True)
class PlatformSet:
    """The platforms every image of a pod supports.

    Attributes:
        pairs: the (os, architecture) pairs in the intersection, sorted.
        variants: (os, architecture, variant) triples seen for those pairs in any image,
            sorted; informational only.
        image_count: how many images were intersected (0: the set is meaningless).
    """

    pairs: tuple[tuple[str, str], ...]
    variants: tuple[tuple[str, str, str], ...] = ()
    image_count: int = 0

    @property
    def architectures(self) -> tuple[str, ...]:
        """Sorted distinct architectures of :attr:`pairs`."""
        return tuple(sorted({arch for _, arch in self.pairs}))

    @property
    def oses(self) -> tuple[str, ...]:
        """Sorted distinct operating systems of :attr:`pairs`."""
        return tuple(sorted({os_ for os_, _ in self.pairs}))

    @property
    def empty(self) -> bool:
        """True when no platform is common to all images (the pod can run nowhere)."""
        return not self.pairs

    @property
    def all_linux(self) -> bool:
        """True when every supported pair is linux: the one case the admission policy
        places (one term ``arch In [archs]`` AND ``os In [linux]``,
        :mod:`rules.admissionpolicy`)."""
        return bool(self.pairs) and all(os_ == LINUX for os_, _ in self.pairs)

    def strings(self) -> list[str]:
        """``["linux/amd64", ...]`` for the annotation."""
        return [f"{o}/{a}" for o, a in self.pairs]


def image_platform_pairs(image: ImageLike) -> set[tuple[str, str]]:
    """The (os, architecture) pairs of one image; ``unknown`` entries (attestations) and
    entries without os or architecture are not platforms (OCI image-spec index)."""
    out: set[tuple[str, str]] = set()
    for p in image.platforms:
        if not p.os or not p.architecture or "unknown" in (p.os, p.architecture):
            continue
        out.add((p.os, p.architecture))
    return out


def supported_platforms(images: Sequence[ImageLike]) -> PlatformSet:
    """Intersect the (os, architecture) pairs of ``images``.

    Returns a :class:`PlatformSet`; with no images it is empty with ``image_count`` 0
    (callers treat that as "no constraint can be derived").
    """
    if not images:
        return PlatformSet((), (), 0)
    common: set[tuple[str, str]] | None = None
    for image in images:
        pairs = image_platform_pairs(image)
        common = pairs if common is None else common & pairs
    common = common or set()
    variants = {
        (p.os, p.architecture, p.variant)
        for image in images
        for p in image.platforms
        if p.variant and (p.os, p.architecture) in common
    }
    return PlatformSet(
        tuple(sorted(common)),
        tuple(sorted((o, a, str(v)) for o, a, v in variants)),
        len(images),
    )


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """Architectures and (os, architecture) pairs of the cluster's nodes (from their
    ``kubernetes.io/arch`` / ``kubernetes.io/os`` labels). ``node_count`` 0 means unknown
    (no node seen yet): no "not in cluster" warning is given then."""

    architectures: frozenset[str] = frozenset()
    pairs: frozenset[tuple[str, str]] = frozenset()
    node_count: int = 0


def node_inventory(nodes: Iterable[Mapping[str, Any]]) -> NodeInventory:
    """Build a :class:`NodeInventory` from Node objects (dicts)."""
    archs: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    count = 0
    for node in nodes:
        count += 1
        labels = (node.get("metadata") or {}).get("labels") or {}
        arch = labels.get(ARCH_LABEL)
        if arch:
            archs.add(arch)
            pairs.add((labels.get(OS_LABEL) or LINUX, arch))
    return NodeInventory(frozenset(archs), frozenset(pairs), count)

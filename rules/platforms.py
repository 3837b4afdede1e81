"""Which platforms a pod can run on, from the platforms of its images.

A pod runs on a node only if every one of its images (init and app containers) has a
manifest for the node's (os, architecture). So the supported set is the intersection over
images of their (os, architecture) pairs, and a node is admissible only when its own pair is
one of them (:func:`rules.place.affinity.platform_requirement` writes that into the pod).
Variants (``arm64/v8``, ``arm/v7``) are recorded for the decision annotation but never
matched: nodes carry no variant label (``kubernetes.io/arch`` and ``kubernetes.io/os``
only). Windows entries carrying ``os.version`` add a build constraint per (windows,
architecture) pair (:func:`windows_builds`). Pure code, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from podplacement.rules.config import ARCH_LABEL, LINUX, OS_LABEL, WINDOWS

#: A Windows build as the node label ``node.kubernetes.io/windows-build`` carries it:
#: ``major.minor.build`` (the first three parts of an image's ``os.version``).
_BUILD_PARTS = 3


class PlatformLike(Protocol):
    """Anything with ``os``, ``architecture`` and ``variant`` (``imageinspect.Platform``)."""

    @property
    def os(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def variant(self) -> str | None: ...


def os_version_of(platform: PlatformLike) -> str | None:
    """``platform``'s ``os_version`` (``imageinspect.Platform``), None for platforms
    without one (older types, the catalog's pairs)."""
    value = getattr(platform, "os_version", None)
    return value if isinstance(value, str) and value else None


def windows_build(os_version: str | None) -> str | None:
    """The build (``major.minor.build``) of a Windows ``os.version``:
    ``10.0.17763.5458`` -> ``10.0.17763``; None when it has fewer than three parts (such a
    version names no build: the entry supports any)."""
    if not os_version:
        return None
    parts = os_version.split(".")
    if len(parts) < _BUILD_PARTS or not all(p.isdigit() for p in parts):
        return None
    return ".".join(parts[:_BUILD_PARTS])


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
        builds: per (windows, architecture) pair of :attr:`pairs` that carries a build
            constraint, the sorted Windows builds (``10.0.17763``) every image supports,
            as ``((os, arch), (build, ...))`` sorted by pair; a windows pair not listed
            runs on any build (:func:`windows_builds`).
    """

    pairs: tuple[tuple[str, str], ...]
    variants: tuple[tuple[str, str, str], ...] = ()
    image_count: int = 0
    builds: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()

    def builds_of(self, pair: tuple[str, str]) -> tuple[str, ...] | None:
        """The Windows builds ``pair`` is limited to, None when it has no such limit."""
        return next((b for p, b in self.builds if p == pair), None)

    def build_strings(self) -> dict[str, list[str]]:
        """``{"windows/amd64": ["10.0.17763"]}`` for the decision annotation (empty: no
        build constraint)."""
        return {f"{o}/{a}": list(b) for (o, a), b in self.builds}

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
        :mod:`rules.admit.admissionpolicy`)."""
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


def image_builds(image: ImageLike, pair: tuple[str, str]) -> frozenset[str] | None:
    """The Windows builds one image supports for ``pair`` (a windows pair): the builds of
    its entries of that pair, or None (any build) when one of them has no usable
    ``os.version`` (an image without ``os.version`` keeps the rule of before: every
    windows node of its architecture)."""
    builds: set[str] = set()
    for p in image.platforms:
        if (p.os, p.architecture) != pair:
            continue
        build = windows_build(os_version_of(p))
        if build is None:
            return None
        builds.add(build)
    return frozenset(builds)


def windows_builds(images: Sequence[ImageLike], pairs: Iterable[tuple[str, str]]
                   ) -> dict[tuple[str, str], tuple[str, ...]]:
    """Per windows pair of ``pairs`` (those every image supports), the builds every image
    supports: the intersection over the images that constrain it (:func:`image_builds`).
    A pair no image constrains is not in the result (any build); a pair whose images share
    no build maps to ``()`` (no host can run them all: the caller drops the pair).

    The rule: a process-isolated Windows container runs only on a host of the same build
    (kubernetes.io, "Windows containers in Kubernetes": version compatibility), and the
    kubelet labels Windows nodes ``node.kubernetes.io/windows-build=major.minor.build``.
    """
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for pair in sorted(set(pairs)):
        if pair[0] != WINDOWS:
            continue
        common: frozenset[str] | None = None
        for image in images:
            builds = image_builds(image, pair)
            if builds is not None:
                common = builds if common is None else common & builds
        if common is not None:
            out[pair] = tuple(sorted(common))
    return out


def supported_platforms(images: Sequence[ImageLike]) -> PlatformSet:
    """Intersect the (os, architecture) pairs of ``images``; a windows pair whose images
    carry ``os.version`` keeps only the builds every image supports, and is dropped when
    they share none (:func:`windows_builds`).

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
    builds = windows_builds(images, common)
    common -= {pair for pair, b in builds.items() if not b}
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
        tuple((pair, b) for pair, b in sorted(builds.items()) if b),
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

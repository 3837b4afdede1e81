"""Start the demo's two registries and push the real busybox images into them.

Two Debian ``docker-registry`` (CNCF distribution 2.8) processes on 127.0.0.1, started with
:mod:`podplacement.sandbox.registry`: plain HTTP for the public images, TLS with our own CA +
htpasswd basic auth for the private one. Images are pushed with
:class:`podplacement.sandbox.oci.Pusher`; every layer holds the genuine busybox binary of
its architecture (:mod:`podplacement.demo.images`), and media types follow the OCI image-spec
(index, manifest) and Docker image manifest v2 schema 2 (manifest list, manifest).

Tags (names from :mod:`podplacement.demo.workloads`):

- ``demo/busybox:multi`` OCI index: linux/amd64, arm64/v8, ppc64le, s390x, each followed by a
  BuildKit-style attestation entry (platform ``unknown/unknown``);
- ``demo/busybox:list`` Docker manifest list: amd64, arm64/v8;
- ``demo/busybox:s390x`` a single Docker v2 image;
- ``demo/busybox:arm64`` a single Docker v2 image (arm64/v8);
- ``demo/winonly:1`` an OCI index with only a windows/amd64 entry (its layer is a placeholder:
  no Windows busybox exists; only the platform matters to placement);
- ``private/busybox:1`` on the private registry: OCI index amd64 + arm64/v8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podplacement.demo.images import BusyboxBinary
from podplacement.demo.workloads import ARM64, LIST, MULTI, PRIVATE, S390X, WINONLY, DemoRegistries
from podplacement.sandbox.oci import Pushed, Pusher, parse_platform
from podplacement.sandbox.registry import Registry, start_registry


@dataclass
class DemoRegistryPair:
    """The two running registries: ``public`` (HTTP) and ``private`` (HTTPS + basic auth),
    each a :class:`podplacement.sandbox.registry.Registry`. :meth:`stop` stops both."""

    public: Registry
    private: Registry

    @property
    def names(self) -> DemoRegistries:
        """Hosts and credentials as :class:`DemoRegistries`."""
        return DemoRegistries(
            public=self.public.host,
            private=self.private.host,
            username=str(self.private.username),
            password=str(self.private.password),
        )

    @property
    def private_ca_pem(self) -> bytes:
        """PEM of the CA that signed the private registry's certificate."""
        return bytes(self.private.ca_pem or b"")

    def stop(self) -> None:
        """Stop both registry processes (idempotent)."""
        for reg in (self.private, self.public):
            if reg is not None:
                reg.stop()


def start_registries(work: Path) -> DemoRegistryPair:
    """Start both registries with storage under ``work`` (``registry-public``,
    ``registry-private``); stops the first if the second fails.

    Raises:
        podplacement.sandbox.registry.RegistryStartError: a registry did not start.
        ImportError: the ``bcrypt`` package (for the private registry's htpasswd) is missing.
    """
    public = start_registry(work / "registry-public")
    try:
        private = start_registry(work / "registry-private", tls=True, auth="basic")
    except BaseException:
        public.stop()
        raise
    return DemoRegistryPair(public, private)


#: The images' config runs ``sh`` (busybox's applet, through PATH), as the busybox image does.
SHELL: dict[str, Any] = {"Cmd": ["sh"]}


def _split(tag_ref: str) -> tuple[str, str]:
    repo, _, tag = tag_ref.rpartition(":")
    return repo, tag


def _platform(binary: BusyboxBinary) -> dict[str, str]:
    platform = {"os": "linux", "architecture": binary.architecture}
    if binary.variant:
        platform["variant"] = binary.variant
    return platform


def push_images(pair: DemoRegistryPair, busybox: Mapping[str, BusyboxBinary]) -> dict[str, str]:
    """Push every demo tag; returns tag → manifest digest (``sha256:...``).

    Args:
        busybox: OCI architecture → binary layer, from
            :func:`podplacement.demo.images.load_busybox_debs` (needs the four architectures).
    Raises:
        KeyError: an architecture is missing from ``busybox``.
        podplacement.sandbox.oci.PushError: the registry refused a push.
    """
    digests: dict[str, str] = {}
    with Pusher(pair.public) as pusher:
        repo, tag = _split(MULTI)
        children: list[tuple[Pushed, dict[str, Any]]] = []
        attestations: list[tuple[Pushed, dict[str, Any]]] = []
        for arch in ("amd64", "arm64", "ppc64le", "s390x"):
            b = busybox[arch]
            image = pusher.image(repo, None, architecture=arch, variant=b.variant, fmt="oci",
                                 layers=[b.layer], process=SHELL)
            children.append((image, _platform(b)))
            attestations.append(pusher.attestation(repo, image))
        # BuildKit lists the images first, then their attestation manifests.
        digests[MULTI] = pusher.index(repo, tag, children + attestations, fmt="oci").digest

        repo, tag = _split(LIST)
        entries = []
        for arch in ("amd64", "arm64"):
            b = busybox[arch]
            image = pusher.image(repo, None, architecture=arch, variant=b.variant,
                                 fmt="docker", layers=[b.layer], process=SHELL)
            entries.append((image, _platform(b)))
        digests[LIST] = pusher.index(repo, tag, entries, fmt="docker").digest

        repo, tag = _split(S390X)
        digests[S390X] = pusher.image(repo, tag, architecture="s390x", fmt="docker",
                                      layers=[busybox["s390x"].layer],
                                      process=SHELL).digest

        repo, tag = _split(ARM64)
        b = busybox["arm64"]
        digests[ARM64] = pusher.image(repo, tag, architecture="arm64", variant=b.variant,
                                      fmt="docker", layers=[b.layer], process=SHELL).digest

        repo, tag = _split(WINONLY)
        windows = parse_platform("windows/amd64")
        image = pusher.image(repo, None, os="windows", architecture="amd64", fmt="oci",
                             os_version=windows.get("os.version"))
        digests[WINONLY] = pusher.index(repo, tag, [(image, windows)], fmt="oci").digest

    with Pusher(pair.private) as pusher:
        repo, tag = _split(PRIVATE)
        entries = []
        for arch in ("amd64", "arm64"):
            b = busybox[arch]
            image = pusher.image(repo, None, architecture=arch, variant=b.variant, fmt="oci",
                                 layers=[b.layer], process=SHELL)
            entries.append((image, _platform(b)))
        digests[PRIVATE] = pusher.index(repo, tag, entries, fmt="oci").digest
    return digests

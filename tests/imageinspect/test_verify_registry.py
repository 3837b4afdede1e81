"""``podplacement inspect --verify`` against the real registry (Debian's docker-registry):
a lying index, an honest one, a script whose interpreter is for another architecture, zstd
layers, whiteouts across layers, the byte cap, early stop, and the bearer-token flow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from podplacement import cli
from podplacement.imageinspect import Credential, verify_image
from tests.harness.oci import OCI_LAYER_ZSTD, Pusher
from tests.harness.registry import Registry
from tests.imageinspect._images import elf, file, layer, symlink, whiteout
from tests.imageinspect.conftest import InspectorFactory, insecure, trust

REPO = Path(__file__).resolve().parents[2]
ARCHES = ("amd64", "arm64", "ppc64le", "s390x")


def _busybox() -> dict[str, bytes] | None:
    """Real busybox layers (bin/busybox + bin/sh -> busybox) by architecture, from the demo's
    Debian packages, or None without them."""
    candidates = [os.environ.get("PODPLACEMENT_DEMO_DEBS"), str(REPO / ".demo-cache" / "debs")]
    for c in candidates:
        if c and list(Path(c).glob("busybox-static_*_s390x.deb")):
            from podplacement.demo.images import load_busybox_debs

            return {arch: b.layer for arch, b in load_busybox_debs(Path(c)).items()}
    return None


BUSYBOX = _busybox()
needs_busybox = pytest.mark.skipif(
    BUSYBOX is None, reason="busybox-static .debs not found (hack/fetch-debs.sh fills "
    ".demo-cache/debs, or set PODPLACEMENT_DEMO_DEBS)")

SH = {"Cmd": ["sh"]}


def _index(p: Pusher, repo: str, tag: str, layers_by_arch: dict[str, list[bytes]],
           process: dict[str, object], **kw: object) -> str:
    children = []
    for arch, layers in layers_by_arch.items():
        img = p.image(repo, None, architecture=arch, fmt="oci", layers=layers,
                      process=process, **kw)  # type: ignore[arg-type]
        children.append((img, {"os": "linux", "architecture": arch}))
    return p.index(repo, tag, children).digest


@pytest.fixture(scope="module")
def images(registry: Registry, pusher: object) -> str:
    p: Pusher = pusher(registry)  # type: ignore[operator]
    bb = layer([file("bin/busybox", elf("amd64")), symlink("bin/sh", "busybox")])
    if BUSYBOX is not None:
        _index(p, "verify/lying", "v1", {"amd64": [BUSYBOX["amd64"]],
                                         "arm64": [BUSYBOX["amd64"]]}, SH)
        _index(p, "verify/honest", "v1", {a: [BUSYBOX[a]] for a in ARCHES}, SH)
        base = BUSYBOX["amd64"]
    else:
        base = bb
    # a script entrypoint in its own layer over a base whose /bin/sh is amd64
    script = layer([file("entrypoint.sh", b"#!/bin/sh\nexec sleep 1\n")])
    _index(p, "verify/script", "v1", {"amd64": [base, script], "arm64": [base, script]},
           {"Entrypoint": ["/entrypoint.sh"]})
    # zstd layers: arm64 honest, s390x lying
    _index(p, "verify/zstd", "v1", {
        "arm64": [layer([file("bin/app", elf("arm64"))], "zstd")],
        "s390x": [layer([file("bin/app", elf("amd64"))], "zstd")],
    }, {"Entrypoint": ["app"], "Env": ["PATH=/usr/local/bin:/bin"]},
        layer_media_type=OCI_LAYER_ZSTD)
    # whiteouts: the lower layer's wrong /usr/local/bin/app is deleted, /bin/app is right
    lower = layer([file("usr/local/bin/app", elf("amd64")), file("bin/app", elf("arm64"))])
    _index(p, "verify/whiteout", "v1", {"arm64": [lower, layer([whiteout("usr/local/bin/app")])]},
           {"Cmd": ["app"], "Env": ["PATH=/usr/local/bin:/bin"]})
    _index(p, "verify/nowhiteout", "v1", {"arm64": [lower, layer([file("etc/x", b"x", 0o644)])]},
           {"Cmd": ["app"], "Env": ["PATH=/usr/local/bin:/bin"]})
    # a big incompressible bottom layer under a top layer holding the program
    # the tool after 2 MiB of incompressible filler: a 300 kB cap always stops before it
    big = layer([file("filler", os.urandom(2 * 1024 * 1024)), file("bin/tool", elf("amd64"))])
    top = layer([file("app", elf("arm64"))])
    _index(p, "verify/big", "v1", {"arm64": [big, top]}, {"Entrypoint": ["/app"]})
    _index(p, "verify/bigtool", "v1", {"arm64": [big, top]}, {"Entrypoint": ["/bin/tool"]})
    # a single manifest, no index, and one with neither Entrypoint nor Cmd
    p.image("verify/single", "v1", architecture="ppc64le", fmt="oci",
            layers=[layer([file("bin/app", elf("ppc64le"))])], process={"Cmd": ["/bin/app"]})
    p.image("verify/noprogram", "v1", architecture="amd64", fmt="oci", layers=[bb])
    return registry.host


async def _verify(make_inspector: InspectorFactory, host: str, repo: str, **kw: object):  # type: ignore[no-untyped-def]
    insp = await make_inspector(registries=insecure(host))
    return await verify_image(insp, f"{host}/{repo}", **kw)  # type: ignore[arg-type]


def _status(report: object) -> dict[str, str]:
    return {p.platform: p.status for p in report.platforms}  # type: ignore[attr-defined]


@needs_busybox
def test_cli_flags_the_lying_arm64_entry_and_passes_amd64(
        images: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["inspect", "--verify", "--json", "--insecure-registry", images,
                     f"{images}/verify/lying:v1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3
    assert out[0]["mismatched"] == ["linux/arm64"]
    by = {p["platform"]: p for p in out[0]["platforms"]}
    assert by["linux/amd64"]["status"] == "ok"
    arm = by["linux/arm64"]
    assert arm["status"] == "mismatch"
    assert arm["files"][0]["path"] == "/bin/busybox"
    assert arm["files"][0]["via"][-1] == "/bin/sh"
    assert arm["files"][0]["machine"] == 62 and arm["files"][0]["architecture"] == "amd64"


@needs_busybox
def test_cli_text_output_names_the_binary_and_the_figures(
        images: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["inspect", "--verify", "--insecure-registry", images,
                     f"{images}/verify/lying:v1"])
    out = capsys.readouterr().out
    assert code == 3
    assert "mismatched: linux/arm64" in out
    assert "linux/arm64: MISMATCH: /bin/busybox is ELF 64-bit LSB EM_X86_64 (amd64), not arm64" \
        in out
    assert "read " in out and "layers" in out


@needs_busybox
def test_honest_multiarch_image_has_no_finding(
        images: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["inspect", "--verify", "--json", "--insecure-registry", images,
                     f"{images}/verify/honest:v1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out[0]["mismatched"] == []
    assert {p["platform"]: p["status"] for p in out[0]["platforms"]} == {
        f"linux/{a}": "ok" for a in ARCHES}


async def test_script_is_reported_and_its_wrong_interpreter_flagged(
        images: str, make_inspector: InspectorFactory) -> None:
    report = await _verify(make_inspector, images, "verify/script:v1")
    assert _status(report) == {"linux/amd64": "ok", "linux/arm64": "mismatch"}
    arm = report.platforms[1]
    assert [f.kind for f in arm.files] == ["script", "elf"]
    assert arm.files[0].path == "/entrypoint.sh" and arm.files[0].detail == "#!/bin/sh"
    assert arm.files[0].layer == 0  # the newest layer
    assert arm.files[1].name == "/bin/sh" and arm.files[1].architecture == "amd64"
    assert arm.layers_read == 2


async def test_zstd_layers(images: str, make_inspector: InspectorFactory) -> None:
    report = await _verify(make_inspector, images, "verify/zstd:v1")
    assert _status(report) == {"linux/arm64": "ok", "linux/s390x": "mismatch"}


async def test_whiteout_in_an_upper_layer_hides_the_wrong_binary(
        images: str, make_inspector: InspectorFactory) -> None:
    hidden = await _verify(make_inspector, images, "verify/whiteout:v1")
    assert _status(hidden) == {"linux/arm64": "ok"}
    assert hidden.platforms[0].files[0].path == "/bin/app"
    shown = await _verify(make_inspector, images, "verify/nowhiteout:v1")
    assert _status(shown) == {"linux/arm64": "mismatch"}
    assert shown.platforms[0].files[0].path == "/usr/local/bin/app"


async def test_found_in_the_newest_layer_stops_before_the_big_one(
        images: str, make_inspector: InspectorFactory) -> None:
    report = await _verify(make_inspector, images, "verify/big:v1")
    arm = report.platforms[0]
    assert arm.status == "ok" and arm.layers_read == 1 and arm.layers == 2
    assert arm.bytes_read < 64 * 1024


async def test_byte_cap_is_said(images: str, make_inspector: InspectorFactory) -> None:
    report = await _verify(make_inspector, images, "verify/bigtool:v1", max_bytes=300_000)
    arm = report.platforms[0]
    assert arm.status == "incomplete" and arm.cap_hit
    assert "cap of 300000 bytes" in arm.reason
    assert 300_000 < arm.bytes_read <= 300_000 + 64 * 1024
    whole = await _verify(make_inspector, images, "verify/bigtool:v1")
    assert whole.platforms[0].status == "mismatch" and not whole.platforms[0].cap_hit


async def test_single_manifest_and_no_program(images: str,
                                              make_inspector: InspectorFactory) -> None:
    single = await _verify(make_inspector, images, "verify/single:v1")
    assert _status(single) == {"linux/ppc64le": "ok"}
    none = await _verify(make_inspector, images, "verify/noprogram:v1")
    assert _status(none) == {"linux/amd64": "no-entrypoint"}


async def test_pod_command_replaces_the_entrypoint(images: str,
                                                   make_inspector: InspectorFactory) -> None:
    report = await _verify(make_inspector, images, "verify/big:v1", command=["/bin/tool"],
                           max_bytes=10 * 1024 * 1024)
    assert report.platforms[0].program == "/bin/tool"
    assert report.platforms[0].status == "mismatch"


async def test_bearer_token_registry(token_registry: Registry, pusher: object,
                                     make_inspector: InspectorFactory) -> None:
    p: Pusher = pusher(token_registry)  # type: ignore[operator]
    _index(p, "verify/private", "v1", {"amd64": [layer([file("app", elf("arm64"))])]},
           {"Entrypoint": ["/app"]})
    insp = await make_inspector(ca_bundles=trust(token_registry))
    cred = Credential(token_registry.host, token_registry.username or "",
                      token_registry.password or "")
    report = await verify_image(insp, f"{token_registry.host}/verify/private:v1", [cred])
    assert report.mismatched == ("linux/amd64",)

"""hack/image.sh: the product's OCI image, built without a container daemon, for the host's
architecture and one foreign architecture (the full build does amd64 and arm64). The image is
pushed to the real test registry and read back with ``podplacement inspect``; the host
architecture's root filesystem runs the product under ``chroot`` as user 65532 with the image
config's environment; the foreign one is checked by the ELF machine of its interpreter and of
compiled wheels. Also: deploy/overlays/registry renders both Deployments with a registry's
image through kubectl's built-in kustomize.

The build needs root, mmdebstrap, umoci and skopeo (hack/setup.sh installs them) and the
network (Debian mirror, package index); it reuses ~/.cache/podplacement/image."""

from __future__ import annotations

import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.version import source_version
from tests.harness.registry import Registry

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "image.sh"
#: pyproject.toml's version: the image's label and what its --version prints
VERSION = source_version(REPO)
TAG = "0.1.0-test"
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())
FOREIGN_ARCH = "arm64" if HOST_ARCH == "amd64" else "amd64"
#: ELF e_machine per OCI architecture (EM_X86_64, EM_AARCH64, EM_PPC64, EM_S390)
E_MACHINE = {"amd64": 62, "arm64": 183, "ppc64le": 21, "s390x": 22}
INDEX = "application/vnd.oci.image.index.v1+json"
REF = "org.opencontainers.image.ref.name"
LIB = "opt/podplacement/lib"


def _missing() -> str | None:
    if HOST_ARCH is None:
        return f"no image for this host's architecture {platform.machine()}"
    if os.geteuid() != 0:
        return "hack/image.sh and chroot need root"
    tools = [t for t in ("mmdebstrap", "umoci", "skopeo", "chroot", "tar") if not shutil.which(t)]
    if tools:
        return f"not installed: {', '.join(tools)} (bash hack/setup.sh)"
    return None


needs_build = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@dataclass
class Built:
    """An image built by hack/image.sh and pushed to the test registry."""

    layout: Path
    ref: str
    registry: Registry
    seconds: float
    log: str

    def blob(self, digest: str) -> bytes:
        return (self.layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()

    def json_blob(self, digest: str) -> Any:
        return json.loads(self.blob(digest))

    def top(self) -> dict[str, Any]:
        return {
            d["annotations"][REF]: d
            for d in json.loads((self.layout / "index.json").read_text())["manifests"]
        }

    def manifest(self, arch: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json_blob(self.top()[f"{TAG}-{arch}"]["digest"])
        return result

    def config(self, arch: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json_blob(self.manifest(arch)["config"]["digest"])
        return result

    def layer_paths(self, arch: str) -> list[Path]:
        blobs = self.layout / "blobs" / "sha256"
        return [blobs / layer["digest"].split(":", 1)[1] for layer in self.manifest(arch)["layers"]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Built]:
    """Run hack/image.sh for the host and one foreign architecture into a temp layout and push
    it to the plain-HTTP test registry (INSECURE=1). Wheels come from the script's cache when
    it has them (CACHED_WHEELS=1)."""
    out = tmp_path_factory.mktemp("image") / "oci"
    ref = f"{registry.host}/podplacement/test:{TAG}"
    env = {
        **os.environ,
        "OUT": str(out),
        "ARCHS": f"{HOST_ARCH} {FOREIGN_ARCH}",
        "TAG": TAG,
        "REGISTRY": ref,
        "INSECURE": "1",
        "CACHED_WHEELS": "1",
        "PYTHON": sys.executable,
    }
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.monotonic() - start
    assert proc.returncode == 0, f"hack/image.sh failed ({proc.returncode}):\n{proc.stderr}"
    yield Built(out, ref, registry, seconds, proc.stderr)
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def host_rootfs(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The host architecture's root filesystem, its layers extracted in order, bind-mounted
    read-only (as deploy/ runs it: readOnlyRootFilesystem) when this machine allows mounts."""
    base = tmp_path_factory.mktemp("rootfs")
    root, ro = base / "rootfs", base / "ro"
    root.mkdir()
    ro.mkdir()
    for layer in built.layer_paths(HOST_ARCH or "amd64"):
        subprocess.run(
            ["tar", "--numeric-owner", "-xzf", str(layer), "-C", str(root)], check=True,
            capture_output=True,
        )
    bind = subprocess.run(["mount", "--bind", str(root), str(ro)], capture_output=True,
                          check=False)
    if bind.returncode != 0:
        warnings.warn(f"no read-only bind mount here: {bind.stderr!r}", stacklevel=1)
        yield root
        return
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True,
                       capture_output=True)
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True)


def _elf_machine(head: bytes) -> int:
    """e_machine of an ELF header (offset 18; byte order from EI_DATA)."""
    assert head[:4] == b"\x7fELF", head[:4]
    order = "<" if head[5] == 1 else ">"
    machine: int = struct.unpack_from(f"{order}H", head, 18)[0]
    return machine


def _chroot(root: Path, config: dict[str, Any], *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``root`` as the image's user with exactly the image config's environment
    (the command found through the config's PATH inside the root)."""
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    user = config["config"]["User"]
    chroot = shutil.which("chroot")
    assert chroot is not None
    return subprocess.run(
        [chroot, f"--userspec={user}", str(root), *argv],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


@needs_build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_index_holds_exactly_the_built_platforms(built: Built) -> None:
    top = built.top()
    assert set(top) == {TAG, f"{TAG}-{HOST_ARCH}", f"{TAG}-{FOREIGN_ARCH}"}
    assert top[TAG]["mediaType"] == INDEX
    index = built.json_blob(top[TAG]["digest"])
    assert index["mediaType"] == INDEX
    platforms = {
        (m["platform"]["os"], m["platform"]["architecture"], m["platform"].get("variant"))
        for m in index["manifests"]
    }
    want = {("linux", a, "v8" if a == "arm64" else None) for a in (HOST_ARCH, FOREIGN_ARCH)}
    assert platforms == want
    for m in index["manifests"]:
        arch = m["platform"]["architecture"]
        assert m["digest"] == top[f"{TAG}-{arch}"]["digest"]
        assert built.config(arch)["architecture"] == arch
        assert built.config(arch)["os"] == "linux"
        assert len(built.manifest(arch)["layers"]) == 1
    skopeo = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci:{built.layout}:{TAG}"],
        capture_output=True, check=True,
    )
    assert json.loads(skopeo.stdout) == index


@needs_build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_podplacement_inspect_reads_the_pushed_platforms(built: Built) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "inspect", "--json",
         "--insecure-registry", built.registry.host, built.ref],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["mediaType"] == INDEX
    assert sorted(result["platforms"]) == sorted(
        f"linux/{a}/v8" if a == "arm64" else f"linux/{a}" for a in (HOST_ARCH, FOREIGN_ARCH)
    )
    # pushed with the digests of the layout
    assert result["digest"] == built.top()[TAG]["digest"]


@needs_build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_image_config(built: Built) -> None:
    for arch in (HOST_ARCH or "amd64", FOREIGN_ARCH):
        config = built.config(arch)["config"]
        assert config["User"] == "65532:65532"
        assert config["Entrypoint"] == ["podplacement"]
        assert config["Cmd"] == ["--help"]
        assert config["WorkingDir"] == "/"
        env = dict(item.split("=", 1) for item in config["Env"])
        assert env["PYTHONPATH"] == "/opt/podplacement/lib"
        assert env["PYTHONDONTWRITEBYTECODE"] == "1"
        assert "/usr/local/bin" in env["PATH"].split(":")
        assert set(config["ExposedPorts"]) == {"9443/tcp", "8080/tcp"}
        labels = config["Labels"]
        assert labels["org.opencontainers.image.title"] == "podplacement"
        assert labels["org.opencontainers.image.version"] == VERSION


@needs_build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_host_root_filesystem_runs_the_product(built: Built, host_rootfs: Path) -> None:
    config = built.config(HOST_ARCH or "amd64")
    entrypoint = config["config"]["Entrypoint"]
    version = _chroot(host_rootfs, config, *entrypoint, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"podplacement {VERSION}"
    webhook = _chroot(host_rootfs, config, *entrypoint, "webhook", "--help")
    assert webhook.returncode == 0, webhook.stderr
    assert webhook.stdout.startswith("usage: podplacement webhook")
    # every compiled dependency loads (numpy needs libstdc++ from the base), the CA bundle is
    # at OpenSSL's default path, and the byte code shipped is used, not rewritten
    probe = (
        "import sys, ssl, importlib.util\n"
        "import numpy, orjson, msgspec, uvloop, httptools, yaml, xxhash, pydantic_core\n"
        "import cryptography.hazmat.bindings._rust, aiohttp, multidict, frozenlist, yarl\n"
        "import kubernetes.client, kubernetes.aio.client\n"
        "import podplacement.controller.cli, podplacement.webhook.cli\n"
        "import podplacement.imageinspect.cli, podplacement.certs.cli\n"
        "assert yaml.__with_libyaml__, 'libyaml'\n"
        "assert numpy.arange(3).sum() == 3\n"
        "assert sys.flags.dont_write_bytecode\n"
        "n = len(ssl.create_default_context().get_ca_certs())\n"
        "assert n > 100, n\n"
        "spec = importlib.util.find_spec('kubernetes.client.api.core_v1_api')\n"
        "import os; assert os.path.exists(spec.cached), spec.cached\n"
        "print(sys.version_info[:2], numpy.__version__)\n"
    )
    imports = _chroot(host_rootfs, config, "/usr/bin/python3", "-c", probe)
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.startswith("(3, 11)")
    assert not list(host_rootfs.glob("dev/*")), "device nodes in the layer"
    passwd = (host_rootfs / "etc" / "passwd").read_text()
    assert "nonroot:x:65532:65532:" in passwd


@needs_build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_root_filesystem_is_built_for_its_architecture(built: Built) -> None:
    for arch in (HOST_ARCH or "amd64", FOREIGN_ARCH):
        heads: dict[str, bytes] = {}
        for layer in built.layer_paths(arch):
            with tarfile.open(layer, "r|gz") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    wanted = (
                        name == "usr/bin/python3.11"
                        or (name.startswith(f"{LIB}/orjson/orjson.") and name.endswith(".so"))
                        or (name.startswith(f"{LIB}/numpy/_core/_multiarray_umath.")
                            and name.endswith(".so"))
                    )
                    if wanted and member.isfile():
                        f = tar.extractfile(member)
                        assert f is not None
                        heads[name] = f.read(64)
        assert len(heads) == 3, f"{arch}: found only {sorted(heads)}"
        for name, head in heads.items():
            assert _elf_machine(head) == E_MACHINE[arch], f"{arch}: {name}"


def test_the_registry_overlay_names_the_pushed_image(tmp_path: Path, registry: Registry) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH")
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    overlay = deploy / "overlays" / "registry" / "kustomization.yaml"
    text = overlay.read_text()
    assert "newName: registry.example.com/podplacement" in text
    # what the overlay's comment tells users to do
    subprocess.run(
        ["sed", "-i", "-e", f"s|newName: .*|newName: {registry.host}/podplacement/test|",
         "-e", f"s|newTag: .*|newTag: {TAG}|", str(overlay)],
        check=True,
    )
    proc = subprocess.run(
        [kubectl, "kustomize", str(overlay.parent)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    images = {
        d["metadata"]["name"]: [c["image"] for c in d["spec"]["template"]["spec"]["containers"]]
        for d in docs
        if d["kind"] == "Deployment"
    }
    want = [f"{registry.host}/podplacement/test:{TAG}"]
    assert images == {"podplacement-webhook": want, "podplacement-controller": want}
    # everything else is deploy/ itself
    base = subprocess.run(
        [kubectl, "kustomize", str(deploy)], capture_output=True, text=True, timeout=60,
        check=True,
    )
    plain = [d for d in yaml.safe_load_all(base.stdout) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        (d["kind"], d["metadata"]["name"]) for d in plain
    ]

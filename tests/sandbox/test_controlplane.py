"""Finding the control plane (``KUBEBUILDER_ASSETS``, else ``shared/k8s-bin`` decompressed and
checked once into the cache, else the cache alone) and stopping it within seconds."""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import threading
import time
from pathlib import Path

import httpx
import pytest

from podplacement.sandbox import controlplane as cp
from podplacement.sandbox.controlplane import AssetsNotFound, locate_assets

BINARY = b"#!/bin/sh\necho fake\n"


def _k8s_bin(base: Path, content: bytes = BINARY) -> Path:
    """A ``shared/k8s-bin`` beside ``base`` with tiny stand-ins and their sums."""
    k8s_bin = base / "shared" / "k8s-bin"
    k8s_bin.mkdir(parents=True)
    lines = []
    for name in cp.K8S_BINARIES:
        (k8s_bin / f"{name}.xz").write_bytes(lzma.compress(content + name.encode()))
        lines.append(f"    {hashlib.sha256(content + name.encode()).hexdigest()}  {name}")
    (k8s_bin / "README.md").write_text("SHA-256:\n\n" + "\n".join(lines) + "\n")
    return k8s_bin


@pytest.fixture(autouse=True)
def _no_explicit_k8s_bin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODPLACEMENT_K8S_BIN", raising=False)
    if cp.find_etcd() is None:
        pytest.skip("no etcd (hack/setup.sh installs Debian's etcd-server)")


def test_kubebuilder_assets_comes_first(tmp_path: Path) -> None:
    _k8s_bin(tmp_path / "clone")
    assets_dir = tmp_path / "assets"
    assets_dir.mkdir()
    for name in ("etcd", "kube-apiserver"):
        (assets_dir / name).write_bytes(BINARY)
        (assets_dir / name).chmod(0o755)
    got = locate_assets({"KUBEBUILDER_ASSETS": str(assets_dir)}, starts=[tmp_path / "clone"],
                        cache=tmp_path / "cache")
    assert (got.directory, got.source) == (assets_dir, "KUBEBUILDER_ASSETS")
    assert not (tmp_path / "cache").exists()


def test_k8s_bin_is_decompressed_and_checked_once_then_trusted_by_its_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    k8s_bin = _k8s_bin(tmp_path)
    cache = tmp_path / "cache"
    got = locate_assets({}, starts=[tmp_path / "shared"], cache=cache)
    assert (got.directory, got.source) == (cache, str(k8s_bin))
    for name in cp.K8S_BINARIES:
        assert (cache / name).read_bytes() == BINARY + name.encode()
    assert got.binary("etcd") is not None
    stamp = json.loads((cache / cp.VERIFIED_STAMP).read_text())
    assert set(stamp) == set(cp.K8S_BINARIES)

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(cp, "_sha256", no_hashing)
    assert locate_assets({}, starts=[tmp_path / "shared"], cache=cache).directory == cache
    monkeypatch.undo()
    monkeypatch.delenv("PODPLACEMENT_K8S_BIN", raising=False)
    # a binary changed behind the stamp's back is checked, found wrong and replaced
    (cache / "kube-scheduler").write_bytes(b"tampered")
    locate_assets({}, starts=[tmp_path / "shared"], cache=cache)
    assert (cache / "kube-scheduler").read_bytes() == BINARY + b"kube-scheduler"


def test_a_wrong_sum_is_refused(tmp_path: Path) -> None:
    k8s_bin = _k8s_bin(tmp_path)
    (k8s_bin / "kube-apiserver.xz").write_bytes(lzma.compress(b"something else"))
    with pytest.raises(AssetsNotFound, match="not the listed"):
        locate_assets({}, starts=[tmp_path / "shared"], cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "kube-apiserver").exists()


def test_without_k8s_bin_the_cache_left_by_an_earlier_run_is_used(tmp_path: Path) -> None:
    _k8s_bin(tmp_path / "clone")
    cache = tmp_path / "cache"
    locate_assets({}, starts=[tmp_path / "clone"], cache=cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = locate_assets({}, starts=[elsewhere], cache=cache)
    assert (got.directory, got.source) == (cache, "cache")
    assert got.binary("kube-apiserver") is not None and got.binary("etcd") is not None


def test_nothing_found_says_what_was_looked_for_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(AssetsNotFound) as info:
        locate_assets({}, starts=[tmp_path], cache=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "KUBEBUILDER_ASSETS is unset" in message and "shared/k8s-bin" in message
    assert "to get one" in message


@pytest.mark.realcluster
def test_the_api_server_stops_within_seconds_while_a_client_still_watches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    try:
        assets = locate_assets()
    except AssetsNotFound as exc:
        pytest.skip(str(exc))
    caplog.set_level("INFO", logger="podplacement.sandbox")
    plane = cp.start_control_plane(assets, tmp_path, scheduler=False,
                                   controller_manager=False)
    ended = threading.Event()

    def watch() -> None:
        # a Lease watch, as the webhook keeps one open: without the shutdown flags the API
        # server waits for it for 60 s
        with contextlib.suppress(httpx.HTTPError), plane.client(timeout=None) as c, c.stream(
                "GET", "/apis/coordination.k8s.io/v1/leases", params={"watch": "1"}) as r:
            for _ in r.iter_lines():
                pass
        ended.set()

    try:
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        time.sleep(1.0)
        began = time.monotonic()
        plane.stop_process("kube-apiserver", timeout=30)
        took = time.monotonic() - began
    finally:
        plane.stop()
    assert plane.processes["kube-apiserver"].returncode == 0
    assert took < 5, f"kube-apiserver took {took:.1f} s to stop"
    assert ended.wait(5)
    messages = [r.getMessage() for r in caplog.records if r.name == "podplacement.sandbox"]
    for name in ("etcd", "kube-apiserver"):
        assert any(m.startswith(f"started {name} (pid ") for m in messages), messages
        assert any(m.startswith(f"stopped {name} (pid ") for m in messages), messages



def test_the_kubelet_is_found_like_the_control_plane_and_keeps_the_others_stamps(
        tmp_path: Path) -> None:
    k8s_bin = _k8s_bin(tmp_path / "clone")
    (k8s_bin / "kubelet.xz").write_bytes(lzma.compress(BINARY + b"kubelet"))
    with (k8s_bin / "README.md").open("a") as f:
        f.write(f"    {hashlib.sha256(BINARY + b'kubelet').hexdigest()}  kubelet\n")
    cache = tmp_path / "cache"
    locate_assets({}, starts=[tmp_path / "clone"], cache=cache)
    assert not (cache / "kubelet").exists()  # a control plane alone does not need it
    found = cp.locate_kubelet({}, starts=[tmp_path / "clone"], cache=cache)
    assert found == cache / "kubelet" and found.read_bytes() == BINARY + b"kubelet"
    stamp = json.loads((cache / cp.VERIFIED_STAMP).read_text())
    assert set(stamp) == {*cp.K8S_BINARIES, "kubelet"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert cp.locate_kubelet({}, starts=[elsewhere], cache=cache) == found
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "kubelet").write_bytes(BINARY)
    (assets / "kubelet").chmod(0o755)
    assert cp.locate_kubelet({"KUBEBUILDER_ASSETS": str(assets)}, starts=[elsewhere],
                             cache=cache) == assets / "kubelet"
    with pytest.raises(AssetsNotFound, match="no kubelet"):
        cp.locate_kubelet({}, starts=[elsewhere], cache=tmp_path / "empty")

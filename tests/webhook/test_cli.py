"""``podplacement webhook`` as a real process: serves TLS, becomes ready, stops on SIGTERM."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from podplacement.certs import load_bundle
from podplacement.rules.config import API_VERSION, CONFIG_KIND, CONFIG_NAME
from podplacement.sandbox.ports import free_port
from podplacement.webhook.configsource import CONFIG_LIST_PATH
from tests.harness.kube import KubeEnv
from tests.webhook.reference import raw_body


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "podplacement", "--log-format", "text", "webhook", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_ready(client: httpx.Client, url: str, proc: subprocess.Popen[str]) -> None:
    """Poll /readyz (at most 30 s) until 200; fail if the process exits."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.get(f"{url}/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "webhook did not become ready"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, wait (kill after 20 s); returns the output and asserts exit status 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        out = proc.communicate(timeout=20)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0]
    assert proc.returncode == 0, out
    return out


def test_webhook_process_serves_tls_and_stops_on_sigterm(cert_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                                      "metadata": {"name": CONFIG_NAME}, "spec": {}}))
    port = free_port()
    proc = start("--host", "127.0.0.1", "--port", str(port), "--cert-dir", str(cert_dir),
                 "--config-file", str(config))
    ctx = ssl.create_default_context(cadata=load_bundle(cert_dir).decode())
    try:
        with httpx.Client(verify=ctx, timeout=5) as client:
            wait_ready(client, f"https://127.0.0.1:{port}", proc)
            resp = client.post(f"https://127.0.0.1:{port}/mutate", content=raw_body("a-plain-pod"))
            assert resp.status_code == 200
            assert resp.json()["response"]["patchType"] == "JSONPatch"
            metrics = client.get(f"https://127.0.0.1:{port}/metrics").text
            assert "podplacement_webhook_gated_pods_total 1.0" in metrics
    finally:
        stop(proc)


def test_webhook_without_certificates_exits_1(tmp_path: Path) -> None:
    proc = start("--port", str(free_port()), "--cert-dir", str(tmp_path / "missing"),
                 "--config-file", "/dev/null")
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, out
    assert "failed to start" in out


@pytest.mark.parametrize("flag", ["--port", "--cert-dir", "--kubeconfig", "--namespace",
                                  "--config-file", "--host", "--max-body-bytes",
                                  "--body-timeout", "--header-timeout", "--max-connections"])
def test_webhook_help_lists_the_flags(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from podplacement import cli

    with pytest.raises(SystemExit):
        cli.main(["webhook", "--help"])
    assert flag in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--max-body-bytes", "0"], ["--max-body-bytes", "1.5"],
                                  ["--body-timeout", "0"], ["--header-timeout", "nan"],
                                  ["--header-timeout", "inf"], ["--max-connections", "-1"]])
def test_webhook_refuses_unusable_limits(args: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from podplacement import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["webhook", *args])
    assert exit_.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_webhook_process_applies_the_limit_flags(cert_dir: Path, tmp_path: Path) -> None:
    """``--max-body-bytes`` and ``--header-timeout`` reach the served app and protocol."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                                      "metadata": {"name": CONFIG_NAME}, "spec": {}}))
    port = free_port()
    proc = start("--port", str(port), "--cert-dir", str(cert_dir), "--config-file", str(config),
                 "--max-body-bytes", "1000", "--body-timeout", "2", "--header-timeout", "1",
                 "--max-connections", "50")
    ctx = ssl.create_default_context(cadata=load_bundle(cert_dir).decode())
    url = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=ctx, timeout=5) as client:
            wait_ready(client, url, proc)
            resp = client.post(f"{url}/mutate", content=raw_body("a-plain-pod"))
            assert resp.status_code == 413
            assert "over the limit of 1000 bytes" in resp.json()["error"]
            with socket.create_connection(("127.0.0.1", port)) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(10)
                started = time.monotonic()
                tls.sendall(b"POST /mutate HTTP/1.1\r\n")  # and no more
                try:
                    assert tls.recv(1) == b""  # closed without an answer
                except (ConnectionError, ssl.SSLError):
                    pass
                assert time.monotonic() - started < 8
            metrics = client.get(f"{url}/metrics").text
            assert ('podplacement_webhook_requests_total{outcome="bad_request",'
                    'reason="body_too_large"} 1.0') in metrics
            assert "podplacement_webhook_header_timeouts_total 1.0" in metrics
    finally:
        stop(proc)


def test_webhook_process_reads_the_config_from_the_api(
    cert_dir: Path, fresh_localkube: KubeEnv
) -> None:
    """``--kubeconfig``: list + watch against localkube; gating starts once the
    PodPlacementConfig exists."""
    port = free_port()
    proc = start("--port", str(port), "--cert-dir", str(cert_dir),
                 "--kubeconfig", str(fresh_localkube.kubeconfig))
    ctx = ssl.create_default_context(cadata=load_bundle(cert_dir).decode())
    url = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=ctx, timeout=5) as client:
            wait_ready(client, url, proc)
            first = client.post(f"{url}/mutate", content=raw_body("a-plain-pod")).json()
            assert "patch" not in first["response"]  # no config yet
            fresh_localkube.create(CONFIG_LIST_PATH, {
                "apiVersion": API_VERSION, "kind": CONFIG_KIND,
                "metadata": {"name": CONFIG_NAME}, "spec": {}})
            for _ in range(200):
                answer = client.post(f"{url}/mutate", content=raw_body("a-plain-pod")).json()
                if "patch" in answer["response"]:
                    break
                time.sleep(0.05)
            assert "patch" in answer["response"]
    finally:
        stop(proc)


# --- issue 15 ---------------------------------------------------------------------------------

def test_webhook_help_has_a_description_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from podplacement import cli

    with pytest.raises(SystemExit):
        cli.main(["webhook", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Serve the mutating admission webhook" in text
    assert "(default: 9443)" in text and "(default: 2.0)" in text
    assert "(default: /etc/podplacement/webhook-certs)" in text


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_webhook_names_the_missing_certificate_path(what: str, tmp_path: Path) -> None:
    cert_dir = tmp_path / "missing"
    if what == "empty":
        cert_dir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "--log-format", "text", "webhook", "--port",
         str(free_port()), "--cert-dir", str(cert_dir), "--config-file", "/dev/null"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "[Errno" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "failed to start" in lines[0] and str(cert_dir) in lines[0]
    assert ("does not exist" if what == "missing" else "has no tls.crt or tls.key") in lines[0]


def test_webhook_logs_the_address_it_listens_on(cert_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                                      "metadata": {"name": CONFIG_NAME}, "spec": {}}))
    port = free_port()
    proc = start("--port", str(port), "--cert-dir", str(cert_dir), "--config-file", str(config))
    ctx = ssl.create_default_context(cadata=load_bundle(cert_dir).decode())
    try:
        with httpx.Client(verify=ctx, timeout=5) as client:
            wait_ready(client, f"https://127.0.0.1:{port}", proc)
    finally:
        out = stop(proc)
    assert f"webhook listening on https://127.0.0.1:{port}" in out

"""``podplacement controller`` as a real process: it ungates a pod, serves /readyz and
/metrics on 127.0.0.1, and exits 0 on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from podplacement import certs
from podplacement.cli import build_parser
from podplacement.controller.cli import options_from_args
from podplacement.kubeclient import KubeAPI
from podplacement.sandbox.ports import free_port
from tests.controller.conftest import Images, create_pod, eventually, gated_pod, wait_ungated
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry


def test_parser_has_the_issue_flags() -> None:
    args = build_parser().parse_args(
        [
            "controller",
            "--kubeconfig",
            "k",
            "--namespace",
            "ns",
            "--workers",
            "4",
            "--metrics-port",
            "9",
            "--no-events",
            "--registries-conf",
            "r.conf",
            "--webhook-service",
            "svc",
            "--cert-dir",
            "d",
        ]
    )
    assert (args.kubeconfig, args.namespace, args.workers, args.metrics_port) == ("k", "ns", 4, 9)
    assert args.no_events and args.webhook_service == "svc" and args.cert_dir == "d"


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["controller", *argv])


def test_registry_and_cert_manager_flags_become_options(tmp_path: Path) -> None:
    ca_a, ca_b = certs.generate_ca().cert_pem, certs.generate_ca().cert_pem
    (tmp_path / "a.pem").write_bytes(ca_a)
    (tmp_path / "b.pem").write_bytes(ca_b)
    args = _parse(
        "--ca-file", f"reg.example:5000={tmp_path / 'a.pem'}",
        "--ca-file", f"reg.example:5000={tmp_path / 'b.pem'}",
        "--ca-file", f"127.0.0.1:8443={tmp_path / 'b.pem'}",
        "--insecure-registry", "127.0.0.1:5000", "--insecure-registry", "plain.test",
        "--webhook-service", "podplacement-webhook",
        "--cert-manager-certificate", "podplacement-system/podplacement-webhook",
    )
    opts = options_from_args(args)
    assert opts.ca_bundles == {"reg.example:5000": ca_a + ca_b, "127.0.0.1:8443": ca_b}
    assert opts.insecure_registries == ("127.0.0.1:5000", "plain.test")
    assert opts.cert_manager_certificate == "podplacement-system/podplacement-webhook"
    assert opts.cert_dir is None and opts.webhook_service == "podplacement-webhook"
    plain = options_from_args(_parse())
    assert (plain.ca_bundles, plain.insecure_registries, plain.cert_manager_certificate) == (
        {}, (), None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ca-file", "no-equals-sign"], "HOST=FILE"),
        (["--ca-file", "=file.pem"], "HOST=FILE"),
        (["--ca-file", "host="], "HOST=FILE"),
        (["--ca-file", "host={notpem}"], "no PEM certificate"),
        (["--cert-manager-certificate", "podplacement-webhook", "--webhook-service", "s"],
         "NAMESPACE/NAME"),
        (["--cert-manager-certificate", "Bad_NS/x", "--webhook-service", "s"],
         "NAMESPACE/NAME"),
        (["--cert-manager-certificate", "ns/name"], "--webhook-service"),
    ],
)
def test_unusable_flag_values_are_refused(argv: list[str], message: str,
                                          tmp_path: Path) -> None:
    notpem = tmp_path / "not.pem"
    notpem.write_text("hello")
    args = _parse(*[a.replace("{notpem}", str(notpem)) for a in argv])
    with pytest.raises(ValueError, match=message):
        options_from_args(args)


def test_missing_ca_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        options_from_args(_parse("--ca-file", f"h={tmp_path / 'missing.pem'}"))


def test_cert_dir_and_cert_manager_exclude_each_other(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit):
        _parse("--webhook-service", "s", "--cert-dir", "d", "--cert-manager-certificate", "a/b")
    assert "not allowed with argument" in capsys.readouterr().err


def test_process_exits_2_on_an_unusable_ca_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "controller", "--kubeconfig",
         str(tmp_path / "none"), "--ca-file", "host-without-file"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--ca-file wants HOST=FILE" in proc.stderr




def test_controller_process_ungates_and_stops_on_sigterm(
    ckube: KubeEnv, namespace: str, images: Images, registry: Registry, tmp_path: Path
) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    port = free_port()
    log = tmp_path / "controller.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podplacement",
                "controller",
                "--kubeconfig",
                str(ckube.kubeconfig),
                "--no-leader-election",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                str(port),
                "--registries-conf",
                str(conf),
                "--workers",
                "2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        metrics = asyncio.run(_drive(ckube, namespace, images, port))
        assert 'podplacement_pods_processed_total{outcome="set"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _drive(ckube: KubeEnv, namespace: str, images: Images, port: int) -> str:
    api = await KubeAPI.from_kubeconfig(str(ckube.kubeconfig))
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(ready, within=30, every=0.2)
            await create_pod(api, namespace, gated_pod("cli", [images.arm]))
            pod = await wait_ungated(api, namespace, "cli")
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert terms == [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ]
                }
            ]
            async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                return await r.text()
    finally:
        await api.close()

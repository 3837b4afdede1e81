"""``podplacement controller`` as a real process: it ungates a pod, serves /readyz and
/metrics on 127.0.0.1, and exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from controller.kube import KubeAPI
from podplacement.cli import build_parser
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_controller_process_ungates_and_stops_on_sigterm(
    ckube: KubeEnv, namespace: str, images: Images, registry: Registry, tmp_path: Path
) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    port = _free_port()
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
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
                    ]
                }
            ]
            async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                return await r.text()
    finally:
        await api.close()

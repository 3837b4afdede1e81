"""Act 3 of ``podplacement demo``: install the product on the demo's cluster (CRDs, nodes,
NRTs, config, the ``demo`` namespace), generate certificates and start ``podplacement
webhook`` and ``podplacement controller`` side by side."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from podplacement.demo import workloads
from podplacement.demo.common import (
    CRD_FILES,
    MWC_PATH,
    WORKDIR,
    Child,
    DemoError,
    api_ok,
    create,
    https_ok,
    podplacement_args,
    start_child,
    wait_for,
)
from podplacement.demo.seed import DemoRegistryPair
from podplacement.kubeclient import MERGE_PATCH, ApiError, KubeAPI
from podplacement.rules.config import (
    API_VERSION,
    CONFIG_PLURAL,
    DEFAULT_NAMESPACE,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.sandbox.ports import free_port

log = logging.getLogger("podplacement.demo")

# --- the scenario -----------------------------------------------------------------------


async def install_crds(api: KubeAPI) -> None:
    """Create our CRDs (skipped when present) and wait until their APIs are served."""
    for crd_file in CRD_FILES:
        for doc in yaml.safe_load_all(crd_file.read_text()):
            if doc:
                await create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)

    async def served() -> bool:
        return (await api_ok(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}")
                and await api_ok(api, f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}"))

    await wait_for("the CRDs to be served", served, 30.0)


async def install_cluster_objects(api: KubeAPI, config: dict[str, Any],
                                  real_node: bool = False, real_arm64: bool = False) -> None:
    """Namespaces, nodes (made Ready and untainted, as a kubelet would; with a
    ``real_node``, the NUMA nodes tainted :data:`workloads.SIMULATED_TAINT`, with
    ``real_arm64`` the arm64 one too), NRTs, and the PodPlacementConfig ``config``."""
    await create(api, "/api/v1/namespaces", workloads.namespace_object(DEFAULT_NAMESPACE))
    for node in workloads.NODES:
        await create(api, "/api/v1/nodes", workloads.node_object(node))
        path = f"/api/v1/nodes/{node.name}"
        with contextlib.suppress(ApiError):
            await api.request("PATCH", f"{path}/status", body=workloads.node_status(node),
                              content_type=MERGE_PATCH)
        # TaintNodesByCondition taints a node created without a Ready kubelet; a scheduler
        # would never bind there.
        with contextlib.suppress(ApiError):
            await api.request("PATCH", path, body={"spec": {
                "taints": workloads.node_taints(node, real_node, real_arm64)}},
                content_type=MERGE_PATCH)
    for nrt in workloads.nrt_objects():
        await create(api, f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}", nrt)
    await create(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}", config)


async def install_namespace(api: KubeAPI, registries: workloads.DemoRegistries) -> None:
    """The ``demo`` namespace, its default ServiceAccount and the pull secret.

    Raises:
        DemoError: a namespace of that name exists and was not made by the demo (it is
            never reused, nor deleted at the end).
    """
    ns = workloads.DEMO_NAMESPACE
    stored = await create(api, "/api/v1/namespaces", workloads.namespace_object(ns))
    if not workloads.made_by_demo(stored):
        raise DemoError(f"namespace {ns} exists and was not created by the demo; "
                        "delete it or run the demo against another cluster")
    await create(api, f"/api/v1/namespaces/{ns}/serviceaccounts",
                 workloads.service_account_object(ns))
    await create(api, f"/api/v1/namespaces/{ns}/secrets", workloads.pull_secret(registries, ns))


def registries_conf(pair: DemoRegistryPair) -> str:
    """containers-registries.conf(5) v2 text: the public registry is plain HTTP."""
    return f'[[registry]]\nlocation = "{pair.public.host}"\ninsecure = true\n'


async def generate_certs(work: Path) -> tuple[Path, bytes]:
    """``podplacement certs generate`` for ``localhost``/``127.0.0.1`` into ``work/certs``;
    returns the directory and the CA PEM.

    Raises:
        DemoError: the command failed.
    """
    cert_dir = work / "certs"
    proc = await asyncio.to_thread(
        subprocess.run,
        podplacement_args("certs", "generate", "--out", str(cert_dir), "--dns", "localhost",
                          "--ip", "127.0.0.1"),
        capture_output=True, text=True, cwd=WORKDIR, timeout=60, check=False,
    )
    if proc.returncode != 0:
        raise DemoError(f"podplacement certs generate failed: {proc.stderr.strip()}")
    return cert_dir, (cert_dir / "ca.crt").read_bytes()


def start_webhook(cert_dir: Path, kubeconfig: Path, log_dir: Path) -> tuple[Child, int]:
    """Start ``podplacement webhook`` (HTTPS on 127.0.0.1, serving chain from ``cert_dir``,
    the config watched through ``kubeconfig``); returns the process and its port."""
    port = free_port()
    webhook = start_child("webhook", podplacement_args(
        "webhook", "--host", "127.0.0.1", "--port", str(port), "--cert-dir", str(cert_dir),
        "--kubeconfig", str(kubeconfig), "--namespace", DEFAULT_NAMESPACE,
    ), log_dir)
    return webhook, port


async def wait_webhook_ready(webhook: Child, port: int, ca_pem: bytes,
                             watch: Sequence[Child] = ()) -> None:
    """Wait until the webhook's ``/readyz`` answers 200 over TLS verified with ``ca_pem``.

    Raises:
        DemoError: it (or one of ``watch``) exited, or it was not ready within 30 s.
    """
    ctx = ssl.create_default_context(cadata=ca_pem.decode())

    async def ready() -> bool:
        return await asyncio.to_thread(https_ok, f"https://127.0.0.1:{port}/readyz", ctx)

    await wait_for("the webhook's /readyz", ready, 30.0, interval=0.2,
                   alive=[webhook, *watch])


def controller_args(work: Path, pair: DemoRegistryPair, kubeconfig: Path, cert_dir: Path,
                    webhook_port: int) -> tuple[list[str], dict[str, str], str]:
    """The ``podplacement controller`` command line, extra environment and metrics URL.

    The controller registers the webhook by URL with the CA of ``cert_dir``, reads a
    registries.conf marking the public registry as plain HTTP, trusts the private
    registry's CA (``--ca-file HOST=FILE``) and never stands down at its end (the demo's
    control plane goes with the demo).
    """
    conf = work / "registries.conf"
    conf.write_text(registries_conf(pair))
    ca_file = work / "private-registry-ca.crt"
    ca_file.write_bytes(pair.private_ca_pem)
    metrics_port = free_port()
    args = ["controller", "--kubeconfig", str(kubeconfig), "--namespace", DEFAULT_NAMESPACE,
            "--webhook-url", f"https://127.0.0.1:{webhook_port}/mutate",
            "--cert-dir", str(cert_dir), "--registries-conf", str(conf),
            "--standby-wait", "-1", "--ca-file", f"{pair.private.host}={ca_file}",
            "--metrics-port", str(metrics_port)]
    return podplacement_args(*args), {}, f"http://127.0.0.1:{metrics_port}/metrics"


async def wait_webhook_registered(api: KubeAPI, watch: Sequence[Child]) -> None:
    """Wait until the controller has created the MutatingWebhookConfiguration with a
    caBundle on every webhook.

    Raises:
        DemoError: a watched process exited or 30 s passed.
    """

    async def registered() -> bool:
        try:
            mwc = await api.request("GET", MWC_PATH)
        except ApiError:
            return False
        hooks = mwc.get("webhooks") or []
        return bool(hooks) and all((h.get("clientConfig") or {}).get("caBundle")
                                   for h in hooks)

    await wait_for(f"the MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION_NAME}",
                   registered, 30.0, interval=0.3, alive=watch)

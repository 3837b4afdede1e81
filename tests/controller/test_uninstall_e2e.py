"""The controller with its lifecycle: while the PodPlacementConfig exists the webhook
configuration exists; deleting the config first removes the webhook configuration, then
ungates every pod still gated (a normal decision), then releases the finalizer."""

from __future__ import annotations

from pathlib import Path

from podplacement import certs
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import CONFIG_FINALIZER
from tests.controller.conftest import (
    CONFIG_PATH as CONFIG,
)
from tests.controller.conftest import (
    MWC_PATH as MWC,
)
from tests.controller.conftest import (
    Images,
    StartController,
    create_pod,
    decision_of,
    eventually,
    gated_pod,
    required_terms,
    wait_ungated,
)
from tests.harness.kube import KubeEnv


async def _exists(api: KubeAPI, path: str) -> bool:
    try:
        await api.request("GET", path)
        return True
    except ApiError as exc:
        if exc.not_found:
            return False
        raise


async def test_ordered_uninstall_with_pods_still_gated(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    images: Images,
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    ns = namespace
    (tmp_path / "ca.crt").write_bytes(certs.generate_ca().cert_pem)
    await api.request(
        "POST",
        CONFIG.rsplit("/", 1)[0],
        body={
            "apiVersion": "podplacement.io/v1beta1",
            "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"},
            "spec": {},
        },
    )
    try:
        ctl = await start_controller(
            webhook_url="https://127.0.0.1:9443/mutate",
            cert_dir=str(tmp_path),
            namespace=ns,
            uninstall_deadline_seconds=10.0,
        )
        await eventually(lambda: _exists(api, MWC))

        async def finalized() -> bool:
            cfg = await api.request("GET", CONFIG)
            return CONFIG_FINALIZER in (cfg["metadata"].get("finalizers") or [])

        await eventually(finalized)
        # pods gated while the pod workers write nothing (as in a process that does not
        # lead), except the uninstall's release: the uninstall must release them
        ctl.reconciler.is_leader = lambda: ctl.releasing > 0
        for i in range(3):
            await create_pod(api, ns, gated_pod(f"left{i}", [images.arm]))
        await api.request("DELETE", CONFIG)
        await eventually(lambda: _gone(api, CONFIG), within=30)
        assert not await _exists(api, MWC)
        for i in range(3):
            pod = await wait_ungated(api, ns, f"left{i}", within=1)
            assert required_terms(pod) == [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ]
                }
            ]
            assert decision_of(pod)["result"] == "set"
    finally:
        try:
            cfg = await api.request("GET", CONFIG)
            if cfg["metadata"].get("finalizers"):
                await api.request("PATCH", CONFIG, body={"metadata": {"finalizers": None}})
            await api.request("DELETE", CONFIG)
        except ApiError:
            pass


async def _gone(api: KubeAPI, path: str) -> bool:
    return not await _exists(api, path)

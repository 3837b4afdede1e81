"""The main scenarios against a real kube-apiserver (``real_kube``: etcd + kube-apiserver
from ``$KUBEBUILDER_ASSETS``; skipped without). The controller runs in-process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from podplacement.controller.app import Controller, ControllerOptions
from podplacement.imageinspect import Inspector
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import SCHEDULING_GATE
from tests.controller.conftest import (
    Images,
    create_pod,
    decision_of,
    gated_pod,
    required_terms,
    wait_ungated,
)
from tests.harness.kube import KubeEnv

pytestmark = pytest.mark.realcluster

ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}


@pytest.fixture
def real_namespace(real_kube: KubeEnv) -> Iterator[str]:
    name = f"rc-{uuid.uuid4().hex[:8]}"
    real_kube.ensure_namespace(name)
    try:
        yield name
    finally:
        real_kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
async def real_api(real_kube: KubeEnv, real_namespace: str) -> AsyncIterator[KubeAPI]:
    api = await KubeAPI.from_kubeconfig(str(real_kube.kubeconfig))
    # no kube-controller-manager: the ServiceAccount admission plugin needs "default"
    try:
        await api.request(
            "POST",
            f"/api/v1/namespaces/{real_namespace}/serviceaccounts",
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
        )
    except ApiError as exc:
        if exc.status != 409:
            raise
    try:
        yield api
    finally:
        await api.close()


async def test_real_apiserver_accepts_the_one_write(
    real_kube: KubeEnv, real_api: KubeAPI, real_namespace: str, images: Images, inspector: Inspector
) -> None:
    ns = real_namespace
    ctl = Controller(
        real_api,
        ControllerOptions(
            leader_election=False, metrics_port=None, workers=4, retry_base_delay=0.05
        ),
        inspector=inspector,
    )
    await ctl.start()
    try:
        await ctl.wait_synced(30)
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [ZONE]},
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                            ]
                        },
                    ]
                }
            }
        }
        await create_pod(
            real_api,
            ns,
            gated_pod(
                "terms",
                [images.multi],
                init_images=[images.amd_arm],
                affinity=affinity,
                gates=["example.com/other", SCHEDULING_GATE],
            ),
        )
        await create_pod(real_api, ns, gated_pod("none", [images.arm, images.s390x]))
        pod = await wait_ungated(real_api, ns, "terms", within=30)
        arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
        terms = required_terms(pod)
        linux = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
        assert terms[0] == {"matchExpressions": [ZONE, arch, linux]}
        assert terms[1]["matchExpressions"] == [arch, linux]
        assert pod["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
        none = await wait_ungated(real_api, ns, "none", within=30)
        assert decision_of(none)["result"] == "no-supported-platform"
        assert "schedulingGates" not in none["spec"]
    finally:
        await ctl.stop()

"""Controller options end to end (in-process controller, localkube, real registries):
registry trust from ``ca_bundles`` / ``insecure_registries`` (``--ca-file`` /
``--insecure-registry``) and the cert-manager mode of the webhook configuration
(``--cert-manager-certificate``)."""

from __future__ import annotations

from typing import Any

from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.admit.webhookconfig import CERT_MANAGER_INJECT_ANNOTATION
from tests.controller.conftest import (
    CONFIG_PATH as CONFIG,
)
from tests.controller.conftest import (
    MWC_PATH as MWC,
)
from tests.controller.conftest import (
    StartController,
    create_pod,
    decision_of,
    eventually,
    gated_pod,
    required_terms,
    wait_ungated,
)
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry


def _arch(*archs: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/arch", "operator": "In", "values": list(archs)}


LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}


async def test_own_inspector_trusts_ca_files_and_insecure_registries(
    api: KubeAPI,
    namespace: str,
    registry: Registry,
    tls_registry: Registry,
    make_pusher: Any,
    start_controller: StartController,
) -> None:
    """No inspector injected: the controller builds its own from the options. The TLS
    registry's CA is fresh (no system trust has it) and the plain registry only answers
    HTTP, so both pods are placed only when both options reach the Inspector."""
    assert tls_registry.ca_pem is not None
    make_pusher(tls_registry).image("opts/tls", "v1", architecture="s390x")
    make_pusher(registry).image("opts/plain", "v1", architecture="ppc64le")
    await start_controller(
        inspector=None,
        ca_bundles={tls_registry.host: tls_registry.ca_pem},
        insecure_registries=(registry.host,),
    )
    ns = namespace
    await create_pod(api, ns, gated_pod("tls", [f"{tls_registry.host}/opts/tls:v1"]))
    await create_pod(api, ns, gated_pod("plain", [f"{registry.host}/opts/plain:v1"]))
    tls_pod = await wait_ungated(api, ns, "tls")
    plain_pod = await wait_ungated(api, ns, "plain")
    assert decision_of(tls_pod)["result"] == "set", decision_of(tls_pod)
    assert required_terms(tls_pod) == [{"matchExpressions": [_arch("s390x"), LINUX]}]
    assert required_terms(plain_pod) == [{"matchExpressions": [_arch("ppc64le"), LINUX]}]


async def _get(api: KubeAPI, path: str) -> dict[str, Any] | None:
    try:
        return await api.request("GET", path)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


async def test_cert_manager_mode_annotates_the_webhook_configuration_without_ca(
    api: KubeAPI,
    ckube: KubeEnv,
    namespace: str,
    start_controller: StartController,
) -> None:
    """With ``cert_manager_certificate`` the controller needs no CA source: it writes the
    webhook configuration with cert-manager's inject-ca-from annotation and no caBundle
    (cert-manager's CA injector fills it), and it creates no certificate Secret."""
    ref = f"{namespace}/podplacement-webhook"
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
        await start_controller(
            webhook_service="podplacement-webhook",
            cert_manager_certificate=ref,
            namespace=namespace,
        )
        mwc = await eventually(lambda: _get(api, MWC))
        assert mwc["metadata"]["annotations"][CERT_MANAGER_INJECT_ANNOTATION] == ref
        for hook in mwc["webhooks"]:
            assert "caBundle" not in hook["clientConfig"]
            assert hook["clientConfig"]["service"]["namespace"] == namespace
        secrets = await api.request("GET", f"/api/v1/namespaces/{namespace}/secrets")
        assert secrets.get("items") == []
    finally:
        try:
            cfg = await api.request("GET", CONFIG)
            if cfg["metadata"].get("finalizers"):
                await api.request("PATCH", CONFIG, body={"metadata": {"finalizers": None}})
            await api.request("DELETE", CONFIG)
        except ApiError:
            pass
        try:
            await api.request("DELETE", MWC)
        except ApiError:
            pass

"""``spec.imageInspection.registriesConfigMapRef``: the controller reads the registry rules
(containers-registries.conf(5) v2, key ``registries.conf``) from the named ConfigMap, in place
of ``--registries-conf``, with ``--insecure-registry`` on top. End to end on localkube with the
real plain-HTTP registry: only the ConfigMap makes the registry usable (the controller's own
inspector speaks HTTPS to it otherwise), changes apply without a restart, and a missing or
malformed ConfigMap keeps the last good rules without holding pods back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.app import Controller
from podplacement.controller.registriessource import registries_from
from podplacement.imageinspect import RegistriesConfig, parse_reference
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import (
    CONFIG_NAME,
    CONFIG_PLURAL,
    GROUP,
    REGISTRIES_CONF_KEY,
    VERSION,
)
from tests.controller.conftest import (
    StartController,
    create_pod,
    decision_of,
    eventually,
    gated_pod,
    required_terms,
    unique,
    wait_ungated,
)
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry

CONFIGS = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}"
CONFIG = f"{CONFIGS}/{CONFIG_NAME}"
CM_NAME = "registries"
#: A prefix nothing resolves: images under it are reachable only through the mirror.
MIRRORED = "mirror-only.invalid/team"


def _arch(*archs: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/arch", "operator": "In", "values": list(archs)}


LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}


def _insecure_registry(host: str) -> str:
    return f'[[registry]]\nlocation = "{host}"\ninsecure = true\n'


def _mirror(host: str) -> str:
    return (f'[[registry]]\nprefix = "{MIRRORED}"\nlocation = "{MIRRORED}"\n'
            f'[[registry.mirror]]\nlocation = "{host}/cmreg"\ninsecure = true\n')


# --- precedence (no cluster) ------------------------------------------------------------------
def test_config_map_rules_replace_the_file_and_insecure_hosts_apply_on_top(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text('[[registry]]\nlocation = "file.test"\nblocked = true\n', encoding="utf-8")
    from_cm = RegistriesConfig.from_toml('[[registry]]\nlocation = "cm.test"\ninsecure = true\n')
    file_ref = parse_reference("file.test/app:v1")

    file_only = registries_from(conf_file=str(conf), insecure=["flag.test:5000"])
    entry = file_only.find(file_ref)
    assert entry is not None and entry.blocked
    assert file_only.is_insecure("flag.test:5000") and not file_only.is_insecure("cm.test")

    merged = registries_from(config_map=from_cm, conf_file=str(conf),
                             insecure=["flag.test:5000"])
    assert merged.find(file_ref) is None  # the file's entries are gone, not merged
    assert merged.is_insecure("cm.test")
    assert merged.is_insecure("flag.test:5000")
    assert not registries_from().registries


# --- end to end -------------------------------------------------------------------------------
async def _put_config_map(api: KubeAPI, ns: str, text: str | None) -> str:
    """Create or replace the ConfigMap (``text`` None: without the key); its resourceVersion."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": CM_NAME},
                            "data": {REGISTRIES_CONF_KEY: text} if text is not None else {}}
    path = f"/api/v1/namespaces/{ns}/configmaps"
    try:
        old = await api.request("GET", f"{path}/{CM_NAME}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        made = await api.request("POST", path, body=body)
    else:
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        made = await api.request("PUT", f"{path}/{CM_NAME}", body=body)
    return str(made["metadata"]["resourceVersion"])


async def _loaded(ctl: Controller, rv: str) -> None:
    async def check() -> bool:
        loaded = ctl.registries_config_map
        return loaded is not None and loaded.resource_version == rv

    await eventually(check, within=15)


@pytest.fixture
async def placement_config(api: KubeAPI, ckube: KubeEnv, namespace: str
                           ) -> AsyncIterator[dict[str, Any]]:
    """The singleton config naming ConfigMap ``registries`` in the test namespace (localkube
    only: it is cluster-wide); deleted afterwards."""
    obj = await api.request("POST", CONFIGS, body={
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodPlacementConfig",
        "metadata": {"name": CONFIG_NAME},
        "spec": {"imageInspection": {
            "maxRetries": 1, "registryTimeoutSeconds": 2,
            "registriesConfigMapRef": {"namespace": namespace, "name": CM_NAME}}},
    })
    try:
        yield obj
    finally:
        try:
            await api.request("DELETE", CONFIG)
        except ApiError:
            pass


async def test_registries_from_the_config_map_make_images_inspectable_and_changes_apply(
    api: KubeAPI,
    namespace: str,
    registry: Registry,
    make_pusher: Any,
    placement_config: dict[str, Any],
    start_controller: StartController,
) -> None:
    """No insecure flag and no file: the plain-HTTP registry is usable only through the
    ConfigMap. Missing at first (the pod is ungated anyway, without a placement), then
    created (placed), then extended by a mirror (a new prefix resolves), then broken (the
    last good rules stay in use)."""
    p = make_pusher(registry)
    p.image("cmreg/plain", "v1", architecture="ppc64le")
    p.image("cmreg/mirrored", "v1", architecture="s390x")
    p.image("cmreg/afterbreak", "v1", architecture="arm64")
    ns, host = namespace, registry.host
    ctl = await start_controller(inspector=None, registries_refresh_seconds=0.2)

    # 1. the ConfigMap does not exist: logged, nothing loaded, the pod is not held back
    await eventually(lambda: _true(ctl.registries_error is not None))
    assert CM_NAME in str(ctl.registries_error) and ctl.registries_config_map is None
    await create_pod(api, ns, gated_pod("before", [f"{host}/cmreg/plain:v1"]))
    before = await wait_ungated(api, ns, "before", within=60)
    assert decision_of(before)["result"] != "set", decision_of(before)
    assert required_terms(before) != [{"matchExpressions": [_arch("ppc64le"), LINUX]}]

    # 2. created: the registry is insecure through the ConfigMap only
    rv = await _put_config_map(api, ns, _insecure_registry(host))
    await _loaded(ctl, rv)
    assert ctl.registries_error is None
    await create_pod(api, ns, gated_pod("plain", [f"{host}/cmreg/plain:v1"]))
    plain = await wait_ungated(api, ns, "plain")
    assert decision_of(plain)["result"] == "set", decision_of(plain)
    assert required_terms(plain) == [{"matchExpressions": [_arch("ppc64le"), LINUX]}]

    # 3. changed: a mirror for a prefix that resolves nowhere else
    rv = await _put_config_map(api, ns, _insecure_registry(host) + _mirror(host))
    await _loaded(ctl, rv)
    await create_pod(api, ns, gated_pod("mirrored", [f"{MIRRORED}/mirrored:v1"]))
    mirrored = await wait_ungated(api, ns, "mirrored")
    assert required_terms(mirrored) == [{"matchExpressions": [_arch("s390x"), LINUX]}]

    # 4. broken (invalid TOML, then no key): logged, the previous rules stay in use
    good = ctl.registries_config_map
    for broken in ("[[registry]\nlocation = ", None):
        await _put_config_map(api, ns, broken)
        await eventually(lambda: _true(ctl.registries_error is not None))
        assert ctl.registries_config_map == good
    pod = gated_pod(unique("afterbreak"), [f"{MIRRORED}/afterbreak:v1"])
    await create_pod(api, ns, pod)
    after = await wait_ungated(api, ns, pod["metadata"]["name"])
    assert required_terms(after) == [{"matchExpressions": [_arch("arm64"), LINUX]}]


async def test_removing_the_reference_brings_back_the_file_and_the_inspector_follows(
    api: KubeAPI,
    namespace: str,
    placement_config: dict[str, Any],
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text('[[registry]]\nlocation = "file.test"\nblocked = true\n', encoding="utf-8")
    rv = await _put_config_map(api, namespace, '[[registry]]\nlocation = "cm.test"\n')
    ctl = await start_controller(inspector=None, registries_conf=str(conf),
                                 registries_refresh_seconds=30)
    # read at start (and before the first pods are queued), not only after one period
    loaded = ctl.registries_config_map
    assert loaded is not None and loaded.resource_version == rv
    from_cm = ctl.inspector()
    assert ctl.inspector() is from_cm  # same rules: no rebuild
    await api.request("PATCH", CONFIG, body={"spec": {"imageInspection": {
        "registriesConfigMapRef": None}}}, content_type="application/merge-patch+json")
    await eventually(lambda: _true(ctl.registries_config_map is None))
    from_file = ctl.inspector()
    assert from_file is not from_cm
    entry = from_file._registries.find(parse_reference("file.test/app:v1"))
    assert entry is not None and entry.blocked


async def _true(value: bool) -> bool:
    return value

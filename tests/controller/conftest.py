"""Fixtures for the controller's end-to-end tests: images pushed to the real registry, a
controller running in-process against localkube (or a real control plane via ``kube``)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from podplacement.controller.app import Controller, ControllerOptions
from podplacement.controller.events import REPORTING_CONTROLLER, SOURCE_COMPONENT
from podplacement.imageinspect import Inspector, RegistriesConfig
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import (
    API_VERSION,
    ARCH_LABEL,
    CONFIG_NAME,
    CONFIG_PLURAL,
    GATE_LABEL,
    GATE_LABEL_GATED,
    OS_LABEL,
    SCHEDULING_GATE,
    WEBHOOK_CONFIGURATION_NAME,
)
from podplacement.sandbox.controlplane import DEFAULT_NODES, AssetsNotFound
from tests.harness.kube import KubeEnv, start_localkube, start_real
from tests.harness.registry import Registry


@dataclass(frozen=True)
class Images:
    """References of the images pushed once per session."""

    multi: str  # linux/amd64, linux/arm64, linux/s390x (+ attestations)
    amd_arm: str  # linux/amd64, linux/arm64 (docker manifest list)
    arm: str  # single manifest linux/arm64
    s390x: str  # single manifest linux/s390x
    windows: str  # windows/amd64 index
    private: str  # linux/arm64, linux/ppc64le on the basic-auth registry


#: The PodPlacementConfig singleton and the webhook configuration the controller owns.
CONFIG_PATH = f"/apis/{API_VERSION}/{CONFIG_PLURAL}/{CONFIG_NAME}"
MWC_PATH = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
            + WEBHOOK_CONFIGURATION_NAME)


@pytest.fixture(scope="session")
def images(registry: Registry, basic_registry: Registry, make_pusher: Any) -> Images:
    p = make_pusher(registry)
    p.multiarch("ctl/multi", "v1", ["linux/amd64", "linux/arm64", "linux/s390x"])
    p.multiarch("ctl/amdarm", "v1", ["linux/amd64", "linux/arm64"], fmt="docker")
    p.image("ctl/arm", "v1", architecture="arm64")
    p.image("ctl/s390x", "v1", architecture="s390x")
    p.multiarch("ctl/win", "v1", ["windows/amd64"])
    make_pusher(basic_registry).multiarch("ctl/private", "v1", ["linux/arm64", "linux/ppc64le"])
    h = registry.host
    return Images(
        multi=f"{h}/ctl/multi:v1",
        amd_arm=f"{h}/ctl/amdarm:v1",
        arm=f"{h}/ctl/arm:v1",
        s390x=f"{h}/ctl/s390x:v1",
        windows=f"{h}/ctl/win:v1",
        private=f"{basic_registry.host}/ctl/private:v1",
    )


#: The two backends every controller end-to-end module runs on: localkube, and the real
#: control plane (kube-apiserver, kube-scheduler, kube-controller-manager v1.36.2 with fake
#: Ready nodes of every architecture; skipped with the reason when no binaries are found).
BACKENDS = ["localkube", pytest.param("real", marks=pytest.mark.realcluster)]


@pytest.fixture(scope="module", params=BACKENDS)
def ckube(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeEnv]:
    """The cluster for one controller test module, of its own (the controller watches
    cluster-wide; other modules' leftovers must not leak in): localkube, or the real control
    plane (:func:`tests.harness.kube.start_real`) with the module's ``FAKE_NODES`` (default:
    ``DEFAULT_NODES``, Ready nodes of every architecture)."""
    if request.param == "real":
        try:
            nodes = getattr(request.module, "FAKE_NODES", DEFAULT_NODES)
            env = start_real(tmp_path_factory.mktemp("ctl-real"), nodes=nodes)
        except AssetsNotFound as exc:
            pytest.skip(str(exc))
    else:
        _server, env = start_localkube(tmp_path_factory.mktemp("ctl-localkube"))
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def namespace(ckube: KubeEnv) -> Iterator[str]:
    """A fresh namespace in ``ckube``, deleted afterwards. On the real control plane, before
    the deletion, :func:`check_bindings` asserts that every pod podplacement ungated there
    and kube-scheduler bound sits on a node its images can run (every test gets this check)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    ckube.ensure_namespace(name)
    try:
        yield name
        if ckube.kind == "real":
            check_bindings(ckube, name)
    finally:
        ckube.delete(f"/api/v1/namespaces/{name}")


def _allowed(pod: dict[str, Any], key: str, decided: list[str]) -> set[str]:
    """``decided`` plus the user's own explicit pins on ``key``: a ``nodeSelector`` value and
    ``In`` lists of required terms outside ``decided`` (podplacement only writes lists inside
    it, so a list reaching outside is the user's)."""
    allowed = set(decided)
    spec = pod["spec"]
    if key in (spec.get("nodeSelector") or {}):
        allowed.add(spec["nodeSelector"][key])
    for term in required_terms(pod):
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == key and expr.get("operator") == "In":
                allowed.update(expr.get("values") or [])
    return allowed


def _ours_only(pod: dict[str, Any]) -> bool:
    keys = {ARCH_LABEL, OS_LABEL}
    terms = required_terms(pod)
    return bool(terms) and not pod["spec"].get("nodeSelector") and all(
        not t.get("matchFields") and all(e.get("key") in keys for e in t.get("matchExpressions")
                                         or []) for t in terms)


def check_bindings(env: KubeEnv, ns: str, within: float = 15.0) -> int:
    """Wait until each ungated pod of ``ns`` decided by podplacement is bound or reported
    Unschedulable by kube-scheduler; assert every bound pod's node runs an allowed
    architecture and OS, and, when the decision records ``pairs`` (images of several OSes),
    one of those (os, arch) pairs. Returns the number of bound pods checked.

    Raises: AssertionError on a pod bound to a node its images can't run, or on a pod with
    only podplacement's requirements left unbound after ``within`` seconds."""
    from podplacement.rules.config import DECISION_ANNOTATION

    deadline = time.monotonic() + within
    nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
             for n in env.get("/api/v1/nodes")["items"]}
    while True:
        checked = 0  # bound pods of this pass: one that was bound before counts once
        pending = []
        for pod in env.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            ann = (pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
            if not ann or pod["spec"].get("schedulingGates") or pod["metadata"].get(
                    "deletionTimestamp"):
                continue
            decision = json.loads(ann)
            node = pod["spec"].get("nodeName")
            name = pod["metadata"]["name"]
            if node:
                if node not in nodes:
                    found = env.request("GET", f"/api/v1/nodes/{node}")
                    assert found.status_code in (200, 404), found.text
                    if found.status_code == 404:
                        continue  # the test removed the node; checked before that if it must
                    nodes[node] = found.json()["metadata"].get("labels") or {}
                labels = nodes[node]
                archs = decision.get("archs")
                if archs:
                    allowed = _allowed(pod, ARCH_LABEL, archs)
                    assert labels.get(ARCH_LABEL) in allowed, (
                        f"pod {ns}/{name} bound to {node} ({labels.get(ARCH_LABEL)}); "
                        f"its images run on {archs}")
                oses = decision.get("oses")
                if oses:
                    assert labels.get(OS_LABEL) in _allowed(pod, OS_LABEL, oses), (
                        f"pod {ns}/{name} bound to {node} ({labels.get(OS_LABEL)}); "
                        f"its images run on {oses}")
                pair = f"{labels.get(OS_LABEL)}/{labels.get(ARCH_LABEL)}"
                if "pairs" in decision and labels.get(OS_LABEL) in (oses or []) and labels.get(
                        ARCH_LABEL) in (archs or []):
                    # several OSes: a supported os and a supported arch are not enough
                    assert pair in decision["pairs"], (
                        f"pod {ns}/{name} bound to {node} ({pair}); its affinity admits "
                        f"{decision['pairs']}")
                checked += 1
                continue
            conditions = {c.get("type"): c for c in pod.get("status", {}).get("conditions")
                          or []}
            unschedulable = conditions.get("PodScheduled", {}).get("reason") == "Unschedulable"
            if decision.get("result") == "set" and _ours_only(pod):
                assert not unschedulable, f"pod {ns}/{name} unschedulable: {conditions}"
                pending.append(name)
            elif not unschedulable:
                pending.append(name)
        if not pending:
            return checked
        if time.monotonic() > deadline:
            strict = [
                p["metadata"]["name"] for p in env.get(f"/api/v1/namespaces/{ns}/pods")["items"]
                if p["metadata"]["name"] in pending and _ours_only(p)]
            assert not strict, f"pods {strict} of {ns} not bound within {within} s"
            return checked
        time.sleep(0.2)


@pytest.fixture
async def api(ckube: KubeEnv) -> AsyncIterator[KubeAPI]:
    client = await KubeAPI.from_kubeconfig(str(ckube.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def inspector(registry: Registry, basic_registry: Registry) -> AsyncIterator[Inspector]:
    conf = RegistriesConfig().with_insecure(registry.host)
    assert basic_registry.ca_pem is not None
    insp = Inspector(
        registries=conf,
        ca_bundles={basic_registry.host: basic_registry.ca_pem},
        retries=0,
        timeout=3.0,
    )
    try:
        yield insp
    finally:
        await insp.aclose()


StartController = Callable[..., Awaitable[Controller]]


@pytest.fixture
async def start_controller(api: KubeAPI, inspector: Inspector) -> AsyncIterator[StartController]:
    """``await start_controller(**ControllerOptions overrides)``: a controller leading at
    once (no election), fast retries, no metrics server unless asked; stopped afterwards."""
    started: list[Controller] = []

    async def start(**overrides: Any) -> Controller:
        insp = overrides.pop("inspector", inspector)
        opts: dict[str, Any] = {
            "leader_election": False,
            "metrics_port": None,
            "workers": 8,
            "retry_base_delay": 0.05,
            "retry_max_delay": 0.5,
            "watch_timeout": 30,
        }
        opts.update(overrides)
        ctl = Controller(api, ControllerOptions(**opts), inspector=insp)
        started.append(ctl)
        await ctl.start()
        await ctl.wait_synced(20)
        return ctl

    yield start
    for ctl in started:
        await asyncio.wait_for(ctl.stop(), 60)


def gated_pod(
    name: str,
    images: list[str],
    *,
    init_images: list[str] | None = None,
    affinity: dict[str, Any] | None = None,
    node_selector: dict[str, str] | None = None,
    gates: list[str] | None = None,
    pull_secrets: list[str] | None = None,
) -> dict[str, Any]:
    """A pod as the webhook leaves it: our gate and the ``gated`` label."""
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)],
        "schedulingGates": [{"name": g} for g in (gates or [SCHEDULING_GATE])],
    }
    if init_images:
        spec["initContainers"] = [
            {"name": f"i{i}", "image": im} for i, im in enumerate(init_images)
        ]
    if affinity is not None:
        spec["affinity"] = affinity
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {GATE_LABEL: GATE_LABEL_GATED, "app": "t"}},
        "spec": spec,
    }


async def create_pod(api: KubeAPI, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    return await api.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)


async def get_pod(api: KubeAPI, ns: str, name: str) -> dict[str, Any]:
    return await api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


async def eventually(
    check: Callable[[], Awaitable[Any]], *, within: float = 20.0, every: float = 0.05
) -> Any:
    """Poll ``check`` until it returns a truthy value (bounded); returns that value or
    raises AssertionError with the last value."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"condition not met within {within}s (last: {last!r})")


async def wait_ungated(api: KubeAPI, ns: str, name: str, within: float = 20.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await get_pod(api, ns, name)
        gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        return pod if SCHEDULING_GATE not in gates else None

    result: dict[str, Any] = await eventually(check, within=within)
    return result


def decision_of(pod: dict[str, Any]) -> dict[str, Any]:
    from podplacement.rules.config import DECISION_ANNOTATION

    out: dict[str, Any] = json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION])
    return out


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    na = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(req.get("nodeSelectorTerms") or [])


async def events_for(api: KubeAPI, ns: str, name: str) -> list[dict[str, Any]]:
    """podplacement's Events about pod ``ns/name`` (kube-scheduler's are left out)."""
    found: list[dict[str, Any]] = []
    for path in (
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
        f"/api/v1/namespaces/{ns}/events",
    ):
        try:
            items = (await api.request("GET", path)).get("items") or []
        except ApiError:
            continue
        for ev in items:
            ref = ev.get("regarding") or ev.get("involvedObject") or {}
            ours = ev.get("reportingController") == REPORTING_CONTROLLER or (
                ev.get("source") or {}).get("component") == SOURCE_COMPONENT
            if ours and ref.get("name") == name and ev.get("metadata", {}).get("name") not in {
                f.get("metadata", {}).get("name") for f in found
            }:
                found.append(ev)
        if found:
            break
    return found


def dockerconfig_secret(name: str, reg: Registry) -> dict[str, Any]:
    auth = base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()
    cfg = {"auths": {reg.host: {"username": reg.username, "password": reg.password, "auth": auth}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(cfg).encode()).decode()},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"

"""The place branch of the MutatingAdmissionPolicy ``podplacement-gate``, evaluated by the
real kube-apiserver v1.36.2 (docs/how-it-decides.md, "Placement inside the API server").

The policy's plain ``variables`` are also checked offline with a CEL runtime
(tests/controller/test_admissionpolicy_cel.py); this module checks what only the API server
evaluates: the typed ``Object{}`` node affinity of the JSONPatch, the whole mutation, the
skip rules (against the webhook's own, :func:`webhook.gating.should_gate`) and the server's
facts the module docstring of :mod:`rules.admit.admissionpolicy` lists.

The policy, its binding and an ImagePlatformCatalog params object are installed directly (no
controller). Each PodPlacementConfig variant gets its own copy of the policy, bound to its
own namespace (the spec is :func:`rules.admit.admissionpolicy.desired_policy`'s, only the
names and the namespace selector differ), so every variant is live at once and the property
test needs no wait between examples. Pods are created with ``?dryRun=All``: the API server
runs admission (the policy included) and returns the object it would store.

The oracle is the controller: a pod the policy placed must carry what
:func:`rules.place.decision.decide` writes on the same pod once gated (affinity, the two
labels, the decision facts); any other pod must carry exactly the gate and the gated label.
A pod with neither is a CEL error admitted unchanged by ``failurePolicy: Ignore`` (fail
open), and fails the test.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.controller.paramswriter import params_collection_path
from podplacement.rules.admit import admissionpolicy as ap
from podplacement.rules.admit.imageparams import (
    ParamsStore,
    catalog_maps,
    flat_catalog,
    value_pairs,
)
from podplacement.rules.admit.webhookconfig import WebhookNamespaceSelection
from podplacement.rules.config import (
    API_VERSION,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    DEFAULT_NAMESPACE,
    GATE_LABEL,
    GATE_LABEL_GATED,
    GATE_LABEL_REMOVED,
    OS_LABEL,
    PARAMS_KIND,
    PARAMS_MAX_BYTES,
    PARAMS_NAME,
    SCHEDULING_GATE,
    PlacementConfig,
    PlatformWeight,
    TopologyConfig,
)
from podplacement.rules.monitor.explain import apply_patch
from podplacement.rules.place.decision import decide
from podplacement.rules.place.placement import PlacementInputs
from tests.controller._pods import img
from tests.controller.conftest import check_bindings
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import real_cluster, wait_for

pytestmark = pytest.mark.realcluster

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICIES = f"{ADMISSION}/{ap.POLICY_RESOURCE}"
BINDINGS = f"{ADMISSION}/{ap.BINDING_RESOURCE}"
#: The params object's namespace (the product's, as the controller puts it there).
PARAMS_NS = DEFAULT_NAMESPACE
PARAMS = params_collection_path(PARAMS_NS)
LINUX = ("linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x")
WINDOWS = "windows/amd64"
WEIGHTS = (PlatformWeight("amd64", 10), PlatformWeight("arm64", 60),
           PlatformWeight("s390x", 100))

#: PodPlacementConfig variants under test, each with its own policy copy and namespace.
CONFIGS: dict[str, PlacementConfig] = {
    "plain": PlacementConfig(),
    "weighted": PlacementConfig(preferred_platforms=WEIGHTS),
    "disabled": PlacementConfig(preferred_platforms=WEIGHTS, admission_fast_paths="Disabled"),
    "numa": PlacementConfig(topology=TopologyConfig(enabled=True)),
}


def _long_ref(i: int, tag: str = "v1") -> str:
    """A ~100-character reference, like a real registry path."""
    ref = f"registry.example.com:5000/platform-team/services/component-{i:05d}/image-name:{tag}"
    return ref + "-" + "x" * max(0, 99 - len(ref))


def _pool(rnd: random.Random) -> dict[str, str]:
    """Generated params: image → sorted "os/arch" pairs, over the four linux architectures
    and sometimes windows/amd64 (a windows-only image too)."""
    pool: dict[str, str] = {}
    for i in range(40):
        pairs = set(rnd.sample(LINUX, rnd.randint(1, 4)))
        if rnd.random() < 0.2:
            pairs.add(WINDOWS)
        if i == 0:
            pairs = {WINDOWS}
        ref = (f"reg.example/team/app-{i}:1.{i}" if i % 3 else _long_ref(i)) if i % 7 else (
            f"reg.example/team/app-{i}@sha256:{i:064x}")
        pool[ref] = ",".join(sorted(pairs))
    return pool


@dataclass(frozen=True)
class World:
    """The installed pieces: the params (pool entries the tests pick from, plus filler up to
    the byte bound :data:`PARAMS_MAX_BYTES`), and the namespace of each config variant."""

    env: KubeEnv
    pool: Mapping[str, str]
    namespaces: Mapping[str, str]


def _selection(namespace: str) -> WebhookNamespaceSelection:
    return WebhookNamespaceSelection(
        {"matchLabels": {"kubernetes.io/metadata.name": namespace}}, True, "")


def _install(env: KubeEnv, variant: str, config: PlacementConfig, namespace: str) -> None:
    """desired_policy/desired_binding for ``config``, renamed for ``variant`` and bound to
    ``namespace`` only."""
    name = f"{ap.ADMISSION_POLICY_NAME}-{variant}"
    policy = ap.desired_policy(config)
    policy["metadata"]["name"] = name
    binding = ap.desired_binding(_selection(namespace), params_namespace=PARAMS_NS)
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    for path, obj in ((POLICIES, policy), (BINDINGS, binding)):
        r = env.request("POST", path, json=obj)
        assert r.status_code == 201, r.text
        live = env.get(f"{path}/{name}")
        assert not ap.policy_drifted(live, obj), "the server changed a field we set"


def _params_object(entries: Mapping[str, str]) -> dict[str, Any]:
    """The params object of a flat table, in the dense layout the controller writes (one
    learned time for every tag reference)."""
    learned = {ref: 1_700_000_000 for ref in entries if "@" not in ref}
    return {"apiVersion": API_VERSION, "kind": PARAMS_KIND,
            "metadata": {"name": PARAMS_NAME, "namespace": PARAMS_NS},
            "spec": catalog_maps(entries, learned)}


def _dry_create(env: KubeEnv, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    r = env.request("POST", f"/api/v1/namespaces/{namespace}/pods", params={"dryRun": "All"},
                    json=pod)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def _probe(image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "c", "image": image}]}}


def _admitted_by_policy(pod: Mapping[str, Any]) -> bool:
    return GATE_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    """A real control plane with kube-scheduler and the fake nodes of every architecture
    (and a windows/amd64 one); CRDs loaded by the harness."""
    yield from real_cluster(tmp_path_factory, "mapplace", controller_manager=False)


@pytest.fixture(scope="module")
def world(cluster: KubeEnv) -> World:
    """Params of full size and one bound policy per config variant, in force."""
    cluster.apply_crds()
    cluster.wait_crds_served()
    rnd = random.Random(14)
    pool = _pool(rnd)
    entries = dict(pool)
    # filler until the catalog is within 2 KB of the byte bound (as the controller's
    # ParamsStore measures it)
    size = ParamsStore(1e12)
    for ref, value in pool.items():
        size.record(ref, value_pairs(value) or [], 1.7e9)
    i = 1000
    while size.json_size < PARAMS_MAX_BYTES - 2_000:
        entries[_long_ref(i)] = ",".join(sorted(rnd.sample(LINUX, rnd.randint(1, 4))))
        size.record(_long_ref(i), value_pairs(entries[_long_ref(i)]) or [], 1.7e9)
        i += 1
    assert not size.evictions and len(size) == len(entries)
    cluster.ensure_namespace(PARAMS_NS)
    r = cluster.request("POST", PARAMS, json=_params_object(entries))
    assert r.status_code == 201, r.text[:500]
    namespaces = {}
    for variant, config in CONFIGS.items():
        ns = f"place-{variant}"
        cluster.ensure_namespace(ns)
        _install(cluster, variant, config, ns)
        namespaces[variant] = ns
    known = next(ref for ref, pairs in pool.items() if "windows" not in pairs)
    for ns in namespaces.values():  # the policies and params reach the admission plugin
        wait_for(lambda ns=ns: _admitted_by_policy(_dry_create(cluster, ns, _probe(known))), 30)
    return World(cluster, pool, namespaces)


# --- the oracle ------------------------------------------------------------------------


def _expect_placed(pod: Mapping[str, Any], pool: Mapping[str, str],
                   config: PlacementConfig) -> bool:
    """The place branch's conditions (docs/how-it-decides.md "Placement inside the API server")."""
    spec = pod["spec"]
    images = [i for i, _ in _pulls(pod)]
    if not ap.places(config) or not all(i in pool for i in images):
        return False
    if any(policy == "Always" for _, policy in _pulls(pod)):
        return False
    if "nodeAffinity" in (spec.get("affinity") or {}):
        return False
    if {ARCH_LABEL, OS_LABEL} & set(spec.get("nodeSelector") or {}):
        return False
    common = set.intersection(*(set(pool[i].split(",")) for i in images))
    return all(p.startswith("linux/") for p in common)


def _pulls(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(image, pull policy) of every container and image volume (KEP-4639) of ``pod``."""
    spec = pod["spec"]
    out = [(c["image"], c.get("imagePullPolicy"))
           for k in ("initContainers", "containers") for c in spec.get(k) or []]
    return out + [(v["image"]["reference"], v["image"].get("pullPolicy"))
                  for v in spec.get("volumes") or [] if "image" in v]


def _as_gated(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the gate branch stores it (what the controller then reads)."""
    out = copy.deepcopy(dict(pod))
    meta = out["metadata"]
    meta["resourceVersion"] = "1"
    meta["labels"] = {**(meta.get("labels") or {}), GATE_LABEL: GATE_LABEL_GATED}
    out["spec"]["schedulingGates"] = [*(out["spec"].get("schedulingGates") or []),
                                      {"name": SCHEDULING_GATE}]
    return out


def _controller_result(pod: Mapping[str, Any], pool: Mapping[str, str],
                       config: PlacementConfig) -> dict[str, Any]:
    """``decide()`` on the gated copy, its patch applied."""
    gated = _as_gated(pod)
    images = {i: img(i, *pool[i].split(",")) for i, _ in _pulls(gated)}
    decision = decide(PlacementInputs(gated, images, config, nodes=None))
    out: dict[str, Any] = apply_patch(gated, list(decision.patch))
    if out["spec"].get("schedulingGates") == []:
        del out["spec"]["schedulingGates"]
    return out


FACTS = ("platforms", "oses", "archs", "result", "reason")


def _check(pod: Mapping[str, Any], got: Mapping[str, Any], pool: Mapping[str, str],
           config: PlacementConfig) -> str:
    """Assert the admitted ``got`` against the oracle; returns "placed" or "gated"."""
    meta, spec = got["metadata"], got["spec"]
    labels = meta.get("labels") or {}
    annotations = dict(meta.get("annotations") or {})
    gates = [g["name"] for g in spec.get("schedulingGates") or []]
    sent_meta = pod["metadata"]
    assert GATE_LABEL in labels, f"neither gated nor placed (failed open?): {json.dumps(got)}"
    if _expect_placed(pod, pool, config):
        want = _controller_result(pod, pool, config)
        assert gates == [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        assert spec.get("affinity") == want["spec"].get("affinity")
        assert labels == want["metadata"]["labels"]
        ours = json.loads(annotations.pop(DECISION_ANNOTATION))
        theirs = json.loads(want["metadata"]["annotations"][DECISION_ANNOTATION])
        assert ours["path"] == ap.ADMISSION_PATH
        # the catalog it came from: the params object's uid (config.admission_mark)
        assert ours["catalog"] and isinstance(ours["catalog"], str)
        assert {k: ours.get(k) for k in FACTS} == {k: theirs.get(k) for k in FACTS}
        assert set(ours) - {"path", "catalog"} == set(theirs) & set(FACTS)
        assert annotations == (sent_meta.get("annotations") or {})
        return "placed"
    sent_gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    assert gates == [*sent_gates, SCHEDULING_GATE], gates
    assert labels == {**(sent_meta.get("labels") or {}), GATE_LABEL: GATE_LABEL_GATED}
    assert annotations == (sent_meta.get("annotations") or {})
    assert spec.get("affinity") == pod["spec"].get("affinity")
    return "gated"


# --- generated pods --------------------------------------------------------------------

UNKNOWN = ("reg.example/team/not-inspected:1", "docker.io/library/busybox:latest")
NODE_SELECTORS: tuple[dict[str, str] | None, ...] = (
    None, {"disktype": "ssd"}, {ARCH_LABEL: "amd64"}, {OS_LABEL: "linux"},
    {ARCH_LABEL: "arm64", "disktype": "ssd"},
)
AFFINITIES: tuple[dict[str, Any] | None, ...] = (
    None,
    {},
    {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]}}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [
            {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}]}}]}},
)
LABELS: tuple[dict[str, str] | None, ...] = (None, {"app": "web"}, {"app": "web", "tier": "1"})
ANNOTATIONS: tuple[dict[str, str] | None, ...] = (None, {"team.example/owner": "a@b.c"})


@st.composite
def pods(draw: st.DrawFn, pool: tuple[str, ...]) -> dict[str, Any]:
    """A pod of 1-4 containers, 0-2 init containers and 0-2 image volumes; mostly known
    images."""
    image = st.one_of(st.sampled_from(pool), st.sampled_from(UNKNOWN)) if draw(
        st.integers(0, 9)) == 0 else st.sampled_from(pool)
    containers = [{"name": f"c{i}", "image": draw(image)}
                  for i in range(draw(st.integers(1, 4)))]
    if draw(st.integers(0, 9)) == 0:  # revalidated by the controller: never placed here
        containers[-1]["imagePullPolicy"] = "Always"
    spec: dict[str, Any] = {"containers": containers}
    inits = draw(st.integers(0, 2))
    if inits:
        spec["initContainers"] = [{"name": f"i{i}", "image": draw(image)} for i in range(inits)]
    volumes = draw(st.sampled_from([0, 0, 0, 1, 2]))  # image volumes (KEP-4639)
    if volumes:
        spec["volumes"] = [{"name": f"v{i}", "image": {"reference": draw(image)}}
                           for i in range(volumes)]
        if draw(st.integers(0, 9)) == 0:
            spec["volumes"][-1]["image"]["pullPolicy"] = "Always"
    gates = draw(st.sampled_from([None, None, None, [], [{"name": "example.com/other"}]]))
    if gates is not None:  # another controller's gate is kept, before ours
        spec["schedulingGates"] = gates
    for key, choices in (("nodeSelector", NODE_SELECTORS), ("affinity", AFFINITIES)):
        # mostly absent, so that the place branch is taken often
        value = draw(st.one_of(st.none(), st.none(), st.sampled_from(choices)))
        if value is not None:
            spec[key] = copy.deepcopy(value)
    meta: dict[str, Any] = {"name": "p"}
    for key, options in (("labels", LABELS), ("annotations", ANNOTATIONS)):
        value = draw(st.sampled_from(options))
        if value is not None:
            meta[key] = dict(value)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


#: Config variants drawn by the property test: the two that place, twice as often.
VARIANT_MIX = ("plain", "weighted", "plain", "weighted", "disabled", "numa")


def test_every_placed_pod_equals_the_controllers_decision_and_the_rest_are_gated(
    world: World,
) -> None:
    """The property over generated pods, params and configs: a placed pod is what the
    controller writes, every other pod is gated."""
    seen: dict[tuple[str, str], int] = {}
    pool = tuple(sorted(world.pool))

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(variant=st.sampled_from(VARIANT_MIX), pod=pods(pool))
    def check(variant: str, pod: dict[str, Any]) -> None:
        config = CONFIGS[variant]
        got = _dry_create(world.env, world.namespaces[variant], pod)
        path = _check(pod, got, world.pool, config)
        result = json.loads((got["metadata"].get("annotations") or {}).get(
            DECISION_ANNOTATION, '{"result": "gated"}'))["result"]
        seen[(path, result)] = seen.get((path, result), 0) + 1

    check()
    # The generator reached both branches and both placed outcomes.
    assert {("placed", "set"), ("placed", "no-supported-platform"), ("gated", "gated")} <= set(
        seen), seen
    print(f"admission policy property: {sum(seen.values())} pods: {seen}")


def test_full_size_params_and_a_ten_image_pod_stay_within_cel_cost(world: World) -> None:
    """A catalog at the byte bound (thousands of ~100-character references), 13 images (2
    init, 3 image volumes beside an emptyDir): placed, not an evaluation error admitted
    unchanged."""
    refs = [_long_ref(i) for i in range(1000, 1013)]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big"}, "spec": {
        "initContainers": [{"name": f"i{n}", "image": r} for n, r in enumerate(refs[:2])],
        "containers": [{"name": f"c{n}", "image": r} for n, r in enumerate(refs[2:10])],
        "volumes": [{"name": "e", "emptyDir": {}}] + [
            {"name": f"v{n}", "image": {"reference": r}} for n, r in enumerate(refs[10:])]}}
    spec = world.env.get(f"{PARAMS}/{PARAMS_NAME}")["spec"]
    entries = flat_catalog(spec)[0]
    size = sum(len(json.dumps(spec[k], separators=(",", ":"))) for k in
               ("repositories", "platformSets", "learnedAt"))
    assert PARAMS_MAX_BYTES - 2_000 <= size <= PARAMS_MAX_BYTES and len(refs[0]) >= 100
    got = _dry_create(world.env, world.namespaces["weighted"], pod)
    assert _check(pod, got, entries, CONFIGS["weighted"]) == "placed"
    assert DECISION_ANNOTATION in got["metadata"]["annotations"]


def test_the_scheduler_binds_placed_pods_only_to_supported_architectures(
    world: World,
) -> None:
    """Placed pods (no controller running) are bound by kube-scheduler to nodes of their
    images' architectures; unsatisfiable ones stay unbound."""
    env, ns = world.env, world.namespaces["weighted"]
    linux_only = [ref for ref, pairs in world.pool.items() if "windows" not in pairs]
    created = []
    for n, ref in enumerate(linux_only[:12]):
        pod = _probe(ref)
        pod["metadata"]["name"] = f"bind-{n}"
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        r = env.request("POST", f"/api/v1/namespaces/{ns}/pods", json=pod)
        assert r.status_code == 201, r.text
        assert _check(pod, r.json(), world.pool, CONFIGS["weighted"]) == "placed"
        created.append(r.json()["metadata"]["name"])
    try:
        def all_bound() -> bool:
            pods = env.get(f"/api/v1/namespaces/{ns}/pods")["items"]
            return len(pods) == len(created) and all(p["spec"].get("nodeName") for p in pods)

        wait_for(all_bound, 60, every=0.2)
        assert check_bindings(env, ns, within=30) == len(created)
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"]
                 for n in env.get("/api/v1/nodes")["items"]}
        for name in created:
            pod = env.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            pairs = world.pool[pod["spec"]["containers"][0]["image"]].split(",")
            node = nodes[pod["spec"]["nodeName"]]
            assert f"{node[OS_LABEL]}/{node[ARCH_LABEL]}" in pairs, (name, node, pairs)
    finally:
        for name in created:
            env.delete(f"/api/v1/namespaces/{ns}/pods/{name}")


#: Odd references the catalog holds for :func:`test_the_split_of_odd_references_on_the_server`
#: (none of them the controller would record: the lookup rule must hold for any string), and
#: near misses that share a repository or a suffix with one of them but are not in it.
ODD_RECORDED = ("reg.example:5000/odd/app", "reg.example/odd/app:1@sha256:" + "ab" * 32,
                "reg.example/odd/é:ü", "reg.example/odd/a@b@c", "odd:7", "reg.example/odd/x:y:z")
ODD_MISSES = ("reg.example:5000/odd/app:", "reg.example/odd/app:1", "reg.example/odd/é",
              "reg.example/odd/a@b", "odd", "reg.example/odd/x:y", "reg.example:5000/odd/ap")


def test_the_split_of_odd_references_on_the_server(world: World) -> None:
    """kube-apiserver v1.36.2's CEL splits references as :func:`rules.admit.imageparams.
    split_reference` does (checked offline with another CEL runtime): with odd references in
    the catalog (no tag behind a registry port, tag and digest, non-ASCII, two ``@``, two
    ``:``), a pod of each is placed (arm64, their set) and a pod of each near miss is gated."""
    env = world.env
    saved = env.get(f"{PARAMS}/{PARAMS_NAME}")
    entries = {**flat_catalog(saved["spec"])[0], **dict.fromkeys(ODD_RECORDED, "linux/arm64")}
    odd = {**_params_object(entries),
           "metadata": {"name": PARAMS_NAME, "namespace": PARAMS_NS,
                        "resourceVersion": saved["metadata"]["resourceVersion"]}}
    r = env.request("PUT", f"{PARAMS}/{PARAMS_NAME}", json=odd)
    assert r.status_code == 200, r.text[:300]
    ns = world.namespaces["plain"]
    try:
        # the API server reads the params through its informer: a moment after the write
        wait_for(lambda: _placed(_dry_create(env, ns, _odd_probe(ODD_RECORDED[1]))), 30)
        for image in ODD_RECORDED:
            got = _dry_create(env, ns, _odd_probe(image))
            assert _placed(got), (image, got["metadata"].get("labels"))
            assert '"archs":["arm64"]' in got["metadata"]["annotations"][DECISION_ANNOTATION]
        for image in ODD_MISSES:
            got = _dry_create(env, ns, _odd_probe(image))
            assert [g["name"] for g in got["spec"].get("schedulingGates", [])] == [
                SCHEDULING_GATE], (image, got["metadata"].get("labels"))
    finally:
        current = env.get(f"{PARAMS}/{PARAMS_NAME}")
        restored = {**_params_object(flat_catalog(saved["spec"])[0]),
                    "metadata": {"name": PARAMS_NAME, "namespace": PARAMS_NS,
                                 "resourceVersion": current["metadata"]["resourceVersion"]}}
        r = env.request("PUT", f"{PARAMS}/{PARAMS_NAME}", json=restored)
        assert r.status_code == 200, r.text[:300]


def _odd_probe(image: str) -> dict[str, Any]:
    """:func:`_probe` pulled ``IfNotPresent``: the API server defaults a reference without a
    tag to ``Always``, which the policy places only from ``spec.fresh``."""
    pod = _probe(image)
    pod["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    return pod


def _placed(pod: Mapping[str, Any]) -> bool:
    """The policy placed the pod (its labels say so, no gate)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (labels.get(GATE_LABEL) == GATE_LABEL_REMOVED
            and not (pod.get("spec") or {}).get("schedulingGates"))


def test_server_fact_a_missing_params_object_skips_the_policy(world: World) -> None:
    """kube-apiserver v1.36.2: ``parameterNotFoundAction: Allow`` does not evaluate the
    policy with ``params == null``; it skips it, so the pod is admitted with neither gate
    nor placement. Hence the params object must exist before the binding, and it is the
    dead-man switch of every variant, the gate-only one (fastPaths Disabled) included:
    without it no pod is gated."""
    env = world.env
    saved = env.get(f"{PARAMS}/{PARAMS_NAME}")
    assert env.delete(f"{PARAMS}/{PARAMS_NAME}").status_code == 200
    probe = _probe(next(iter(world.pool)))
    try:
        wait_for(lambda: not _admitted_by_policy(
            _dry_create(env, world.namespaces["plain"], probe)), 30)
        assert not _admitted_by_policy(_dry_create(env, world.namespaces["disabled"], probe))
    finally:
        # The empty object to create before binding (ap.params_object) restores gating.
        assert env.request("POST", PARAMS,
                           json=ap.params_object(PARAMS_NS)).status_code == 201
    wait_for(lambda: _admitted_by_policy(
        _dry_create(env, world.namespaces["plain"], probe)), 30)
    gated = _dry_create(env, world.namespaces["plain"], probe)
    assert [g["name"] for g in gated["spec"]["schedulingGates"]] == [SCHEDULING_GATE]
    current = env.get(f"{PARAMS}/{PARAMS_NAME}")
    restored = {**_params_object(flat_catalog(saved["spec"])[0]),
                "metadata": {"name": PARAMS_NAME, "namespace": PARAMS_NS,
                             "resourceVersion": current["metadata"]["resourceVersion"]}}
    r = env.request("PUT", f"{PARAMS}/{PARAMS_NAME}", json=restored)
    assert r.status_code == 200, r.text[:300]


# --- the match conditions are the webhook's pod-level skip rules --------------------------

def _owner(kind: str, controller: bool | None) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "name": f"{kind.lower()}-x",
                           "uid": "6f1c3c9e-0000-4000-8000-00000000000" + str(len(kind) % 10)}
    if controller is not None:
        ref["controller"] = controller
    return ref


OWNERS: tuple[list[dict[str, Any]] | None, ...] = (
    None,
    [_owner("DaemonSet", True)],
    [_owner("DaemonSet", False)],
    [_owner("DaemonSet", None)],
    [_owner("ReplicaSet", True)],
    [_owner("ReplicaSet", False), _owner("DaemonSet", True)],
)
NODE_NAMES = (None, "", "mapplace-node-0")
MATCH_GATES: tuple[list[dict[str, str]] | None, ...] = (
    None, [{"name": "example.com/other"}], [{"name": SCHEDULING_GATE}])


def _match_pod(image: str, owners: list[dict[str, Any]] | None, node_name: str | None,
               gates: list[dict[str, str]] | None) -> dict[str, Any]:
    pod = _probe(image)
    if owners is not None:
        pod["metadata"]["ownerReferences"] = copy.deepcopy(owners)
    if node_name is not None:
        pod["spec"]["nodeName"] = node_name
    if gates is not None:
        pod["spec"]["schedulingGates"] = copy.deepcopy(gates)
    return pod


def test_match_conditions_skip_exactly_the_pods_should_gate_skips(world: World) -> None:
    """Pods with ``spec.nodeName``, with a controlling DaemonSet ownerReference (and the
    near misses: a DaemonSet that is not the controller, a controlling ReplicaSet), with and
    without gates, of a known and an unknown image, created against the real policy in its
    place and gate-only variants: the policy mutates a pod (gate or place) exactly when
    :func:`webhook.gating.should_gate` gates it; the place variant (its skip rules in the
    JSONPatch, no matchConditions) also labels a pod created with our gate ``gated``, as
    the webhook does, and adds no second gate."""
    from podplacement.webhook.gating import should_gate

    known = next(ref for ref, pairs in world.pool.items() if "windows" not in pairs)
    seen: dict[tuple[str, bool], int] = {}
    for variant in ("plain", "disabled"):
        ns = world.namespaces[variant]
        for image in (known, UNKNOWN[0]):
            for owners in OWNERS:
                for node_name in NODE_NAMES:
                    for gates in MATCH_GATES:
                        if node_name and gates:
                            continue  # gates are forbidden on a bound pod (KEP-3521)
                        pod = _match_pod(image, owners, node_name, gates)
                        got = _dry_create(world.env, ns, pod)
                        # the webhook's rules on the pod as sent (the policy runs first)
                        verdict = should_gate(pod, namespace=ns, config=CONFIGS[variant],
                                              own_namespace=PARAMS_NS)
                        labelled = verdict.gate or (
                            variant == "plain" and verdict.reason == "already_gated")
                        assert _admitted_by_policy(got) == labelled, (verdict, pod, got)
                        if labelled and not verdict.gate:
                            assert got["metadata"]["labels"][GATE_LABEL] == "gated", got
                            assert got["spec"]["schedulingGates"] == pod["spec"][
                                "schedulingGates"], got
                        seen[(verdict.reason, verdict.gate)] = seen.get(
                            (verdict.reason, verdict.gate), 0) + 1
    assert {"node_name_set", "daemonset", "already_gated", "gated"} <= {r for r, _ in seen}, seen


def test_bound_and_daemonset_pods_are_created_untouched(world: World) -> None:
    """Real creates (not dry runs) of a bound pod and of a DaemonSet's pod: admitted with
    neither gate nor label, as the webhook would leave them; an ordinary pod beside them is
    mutated."""
    env, ns = world.env, world.namespaces["plain"]
    image = next(ref for ref, pairs in world.pool.items() if "windows" not in pairs)
    pods = {"bound": _match_pod(image, None, "mapplace-node-0", None),
            "daemon": _match_pod(image, [_owner("DaemonSet", True)], None, None),
            "plain": _match_pod(image, None, None, None)}
    try:
        for name, pod in pods.items():
            pod["metadata"]["name"] = f"match-{name}"
            pod["spec"]["terminationGracePeriodSeconds"] = 0
            r = env.request("POST", f"/api/v1/namespaces/{ns}/pods", json=pod)
            assert r.status_code == 201, r.text
        stored = {name: env.get(f"/api/v1/namespaces/{ns}/pods/match-{name}") for name in pods}
        for name in ("bound", "daemon"):
            meta, spec = stored[name]["metadata"], stored[name]["spec"]
            assert GATE_LABEL not in (meta.get("labels") or {}), stored[name]
            assert not spec.get("schedulingGates") and "affinity" not in spec
        assert _admitted_by_policy(stored["plain"])
    finally:
        for name in pods:
            env.delete(f"/api/v1/namespaces/{ns}/pods/match-{name}")

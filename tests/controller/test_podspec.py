"""The shared pod rules (rules.podspec): QoS, quantities, gate, JSON pointers, nodes.

The QoS class is checked three ways: a table, a hypothesis comparison with an independent
transcription of kubernetes ``pkg/apis/core/helper/qos`` ``ComputePodQOS`` (plus the API
defaulting it runs after), and generated pods created (dry run) on the real kube-apiserver,
whose ``status.qosClass`` must match.
"""

from __future__ import annotations

import ast
import random
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podplacement.rules import podspec
from podplacement.rules.config import SCHEDULING_GATE
from podplacement.rules.podspec import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    QuantityError,
    compute_qos_class,
    effective_requests,
    escape_token,
    gate_index,
    has_gate,
    node_eligible,
    node_ineligibility,
    parse_quantity,
    qos_class,
    quantity_exact,
    quantity_milli,
    unescape_pointer,
)

ROOT = Path(__file__).resolve().parents[2]


def res(requests: dict[str, Any] | None = None,
        limits: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests is not None:
        out["requests"] = requests
    if limits is not None:
        out["limits"] = limits
    return out


def mkpod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
          pod_level: dict[str, Any] | None = None, absent: bool = True) -> dict[str, Any]:
    """A pod; each container is a ``resources`` dict (plus ``restartPolicy`` for init)."""
    def ctr(prefix: str, i: int, c: dict[str, Any]) -> dict[str, Any]:
        c = dict(c)
        out: dict[str, Any] = {"name": f"{prefix}{i}", "image": "registry.example/app:1"}
        if "restartPolicy" in c:
            out["restartPolicy"] = c.pop("restartPolicy")
        if c:
            out["resources"] = c
        return out
    spec: dict[str, Any] = {"containers": [ctr("c", i, c) for i, c in enumerate(containers)]}
    if init:
        spec["initContainers"] = [ctr("i", i, c) for i, c in enumerate(init)]
    if pod_level is not None or not absent:
        spec["resources"] = pod_level
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


GUARANTEED_RES = res({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})
SIDECAR = {"restartPolicy": "Always"}


@pytest.mark.parametrize(("pod", "expected"), [
    pytest.param(mkpod({}), BEST_EFFORT, id="no-resources"),
    pytest.param(mkpod(GUARANTEED_RES), GUARANTEED, id="requests-equal-limits"),
    pytest.param(mkpod(res(None, {"cpu": "1", "memory": "1Gi"})), GUARANTEED,
                 id="limits-only-default-requests"),
    pytest.param(mkpod(res({"memory": "0"}, {"cpu": "1", "memory": "2"})), BURSTABLE,
                 id="explicit-zero-request-is-not-defaulted"),
    pytest.param(mkpod(res(None, {"cpu": "0", "memory": "1"})), BURSTABLE,
                 id="zero-cpu-limit-does-not-count"),
    pytest.param(mkpod(res({"cpu": "0", "memory": "0"})), BEST_EFFORT, id="zero-requests"),
    pytest.param(mkpod(res({"cpu": "1"})), BURSTABLE, id="cpu-request-only"),
    pytest.param(mkpod(res({"cpu": "1", "memory": "1.5"}, {"cpu": "1", "memory": "2"})),
                 BURSTABLE, id="fractional-memory-compared-exactly"),
    pytest.param(mkpod(res({"cpu": "100n", "memory": "1"}, {"cpu": "1m", "memory": "1"})),
                 GUARANTEED, id="rounded-up-to-milli-like-the-server"),
    pytest.param(mkpod(res({"cpu": "1000m", "memory": "1073741824"},
                           {"cpu": 1, "memory": "1Gi"})), GUARANTEED, id="same-value-spellings"),
    pytest.param(mkpod(res({"example.com/nic": "1"}, {"example.com/nic": "1"})), BEST_EFFORT,
                 id="extended-resources-ignored"),
    pytest.param(mkpod(GUARANTEED_RES, res({"cpu": "1"})), BURSTABLE,
                 id="one-container-without-limits"),
    pytest.param(mkpod(GUARANTEED_RES, init=({},)), BURSTABLE,
                 id="init-container-without-limits"),
    pytest.param(mkpod(GUARANTEED_RES, init=(GUARANTEED_RES,)), GUARANTEED,
                 id="guaranteed-init-container"),
    pytest.param(mkpod({}, init=(res({"cpu": "1"}),)), BURSTABLE, id="init-request-counts"),
    pytest.param(mkpod(GUARANTEED_RES, init=({**SIDECAR, **GUARANTEED_RES},)), GUARANTEED,
                 id="guaranteed-sidecar"),
    pytest.param(mkpod(GUARANTEED_RES, init=({**SIDECAR, **res({"cpu": "1"}, {"cpu": "1"})},)),
                 BURSTABLE, id="sidecar-without-memory-limit"),
    pytest.param(mkpod({}, {}, pod_level=res(None, {"cpu": "2", "memory": "2Gi"})), GUARANTEED,
                 id="pod-level-limits-default-requests"),
    pytest.param(mkpod(res({"cpu": "1"}), pod_level=res(None, {"cpu": "2", "memory": "2Gi"})),
                 BURSTABLE, id="pod-level-requests-default-from-containers"),
    pytest.param(mkpod({}, pod_level=res({"cpu": "1"}, {"cpu": "2", "memory": "2Gi"})),
                 BURSTABLE, id="pod-level-requests-below-limits"),
    pytest.param(mkpod({}, pod_level=res(None, {"cpu": "1", "memory": "0"})), BURSTABLE,
                 id="pod-level-zero-memory-limit"),
    pytest.param(mkpod(GUARANTEED_RES, pod_level=res({"cpu": "1"})), BURSTABLE,
                 id="pod-level-decides-over-guaranteed-containers"),
    pytest.param(mkpod(GUARANTEED_RES, pod_level={}), BEST_EFFORT,
                 id="empty-pod-level-object-takes-the-pod-level-branch"),
    pytest.param(mkpod(GUARANTEED_RES, pod_level=None, absent=False), GUARANTEED,
                 id="null-pod-level-is-absent"),
    pytest.param(mkpod(res({"cpu": "1"}), init=(res({"cpu": "3", "memory": "2Gi"}),),
                       pod_level=res(None, {"cpu": "3", "memory": "2Gi"})), GUARANTEED,
                 id="pod-level-default-from-largest-init"),
])
def test_qos_table(pod: dict[str, Any], expected: str) -> None:
    assert compute_qos_class(pod) == expected
    assert qos_class(pod) == expected


def test_status_qos_class_wins() -> None:
    pod = mkpod({})
    pod["status"] = {"qosClass": BURSTABLE}
    assert qos_class(pod) == BURSTABLE
    assert compute_qos_class(pod) == BEST_EFFORT


def test_effective_requests_app_init_sidecar_overhead() -> None:
    pod = mkpod(res({"cpu": "2", "memory": "1Gi"}),
                init=({**SIDECAR, **res({"cpu": "1", "memory": "1Gi"})},
                      res({"cpu": "5", "memory": "1Gi"})))
    pod["spec"]["overhead"] = {"cpu": "250m"}
    # max(apps 2 + sidecar 1, init 5 + sidecar 1) + overhead
    assert effective_requests(pod) == {"cpu": 6250, "memory": 2 * 1024**3}


# --- quantities -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "exact"), [
    ("1", Fraction(1)), ("+1", Fraction(1)), ("-1", Fraction(-1)), ("0", Fraction(0)),
    ("1.5", Fraction(3, 2)), (".5", Fraction(1, 2)), ("5.", Fraction(5)),
    ("500m", Fraction(1, 2)), ("100n", Fraction(1, 10**7)), ("3u", Fraction(3, 10**6)),
    ("1k", Fraction(1000)), ("1M", Fraction(10**6)), ("1G", Fraction(10**9)),
    ("1T", Fraction(10**12)), ("1P", Fraction(10**15)), ("1E", Fraction(10**18)),
    ("1Ki", Fraction(1024)), ("1Mi", Fraction(2**20)), ("1Gi", Fraction(2**30)),
    ("1Ti", Fraction(2**40)), ("1Pi", Fraction(2**50)), ("1Ei", Fraction(2**60)),
    ("1e3", Fraction(1000)), ("1E+3", Fraction(1000)), ("1e-3", Fraction(1, 1000)),
    (" 2 ", Fraction(2)), (7, Fraction(7)), (0.25, Fraction(1, 4)),
])
def test_quantity_exact_valid(value: object, exact: Fraction) -> None:
    assert quantity_exact(value) == exact


@pytest.mark.parametrize("bad", [
    "", " ", "1_000", "1_0Mi", "\u0661", "NaN", "nan", "Inf", "Infinity", "-inf", "1.2.3", "Gi",
    "5 Gi", "1KI", "1ki", "1e", "1e1.5", "1Mi1", "0x10", "1\n2", "++1", "1e99999",
    True, None, [1], {"a": 1}, float("nan"), float("inf"),
])
def test_quantity_invalid(bad: object) -> None:
    with pytest.raises(QuantityError):
        quantity_exact(bad)
    with pytest.raises(QuantityError):
        parse_quantity("memory", bad)
    with pytest.raises(QuantityError):
        quantity_milli(bad)


def test_parse_quantity_units() -> None:
    assert parse_quantity("cpu", "100n") == 1          # MilliValue() rounds up
    assert parse_quantity("cpu", 2) == 2000
    assert parse_quantity("memory", "1.5") == 2        # Value() rounds up
    assert parse_quantity("memory", "2Gi") == 2 * 1024**3
    assert quantity_milli("1.5") == 1500
    assert quantity_milli("100n") == 1


# --- gate, pointers, nodes ---------------------------------------------------------------


def test_gate_presence_and_index() -> None:
    pod = {"spec": {"schedulingGates": [{"name": "other"}, {"name": SCHEDULING_GATE}]}}
    assert gate_index(pod) == 1 and has_gate(pod)
    assert gate_index(pod, "other") == 0
    assert not has_gate({"spec": {"schedulingGates": [{"name": "other"}]}})
    for odd in ({}, {"spec": None}, {"spec": []}, {"spec": {"schedulingGates": "x"}},
                {"spec": {"schedulingGates": [None, "g", {"name": 1}]}}):
        assert not has_gate(odd)


@pytest.mark.parametrize(("token", "escaped"), [
    ("a", "a"), ("a/b", "a~1b"), ("a~b", "a~0b"), ("~1", "~01"), ("/~", "~1~0"), ("", ""),
])
def test_pointer_escape_round_trip(token: str, escaped: str) -> None:
    assert escape_token(token) == escaped
    assert unescape_pointer("/x/" + escaped) == ["x", token]


def test_unescape_pointer() -> None:
    assert unescape_pointer("") == []
    assert unescape_pointer("/") == [""]
    assert unescape_pointer("/metadata/labels/a~1b") == ["metadata", "labels", "a/b"]
    assert unescape_pointer("/~01") == ["~1"]
    with pytest.raises(ValueError):
        unescape_pointer("metadata")


def _node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels}}


def test_node_eligibility() -> None:
    arm = _node(**{"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux", "zone": "a"})
    unlabelled_os = _node(**{"kubernetes.io/arch": "amd64"})
    pairs = {("linux", "amd64")}
    assert node_eligible(arm, {}, None)
    assert node_eligible(arm, {"zone": "a"}, None)
    assert not node_eligible(arm, {"zone": "b"}, None)
    assert not node_eligible(arm, {}, pairs)
    assert node_eligible(unlabelled_os, {}, pairs)          # os defaults to linux
    assert not node_eligible(unlabelled_os, {}, set())      # images share no platform
    assert node_ineligibility(arm, {"zone": "b"}, None) == "nodeSelector zone=b does not match (a)"
    assert node_ineligibility(arm, {}, pairs) == (
        "platform linux/arm64 is not supported by every image (supported: linux/amd64)")
    assert node_ineligibility(_node(), {}, pairs) == (
        "platform linux/unknown is not supported by every image (supported: linux/amd64)")
    for node, sel, plats in ((arm, {}, pairs), (arm, {"zone": "a"}, None),
                             (unlabelled_os, {"x": "y"}, pairs), (unlabelled_os, {}, pairs)):
        assert node_eligible(node, sel, plats) == (node_ineligibility(node, sel, plats) is None)


def test_podspec_and_webhook_layering() -> None:
    """podspec imports only the standard library and rules.config; the webhook's
    pure rules import nothing from the controller but rules.config,
    rules.podspec, (gating) rules.scope, the skip rules it shares with
    the escape monitor, and rules.admit.predicates, the predicate table it shares with
    the admission objects' CEL, and (patch) rules.place.placement, the labels of a
    released pod."""
    core = "podplacement.rules"
    allowed = {"podspec.py": {f"{core}.config"},
               "gating.py": {f"{core}.config", f"{core}.podspec", f"{core}.scope",
                             f"{core}.admit.predicates"},
               "patch.py": {f"{core}.config", f"{core}.podspec", f"{core}.place.placement"}}
    paths = {"podspec.py": ROOT / "rules" / "podspec.py",
             "gating.py": ROOT / "webhook" / "gating.py",
             "patch.py": ROOT / "webhook" / "patch.py"}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for module in modules:
                if module.split(".")[0] in ("controller", "webhook", "rules", "imageinspect",
                                            "localkube", "podplacement"):
                    assert module in allowed[name], f"{name} imports {module}"


# --- an independent transcription of ComputePodQOS, and random pods ------------------------

# Every quantity the generator writes, with its exact value (so the reference needs no parser).
CPU_VALUES: list[tuple[Any, Fraction]] = [
    ("0", Fraction(0)), ("100n", Fraction(1, 10**7)), ("1m", Fraction(1, 1000)),
    ("500m", Fraction(1, 2)), ("0.5", Fraction(1, 2)), (0.5, Fraction(1, 2)),
    ("1", Fraction(1)), ("1000m", Fraction(1)), (1, Fraction(1)), ("1e0", Fraction(1)),
    ("1.5", Fraction(3, 2)), ("2", Fraction(2)),
]
MEMORY_VALUES: list[tuple[Any, Fraction]] = [
    ("0", Fraction(0)), ("1", Fraction(1)), ("1.5", Fraction(3, 2)),
    ("1500m", Fraction(3, 2)), ("2", Fraction(2)), ("1k", Fraction(1000)),
    ("1e3", Fraction(1000)), ("1Ki", Fraction(1024)), ("1024", Fraction(1024)),
    ("1Mi", Fraction(2**20)), ("1Gi", Fraction(2**30)), ("1073741824", Fraction(2**30)),
    ("2Gi", Fraction(2**31)),
]
POD_CPU_VALUES = [("0", Fraction(0)), ("16", Fraction(16)), ("32", Fraction(32)),
                  ("64", Fraction(64))]
POD_MEMORY_VALUES = [("0", Fraction(0)), ("16Gi", Fraction(16 * 2**30)),
                     ("32Gi", Fraction(32 * 2**30)), ("64Gi", Fraction(64 * 2**30))]
EXACT: dict[Any, Fraction] = {}
for _text, _value in CPU_VALUES + MEMORY_VALUES + POD_CPU_VALUES + POD_MEMORY_VALUES:
    EXACT[(type(_text), _text)] = _value


def _pick_pair(rng: random.Random, values: list[tuple[Any, Fraction]],
               valid: bool) -> tuple[Any, Any]:
    """(request, limit) texts, either may be None; request <= limit when ``valid``."""
    mode = rng.choice(("none", "request", "limit", "both", "both"))
    limit = rng.choice(values) if mode in ("limit", "both") else None
    request = None
    if mode in ("request", "both"):
        choices = [v for v in values if not valid or limit is None or v[1] <= limit[1]]
        request = rng.choice(choices)
    return (request[0] if request else None), (limit[0] if limit else None)


def _random_resources(rng: random.Random, cpu: list[tuple[Any, Fraction]],
                      memory: list[tuple[Any, Fraction]], valid: bool,
                      extended: bool) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for name, values in (("cpu", cpu), ("memory", memory)):
        request, limit = _pick_pair(rng, values, valid)
        if request is not None:
            requests[name] = request
        if limit is not None:
            limits[name] = limit
    if extended and rng.random() < 0.15:
        requests["example.com/nic"] = limits["example.com/nic"] = "1"
    out: dict[str, Any] = {}
    if requests or rng.random() < 0.1:
        out["requests"] = requests
    if limits or rng.random() < 0.1:
        out["limits"] = limits
    return out


def random_pod(rng: random.Random, valid: bool = True) -> dict[str, Any]:
    """A pod with random cpu/memory requests and limits on 1-3 containers, 0-2 init
    containers (some sidecars) and sometimes pod-level resources. With ``valid`` the pod
    passes the API server's validation in most cases (requests <= limits, small containers
    under large pod-level amounts)."""
    def container(prefix: str, i: int, init: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "registry.example/app:1"}
        if init and rng.random() < 0.4:
            c["restartPolicy"] = "Always"
        resources = _random_resources(rng, CPU_VALUES, MEMORY_VALUES, valid, extended=True)
        if resources or rng.random() < 0.2:
            c["resources"] = resources
        return c
    spec: dict[str, Any] = {
        "containers": [container("c", i, False) for i in range(rng.randint(1, 3))]}
    inits = [container("i", i, True) for i in range(rng.choice((0, 0, 1, 2)))]
    if inits:
        spec["initContainers"] = inits
    roll = rng.random()
    if roll < 0.05:
        spec["resources"] = {}
    elif roll < 0.35:
        spec["resources"] = _random_resources(rng, POD_CPU_VALUES, POD_MEMORY_VALUES, valid,
                                              extended=False)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}, "spec": spec}


def _exact(value: Any) -> Fraction:
    return EXACT[(type(value), value)]


def _round_milli(value: Fraction) -> Fraction:
    """``Quantity.RoundUp(-3)`` of ``SetDefaults_ResourceList``."""
    return Fraction(-((-value.numerator * 1000) // value.denominator), 1000)


def reference_qos(pod: dict[str, Any]) -> str:
    """Defaulting (SetDefaults_ResourceList, SetDefaults_Pod, defaultPodRequests), then
    ComputePodQOS, transcribed line by line from the Go sources."""
    spec = pod["spec"]
    supported = {"cpu", "memory"}

    def rlist(raw: dict[str, Any] | None) -> dict[str, Fraction]:
        return {k: _round_milli(_exact(v)) if k in supported else Fraction(1)
                for k, v in (raw or {}).items()}

    containers = []  # (requests, limits, is restartable init, is init)
    for is_init, key in ((False, "containers"), (True, "initContainers")):
        for c in spec.get(key) or []:
            r = c.get("resources") or {}
            requests, limits = rlist(r.get("requests")), rlist(r.get("limits"))
            for name, q in limits.items():
                if name not in requests:
                    requests[name] = q
            containers.append((requests, limits, c.get("restartPolicy") == "Always", is_init))

    pod_resources = spec.get("resources")
    pod_requests: dict[str, Fraction] = {}
    pod_limits: dict[str, Fraction] = {}
    if pod_resources is not None:
        pod_requests = rlist(pod_resources.get("requests"))
        pod_limits = rlist(pod_resources.get("limits"))
        if pod_limits:
            # AggregateContainerRequests
            reqs: dict[str, Fraction] = {}
            for requests, _, _, is_init in containers:
                if not is_init:
                    for name, q in requests.items():
                        reqs[name] = reqs.get(name, Fraction(0)) + q
            restartable: dict[str, Fraction] = {}
            init_reqs: dict[str, Fraction] = {}
            for requests, _, always, is_init in containers:
                if not is_init:
                    continue
                if always:
                    for name, q in requests.items():
                        reqs[name] = reqs.get(name, Fraction(0)) + q
                        restartable[name] = restartable.get(name, Fraction(0)) + q
                    current = dict(restartable)
                else:
                    current = dict(requests)
                    for name, q in restartable.items():
                        current[name] = current.get(name, Fraction(0)) + q
                for name, q in current.items():
                    if name not in init_reqs or q > init_reqs[name]:
                        init_reqs[name] = q
            for name, q in init_reqs.items():
                if name not in reqs or q > reqs[name]:
                    reqs[name] = q
            for name, q in reqs.items():
                if name not in pod_requests and name in supported:
                    pod_requests[name] = q
            for name, q in pod_limits.items():
                if name not in pod_requests and name in supported:
                    pod_requests[name] = q

    requests_sum: dict[str, Fraction] = {}
    limits_sum: dict[str, Fraction] = {}
    is_guaranteed = True
    if pod_resources is not None:
        for name, q in pod_requests.items():
            if name in supported and q > 0:
                requests_sum[name] = requests_sum.get(name, Fraction(0)) + q
        if pod_limits:
            found = set()
            for name, q in pod_limits.items():
                if name in supported and q > 0:
                    limits_sum[name] = limits_sum.get(name, Fraction(0)) + q
                    found.add(name)
            if not {"memory", "cpu"} <= found:
                is_guaranteed = False
    else:
        for requests, limits, _, _ in containers:
            for name, q in requests.items():
                if name in supported and q > 0:
                    requests_sum[name] = requests_sum.get(name, Fraction(0)) + q
            found = set()
            for name, q in limits.items():
                if name in supported and q > 0:
                    found.add(name)
                    limits_sum[name] = limits_sum.get(name, Fraction(0)) + q
            if not {"memory", "cpu"} <= found:
                is_guaranteed = False
    if not requests_sum and not limits_sum:
        return "BestEffort"
    if is_guaranteed:
        for name, q in requests_sum.items():
            if name not in limits_sum or limits_sum[name] != q:
                is_guaranteed = False
                break
    if is_guaranteed and len(requests_sum) == len(limits_sum):
        return "Guaranteed"
    return "Burstable"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.booleans())
def test_qos_matches_transcription_of_qos_go(rng: random.Random, valid: bool) -> None:
    pod = random_pod(rng, valid)
    assert compute_qos_class(pod) == reference_qos(pod), pod


# --- the real API server ------------------------------------------------------------------

REAL_PODS = 420
MIN_COMPARED = 300


@pytest.mark.realcluster
def test_qos_matches_the_real_api_server(real_kube: Any) -> None:
    """Create generated pods with ``dryRun=All`` (the server defaults, validates and
    computes ``status.qosClass`` without storing) and compare with podspec."""
    namespace = "podspec-qos"
    real_kube.ensure_namespace(namespace)
    rng = random.Random(20260612)
    pods = [random_pod(rng) for _ in range(REAL_PODS)]
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"q-{i}"
    path = f"/api/v1/namespaces/{namespace}/pods"

    def create(pod: dict[str, Any]) -> tuple[dict[str, Any], int, dict[str, Any]]:
        r = real_kube.request("POST", path, json=pod, params={"dryRun": "All"})
        return pod, r.status_code, r.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(create, pods))
    mismatches = []
    compared = 0
    for pod, status, body in answers:
        if status == 422:  # the generator's rare invalid combination: nothing to compare
            continue
        assert status == 201, body
        compared += 1
        server = body["status"]["qosClass"]
        ours = qos_class(pod)
        if ours != server or reference_qos(pod) != server:
            mismatches.append((server, ours, reference_qos(pod), pod["spec"]))
    print(f"compared {compared} pods with the real API server")
    assert not mismatches, mismatches[:5]
    assert compared >= MIN_COMPARED, f"only {compared} of {REAL_PODS} pods were valid"
    assert podspec.QOS_RESOURCES == ("cpu", "memory")

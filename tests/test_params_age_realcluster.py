"""A tag that moved is not placed from the params object past its cacheTTL, across controller
restarts: podplacement installed from deploy/ on the real control plane v1.36.2, the webhook
and the controller as processes (:mod:`podplacement.sandbox.product`).

With ``imageInspection.cacheTTL: 20s``: a tag is warmed as amd64+arm64 through a pod (the
controller publishes it in ImagePlatformCatalog ``cluster``, with its learned time in
``spec.learnedAt``), then re-pushed amd64-only, and the controller is restarted twice with the
params object left in place: a rolling restart (a new controller process starts, the leader
stops gracefully and the new one takes over) and a crash (the leader killed, a new process
leads once the Lease expired). The only controller stopping gracefully is no such case: it
stands down and deletes the params object. Each new leader keeps the entry's learned time;
the entry leaves the params object within TTL + 2 s of it, with no pod needed to trigger
that, and no pod created after that deadline is placed at admission (by the policy or by the
webhook) with arm64. Pods are created every half second throughout, so the test measures the
latest stale placement.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podplacement.controller.paramswriter import params_path
from podplacement.rules.admit.imageparams import flat_catalog
from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.sandbox.product import NAMESPACE, Product, install_manifests, start_product
from tests.harness.kube import KubeEnv
from tests.harness.realcluster import (
    NO_STAND_DOWN,
    REPO,
    checked_namespace,
    real_cluster,
    wait_for,
)
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

TTL = 20.0
#: The params object (in the product's namespace) and the config (cluster-scoped).
PARAMS = params_path(NAMESPACE)
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
#: Paths of the decision annotation that mean "placed at admission".
AT_ADMISSION = ("admission", "webhook")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    plane = real_cluster(tmp_path_factory, "params-age")
    env = next(plane)
    try:
        assert env.plane is not None
        install_manifests(env.plane, REPO / "deploy")
        yield env
    finally:
        plane.close()


@pytest.fixture
def ns(cluster: KubeEnv) -> Iterator[str]:
    yield from checked_namespace(cluster, "age")


@pytest.fixture
def product(cluster: KubeEnv, registry: Registry, tmp_path: Path) -> Iterator[Product]:
    assert cluster.plane is not None
    # inspectionBudget 0s: the first pod goes through the controller, which publishes the
    # tag in the params object (what this test is about); the webhook would place it itself
    cluster.patch(CONFIG, {"spec": {"imageInspection": {"cacheTTL": f"{TTL:.0f}s"},
                                    "admission": {"inspectionBudget": "0s"}}})
    options = ["--insecure-registry", registry.host]
    prod = start_product(cluster.plane, tmp_path / "product",
                         controller_options=[*options, *NO_STAND_DOWN], webhook_options=options)
    try:
        yield prod
    finally:
        prod.stop()
    assert prod.forbidden() == [], "RBAC denials in the product's logs"


def _pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


def _path(pod: dict[str, Any]) -> str | None:
    raw = (pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
    return None if raw is None else str(json.loads(raw).get("path", "controller"))


def _archs(pod: dict[str, Any]) -> set[str]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return {v for t in terms for e in t.get("matchExpressions") or []
            if e["key"] == "kubernetes.io/arch" for v in e["values"]}


class _ParamsWatch:
    """Polls the params object every 0.1 s in a thread (its own client): the entry of
    ``image`` over time, as (wall time, value or None, learned or None)."""

    def __init__(self, cluster: KubeEnv, image: str) -> None:
        assert cluster.plane is not None
        self._plane, self.image = cluster.plane, image
        self.seen: list[tuple[float, str | None, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="params watch", daemon=True)

    def __enter__(self) -> _ParamsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with self._plane.client() as c:
            while not self._stop.is_set():
                r = c.get(PARAMS)
                if r.status_code == 200:
                    images, learned = flat_catalog(r.json().get("spec") or {})
                    self.seen.append((time.time(), images.get(self.image),
                                      learned.get(self.image)))
                self._stop.wait(0.1)

    def gone_after(self, since: float) -> float | None:
        """The first time at or after ``since`` the entry was absent, or None."""
        return next((t for t, value, _ in list(self.seen) if t >= since and value is None),
                    None)


def _learned(cluster: KubeEnv, image: str) -> int | None:
    """The learned time of ``image`` in the live params object (``spec.learnedAt``; None:
    no entry)."""
    images, learned = flat_catalog(cluster.get(PARAMS).get("spec") or {})
    if image not in images:
        return None
    value = learned.get(image)
    return value if isinstance(value, int) else None


def _leading(product: Product, proc_index: int, line: str, limit: float = 30.0) -> None:
    """Wait until the log of controller process ``proc_index`` has ``line``."""
    proc = product.controllers[proc_index]
    wait_for(lambda: line in proc.log() or not proc.alive(), limit)
    assert proc.alive(), proc.log()[-3000:]


def test_a_moved_tag_leaves_the_params_object_within_its_ttl_across_two_restarts(
        cluster: KubeEnv, ns: str, product: Product, registry: Registry,
        make_pusher: Any) -> None:
    pusher = make_pusher(registry)
    pusher.multiarch("age/moving", "v1", ["linux/amd64", "linux/arm64"])
    image = f"{registry.host}/age/moving:v1"
    pods = f"/api/v1/namespaces/{ns}/pods"
    wait_for(lambda: (cluster.get(CONFIG).get("status") or {}).get("admission") == {
        "mechanism": "MutatingAdmissionPolicy", "fastPaths": "Enabled"}, 30)
    _leading(product, 0, "controller leading")

    # warm: the first pod is gated and placed by the controller, which publishes the tag
    created: list[tuple[float, dict[str, Any]]] = []
    before_first = time.time()
    first = cluster.create(pods, _pod("warm", image))
    assert _gated(first)

    def published() -> dict[str, Any] | None:
        spec = cluster.get(PARAMS).get("spec") or {}
        return spec if image in flat_catalog(spec)[0] else None

    published_spec = wait_for(published, 30)
    seen_published = time.time()
    assert flat_catalog(published_spec)[0][image] == "linux/amd64,linux/arm64"

    with _ParamsWatch(cluster, image) as watch:
        # the tag moves: amd64 only from now on
        pusher.image("age/moving", "v1", architecture="amd64")
        moved = time.time()
        learned_after: list[int | None] = []
        # a rolling restart: the new process campaigns, then the leader stops gracefully
        product.start_controller()
        _leading(product, 1, "controller started")
        product.controllers[0].stop()
        # a crash: the leader is killed, a new process leads once the Lease expired
        _leading(product, 1, "params object cluster: adopted")
        learned_after.append(_learned(cluster, image))
        product.controllers[1].stop(signal.SIGKILL)
        product.start_controller()
        _leading(product, 2, "params object cluster: adopted")
        learned_after.append(_learned(cluster, image))
        restarted = time.time()
        for proc in product.controllers:
            assert "standing down:" not in proc.log(), proc.name  # the object stayed

        # pods every half second until well past the TTL; the writer alone must expire it
        n = 0
        while time.time() < seen_published + TTL + 10:
            created.append((time.time(), cluster.create(pods, _pod(f"p-{n}", image))))
            n += 1
            time.sleep(0.5)
        deadline = time.time() + 5
        while watch.gone_after(moved) is None and time.time() < deadline:
            time.sleep(0.1)

    stale = [(t, pod) for t, pod in created
             if _path(pod) in AT_ADMISSION and "arm64" in _archs(pod)]
    latest_stale = max((t for t, _ in stale), default=None)
    gone = watch.gone_after(moved)
    learned = flat_catalog(published_spec)[1].get(image)
    since = learned or seen_published  # what the ages below are counted from
    print(f"\ncacheTTL {TTL:.0f}s, two restarts (done {restarted - moved:.1f} s after the "
          f"move); learned {learned}, first seen published {seen_published - before_first:.2f}"
          f" s after the first pod; restarts kept learned: {learned_after}; entry gone "
          + ("never" if gone is None else f"{gone - since:.2f} s after it was learned")
          + f"; {len(created)} pods, {len(stale)} placed stale at admission "
          f"({sorted({str(_path(p)) for _, p in stale})}), the latest created "
          + ("never" if latest_stale is None else
             f"{latest_stale - since:.2f} s after it was learned "
             f"({latest_stale - moved:.2f} s after the tag moved)"))

    # Bounds that hold whatever the object records: the controller fetched the tag between
    # the first pod's creation and the moment the test saw it published.
    assert gone is not None and gone <= seen_published + TTL + 2, \
        "the moved tag outlived its TTL in the params object"
    assert latest_stale is None or latest_stale <= seen_published + TTL + 2, \
        "a pod was placed with the old platforms after the TTL"
    # The learned time: when the registry answered, kept across both restarts.
    assert learned is not None and before_first - 1 <= learned <= seen_published
    assert all(v in (learned, None) for v in learned_after), learned_after
    assert learned_after[0] == learned, "the leader change dropped or renewed the entry"
    assert gone <= learned + TTL + 2
    assert latest_stale is None or latest_stale <= learned + TTL + 2
    # Pods created after that: none placed with arm64 by the policy or the webhook; the
    # controller places them amd64 and publishes the tag again, amd64-only.
    later = [pod for t, pod in created if t > learned + TTL + 2]
    assert later, "no pod was created after the deadline"
    for pod in later:
        assert "arm64" not in _archs(pod) or _path(pod) not in AT_ADMISSION, pod["metadata"]

    def republished() -> bool:
        images, times = flat_catalog(cluster.get(PARAMS).get("spec") or {})
        seconds = times.get(image, 0)
        return (images.get(image) == "linux/amd64" and isinstance(seconds, int)
                and seconds > learned)

    wait_for(republished, 30)
    for name in [pod["metadata"]["name"] for pod in later]:
        def decided(name: str = name) -> dict[str, Any] | None:
            pod = cluster.get(f"{pods}/{name}")
            return None if _gated(pod) else pod

        pod = wait_for(decided, 60)
        assert _archs(pod) == {"amd64"}, (name, _path(pod), _archs(pod))

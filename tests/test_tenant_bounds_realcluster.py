"""Bounded by design: one pod naming 60 tags of an image index of 20,000 platform entries
(4 MB, under the 4 MiB manifest cap) neither exhausts the product's memory nor stays gated,
on the real control plane v1.36.2 with podplacement installed from deploy/ as shipped and the
real registry.

Before the bounds: the webhook peaked at 402 MiB (deploy/ limit 256Mi), the controller at
602 MiB, and the controller's PATCH was answered ``413 RequestEntityTooLarge`` (a decision
annotation listing 60 x 20,000 platforms), retried forever, the pod gated with no Event.
Now a manifest is read within 1 MiB and an index within 512 entries (``imageinspect.
_manifest.MAX_MANIFEST_BYTES``, ``MAX_INDEX_ENTRIES``): the 4 MB are refused from their
``Content-Length`` before they are read, so every image is uninspectable and, after the
configured retries, the pod is released with the fallback (``kubernetes.io/os In [linux]``)
and the Warning ``PlacementFallback``.

The peak resident memory (``VmHWM``) of the webhook and the controller is printed; the
assertion is a generous bound below deploy/'s limits, not a benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.rules.config import DECISION_ANNOTATION, SCHEDULING_GATE
from podplacement.rules.place.placement import MAX_DECISION_BYTES
from podplacement.sandbox.product import Product
from tests.harness.kube import KubeEnv
from tests.harness.oci import OCI_INDEX
from tests.harness.realcluster import REPO, installed_cluster, running_product, wait_for
from tests.harness.registry import Registry

pytestmark = pytest.mark.realcluster

ENTRIES = 20_000
TAGS = 60
REPO_NAME = "bounds/huge"
NS = "bounds"
CONFIG = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEnv]:
    yield from installed_cluster(tmp_path_factory, "bounds")


@pytest.fixture(scope="module")
def product(cluster: KubeEnv, registry: Registry,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    yield from running_product(cluster, registry, tmp_path_factory)


def huge_index(child: dict[str, Any]) -> bytes:
    """An OCI index of :data:`ENTRIES` entries over one child, each with a platform of its
    own (``linux/aNNNNN``: nothing to deduplicate): about 4 MB."""
    entries = [{**child, "platform": {"os": "linux", "architecture": f"a{i:05d}"}}
               for i in range(ENTRIES)]
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries},
                      separators=(",", ":")).encode()
    assert 3_900_000 < len(body) < 4 * 1024 * 1024, len(body)
    return body


@pytest.fixture(scope="module")
def images(registry: Registry, make_pusher: Any) -> list[str]:
    """:data:`TAGS` tags of the huge index. The pusher PUTs it once (the registry checks
    each of its 20,000 references, about 2 s); the other tags are written as the registry's
    filesystem storage keeps a tag (distribution's ``_manifests/tags/<tag>/current/link``
    and ``index/<alg>/<hex>/link``, each holding the digest), since 59 more PUTs of the same
    4 MB would take two minutes; one GET checks the registry serves such a tag."""
    pusher = make_pusher(registry)
    child = pusher.image(REPO_NAME, "child", fmt="oci")
    pushed = pusher.raw_manifest(REPO_NAME, "t0", huge_index(child.descriptor()), OCI_INDEX)
    tags = (registry.root / "storage" / "docker" / "registry" / "v2" / "repositories"
            / REPO_NAME / "_manifests" / "tags")
    algorithm, hexdigest = pushed.digest.split(":", 1)
    for n in range(1, TAGS):
        for link in (tags / f"t{n}" / "current" / "link",
                     tags / f"t{n}" / "index" / algorithm / hexdigest / "link"):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.write_text(pushed.digest)
    served = pusher.get_manifest(REPO_NAME, f"t{TAGS - 1}")
    assert served.status_code == 200 and served.headers["Docker-Content-Digest"] == pushed.digest
    return [f"{registry.host}/{REPO_NAME}:t{n}" for n in range(TAGS)]


def vm_hwm_mib(pid: int) -> float:
    """The peak resident memory of ``pid`` (``VmHWM`` of ``/proc/<pid>/status``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def memory_limit_mib(component: str) -> float:
    """The memory limit of deploy/base/<component>/deployment.yaml, MiB."""
    doc = yaml.safe_load((REPO / "deploy" / "base" / component / "deployment.yaml").read_text())
    limit = str(doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                ["memory"])
    assert limit.endswith(("Mi", "Gi")), limit
    return float(limit[:-2]) * (1024 if limit.endswith("Gi") else 1)


def peak_rss(product: Product) -> dict[str, float]:
    """The peak resident memory of the webhook and the controller so far, MiB; printed."""
    peaks = {"webhook": vm_hwm_mib(product.webhook.popen.pid),
             "controller": vm_hwm_mib(product.controllers[0].popen.pid)}
    print("\npeak RSS (VmHWM): " + ", ".join(
        f"{name} {mib:.0f} MiB (deploy/ limit {memory_limit_mib(name):.0f} Mi)"
        for name, mib in peaks.items()))
    return peaks


@pytest.mark.timeout(300)
def test_a_pod_of_60_tags_of_a_20000_entry_index_is_released_with_the_fallback(
        cluster: KubeEnv, product: Product, images: list[str]) -> None:
    cluster.ensure_namespace(NS)
    # one retry, not five: the bounds are under test here, not the retries' backoff
    cluster.patch(CONFIG, {"spec": {"imageInspection": {"maxRetries": 1}}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
           "spec": {"containers": [{"name": f"c{n}", "image": image}
                                   for n, image in enumerate(images)],
                    "terminationGracePeriodSeconds": 0}}
    cluster.create(f"/api/v1/namespaces/{NS}/pods", pod)
    path = f"/api/v1/namespaces/{NS}/pods/huge"

    def released() -> dict[str, Any] | None:
        current = cluster.get(path)
        gates = current["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else current

    # bounded: two rounds of inspections (10 s timeout each, 16 at a time per registry)
    try:
        placed = dict(wait_for(released, 150, every=0.5))
    except AssertionError:
        peak_rss(product)
        meta = cluster.get(path)["metadata"]
        raise AssertionError(f"pod still gated after 150 s: {meta.get('labels')} "
                             f"{str(meta.get('annotations'))[:300]}") from None
    annotation = placed["metadata"]["annotations"][DECISION_ANNOTATION]
    record = json.loads(annotation)
    assert record["result"] == "fallback", record
    assert len(annotation.encode()) <= MAX_DECISION_BYTES
    # each image is uninspectable: its 4 MB refused unread ("larger than the 1 MiB limit"),
    # or, when the registry is slow to answer for it, a timeout (it decodes the 20,000
    # entries for each GET, about 0.5 s of CPU each, before a header is sent)
    errors = [entry.get("error", "") for entry in record["images"]]
    assert len(errors) == TAGS and all(errors), record["images"]
    refused = sum("larger than the 1 MiB limit" in e for e in errors)
    print(f"\n{refused} of {TAGS} images refused by size, {TAGS - refused} timed out")
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]} in [
        e for t in terms for e in t["matchExpressions"]]

    def warned() -> list[dict[str, Any]]:
        events = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
        return [e for e in events if e.get("regarding", {}).get("name") == "huge"
                and e.get("reason") == "PlacementFallback"]

    event = wait_for(warned, 20, every=0.5)[0]
    assert event["type"] == "Warning"
    assert "image inspection failed" in event["note"], event["note"]

    peaks = peak_rss(product)
    for name, mib in peaks.items():
        assert mib < 0.8 * memory_limit_mib(name), (name, mib)


def _settled(cluster: KubeEnv, name: str, within: float = 60) -> dict[str, Any]:
    """The pod ``name`` of :data:`NS` once our gate is gone."""
    path = f"/api/v1/namespaces/{NS}/pods/{name}"

    def released() -> dict[str, Any] | None:
        current = cluster.get(path)
        gates = current["spec"].get("schedulingGates") or []
        return None if any(g.get("name") == SCHEDULING_GATE for g in gates) else current

    try:
        return dict(wait_for(released, within, every=0.5))
    except AssertionError:
        meta = cluster.get(path)["metadata"]
        raise AssertionError(f"{name} still gated after {within} s: {meta.get('labels')}"
                             ) from None


def _fallback_event(cluster: KubeEnv, name: str) -> dict[str, Any]:
    def warned() -> list[dict[str, Any]]:
        events = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
        return [e for e in events if e.get("regarding", {}).get("name") == name
                and e.get("reason") == "PlacementFallback"]

    event: dict[str, Any] = wait_for(warned, 20, every=0.5)[0]
    assert event["type"] == "Warning"
    return event


def _os_required(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [[e for e in t["matchExpressions"] if e["key"] == "kubernetes.io/os"]
            for t in terms]


@pytest.fixture
def controller_path(cluster: KubeEnv, product: Product) -> Iterator[None]:
    """No inspection at admission (``inspectionBudget: 0s``): the controller places."""
    cluster.ensure_namespace(NS)
    cluster.patch(CONFIG, {"spec": {"admission": {"inspectionBudget": "0s"}}})
    yield
    cluster.patch(CONFIG, {"spec": {"admission": {"inspectionBudget": "300ms"}}})


def test_a_placement_patch_answered_413_releases_the_pod_with_the_fallback(
        cluster: KubeEnv, registry: Registry, make_pusher: Any,
        controller_path: None) -> None:
    """An index of 500 platforms with 60-character architecture names (within the bounds)
    and a pod of 150 required nodeSelectorTerms: the placement ANDs ``arch In [500
    names]`` into each term, a PATCH of 4.7 MB, over the API server's 3 MiB body limit,
    answered 413. The pod is released with the fallback, ``os In [linux]`` in every term,
    and the Warning says why in our words."""
    pusher = make_pusher(registry)
    child = pusher.image("bounds/wide", "child", fmt="oci")
    platforms = [{"os": "linux", "architecture": f"{n:03d}" + "a" * 57} for n in range(500)]
    pusher.index("bounds/wide", "v1", [(child, p) for p in platforms])
    terms = [{"matchExpressions": [{"key": "example.com/rack", "operator": "In",
                                    "values": [f"r{n}"]}]} for n in range(150)]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wide"},
           "spec": {"containers": [{"name": "c", "image": f"{registry.host}/bounds/wide:v1"}],
                    "affinity": {"nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": terms}}},
                    "terminationGracePeriodSeconds": 0}}
    cluster.create(f"/api/v1/namespaces/{NS}/pods", pod)
    placed = _settled(cluster, "wide")
    record = json.loads(placed["metadata"]["annotations"][DECISION_ANNOTATION])
    assert record["result"] == "fallback", record
    assert _os_required(placed) == [[{"key": "kubernetes.io/os", "operator": "In",
                                      "values": ["linux"]}]] * 150
    note = _fallback_event(cluster, "wide")["note"]
    assert "refused the placement patch as too large (HTTP 413)" in note, note


def test_a_pod_whose_annotations_leave_no_room_is_released_with_the_fallback(
        cluster: KubeEnv, registry: Registry, make_pusher: Any,
        controller_path: None) -> None:
    """A pod created with its own annotations 22 bytes under the API server's 256 KiB
    total: no decision annotation can be added (422 Invalid, for the placement, the
    fallback's short one and the plain ungate's); the pod is released with the fallback's
    affinity, without it."""
    make_pusher(registry).multiarch("bounds/small", "v1", ["linux/amd64", "linux/arm64"])
    filler = "x" * (256 * 1024 - 40)  # with its key, 22 bytes short of the limit
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "full", "annotations": {"example.com/filler": filler}},
           "spec": {"containers": [{"name": "c", "image": f"{registry.host}/bounds/small:v1"}],
                    "terminationGracePeriodSeconds": 0}}
    cluster.create(f"/api/v1/namespaces/{NS}/pods", pod)
    placed = _settled(cluster, "full")
    assert _os_required(placed) == [[{"key": "kubernetes.io/os", "operator": "In",
                                      "values": ["linux"]}]]
    assert DECISION_ANNOTATION not in placed["metadata"]["annotations"]
    note = _fallback_event(cluster, "full")["note"]
    assert "refused the placement patch as invalid (HTTP 422)" in note, note

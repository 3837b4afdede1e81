"""At cluster scale: one real control plane filled to a stated size, measured at checkpoints.

One fresh real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager
v1.36.2, :mod:`podplacement.sandbox.controlplane`), a local registry and podplacement
installed from ``deploy/`` with the sample config (:mod:`podplacement.sandbox.product`: the
webhook and two controllers, leader and standby, as deploy/'s ServiceAccounts, the lease
duration of deploy/, 15 s). Then:

- ``--nodes`` fake Ready nodes (default 5,000): 45% amd64, 35% arm64, 7% ppc64le, 7% s390x,
  6% windows/amd64, each with room for 500 pods and the bulk of a kubelet's Node object
  (``--node-images`` images in ``status.images``, nodeInfo, addresses, five conditions, cloud
  labels), created over concurrent connections; a NodeResourceTopology (two zones) for
  ``--nrt-share`` of the Linux nodes (default 0.1; the CRD of
  ``deploy/optional/noderesourcetopology-crd.yaml``);
- ``--tags`` image tags (default 50,000) ``z<k>`` over three manifests (an amd64+arm64
  index, an amd64 and an arm64 image, by ``k % 3``): the three are pushed over HTTP, then
  every tag is written into the registry's filesystem storage as distribution lays tags out
  (``_manifests/tags/<tag>/current/link`` and ``index/sha256/<hex>/link``, what a manifest
  PUT of an existing manifest writes), checked over HTTP on a sample; ``--push http`` PUTs
  every tag's manifest instead (concurrent PUTs: about 2.7 ms of registry CPU each here,
  3-4 minutes for 50,000 tags on these 2 cores, against seconds);
- pods created at the benchmark's full rate (:mod:`bench.loadgen` processes, pre-serialized
  requests) in namespace ``bench``, placed by the product from an empty catalog: the
  ``skewed`` mix of :mod:`bench.cluster` (Zipf s=1.1 over the tags, 10% ``Always``).

At each checkpoint (``--checkpoints``, default 2,000, 10,000 and 20,000 pods: what fits in
20 minutes on 2 cores with 5,000 nodes, with room for other work on the machine: 584 s on a
quiet machine, while 2,000 / 10,000 / 30,000 took 1,308 s on a loaded one; 100,000 pods take
about 50 minutes here, see docs/benchmarks.md) the pods created since the previous one are
all bound, and it prints:

- every process's RSS (now and peak) and CPU milliseconds per pod over the pods created since
  the previous checkpoint and in the stretches below: the leading and the standby
  controller, the webhook, kube-apiserver, etcd (and the scheduler,
  kube-controller-manager, the registry, the benchmark itself with its load generators);
- the **placement rate as a ratio to bare at the same size**: ``--stretch-rounds`` pairs of
  stretches of ``--stretch`` pods each, created from idle at full rate: a product stretch in
  ``bench``, a bare stretch in ``bench-bare``, a namespace with the product's opt-out label
  ``podplacement.io/exclude-pod-placement`` (neither the admission policy nor the webhook is
  called for its pods). Both run on the same control plane at the same size in the same
  minute, in alternating order; rate = pods / (last bound - first create sent). This stands
  in for a bare arm filled to the same size (a second fill of 100,000 pods: twice the run
  time); what the bare stretch still pays for the product is its processes' idle work and
  the escape monitor's watch, which receives the bare pods (bound, no placement label) and
  drops them by their namespace's label: the controller's CPU during the bare stretches is
  printed. Next to the measured ratio, the *CPU model* of :mod:`bench.cluster`: bare's CPU
  per pod over the product's, every process of the machine counted (with the 2 cores
  saturated, the rate ratio it predicts), steadier than rates on a shared machine, and the
  same without the controllers' and the webhook's CPU in the bare stretches (a cluster
  without the product at all);
- the share of pods per admission path (the decision annotation's ``path``: ``admission``
  the policy, ``webhook``, absent: the controller) over the pods since the previous
  checkpoint and over the last product stretches, separately for ``Always`` pods, and the
  **catalog's hit ratio** (pods placed by the policy over the pods not pulled with Always),
  next to what an unbounded catalog updated at once would reach (the pod's tag was named by
  an earlier pod) and the catalog's ceiling: the product's ``ParamsStore`` with its bounds fed
  at once with the same references (:func:`bench.catalogsim.ceiling`);
- the **params object**: its bytes and entries, and its writes per second and KB/s since
  the previous checkpoint (a watch of it in this process);
- **start to serving**: a fresh controller process started at that size, seconds until its
  ``/readyz`` answers 200 (pods, nodes and config informers synced) and its RSS then;
  **leader handover**: with ``spec.admission.inspectionBudget: 0s`` (the webhook leaves new
  images to the controller: a probe pod of a tag never seen is checked to be placed by the
  controller first), the leader is SIGKILLed, a probe pod of a new tag is created at once,
  and the seconds until the standby holds the Lease and until it placed the probe pod are
  printed, then the budget goes back to 300ms; the fresh controller is the next standby.
  Then the seconds from the Lease taken until the new leader's CPU is idle again (its relist
  of every placed pod) and the CPU that took. Then a rolling update's handover: one more
  controller started and ready, the leader SIGTERMed (it releases the Lease as it stops),
  a probe pod created at once, and the seconds until another controller holds the Lease and
  until the probe was placed.

Every bound pod of ``bench`` is checked as it binds: bound to a node whose (os, arch) its
image lacks (*wrong*) or without a ``kubernetes.io/arch`` requirement (*escaped*); both
must be 0. At the end (unless ``--no-probe``) a separate process measures what the
controller's informers hold at that size (:func:`probe_memory`, tracemalloc): the Node
cache with full objects and through the controller's transform
(:func:`rules.nodeview.node_view`), the NRT cache, the gated pods, and the
transient peak of the placed-pods watch's (re)list of every placed pod, page by page as the
informer reads it and with every page held.

The machine is shared: the figures are this machine's, 2 cores with other work on them.

Usage: ``python bench/scale.py [--nodes 5000] [--nrt-share 0.1] [--tags 50000]
[--checkpoints 2000,10000,20000] [--stretch 1000] [--stretch-rounds 2] [--save FILE]``;
the issue's size: ``--checkpoints 10000,50000,100000 --stretch 2000``; a setting against the
sample config: ``--config-patch '{"spec": {...}}'`` (a JSON merge patch); a smoke run:
``python bench/scale.py --nodes 300 --tags 2000 --checkpoints 1000,3000 --stretch 300
--stretch-rounds 1``.
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect``: put the project root
# first on sys.path instead of this script's directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.catalogsim import ceiling  # noqa: E402
from bench.cluster import (  # noqa: E402
    CONFIG_PATH,
    PARAMS_PATH,
    REPOS,
    SKEW_ALWAYS,
    SKEW_S,
    Images,
    Run,
    Watch,
    Workload,
    _create_with_loadgens,
    _self_cpu,
    dry_run_pod,
    proc_stats,
    push_images,
    webhook_paths,
    workload,
)
from podplacement.controller.leader import LEASE_PATH  # noqa: E402
from podplacement.demo.workloads import DemoNode, DemoZone, nrt_object  # noqa: E402
from podplacement.rules.admit.imageparams import flat_catalog  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    AFFINITY_LABEL,
    ARCH_LABEL,
    DECISION_ANNOTATION,
    EXCLUDE_NAMESPACE_LABEL,
    GATE_LABEL,
    GATE_LABEL_GATED,
    LEASE_NAME,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    SCHEDULING_GATE,
)
from podplacement.sandbox.controlplane import (  # noqa: E402
    ControlPlane,
    FakeNode,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.ports import free_port  # noqa: E402
from podplacement.sandbox.product import NAMESPACE as PRODUCT_NAMESPACE  # noqa: E402
from podplacement.sandbox.product import (  # noqa: E402
    Process,
    Product,
    install_manifests,
    kubectl,
    start_process,
    start_product,
    wait_webhook_registered,
)
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402

REPO = Path(_ROOT)
NAMESPACE = "bench"
BARE_NAMESPACE = "bench-bare"
NODES_PATH = "/api/v1/nodes"
NRTS_PATH = f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}"
LEASE = LEASE_PATH.format(namespace=PRODUCT_NAMESPACE, name=LEASE_NAME)
#: (os, arch, share of the nodes), in node-name order.
NODE_MIX = (("linux", "amd64", 0.45), ("linux", "arm64", 0.35), ("linux", "ppc64le", 0.07),
            ("linux", "s390x", 0.07), ("windows", "amd64", 0.06))
#: The inspection budget of the sample config, restored after each handover.
SAMPLE_BUDGET = "300ms"
#: Tags ``h<j>`` of the amd64 image for the handover's probe pods (never named by the mix).
PROBE_TAGS = 200
#: Processes in the order of the tables.
PROCESS_ORDER = ("controller (leader)", "controller (standby)", "webhook", "kube-apiserver",
                 "etcd", "kube-scheduler", "kube-controller-manager", "registry")


# --- the registry's tags -------------------------------------------------------------------
def tag_ref(registry: Registry, k: int) -> str:
    """The reference of tag ``z<k>`` (repository ``k % 3`` of :data:`bench.cluster.REPOS`)."""
    return f"{registry.host}/{list(REPOS)[k % 3]}:z{k}"


def push_tags(registry: Registry, tags: int, mode: str) -> Images:
    """Push the three manifests (tag ``v1``, :func:`bench.cluster.push_images`), then tags
    ``z0..z<tags-1>`` naming them (``k % 3``) and :data:`PROBE_TAGS` tags ``h<j>`` of the
    amd64 image: ``mode`` ``storage`` writes each tag's two link files into the registry's
    filesystem storage (module docstring), ``http`` PUTs each tag's manifest over 16
    concurrent connections. A sample of tags is then checked with a manifest HEAD (its
    ``Docker-Content-Digest``).

    Returns: the :class:`bench.cluster.Images` with ``skewed`` the ``z`` references.

    Raises:
        RuntimeError: a checked tag does not name its manifest.
    """
    base = push_images(registry, 0, False, False, 0)
    digests: dict[str, str] = {}
    with Pusher(registry) as p:
        for repo in REPOS:
            r = p.get_manifest(repo, "v1")
            digests[repo] = r.headers["Docker-Content-Digest"]
    work = [(list(REPOS)[k % 3], f"z{k}") for k in range(tags)]
    work += [("bench/amd", f"h{j}") for j in range(PROBE_TAGS)]
    began = time.monotonic()
    if mode == "storage":
        repos = registry.root / "storage" / "docker" / "registry" / "v2" / "repositories"
        for repo, tag in work:
            digest = digests[repo]
            top = repos / repo / "_manifests" / "tags" / tag
            index = top / "index" / "sha256" / digest.split(":", 1)[1]
            index.mkdir(parents=True, exist_ok=True)
            (index / "link").write_text(digest)
            (top / "current").mkdir(exist_ok=True)
            (top / "current" / "link").write_text(digest)
    else:
        asyncio.run(_put_tags(registry, work))
    took = time.monotonic() - began
    rng = random.Random(3)
    sample = [work[0], work[-1], *rng.sample(work, min(64, len(work)))]
    with httpx.Client(base_url=registry.url, timeout=30) as c:
        for repo, tag in sample:
            r = c.head(f"/v2/{repo}/manifests/{tag}", headers={"Accept": ", ".join([
                "application/vnd.oci.image.index.v1+json",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json",
                "application/vnd.docker.distribution.manifest.v2+json"])})
            if r.status_code != 200 or r.headers.get("Docker-Content-Digest") != digests[repo]:
                raise RuntimeError(f"tag {repo}:{tag}: {r.status_code} "
                                   f"{r.headers.get('Docker-Content-Digest')}")
    print(f"tags: {len(work)} written ({mode}) in {took:.1f} s; {len(sample)} checked over HTTP",
          file=sys.stderr)
    return Images(base.base, [], [], [tag_ref(registry, k) for k in range(tags)])


async def _put_tags(registry: Registry, work: list[tuple[str, str]],
                    connections: int = 16) -> None:
    """PUT each ``(repository, tag)``'s ``v1`` manifest as that tag, concurrently."""
    async with httpx.AsyncClient(base_url=registry.url, timeout=60,
                                 limits=httpx.Limits(max_connections=connections)) as c:
        bodies: dict[str, tuple[bytes, str]] = {}
        for repo in REPOS:
            r = await c.get(f"/v2/{repo}/manifests/v1", headers={"Accept": ", ".join([
                "application/vnd.oci.image.index.v1+json",
                "application/vnd.oci.image.manifest.v1+json"])})
            r.raise_for_status()
            bodies[repo] = (r.content, r.headers["Content-Type"])
        queue = list(reversed(work))

        async def one() -> None:
            while queue:
                repo, tag = queue.pop()
                body, media = bodies[repo]
                r = await c.put(f"/v2/{repo}/manifests/{tag}", content=body,
                                headers={"Content-Type": media})
                if r.status_code != 201:
                    raise RuntimeError(f"PUT {repo}:{tag}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(one() for _ in range(connections)))


# --- nodes and NodeResourceTopologies ------------------------------------------------------
def fake_nodes(count: int) -> list[FakeNode]:
    """``count`` nodes in the proportions of :data:`NODE_MIX` (the remainder to the first),
    named ``n-<os>-<arch>-<i>``, with room for 500 pods and a cloud's labels."""
    sizes = [int(count * share) for _, _, share in NODE_MIX]
    sizes[0] += count - sum(sizes)
    nodes = []
    for (os_name, arch, _), size in zip(NODE_MIX, sizes, strict=True):
        for i in range(size):
            zone = "abc"[i % 3]
            nodes.append(FakeNode(
                f"n-{os_name}-{arch}-{i:05d}", arch, os=os_name, pods="500", labels={
                    "beta.kubernetes.io/arch": arch, "beta.kubernetes.io/os": os_name,
                    "node.kubernetes.io/instance-type": "m6.4xlarge",
                    "topology.kubernetes.io/region": "region-1",
                    "topology.kubernetes.io/zone": f"region-1{zone}",
                    "node-pool": f"pool-{os_name}-{arch}"}))
    return nodes


def node_bulk(node: FakeNode, images: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a kubelet adds to ``node``'s object besides :meth:`FakeNode.status`: the spec
    and annotations to create it with, and the status merge patch (five conditions,
    addresses, nodeInfo, daemonEndpoints, ``images`` entries in ``status.images``)."""
    manifest = node.manifest()
    manifest["metadata"]["annotations"] = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{node.name}"})}
    manifest["spec"] = {"podCIDR": "10.64.0.0/24", "podCIDRs": ["10.64.0.0/24"],
                        "providerID": f"aws:///region-1a/i-{node.name}"}
    status = node.status()
    now = status["status"]["conditions"][0]["lastHeartbeatTime"]
    pressure = [{"type": t, "status": "False", "reason": f"KubeletHas{r}",
                 "message": f"kubelet has {m}", "lastHeartbeatTime": now,
                 "lastTransitionTime": now}
                for t, r, m in (("MemoryPressure", "SufficientMemory", "sufficient memory"),
                                ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                                ("PIDPressure", "SufficientPID", "sufficient PID"),
                                ("NetworkUnavailable", "RouteCreated", "routes created"))]
    status["status"]["conditions"] = pressure + status["status"]["conditions"]
    status["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "Hostname", "address": node.name}]
    status["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": 10250}}
    status["status"]["nodeInfo"] = {
        "machineID": "0" * 32, "systemUUID": f"ec2{node.name}", "bootID": "1" * 36,
        "kernelVersion": "6.1.0-28-cloud", "osImage": "Debian GNU/Linux 12 (bookworm)",
        "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.36.2",
        "kubeProxyVersion": "v1.36.2", "operatingSystem": node.os, "architecture": node.arch}
    status["status"]["images"] = [
        {"names": [f"registry.example.internal/team{j % 7}/app{j}@sha256:{j:064x}",
                   f"registry.example.internal/team{j % 7}/app{j}:v1.{j}"],
         "sizeBytes": 10_000_000 + j * 1_000_003} for j in range(images)]
    return manifest, status


def _api_client(plane: ControlPlane, connections: int) -> httpx.AsyncClient:
    """An async client of ``plane``'s API server (its CA, the admin token, 60 s timeouts,
    at most ``connections`` connections)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    return httpx.AsyncClient(base_url=plane.url, verify=ctx, timeout=60,
                             headers={"Authorization": f"Bearer {plane.token}"},
                             limits=httpx.Limits(max_connections=connections))


async def create_nodes(plane: ControlPlane, nodes: Sequence[FakeNode], images: int,
                       connections: int = 16) -> None:
    """Create ``nodes`` as :func:`podplacement.sandbox.controlplane.add_nodes` does (create,
    status Ready with :func:`node_bulk`'s bulk, the not-ready taint removed), over
    ``connections`` concurrent connections.

    Raises:
        httpx.HTTPStatusError: a write was refused.
    """
    merge = {"Content-Type": "application/merge-patch+json"}
    async with _api_client(plane, connections) as c:
        queue = list(reversed(nodes))

        async def one() -> None:
            while queue:
                node = queue.pop()
                manifest, status = node_bulk(node, images)
                r = await c.post(NODES_PATH, json=manifest)
                if r.status_code != 409:
                    r.raise_for_status()
                path = f"{NODES_PATH}/{node.name}"
                (await c.patch(f"{path}/status", json=status, headers=merge)).raise_for_status()
                (await c.patch(path, json={"spec": {"taints": None}}, headers=merge)
                 ).raise_for_status()

        await asyncio.gather(*(one() for _ in range(connections)))


async def create_objects(plane: ControlPlane, path: str, objects: Sequence[dict[str, Any]],
                         connections: int = 16) -> None:
    """POST every object of ``objects`` to ``path`` over ``connections`` connections.

    Raises:
        httpx.HTTPStatusError: a create was refused.
    """
    async with _api_client(plane, connections) as c:
        queue = list(reversed(objects))

        async def one() -> None:
            while queue:
                (await c.post(path, json=queue.pop())).raise_for_status()

        await asyncio.gather(*(one() for _ in range(connections)))


def nrt_nodes(nodes: Sequence[FakeNode], share: float) -> list[FakeNode]:
    """``share`` of the Linux nodes, spread evenly over them: those with an NRT."""
    linux = [n for n in nodes if n.os == "linux"]
    count = round(len(nodes) * share)
    if count <= 0 or not linux:
        return []
    step = len(linux) / min(count, len(linux))
    return [linux[int(i * step)] for i in range(min(count, len(linux)))]


def nrt_for(node: FakeNode) -> dict[str, Any]:
    """The NodeResourceTopology of ``node``: two zones of 8 free CPUs and 28Gi
    (:func:`podplacement.demo.workloads.nrt_object`)."""
    return nrt_object(DemoNode(node.name, node.arch, (DemoZone(8, "28Gi"), DemoZone(8, "28Gi"))))


# --- processes -------------------------------------------------------------------------------
def reset_peak_rss() -> None:
    """Reset this process's peak RSS (VmHWM) to its present RSS (Linux ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_kib(pid: int) -> int:
    """The resident set size (VmRSS, KiB) of a live process; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


@dataclass(frozen=True)
class Sample:
    """One process at one moment: CPU seconds (user+system), RSS and peak RSS in KiB."""

    cpu: float
    rss: int
    hwm: int


@dataclass
class Controllers:
    """The controller processes started by :func:`start_controller`, by identity."""

    product: Product
    by_identity: dict[str, Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    lease_duration: int = 15

    def leader(self, plane: ControlPlane) -> str | None:
        """The Lease's holder identity (None: no Lease or no holder)."""
        with plane.client() as c:
            r = c.get(LEASE)
        if r.status_code != 200:
            return None
        holder = (r.json().get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    def alive(self) -> dict[str, Process]:
        """The controllers still running, by identity."""
        return {i: p for i, p in self.by_identity.items() if p.alive()}


def start_controller(ctl: Controllers, identity: str) -> Process:
    """Start one more ``podplacement controller`` (the product's arguments, this identity,
    metrics and ``/readyz`` on a free port of 127.0.0.1); stopped with the product."""
    port = free_port()
    product = ctl.product
    proc = start_process(identity, [*product.controller_args, "--identity", identity,
                                    "--lease-duration", str(ctl.lease_duration),
                                    "--metrics-port", str(port),
                                    "--metrics-address", "127.0.0.1"],
                         product.workdir, product.env, product.cwd)
    product.controllers.append(proc)
    ctl.by_identity[identity] = proc
    ctl.ports[identity] = port
    return proc


def wait_ready(ctl: Controllers, identity: str, limit: float = 600.0) -> float:
    """Seconds from now until the controller ``identity`` answers ``/readyz`` 200.

    Raises:
        RuntimeError: it exited or was not ready within ``limit`` seconds.
    """
    began = time.monotonic()
    url = f"http://127.0.0.1:{ctl.ports[identity]}/readyz"
    proc = ctl.by_identity[identity]
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - began
        if not proc.alive() or time.monotonic() - began > limit:
            raise RuntimeError(f"controller {identity} not ready:\n{proc.log()[-2000:]}")
        time.sleep(0.05)


def processes(plane: ControlPlane, product: Product, ctl: Controllers, registry: Registry
              ) -> dict[str, int]:
    """Name → pid of every process measured (the controllers named by their role now)."""
    leader = ctl.leader(plane)
    procs = {name: p.pid for name, p in plane.processes.items()}
    procs["webhook"] = product.webhook.popen.pid
    for identity, proc in ctl.alive().items():
        role = "leader" if identity == leader else "standby"
        procs[f"controller ({role})"] = proc.popen.pid
    if registry._process is not None:
        procs["registry"] = registry._process.pid
    return procs


def sample(procs: Mapping[str, int]) -> dict[str, Sample]:
    """A :class:`Sample` of every process of ``procs``."""
    out = {}
    for name, pid in procs.items():
        cpu, hwm = proc_stats(pid)
        out[name] = Sample(cpu, rss_kib(pid), hwm)
    return out


# --- the params object's writes ------------------------------------------------------------
class ParamsLog(threading.Thread):
    """A watch of the params object (ImagePlatformCatalog ``cluster``) in a thread: per
    event, (monotonic time, bytes of the event line, catalog entries: :func:`catalog_entries`)."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(name="params watch", daemon=True)
        self.plane = plane
        self.writes: list[tuple[float, int, int]] = []
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Ask the thread to end (at its stream's next line or end)."""
        self._stop_event.set()

    def run(self) -> None:
        query = {"fieldSelector": "metadata.name=cluster"}
        rv = ""
        with self.plane.client(timeout=400) as c:
            while not self._stop_event.is_set():
                try:
                    if not rv:
                        rv = c.get(PARAMS_PATH, params=query).json()["metadata"][
                            "resourceVersion"]
                    with c.stream("GET", PARAMS_PATH, params={
                            **query, "watch": "1", "resourceVersion": rv,
                            "allowWatchBookmarks": "true", "timeoutSeconds": "300"}) as r:
                        for line in r.iter_lines():
                            if self._stop_event.is_set():
                                return
                            event = orjson.loads(line)
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                rv = ""
                                break
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                entries = catalog_entries(obj.get("spec") or {})
                                self.writes.append((time.monotonic(), len(line), entries))
                except (httpx.HTTPError, orjson.JSONDecodeError, KeyError):
                    if self._stop_event.wait(0.5):
                        return

    def between(self, t0: float, t1: float) -> tuple[int, int]:
        """(writes, bytes written) with a time in [t0, t1]."""
        inside = [w for w in self.writes if t0 <= w[0] <= t1]
        return len(inside), sum(w[1] for w in inside)


def params_now(plane: ControlPlane) -> tuple[int, int]:
    """(bytes of the params object's JSON as served, its catalog entries:
    :func:`catalog_entries`); (0, 0) when it does not exist."""
    with plane.client() as c:
        r = c.get(f"{PARAMS_PATH}/cluster")
    if r.status_code != 200:
        return 0, 0
    return len(r.content), catalog_entries(r.json().get("spec") or {})


def catalog_entries(spec: dict[str, Any]) -> int:
    """The image references a params object's ``spec`` holds, in either layout
    (:func:`podplacement.rules.admit.imageparams.flat_catalog`)."""
    return len(flat_catalog(spec)[0])


# --- creating pods and following them -------------------------------------------------------
class PodTracker(Watch):
    """:class:`bench.cluster.Watch` over the pods ``p-<i>`` of one namespace with ``i`` in
    ``indexes``: when each is first seen bound, its decision path, and (with ``work`` and
    ``nodes``) the arch check: *wrong* (its node's os is not linux or its arch not one its
    image runs on), *escaped* (bound without a ``kubernetes.io/arch`` requirement)."""

    def __init__(self, client: httpx.AsyncClient, namespace: str, rv: str, indexes: range,
                 limit: float, work: Workload | None,
                 nodes: Mapping[str, tuple[str, str]]) -> None:
        super().__init__(client, f"/api/v1/namespaces/{namespace}/pods", rv, len(indexes),
                         limit)
        self.indexes = indexes
        self.work = work
        self.nodes = nodes
        self.paths: dict[int, str] = {}
        self.wrong = 0
        self.escaped = 0
        self.errors = 0

    def _event(self, line: str) -> bool:
        event = orjson.loads(line)
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if event.get("type") == "ERROR":
            self.errors += 1
            print(f"  ! pod watch: {obj.get('message')}", file=sys.stderr)
            return False
        self._rv = meta.get("resourceVersion") or self._rv
        name = str(meta.get("name") or "")
        if not name.startswith("p-") or not name[2:].isdigit():
            return False
        i = int(name[2:])
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        if i not in self.indexes or not node or i in self.bound:
            return False
        self.bound[i] = time.monotonic()
        raw = (meta.get("annotations") or {}).get(DECISION_ANNOTATION)
        self.paths[i] = "none" if raw is None else str(orjson.loads(raw).get("path",
                                                                            "controller"))
        if self.work is not None:
            os_name, arch = self.nodes.get(node, ("", ""))
            if os_name != "linux" or arch not in Images.archs(self.work.images[i]):
                self.wrong += 1
            terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                "nodeSelectorTerms") or [])
            if ARCH_LABEL not in {e.get("key") for t in terms
                                  for e in t.get("matchExpressions") or []}:
                self.escaped += 1
        if len(self.bound) >= self._n:
            self.done.set()
            return True
        return False


@dataclass
class Phase:
    """Pods created together (a fill or a stretch) and what became of them."""

    namespace: str
    indexes: range
    sent: dict[int, float] = field(default_factory=dict)
    bound: dict[int, float] = field(default_factory=dict)
    paths: dict[int, str] = field(default_factory=dict)
    run: Run = field(default_factory=lambda: Run("scale", 0))
    wrong: int = 0
    escaped: int = 0
    started: float = 0.0
    ended: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Pods bound per second: bound pods over (last bound - first create sent)."""
        if not self.bound or not self.sent:
            return float("nan")
        return len(self.bound) / (max(self.bound.values()) - min(self.sent.values()))


def write_specs(plane: ControlPlane, namespace: str, bodies: list[list[Any]], procs: int,
                clients: int, directory: Path, name: str) -> list[Path]:
    """The :mod:`bench.loadgen` spec files for ``bodies`` (``[index, JSON]``): item i to
    process i % procs, ``clients`` connections in all."""
    url = urlsplit(plane.url)
    paths = []
    for k in range(procs):
        spec = {"host": url.hostname, "port": url.port, "ca_file": str(plane.ca_file),
                "token": plane.token, "path": f"/api/v1/namespaces/{namespace}/pods",
                "connections": max(1, clients // procs + (1 if k < clients % procs else 0)),
                "bodies": bodies[k::procs]}
        path = directory / f"{name}-{k}.json"
        path.write_bytes(orjson.dumps(spec))
        paths.append(path)
    return paths


async def create_phase(plane: ControlPlane, phase: Phase, body: Callable[[int], str],
                       args: argparse.Namespace, directory: Path, work: Workload | None,
                       nodes: Mapping[str, tuple[str, str]]) -> None:
    """Create the pods of ``phase`` at full rate (load-generator processes) and wait until
    all are bound (at most ``args.limit`` s after the last create); fills ``phase``."""
    specs = write_specs(plane, phase.namespace, [[i, body(i)] for i in phase.indexes],
                        args.procs, args.clients, directory, f"{phase.namespace}-"
                        f"{phase.indexes.start}")
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}", "Accept": "application/json"}
    async with httpx.AsyncClient(base_url=plane.url, verify=ctx, headers=headers,
                                 timeout=60) as c:
        base = f"/api/v1/namespaces/{phase.namespace}/pods"
        rv = (await c.get(base, params={"limit": "1"})).json()["metadata"]["resourceVersion"]
        tracker = PodTracker(c, phase.namespace, rv, phase.indexes, args.limit + 3600, work,
                             nodes)
        watcher = asyncio.create_task(tracker.run())
        await asyncio.sleep(0.2)
        started = asyncio.Event()
        creating = asyncio.create_task(_create_with_loadgens(specs, phase.run, phase.sent,
                                                             started))
        await started.wait()
        phase.started = time.monotonic()
        await creating
        created = sum(1 for _ in phase.sent)
        if phase.run.failed_creates:
            print(f"  ! {phase.run.failed_creates} creates failed", file=sys.stderr)
        tracker._n = created - phase.run.failed_creates
        if len(tracker.bound) >= tracker._n:
            tracker.done.set()
        try:
            await asyncio.wait_for(tracker.done.wait(), args.limit)
        except TimeoutError:
            print(f"  ! {len(tracker.bound)} of {tracker._n} bound within {args.limit:.0f} s",
                  file=sys.stderr)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    phase.ended = time.monotonic()
    phase.bound, phase.paths = tracker.bound, tracker.paths
    phase.wrong, phase.escaped = tracker.wrong, tracker.escaped
    for path in specs:
        path.unlink(missing_ok=True)


def run_measured(plane: ControlPlane, phase: Phase, procs: Mapping[str, int],
                 body: Callable[[int], str], args: argparse.Namespace, directory: Path,
                 work: Workload | None, nodes: Mapping[str, tuple[str, str]]
                 ) -> dict[str, Sample]:
    """:func:`create_phase`, then 2 s for the writes that trail the last binding (Events,
    the params object); ``phase.cpu`` gets every process's CPU milliseconds per pod of the
    phase (``benchmark``: this process and its load generators). Returns the processes'
    samples at the end."""
    before, self0 = sample(procs), _self_cpu()
    asyncio.run(create_phase(plane, phase, body, args, directory, work, nodes))
    time.sleep(2.0)
    after, self1 = sample(procs), _self_cpu()
    count = max(1, len(phase.indexes))
    phase.cpu = {name: (after[name].cpu - before[name].cpu) * 1000 / count for name in procs}
    phase.cpu["benchmark"] = (self1 - self0 + phase.run.bench_cpu) * 1000 / count
    return after


# --- hit ratios an ideal catalog would reach --------------------------------------------------
def ideal_hits(work: Workload, total: int) -> tuple[list[bool], list[bool]]:
    """For each product pod ``i < total``: whether its tag was named by an earlier pod (an
    unbounded catalog updated at once), and whether the product's catalog with its bounds,
    fed at once, holds it (:func:`bench.catalogsim.ceiling`, the same references: the
    catalog's ceiling)."""
    seen: set[str] = set()
    unbounded = []
    for i in range(total):
        image = work.images[i]
        unbounded.append(image in seen)
        seen.add(image)
    return unbounded, ceiling(work.images[:total])


@dataclass
class PathShares:
    """Pods by decision path, pulled with Always or not, and the catalog's hit ratios."""

    pods: int
    paths: Counter[str]
    always_paths: Counter[str]
    hit: float
    ideal: float
    lru: float

    @staticmethod
    def of(phases: Sequence[Phase], work: Workload, unbounded: Sequence[bool],
           bounded: Sequence[bool]) -> PathShares:
        """The shares over the product pods of ``phases``."""
        paths: Counter[str] = Counter()
        always: Counter[str] = Counter()
        others = hits = ideal = lru = 0
        for phase in phases:
            for i, path in phase.paths.items():
                if i in work.always_pods:
                    always[path] += 1
                    continue
                paths[path] += 1
                others += 1
                hits += path == "admission"
                ideal += unbounded[i]
                lru += bounded[i]
        n = max(1, others)
        return PathShares(others + sum(always.values()), paths, always, hits / n, ideal / n,
                          lru / n)

    def text(self) -> str:
        """One line: shares per path (not Always / Always) and the hit ratios."""
        def shares(c: Counter[str]) -> str:
            total = max(1, sum(c.values()))
            return ", ".join(f"{p} {v / total:.1%}" for p, v in c.most_common())

        all_paths = self.paths + self.always_paths
        return (f"{self.pods} pods: {shares(all_paths)} | not Always: {shares(self.paths)} | "
                f"Always: {shares(self.always_paths)} | catalog hit {self.hit:.1%} "
                f"(unbounded, at once: {self.ideal:.1%}; the catalog's ceiling, "
                f"bench/catalogsim.py: {self.lru:.1%})")


# --- the handover -----------------------------------------------------------------------------
def set_budget(plane: ControlPlane, budget: str) -> None:
    """Set ``spec.admission.inspectionBudget`` of the config (merge patch)."""
    with plane.client() as c:
        c.patch(CONFIG_PATH, json={"spec": {"admission": {"inspectionBudget": budget}}},
                headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()


def probe_pod(plane: ControlPlane, registry: Registry, j: int) -> str:
    """Create pod ``handover-<j>`` in ``bench`` of tag ``h<j>`` (never seen); its name."""
    name = f"handover-{j}"
    body = dry_run_pod(f"{registry.host}/bench/amd:h{j}")
    body["metadata"] = {"name": name, "labels": {"app": "handover"}}
    body["spec"]["terminationGracePeriodSeconds"] = 0
    with plane.client(timeout=60) as c:
        c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body).raise_for_status()
    return name


def wait_placed(plane: ControlPlane, name: str, limit: float = 120.0) -> tuple[float, str]:
    """Poll pod ``name`` in ``bench`` every 50 ms until its gate is gone; returns (the
    monotonic time it was seen ungated, its decision path: ``admission``, ``webhook``,
    ``controller``, or ``none``).

    Raises:
        RuntimeError: still gated after ``limit`` seconds.
    """
    deadline = time.monotonic() + limit
    with plane.client() as c:
        while True:
            pod = c.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").json()
            gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates")
                     or []]
            if SCHEDULING_GATE not in gates:
                raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                    DECISION_ANNOTATION)
                path = "none" if raw is None else str(orjson.loads(raw).get("path",
                                                                            "controller"))
                return time.monotonic(), path
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {name} still gated after {limit:.0f} s")
            time.sleep(0.05)


@dataclass
class Handover:
    """Figures of one start and handover at a checkpoint (seconds; RSS in KiB)."""

    ready: float = float("nan")
    ready_rss: int = 0
    before: float = float("nan")
    lease: float = float("nan")
    placed: float = float("nan")
    #: seconds from the Lease taken until the new leader's CPU is idle, and that CPU
    settle: float = float("nan")
    settle_cpu: float = float("nan")
    probes: int = 0
    #: a rolling update's handover: a fresh standby ready, the leader SIGTERMed (it gives
    #: the Lease up on its way out), seconds until the Lease is taken and a probe placed
    graceful_lease: float = float("nan")
    graceful_placed: float = float("nan")


def handover(plane: ControlPlane, registry: Registry, ctl: Controllers, n: int,
             probes: list[int]) -> Handover:
    """Start controller ``scale-<n>`` and time it to ready; then, with the inspection budget
    at 0s, SIGKILL the leader and time the standby's takeover until it placed a gated probe
    pod (module docstring); then until the new leader's CPU is idle."""
    out = Handover()
    identity = f"scale-{n}"
    start_controller(ctl, identity)
    out.ready = wait_ready(ctl, identity)
    out.ready_rss = rss_kib(ctl.by_identity[identity].popen.pid)
    set_budget(plane, "0s")
    try:
        for _ in range(20):  # until the webhook has the budget: the controller places it
            probes[0] += 1
            out.probes += 1
            name = probe_pod(plane, registry, probes[0])
            t_sent = time.monotonic()
            t_done, path = wait_placed(plane, name)
            if path == "controller":
                out.before = t_done - t_sent
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the webhook kept placing the probe pods with a budget of 0s")
        old = ctl.leader(plane)
        if old is None or old not in ctl.alive():
            raise RuntimeError(f"no live leader to kill (Lease holder {old})")
        proc = ctl.by_identity[old]
        killed = time.monotonic()
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(10)
        probes[0] += 1
        name = probe_pod(plane, registry, probes[0])
        holder = wait_new_holder(plane, ctl, old, killed)
        out.lease = time.monotonic() - killed
        t_done, path = wait_placed(plane, name)
        out.placed = t_done - killed
        if path != "controller":
            print(f"  ! the handover probe was placed by {path}", file=sys.stderr)
        proc.stop()
        leader = ctl.by_identity[str(holder)]
        cpu0 = proc_stats(leader.popen.pid)[0]
        last, idle_since = cpu0, time.monotonic()
        while time.monotonic() - killed < 300:
            time.sleep(1.0)
            now = proc_stats(leader.popen.pid)[0]
            if now - last < 0.05:
                break
            last, idle_since = now, time.monotonic()
        out.settle = idle_since - killed - out.lease
        out.settle_cpu = last - cpu0
        out.graceful_lease, out.graceful_placed = graceful_handover(
            plane, registry, ctl, f"{identity}-b", str(holder), probes)
        out.probes += 1
    finally:
        set_budget(plane, SAMPLE_BUDGET)
    return out


def wait_new_holder(plane: ControlPlane, ctl: Controllers, old: str, since: float) -> str:
    """Poll the Lease every 50 ms until a controller other than ``old`` holds it; its
    identity.

    Raises:
        RuntimeError: none did within 120 s of ``since`` (a monotonic time).
    """
    while True:
        holder = ctl.leader(plane)
        if holder is not None and holder != old:
            return holder
        if time.monotonic() - since > 120:
            raise RuntimeError(f"no controller took the Lease from {old} within 120 s")
        time.sleep(0.05)


def graceful_handover(plane: ControlPlane, registry: Registry, ctl: Controllers,
                      standby: str, leader: str, probes: list[int]) -> tuple[float, float]:
    """A rolling update's handover: start controller ``standby`` and wait until it is ready,
    SIGTERM ``leader`` (it releases the Lease as it stops, client-go's ``ReleaseOnCancel``),
    create a gated probe pod at once; seconds from the signal until another controller holds
    the Lease, and until the probe was placed."""
    start_controller(ctl, standby)
    wait_ready(ctl, standby)
    proc = ctl.by_identity[leader]
    signalled = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    probes[0] += 1
    name = probe_pod(plane, registry, probes[0])
    wait_new_holder(plane, ctl, leader, signalled)
    lease = time.monotonic() - signalled
    t_done, path = wait_placed(plane, name)
    if path != "controller":
        print(f"  ! the graceful handover's probe was placed by {path}", file=sys.stderr)
    proc.popen.wait(60)
    proc.stop()
    return lease, t_done - signalled


# --- the informers' memory, in a separate process ----------------------------------------------
async def probe_memory(kubeconfig: str) -> dict[str, Any]:
    """What the controller's informers hold at the cluster's present size, measured with
    tracemalloc in this (fresh) process with the product's own :class:`kubeclient.Informer`
    and :meth:`kubeclient.KubeAPI.list_all`:

    - ``nodes``: the Node informer's cache with full objects (``heap_bytes``) and through
      the controller's transform (``kept_heap_bytes``: :func:`rules.nodeview.
      node_view`, name, resourceVersion, labels and ``status.allocatable``);
    - ``nrts``: the NodeResourceTopology informer's cache;
    - ``gated``: the gated-pods informer's cache (``scheduling-gate=gated``);
    - ``placed_relist``: the cache-less informer's relist of every placed pod (the
      placed-pods watch's, a handler keeping nothing: each page handed on as it arrives),
      its RSS peak above the level before it and the seconds;
    - ``placed_list``: the same list with every page held (:meth:`KubeAPI.list_all`, what
      that relist did before it went page by page), its RSS peak and the seconds.

    Returns: ``{name: {"objects", "json_bytes", "heap_bytes", ...}}`` (bytes, seconds).
    """
    import gc
    import tracemalloc

    from podplacement.kubeclient import Informer, KubeAPI
    from podplacement.rules.nodeview import node_view

    api = await KubeAPI.from_kubeconfig(kubeconfig)
    out: dict[str, Any] = {}

    def heap() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    async def informer(path: str, params: Mapping[str, str] | None = None,
                       transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                       ) -> Informer:
        inf = Informer(api, path, params, tolerate_absent=True, transform=transform)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 600)
        await inf.stop()
        return inf

    def json_bytes(objs: Any) -> int:
        return sum(len(orjson.dumps(o)) for o in objs)

    try:
        tracemalloc.start()
        for name, path, params in (("nodes", NODES_PATH, None), ("nrts", NRTS_PATH, None),
                                   ("gated", "/api/v1/pods",
                                    {"labelSelector": f"{GATE_LABEL}={GATE_LABEL_GATED}"})):
            before = heap()
            inf = await informer(path, params)
            out[name] = {"objects": len(inf.cache), "json_bytes": json_bytes(inf.cache.values()),
                         "heap_bytes": heap() - before}
            inf.cache.clear()
            del inf
            if name == "nodes":
                before = heap()
                inf = await informer(path, params, transform=node_view)
                out["nodes"]["kept_heap_bytes"] = heap() - before
                out["nodes"]["kept_json_bytes"] = json_bytes(inf.cache.values())
                inf.cache.clear()
                del inf
        tracemalloc.stop()
        gc.collect()
        reset_peak_rss()  # the peak RSS of each list, from the level before it
        rss0 = rss_kib(os.getpid())
        began = time.monotonic()
        placed = Informer(api, "/api/v1/pods", {"labelSelector": AFFINITY_LABEL},
                          keep_cache=False)
        count = [0]
        placed.add_handler(lambda t, o, old: count.__setitem__(0, count[0] + 1))
        await placed.relist()
        took = time.monotonic() - began
        _, hwm = proc_stats(os.getpid())
        out["placed_relist"] = {"objects": count[0], "rss_peak_above_kib": hwm - rss0,
                                "seconds": took}
        del placed
        gc.collect()
        reset_peak_rss()
        rss0 = rss_kib(os.getpid())
        began = time.monotonic()
        items, _ = await api.list_all("/api/v1/pods", params={"labelSelector": AFFINITY_LABEL})
        took = time.monotonic() - began
        _, hwm = proc_stats(os.getpid())
        out["placed_list"] = {"objects": len(items), "json_bytes": json_bytes(items),
                              "rss_peak_above_kib": hwm - rss0, "seconds": took}
        del items
        gc.collect()
        out["placed_list"]["rss_after_kib"] = rss_kib(os.getpid()) - rss0
    finally:
        await api.close()
    return out


def run_probe(plane: ControlPlane) -> dict[str, Any]:
    """Run :func:`probe_memory` in a fresh process (``--probe-memory``); its JSON."""
    proc = subprocess.run([sys.executable, __file__, "--probe-memory", str(plane.kubeconfig)],
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        print(f"  ! memory probe failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return {}
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


# --- the run ----------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """Everything measured at one checkpoint."""

    pods: int
    fill: Phase
    procs: dict[str, Sample]
    stretches: list[tuple[Phase, Phase]]
    controller_cpu_bare: float
    shares_fill: PathShares
    shares_stretch: PathShares
    params_bytes: int
    params_entries: int
    params_writes: int
    params_written: int
    params_seconds: float
    webhook: dict[str, float]
    handover: Handover | None

    def ratios(self) -> list[float]:
        """Product stretch rate over bare's, per pair."""
        return [p.rate / b.rate if b.rate else float("nan") for p, b in self.stretches]

    def stretch_cpu(self, bare: bool) -> dict[str, float]:
        """CPU ms per pod of each process in the product (or bare) stretches, median over
        the pairs, with ``total`` (every process of the machine, the benchmark included)."""
        phases = [b if bare else p for p, b in self.stretches]
        names = {n for ph in phases for n in ph.cpu}
        out = {n: median([ph.cpu.get(n, 0.0) for ph in phases]) for n in names}
        out["total"] = median([sum(ph.cpu.values()) for ph in phases])
        return out

    def cpu_model(self, without_product: bool = False) -> float:
        """Bare's CPU per pod over the product's in the stretches: the rate ratio the
        machine's CPU predicts with its 2 cores saturated (:mod:`bench.cluster`); with
        ``without_product``, bare's CPU without what the controllers and the webhook spent
        during the bare stretches (a cluster without the product at all)."""
        if not self.stretches:
            return float("nan")
        bare = self.stretch_cpu(True)
        total = bare["total"]
        if without_product:
            total -= sum(v for k, v in bare.items()
                         if k.startswith("controller") or k == "webhook")
        return total / self.stretch_cpu(False)["total"]


def median(values: Sequence[float]) -> float:
    """The median of the numbers of ``values`` that are not NaN (NaN when none)."""
    clean = sorted(v for v in values if v == v)
    if not clean:
        return float("nan")
    mid = len(clean) // 2
    return clean[mid] if len(clean) % 2 else (clean[mid - 1] + clean[mid]) / 2


def mib(kib: int) -> str:
    """``kib`` as MiB, no decimals."""
    return f"{kib / 1024:.0f}"


def print_checkpoint(cp: Checkpoint) -> None:
    """Print the figures of one checkpoint as they are measured."""
    fill = cp.fill
    print(f"\n== checkpoint {cp.pods} pods in {NAMESPACE} (+{len(fill.indexes)} since the last; "
          f"fill at {fill.rate:.1f} pods/s; wrong {fill.wrong}, escaped {fill.escaped}, "
          f"failed creates {fill.run.failed_creates})")
    product, bare = cp.stretch_cpu(False), cp.stretch_cpu(True)
    print(f"{'process':<26}{'RSS MiB':>9}{'peak MiB':>10}   CPU ms/pod: {'fill':>6}"
          f"{'product':>9}{'bare':>7} (stretches, median)")
    for name in [*PROCESS_ORDER, "benchmark", "total"]:
        s = cp.procs.get(name)
        mem = f"{mib(s.rss):>9}{mib(s.hwm):>10}" if s is not None else f"{'':>19}"
        fill_cpu = (sum(fill.cpu.values()) if name == "total"
                    else fill.cpu.get(name, float("nan")))
        print(f"{name:<26}{mem}{'':>15}{fill_cpu:>6.2f}"
              f"{product.get(name, float('nan')):>9.2f}{bare.get(name, float('nan')):>7.2f}")
    for k, (p, b) in enumerate(cp.stretches):
        print(f"stretch {k + 1}: product {p.rate:.1f} pods/s, bare {b.rate:.1f} pods/s, ratio "
              f"{p.rate / b.rate if b.rate else float('nan'):.2f} (wrong {p.wrong}, "
              f"escaped {p.escaped})")
    if cp.stretches:
        print(f"placement rate / bare at this size (median): {median(cp.ratios()):.2f}; "
              f"the CPU model (bare's CPU per pod over the product's): {cp.cpu_model():.2f}, "
              f"{cp.cpu_model(True):.2f} without the product's processes' CPU in the bare "
              f"stretches (controllers {cp.controller_cpu_bare:.2f} s)")
    print(f"paths since the last checkpoint: {cp.shares_fill.text()}")
    if cp.stretches:
        print(f"paths in the product stretches: {cp.shares_stretch.text()}")
    print(f"params object: {cp.params_bytes / 1000:.0f} KB, {cp.params_entries} entries; "
          f"{cp.params_writes} writes in {cp.params_seconds:.0f} s "
          f"({cp.params_writes / max(cp.params_seconds, 1e-9):.2f}/s, "
          f"{cp.params_written / 1000 / max(cp.params_seconds, 1e-9):.1f} KB/s)")
    print(f"webhook admissions: {cp.webhook}")
    h = cp.handover
    if h is not None:
        print(f"fresh controller: ready {h.ready:.1f} s after its start (RSS {mib(h.ready_rss)} "
              f"MiB); handover: leader SIGKILLed, Lease taken after {h.lease:.1f} s, gated probe "
              f"placed after {h.placed:.1f} s ({h.placed - h.lease:.2f} s after the Lease; the "
              f"controller placed one in {h.before:.2f} s before); the new leader's CPU idle "
              f"{h.settle:.1f} s after it took the Lease ({h.settle_cpu:.1f} s of CPU); "
              f"rolling update (leader SIGTERMed, a ready standby): Lease taken after "
              f"{h.graceful_lease:.1f} s, probe placed after {h.graceful_placed:.1f} s")
    sys.stdout.flush()


def print_summary(cps: Sequence[Checkpoint], probe: Mapping[str, Any],
                  args: argparse.Namespace, setup: Mapping[str, float]) -> None:
    """The tables of every checkpoint, then the memory probe."""
    print(f"\n== summary: {args.nodes} nodes ({setup['nrts']:.0f} with an NRT; Node JSON "
          f"{setup['node_bytes'] / 1000:.1f} KB each), {args.tags} tags, Zipf s={SKEW_S}, "
          f"{SKEW_ALWAYS:.0%} Always; 2 shared cores")
    print("| pods | " + " | ".join(f"{n} RSS MiB (peak)" for n in PROCESS_ORDER[:5])
          + " | rate / bare (CPU model; without the product's idle CPU) | rate / first (CPU "
          "model) | admission share (catalog hit) | params KB, writes/s | ready s | handover: "
          "Lease / placed s | rolling handover: Lease / placed s |")
    print("|" + "---|" * 13)
    first = median([p.rate for p, _ in cps[0].stretches])
    first_cpu = cps[0].stretch_cpu(False).get("total", float("nan"))
    for cp in cps:
        mem = " | ".join(f"{mib(cp.procs[n].rss)} ({mib(cp.procs[n].hwm)})"
                         if n in cp.procs else "" for n in PROCESS_ORDER[:5])
        rate = median([p.rate for p, _ in cp.stretches])
        cpu = cp.stretch_cpu(False).get("total", float("nan"))
        s = cp.shares_stretch if cp.stretches else cp.shares_fill
        adm = sum(v for k, v in (s.paths + s.always_paths).items() if k == "admission")
        h = cp.handover or Handover()
        print(f"| {cp.pods} | {mem} | {median(cp.ratios()):.2f} ({cp.cpu_model():.2f}; "
              f"{cp.cpu_model(True):.2f}) | "
              f"{rate / first:.2f} ({first_cpu / cpu:.2f}) | "
              f"{adm / max(1, s.pods):.1%} ({s.hit:.1%}) | {cp.params_bytes / 1000:.0f}, "
              f"{cp.params_writes / max(cp.params_seconds, 1e-9):.2f} | {h.ready:.1f} | "
              f"{h.lease:.1f} / {h.placed:.1f} | {h.graceful_lease:.1f} / "
              f"{h.graceful_placed:.1f} |")
    names = [*PROCESS_ORDER, "benchmark"]
    for title, of in (("pods created since the previous checkpoint",
                       lambda cp: {**cp.fill.cpu, "total": sum(cp.fill.cpu.values())}),
                      ("product stretch pods (median)", lambda cp: cp.stretch_cpu(False)),
                      ("bare stretch pods (median)", lambda cp: cp.stretch_cpu(True))):
        print(f"\nCPU ms per pod, {title}:")
        print("| pods | " + " | ".join([*names, "total"]) + " |")
        print("|" + "---|" * (len(names) + 2))
        for cp in cps:
            figures = of(cp)
            print(f"| {cp.pods} | " + " | ".join(f"{figures.get(n, float('nan')):.2f}"
                                                for n in [*names, "total"]) + " |")
    if probe:
        print("\nwhat the controller's informers hold (tracemalloc, a fresh process, at the "
              "last checkpoint):")
        for name, fig in probe.items():
            print(f"  {name}: " + ", ".join(
                f"{k} {v / 2**20:.1f} MiB" if k.endswith("bytes") else
                f"{k} {v / 1024:.0f} MiB" if k.endswith("kib") else
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in fig.items()))


def save(path: Path, cps: Sequence[Checkpoint], probe: Mapping[str, Any],
         setup: Mapping[str, float]) -> None:
    """Write the checkpoints' figures as JSON to ``path``."""
    path.write_text(json.dumps({"setup": setup, "probe": probe, "checkpoints": [{
        "pods": cp.pods, "fill_rate": cp.fill.rate,
        "rss_kib": {n: s.rss for n, s in cp.procs.items()},
        "hwm_kib": {n: s.hwm for n, s in cp.procs.items()},
        "cpu_ms_per_pod": cp.fill.cpu,
        "stretches": [{"product": p.rate, "bare": b.rate, "product_cpu": p.cpu,
                       "bare_cpu": b.cpu} for p, b in cp.stretches],
        "paths_fill": dict(cp.shares_fill.paths + cp.shares_fill.always_paths),
        "paths_stretch": dict(cp.shares_stretch.paths + cp.shares_stretch.always_paths),
        "hit_fill": [cp.shares_fill.hit, cp.shares_fill.ideal, cp.shares_fill.lru],
        "hit_stretch": [cp.shares_stretch.hit, cp.shares_stretch.ideal, cp.shares_stretch.lru],
        "params": {"bytes": cp.params_bytes, "entries": cp.params_entries,
                   "writes": cp.params_writes, "written": cp.params_written,
                   "seconds": cp.params_seconds},
        "webhook": cp.webhook, "handover": None if cp.handover is None else vars(cp.handover),
        "wrong": cp.fill.wrong + sum(p.wrong for p, _ in cp.stretches),
        "escaped": cp.fill.escaped + sum(p.escaped for p, _ in cp.stretches),
    } for cp in cps]}, indent=1))


def set_up(args: argparse.Namespace, work_dir: Path, registry: Registry, plane: ControlPlane
           ) -> tuple[Images, dict[str, tuple[str, str]], dict[str, float]]:
    """Tags, nodes, NRTs and the two namespaces; returns the images, node name → (os, arch)
    and a few setup figures (seconds, counts)."""
    setup: dict[str, float] = {}
    began = time.monotonic()
    images = push_tags(registry, args.tags, args.push)
    setup["tags_s"] = time.monotonic() - began
    nodes = fake_nodes(args.nodes)
    began = time.monotonic()
    asyncio.run(create_nodes(plane, nodes, args.node_images))
    setup["nodes_s"] = time.monotonic() - began
    with plane.client() as c:
        one = c.get(f"{NODES_PATH}/{nodes[0].name}").content
    setup["node_bytes"] = len(one)
    kubectl(plane, "apply", "--server-side", "-f",
            str(REPO / "deploy" / "optional" / "noderesourcetopology-crd.yaml"))
    kubectl(plane, "wait", "--for", "condition=Established", "--timeout=60s", "-f",
            str(REPO / "deploy" / "optional" / "noderesourcetopology-crd.yaml"))
    with_nrt = nrt_nodes(nodes, args.nrt_share)
    began = time.monotonic()
    asyncio.run(create_objects(plane, NRTS_PATH, [nrt_for(n) for n in with_nrt]))
    setup["nrts"], setup["nrts_s"] = len(with_nrt), time.monotonic() - began
    print(f"nodes: {len(nodes)} in {setup['nodes_s']:.1f} s ({setup['node_bytes']} bytes of "
          f"JSON each); NRTs: {len(with_nrt)} in {setup['nrts_s']:.1f} s", file=sys.stderr)
    with plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}).raise_for_status()
        c.post("/api/v1/namespaces", json={"metadata": {
            "name": BARE_NAMESPACE, "labels": {EXCLUDE_NAMESPACE_LABEL: "true"}}}
               ).raise_for_status()
        deadline = time.monotonic() + 30
        for ns in (NAMESPACE, BARE_NAMESPACE):
            while c.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"
                        ).status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
    return images, {n.name: (n.os, n.arch) for n in nodes}, setup


def check_bare(plane: ControlPlane, image: str) -> None:
    """A dry-run pod in the bare namespace must come back unchanged by the product.

    Raises:
        RuntimeError: it was gated or carries the decision annotation.
    """
    with plane.client() as c:
        obj = c.post(f"/api/v1/namespaces/{BARE_NAMESPACE}/pods", params={"dryRun": "All"},
                     json=dry_run_pod(image)).json()
    if (obj.get("spec") or {}).get("schedulingGates") or DECISION_ANNOTATION in (
            (obj.get("metadata") or {}).get("annotations") or {}):
        raise RuntimeError(f"the product touched a pod of {BARE_NAMESPACE}: {obj}")


def main(argv: list[str] | None = None) -> int:
    """Parse options, fill the cluster checkpoint by checkpoint, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=5000, help="fake nodes (default 5000)")
    ap.add_argument("--nrt-share", type=float, default=0.1,
                    help="share of the nodes with a NodeResourceTopology (default 0.1)")
    ap.add_argument("--node-images", type=int, default=30,
                    help="entries of each node's status.images (default 30)")
    ap.add_argument("--tags", type=int, default=50_000, help="image tags (default 50000)")
    ap.add_argument("--push", choices=("storage", "http"), default="storage",
                    help="write the tags into the registry's storage (default) or PUT them")
    ap.add_argument("--checkpoints", default="2000,10000,20000",
                    help="pod counts, comma-separated (default 2000,10000,20000)")
    ap.add_argument("--stretch", type=int, default=1000,
                    help="pods per rate stretch (default 1000)")
    ap.add_argument("--stretch-rounds", type=int, default=2,
                    help="product/bare stretch pairs per checkpoint (default 2; 0: none)")
    ap.add_argument("--clients", type=int, default=16,
                    help="keep-alive connections in all (default 16)")
    ap.add_argument("--procs", type=int, default=2, help="load-generator processes (default 2)")
    ap.add_argument("--config-patch", default=None, metavar="JSON",
                    help="a JSON merge patch applied to the sample config after the install "
                         "(to compare a setting with the default; the default config "
                         "without it)")
    ap.add_argument("--lease-duration", type=int, default=15,
                    help="the controllers' --lease-duration (default 15, deploy/'s)")
    ap.add_argument("--limit", type=float, default=900.0,
                    help="seconds to wait for a phase's pods to be bound (default 900)")
    ap.add_argument("--no-handover", action="store_true",
                    help="no controller start and leader handover at the checkpoints")
    ap.add_argument("--no-probe", action="store_true", help="no memory probe at the end")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (logs, etcd data, registry storage: GBs at "
                         "100,000 pods); removed by default")
    ap.add_argument("--save", type=Path, default=None, metavar="FILE",
                    help="also write the figures as JSON to FILE")
    ap.add_argument("--probe-memory", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe_memory:
        print(json.dumps(asyncio.run(probe_memory(args.probe_memory))))
        return 0
    try:
        checkpoints = sorted({int(x) for x in args.checkpoints.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--checkpoints: not a list of pod counts: {args.checkpoints!r}")
    if not checkpoints or checkpoints[0] <= 0 or args.nodes <= 0 or args.tags <= 0:
        ap.error("--checkpoints, --nodes and --tags must be positive")
    try:
        patch = None if args.config_patch is None else json.loads(args.config_patch)
    except ValueError as exc:
        ap.error(f"--config-patch: not JSON: {exc}")
    args.procs = max(1, min(args.procs, args.clients))
    work_dir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    t_start = time.monotonic()
    registry = start_registry(work_dir / "registry", quiet=True)
    plane: ControlPlane | None = None
    product: Product | None = None
    params: ParamsLog | None = None
    try:
        plane = start_control_plane(locate_assets(), work_dir / "plane")
        images, nodes, setup = set_up(args, work_dir, registry, plane)
        install_manifests(plane, REPO / "deploy")
        if patch is not None:
            with plane.client() as c:
                c.patch(CONFIG_PATH, json=patch,
                        headers={"Content-Type": "application/merge-patch+json"}
                        ).raise_for_status()
        options = ["--insecure-registry", registry.host]
        product = start_product(plane, work_dir / "product", controller_options=options,
                                webhook_options=options, controllers=0,
                                wait_registered=False)
        ctl = Controllers(product, lease_duration=args.lease_duration)
        start_controller(ctl, "scale-0")
        wait_webhook_registered(product)
        start_controller(ctl, "scale-1")
        wait_ready(ctl, "scale-1")
        check_bare(plane, images.skewed[0])
        params = ParamsLog(plane)
        params.start()
        setup["setup_s"] = time.monotonic() - t_start
        print(f"set up in {setup['setup_s']:.0f} s", file=sys.stderr)
        rounds = args.stretch_rounds if args.stretch > 0 else 0
        total = checkpoints[-1] + len(checkpoints) * rounds * args.stretch
        work = workload("skewed", images, total, None)
        unbounded, bounded = ideal_hits(work, total)
        next_pod, next_bare, probes = 0, 0, [0]
        cps: list[Checkpoint] = []
        last_t = time.monotonic()
        for n, target in enumerate(checkpoints):
            fill = Phase(NAMESPACE, range(next_pod, next_pod + max(0, target - next_pod)))
            next_pod = fill.indexes.stop
            print(f"filling to {target} pods ({len(fill.indexes)} new)", file=sys.stderr)
            after = run_measured(plane, fill, processes(plane, product, ctl, registry),
                                 work.body, args, work_dir, work, nodes)
            stretches: list[tuple[Phase, Phase]] = []
            bare_ctl_cpu = 0.0
            for r in range(rounds):
                product_phase = Phase(NAMESPACE, range(next_pod, next_pod + args.stretch))
                bare_phase = Phase(BARE_NAMESPACE, range(next_bare, next_bare + args.stretch))
                next_pod, next_bare = product_phase.indexes.stop, bare_phase.indexes.stop
                order = [product_phase, bare_phase] if r % 2 == 0 else [bare_phase,
                                                                        product_phase]
                for phase in order:
                    run_measured(plane, phase, processes(plane, product, ctl, registry),
                                 work.body, args, work_dir,
                                 work if phase is product_phase else None, nodes)
                    if phase is bare_phase:
                        bare_ctl_cpu += sum(v for k, v in phase.cpu.items()
                                            if k.startswith("controller")
                                            ) * len(phase.indexes) / 1000
                stretches.append((product_phase, bare_phase))
            now = time.monotonic()
            writes, written = params.between(last_t, now)
            p_bytes, p_entries = params_now(plane)
            cp = Checkpoint(
                pods=target, fill=fill, procs=after, stretches=stretches,
                controller_cpu_bare=bare_ctl_cpu,
                shares_fill=PathShares.of([fill], work, unbounded, bounded),
                shares_stretch=PathShares.of([p for p, _ in stretches], work, unbounded,
                                             bounded),
                params_bytes=p_bytes, params_entries=p_entries, params_writes=writes,
                params_written=written, params_seconds=now - last_t,
                webhook=webhook_paths(product), handover=None)
            last_t = now
            if not args.no_handover:
                cp.handover = handover(plane, registry, ctl, n + 2, probes)
            cps.append(cp)
            print_checkpoint(cp)
            if args.save is not None:
                save(args.save, cps, {}, setup)
        probe = {} if args.no_probe else run_probe(plane)
        setup["total_s"] = time.monotonic() - t_start
        print_summary(cps, probe, args, setup)
        print(f"\nwhole run: {setup['total_s']:.0f} s (set-up {setup['setup_s']:.0f} s)")
        if args.save is not None:
            save(args.save, cps, probe, setup)
    finally:
        if params is not None:
            params.stop()
        if product is not None:
            product.stop()
        if plane is not None:
            plane.stop()
        registry.stop()
        if args.keep:
            print(f"work directory kept: {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

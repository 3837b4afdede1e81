"""Cluster benchmark on the real control plane: what the product adds to the API server, as a
ratio to bare in the same round.

Each *arm* starts a fresh real control plane (etcd, kube-apiserver, kube-scheduler with client
limits raised, kube-controller-manager; 7 fake Ready nodes: 2 amd64, 2 arm64, ppc64le, s390x,
windows/amd64, with room for every pod) and creates ``--pods`` pods (default 2,000) in
namespace ``bench``. The ``bare`` arm has nothing installed; a product arm applies
``deploy/`` (``kubectl apply -k``), runs the webhook and the controller as deploy/'s
ServiceAccounts (:mod:`podplacement.sandbox.product`) and sets up its *scenario*. A round
runs ``bare`` and every scenario asked for, in an order rotated from round to round
(interleaved rounds: slow drifts of a shared machine hit every arm alike).

The load generator is never the bottleneck: the pods' request bytes (headers and JSON body)
are serialized before the clock starts, then ``--procs`` processes (:mod:`bench.loadgen`,
standard library only) send them over ``--clients`` keep-alive HTTPS connections in all,
reading each answer without decoding it. One watch in this process records when each pod is
ungated and bound (orjson). The figures, per arm:

- pods bound per second (first create sent → last pod bound), and the **ratio to bare in the
  same round**: the primary figure; the median over rounds is printed per scenario, and the
  difference to ``warm`` in the same round when ``warm`` ran too;
- **kube-apiserver CPU milliseconds per pod the product adds** (the product arm's
  kube-apiserver CPU minus bare's in the same round, over the pods);
- the benchmark's own CPU (this process + the load generators) next to the bare rate;
- p50/p99 from create sent to answered, to ungated and to bound;
- the API requests per pod by podplacement's ServiceAccounts (audit log, unless
  ``--no-audit``), the webhook's ``admissions_total`` by path, the CPU of every process;
- the **CPU per pod of every process on this machine** (median over rounds) and what it
  predicts: with the 2 cores saturated, an arm's rate over bare's is bare's CPU per pod over
  the arm's (printed next to the measured ratio), the same without the local registry's
  CPU, which a real cluster spends on other machines, and with the control plane's
  processes alone (the webhook's replicas and the registry on other nodes). The registry
  runs as one tuned for
  throughput (errors-only log, no access log, in-memory blob descriptor cache);
- the **arch check** of every bound pod: bound to a node whose (os, arch) its image does not
  run on (*wrong*), or bound without a ``kubernetes.io/arch`` requirement (*escaped*). Both
  must be 0 for the product (bare shows what happens without it).

Scenarios (``--scenario``, comma-separated; images in a local registry: an amd64+arm64 index,
a single amd64 and a single arm64 manifest; with ``mechanism: Auto`` the params object holds
``--params-entries`` entries, filler included):

- ``warm``: the images are in the params object: the MutatingAdmissionPolicy places every
  pod at admission (no webhook call, no second write);
- ``warm-policy``: ``warm`` with a PodPlacementPolicy in the bench namespace whose selector
  matches every bench pod (its own weights, an ``allowedArchitectures`` that removes nothing
  from the bench images): the policy's place branch reads it for every pod; the report's
  "vs warm" column is the difference to ``warm`` in the same round;
- ``webhook-warm``: ``spec.admission.mechanism: Webhook``, the images in the webhook's cache
  (one pod of each created first): the webhook gates and places each pod in its answer;
- ``always``: every pod ``imagePullPolicy: Always``, one pod of each image placed first (by
  the webhook, which checks the tag's digest): the controller then checks the tags every half
  of ``pullAlwaysFreshness`` and publishes them in ``spec.fresh``, and the policy places the
  pods (docs/how-it-decides.md "Always pods and spec.fresh");
- ``always-webhook``: ``always`` with ``pullAlwaysFreshness: 0s``: the policy gates every
  pod, the webhook checks each tag's digest with a manifest HEAD (shared by concurrent
  reviews) and places the pod;
- ``new-images``: every pod names a reference never seen (a distinct tag of one of the three
  manifests): the policy gates, the webhook inspects at admission and places;
- ``skewed``: what a default install meets: the product as shipped (sample config), the
  params object empty at the start, pods over ``--skew-tags`` tags (default 500) drawn with a
  Zipf law (s=1.1; a few tags take most pods), 10% of the pods pulled with ``Always``. The
  report's decision paths give the share of pods each path placed (``admission``: the
  policy, from the catalog the controller fills from every path);
- ``cold-burst``: 20 references never seen, pods round-robin over them, no warm-up;
- ``controller``: ``spec.admission.fastPaths: Disabled``: every pod gated, then PATCHed by the
  controller (the floor);
- ``cold`` (the three images new to the product), ``private`` (htpasswd registry, pull
  secret; one pod of each image placed first: the webhook reads no Secret, so the
  controller places them, with the images warm in its inspector's cache),
  ``webhook-stopped`` (SIGSTOP for the whole run);
- ``warm-small`` (the params object holds the bench images only) and ``warm-nomonitor``
  (``plugins.execFormatErrorMonitor.enabled: false``): ``warm`` less one of its costs;
- ``floor-product``: the product's own admission policy and params object (as in ``warm``),
  with no webhook or controller process (:func:`product_policy`);
- ``floor-lookup``: the same, the policy reduced to what any catalog-based policy needs for
  a ``warm`` pod (:func:`lookup_policy`: the lookup of its image, the patch built from its
  platform set), the same decision written: the floor a policy that reads a catalog can
  reach, where ``floor-same`` knows each pod's answer before the pod exists;
- ``floor-webhook``: no product; a minimal mutating webhook of the benchmark's own
  (:mod:`bench.floorhook`: uvicorn, TLS, a one-op JSONPatch) called for every pod: what one
  webhook call costs the API server whatever the webhook decides, the floor under every pod
  the webhook places (``always``, ``new-images``);
- ``floor-label`` and ``floor-place``: no product; a minimal MutatingAdmissionPolicy of the
  benchmark's own that adds one label, or writes a constant placement of the product's
  shape, to every pod (:func:`floor_policy`): what the API server spends on any policy
  mutation, the floor under the product's place branch (their pods are not placed: the
  arch check does not apply).

``--light`` creates pods one at a time over 1 connection (default ``--pods 200``) and prints
the create latency (p50) of each arm and what the product adds to it: with ``new-images``
every pod is the first of its image (inspected at admission from the local registry), with
``warm`` every pod is placed by the policy.

``--loadgen inprocess`` creates the pods with httpx from this process instead (JSON
serialized per pod, 1 process), the generator this benchmark used before, for comparison.

Usage: ``python bench/cluster.py [--scenario warm,always,new-images] [--rounds 3]
[--pods 2000] [--clients 16] [--procs 2] [--light] [--no-audit] [--params-entries 5000]
[--save FILE]``
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
import base64  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import httpx  # noqa: E402
import orjson  # noqa: E402

from podplacement.controller.paramswriter import params_collection_path  # noqa: E402
from podplacement.rules.admit.imageparams import catalog_maps  # noqa: E402
from podplacement.rules.config import ARCH_LABEL, OS_LABEL, SCHEDULING_GATE  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    DEFAULT_NODES,
    ControlPlane,
    add_nodes,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pushed, Pusher  # noqa: E402
from podplacement.sandbox.product import NAMESPACE as PRODUCT_NAMESPACE  # noqa: E402
from podplacement.sandbox.product import Product, install_manifests, start_product  # noqa: E402
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402

REPO = Path(_ROOT)
LOADGEN = REPO / "bench" / "loadgen.py"
NAMESPACE = "bench"
CONFIG_PATH = "/apis/podplacement.io/v1beta1/podplacementconfigs/cluster"
PARAMS_PATH = params_collection_path(PRODUCT_NAMESPACE)
SCENARIOS = ("warm", "warm-policy", "webhook-warm", "always", "always-webhook", "new-images",
             "skewed",
             "cold-burst",
             "controller", "cold", "private", "webhook-stopped", "floor-label", "floor-place",
             "warm-small", "warm-nomonitor", "floor-product", "floor-webhook", "floor-same",
             "floor-lookup")
#: ``warm`` variants that tell where its cost goes: a params object holding only the bench
#: images, or the exec format error monitor (a watch of every placed pod) switched off.
WARM_ARMS = ("warm", "warm-policy", "warm-small", "warm-nomonitor")
#: Arms without the product: a minimal MutatingAdmissionPolicy of the benchmark's own
#: (:func:`floor_policy`), the floor under any placement done by a policy.
FLOOR_ARMS = ("floor-label", "floor-place", "floor-product", "floor-webhook", "floor-same",
              "floor-lookup")
#: The floor arms whose pods are placed for real (the arch check applies to them).
PLACING_FLOORS = ("floor-product", "floor-same", "floor-lookup")
#: The floors ``warm`` is measured against, each that ran (:func:`report_floor`);
#: ``floor-place`` only when neither of the others did.
FLOOR_REFERENCE = ("floor-same", "floor-lookup", "floor-place")
#: The catalog uid the ``floor-same`` arm writes into its decision records (it reads no
#: params object): a fixed uid as long as the API server's, so the records differ from
#: ``warm``'s in these 36 characters only; :func:`decision_signature` compares records with
#: the uid replaced by it.
FLOOR_CATALOG_UID = "00000000-0000-4000-8000-000000000000"
#: The three manifests every image reference of the benchmark names: repository → the
#: architectures it runs on (all linux).
REPOS = {"bench/multi": frozenset({"amd64", "arm64"}), "bench/amd": frozenset({"amd64"}),
         "bench/arm": frozenset({"arm64"})}
BURST_IMAGES = 20
#: The ``skewed`` scenario's defaults: tags, Zipf exponent, share of pods pulled with Always.
SKEW_TAGS = 500
SKEW_S = 1.1
SKEW_ALWAYS = 0.10


@dataclass(frozen=True)
class Workload:
    """What one arm creates: per pod, its image reference and pull policy."""

    images: list[str]
    always: bool = False
    pull_secret: str | None = None
    #: indexes of the pods pulled with Always (besides every pod when ``always``)
    always_pods: frozenset[int] = frozenset()

    def body(self, i: int) -> str:
        """The JSON body of pod ``p-i``."""
        container: dict[str, Any] = {"name": "c", "image": self.images[i]}
        if self.always or i in self.always_pods:
            container["imagePullPolicy"] = "Always"
        spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
        if self.pull_secret:
            spec["imagePullSecrets"] = [{"name": self.pull_secret}]
        return orjson.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"p-{i}", "labels": {"app": "bench"}}, "spec": spec}).decode()


@dataclass
class Run:
    """Figures of one arm."""

    arm: str
    pods: int
    wall: float = 0.0
    create_latency: list[float] = field(default_factory=list)
    to_ungate: list[float] = field(default_factory=list)
    to_bound: list[float] = field(default_factory=list)
    failed_creates: int = 0
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    processes: dict[str, tuple[float, int]] = field(default_factory=dict)
    bench_cpu: float = 0.0
    loadgen_cpu_total: float = 0.0
    escaped: int = 0
    wrong: int = 0
    checked: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    #: indexes (creation order) of the pods the controller placed
    by_controller: list[int] = field(default_factory=list)
    webhook_paths: dict[str, float] = field(default_factory=dict)
    #: per image, the decisions written into its bound pods (:func:`decision_signature`)
    decisions: dict[str, set[str]] = field(default_factory=dict)

    @property
    def bound_per_s(self) -> float:
        return len(self.to_bound) / self.wall if self.wall else 0.0

    def cpu(self, name: str) -> float:
        return self.processes.get(name, (0.0, 0))[0]


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, peak RSS KiB) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as f:
            hwm = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0.0, 0
    return cpu, hwm


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` in ms (nearest rank); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- images -----------------------------------------------------------------------------------
@dataclass
class Images:
    """The references pushed to one registry: ``base`` (tag v1 of each repository),
    ``new`` (one never-seen tag per pod), ``burst`` (:data:`BURST_IMAGES` never-seen tags)."""

    base: list[str]
    new: list[str]
    burst: list[str]
    skewed: list[str] = field(default_factory=list)

    @staticmethod
    def archs(image: str) -> frozenset[str]:
        """The architectures ``image`` runs on (by its repository)."""
        repo = image.split("/", 1)[1].rsplit(":", 1)[0]
        return REPOS[repo]


def push_images(registry: Registry, pods: int, new_images: bool, burst: bool,
                skewed: int = 0) -> Images:
    """Push the three manifests (tag ``v1``) and, as asked, ``pods`` tags ``n<i>`` (pod i:
    repository i % 3), :data:`BURST_IMAGES` tags ``b<j>`` and ``skewed`` tags ``z<k>``
    (repository k % 3); every tag of a repository names the same manifest."""
    p = Pusher(registry)
    repos = list(REPOS)
    try:
        pushed: dict[str, Pushed] = {
            "bench/multi": p.multiarch("bench/multi", "v1", ["linux/amd64", "linux/arm64"]),
            "bench/amd": p.image("bench/amd", "v1", architecture="amd64"),
            "bench/arm": p.image("bench/arm", "v1", architecture="arm64"),
        }

        def tag(repo: str, name: str) -> str:
            m = pushed[repo]
            p.raw_manifest(repo, name, m.body, m.media_type)
            return f"{registry.host}/{repo}:{name}"

        new = [tag(repos[i % 3], f"n{i}") for i in range(pods)] if new_images else []
        bursts = [tag(repos[j % 3], f"b{j}") for j in range(BURST_IMAGES)] if burst else []
        skew = [tag(repos[k % 3], f"z{k}") for k in range(skewed)]
    finally:
        p.close()
    return Images([f"{registry.host}/{r}:v1" for r in repos], new, bursts, skew)


def zipf_picks(n: int, tags: int, s: float, seed: int = 1) -> list[int]:
    """``n`` draws of a tag index in ``range(tags)`` with P(k) proportional to 1/(k+1)^s (a
    Zipf law over ranks; the same draws for the same arguments)."""
    import random

    weights = [1.0 / (k + 1) ** s for k in range(tags)]
    return random.Random(seed).choices(range(tags), weights=weights, k=n)


def workload(scenario: str, images: Images, pods: int, pull_secret: str | None) -> Workload:
    """The pods a product arm of ``scenario`` creates (bare: those of ``warm``)."""
    if scenario == "skewed":
        import random

        rng = random.Random(2)
        picks = zipf_picks(pods, len(images.skewed), SKEW_S)
        return Workload([images.skewed[k] for k in picks], pull_secret=pull_secret,
                        always_pods=frozenset(i for i in range(pods)
                                              if rng.random() < SKEW_ALWAYS))
    if scenario == "new-images":
        refs = images.new[:pods]
    elif scenario == "cold-burst":
        refs = [images.burst[i % len(images.burst)] for i in range(pods)]
    else:
        refs = [images.base[i % len(images.base)] for i in range(pods)]
    return Workload(refs, always=scenario in ("always", "always-webhook"),
                    pull_secret=pull_secret)


def pull_secret(registry: Registry, name: str) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` Secret ``name`` for ``registry``'s login."""
    auth = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}}


# --- creating pods and watching them ----------------------------------------------------------
class Watch:
    """One pod watch in ``bench`` recording when each ``p-N`` pod is first seen ungated and
    bound (monotonic seconds). Resumed from the last resourceVersion when the stream ends."""

    def __init__(self, client: httpx.AsyncClient, base: str, rv: str, n: int,
                 limit: float) -> None:
        self.ungated: dict[int, float] = {}
        self.bound: dict[int, float] = {}
        self.done = asyncio.Event()
        self._client, self._base, self._rv, self._n, self._limit = client, base, rv, n, limit

    async def run(self) -> None:
        while not self.done.is_set():
            try:
                async with self._client.stream("GET", self._base, params={
                        "watch": "1", "resourceVersion": self._rv,
                        "allowWatchBookmarks": "true",
                        "timeoutSeconds": str(int(self._limit))}, timeout=None) as r:
                    async for line in r.aiter_lines():
                        if line and self._event(line):
                            return
            except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
                print(f"  (pod watch: {type(exc).__name__}: {exc}; resuming)", file=sys.stderr)
                await asyncio.sleep(0.1)

    def _event(self, line: str) -> bool:
        obj = orjson.loads(line).get("object") or {}
        meta = obj.get("metadata") or {}
        self._rv = meta.get("resourceVersion") or self._rv
        name = meta.get("name") or ""
        if not name.startswith("p-"):
            return False  # a warm-up pod, a bookmark
        i = int(name[2:])
        spec = obj.get("spec") or {}
        now = time.monotonic()
        if not any(g.get("name") == SCHEDULING_GATE for g in spec.get("schedulingGates") or []):
            self.ungated.setdefault(i, now)
        if spec.get("nodeName"):
            self.bound.setdefault(i, now)
            if len(self.bound) >= self._n:
                self.done.set()
                return True
        return False


def _write_specs(plane: ControlPlane, work: Workload, n: int, procs: int, clients: int,
                 directory: Path) -> list[Path]:
    """Pre-serialize the pods for ``procs`` load generators (pod i → process i % procs)."""
    url = urlsplit(plane.url)
    paths = []
    for k in range(procs):
        spec = {"host": url.hostname, "port": url.port, "ca_file": str(plane.ca_file),
                "token": plane.token, "path": f"/api/v1/namespaces/{NAMESPACE}/pods",
                "connections": max(1, clients // procs + (1 if k < clients % procs else 0)),
                "bodies": [[i, work.body(i)] for i in range(k, n, procs)]}
        path = directory / f"loadgen-{k}.json"
        path.write_bytes(orjson.dumps(spec))
        paths.append(path)
    return paths


async def _create_with_loadgens(specs: list[Path], run: Run, sent: dict[int, float],
                                started: asyncio.Event) -> list[int]:
    """Start the load generators, wait until each is connected, start them together;
    returns their pids (gone by then). Fills ``sent`` and the create figures of ``run``."""
    gens = [await asyncio.create_subprocess_exec(
        sys.executable, str(LOADGEN), str(spec), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE) for spec in specs]
    for gen in gens:
        assert gen.stdout is not None
        line = await gen.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"load generator did not start: {line!r}")
    started.set()
    for gen in gens:
        assert gen.stdin is not None
        gen.stdin.write(b"go\n")
        await gen.stdin.drain()
    for gen in gens:
        assert gen.stdout is not None
        out = orjson.loads(await gen.stdout.read())
        await gen.wait()
        run.bench_cpu += out["cpu"]
        run.loadgen_cpu_total += out["cpu_total"]
        for i, t_sent, t_done, status in out["results"]:
            sent[i] = t_sent
            if status == 201:
                run.create_latency.append(t_done - t_sent)
            else:
                run.failed_creates += 1
    return [g.pid for g in gens]


async def _create_inprocess(plane: ControlPlane, work: Workload, n: int, clients: int,
                            run: Run, sent: dict[int, float], started: asyncio.Event) -> None:
    """The former generator: httpx from this process, one JSON serialization per pod."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=plane.url, verify=ctx, headers=headers, timeout=60,
                                 limits=httpx.Limits(max_connections=clients)) as c:
        queue = list(range(n))[::-1]
        started.set()

        async def client() -> None:
            while queue:
                i = queue.pop()
                sent[i] = t0 = time.monotonic()
                body = json.dumps(json.loads(work.body(i)))
                r = await c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", content=body)
                if r.status_code == 201:
                    run.create_latency.append(time.monotonic() - t0)
                else:
                    run.failed_creates += 1

        await asyncio.gather(*(client() for _ in range(clients)))


async def create_and_watch(plane: ControlPlane, work: Workload, n: int, args: argparse.Namespace,
                           run: Run, specs: list[Path], limit: float,
                           on_start: Any) -> None:
    """Create ``n`` pods while one watch records when each is ungated and bound (bounded by
    ``limit`` seconds); ``on_start()`` is called just before the first create."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}", "Accept": "application/json"}
    sent: dict[int, float] = {}
    async with httpx.AsyncClient(base_url=plane.url, verify=ctx, headers=headers,
                                 timeout=60) as c:
        base = f"/api/v1/namespaces/{NAMESPACE}/pods"
        rv = (await c.get(base, params={"limit": "1"})).json()["metadata"]["resourceVersion"]
        watch = Watch(c, base, rv, n, limit)
        watcher = asyncio.create_task(watch.run())
        await asyncio.sleep(0.2)
        started = asyncio.Event()
        creating: asyncio.Task[Any]
        if args.loadgen == "processes":
            creating = asyncio.create_task(_create_with_loadgens(specs, run, sent, started))
        else:
            clients = 1 if args.light else args.clients
            creating = asyncio.create_task(
                _create_inprocess(plane, work, n, clients, run, sent, started))
        await started.wait()
        on_start()
        start = time.monotonic()
        await creating
        try:
            await asyncio.wait_for(watch.done.wait(), limit)
        except TimeoutError:
            print(f"  ! {run.arm}: {len(watch.bound)} of {n} bound within {limit:.0f} s",
                  file=sys.stderr)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        run.wall = (max(watch.bound.values()) - start) if watch.bound else 0.0
    run.to_bound = [t - sent[i] for i, t in watch.bound.items() if i in sent]
    run.to_ungate = [t - sent[i] for i, t in watch.ungated.items()
                     if i in sent and t > sent[i]]


# --- setting a scenario up --------------------------------------------------------------------
def count_audit(plane: ControlPlane, since: datetime, until: datetime) -> Counter[
        tuple[str, str]]:
    """Requests by (user, verb) received in [since, until] (one per audit ID)."""
    assert plane.audit_log is not None
    seen: set[str] = set()
    out: Counter[tuple[str, str]] = Counter()
    for path in sorted(plane.audit_log.parent.glob(plane.audit_log.name + "*")):
        with path.open("rb") as f:
            for line in f:
                ev = orjson.loads(line)
                if ev["auditID"] in seen:
                    continue
                t = datetime.fromisoformat(ev["requestReceivedTimestamp"])
                if since <= t <= until:
                    seen.add(ev["auditID"])
                    out[(ev["user"]["username"], ev["verb"])] += 1
    return out


def seed_params(plane: ControlPlane, entries: int, images: dict[str, str]) -> None:
    """Create the params object ImagePlatformCatalog ``cluster`` with ``images`` (reference →
    ``os/arch`` list, learned now) and filler images (~110-character
    references by digest, which have no learned time) up to ``entries``, before the
    controller starts: it adopts them, so the policy reads a full-size object. Filler by
    digest, because 5,000 long tag references with their learned times exceed the
    controller's 1 MB bound (it would evict some on adoption)."""
    filler = {f"registry.example.internal/t{i % 50:02d}/s{i:05d}@sha256:"
              + hashlib.sha256(str(i).encode()).hexdigest(): "linux/amd64,linux/arm64"
              for i in range(max(0, entries - len(images)))}
    now = int(time.time())
    learned = {image: now for image in images if "@" not in image}
    with plane.client() as c:
        c.post(PARAMS_PATH, json={"apiVersion": "podplacement.io/v1beta1",
                                  "kind": "ImagePlatformCatalog",
                                  "metadata": {"name": "cluster",
                                               "namespace": PRODUCT_NAMESPACE},
                                  "spec": catalog_maps({**filler, **images}, learned)}
               ).raise_for_status()


def dry_run_pod(image: str, always: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": image}
    if always:
        container["imagePullPolicy"] = "Always"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "dry-"},
            "spec": {"containers": [container]}}


def warm_up(plane: ControlPlane, work: Workload, images: list[str], *, path: str,
            create: bool, limit: float = 120.0, dry_always: bool = False) -> None:
    """Optionally create one pod ``w-N`` of each image in ``bench`` (as the workload writes
    it: pull policy, pull secret), then wait until a dry-run pod of each image comes back
    placed at admission by ``path`` (``admission``: the policy; ``webhook``: the webhook's
    cache). The dry-run pod pulls with ``Always`` only with ``dry_always`` (the policy places
    it once the controller published the tag in ``spec.fresh``; the webhook does not
    revalidate a dry run)."""
    with plane.client() as c:
        if create:
            for i, image in enumerate(images):
                body = orjson.loads(Workload([image], work.always, work.pull_secret).body(0))
                body["metadata"] = {"name": f"w-{i}", "labels": {"app": "warm-up"}}
                c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            placed = []
            for image in images:
                body = dry_run_pod(image, always=dry_always)
                if work.pull_secret:
                    body["spec"]["imagePullSecrets"] = [{"name": work.pull_secret}]
                obj = c.post(f"/api/v1/namespaces/{NAMESPACE}/pods",
                             params={"dryRun": "All"}, json=body).json()
                placed.append(_placed_by(path, obj))
            if all(placed):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up: not placed by {path} within {limit} s")
            time.sleep(0.5)


def warm_up_controller(plane: ControlPlane, work: Workload, images: list[str],
                       limit: float = 120.0) -> None:
    """Create one pod ``w-N`` of each image in ``bench`` (as the workload writes it: pull
    secret) and wait until each is ungated (placed by the controller, whose inspector then
    holds the images: the steady state of a private image, which the webhook never places
    because it reads no Secret)."""
    with plane.client() as c:
        for i, image in enumerate(images):
            body = orjson.loads(Workload([image], work.always, work.pull_secret).body(0))
            body["metadata"] = {"name": f"w-{i}", "labels": {"app": "warm-up"}}
            c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            pods = [c.get(f"/api/v1/namespaces/{NAMESPACE}/pods/w-{i}").json()
                    for i in range(len(images))]
            if not any(g.get("name") == SCHEDULING_GATE for p in pods
                       for g in (p.get("spec") or {}).get("schedulingGates") or []):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up: not placed by the controller within {limit} s")
            time.sleep(0.2)


def wait_policy_gates(plane: ControlPlane, limit: float = 60.0) -> None:
    """With the webhook stopped, wait until a dry-run pod comes back gated: the admission
    policy is in force."""
    deadline = time.monotonic() + limit
    with plane.client(timeout=30) as c:
        while True:
            obj = c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"dryRun": "All"},
                         json=dry_run_pod("probe.invalid/unknown:1")).json()
            gates = [g.get("name") for g in (obj.get("spec") or {}).get("schedulingGates")
                     or []]
            if SCHEDULING_GATE in gates:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the admission policy did not gate within {limit} s")
            time.sleep(0.5)


#: The PodPlacementPolicy of the ``policy`` runs: every bench pod (label ``app=bench``), its
#: own weights, and a limit that removes nothing from the bench images.
BENCH_POLICY = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
                "metadata": {"name": "bench"},
                "spec": {"priority": 100, "podSelector": {"matchLabels": {"app": "bench"}},
                         "allowedArchitectures": ["amd64", "arm64"],
                         "nodeAffinityScoring": {"platforms": [
                             {"architecture": "arm64", "weight": 70}]}}}


def install_policy(plane: ControlPlane, limit: float = 60.0) -> None:
    """Create :data:`BENCH_POLICY` in the bench namespace and wait until the controller
    published it in the params object (the admission policy then reads it)."""
    with plane.client() as c:
        c.post(f"/apis/podplacement.io/v1beta1/namespaces/{NAMESPACE}/podplacementpolicies",
               json=BENCH_POLICY).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            spec = c.get(f"{PARAMS_PATH}/cluster").json().get("spec") or {}
            if (spec.get("policies") or {}).get(NAMESPACE):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the policy was not published within {limit} s")
            time.sleep(0.2)


#: A constant nodeAffinity with the shape of the product's (one required term, arch and os,
#: two preferred terms): what ``floor-place`` writes into every pod.
_FLOOR_AFFINITY = (
    "Object.spec.affinity{nodeAffinity: Object.spec.affinity.nodeAffinity{"
    "requiredDuringSchedulingIgnoredDuringExecution: "
    "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution{"
    "nodeSelectorTerms: [Object.spec.affinity.nodeAffinity."
    "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms{matchExpressions: ["
    "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
    "nodeSelectorTerms.matchExpressions{key: 'kubernetes.io/arch', operator: 'In', "
    "values: ['amd64', 'arm64']}, "
    "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
    "nodeSelectorTerms.matchExpressions{key: 'kubernetes.io/os', operator: 'In', "
    "values: ['linux']}]}]}}}"
)


def floor_policy(arm: str) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and binding of a floor arm (no product installed; no
    params, no variables, no matchConditions; every pod CREATE in the bench namespace):

    - ``floor-label``: one JSONPatch op adding one label: what the API server spends on any
      policy that mutates a pod (the policy machinery, the JSONPatch round trip through
      JSON), whatever it computes;
    - ``floor-place``: one JSONPatch writing a constant placement of the product's shape
      (``spec.affinity`` with a typed nodeAffinity, two labels, a 120-byte annotation):
      the floor of a policy that places, before any table lookup.
    """
    def labels(values: dict[str, str]) -> str:
        each = ", ".join(f"JSONPatch{{op: 'add', path: '/metadata/labels/' + "
                         f"jsonpatch.escapeKey('{k}'), value: '{v}'}}" for k, v in values.items())
        whole = ", ".join(f"'{k}': '{v}'" for k, v in values.items())
        return (f"(has(object.metadata.labels) ? [{each}] : "
                f"[JSONPatch{{op: 'add', path: '/metadata/labels', value: {{{whole}}}}}])")

    if arm == "floor-label":
        patch = labels({"bench.io/floor": "yes"})
    else:
        decision = ('{"path":"admission","platforms":["linux/amd64","linux/arm64"],'
                    '"oses":["linux"],"archs":["amd64","arm64"],"result":"set"}')
        patch = ("[JSONPatch{op: 'add', path: '/spec/affinity', value: " + _FLOOR_AFFINITY
                 + "}] + " + labels({"podplacement.io/scheduling-gate": "removed",
                                      "podplacement.io/node-affinity": "set"})
                 + " + [JSONPatch{op: 'add', path: '/metadata/annotations', value: "
                 "{'podplacement.io/decision': " + json.dumps(decision) + "}}]")
    name = f"bench-{arm}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["pods"]}]},
                 "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}]},
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "matchResources": {"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}}},
    }
    return [policy, binding]


def product_policy(plane: ControlPlane, images: Images, entries: int,
                   lookup: bool = False) -> list[dict[str, Any]]:
    """``floor-product``: deploy/ applied (CRDs, config) and the params object seeded as for
    ``warm``, then the MutatingAdmissionPolicy and binding the controller would create for
    the config (:func:`podplacement.rules.admit.admissionpolicy.desired_policy`), but no
    webhook or controller process: the cost of the product's policy alone. With
    ``lookup`` (``floor-lookup``): that policy reduced to the catalog lookup and the patch
    built from the set (:func:`lookup_policy`)."""
    from podplacement.rules.admit import admissionpolicy
    from podplacement.rules.admit.webhookconfig import webhook_namespace_selection

    install_manifests(plane, REPO / "deploy")
    seed_params(plane, entries, {i: ",".join(f"linux/{a}" for a in sorted(Images.archs(i)))
                                 for i in images.base})
    with plane.client() as c:
        config = c.get(CONFIG_PATH).json()
    policy = admissionpolicy.desired_policy(admissionpolicy.placement_config(config))
    binding = admissionpolicy.desired_binding(
        webhook_namespace_selection(config, PRODUCT_NAMESPACE),
        params_namespace=PRODUCT_NAMESPACE)
    return [lookup_policy(policy) if lookup else policy, binding]


#: The variables :func:`lookup_policy` replaces, with their constant (or minimal) CEL: what
#: a pod of the benchmark (``bench/policycost.py``'s ``pod_body``, a ``warm`` pod) needs of
#: each (one container, no init container, no image volume, no pull policy, no affinity,
#: selector or toleration of its own, no policy in its namespace, no architecture taint).
LOOKUP_CONSTANTS = {
    "images": "object.spec.containers.map(c, c.image)",
    "fresh": "{}",
    "known": "size(variables.codes) > 0 && variables.codes.all(c, c in variables.sets)",
    "free": "true",
    "policies": "[]",
    "labels": "{}",
    "matched": "[]",
    "hasPolicy": "false",
    "allowedOk": "true",
    "archTaints": "[]",
    "ownTolerations": "[]",
    "addTolerations": "[]",
}


def lookup_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """``policy`` (the generated one) without its matchConditions and with the variables of
    :data:`LOOKUP_CONSTANTS` replaced: the minimal policy that looks a benchmark pod's image
    up in the catalog and writes the product's decision from it (the variables
    it keeps and its JSONPatch expression are the product's own). A variable the generated
    policy does not declare is not added.

    Raises:
        ValueError: the policy lacks ``images`` or ``known`` (not the product's shape).
    """
    out = copy.deepcopy(policy)
    spec = out["spec"]
    spec.pop("matchConditions", None)
    declared = {str(v["name"]) for v in spec.get("variables") or []}
    if not {"images", "known"} <= declared:
        raise ValueError("the generated policy has no images/known variables")
    for variable in spec["variables"]:
        if variable["name"] in LOOKUP_CONSTANTS:
            variable["expression"] = LOOKUP_CONSTANTS[variable["name"]]
    return out


def _cel_plain(value: Any) -> str:
    """``value`` (JSON-like) as an untyped CEL literal (maps with string keys), as the
    product's policy writes label and annotation maps."""
    from podplacement.rules.admit.predicates import cel_string

    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{cel_string(str(k))}: {_cel_plain(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_cel_plain(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return cel_string(value)
    raise TypeError(f"no CEL literal for {type(value).__name__}")


def cel_patch_op(op: Mapping[str, Any]) -> str:
    """One RFC 6902 op (``add`` / ``replace`` / ``test`` / ``remove``) as a CEL ``JSONPatch``
    literal: a value under ``/spec`` typed as the pod schema's field at that path
    (``Object.spec.affinity{...}``, :func:`podplacement.rules.admit.admissionpolicy.cel_typed`,
    as the product's policy writes it), a value under ``/metadata`` an untyped map or
    string."""
    from podplacement.rules.admit.admissionpolicy import cel_typed
    from podplacement.rules.admit.predicates import cel_string

    path = str(op["path"])
    fields = f"op: {cel_string(str(op['op']))}, path: {cel_string(path)}"
    if "value" not in op:
        return f"JSONPatch{{{fields}}}"
    if path.startswith("/spec/"):
        parts = [p for p in path.split("/")[1:] if p != "-" and not p.isdigit()]
        value = cel_typed("Object." + ".".join(parts), op["value"])
    else:
        value = _cel_plain(op["value"])
    return f"JSONPatch{{{fields}, value: {value}}}"


def same_decision_ops(pod: Mapping[str, Any], platforms: Mapping[str, str],
                      config_obj: Mapping[str, Any] | None,
                      catalog_uid: str = FLOOR_CATALOG_UID) -> list[dict[str, Any]]:
    """The JSONPatch ops that write into ``pod`` (being created, no gate) what the product's
    admission policy writes for it, rendered by the product's Python rules, not copied:
    the facts of :func:`podplacement.rules.place.placement.placement_facts` (the images'
    platforms as the catalog holds them, ``platforms``: reference → ``"linux/amd64,..."``;
    the config ``config_obj``; no nodes, no policy: what the admission paths see), written
    by :func:`podplacement.rules.place.render.admission_patch` (affinity, tolerations,
    labels, annotation: the renderer whose result the policy's CEL is tested against), the
    decision annotation replaced by the policy's own record
    (:func:`podplacement.rules.admit.admissionpolicy.admission_record`, compact JSON, naming
    ``catalog_uid``).

    Raises:
        ValueError: the product would not place ``pod`` (a platform it cannot read).
    """
    from podplacement.imageinspect import ImageInfo, Platform
    from podplacement.rules.admit import admissionpolicy
    from podplacement.rules.admit.imageparams import value_pairs
    from podplacement.rules.config import DECISION_ANNOTATION
    from podplacement.rules.place.placement import (
        PlacementInputs,
        compact_json,
        placement_facts,
        unique_images,
    )
    from podplacement.rules.place.render import admission_patch

    results: dict[str, Any] = {}
    for image in unique_images(pod):
        pairs = value_pairs(platforms.get(image, "")) or []
        if not pairs:
            raise ValueError(f"{image}: no platforms")
        results[image] = ImageInfo(image, "", "", tuple(Platform(o, a) for o, a in pairs))
    config = admissionpolicy.placement_config(config_obj)
    placement = placement_facts(PlacementInputs(pod, results, config))
    if not placement.ungate or not placement.record:
        raise ValueError(f"the product would not place {pod}: {placement.record}")
    record = compact_json(admissionpolicy.admission_record(placement, catalog_uid))
    key = "/metadata/annotations/" + DECISION_ANNOTATION.replace("~", "~0").replace("/", "~1")
    ops = [dict(op) for op in admission_patch(pod, placement)]
    for op in ops:
        if op["path"] == "/metadata/annotations":
            op["value"] = {**op["value"], DECISION_ANNOTATION: record}
        elif op["path"] == key:
            op["value"] = record
    return ops


def same_decision_policy(plane: ControlPlane, images: Images, work: Workload
                         ) -> list[dict[str, Any]]:
    """``floor-same``: deploy/ applied (CRDs and config only: no process, no params object)
    and a minimal MutatingAdmissionPolicy of the benchmark's own, no params, no variables,
    no matchConditions, whose one JSONPatch expression picks, by the first container's image,
    the ops :func:`same_decision_ops` rendered for a bench pod of that image: the decision
    ``warm`` writes (the same affinity, labels and annotation, the catalog's uid aside:
    :data:`FLOOR_CATALOG_UID`), looked up in-process at the least CEL can do it. The arch
    check and :func:`decision_signature` then compare its pods with ``warm``'s."""
    install_manifests(plane, REPO / "deploy")
    with plane.client() as c:
        config = c.get(CONFIG_PATH).json()
    platforms = {i: ",".join(f"linux/{a}" for a in sorted(Images.archs(i))) for i in images.base}
    branches: list[tuple[str, str]] = []
    for image in images.base:
        index = work.images.index(image)
        pod = orjson.loads(work.body(index))
        pod["metadata"]["namespace"] = NAMESPACE
        ops = same_decision_ops(pod, platforms, config)
        branches.append((image, "[" + ", ".join(cel_patch_op(op) for op in ops) + "]"))
    from podplacement.rules.admit.predicates import cel_string

    expression = "[]"
    for image, ops_cel in reversed(branches):
        expression = (f"object.spec.containers[0].image == {cel_string(image)} ? {ops_cel} : "
                      f"{expression}")
    policy, binding = floor_policy("floor-label")
    name = "bench-floor-same"
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = name
    policy["spec"]["mutations"][0]["jsonPatch"]["expression"] = expression
    return [policy, binding]


def decision_signature(pod: Mapping[str, Any]) -> str:
    """What a placement wrote into ``pod``, as one JSON text: its affinity, tolerations,
    labels and annotations, the decision record's catalog uid replaced by
    :data:`FLOOR_CATALOG_UID` (``floor-same`` and ``warm`` read different params objects, or
    none). Equal texts: byte-identical decisions."""
    from podplacement.rules.config import DECISION_ANNOTATION

    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    raw = annotations.get(DECISION_ANNOTATION)
    if isinstance(raw, str):
        annotations[DECISION_ANNOTATION] = re.sub(
            r'"catalog":"[^"]*"', f'"catalog":"{FLOOR_CATALOG_UID}"', raw)
    return orjson.dumps({"affinity": spec.get("affinity"), "tolerations": spec.get("tolerations"),
                         "labels": meta.get("labels"), "annotations": annotations}).decode()


def install_floor(plane: ControlPlane, arm: str, limit: float = 30.0,
                  objects: list[dict[str, Any]] | None = None, image: str | None = None,
                  namespace: str = NAMESPACE) -> None:
    """Create :func:`floor_policy` (or ``objects``: a policy and its binding) and wait until
    a dry-run pod of ``image`` in ``namespace`` (labelled ``app=probe``, as a bench pod has
    labels) shows its mutation (a label of its own)."""
    base = "/apis/admissionregistration.k8s.io/v1"
    policy, binding = objects or floor_policy(arm)
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "floor-probe", "labels": {"app": "probe"}},
             "spec": {"schedulerName": "none",
                      "containers": [{"name": "c", "image": image or "probe"}]}}
    with plane.client() as c:
        c.post(f"{base}/mutatingadmissionpolicies", json=policy).raise_for_status()
        c.post(f"{base}/mutatingadmissionpolicybindings", json=binding).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            # refused (failurePolicy Fail) until the API server has the binding's policy
            got = c.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", json=probe)
            if got.is_success and set(got.json()["metadata"].get("labels") or {}) - {"app"}:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{arm}: the policy did not apply within {limit} s: "
                                   f"{got.status_code} {got.text[:300]}")
            time.sleep(0.2)


def _placed_by(path: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    return f'"path":"{path}"' in (meta.get("annotations") or {}).get(
        "podplacement.io/decision", "")


def check_pods(plane: ControlPlane, work: Workload, run: Run) -> None:
    """The arch check of every bound ``p-N`` pod: ``wrong`` (its node's os is not linux or
    its arch not one its image runs on), ``escaped`` (bound without a ``kubernetes.io/arch``
    requirement); and the pods by placement path."""
    with plane.client(timeout=120) as c:
        items = c.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json().get("items") or []
        nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
                 for n in c.get("/api/v1/nodes").json()["items"]}
    for obj in items:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if not name.startswith("p-"):
            continue  # a warm-up pod
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        raw = (meta.get("annotations") or {}).get("podplacement.io/decision")
        path = "none" if raw is None else str(orjson.loads(raw).get("path", "controller"))
        run.paths[path] += 1
        run.decisions.setdefault(work.images[int(name[2:])], set()).add(
            decision_signature(obj))
        if path == "controller":
            run.by_controller.append(int(name[2:]))
        if not node:
            continue
        run.checked += 1
        labels = nodes.get(node, {})
        image = work.images[int(name[2:])]
        if labels.get(OS_LABEL) != "linux" or labels.get(ARCH_LABEL) not in Images.archs(image):
            run.wrong += 1
        terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms") or [])
        if ARCH_LABEL not in {e.get("key") for t in terms for e in t.get("matchExpressions")
                              or []}:
            run.escaped += 1


_ADMISSIONS_RE = re.compile(r'^podplacement_webhook_admissions_total\{path="([^"]+)"\} (\S+)$',
                            re.M)


def webhook_paths(product: Product) -> dict[str, float]:
    """The webhook's ``admissions_total`` by path (non-zero ones)."""
    ctx = ssl.create_default_context(cafile=str(product.cert_dir / "ca.crt"))
    try:
        text = httpx.get(f"https://127.0.0.1:{product.webhook_port}/metrics", verify=ctx,
                         timeout=10).text
    except httpx.HTTPError:
        return {}
    return {path: float(v) for path, v in _ADMISSIONS_RE.findall(text) if float(v)}


def one_run(arm: str, args: argparse.Namespace, registry: Registry, images: Images,
            work_dir: Path) -> Run:
    """Start a fresh control plane (+ the product for a scenario), run, collect, stop."""
    plane = start_control_plane(locate_assets(), work_dir / f"{arm}-plane",
                                audit=not args.no_audit)
    product: Product | None = None
    floor_hook: subprocess.Popen[bytes] | None = None
    run = Run(arm, args.pods)
    secret = "bench-pull" if args.private else None
    work = workload("warm" if arm in ("bare", *WARM_ARMS, *FLOOR_ARMS) else arm, images,
                    args.pods, secret)
    try:
        # Room for every pod on the nodes of each architecture: the limit measured is the
        # control plane's, never the nodes' pod capacity (500 by default).
        room = str(max(500, args.pods))
        add_nodes(plane, [dataclasses.replace(n, pods=room) for n in DEFAULT_NODES])
        with plane.client() as c:
            c.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
            deadline = time.monotonic() + 20
            while c.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"
                        ).status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            if secret:
                c.post(f"/api/v1/namespaces/{NAMESPACE}/secrets",
                       json=pull_secret(registry, secret)).raise_for_status()
        if arm in ("floor-product", "floor-lookup"):
            install_floor(plane, arm, objects=product_policy(plane, images, args.params_entries,
                                                             lookup=arm == "floor-lookup"),
                          image=images.base[0])
        elif arm == "floor-same":
            install_floor(plane, arm, objects=same_decision_policy(plane, images, work),
                          image=images.base[0])
        elif arm == "floor-webhook":
            floor_hook = start_floor_webhook(plane, work_dir / "floorhook")
        elif arm in FLOOR_ARMS:
            install_floor(plane, arm)
        elif arm != "bare":
            product = _set_up_product(arm, args, plane, registry, images, work, work_dir)
        specs = (_write_specs(plane, work, args.pods, args.procs,
                              1 if args.light else args.clients, work_dir)
                 if args.loadgen == "processes" else [])
        before: dict[str, tuple[float, int]] = {}
        since = datetime.now().astimezone()
        self_cpu0 = _self_cpu()

        def on_start() -> None:
            procs = _processes(plane, product, registry, floor_hook)
            before.update({name: proc_stats(pid) for name, pid in procs.items()})

        asyncio.run(create_and_watch(plane, work, args.pods, args, run, specs, args.limit,
                                     on_start))
        time.sleep(2.0)  # writes that trail the last binding (Events) still count
        until = datetime.now().astimezone()
        after = {name: proc_stats(pid)
                 for name, pid in _processes(plane, product, registry, floor_hook).items()}
        run.bench_cpu += _self_cpu() - self_cpu0
        run.processes = {name: (after[name][0] - before.get(name, (0.0, 0))[0], after[name][1])
                         for name in after}
        if product is not None:
            run.webhook_paths = webhook_paths(product)
        if not args.no_audit:
            time.sleep(2.5)  # the audit backend flushes batches every second
            run.requests = count_audit(plane, since, until)
        check_pods(plane, work, run)
    finally:
        if product is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(product.webhook.popen.pid, signal.SIGCONT)
            product.stop()
        if floor_hook is not None:
            floor_hook.terminate()
            floor_hook.wait(10)
        plane.stop()
    return run


def start_floor_webhook(plane: ControlPlane, work_dir: Path,
                        limit: float = 30.0) -> subprocess.Popen[bytes]:
    """Start :mod:`bench.floorhook` on a free port of 127.0.0.1 with a serving certificate of
    a fresh CA, register it for the bench namespace's pod CREATEs (failurePolicy Fail), and
    wait until a dry-run pod shows its label."""
    from podplacement.certs import generate_ca, issue_serving_cert
    from podplacement.sandbox.ports import free_port

    work_dir.mkdir(parents=True, exist_ok=True)
    ca = generate_ca("bench-floor-ca")
    serving = issue_serving_cert(ca, [], ["127.0.0.1"])
    (work_dir / "tls.crt").write_bytes(serving.cert_pem)
    (work_dir / "tls.key").write_bytes(serving.key_pem)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("floorhook.py")),
                             "--port", str(port), "--cert", str(work_dir / "tls.crt"),
                             "--key", str(work_dir / "tls.key")])
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration", "metadata": {"name": "bench-floor"},
        "webhooks": [{
            "name": "floor.bench.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 10,
            "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate",
                             "caBundle": base64.b64encode(ca.cert_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": NAMESPACE}}}]}
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "floor-probe",
                                                             "labels": {"app": "probe"}},
             "spec": {"containers": [{"name": "c", "image": "probe"}]}}
    with plane.client() as c:
        c.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
               json=config).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            r = c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"dryRun": "All"},
                       json=probe)
            if r.status_code == 201 and (r.json()["metadata"].get("labels") or {}).get(
                    "bench.io/floor") == "webhook":
                return proc
            if time.monotonic() > deadline:
                proc.terminate()
                raise RuntimeError(f"the floor webhook did not answer: {r.status_code} "
                                   f"{r.text[:600]}")
            time.sleep(0.2)


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _set_up_product(scenario: str, args: argparse.Namespace, plane: ControlPlane,
                    registry: Registry, images: Images, work: Workload,
                    work_dir: Path) -> Product:
    install_manifests(plane, REPO / "deploy")
    admission: dict[str, Any] = {}
    if scenario == "webhook-warm":
        admission["mechanism"] = "Webhook"
    if scenario == "controller":
        admission["fastPaths"] = "Disabled"
    if args.inspection_budget is not None:
        admission["inspectionBudget"] = args.inspection_budget
    if scenario == "always-webhook":
        admission["pullAlwaysFreshness"] = "0s"
    spec: dict[str, Any] = {"admission": admission} if admission else {}
    if scenario == "warm-nomonitor":
        spec["plugins"] = {"execFormatErrorMonitor": {"enabled": False}}
    if spec:
        with plane.client() as c:
            c.patch(CONFIG_PATH, json={"spec": spec},
                    headers={"Content-Type": "application/merge-patch+json"}
                    ).raise_for_status()
    warm = scenario in WARM_ARMS
    if scenario not in ("webhook-warm", "skewed"):  # skewed: the catalog starts empty
        known = ({i: ",".join(f"linux/{a}" for a in sorted(Images.archs(i)))
                  for i in images.base} if warm else {})
        seed_params(plane, len(known) if scenario == "warm-small" else args.params_entries,
                    known)
    options = ["--insecure-registry", registry.host]
    if registry.ca_pem is not None:
        ca = work_dir / "registry-ca.pem"
        ca.write_bytes(registry.ca_pem)
        options = ["--ca-file", f"{registry.host}={ca}"]
    product = start_product(plane, work_dir / f"{scenario}-product",
                            controller_options=[*options, *args.controller_option],
                            webhook_options=options)
    try:
        if scenario == "warm-policy":
            install_policy(plane)
        if warm:
            warm_up(plane, work, images.base, path="admission", create=False)
        elif scenario == "always":
            # the steady state: the controller checks the tags and publishes them as fresh
            warm_up(plane, work, images.base, path="admission", create=True, dry_always=True)
        elif scenario == "always-webhook":
            warm_up(plane, work, images.base, path="admission", create=True)
        elif scenario == "webhook-warm":
            warm_up(plane, work, images.base, path="webhook", create=True)
        elif scenario == "private":
            warm_up_controller(plane, work, images.base)
        elif scenario == "webhook-stopped":
            os.kill(product.webhook.popen.pid, signal.SIGSTOP)
            wait_policy_gates(plane)
    except BaseException:
        product.stop()
        raise
    return product


def _processes(plane: ControlPlane, product: Product | None, registry: Registry,
               floor_hook: subprocess.Popen[bytes] | None = None) -> dict[str, int]:
    procs = {name: p.pid for name, p in plane.processes.items()}
    if floor_hook is not None:
        procs["webhook"] = floor_hook.pid
    if product is not None:
        procs["webhook"] = product.webhook.popen.pid
        for i, p in enumerate(product.controllers):
            procs[f"controller-{i}"] = p.popen.pid
    if registry._process is not None:
        procs["registry"] = registry._process.pid
    return procs


# --- report -----------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def _join(values: list[float], fmt: str, *, median: bool = False) -> str:
    """``values`` formatted with ``fmt``, comma-separated, with their median in brackets."""
    text = ", ".join(fmt.format(v) for v in values)
    return f"{text} ({fmt.format(_median(values))})" if median else text


def report(rounds: list[dict[str, Run]], scenarios: list[str], args: argparse.Namespace) -> None:
    """Print every arm of every round, then per scenario the ratios to bare, the
    kube-apiserver CPU the product adds per pod and (with ``warm``) the gap to warm."""
    pods = args.pods
    mode = "light (1 client, one pod at a time)" if args.light else (
        f"{args.clients} connections over {args.procs} load-generator processes"
        if args.loadgen == "processes" else f"{args.clients} httpx clients in-process")
    print(f"\n== {pods} pods per arm, {len(rounds)} round(s), {mode}")
    print(f"{'round':<6}{'arm':<16}{'bound/s':>8}{'ratio':>7}{'apiserver':>10}{'+ms/pod':>8}"
          f"{'bench CPU':>10}{'create p50':>11}{'p99':>7}{'→ungate p50':>12}{'→bound p50':>11}"
          f"{'p99':>7}{'wrong':>6}{'esc.':>5}{'fail':>5}")
    for r, arms in enumerate(rounds):
        bare = arms["bare"]
        for name in ["bare", *scenarios]:
            run = arms[name]
            ratio = run.bound_per_s / bare.bound_per_s if bare.bound_per_s else float("nan")
            added = (run.cpu("kube-apiserver") - bare.cpu("kube-apiserver")) * 1000 / pods
            print(f"{r + 1:<6}{name:<16}{run.bound_per_s:>8.1f}"
                  f"{'' if name == 'bare' else f'{ratio:.2f}':>7}"
                  f"{run.cpu('kube-apiserver'):>9.1f}s"
                  f"{'' if name == 'bare' else f'{added:+.2f}':>8}"
                  f"{run.bench_cpu:>9.2f}s{pct(run.create_latency, .5):>9.1f}ms"
                  f"{pct(run.create_latency, .99):>5.0f}ms{pct(run.to_ungate, .5):>10.1f}ms"
                  f"{pct(run.to_bound, .5):>9.1f}ms{pct(run.to_bound, .99):>5.0f}ms"
                  f"{run.wrong:>6}{run.escaped:>5}{run.failed_creates:>5}")
    bare_rates = _join([arms["bare"].bound_per_s for arms in rounds], "{:.1f}")
    bench_cpu = _join([arms["bare"].bench_cpu for arms in rounds], "{:.2f}")
    totals = _join([arms["bare"].loadgen_cpu_total for arms in rounds], "{:.2f}")
    print(f"\nbare: {bare_rates} pods/s; the benchmark's own CPU in those runs: {bench_cpu} s "
          f"(load generators {totals} s in all, serialization and start-up included)")
    print(f"\n{'scenario':<16}{'ratio to bare per round (median)':<40}"
          f"{'apiserver +ms/pod (median)':<34}{'vs warm (median)':<24}")
    for name in scenarios:
        ratios = [arms[name].bound_per_s / arms["bare"].bound_per_s
                  if arms["bare"].bound_per_s else float("nan") for arms in rounds]
        added = [(arms[name].cpu("kube-apiserver") - arms["bare"].cpu("kube-apiserver"))
                 * 1000 / pods for arms in rounds]
        vs_warm = ""
        if "warm" in scenarios and name != "warm":
            vs_warm = _join([ratio - arms["warm"].bound_per_s / arms["bare"].bound_per_s
                             for ratio, arms in zip(ratios, rounds, strict=True)], "{:+.2f}",
                            median=True)
        print(f"{name:<16}{_join(ratios, '{:.2f}', median=True):<40}"
              f"{_join(added, '{:+.2f}', median=True):<34}{vs_warm}")
    if not args.light:
        report_host_cpu(rounds, scenarios, pods)
        report_floor(rounds, scenarios, pods)
    else:
        added_p50 = {name: _median([pct(a[name].create_latency, .5)
                                    - pct(a["bare"].create_latency, .5) for a in rounds])
                     for name in scenarios}
        bare_p50 = _median([pct(a["bare"].create_latency, .5) for a in rounds])
        print(f"\ncreate latency p50, bare {bare_p50:.1f} ms; added by the product (median "
              "over rounds): " + ", ".join(f"{n} {v:+.1f} ms" for n, v in added_p50.items()))
    last = rounds[-1]
    print("\nlast round, per arm: CPU seconds of each process during the run; the webhook's "
          "admissions by path; pods by decision path; requests per pod by podplacement")
    for name in ["bare", *scenarios]:
        run = last[name]
        cpu = ", ".join(f"{p} {c:.1f}" for p, (c, _) in sorted(run.processes.items()))
        print(f"  {name}: CPU s: {cpu}, bench {run.bench_cpu:.2f}")
        if name != "bare":
            extra = Counter[str]()
            for (user, verb), count in run.requests.items():
                if user.startswith(f"system:serviceaccount:{PRODUCT_NAMESPACE}:"):
                    extra[f"{user.rsplit(':', 1)[1]} {verb}"] += count
            print(f"    webhook admissions: {run.webhook_paths}; decision paths: "
                  f"{dict(run.paths)}; checked {run.checked}, wrong {run.wrong}, "
                  f"escaped {run.escaped}")
            if run.by_controller and run.paths.get("webhook"):
                # when the pods the webhook left to the controller were created
                spots = sorted(run.by_controller)
                print(f"    pods left to the controller, by creation order: first {spots[0]}, "
                      f"median {spots[len(spots) // 2]}, last {spots[-1]} (of {pods})")
            if extra:
                print("    requests per pod by podplacement: " + ", ".join(
                    f"{k} {v / pods:.3f}" for k, v in sorted(extra.items())))
    bad = [(r + 1, name) for r, arms in enumerate(rounds) for name in scenarios
           if (name not in FLOOR_ARMS or name in PLACING_FLOORS)
           and (arms[name].wrong or arms[name].escaped)]
    print("\nno wrong placement" if not bad else f"\n! WRONG PLACEMENTS in {bad}")


def save(rounds: list[dict[str, Run]], path: Path) -> None:
    """Write ``rounds`` as JSON to ``path``: per round, per arm, the pods bound per second,
    the CPU seconds of every process and the benchmark's own, the wrong and escaped pods."""
    path.write_text(json.dumps([{name: {
        "bound_per_s": run.bound_per_s, "pods": run.pods, "wall": run.wall,
        "cpu": {p: c for p, (c, _) in run.processes.items()}, "bench_cpu": run.bench_cpu,
        "wrong": run.wrong, "escaped": run.escaped, "webhook_paths": run.webhook_paths,
    } for name, run in arms.items()} for arms in rounds], indent=1))


#: The process groups of :func:`report_host_cpu`, in its column order.
HOST_GROUPS = ("kube-apiserver", "etcd", "scheduler+kcm", "webhook", "controller", "registry",
               "bench")


def group_cpu(processes: Mapping[str, float], bench_cpu: float) -> dict[str, float]:
    """CPU seconds per group of :data:`HOST_GROUPS` from CPU seconds per process name (as
    :func:`save` writes them, ``cpu``) and the benchmark's own CPU seconds; pure (also read by
    ``bench/plots.py``)."""
    out = dict.fromkeys(HOST_GROUPS, 0.0)
    for name, seconds in processes.items():
        group = ("scheduler+kcm" if name in ("kube-scheduler", "kube-controller-manager")
                 else "controller" if name.startswith("controller-")
                 else name if name in out else "bench")
        out[group] += seconds
    out["bench"] += bench_cpu
    return out


def host_cpu(run: Run) -> dict[str, float]:
    """CPU seconds of one arm per group of :data:`HOST_GROUPS` (every process this machine
    ran for it, the benchmark and its load generators included)."""
    return group_cpu({name: seconds for name, (seconds, _) in run.processes.items()},
                     run.bench_cpu)


#: The control plane's processes: what a cluster's control-plane nodes run.
PLANE = ("kube-apiserver", "etcd", "scheduler+kcm")


def _cpu_model(arms: dict[str, Run], name: str, registry: bool,
               only: tuple[str, ...] = HOST_GROUPS) -> float:
    """Bare's CPU over arm ``name``'s in one round: of the groups ``only`` (every process by
    default), without the registry's when ``registry`` is False."""
    bare, arm = host_cpu(arms["bare"]), host_cpu(arms[name])
    if not registry:
        bare["registry"] = arm["registry"] = 0.0
    total = sum(arm[g] for g in only)
    return sum(bare[g] for g in only) / total if total else float("nan")


def report_host_cpu(rounds: list[dict[str, Run]], scenarios: list[str], pods: int) -> None:
    """Print, per arm, the CPU milliseconds per pod of every process on this machine (median
    over rounds) and what that CPU predicts: with the 2 cores saturated, an arm's rate over
    bare's is bare's CPU per pod over the arm's (the *CPU model* column, next to the measured
    median), the same model without the local registry's CPU (a registry a real cluster
    runs on other machines), and with the control plane's CPU alone (*plane*: the webhook's
    replicas, the controller and the registry elsewhere, the API server the bottleneck)."""
    print("\nCPU ms per pod of every process on this machine (median over rounds); CPU model: "
          "bare's total over the arm's, then the same without the registry")
    print(f"{'arm':<16}" + "".join(f"{g:>15}" for g in (*HOST_GROUPS, "total"))
          + f"{'measured':>10}{'CPU model':>10}{'w/o reg.':>9}{'plane':>7}")
    for name in ["bare", *scenarios]:
        per = {g: _median([host_cpu(a[name])[g] * 1000 / pods for a in rounds])
               for g in HOST_GROUPS}
        total = _median([sum(host_cpu(a[name]).values()) * 1000 / pods for a in rounds])
        line = f"{name:<16}" + "".join(f"{per[g]:>15.2f}" for g in HOST_GROUPS)
        line += f"{total:>15.2f}"
        if name != "bare":
            measured = _median([a[name].bound_per_s / a["bare"].bound_per_s
                                if a["bare"].bound_per_s else float("nan") for a in rounds])
            line += (f"{measured:>10.2f}"
                     f"{_median([_cpu_model(a, name, True) for a in rounds]):>10.2f}"
                     f"{_median([_cpu_model(a, name, False) for a in rounds]):>9.2f}"
                     f"{_median([_cpu_model(a, name, False, PLANE) for a in rounds]):>7.2f}")
        print(line)


def same_decisions(warm: Run, floor: Run) -> str:
    """Whether ``floor`` wrote into its pods exactly the decisions ``warm`` wrote into its
    own, image by image (:func:`decision_signature`): ``"yes (N images)"``, or what
    differs."""
    if not warm.decisions or not floor.decisions:
        return "not checked (no bound pods)"
    bad = [image for image in sorted(set(warm.decisions) | set(floor.decisions))
           if warm.decisions.get(image) != floor.decisions.get(image)
           or len(warm.decisions.get(image) or ()) != 1]
    if not bad:
        return f"yes ({len(warm.decisions)} images)"
    image = bad[0]
    return (f"NO for {len(bad)} image(s); {image}: warm {sorted(warm.decisions.get(image, []))}"
            f" floor {sorted(floor.decisions.get(image, []))}")


def ours_ms(run: Run, pods: int) -> float:
    """CPU milliseconds per pod of our processes (the webhook and every controller)."""
    cpu = host_cpu(run)
    return (cpu["webhook"] + cpu["controller"]) * 1000 / pods


def report_floor(rounds: list[dict[str, Run]], scenarios: list[str], pods: int) -> None:
    """With ``warm`` and the floors of :data:`FLOOR_REFERENCE` in the run (each of
    ``floor-same`` and ``floor-lookup`` that ran, else ``floor-place``): per round, warm's
    pods bound/s over the floor's in the same round (the issue's "warm at the floor"
    figure) and its median, the same predicted by the CPU (the floor's CPU per pod, every
    process, over warm's), kube-apiserver's CPU per pod in both, our processes' CPU per
    warm pod, whether the floor wrote the same decisions (:func:`same_decisions`), then the
    CPU milliseconds per pod of every process of both arms, round by round."""
    floors = [f for f in FLOOR_REFERENCE[:2] if f in scenarios] or [
        f for f in FLOOR_REFERENCE[2:] if f in scenarios][:1]
    if "warm" not in scenarios:
        return
    for floor in floors:
        _report_floor(rounds, floor, pods)


def _report_floor(rounds: list[dict[str, Run]], floor: str, pods: int) -> None:
    """:func:`report_floor` for one floor arm."""
    print(f"\n== warm at the floor: warm over {floor} in the same round (ms are CPU per pod)")
    print(f"{'round':<6}{'warm/s':>8}{'floor/s':>8}{'warm/floor':>11}{'CPU model':>10}"
          f"{'apiserver warm':>15}{'floor':>7}{'ours (warm)':>12}  same decision")
    ratios, models, ours, api_diffs, total_diffs = [], [], [], [], []
    for r, arms in enumerate(rounds):
        w, f = arms["warm"], arms[floor]
        ratio = w.bound_per_s / f.bound_per_s if f.bound_per_s else float("nan")
        ratios.append(ratio)
        # with the cores saturated, warm's rate over the floor's is the floor's CPU per pod
        # (every process) over warm's: steadier than the rates on a shared machine
        warm_cpu = sum(host_cpu(w).values())
        models.append(sum(host_cpu(f).values()) / warm_cpu if warm_cpu else float("nan"))
        ours.append(ours_ms(w, pods))
        api_diffs.append((w.cpu("kube-apiserver") - f.cpu("kube-apiserver")) * 1000 / pods)
        total_diffs.append((warm_cpu - sum(host_cpu(f).values())) * 1000 / pods)
        print(f"{r + 1:<6}{w.bound_per_s:>8.1f}{f.bound_per_s:>8.1f}{ratio:>11.2f}"
              f"{models[-1]:>10.2f}{w.cpu('kube-apiserver') * 1000 / pods:>15.2f}"
              f"{f.cpu('kube-apiserver') * 1000 / pods:>7.2f}{ours[-1]:>12.2f}  "
              f"{same_decisions(w, f) if floor in PLACING_FLOORS else 'n/a (constant placement)'}")
    print(f"median warm/floor {_median(ratios):.2f}, CPU model {_median(models):.2f} (target "
          f">= 0.95); our processes {_median(ours):.2f} ms CPU per warm pod (median)")
    # the measure proposed for the last step (docs/benchmarks.md): what warm costs the
    # API server, and every process, per pod beyond the floor, round by round
    print(f"warm - {floor}, CPU ms per pod, median of per-round differences: kube-apiserver "
          f"{_median(api_diffs):+.2f} (rounds {', '.join(f'{d:+.2f}' for d in api_diffs)}); "
          f"every process {_median(total_diffs):+.2f}")
    names = sorted({n for arms in rounds for a in ("bare", "warm", floor)
                    for n in arms[a].processes} | {"bench"})
    print("CPU ms per pod of every process, per round (" + ", ".join(names) + ")")
    for arm in ("bare", "warm", floor):
        rows = []
        for arms in rounds:
            run = arms[arm]
            rows.append(" ".join(
                f"{(run.bench_cpu if n == 'bench' else run.cpu(n)) * 1000 / pods:.2f}"
                for n in names))
        print(f"  {arm:<12}" + " | ".join(rows))


def report_policy(bare: list[Run], product: list[Run], policy: list[Run]) -> None:
    """Print the ``policy`` runs' ratio to bare next to the product's, round by round."""
    print("\n== with a PodPlacementPolicy matching every pod (same rounds)")
    diffs = []
    for i, (b, p, q) in enumerate(zip(bare, product, policy, strict=True)):
        without = p.bound_per_s / b.bound_per_s if b.bound_per_s else float("nan")
        with_policy = q.bound_per_s / b.bound_per_s if b.bound_per_s else float("nan")
        diffs.append(with_policy - without)
        print(f"round {i + 1}: bound/s bare {b.bound_per_s:.1f}, product {p.bound_per_s:.1f} "
              f"(ratio {without:.2f}), with policy {q.bound_per_s:.1f} (ratio "
              f"{with_policy:.2f}); difference {with_policy - without:+.2f}; placed by path "
              f"{dict(q.paths)}; escaped {q.escaped}")
        cpu = {name: (p.processes.get(name, (0.0, 0))[0], q.processes.get(name, (0.0, 0))[0])
               for name in ("kube-apiserver", "webhook", "controller-0")}
        print("  CPU seconds without / with the policy: " + ", ".join(
            f"{name} {a:.1f} / {b:.1f}" for name, (a, b) in cpu.items()))
    print(f"median difference of the ratios (with policy - without): "
          f"{statistics.median(diffs):+.2f}")


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the rounds, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--scenario", default="warm",
                    help=f"comma-separated, of {', '.join(SCENARIOS)} (default warm)")
    ap.add_argument("--pods", type=int, default=2000, help="pods per arm (default 2000)")
    ap.add_argument("--clients", type=int, default=16,
                    help="keep-alive connections in all (default 16)")
    ap.add_argument("--procs", type=int, default=2,
                    help="load-generator processes (default 2)")
    ap.add_argument("--loadgen", choices=("processes", "inprocess"), default="processes",
                    help="pre-serialized bodies in load-generator processes (default), or "
                         "httpx from this process (the former generator)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--light", action="store_true",
                    help="1 connection, pods created one at a time (default --pods 200)")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="seconds to wait for every pod to be bound (default 300)")
    ap.add_argument("--skew-tags", type=int, default=SKEW_TAGS,
                    help=f"tags of the skewed scenario (default {SKEW_TAGS}; Zipf s={SKEW_S}, "
                         f"{SKEW_ALWAYS * 100:.0f}%% Always)")
    ap.add_argument("--params-entries", type=int, default=5000,
                    help="entries of the params object with mechanism Auto (default 5000)")
    ap.add_argument("--inspection-budget", default=None, metavar="DURATION",
                    help="spec.admission.inspectionBudget of the product arms (default: the "
                         "CRD's, 300ms)")
    ap.add_argument("--no-audit", action="store_true",
                    help="no audit log (no requests-per-pod figures)")
    ap.add_argument("--save", type=Path, default=None, metavar="FILE",
                    help="also write every round's figures per arm as JSON (rates, CPU "
                         "seconds per process) to FILE")
    ap.add_argument("--controller-option", action="append", default=[],
                    help="extra option for podplacement controller (repeatable)")
    args = ap.parse_args(argv)
    scenarios = [s for s in args.scenario.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        ap.error(f"unknown scenario {unknown}; choose from {', '.join(SCENARIOS)}")
    if "private" in scenarios and len(scenarios) > 1:
        ap.error("private uses its own registry (htpasswd, TLS): run it alone")
    if args.light:
        if "--pods" not in (argv if argv is not None else sys.argv):
            args.pods = 200
        args.clients, args.procs = 1, 1
    args.procs = max(1, min(args.procs, args.clients))
    args.private = scenarios == ["private"]
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    registry = (start_registry(work / "registry", tls=True, auth="basic") if args.private
                else start_registry(work / "registry", quiet=True))
    try:
        images = push_images(registry, args.pods, "new-images" in scenarios,
                             "cold-burst" in scenarios,
                             args.skew_tags if "skewed" in scenarios else 0)
        rounds: list[dict[str, Run]] = []
        for r in range(args.rounds):
            order = ["bare", *scenarios]
            order = order[r % len(order):] + order[:r % len(order)]
            arms: dict[str, Run] = {}
            for arm in order:
                print(f"round {r + 1}: {arm}", file=sys.stderr)
                arms[arm] = one_run(arm, args, registry, images, work / f"r{r}")
                print(f"  {arms[arm].bound_per_s:.1f} pods/s, bench CPU "
                      f"{arms[arm].bench_cpu:.2f} s, kube-apiserver CPU "
                      f"{arms[arm].cpu('kube-apiserver'):.1f} s", file=sys.stderr)
            rounds.append(arms)
            if args.save is not None:
                save(rounds, args.save)
        report(rounds, scenarios, args)
    finally:
        registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

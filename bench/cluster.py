"""Cluster benchmark on the real control plane: what users feel, as a ratio to bare.

Each round starts a fresh real control plane (etcd, kube-apiserver with an audit log at level
Metadata, kube-scheduler with client limits raised, kube-controller-manager; fake Ready nodes
of every architecture), then creates ``--pods`` pods (default 2,000) with ``--clients``
concurrent clients (default 16), each pod with one of three images in a local registry (an
index amd64+arm64, a single amd64 and a single arm64 manifest). It runs ``bare`` (nothing
installed) and ``product`` (``kubectl apply -k deploy/``, then the webhook and the controller
as deploy/'s ServiceAccounts, see :mod:`podplacement.sandbox.product`), interleaved round by
round, and prints for each:

- pods bound per second (first create sent → last pod bound) and the ratio product/bare of
  the same round;
- p50/p99 from create sent to ungated (product) and to bound, seen on one pod watch;
- API requests per pod by user and verb, from the audit log (every request received from the
  first create until 2 s after the last pod was bound);
- CPU seconds and peak RSS of every process (from ``/proc``).

``--light`` creates pods one at a time (1 client) and prints the create latency and
create-to-bound latency, and what the product adds to each.

``--scenario`` picks what the product run measures:

- ``cold`` (default): the images are new to the product: every pod is gated (by the
  MutatingAdmissionPolicy ``podplacement-gate``) and placed by the controller's PATCH;
- ``warm``: the images were placed once before the run (one pod each, in another namespace),
  so the controller published them in the policy's params object, which also holds filler
  entries up to ``--params-entries`` (default 5,000): the policy places every pod at
  admission, with no second write;
- ``private``: the images are in a registry that needs a login (htpasswd, TLS) and every pod
  names a pull secret; one pod of each was placed before the run, so the webhook's own
  cache knows them for that namespace and secret: the policy gates, the webhook places at
  admission (removes the gate), no second write;
- ``controller``: ``spec.admission.fastPaths: Disabled``: every pod is gated and placed by
  the controller's PATCH (the path of truly cold images, one new image per pod);
- ``webhook-stopped``: the webhook is stopped (SIGSTOP) for the whole run: the policy still
  gates every pod, the controller places them.

``--with-policy`` adds a third run per round, ``policy``: the product as in the scenario, and
a PodPlacementPolicy in the bench namespace whose selector matches every bench pod (its own
weights, and ``allowedArchitectures`` that remove nothing from the bench images), so the
admission policy's place branch reads it for every pod; the report adds its ratio to bare
and the difference to the product run without a policy, in the same round.

After each run every pod is checked: one bound without a node affinity requirement on
``kubernetes.io/arch`` escaped placement (printed; there must be none).

Usage: ``python bench/cluster.py [--pods 2000] [--clients 16] [--rounds 1] [--light]
[--scenario cold|warm|private|controller|webhook-stopped] [--params-entries 5000]
[--with-policy]``
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
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402

from controller.config import SCHEDULING_GATE  # noqa: E402
from controller.paramswriter import params_collection_path  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    DEFAULT_NODES,
    ControlPlane,
    add_nodes,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.product import NAMESPACE as PRODUCT_NAMESPACE  # noqa: E402
from podplacement.sandbox.product import Product, install_manifests, start_product  # noqa: E402
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402

REPO = Path(_ROOT)
NAMESPACE = "bench"


@dataclass
class Run:
    """Figures of one run."""

    mode: str
    pods: int
    wall: float = 0.0
    create_latency: list[float] = field(default_factory=list)
    to_ungate: list[float] = field(default_factory=list)
    to_bound: list[float] = field(default_factory=list)
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    processes: dict[str, tuple[float, int]] = field(default_factory=dict)
    escaped: int = 0
    paths: Counter[str] = field(default_factory=Counter)

    @property
    def bound_per_s(self) -> float:
        return len(self.to_bound) / self.wall if self.wall else 0.0


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


def push_images(registry: Registry) -> list[str]:
    """The three images of the benchmark; returns their references."""
    p = Pusher(registry)
    try:
        p.multiarch("bench/multi", "v1", ["linux/amd64", "linux/arm64"])
        p.image("bench/amd", "v1", architecture="amd64")
        p.image("bench/arm", "v1", architecture="arm64")
    finally:
        p.close()
    return [f"{registry.host}/bench/{r}:v1" for r in ("multi", "amd", "arm")]


#: The pull secret of the ``private`` scenario (set when that registry is used).
PULL_SECRET: str | None = None


def pod(i: int, image: str) -> dict[str, Any]:
    """Pod ``p-i`` with one container of ``image`` (and the pull secret, if any)."""
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}],
                            "terminationGracePeriodSeconds": 0}
    if PULL_SECRET:
        spec["imagePullSecrets"] = [{"name": PULL_SECRET}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i}",
                                                            "labels": {"app": "bench"}},
            "spec": spec}


def pull_secret(registry: Registry) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` Secret for ``registry``'s login."""
    auth = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": PULL_SECRET},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}}


async def create_and_watch(plane: ControlPlane, n: int, clients: int, images: list[str],
                           run: Run, limit: float) -> None:
    """Create ``n`` pods with ``clients`` concurrent clients while one watch records when
    each is ungated and bound (bounded by ``limit`` seconds)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}", "Content-Type": "application/json"}
    sent: dict[str, float] = {}
    ungated: dict[str, float] = {}
    bound: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=plane.url, verify=ctx, headers=headers,
                                 timeout=60, limits=httpx.Limits(
                                     max_connections=clients + 2)) as c:
        base = f"/api/v1/namespaces/{NAMESPACE}/pods"
        rv = (await c.get(base)).json()["metadata"]["resourceVersion"]
        done = asyncio.Event()

        async def watch() -> None:
            # Resumed from the last resourceVersion when the stream ends or breaks (the
            # client is busy creating pods meanwhile; a lost stream must not lose bindings).
            last_rv = rv
            while not done.is_set():
                try:
                    async with c.stream("GET", base, params={
                            "watch": "1", "resourceVersion": last_rv,
                            "allowWatchBookmarks": "true",
                            "timeoutSeconds": str(int(limit))}, timeout=None) as r:
                        async for line in r.aiter_lines():
                            if not line:
                                continue
                            obj = json.loads(line).get("object") or {}
                            meta = obj.get("metadata") or {}
                            last_rv = meta.get("resourceVersion") or last_rv
                            name = meta.get("name")
                            if name and not name.startswith("p-"):
                                continue  # a warm-up pod
                            spec = obj.get("spec") or {}
                            now = time.monotonic()
                            gates = [g.get("name") for g in spec.get("schedulingGates") or []]
                            if name and SCHEDULING_GATE not in gates:
                                ungated.setdefault(name, now)
                            if name and spec.get("nodeName"):
                                bound.setdefault(name, now)
                                if len(bound) >= n:
                                    done.set()
                                    return
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    print(f"  (pod watch: {type(exc).__name__}: {exc}; resuming)",
                          file=sys.stderr)
                    await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                name = f"p-{i}"
                t0 = time.monotonic()
                sent[name] = t0
                r = await c.post(base, content=json.dumps(pod(i, images[i % len(images)])))
                r.raise_for_status()
                run.create_latency.append(time.monotonic() - t0)

        start = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        try:
            await asyncio.wait_for(done.wait(), limit)
        except TimeoutError:
            print(f"  ! {run.mode}: {len(bound)} of {n} bound within {limit:.0f} s",
                  file=sys.stderr)
        watcher.cancel()
        run.wall = (max(bound.values()) - start) if bound else 0.0
    run.to_bound = [bound[k] - sent[k] for k in bound if k in sent]
    run.to_ungate = [ungated[k] - sent[k] for k in ungated if k in sent and
                     ungated[k] > sent[k]]


def count_audit(plane: ControlPlane, since: datetime, until: datetime) -> Counter[
        tuple[str, str]]:
    """Requests by (user, verb) received in [since, until] (one per audit ID)."""
    assert plane.audit_log is not None
    seen: set[str] = set()
    out: Counter[tuple[str, str]] = Counter()
    for path in sorted(plane.audit_log.parent.glob(plane.audit_log.name + "*")):
        with path.open() as f:
            for line in f:
                ev = json.loads(line)
                if ev["auditID"] in seen:
                    continue
                t = datetime.fromisoformat(ev["requestReceivedTimestamp"])
                if since <= t <= until:
                    seen.add(ev["auditID"])
                    out[(ev["user"]["username"], ev["verb"])] += 1
    return out


PARAMS_PATH = params_collection_path(PRODUCT_NAMESPACE)


def seed_params(plane: ControlPlane, entries: int) -> None:
    """Create the params object ImagePlatforms ``cluster`` with ``entries`` filler images
    (~110-character references by digest) before the controller starts: it adopts them, so
    the policy reads a full-size object during the run. By digest, because a tag reference
    also has a ``spec.learned`` item, and 5,000 long tag references with theirs exceed the
    controller's 1 MB bound (it would evict some on adoption)."""
    images = {f"registry.example.internal/t{i % 50:02d}/s{i:05d}@sha256:"
              + hashlib.sha256(str(i).encode()).hexdigest(): "linux/amd64,linux/arm64"
              for i in range(max(0, entries))}
    with plane.client() as c:
        r = c.post(PARAMS_PATH, json={"apiVersion": "podplacement.io/v1beta1",
                                      "kind": "ImagePlatforms",
                                      "metadata": {"name": "cluster",
                                                   "namespace": PRODUCT_NAMESPACE},
                                      "spec": {"images": images}})
        r.raise_for_status()


def warm_up(plane: ControlPlane, images: list[str], *, path: str = "admission",
            namespace: str = "bench-warm", limit: float = 120.0) -> None:
    """Place one pod of each image (in ``namespace``; pods ``w-N``) and wait until a dry-run
    pod of each image comes back placed at admission by ``path`` (``admission``: the policy,
    once the controller published the images; ``webhook``: the webhook's cache)."""
    with plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
        deadline = time.monotonic() + 20
        while c.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
                    ).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        for i, image in enumerate(images):
            body = pod(i, image)
            body["metadata"]["name"] = f"w-{i}"
            body["metadata"]["labels"] = {"app": "warm-up"}
            c.post(f"/api/v1/namespaces/{namespace}/pods", json=body).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            placed = [_placed_by(path, c.post(
                f"/api/v1/namespaces/{NAMESPACE}/pods", params={"dryRun": "All"},
                json=pod(10**6 + i, image)).json()) for i, image in enumerate(images)]
            if all(placed):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up: not placed by {path} within {limit} s")
            time.sleep(0.5)


def wait_policy_gates(plane: ControlPlane, limit: float = 60.0) -> None:
    """With the webhook stopped, wait until a dry-run pod comes back gated: the admission
    policy is in force (the API server activates a new policy about a second after it was
    created; the controller creates it at start)."""
    deadline = time.monotonic() + limit
    with plane.client(timeout=30) as c:
        while True:
            obj = c.post(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"dryRun": "All"},
                         json=pod(10**7, "probe.invalid/unknown:1")).json()
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


def _placed_by(path: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    return f'"path":"{path}"' in (meta.get("annotations") or {}).get(
        "podplacement.io/decision", "")


def check_pods(plane: ControlPlane) -> tuple[int, Counter[str]]:
    """(pods bound without a ``kubernetes.io/arch`` requirement, pods by placement path)."""
    escaped = 0
    paths: Counter[str] = Counter()
    with plane.client(timeout=120) as c:
        items = c.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json().get("items") or []
    for obj in items:
        if not str((obj.get("metadata") or {}).get("name", "")).startswith("p-"):
            continue  # a warm-up pod
        spec = obj.get("spec") or {}
        terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms") or [])
        keys = {e.get("key") for t in terms for e in t.get("matchExpressions") or []}
        if spec.get("nodeName") and "kubernetes.io/arch" not in keys:
            escaped += 1
        meta = obj.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get("podplacement.io/decision")
        record = {} if raw is None else json.loads(raw)
        paths["none" if raw is None else str(record.get("path", "controller"))
              + (f"+policy {record['policy']}" if "policy" in record else "")] += 1
    return escaped, paths


def one_run(mode: str, args: argparse.Namespace, registry: Registry, images: list[str],
            work: Path) -> Run:
    """Start a fresh control plane (+ the product), run, collect, stop."""
    assets = locate_assets()
    plane = start_control_plane(assets, work / f"{mode}-plane", audit=True)
    product: Product | None = None
    run = Run(mode, args.pods)
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
            if PULL_SECRET:
                c.post(f"/api/v1/namespaces/{NAMESPACE}/secrets",
                       json=pull_secret(registry)).raise_for_status()
        if mode in ("product", "policy"):
            install_manifests(plane, REPO / "deploy")
            if args.scenario == "warm":
                seed_params(plane, args.params_entries - len(images))
            elif args.scenario == "controller":
                with plane.client() as c:
                    c.patch("/apis/podplacement.io/v1beta1/podplacementconfigs/cluster",
                            json={"spec": {"admission": {"fastPaths": "Disabled"}}},
                            headers={"Content-Type": "application/merge-patch+json"}
                            ).raise_for_status()
            options = ["--insecure-registry", registry.host]
            if registry.ca_pem is not None:
                ca = work / "registry-ca.pem"
                ca.write_bytes(registry.ca_pem)
                options = ["--ca-file", f"{registry.host}={ca}"]
            product = start_product(plane, work / ("product" if mode == "product"
                                                   else f"{mode}-product"),
                                    controller_options=[*options, *args.controller_option],
                                    webhook_options=options)
            if mode == "policy":
                install_policy(plane)
            if args.scenario == "warm":
                warm_up(plane, images)
            elif args.scenario == "private":
                warm_up(plane, images, path="webhook", namespace=NAMESPACE)
            elif args.scenario == "webhook-stopped":
                os.kill(product.webhook.popen.pid, signal.SIGSTOP)
                wait_policy_gates(plane)
        before = {name: proc_stats(p.pid) for name, p in _processes(plane, product).items()}
        since = datetime.now().astimezone()
        clients = 1 if args.light else args.clients
        asyncio.run(create_and_watch(plane, args.pods, clients, images, run, args.limit))
        time.sleep(2.0)  # writes that trail the last binding (Events) still count
        until = datetime.now().astimezone()
        after = {name: proc_stats(p.pid) for name, p in _processes(plane, product).items()}
        run.processes = {name: (after[name][0] - before.get(name, (0.0, 0))[0], after[name][1])
                         for name in after}
        time.sleep(2.5)  # the audit backend flushes batches every second
        run.requests = count_audit(plane, since, until)
        run.escaped, run.paths = check_pods(plane)
    finally:
        if product is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(product.webhook.popen.pid, signal.SIGCONT)
            product.stop()
        plane.stop()
    return run


def _processes(plane: ControlPlane, product: Product | None) -> dict[str, Any]:
    procs: dict[str, Any] = dict(plane.processes)
    if product is not None:
        procs["webhook"] = product.webhook.popen
        for i, p in enumerate(product.controllers):
            procs[f"controller-{i}"] = p.popen
    procs["bench (this process)"] = type("Self", (), {"pid": os.getpid()})()
    return procs


def report(bare: list[Run], product: list[Run], light: bool, scenario: str) -> None:
    """Print the figures of every round and the medians."""
    print(f"\n== {scenario}, {'light (1 client)' if light else 'throughput'}: "
          f"{bare[0].pods} pods, {len(bare)} round(s)")
    print(f"{'round':<6}{'mode':<9}{'bound/s':>9}{'ratio':>7}{'create p50':>12}"
          f"{'p99':>8}{'→ungate p50':>13}{'p99':>8}{'→bound p50':>12}{'p99':>8}")
    ratios = []
    for i, (b, p) in enumerate(zip(bare, product, strict=True)):
        ratio = p.bound_per_s / b.bound_per_s if b.bound_per_s else float("nan")
        ratios.append(ratio)
        for r, rat in ((b, ""), (p, f"{ratio:.2f}")):
            print(f"{i + 1:<6}{r.mode:<9}{r.bound_per_s:>9.1f}{rat:>7}"
                  f"{pct(r.create_latency, .5):>11.1f}ms{pct(r.create_latency, .99):>6.0f}ms"
                  f"{pct(r.to_ungate, .5):>11.1f}ms{pct(r.to_ungate, .99):>6.0f}ms"
                  f"{pct(r.to_bound, .5):>10.1f}ms{pct(r.to_bound, .99):>6.0f}ms")
    print(f"median ratio product/bare (pods bound per second): {statistics.median(ratios):.2f}")
    if light:
        added_create = statistics.median(
            pct(p.create_latency, .5) - pct(b.create_latency, .5)
            for b, p in zip(bare, product, strict=True))
        added_bound = statistics.median(
            pct(p.to_bound, .5) - pct(b.to_bound, .5) for b, p in zip(bare, product, strict=True))
        print(f"added by the product (median over rounds): create p50 {added_create:+.1f} ms, "
              f"create→bound p50 {added_bound:+.1f} ms")
    for label, runs in (("bare", bare), ("product", product)):
        last = runs[-1]
        print(f"\n{label}: API requests per pod by user and verb (last round)")
        for (user, verb), count in sorted(last.requests.items(), key=lambda kv: -kv[1]):
            if count / last.pods >= 0.005:
                print(f"  {user:<68} {verb:<8}{count / last.pods:>8.3f}")
        print(f"{label}: CPU seconds during the run and peak RSS (last round)")
        for name, (cpu, rss) in last.processes.items():
            print(f"  {name:<28}{cpu:>8.1f} s{rss / 1024:>9.0f} MiB")
    for label, runs in (("bare", bare), ("product", product)):
        print(f"{label}: pods bound without an architecture requirement (escaped): "
              f"{[r.escaped for r in runs]}; placed by path (last round): "
              f"{dict(runs[-1].paths)}")
    extra = Counter[str]()
    for (user, verb), count in product[-1].requests.items():
        if user.startswith("system:serviceaccount:podplacement-system:"):
            extra[f"{user.rsplit(':', 1)[1]} {verb}"] += count
    print("\nrequests per pod made by podplacement (last round): " + (", ".join(
        f"{k} {v / product[-1].pods:.3f}" for k, v in sorted(extra.items())) or "none"))


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
    ap.add_argument("--pods", type=int, default=2000, help="pods per run (default 2000)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved bare/product rounds")
    ap.add_argument("--light", action="store_true",
                    help="1 client, pods created one at a time (default --pods 200)")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="seconds to wait for every pod to be bound (default 300)")
    ap.add_argument("--scenario",
                    choices=("cold", "warm", "private", "controller", "webhook-stopped"),
                    default="cold", help="what the product run measures (default cold)")
    ap.add_argument("--params-entries", type=int, default=5000,
                    help="entries of the params object in the warm scenario (default 5000)")
    ap.add_argument("--with-policy", action="store_true",
                    help="a third run per round with a PodPlacementPolicy matching every pod")
    ap.add_argument("--controller-option", action="append", default=[],
                    help="extra option for podplacement controller (repeatable)")
    args = ap.parse_args(argv)
    if args.light and "--pods" not in (argv if argv is not None else sys.argv):
        args.pods = 200
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    if args.scenario == "private":
        global PULL_SECRET
        PULL_SECRET = "bench-pull"
        registry = start_registry(work / "registry", tls=True, auth="basic")
    else:
        registry = start_registry(work / "registry")
    try:
        images = push_images(registry)
        bare: list[Run] = []
        product: list[Run] = []
        policy: list[Run] = []
        for i in range(args.rounds):
            print(f"round {i + 1}: bare", file=sys.stderr)
            bare.append(one_run("bare", args, registry, images, work / f"r{i}"))
            print(f"round {i + 1}: product", file=sys.stderr)
            product.append(one_run("product", args, registry, images, work / f"r{i}"))
            if args.with_policy:
                print(f"round {i + 1}: product with a policy", file=sys.stderr)
                policy.append(one_run("policy", args, registry, images, work / f"r{i}"))
        report(bare, product, args.light, args.scenario)
        if policy:
            report_policy(bare, product, policy)
    finally:
        registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

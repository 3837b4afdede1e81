"""Controller benchmark: N gated pods created as fast as possible on localkube.

Starts a real registry (``docker-registry``) with ``--images`` multi-arch images and a
localkube, then runs ``podplacement controller`` as a subprocess (so its CPU time and peak
RSS can be read from ``/proc``). Two batches of ``--pods`` pods each: ``cold`` (a fresh
controller, empty image cache) and ``warm`` (the same controller, cache filled). Prints, per
batch: pods ungated per second, p50/p99 from creation to ungate (seen on a watch), API
requests per pod by verb and resource from the localkube request log (target: exactly one
pod write, at most one event), and the controller's CPU seconds and peak RSS.

Usage: ``python bench/controller.py [--pods 2000] [--images 20] [--workers 32]``
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect`` (asyncio imports it):
# replace this script's directory on sys.path by the project root before other imports.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.kubeclient import KubeAPI, request_resource  # noqa: E402
from podplacement.rules.config import GATE_LABEL, GATE_LABEL_GATED, SCHEDULING_GATE  # noqa: E402
from tests.harness.kube import start_localkube  # noqa: E402
from tests.harness.oci import Pusher  # noqa: E402
from tests.harness.registry import start_registry  # noqa: E402

PLATFORMS = [["linux/amd64", "linux/arm64"], ["linux/amd64", "linux/arm64", "linux/s390x"],
             ["linux/arm64"], ["linux/amd64", "linux/ppc64le"]]


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, peak RSS in KiB) of a live process from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    peak = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return cpu, peak


def pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {GATE_LABEL: GATE_LABEL_GATED}},
        "spec": {"containers": [{"name": "c", "image": image}],
                 "schedulingGates": [{"name": SCHEDULING_GATE}]},
    }


async def run_batch(api: KubeAPI, server: Any, ns: str, images: list[str], n: int,
                    pid: int, label: str) -> dict[str, Any]:
    await api.request("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    created: dict[str, float] = {}
    ungated: dict[str, float] = {}
    list_rv = (await api.request("GET", f"/api/v1/namespaces/{ns}/pods"))["metadata"][
        "resourceVersion"]
    done = asyncio.Event()

    async def watch() -> None:
        rv = list_rv
        while not done.is_set():
            async for ev in api.watch(f"/api/v1/namespaces/{ns}/pods", resource_version=rv,
                                      timeout_seconds=60):
                obj = ev.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if ev.get("type") != "MODIFIED":
                    continue
                gates = (obj.get("spec") or {}).get("schedulingGates") or []
                name = obj["metadata"]["name"]
                if not any(g.get("name") == SCHEDULING_GATE for g in gates):
                    ungated.setdefault(name, time.monotonic())
                    if len(ungated) >= n:
                        done.set()
                        return

    cpu0, _ = proc_stats(pid)
    server.clear_requests()
    watcher = asyncio.create_task(watch())
    sem = asyncio.Semaphore(64)
    t0 = time.monotonic()

    async def create(i: int) -> None:
        name = f"p{i:05d}"
        async with sem:
            await api.request("POST", f"/api/v1/namespaces/{ns}/pods",
                              body=pod(name, images[i % len(images)]))
            created[name] = time.monotonic()

    await asyncio.gather(*(create(i) for i in range(n)))
    t_created = time.monotonic() - t0
    try:
        await asyncio.wait_for(done.wait(), timeout=max(120.0, n / 5))
    except TimeoutError:
        print(f"[{label}] timeout: {len(ungated)}/{n} ungated", file=sys.stderr)
    watcher.cancel()
    elapsed = max(ungated.values(), default=t0) - t0
    # Events are sent in the background: wait (bounded) until the request log settles.
    seen = -1
    for _ in range(40):
        if len(server.requests) == seen:
            break
        seen = len(server.requests)
        await asyncio.sleep(0.5)
    cpu1, peak = proc_stats(pid)
    lat = sorted(ungated[k] - created[k] for k in ungated if k in created)
    counts: Counter[str] = Counter()
    for rec in server.requests:
        # the controller's requests only: skip this script's POSTs of pods and its watch
        if rec.path.startswith(f"/api/v1/namespaces/{ns}/pods") and rec.verb in (
            "create", "watch", "list"
        ):
            continue
        if rec.verb == "create" and request_resource(rec.path) == "namespaces":
            continue
        counts[f"{rec.verb} {request_resource(rec.path) or rec.path}"] += 1
    return {
        "label": label, "pods": n, "ungated": len(ungated),
        "create_s": t_created, "elapsed_s": elapsed,
        "rate": len(ungated) / elapsed if elapsed > 0 else 0.0,
        "p50": statistics.median(lat) if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        "counts": counts, "cpu_s": cpu1 - cpu0, "peak_rss_mib": peak / 1024,
    }


def report(r: dict[str, Any]) -> None:
    n = max(1, r["ungated"])
    print(f"\n== {r['label']}: {r['ungated']}/{r['pods']} pods ungated "
          f"(created in {r['create_s']:.2f}s)")
    print(f"  ungated/s        {r['rate']:.1f}")
    print(f"  creation->ungate p50 {r['p50'] * 1000:.0f} ms   p99 {r['p99'] * 1000:.0f} ms")
    print(f"  controller CPU   {r['cpu_s']:.2f} s ({r['cpu_s'] / n * 1000:.2f} ms/pod)"
          f"   peak RSS {r['peak_rss_mib']:.1f} MiB")
    print("  API requests per pod (controller):")
    for key, c in sorted(r["counts"].items(), key=lambda kv: -kv[1]):
        print(f"    {key:40s} {c / n:8.3f}  ({c})")


async def measure(kubeconfig: str, server: Any, images: list[str], n: int, pid: int
                  ) -> None:
    api = await KubeAPI.from_kubeconfig(kubeconfig)
    try:
        await asyncio.sleep(2.0)  # let the controller list+watch
        report(await run_batch(api, server, "bench-cold", images, n, pid, "cold"))
        report(await run_batch(api, server, "bench-warm", images, n, pid, "warm"))
    finally:
        await api.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--rate", type=float, default=500.0,
                    help="controller --rate (pods/s, 0: unlimited)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    reg = start_registry(tmp / "registry")
    server, env = start_localkube(tmp / "kube", bookmark_interval=1.0, history_size=50000)
    proc: subprocess.Popen[bytes] | None = None
    try:
        with Pusher(reg) as pusher:
            images = []
            for i in range(args.images):
                pusher.multiarch(f"bench/img{i}", "v1", PLATFORMS[i % len(PLATFORMS)])
                images.append(f"{reg.host}/bench/img{i}:v1")
        conf = tmp / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{reg.host}"\ninsecure = true\n')
        with open(tmp / "controller.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "podplacement", "--log-level", "warning", "controller",
                 "--kubeconfig", str(env.kubeconfig), "--no-leader-election",
                 "--metrics-port", "-1", "--workers", str(args.workers),
                 "--rate", str(args.rate), "--registries-conf", str(conf)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        print(f"controller pid {proc.pid}; {args.images} images; {args.pods} pods per batch; "
              f"log {tmp / 'controller.log'}")
        asyncio.run(measure(str(env.kubeconfig), server, images, args.pods, proc.pid))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        env.close()
        server.stop()
        reg.stop()


if __name__ == "__main__":
    main()

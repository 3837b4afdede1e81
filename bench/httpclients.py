"""aiohttp against httpx on the product's two hot HTTP clients, against real servers.

Starts a real TLS registry (Debian's docker-registry, :func:`podplacement.sandbox.registry.
start_registry`, its own CA) and a real control plane (etcd + kube-apiserver,
:func:`podplacement.sandbox.controlplane.start_control_plane`; no scheduler, no
controller-manager: nothing else writes the pods), then runs three request shapes with each
library, HTTP/1.1, one pooled keep-alive client per run, the same concurrency for both:

- ``registry``: what an inspection sends (``imageinspect._inspector``): ``HEAD`` of a tag's
  manifest (the pull-always revalidation), ``GET`` of the tag's index, ``GET`` of a child
  manifest by digest, ``GET`` of its config blob by digest; manifest requests with the
  inspector's Accept header (``MANIFEST_ACCEPT``), the blob with ``*/*``. ``--images``
  multi-arch images (an OCI index over amd64 and arm64, each child its own config) are pushed
  first. Concurrency 16: the inspector's ``per_registry_concurrency`` default.
- ``kube get+patch``: the reconciler's per-pod pair: ``GET`` of a pod, then a guarded JSON
  patch (``test`` of the resourceVersion just read, then ``add`` of the decision annotation and
  a label: the ``application/json-patch+json`` shape ``controller/reconciler.py`` sends; the
  gate itself can be removed only once, so the benchmark rewrites metadata). Concurrency 32:
  the controller's ``--workers`` default.
- ``kube list``: ``GET`` of the namespace's pods with a ``labelSelector`` that matches one pod
  in three (the controller's gated-pod list), ``limit=500``.

``--pods`` pods (300) are created with the product's kube client (:class:`KubeAPI`) in a
namespace of their own. Every answer body is read in full and JSON bodies are decoded with
orjson on both sides, so the work around the library is the same.

Per run: requests/s, this process's CPU (``time.process_time``) per 1,000 requests, p50/p99
latency per request, and the servers' CPU per 1,000 requests (``/proc/<pid>/stat``: the
registry; kube-apiserver + etcd). Runs are interleaved (aiohttp, httpx, aiohttp, httpx, ...)
for ``--rounds`` rounds (3); the table gives the median of the rounds. ``--product`` adds the
product's own wrappers (``AiohttpTransport``, ``KubeAPI``: aiohttp plus their bookkeeping);
``--http2`` adds httpx with HTTP/2 (needs ``h2``). The loop is asyncio's default loop, as the
controller's (``asyncio.run``).

Run: ``python bench/httpclients.py [--rounds 3] [--requests 1200] [--lists 100] [--product]
[--http2]`` (about 2-3 minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import os
import sys

# bench/ holds an inspect.py: drop the script's own directory from sys.path before anything
# imports the standard library's ``inspect`` module.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Protocol  # noqa: E402

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402

from podplacement.imageinspect._manifest import MANIFEST_ACCEPT  # noqa: E402
from podplacement.imageinspect._transport import AiohttpTransport  # noqa: E402
from podplacement.kubeclient import KubeAPI  # noqa: E402
from podplacement.kubeclient.credentials import StaticCredentials  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    DECISION_ANNOTATION,
    GATE_LABEL,
    SCHEDULING_GATE,
)
from podplacement.sandbox.controlplane import (  # noqa: E402
    ControlPlane,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.oci import Pusher  # noqa: E402
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402

REPO = "bench/multiarch"
NAMESPACE = "httpclients"
JSON_PATCH = "application/json-patch+json"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the two libraries behind one small interface ------------------------------------------


#: What a client gives back as the body: bytes, or the JSON already decoded (``KubeAPI``).
Body = bytes | dict[str, Any]


class Client(Protocol):
    """One pooled client: send, read the whole body, give (status, body)."""

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   body: bytes | None = None) -> tuple[int, Body]: ...

    async def close(self) -> None: ...


class AiohttpClient:
    """aiohttp ``ClientSession`` on a ``TCPConnector`` of ``pool`` connections."""

    def __init__(self, pool: int, ctx: ssl.SSLContext, headers: Mapping[str, str]) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=pool, ssl=ctx), headers=dict(headers))

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   body: bytes | None = None) -> tuple[int, bytes]:
        async with self._session.request(method, url, headers=headers, data=body,
                                         allow_redirects=False) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        await self._session.close()


class HttpxClient:
    """httpx ``AsyncClient`` with ``pool`` connections kept alive (HTTP/1.1 unless ``http2``)."""

    def __init__(self, pool: int, ctx: ssl.SSLContext, headers: Mapping[str, str],
                 http2: bool = False) -> None:
        self._client = httpx.AsyncClient(
            verify=ctx, http2=http2, headers=dict(headers), timeout=30.0, trust_env=False,
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool))

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   body: bytes | None = None) -> tuple[int, bytes]:
        resp = await self._client.request(method, url, headers=headers, content=body)
        return resp.status_code, resp.content

    async def close(self) -> None:
        await self._client.aclose()


class ProductRegistryClient:
    """The product's registry transport (:class:`AiohttpTransport`, no address guard: the
    registry is 127.0.0.1; the guard's resolver runs once per host and DNS-cache period)."""

    def __init__(self, pool: int, ctx: ssl.SSLContext, headers: Mapping[str, str]) -> None:
        self._transport = AiohttpTransport(limit_per_host=pool)
        self._ctx = ctx

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   body: bytes | None = None) -> tuple[int, bytes]:
        resp = await self._transport.request(method, url, headers=headers,
                                             max_body=8 << 20, ssl_context=self._ctx)
        return resp.status, resp.body

    async def close(self) -> None:
        await self._transport.aclose()


# --- measuring ------------------------------------------------------------------------------


def proc_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far (``/proc/<pid>/stat``
    fields 14 and 15, clock ticks)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


@dataclass
class Result:
    """One run: ``requests`` in ``seconds`` wall time, ``cpu`` seconds of this process,
    ``server_cpu`` seconds of the servers, each request's latency (s)."""

    requests: int
    seconds: float
    cpu: float
    server_cpu: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_per_k(self) -> float:
        return self.cpu / self.requests * 1000

    @property
    def server_cpu_per_k(self) -> float:
        return self.server_cpu / self.requests * 1000

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Unit = Callable[[Client, int, list[float]], Awaitable[int]]


def decoded(body: Body) -> Any:
    """The JSON of ``body`` (decoded with orjson unless a client did it already)."""
    return body if isinstance(body, dict) else orjson.loads(body)


async def timed(client: Client, lat: list[float], method: str, url: str,
                headers: Mapping[str, str], body: bytes | None = None) -> tuple[int, Body]:
    """One request, its latency appended to ``lat``."""
    began = time.perf_counter()
    status, data = await client.send(method, url, headers, body)
    lat.append(time.perf_counter() - began)
    return status, data


async def run(make: Callable[[], Client], unit: Unit, units: int, concurrency: int,
              server_pids: Sequence[int]) -> Result:
    """Open a client, warm its pool (``concurrency`` units, not counted), then run ``units``
    units with ``concurrency`` workers; CPU and wall time cover the timed part only."""
    client = make()
    try:
        warm: list[float] = []
        await asyncio.gather(*(unit(client, k, warm) for k in range(concurrency)))
        counter = iter(range(units))
        lat: list[float] = []
        sent = 0

        async def worker() -> None:
            nonlocal sent
            for k in counter:
                n = await unit(client, k, lat)  # not `sent += await ...`: read before the await
                sent += n

        cpu0, srv0, t0 = time.process_time(), proc_cpu(server_pids), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
        return Result(sent, seconds, time.process_time() - cpu0,
                      proc_cpu(server_pids) - srv0, lat)
    finally:
        await client.close()


# --- the registry shape ---------------------------------------------------------------------


@dataclass(frozen=True)
class PushedImage:
    tag: str
    child: str
    config: str


def push_images(registry: Registry, n: int) -> list[PushedImage]:
    """Push ``n`` OCI indexes ``REPO:t<i>`` over an amd64 and an arm64 image, each image with
    a config of its own (the Docker formats); returns each tag with its amd64 child's digest
    and that child's config digest."""
    images = []
    with Pusher(registry) as p:
        for i in range(n):
            children = []
            for arch in ("amd64", "arm64"):
                child = p.image(REPO, None, architecture=arch, process={"Env": [f"N={i}"]})
                children.append((child, {"os": "linux", "architecture": arch}))
            p.index(REPO, f"t{i}", children)
            manifest = json.loads(children[0][0].body)
            images.append(PushedImage(f"t{i}", children[0][0].digest,
                                      manifest["config"]["digest"]))
    return images


def registry_unit(registry: Registry, images: list[PushedImage]) -> Unit:
    base = f"{registry.url}/v2/{REPO}"
    manifest_headers = {"Accept": MANIFEST_ACCEPT}
    blob_headers = {"Accept": "*/*"}

    async def unit(client: Client, k: int, lat: list[float]) -> int:
        img = images[k % len(images)]
        status, _ = await timed(client, lat, "HEAD", f"{base}/manifests/{img.tag}",
                                manifest_headers)
        assert status == 200, status
        status, body = await timed(client, lat, "GET", f"{base}/manifests/{img.tag}",
                                   manifest_headers)
        assert status == 200 and decoded(body)["manifests"], status
        status, body = await timed(client, lat, "GET", f"{base}/manifests/{img.child}",
                                   manifest_headers)
        assert status == 200 and decoded(body)["config"], status
        status, body = await timed(client, lat, "GET", f"{base}/blobs/{img.config}",
                                   blob_headers)
        assert status == 200 and decoded(body)["architecture"] == "amd64", status
        return 4

    return unit


# --- the kube shapes ------------------------------------------------------------------------


def pod_body(i: int) -> dict[str, Any]:
    """A gated pod as the webhook leaves it: the gate, the gate label (one pod in three
    ``gated``, the others ``removed``), one container with requests."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "annotations": {"bench": "httpclients"}, "labels": {
            "app": "httpclients", GATE_LABEL: "gated" if i % 3 == 0 else "removed"}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{
                "name": "main", "image": f"registry.example/{REPO}:t{i % 50}",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "env": [{"name": "N", "value": str(i)}],
            }],
        },
    }


async def create_pods(plane: ControlPlane, ctx: ssl.SSLContext, n: int) -> int:
    """Create the namespace, its ``default`` ServiceAccount and ``n`` pods with the product's
    kube client (:class:`KubeAPI`), 16 at a time. Returns the size of the LIST's JSON (bytes,
    as orjson writes it again)."""
    async with KubeAPI(plane.url, ssl_context=ctx,
                       credentials=StaticCredentials(f"Bearer {plane.token}")) as api:
        await api.request("POST", "/api/v1/namespaces",
                          body={"metadata": {"name": NAMESPACE}})
        await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                          body={"metadata": {"name": "default"}})
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                  body=pod_body(i))

        await asyncio.gather(*(one(i) for i in range(n)))
        listed = await api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                   params={"labelSelector": f"{GATE_LABEL}=gated"})
        return len(orjson.dumps(listed))


def kube_get_patch_unit(plane: ControlPlane, pods: int) -> Unit:
    base = f"{plane.url}/api/v1/namespaces/{NAMESPACE}/pods"
    get_headers = {"Accept": "application/json"}
    patch_headers = {"Accept": "application/json", "Content-Type": JSON_PATCH}
    decision_key = DECISION_ANNOTATION.replace("~", "~0").replace("/", "~1")
    label_key = "bench.podplacement.io~1round"

    async def unit(client: Client, k: int, lat: list[float]) -> int:
        name = f"p{k % pods}"
        status, body = await timed(client, lat, "GET", f"{base}/{name}", get_headers)
        assert status == 200, status
        rv = decoded(body)["metadata"]["resourceVersion"]
        decision = {"platforms": {"main": ["linux/amd64", "linux/arm64"]},
                    "archs": ["amd64", "arm64"], "reason": "bench", "n": k}
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
               {"op": "add", "path": f"/metadata/annotations/{decision_key}",
                "value": orjson.dumps(decision).decode()},
               {"op": "add", "path": f"/metadata/labels/{label_key}", "value": str(k)}]
        status, body = await timed(client, lat, "PATCH", f"{base}/{name}", patch_headers,
                                   orjson.dumps(ops))
        # 409/422: another worker wrote the same pod in between (k and k + pods together)
        assert status in (200, 409, 422), status
        if status == 200:
            decoded(body)
        return 2

    return unit


def kube_list_unit(plane: ControlPlane) -> Unit:
    url = (f"{plane.url}/api/v1/namespaces/{NAMESPACE}/pods"
           f"?labelSelector={GATE_LABEL}%3Dgated&limit=500")
    headers = {"Accept": "application/json"}

    async def unit(client: Client, k: int, lat: list[float]) -> int:
        status, body = await timed(client, lat, "GET", url, headers)
        assert status == 200 and decoded(body)["items"], status
        return 1

    return unit


# --- main -----------------------------------------------------------------------------------


def fmt_row(shape: str, lib: str, results: list[Result]) -> str:
    def med(f: Callable[[Result], float]) -> float:
        return statistics.median(f(r) for r in results)

    rates = "/".join(f"{r.rate:.0f}" for r in results)
    return (f"| {shape} | {lib} | {med(lambda r: r.rate):,.0f} ({rates}) "
            f"| {med(lambda r: r.cpu_per_k):.2f} "
            f"| {med(lambda r: r.quantile(0.5)) * 1000:.1f} "
            f"| {med(lambda r: r.quantile(0.99)) * 1000:.1f} "
            f"| {med(lambda r: r.server_cpu_per_k):.2f} |")


async def main_async(args: argparse.Namespace, registry: Registry, plane: ControlPlane) -> None:
    ca_pem = registry.ca_pem
    assert ca_pem is not None

    def reg_ctx() -> ssl.SSLContext:
        return ssl.create_default_context(cadata=ca_pem.decode())

    def kube_ctx() -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(plane.ca_file))

    start = time.perf_counter()
    images = await asyncio.to_thread(push_images, registry, args.images)
    list_bytes = await create_pods(plane, kube_ctx(), args.pods)
    print(f"pushed {args.images} images, created {args.pods} pods in "
          f"{time.perf_counter() - start:.1f} s; the LIST's JSON: {list_bytes // 1024} KiB",
          flush=True)
    assert registry._process is not None
    reg_pids = [registry._process.pid]
    kube_pids = [plane.processes["kube-apiserver"].pid, plane.processes["etcd"].pid]
    auth = {"Authorization": f"Bearer {plane.token}"}
    ua = {"User-Agent": "podplacement-bench"}

    # A context per client: httpx sets the ALPN protocols of the context it is given (h2 for
    # HTTP/2), which would make a later aiohttp client on the same context speak to an HTTP/2
    # answer.
    def libs(ctx: Callable[[], ssl.SSLContext], headers: Mapping[str, str], pool: int,
             product: Callable[[], Client] | None) -> list[tuple[str, Callable[[], Client]]]:
        out: list[tuple[str, Callable[[], Client]]] = [
            ("aiohttp", lambda: AiohttpClient(pool, ctx(), headers)),
            ("httpx", lambda: HttpxClient(pool, ctx(), headers)),
        ]
        if args.http2:
            out.append(("httpx HTTP/2", lambda: HttpxClient(pool, ctx(), headers, http2=True)))
        if args.product and product is not None:
            out.append(("aiohttp (product wrapper)", product))
        return out

    class _KubeProduct:
        def __init__(self) -> None:
            self._api = KubeAPI(plane.url, ssl_context=kube_ctx(), pool_size=args.kube_concurrency,
                                credentials=StaticCredentials(f"Bearer {plane.token}"))
            self._prefix = len(plane.url)

        async def send(self, method: str, url: str, headers: Mapping[str, str],
                       body: bytes | None = None) -> tuple[int, Body]:
            path = url[self._prefix:]
            try:
                answer = await self._api.request(
                    method, path, body=body, content_type=headers.get("Content-Type"))
            except Exception as exc:  # ApiError: the status is what the unit checks
                return getattr(exc, "status", 0), {}
            return 200, answer  # decoded once, by KubeAPI

        async def close(self) -> None:
            await self._api.close()

    shapes: list[tuple[str, Unit, int, int, list[int], list[tuple[str, Callable[[], Client]]]]]
    shapes = [
        ("registry (HEAD + 3 GETs)", registry_unit(registry, images), args.requests // 4,
         args.registry_concurrency, reg_pids,
         libs(reg_ctx, ua, args.registry_concurrency,
              lambda: ProductRegistryClient(args.registry_concurrency, reg_ctx(), ua))),
        ("kube GET + JSON PATCH", kube_get_patch_unit(plane, args.pods), args.requests // 2,
         args.kube_concurrency, kube_pids,
         libs(kube_ctx, {**auth, **ua}, args.kube_concurrency, _KubeProduct)),
        ("kube LIST (labelSelector)", kube_list_unit(plane), args.lists,
         args.kube_concurrency, kube_pids,
         libs(kube_ctx, {**auth, **ua}, args.kube_concurrency, _KubeProduct)),
    ]
    results: dict[tuple[str, str], list[Result]] = {}
    for rnd in range(args.rounds):
        for shape, unit, units, concurrency, pids, arms in shapes:
            # alternate which library goes first from round to round
            order = arms if rnd % 2 == 0 else arms[::-1]
            for lib, make in order:
                r = await run(make, unit, units, concurrency, pids)
                results.setdefault((shape, lib), []).append(r)
                print(f"  round {rnd + 1} {shape:<26} {lib:<26} {r.rate:7.0f} req/s "
                      f"{r.cpu_per_k:6.2f} CPU s/1k", flush=True)
    print(f"\nmedian of {args.rounds} interleaved rounds; registry concurrency "
          f"{args.registry_concurrency}, kube concurrency {args.kube_concurrency}; "
          f"{args.pods} pods, LIST selects {len(range(0, args.pods, 3))}")
    print("| shape | library | requests/s (rounds) | client CPU s / 1,000 req | p50 ms "
          "| p99 ms | server CPU s / 1,000 req |")
    print("|---|---|---|---|---|---|---|")
    for shape, _unit, _n, _c, _p, arms in shapes:
        for lib, _make in arms:
            print(fmt_row(shape, lib, results[(shape, lib)]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--requests", type=int, default=1200,
                        help="requests per run of the registry and get+patch shapes (1200)")
    parser.add_argument("--lists", type=int, default=100, help="LISTs per run (100)")
    parser.add_argument("--images", type=int, default=50, help="multi-arch images (50)")
    parser.add_argument("--pods", type=int, default=300, help="pods in the namespace (300)")
    parser.add_argument("--registry-concurrency", type=int, default=16)
    parser.add_argument("--kube-concurrency", type=int, default=32)
    parser.add_argument("--product", action="store_true",
                        help="also the product's wrappers (AiohttpTransport, KubeAPI)")
    parser.add_argument("--http2", action="store_true", help="also httpx over HTTP/2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-httpclients-") as tmp:
        registry = start_registry(Path(tmp) / "registry", tls=True)
        plane: ControlPlane | None = None
        try:
            plane = start_control_plane(locate_assets(), Path(tmp) / "plane",
                                        scheduler=False, controller_manager=False)
            asyncio.run(main_async(args, registry, plane))
        finally:
            if plane is not None:
                plane.stop()
            registry.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark imageinspect against a local distribution registry (127.0.0.1 only).

Starts its own registries (plain HTTP and TLS, via tests.harness.registry), pushes N image
indexes and N single-platform manifests, then prints:

1. the HTTP-library comparison the issue asks for: cold manifest GETs/s at 50 concurrent
   requests with httpx (HTTP/1.1; HTTP/2 over TLS when ``h2`` is installed) and aiohttp;
2. Inspector throughput: cold and warm inspections/s at 1, 10 and 50 concurrent lookups;
3. HTTP requests per image: index (expect 1), single manifest (expect 2), warm hit (expect 0).

Run: ``python bench/inspect.py [--images N] [--gets M]`` (about 30-60 s on 2 cores).
"""

# This file is named inspect.py: drop its own directory from sys.path before anything imports
# the standard library's ``inspect`` module.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import httpx  # noqa: E402

from podplacement.imageinspect import Inspector, RegistriesConfig  # noqa: E402
from podplacement.imageinspect._manifest import MANIFEST_ACCEPT, OCI_INDEX, OCI_MANIFEST  # noqa: E402
from tests.harness.oci import Pusher  # noqa: E402
from tests.harness.registry import Registry, start_registry  # noqa: E402

REPO_INDEX = "bench/idx"
REPO_SINGLE = "bench/single"


def push_images(reg: Registry, n: int, singles: bool = True) -> None:
    """Push ``n`` distinct indexes (2 platforms each) and, with ``singles``, ``n`` distinct
    single-platform manifests, each with a config of its own (the inspector keeps a config's
    platform by digest: a shared config would be read once)."""
    with Pusher(reg) as p:
        children = [
            (p.image(REPO_INDEX, None, architecture=a), {"os": "linux", "architecture": a})
            for a in ("amd64", "arm64")
        ]
        for i in range(n):
            p.index(REPO_INDEX, f"i{i}", children, annotations={"bench.n": str(i)})
        if not singles:
            return
        layer = p.blob(REPO_SINGLE, b"bench layer")
        for i in range(n):
            config = p.blob(REPO_SINGLE, json.dumps(
                {"os": "linux", "architecture": "arm64", "rootfs": {}, "bench.n": i}).encode())
            body = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "config": {
                        "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": config.digest,
                        "size": config.size,
                    },
                    "layers": [
                        {
                            "mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": layer.digest,
                            "size": layer.size,
                        }
                    ],
                    "annotations": {"bench.n": str(i)},
                }
            ).encode()
            p.raw_manifest(REPO_SINGLE, f"s{i}", body, OCI_MANIFEST)


async def _run_concurrent(
    total: int, concurrency: int, one: Callable[[int], Awaitable[None]]
) -> float:
    """Run ``one(k)`` for k in range(total) with ``concurrency`` workers; returns ops/s."""
    counter = iter(range(total))

    async def worker() -> None:
        for k in counter:
            await one(k)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


def _ssl_ctx(reg: Registry) -> Any:
    import ssl

    return ssl.create_default_context(cadata=reg.ca_pem.decode()) if reg.ca_pem else False


async def bench_httpx(reg: Registry, gets: int, n: int, http2: bool) -> float:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    verify = _ssl_ctx(reg) or True
    async with httpx.AsyncClient(
        base_url=reg.url, http2=http2, limits=limits, verify=verify, timeout=30
    ) as client:

        async def one(k: int) -> None:
            r = await client.get(
                f"/v2/{REPO_INDEX}/manifests/i{k % n}", headers={"Accept": MANIFEST_ACCEPT}
            )
            assert r.status_code == 200, r.status_code

        await _run_concurrent(100, 50, one)  # open connections
        return await _run_concurrent(gets, 50, one)


async def bench_aiohttp(reg: Registry, gets: int, n: int) -> float:
    connector = aiohttp.TCPConnector(limit=64)
    ssl_ctx = _ssl_ctx(reg)
    async with aiohttp.ClientSession(reg.url, connector=connector) as session:

        async def one(k: int) -> None:
            async with session.get(
                f"/v2/{REPO_INDEX}/manifests/i{k % n}",
                headers={"Accept": MANIFEST_ACCEPT},
                ssl=ssl_ctx,
            ) as r:
                await r.read()
                assert r.status == 200, r.status

        await _run_concurrent(100, 50, one)
        return await _run_concurrent(gets, 50, one)


async def bench_inspector(reg: Registry, n: int) -> list[tuple[str, int, float, float]]:
    rows = []
    conf = RegistriesConfig().with_insecure(reg.host)
    for kind, repo, prefix in (("index", REPO_INDEX, "i"), ("single", REPO_SINGLE, "s")):
        for concurrency in (1, 10, 50):
            async with Inspector(registries=conf, per_registry_concurrency=64) as insp:
                await insp.inspect(f"{reg.host}/{repo}:{prefix}0")  # scheme probe + warm pool
                images = [f"{reg.host}/{repo}:{prefix}{k}" for k in range(1, n)]

                async def one(k: int, insp: Inspector = insp, images: list[str] = images) -> None:
                    info = await insp.inspect(images[k])
                    assert info.platforms

                cold = await _run_concurrent(len(images), concurrency, one)
                warm = await _run_concurrent(len(images), concurrency, one)
            rows.append((kind, concurrency, cold, warm))
    return rows


async def requests_per_image(reg: Registry) -> dict[str, int]:
    conf = RegistriesConfig().with_insecure(reg.host)
    out = {}
    async with Inspector(registries=conf) as insp:
        await insp.inspect(f"{reg.host}/{REPO_INDEX}:i0")
        for label, image in (
            ("index (cold)", f"{reg.host}/{REPO_INDEX}:i1"),
            ("single manifest (cold)", f"{reg.host}/{REPO_SINGLE}:s1"),
            ("index (warm)", f"{reg.host}/{REPO_INDEX}:i1"),
            ("single manifest (warm)", f"{reg.host}/{REPO_SINGLE}:s1"),
        ):
            before = insp.stats.requests
            info = await insp.inspect(image)
            assert info.media_type in (OCI_INDEX, OCI_MANIFEST)
            out[label] = insp.stats.requests - before
    return out


async def main_async(args: argparse.Namespace, plain: Registry, tls: Registry) -> None:
    n = args.images
    print(f"\n== HTTP library: cold manifest GETs/s, 50 concurrent, {args.gets} GETs/round ==")
    libs: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("httpx AsyncClient HTTP/1.1 (plain)", lambda: bench_httpx(plain, args.gets, n, False)),
        ("httpx AsyncClient HTTP/1.1 (TLS)", lambda: bench_httpx(tls, args.gets, n, False)),
        ("aiohttp ClientSession (plain)", lambda: bench_aiohttp(plain, args.gets, n)),
        ("aiohttp ClientSession (TLS)", lambda: bench_aiohttp(tls, args.gets, n)),
    ]
    try:
        import h2  # noqa: F401

        libs.insert(
            2, ("httpx AsyncClient HTTP/2 (TLS)", lambda: bench_httpx(tls, args.gets, n, True))
        )
    except ImportError:
        print("(h2 not installed: httpx HTTP/2 skipped)")
    best: dict[str, list[float]] = {label: [] for label, _ in libs}
    for _round in range(args.rounds):  # interleaved rounds: the machine is shared and noisy
        for label, run in libs:
            best[label].append(await run())
    for label, rates in best.items():
        shown = " ".join(f"{r:6.0f}" for r in rates)
        print(f"  {label:<38} best {max(rates):6.0f} GETs/s   (rounds: {shown})", flush=True)

    print(f"\n== Inspector: inspections/s over {n - 1} distinct images (plain registry) ==")
    print(f"  {'kind':<8} {'concurrent':>10} {'cold/s':>10} {'warm/s':>12}")
    for kind, concurrency, cold, warm in await bench_inspector(plain, n):
        print(f"  {kind:<8} {concurrency:>10} {cold:>10.0f} {warm:>12.0f}", flush=True)

    print("\n== HTTP requests per image ==")
    for label, count in (await requests_per_image(plain)).items():
        print(f"  {label:<24} {count}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=150, help="images per kind (150)")
    parser.add_argument("--gets", type=int, default=800, help="GETs per library and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as tmp:
        plain = start_registry(Path(tmp) / "plain")
        tls = start_registry(Path(tmp) / "tls", tls=True)
        try:
            start = time.perf_counter()
            push_images(plain, args.images)
            push_images(tls, args.images, singles=False)  # only the library comparison
            print(f"pushed the test images in {time.perf_counter() - start:.1f}s")
            asyncio.run(main_async(args, plain, tls))
        finally:
            plain.stop()
            tls.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

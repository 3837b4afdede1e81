"""Benchmark: the webhook's CPU per pod it places at admission, from its cache and after
revalidating an ``imagePullPolicy: Always`` tag with one manifest ``HEAD``, layer by layer.

Starts Debian's ``docker-registry`` (127.0.0.1, tuned for throughput:
``start_registry(quiet=True)``) and pushes one amd64+arm64 image index, then measures in
this process, one call at a time, the CPU milliseconds per call (``time.process_time``,
best of ``--rounds`` runs of ``--calls`` calls; the registry's own CPU is not counted):

- ``aiohttp HEAD``: a plain ``aiohttp`` manifest ``HEAD`` on a keep-alive session: the
  floor of any client;
- ``Inspector.inspect(pull_always)``: the image inspector's revalidation of a cached tag
  (reference parsing, pull sources, credentials, auth, retries around that ``HEAD``);
- ``AdmissionInspector.pod_images``: the webhook's singleflight and budget around it;
- ``place_reviewed_pod``, cached and Always: the whole admission-time placement of a gated
  pod from the AdmissionReview's bytes (decode, lookup or revalidation, the controller's
  decision, the patch), as the webhook's ``/mutate`` runs it minus the HTTP server.

What ``place_reviewed_pod`` Always costs over cached is the webhook's price of one
revalidation; over ``aiohttp HEAD`` it is what the product's layers add to the client.

Usage: ``python bench/revalidate.py [--calls 2000] [--rounds 3]``
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from podplacement.imageinspect import Inspector, RegistriesConfig  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    GATE_LABEL,
    GATE_LABEL_GATED,
    SCHEDULING_GATE,
    PlacementConfig,
)
from podplacement.sandbox.oci import MANIFEST_ACCEPT, Pusher  # noqa: E402
from podplacement.sandbox.registry import Registry, start_registry  # noqa: E402
from podplacement.webhook.admitinspect import AdmissionInspector  # noqa: E402
from podplacement.webhook.admitplace import place_reviewed_pod  # noqa: E402
from podplacement.webhook.placecache import PlaceCache  # noqa: E402

NAMESPACE = "bench"


def review(image: str, *, always: bool) -> bytes:
    """An AdmissionReview of a pod of ``image`` as the admission policy leaves it: gated."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": NAMESPACE,
                        "labels": {GATE_LABEL: GATE_LABEL_GATED}},
           "spec": {"containers": [{"name": "c", "image": image,
                                    "imagePullPolicy": "Always" if always else "IfNotPresent"}],
                    "schedulingGates": [{"name": SCHEDULING_GATE}]}}
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "u", "operation": "CREATE", "namespace": NAMESPACE,
                                     "object": pod, "dryRun": False}})


async def cpu_ms(call: Callable[[], Awaitable[Any]], calls: int, rounds: int) -> float:
    """CPU ms per call of ``call()``: best of ``rounds`` runs of ``calls`` (after one)."""
    await call()
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            await call()
        best = min(best, (time.process_time() - start) * 1000 / calls)
    return best


async def measure(registry: Registry, calls: int, rounds: int) -> list[tuple[str, float]]:
    """The figures of the module docstring, in its order."""
    image = f"{registry.host}/bench/multi:v1"
    inspector = Inspector(registries=RegistriesConfig().with_insecure(registry.host),
                          retries=0, timeout=10.0)
    cache = PlaceCache(inspector)
    at_admission = AdmissionInspector(inspector, cache=cache, budget=3.0)
    config = PlacementConfig()
    pod = orjson.loads(review(image, always=True))["request"]["object"]
    out: list[tuple[str, float]] = []
    try:
        async with aiohttp.ClientSession() as session:
            url = f"{registry.url}/v2/bench/multi/manifests/v1"

            async def head() -> None:
                async with session.head(url, headers={"Accept": MANIFEST_ACCEPT}) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HEAD {url}: {resp.status}")

            out.append(("aiohttp HEAD", await cpu_ms(head, calls, rounds)))
        out.append(("Inspector.inspect(pull_always)", await cpu_ms(
            lambda: inspector.inspect(image, pull_always=True), calls, rounds)))
        out.append(("AdmissionInspector.pod_images", await cpu_ms(
            lambda: at_admission.pod_images(pod, config, revalidate=True),
            calls, rounds)))
        for label, always in (("place_reviewed_pod, cached", False),
                              ("place_reviewed_pod, Always", True)):
            body = review(image, always=always)

            async def place(body: bytes = body) -> None:
                answer = await place_reviewed_pod(
                    body, NAMESPACE, config, cache=cache, inspector=at_admission,
                    budget=3.0, dry_run=False, on_error=lambda: None)
                if answer.placement is None:
                    raise RuntimeError(f"not placed: {answer.kind}")

            out.append((label, await cpu_ms(place, calls, rounds)))
    finally:
        await at_admission.aclose()
        await cache.aclose()
        await inspector.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    """Start the registry, push, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="runs, the best kept (default 3)")
    args = ap.parse_args(argv)
    registry = start_registry(Path(tempfile.mkdtemp(prefix="bench-revalidate-")), quiet=True)
    try:
        with Pusher(registry) as pusher:
            pusher.multiarch("bench/multi", "v1", ["linux/amd64", "linux/arm64"])
        figures = asyncio.run(measure(registry, args.calls, args.rounds))
    finally:
        registry.stop()
    print(f"CPU ms per call, best of {args.rounds} runs of {args.calls} (this process only)")
    for label, ms in figures:
        print(f"  {label:<34}{ms:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

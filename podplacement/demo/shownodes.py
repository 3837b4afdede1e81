"""Act 5 of ``podplacement demo``: show the pods bound to each real node running (phase and
first log line)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from podplacement.demo import report, workloads
from podplacement.demo.common import Child, DemoError, DemoOptions, wait_for
from podplacement.kubeclient import KubeAPI
from podplacement.sandbox.realnode import RealNode

log = logging.getLogger("podplacement.demo")

#: Seconds the pods on the real node get to run (first pulls included: about 2 s each);
#: the emulated arm64 node gets :data:`ARM64_RUN_TIMEOUT` (its containerd and the
#: containers' programs run under qemu-user).
RUN_TIMEOUT = 30.0
ARM64_RUN_TIMEOUT = 60.0
#: Seconds to wait, once the pods run, for the first line of each Running pod's log.
LOG_TIMEOUT = 15.0


async def show_real_node(api: KubeAPI, node: RealNode, options: DemoOptions,
                         watch: Sequence[Child]) -> int:
    """Wait (bounded by :data:`RUN_TIMEOUT`) until the pods bound to the real node run,
    then print their phase and first log line and one verdict per pod; returns how many did
    not run (a real node that got no pod counts as one)."""
    ns = workloads.DEMO_NAMESPACE
    state: dict[str, list[dict[str, Any]]] = {"pods": []}

    async def running() -> bool:
        pods = (await api.request("GET", f"/api/v1/namespaces/{ns}/pods")).get("items") or []
        state["pods"] = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node.name]
        return all((p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")
                   for p in state["pods"])

    with contextlib.suppress(DemoError):
        await wait_for(f"the pods on the real node {node.name} to run", running,
                       ARM64_RUN_TIMEOUT if node.arch == "arm64" else RUN_TIMEOUT,
                       interval=0.3, alive=watch)
    pods = state["pods"]
    logs: dict[str, str] = {}

    async def logged() -> bool:
        # a container can be Running a moment before its first line is in its log
        for pod in pods:
            name = pod["metadata"]["name"]
            if not logs.get(name, "").strip():
                logs[name] = await asyncio.to_thread(node.pod_log, ns, name, "app")
        return all(logs[p["metadata"]["name"]].strip() for p in pods
                   if (p.get("status") or {}).get("phase") == "Running")

    with contextlib.suppress(DemoError):
        await wait_for(f"the logs of the pods on the real node {node.name}", logged,
                       LOG_TIMEOUT, interval=0.5, alive=watch)
    out = options.out
    print(f"on the real {node.arch} node {node.name} ({node.describe()}): the pods placed "
          "there run (phase, first line of their log):", file=out)
    rows = report.run_rows(pods, logs)
    print(report.render_table(rows, report.RUN_HEADERS, {}) + "\n", file=out)
    failures = 0 if rows else 1
    if not rows:
        print(f"no pod was bound to the real node {node.name}: UNEXPECTED", file=out)
    for row in rows:
        problems = ([f"phase {row.phase}"] if row.phase != "Running" else []) + (
            ["no log"] if row.log == "-" else [])
        failures += bool(problems)
        verdict = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
        print(f"{row.pod:<20} runs on the real node: {verdict}", file=out)
    print("", file=out)
    return failures

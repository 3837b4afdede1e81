"""Act 4 of ``podplacement demo``: create the sample pods, wait (bounded) for the decisions,
print the table, the explanation of the pod that waits and the checks, then free NUMA
capacity and show the waiting pod placed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from podplacement.demo import report, workloads
from podplacement.demo.cluster import ApiServer
from podplacement.demo.common import (
    WORKDIR,
    Child,
    DemoError,
    DemoOptions,
    http_text,
    podplacement_args,
    wait_for,
)
from podplacement.demo.seed import DemoRegistryPair
from podplacement.demo.shownodes import show_real_node
from podplacement.demo.workloads import Expectation
from podplacement.kubeclient import MERGE_PATCH, ApiError, KubeAPI
from podplacement.rules.config import NRT_GROUP, NRT_PLURAL, NRT_VERSION
from podplacement.rules.place.placement import WAITING_FOR_NUMA

log = logging.getLogger("podplacement.demo")


async def list_demo(api: KubeAPI) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pods and Events (core/v1 and events.k8s.io/v1) of the demo namespace."""
    ns = workloads.DEMO_NAMESPACE
    pods = (await api.request("GET", f"/api/v1/namespaces/{ns}/pods")).get("items") or []
    events: list[dict[str, Any]] = []
    for path in (f"/api/v1/namespaces/{ns}/events",
                 f"/apis/events.k8s.io/v1/namespaces/{ns}/events"):
        with contextlib.suppress(ApiError):
            events += (await api.request("GET", path)).get("items") or []
    return pods, events


async def settle(api: KubeAPI, names: set[str], limit: float, watch: Sequence[Child],
                 scheduler: bool, done_states: tuple[str, ...] = ("ungated", "waiting"),
                 stale_reasons: frozenset[str] = frozenset(),
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait (bounded by ``limit`` s) until every pod of ``names`` is in one of
    ``done_states`` (see :func:`report.state_cell`; a pod the webhook never gated counts as
    done too), then (bounded) for their Events, which the controller sends after the ungate,
    and, with a scheduler, for the bindings of the pods that can run somewhere. An Event whose
    reason is in ``stale_reasons`` (one sent before, e.g. ``WaitingForNUMAResources`` of a
    pod decided again) does not count as the decision's. Returns the
    last pods and events read; a timeout is logged, not raised (the table shows the state
    reached)."""
    ns = workloads.DEMO_NAMESPACE
    state: dict[str, Any] = {"pods": [], "events": []}

    async def read() -> list[dict[str, Any]]:
        pods, events = await list_demo(api)
        state["pods"], state["events"] = pods, events
        return [p for p in pods if p["metadata"]["name"] in names]

    async def decided() -> bool:
        ours = await read()
        return len(ours) == len(names) and all(
            report.state_cell(p) in (*done_states, "not-gated") for p in ours)

    async def reported() -> bool:
        ours = await read()
        reasons = report.events_by_pod(state["events"])
        return all(set(reasons.get((ns, p["metadata"]["name"])) or ()) - stale_reasons
                   for p in ours if report.state_cell(p) in ("ungated", "waiting"))

    async def bound() -> bool:
        return all(p["spec"].get("nodeName") for p in await read()
                   if report.state_cell(p) == "ungated" and not report.unsatisfiable(p))

    try:
        await wait_for("the pods to be decided", decided, limit, interval=0.5, alive=watch)
    except DemoError as exc:
        log.error("%s", exc)
    with contextlib.suppress(DemoError):
        await wait_for("the events", reported, 10.0, interval=0.5)
    if scheduler:
        with contextlib.suppress(DemoError):
            await wait_for("the scheduler to bind the pods", bound, 15.0, interval=0.5)
    return state["pods"], state["events"]


def print_checks(out: TextIO, checks: Sequence[tuple[str, str, Expectation]],
                 pods: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]) -> int:
    """Print one verdict line per ``(pod name, what it shows, expectation)``; returns how
    many did not match."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    reasons = report.events_by_pod(events)
    failures = 0
    for name, what, expect in checks:
        pod = by_name.get(name)
        if pod is None:
            problems = ["pod missing"]
        else:
            problems = report.check(pod, reasons.get((workloads.DEMO_NAMESPACE, name), []),
                                    expect)
        failures += bool(problems)
        verdict = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
        print(f"{name:<20} {what}: {verdict}", file=out)
    return failures


async def run_workloads(api: KubeAPI, registries: workloads.DemoRegistries, server: ApiServer,
                        options: DemoOptions, watch: Sequence[Child],
                        metrics_url: str | None = None,
                        explain: Callable[[dict[str, Any]], Awaitable[str]] | None = None,
                        ) -> int:
    """Create the sample pods, wait for the decisions and print the table; explain (through
    ``explain``) why pods still wait; then free NUMA capacity and show the waiting pod placed
    (the controller re-queues waiting pods on NodeResourceTopology changes); finally a
    summary of the controller's metrics from ``metrics_url``. Returns the exit code (0 when
    everything went as expected, 1 otherwise). On an existing cluster only the table is
    shown and the exit code says whether podplacement decided every pod."""
    items = workloads.workloads(registries)
    ns = workloads.DEMO_NAMESPACE
    for w in items:
        await api.request("POST", f"/api/v1/namespaces/{ns}/pods", body=w.pod)
    names = {w.name for w in items}
    log.info("created %d pods in namespace %s; waiting for decisions", len(items), ns)
    pods, events = await settle(api, names, options.settle_timeout, watch, server.scheduler)
    by_name = {p["metadata"]["name"]: p for p in pods}
    ordered = [by_name[w.name] for w in items if w.name in by_name]
    out = options.out
    print(report.render_table(report.build_rows(ordered, events)) + "\n", file=out)
    kind = f"API server: {server.kind}, scheduler: {'yes' if server.scheduler else 'no'}"
    if server.kind == "existing":
        # The cluster's own nodes and PodPlacementConfig decide: the expectations hold for
        # the demo's fake cluster only, so report whether the product decided each pod.
        undecided = [w.name for w in items
                     if report.state_cell(by_name.get(w.name) or {}) not in
                     ("ungated", "waiting")]
        for name in undecided:
            print(f"{name:<20} not decided by podplacement (is it installed and running?)",
                  file=out)
        print(f"{len(items) - len(undecided)} of {len(items)} workloads decided ({kind})",
              file=out)
        out.flush()
        return 0 if not undecided else 1

    if explain is not None:
        for pod in ordered:
            if report.state_cell(pod) == "waiting":
                text = await explain(pod)
                if text:
                    print(f"why {pod['metadata']['name']} waits (podplacement explain):\n"
                          f"{text.rstrip()}\n", file=out)
    failures = print_checks(out, [(w.name, w.what, w.expect) for w in items], pods, events)
    print(f"\n{len(items) - failures} of {len(items)} workloads placed as expected ({kind})\n",
          file=out)
    out.flush()
    for real in server.real_nodes:
        failures += await show_real_node(api, real, options, watch)
    nodes = (await api.request("GET", "/api/v1/nodes")).get("items") or []
    print(report.nodes_line(nodes, [n.name for n in server.real_nodes]) + "\n", file=out)
    out.flush()

    waiting = workloads.WAITING_POD
    if report.state_cell(by_name.get(waiting) or {}) == "waiting":
        failures += await free_capacity(api, options, watch, server.scheduler)

    if metrics_url:
        exposition = await asyncio.to_thread(http_text, metrics_url)
        summary = report.metrics_summary(exposition) if exposition else ""
        if summary:
            print(f"controller: {summary}", file=out)
    print(server.real_nodes_line(), file=out)
    out.flush()
    return 0 if failures == 0 else 1


async def free_capacity(api: KubeAPI, options: DemoOptions, watch: Sequence[Child],
                        scheduler: bool) -> int:
    """Raise the free CPUs of one NUMA zone (as when pods there finish), wait until the pod
    that waited for NUMA resources is placed, print its row and check it; returns 1 when it
    was not placed as expected, else 0."""
    node = workloads.FREED_NODE
    log.info("freeing NUMA capacity on %s (the kubelet's NRT exporter would report this)",
             node.name)
    await api.request("PATCH", f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}/{node.name}",
                      body=workloads.freed_capacity_patch(), content_type=MERGE_PATCH)
    name = workloads.WAITING_POD
    # the pod's WaitingForNUMAResources Event is older than the decision awaited here
    pods, events = await settle(api, {name}, 30.0, watch, scheduler, ("ungated",),
                                stale_reasons=frozenset({WAITING_FOR_NUMA}))
    pods = [p for p in pods if p["metadata"]["name"] == name]
    for pod in pods:
        if report.state_cell(pod) == "waiting":  # not re-decided within the bound
            log.error("%s still waits after the capacity was freed", name)
    out = options.out
    print(f"after {node.name} zone node-0 reported {workloads.FREED_CPU} free CPUs "
          "(NodeResourceTopology update):", file=out)
    print(report.render_table(report.build_rows(pods, events)) + "\n", file=out)
    failures = print_checks(out, [(name, "placed once a zone can hold it",
                                   workloads.AFTER_FREEING)], pods, events)
    print("", file=out)
    return failures


async def explain_pod(work: Path, pair: DemoRegistryPair, kubeconfig: Path,
                      config: dict[str, Any], pod: dict[str, Any]) -> str:
    """``podplacement explain`` of ``pod`` against the cluster (nodes and NRTs read through
    ``kubeconfig``, the PodPlacementConfig ``config`` from a file), as a table; "" when it
    fails."""
    name = pod["metadata"]["name"]
    pod_file = work / f"explain-{name}.json"
    pod_file.write_text(json.dumps(pod))
    config_file = work / "podplacementconfig.json"
    config_file.write_text(json.dumps(config))
    args = podplacement_args("explain", str(pod_file), "--kubeconfig", str(kubeconfig),
                             "--config", str(config_file),
                             "--insecure-registry", pair.public.host, "--output", "table")
    try:
        proc = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True,
                                       cwd=WORKDIR, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("podplacement explain %s failed: %s", name, exc)
        return ""
    if proc.returncode != 0:
        log.warning("podplacement explain %s failed (exit %d): %s", name, proc.returncode,
                    proc.stderr.strip()[-500:])
        return ""
    return proc.stdout

"""What reading a watch costs the client per event, with and without held reads.

A TLS server on 127.0.0.1 (aiohttp, a fresh CA) streams ``--events`` pod watch events of
about 3 kB (a pod as the admission policy places it, bound), one write per event, at
``--rate`` events per second: what kube-apiserver does for the controller's watch of placed
pods during a burst. For each ``--coalesce`` value a fresh client process reads the stream
with :meth:`kubeclient.KubeAPI.watch` (decoding every event) and reports its CPU seconds
(user+system, ``getrusage``) per event and how long after its write each event was
yielded. Values are interleaved over ``--rounds`` rounds; medians are printed.

Usage: ``python bench/watchread.py [--events 3000] [--rate 400] [--coalesce 0,0.05,0.1]
[--rounds 3]``
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
import json  # noqa: E402
import resource  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402

PATH = "/api/v1/pods"


def pod_event(i: int, sent: float) -> bytes:
    """One MODIFIED event of a bound pod placed by the admission policy (about 3 kB, the
    shape kube-apiserver v1.36.2 sends: managedFields, token volume, tolerations);
    ``sent`` (unix seconds) rides in an annotation."""
    record = {"path": "admission", "catalog": "fdd92aeb-7829-482a-acd9-d1cf9253f67f",
              "platforms": ["linux/amd64"], "oses": ["linux"], "archs": ["amd64"],
              "result": "set", "reason": "required architectures amd64"}
    term = {"matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}
    pod = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": f"p-{i}", "namespace": "bench", "uid": f"00000000-0000-0000-0000-{i:012d}",
            "resourceVersion": str(1000 + i), "generation": 1,
            "creationTimestamp": "2026-12-07T12:48:48Z",
            "labels": {"app": "bench", "podplacement.io/node-affinity": "set",
                       "podplacement.io/scheduling-gate": "removed"},
            "annotations": {"podplacement.io/decision": json.dumps(record),
                            "bench/sent": repr(sent)},
            "managedFields": [{
                "manager": "podplacement-bench", "operation": "Update", "apiVersion": "v1",
                "time": "2026-12-07T12:48:48Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                             "f:spec": {"f:containers": {'k:{"name":"c"}': {
                                 ".": {}, "f:image": {}, "f:imagePullPolicy": {},
                                 "f:name": {}, "f:resources": {},
                                 "f:terminationMessagePath": {},
                                 "f:terminationMessagePolicy": {}}},
                                 "f:dnsPolicy": {}, "f:enableServiceLinks": {},
                                 "f:restartPolicy": {}, "f:schedulerName": {},
                                 "f:securityContext": {},
                                 "f:terminationGracePeriodSeconds": {}}}}]},
        "spec": {
            "volumes": [{"name": "kube-api-access-gw2xr", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [{"name": "c", "image": "registry.test/bench/amd:v1", "resources": {},
                            "volumeMounts": [{"name": "kube-api-access-gw2xr",
                                              "readOnly": True, "mountPath":
                                              "/var/run/secrets/kubernetes.io/serviceaccount"}],
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File",
                            "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 0,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": "node-amd64-a", "securityContext": {},
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "preference": {"matchExpressions": [
                        term["matchExpressions"][0]]}}]}},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": f"node.kubernetes.io/{k}", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}
                            for k in ("not-ready", "unreachable")],
            "priority": 0, "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-12-07T12:48:48Z"}]}}
    return orjson.dumps({"type": "MODIFIED", "object": pod}) + b"\n"


def serve(port: int, cert: str, key: str, events: int, rate: float) -> None:
    """The server process: every request to :data:`PATH` gets ``events`` events, one write
    each, paced at ``rate`` per second."""
    from aiohttp import web

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        start = time.monotonic()
        for i in range(events):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await resp.write(pod_event(i, time.time()))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get(PATH, watch)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, print=None)


async def read(port: int, ca: str, coalesce: float) -> dict[str, Any]:
    """The client process: read the whole stream, return CPU µs per event and the delay of
    each event after its write (ms: median and max)."""
    from podplacement.kubeclient import KubeAPI

    api = KubeAPI(f"https://127.0.0.1:{port}", ssl_context=ssl.create_default_context(cafile=ca))
    delays: list[float] = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        async for event in api.watch(PATH, timeout_seconds=600, coalesce=coalesce):
            sent = float(event["object"]["metadata"]["annotations"]["bench/sent"])
            delays.append(time.time() - sent)
    finally:
        await api.close()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return {"events": len(delays), "us_per_event": 1e6 * cpu / max(1, len(delays)),
            "delay_p50_ms": 1e3 * statistics.median(delays) if delays else 0.0,
            "delay_max_ms": 1e3 * max(delays) if delays else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=3000, help="events per read (default 3000)")
    ap.add_argument("--rate", type=float, default=400.0,
                    help="events written per second (default 400: 2 per pod at 200 pods/s)")
    ap.add_argument("--coalesce", default="0,0.05,0.1",
                    help="hold times to compare, seconds, comma-separated (default 0,0.05,0.1)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--read", nargs=3, metavar=("PORT", "CA", "COALESCE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        d = Path(args.serve[1])
        serve(int(args.serve[0]), str(d / "tls.crt"), str(d / "tls.key"), args.events,
              args.rate)
        return
    if args.read:
        result = asyncio.run(read(int(args.read[0]), args.read[1], float(args.read[2])))
        print(json.dumps(result))
        return
    from podplacement.certs import generate_ca, issue_serving_cert
    from podplacement.sandbox.ports import free_port

    values = [float(v) for v in args.coalesce.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-watchread-") as tmp:
        d = Path(tmp)
        ca = generate_ca("bench-watchread-ca")
        serving = issue_serving_cert(ca, [], ["127.0.0.1"])
        (d / "ca.crt").write_bytes(ca.cert_pem)
        (d / "tls.crt").write_bytes(serving.cert_pem)
        (d / "tls.key").write_bytes(serving.key_pem)
        port = free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), tmp,
                                   "--events", str(args.events), "--rate", str(args.rate)])
        try:
            time.sleep(1.5)
            results: dict[float, list[dict[str, Any]]] = {v: [] for v in values}
            for r in range(args.rounds):
                for v in values:
                    out = subprocess.run([sys.executable, __file__, "--read", str(port),
                                          str(d / "ca.crt"), str(v)], check=True,
                                         capture_output=True, text=True, timeout=600).stdout
                    results[v].append(json.loads(out.strip().splitlines()[-1]))
                    row = results[v][-1]
                    print(f"round {r + 1}, coalesce {v:g} s: {row['us_per_event']:.1f} µs CPU "
                          f"per event, delay p50 {row['delay_p50_ms']:.1f} ms "
                          f"max {row['delay_max_ms']:.1f} ms", flush=True)
        finally:
            server.terminate()
            server.wait(10)
    print(f"\n== {args.events} events of ~3 kB at {args.rate:g}/s over TLS, one write each; "
          f"medians of {args.rounds} interleaved rounds")
    print(f"{'coalesce s':>10} {'CPU µs/event':>13} {'delay p50 ms':>13} {'delay max ms':>13}")
    for v in values:
        rows = results[v]
        print(f"{v:>10g} {statistics.median(x['us_per_event'] for x in rows):>13.1f} "
              f"{statistics.median(x['delay_p50_ms'] for x in rows):>13.1f} "
              f"{statistics.median(x['delay_max_ms'] for x in rows):>13.1f}")


if __name__ == "__main__":
    main()

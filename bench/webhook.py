"""Benchmark: admissions per second and p50/p99 latency of the webhook over TLS.

Starts ``podplacement webhook`` (uvicorn + uvloop + httptools, TLS with a generated ECDSA
certificate, a static PodPlacementConfig) as a separate process on 127.0.0.1 and drives it with
a load generator in another process: ``wrk`` when available (``--install-wrk`` installs the
Debian package when missing), else a Python aiohttp client with keep-alive. For each
concurrency (10 and 50 connections) it measures ``POST /mutate`` with the recorded
AdmissionReview ``admission-review-raw-a-plain-pod.json`` (a pod that gets gated) and
``POST /bare`` (same process and stack, constant answer) in rounds of back-to-back runs, and
prints a table with the median over the rounds of the mutate/bare ratio (single runs on this
shared machine move by +-20%; the runs of one round see the same conditions).
/mutate decodes the review selectively with msgspec when it is installed (else orjson parses the
whole body, ~10 us more per request): the header says which.

``--breakdown`` instead prints what /mutate adds over /bare per request, part by part, measured
in-process through the ASGI app (CPU time, best of many runs: steadier than the served figures
on a shared machine).

``--floor`` adds ``POST /bare-validate``: the bare endpoint plus the one thing /mutate cannot
skip, checking that the 5 KB body is JSON (so that a malformed one gets 400), with nothing
built. Its ratio is the ceiling of what /mutate can reach on the machine.

Usage: ``python bench/webhook.py [--duration 5] [--rounds 5] [--floor] [--connections 10 50]
[--client auto|wrk|aiohttp] [--install-wrk] [--breakdown]``
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (bench/inspect.py): keep it off sys.path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, MutableMapping  # noqa: E402
from typing import Any  # noqa: E402

from podplacement.sandbox.ports import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_SHARED = REPO.parent / "shared" / "reference"
REVIEW = (_SHARED if _SHARED.is_dir() else REPO / "tests" / "reference") / (
    "admission-review-raw-a-plain-pod.json")




def prepare(workdir: Path) -> tuple[Path, Path]:
    """Write certificates and a PodPlacementConfig; returns (cert_dir, config_file)."""
    sys.path.insert(0, str(REPO))
    from podplacement.certs import CertState, generate_ca, issue_serving_cert, write_dir

    ca = generate_ca()
    serving = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    cert_dir = workdir / "certs"
    write_dir(cert_dir, CertState(serving, ca.key_pem, (ca.cert_pem,)))
    config = workdir / "config.yaml"
    config.write_text("apiVersion: podplacement.io/v1beta1\nkind: PodPlacementConfig\n"
                      "metadata: {name: cluster}\nspec: {}\n")
    return cert_dir, config


def load_bareapp() -> Any:
    """The module ``bench/bareapp.py`` (the baselines added to the webhook's app)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_bareapp", REPO / "bench" / "bareapp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_server(cert_dir: Path, config: Path, port: int) -> subprocess.Popen[bytes]:
    """Start the webhook process and wait (at most 30 s) until /readyz answers 200."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "bareapp.py"),
         "--host", "127.0.0.1", "--port", str(port), "--cert-dir", str(cert_dir),
         "--config-file", str(config)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ctx = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"webhook exited: {err}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("webhook did not become ready in 30 s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- load generators ------------------------------------------------------------------------


def run_wrk(url: str, body: bytes, connections: int, duration: float,
            workdir: Path) -> dict[str, Any]:
    """Run wrk (2 threads) with a Lua script that POSTs ``body``; parse its report."""
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{int(duration)}s",
         "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
        return float(m.group(1)) * scale

    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return {"rps": rps, "p50_ms": pct("50"), "p99_ms": pct("99"), "requests": total,
            "failed": int(bad.group(1)) if bad else 0,
            "socket_errors": errors.group(0) if errors else ""}


async def _aiohttp_load(url: str, body: bytes, connections: int, duration: float,
                        cafile: str) -> dict[str, Any]:
    import aiohttp

    ctx = ssl.create_default_context(cafile=cafile)
    latencies: list[float] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=connections, ssl=ctx, force_close=False)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker(until: float, record: bool) -> None:
            nonlocal failed
            while True:
                start = time.perf_counter()
                if start >= until:
                    return
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
                end = time.perf_counter()
                if record:
                    latencies.append(end - start)
                    failed += not ok

        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(worker(warm, False) for _ in range(connections)))
        started = time.perf_counter()
        await asyncio.gather(*(worker(started + duration, True) for _ in range(connections)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {"rps": len(latencies) / elapsed, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "requests": len(latencies), "failed": failed, "socket_errors": ""}


def run_aiohttp(url: str, body_file: Path, connections: int, duration: float,
                cafile: Path) -> dict[str, Any]:
    """Run the aiohttp load generator in a separate process (uvloop); returns its report."""
    out = subprocess.run(
        [sys.executable, __file__, "--loadgen", url, str(body_file), str(connections),
         str(duration), str(cafile)],
        capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _loadgen_main(argv: list[str]) -> None:
    url, body_file, connections, duration, cafile = argv
    import uvloop

    result = uvloop.run(_aiohttp_load(url, Path(body_file).read_bytes(), int(connections),
                                      float(duration), cafile))
    print(json.dumps(result))


# --- in-process breakdown -------------------------------------------------------------------


def breakdown(rounds: int, *, cold_mib: float = 0.0) -> None:
    """Print the CPU cost per request of /bare and /mutate called straight through the ASGI
    app (no TLS, no sockets, no uvicorn), and of /mutate with its decoding or its decoding
    and gating replaced by constants: what /mutate adds over the bare endpoint, part by part.
    Best of ``rounds`` runs of 500 requests each (CPU time of this process), so it is far
    less sensitive to other load on the machine than the served figures. With ``cold_mib``,
    that many MiB of CPU cache are overwritten before each request, which is closer to the
    served situation than a hot loop of identical requests."""
    sys.path.insert(0, str(REPO))
    import orjson
    import uvloop

    import podplacement.webhook.app as app_module
    import podplacement.webhook.pipeline as pipeline_module
    import podplacement.webhook.review as review_module
    from podplacement.rules.config import PlacementConfig
    from podplacement.webhook.configsource import StaticConfigSource
    from podplacement.webhook.gating import GATED

    body = REVIEW.read_bytes()
    app = load_bareapp().add_baselines(app_module.create_app(StaticConfigSource(
        PlacementConfig())))
    parsed = review_module.parse_review(body)
    real_parse, real_gate = pipeline_module.parse_review, pipeline_module.should_gate

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        pass

    def parse_stub(body: bytes, *, resources: bool = True) -> tuple[str, Mapping[str, Any]]:
        return parsed  # same signature

    # --cold MIB: before each request (outside the timed part), write one byte per cache line
    # of a MIB-sized buffer, evicting what /bare and /mutate left in the CPU caches, as TLS,
    # the kernel, the load generator and other processes do between two served requests.
    cold = cold_mib > 0
    thrash = bytearray(int(cold_mib * (1 << 20)) // 64 * 64)
    stride = b"\x01" * (len(thrash) // 64)

    async def run(path: str, count: int) -> float:
        """CPU seconds spent in ``count`` requests to ``path`` (thrashing excluded)."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "https", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 443), "state": {}}
        spent = 0.0
        for _ in range(count):
            if cold:
                thrash[::64] = stride
            start = time.process_time()
            await app(dict(scope), receive, send)
            spent += time.process_time() - start
        return spent

    cases = {
        "bare": ("/bare", False, False),
        "mutate": ("/mutate", False, False),
        "mutate, decoding stubbed": ("/mutate", True, False),
        "mutate, decoding+gating stubbed": ("/mutate", True, True),
    }

    async def measure() -> dict[str, float]:
        best: dict[str, float] = {}
        for _ in range(rounds):
            for name, (path, no_parse, no_gate) in cases.items():
                pipeline_module.parse_review = parse_stub if no_parse else real_parse
                pipeline_module.should_gate = (lambda *_a, **_k: GATED) if no_gate else real_gate
                per_request = await run(path, 500) / 500 * 1e6
                best[name] = min(best.get(name, per_request), per_request)
        pipeline_module.parse_review, pipeline_module.should_gate = real_parse, real_gate
        return best

    best = uvloop.run(measure())
    print(f"in-process ASGI breakdown, CPU us per request (best of {rounds} x 500), "
          f"caches {f'{cold_mib:g} MiB flushed before each request' if cold else 'hot'}, "
          f"body {len(body)} B, /mutate decoder="
          f"{'msgspec' if review_module._REVIEW_DECODER is not None else 'orjson'}:")
    for name, cost in best.items():
        print(f"  {name:<32} {cost:6.1f}  (+{cost - best['bare']:5.1f} over bare)")
    decoders = {"orjson.loads (whole body)": lambda: orjson.loads(body)}
    if review_module._REVIEW_DECODER is not None:
        lean = review_module._REVIEW_DECODER
        decoders["msgspec selective decode"] = lambda: lean.decode(body)
    for name, fn in decoders.items():
        runs = []
        calls = 500 if cold else 2000
        for _ in range(rounds):
            spent = 0.0
            for _ in range(calls):
                if cold:
                    thrash[::64] = stride
                start = time.process_time()
                fn()
                spent += time.process_time() - start
            runs.append(spent / calls * 1e6)
        print(f"  {name:<32} {min(runs):6.1f}")


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    """Run the benchmark and print the table; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of back-to-back runs per concurrency; ratios are the "
                             "median over the rounds (shared machine: single runs are noisy)")
    parser.add_argument("--connections", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--client", choices=("auto", "wrk", "aiohttp"), default="auto")
    parser.add_argument("--install-wrk", action="store_true",
                        help="apt-get install -y wrk when it is missing")
    parser.add_argument("--floor", action="store_true",
                        help="also run /bare-validate, which only checks that the body is "
                             "JSON: the least /mutate must do, so its ratio bounds /mutate's")
    parser.add_argument("--breakdown", action="store_true",
                        help="only the in-process per-request CPU breakdown (no server)")
    parser.add_argument("--cold", type=float, default=0.0, metavar="MIB",
                        help="with --breakdown: overwrite MIB MiB of CPU cache before each "
                             "request (e.g. 1 = one core's L2 here, 8, 32 = the whole L3)")
    args = parser.parse_args()
    if args.breakdown:
        breakdown(max(args.rounds, 10), cold_mib=args.cold)
        return 0
    if args.install_wrk and not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=False,
                       stdout=subprocess.DEVNULL, env={**os.environ,
                                                       "DEBIAN_FRONTEND": "noninteractive"})
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "aiohttp"

    body = REVIEW.read_bytes()
    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        workdir = Path(tmp)
        cert_dir, config = prepare(workdir)
        body_file = workdir / "review.json"
        body_file.write_bytes(body)
        port = free_port()
        server = start_server(cert_dir, config, port)
        endpoints = ["bare", "mutate", *(["bare-validate"] if args.floor else [])]
        tables: list[tuple[int, dict[str, list[dict[str, Any]]]]] = []
        try:
            for conns in args.connections:
                runs: dict[str, list[dict[str, Any]]] = {e: [] for e in endpoints}
                for round_no in range(args.rounds):
                    # Each round runs every endpoint back to back, in turn forwards and
                    # backwards, so a machine that speeds up or slows down during the round
                    # favours none of them.
                    order = endpoints if round_no % 2 == 0 else endpoints[::-1]
                    for endpoint in order:
                        url = f"https://127.0.0.1:{port}/{endpoint}"
                        cpu_before = cpu_seconds(server.pid)
                        if client == "wrk":
                            result = run_wrk(url, body, conns, args.duration, workdir)
                        else:
                            result = run_aiohttp(url, body_file, conns, args.duration,
                                                 cert_dir / "ca.crt")
                        cpu = cpu_seconds(server.pid) - cpu_before
                        result["cpu_us"] = cpu / max(result["requests"], 1) * 1e6
                        runs[endpoint].append(result)
                tables.append((conns, runs))
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    import importlib.util

    decoder = "msgspec" if importlib.util.find_spec("msgspec") else "orjson (msgspec missing)"
    print(f"webhook benchmark: TLS (ECDSA P-256), body {len(body)} B "
          f"({REVIEW.name}), /mutate decoder={decoder}, client={client}, "
          f"{args.rounds} rounds of {args.duration:g} s runs per endpoint and concurrency, "
          f"{os.cpu_count()} CPUs (server, load generator and anything else share them)")
    print("A round runs the endpoints back to back (in turn forwards and backwards); "
          "'ratio' is the median over the rounds of endpoint/bare, for req/s and for the "
          "server's CPU time per request ('cpu us/req': bare cpu / endpoint cpu, the "
          "throughput ratio of a CPU-bound server). Rounds cancel most of the drift of a "
          "shared machine, which moves single runs by +-20%. Other columns: median run. "
          "bare-validate (--floor) only checks that the body is JSON: the least /mutate does.")
    print(f"{'conns':>5} {'endpoint':<13} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'requests':>8} {'failed':>6} {'cpu us/req':>10} {'req/s ratio':>11} "
          f"{'cpu ratio':>9}")
    for conns, runs in tables:
        for endpoint, endpoint_runs in runs.items():
            r = dict(sorted(endpoint_runs, key=lambda run: run["rps"])[len(endpoint_runs) // 2])
            cpus = sorted(run["cpu_us"] for run in endpoint_runs)
            failed = sum(run["failed"] for run in endpoint_runs)
            ratios = ""
            if endpoint != "bare":
                pair_rps = sorted(e["rps"] / b["rps"] for b, e in zip(
                    runs["bare"], endpoint_runs, strict=True))
                pair_cpu = [b["cpu_us"] / e["cpu_us"] for b, e in zip(
                    runs["bare"], endpoint_runs, strict=True) if e["cpu_us"]]
                rps_ratio, cpu_ratio = statistics.median(pair_rps), statistics.median(pair_cpu)
                ratios = (f"{rps_ratio:>10.2f}x {cpu_ratio:>8.2f}x  "
                          f"rounds: req/s {[round(x, 2) for x in pair_rps]}")
            print(f"{conns:>5} {endpoint:<13} {r['rps']:>7.0f} {r['p50_ms']:>7.2f} "
                  f"{r['p99_ms']:>7.2f} {r['requests']:>8} {failed:>6} "
                  f"{cpus[len(cpus) // 2]:>10.0f} {ratios}"
                  + (f"  {r['socket_errors']}" if r.get("socket_errors") else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--loadgen":
        _loadgen_main(sys.argv[2:])
        raise SystemExit(0)
    raise SystemExit(main())

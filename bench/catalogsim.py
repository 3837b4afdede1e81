"""The catalog's hit ratio under a skewed image mix, for several bounds, with the product's own
``ParamsStore`` (no cluster): what the params object can reach, and what no catalog can.

A pod is a *hit* when the catalog holds its image as the pod is created (the admission policy
can place it then). Pods name tags drawn from a Zipf distribution (``--skew``, default 1.1,
over ``--tags`` tags, as ``bench/scale.py``); each image is recorded right after its first
pod (an instant feed: the real feed takes about 2 s, see docs/benchmarks.md). Printed per
bound, for the pods in each window of ``--windows``:

- ``unbounded``: the hit ratio of a catalog that keeps everything (the ceiling: the rest
  are first sightings, which no catalog can place);
- ``LRU n``: :class:`rules.admit.imageparams.ParamsStore` with ``max_entries=n`` and the
  product's byte bound (:data:`rules.config.PARAMS_MAX_BYTES`), entries touched on
  every hit as the admission feed does (:meth:`ParamsStore.touch`);
- how many entries the byte bound holds for references as long as ``--ref-length``.

With ``--json FILE`` it also writes the figures as JSON (what ``bench/plots.py`` draws): per
catalog its hit ratio in each window and in every ``--curve-step`` pods (the curve).

Usage: ``python bench/catalogsim.py`` (about 20 s); ``--help`` for the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/catalogsim.py` puts bench/ first on sys.path, where bench/inspect.py would
# shadow the standard library's inspect; the repository root goes first instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import bisect  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from podplacement.rules.admit.imageparams import ParamsStore  # noqa: E402
from podplacement.rules.config import PARAMS_MAX_BYTES, PARAMS_MAX_ENTRIES  # noqa: E402

#: What every image is recorded with (an amd64+arm64 image: a typical value length).
PAIRS = (("linux", "amd64"), ("linux", "arm64"))


def zipf_draws(tags: int, skew: float, pods: int, seed: int) -> list[int]:
    """``pods`` tag ranks (0 = the most popular) drawn from Zipf(``skew``) over ``tags``."""
    cum = list(itertools.accumulate(1.0 / (k ** skew) for k in range(1, tags + 1)))
    total = cum[-1]
    rng = random.Random(seed)
    return [bisect.bisect_left(cum, rng.random() * total) for _ in range(pods)]


def reference(rank: int, length: int) -> str:
    """A tag reference of exactly ``length`` characters (at least 40) for tag ``rank``."""
    head = f"registry.example.com/team-{rank % 97}/service-{rank}"
    tail = f":v{rank}"
    pad = max(0, length - len(head) - len(tail))
    return head + "x" * pad + tail


def hits_with(store: ParamsStore | None, refs: Sequence[str]) -> list[bool]:
    """Per pod: the catalog held its image at creation; then the image is recorded."""
    seen: set[str] = set()
    out = []
    now = time.time()
    for ref in refs:
        if store is None:
            out.append(ref in seen)
            seen.add(ref)
            continue
        hit = ref in store
        out.append(hit)
        if hit:
            store.touch(ref)
        else:
            store.record(ref, PAIRS, now, learned=now)
    return out


def capacity(length: int) -> int:
    """Entries of ``length``-character references the byte bound holds (entries bound off)."""
    store = ParamsStore(86400.0, max_entries=10**9)
    now = time.time()
    for i in itertools.count():
        store.record(reference(i, length), PAIRS, now, learned=now)
        if len(store) <= i:
            return len(store)
    raise AssertionError("unreachable")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tags", type=int, default=50_000, help="tags (default 50000)")
    ap.add_argument("--skew", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    ap.add_argument("--pods", type=int, default=100_000, help="pods (default 100000)")
    ap.add_argument("--bounds", default=f"{PARAMS_MAX_ENTRIES},10000,20000",
                    help="entry bounds to try, comma-separated")
    ap.add_argument("--windows", default="0:10000,40000:50000,90000:100000",
                    help="pod windows start:end, comma-separated")
    ap.add_argument("--ref-length", type=int, default=60,
                    help="characters per image reference (default 60)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--curve-step", type=int, default=2000,
                    help="pods per point of the JSON curve (default 2000)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="also write the figures as JSON to FILE (bench/plots.py draws them)")
    args = ap.parse_args(argv)
    if args.curve_step <= 0:
        ap.error("--curve-step must be positive")
    try:
        bounds = [int(b) for b in args.bounds.split(",")]
        windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    except ValueError as exc:
        ap.error(f"--bounds/--windows: {exc}")
    draws = zipf_draws(args.tags, args.skew, args.pods, args.seed)
    refs = [reference(r, args.ref_length) for r in draws]
    fits = capacity(args.ref_length)
    print(f"{args.pods} pods, Zipf s={args.skew} over {args.tags} tags, references of "
          f"{args.ref_length} characters; the byte bound ({PARAMS_MAX_BYTES} bytes) holds "
          f"{fits} entries")
    print("| catalog | " + " | ".join(f"pods {a + 1}-{b}" for a, b in windows) + " |")
    print("|---|" + "---|" * len(windows))
    arms: list[tuple[str, ParamsStore | None]] = [("unbounded (no catalog does better)", None)]
    arms += [(f"LRU {b} entries (byte bound: {min(b, fits)} held)",
              ParamsStore(86400.0, max_entries=b)) for b in bounds]
    recorded = []
    for (name, store), bound in zip(arms, [None, *bounds], strict=True):
        hits = hits_with(store, refs)
        shares = [sum(hits[a:b]) / max(1, len(hits[a:b])) for a, b in windows]
        print(f"| {name} | " + " | ".join(f"{v:.1%}" for v in shares) + " |")
        recorded.append({
            "name": name, "bound": bound, "held": None if bound is None else min(bound, fits),
            "windows": shares,
            "curve": [sum(hits[i:i + args.curve_step]) / len(hits[i:i + args.curve_step])
                      for i in range(0, len(hits), args.curve_step)]})
    top = {b: sum(1 for r in draws if r < b) / len(draws) for b in (*bounds, fits)}
    print("share of pods naming the n most popular tags: "
          + ", ".join(f"{n}: {v:.1%}" for n, v in sorted(top.items())))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "command": "python bench/catalogsim.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "pods": args.pods, "tags": args.tags, "skew": args.skew,
            "ref_length": args.ref_length, "max_bytes": PARAMS_MAX_BYTES, "fits": fits,
            "windows": windows, "curve_step": args.curve_step, "catalogs": recorded,
            "top": {str(n): v for n, v in sorted(top.items())}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

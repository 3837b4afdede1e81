"""The catalog's hit ratio under a skewed image mix, for several bounds, with the product's own
``ParamsStore`` (no cluster): what the params object can reach, and what no catalog can.

A pod is a *hit* when the catalog holds its image as the pod is created (the admission policy
can place it then). Pods name tags drawn from a Zipf distribution (``--skew``, default 1.1,
over ``--tags`` tags, as ``bench/scale.py``); each image is recorded right after its first
pod (an instant feed: the real feed takes about 2 s, see docs/benchmarks.md). Two shapes of
references are simulated, each printed with:

- ``one repository per tag``: ``registry.example.com/team-<r % 97>/service-<r>...:v<r>``,
  ``--ref-length`` characters (the worst case of the dense layout: nothing shared);
- ``scale.py``: bench/scale.py's references, tag ``z<k>`` of ``--repos`` repositories
  (``127.0.0.1:5000/bench/multi:z<k>``, ... as bench/cluster.py's REPOS, ``k % repos``).

For each shape: the bytes per entry and the entries the byte bound
(:data:`rules.config.PARAMS_MAX_BYTES`) holds in the previous release's flat layout
(``spec.images`` + ``spec.learned``, every reference written twice) and in the dense one
(:class:`rules.admit.imageparams.ParamsStore`: a repository once, a platform-set code, a
learned time per tag), then the hit ratio for the pods in each window of ``--windows``:

- ``unbounded``: a catalog that keeps everything (no catalog does better: the rest are
  first sightings);
- ``flat, 5,000 entries``: the previous release (its entries bound and the byte bound, LRU);
- ``flat, bytes only``: the flat layout with the byte bound alone;
- ``dense``: the product's ``ParamsStore`` with its bounds (the *ceiling* of the catalog),
  entries touched on every hit as the admission feed does (:meth:`ParamsStore.touch`).

With ``--json FILE`` it also writes the figures as JSON (what ``bench/plots.py`` draws): per
shape and catalog its hit ratio in each window and in every ``--curve-step`` pods (the
curve). :func:`ceiling` is what bench/scale.py prints beside its in-process share.

Usage: ``python bench/catalogsim.py`` (about 30 s); ``--help`` for the options.
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
from collections import OrderedDict  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

import orjson  # noqa: E402

from podplacement.rules.admit.imageparams import ParamsStore  # noqa: E402
from podplacement.rules.config import (  # noqa: E402
    PARAMS_LEGACY_MAX_ENTRIES,
    PARAMS_MAX_BYTES,
    PARAMS_MAX_ENTRIES,
)

#: What every image is recorded with (an amd64+arm64 image: a typical value length).
PAIRS = (("linux", "amd64"), ("linux", "arm64"))
#: bench/cluster.py's REPOS (its repositories, in order), and the registry of bench/scale.py.
SCALE_REPOS = ("bench/multi", "bench/amd", "bench/arm")
SCALE_REGISTRY = "127.0.0.1:5000"
#: A learned time of today's length (ten digits).
NOW = 1_765_000_000.0


def zipf_draws(tags: int, skew: float, pods: int, seed: int) -> list[int]:
    """``pods`` tag ranks (0 = the most popular) drawn from Zipf(``skew``) over ``tags``."""
    cum = list(itertools.accumulate(1.0 / (k ** skew) for k in range(1, tags + 1)))
    total = cum[-1]
    rng = random.Random(seed)
    return [bisect.bisect_left(cum, rng.random() * total) for _ in range(pods)]


def reference(rank: int, length: int) -> str:
    """A tag reference of exactly ``length`` characters (at least 40) for tag ``rank``, in a
    repository of its own."""
    head = f"registry.example.com/team-{rank % 97}/service-{rank}"
    tail = f":v{rank}"
    pad = max(0, length - len(head) - len(tail))
    return head + "x" * pad + tail


def scale_reference(rank: int, repos: int) -> str:
    """bench/scale.py's reference of tag ``z<rank>``: repository ``rank % repos`` (its three
    first, then ``bench/r<j>``)."""
    j = rank % repos
    repo = SCALE_REPOS[j] if j < len(SCALE_REPOS) else f"bench/r{j}"
    return f"{SCALE_REGISTRY}/{repo}:z{rank}"


class FlatLRU:
    """The previous release's catalog for the simulation: flat ``spec.images`` (reference →
    pairs) and ``spec.learned`` (tag reference → seconds), LRU within ``max_entries`` and
    ``max_bytes`` of the two maps' compact JSON (its ``ParamsStore`` did the same)."""

    def __init__(self, max_entries: int, max_bytes: int = PARAMS_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: OrderedDict[str, int] = OrderedDict()
        self.items = 0  # the entries' bytes (each item with its separator)

    @property
    def bytes(self) -> int:
        """The two maps' compact JSON size ({...} is 1 + its items, {} is 2)."""
        return self.items + (2 if self.entries else 4)

    @staticmethod
    def entry_bytes(ref: str, value: str = "linux/amd64,linux/arm64") -> int:
        """``"ref":"value",`` in spec.images and ``"ref":seconds,`` in spec.learned."""
        key = len(orjson.dumps(ref))
        return key + len(orjson.dumps(value)) + 2 + key + len(str(int(NOW))) + 2

    def __contains__(self, ref: str) -> bool:
        return ref in self.entries

    def touch(self, ref: str) -> None:
        self.entries.move_to_end(ref)

    def record(self, ref: str) -> None:
        size = self.entry_bytes(ref)
        self.entries[ref] = size
        self.items += size
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            self.items -= self.entries.popitem(last=False)[1]


Catalog = ParamsStore | FlatLRU | None


def hits_with(store: Catalog, refs: Sequence[str]) -> list[bool]:
    """Per pod: the catalog held its image at creation; then the image is recorded (a
    ``None`` catalog keeps everything)."""
    seen: set[str] = set()
    out = []
    for ref in refs:
        if store is None:
            out.append(ref in seen)
            seen.add(ref)
            continue
        hit = ref in store
        out.append(hit)
        if hit:
            store.touch(ref)
        elif isinstance(store, FlatLRU):
            store.record(ref)
        else:
            store.record(ref, PAIRS, NOW, learned=NOW)
    return out


def dense_store() -> ParamsStore:
    """The product's catalog with its bounds (a TTL no simulated pod reaches)."""
    return ParamsStore(86400.0)


def ceiling(refs: Sequence[str]) -> list[bool]:
    """Per pod of ``refs``: a hit of the product's catalog with an instant feed (the most
    any feed reaches within the bounds): what bench/scale.py prints beside its share."""
    return hits_with(dense_store(), refs)


def capacity(shape: Callable[[int], str]) -> tuple[int, float, int, float]:
    """(entries held, bytes per entry) of the references ``shape(0), shape(1), ...`` in the
    flat layout (its entries bound off) and in the dense one (``ParamsStore``, its entries
    bound off): how many the byte bound holds in each."""
    flat = FlatLRU(max_entries=10**9)
    for i in itertools.count():
        flat.record(shape(i))
        if len(flat.entries) <= i:
            break
    flat_held = len(flat.entries)
    store = ParamsStore(86400.0, max_entries=10**9)
    for i in itertools.count():
        store.record(shape(i), PAIRS, NOW, learned=NOW)
        if store.evictions:
            break
    return (flat_held, flat.items / max(1, flat_held),
            len(store), (store.json_size - 6) / max(1, len(store)))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tags", type=int, default=50_000, help="tags (default 50000)")
    ap.add_argument("--skew", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    ap.add_argument("--pods", type=int, default=100_000, help="pods (default 100000)")
    ap.add_argument("--windows", default="0:10000,40000:50000,90000:100000",
                    help="pod windows start:end, comma-separated")
    ap.add_argument("--ref-length", type=int, default=60,
                    help="characters per image reference of the one-repository-per-tag "
                         "shape (default 60)")
    ap.add_argument("--repos", type=int, default=3,
                    help="repositories of the scale.py shape (default 3, as bench/scale.py)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--curve-step", type=int, default=2000,
                    help="pods per point of the JSON curve (default 2000)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="also write the figures as JSON to FILE (bench/plots.py draws them)")
    args = ap.parse_args(argv)
    if args.curve_step <= 0 or args.repos <= 0:
        ap.error("--curve-step and --repos must be positive")
    try:
        windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    except ValueError as exc:
        ap.error(f"--windows: {exc}")
    draws = zipf_draws(args.tags, args.skew, args.pods, args.seed)
    print(f"{args.pods} pods, Zipf s={args.skew} over {args.tags} tags; the byte bound "
          f"{PARAMS_MAX_BYTES} bytes")
    shapes: list[tuple[str, str, Callable[[int], str]]] = [
        ("one-repository-per-tag", f"one repository per tag, references of "
         f"{args.ref_length} characters", lambda r: reference(r, args.ref_length)),
        ("scale", f"bench/scale.py: tags z<k> over {args.repos} repositories",
         lambda r: scale_reference(r, args.repos)),
    ]
    out_shapes = []
    for key, title, shape in shapes:
        refs = [shape(r) for r in draws]
        flat_held, flat_bytes, dense_held, dense_bytes = capacity(shape)
        print(f"\n{title} (e.g. {shape(12345)}): the byte bound holds {flat_held} entries "
              f"flat ({flat_bytes:.1f} bytes each), {dense_held} dense ({dense_bytes:.1f} "
              "bytes each)")
        print("| catalog | " + " | ".join(f"pods {a + 1}-{b}" for a, b in windows)
              + " | all |")
        print("|---|" + "---|" * (len(windows) + 1))
        # (name, catalog, its entries bound and the entries the bounds hold: for the plot)
        arms: list[tuple[str, Catalog, int | None, int | None]] = [
            ("unbounded (no catalog does better)", None, None, None),
            (f"flat, {PARAMS_LEGACY_MAX_ENTRIES} entries (the release before)",
             FlatLRU(PARAMS_LEGACY_MAX_ENTRIES), PARAMS_LEGACY_MAX_ENTRIES,
             min(PARAMS_LEGACY_MAX_ENTRIES, flat_held)),
            (f"flat, bytes only ({flat_held} held)", FlatLRU(10**9), flat_held, flat_held),
            (f"dense, the product's bounds ({dense_held} held): the ceiling", dense_store(),
             PARAMS_MAX_ENTRIES, dense_held),
        ]
        recorded = []
        for name, store, bound, held in arms:
            hits = hits_with(store, refs)
            shares = [sum(hits[a:b]) / max(1, len(hits[a:b])) for a, b in windows]
            total = sum(hits) / max(1, len(hits))
            print(f"| {name} | " + " | ".join(f"{v:.1%}" for v in shares)
                  + f" | {total:.1%} |")
            recorded.append({
                "name": name, "bound": bound, "held": held, "windows": shares, "all": total,
                "curve": [sum(hits[i:i + args.curve_step]) / len(hits[i:i + args.curve_step])
                          for i in range(0, len(hits), args.curve_step)]})
        out_shapes.append({"shape": key, "title": title,
                           "ref_length": sum(map(len, refs)) / max(1, len(refs)),
                           "flat_held": flat_held,
                           "flat_bytes_per_entry": flat_bytes, "dense_held": dense_held,
                           "dense_bytes_per_entry": dense_bytes, "catalogs": recorded})
    top = {b: sum(1 for r in draws if r < b) / len(draws)
           for b in sorted({PARAMS_LEGACY_MAX_ENTRIES, *(s["dense_held"] for s in out_shapes),
                            *(s["flat_held"] for s in out_shapes)})}
    print("\nshare of pods naming the n most popular tags: "
          + ", ".join(f"{n}: {v:.1%}" for n, v in sorted(top.items())))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "command": "python bench/catalogsim.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "pods": args.pods, "tags": args.tags, "skew": args.skew,
            "repos": args.repos, "max_bytes": PARAMS_MAX_BYTES,
            "windows": windows, "curve_step": args.curve_step, "shapes": out_shapes,
            # what bench/plots.py draws: the scale.py shape
            "ref_length": round(out_shapes[-1]["ref_length"]),
            "catalogs": out_shapes[-1]["catalogs"], "fits": out_shapes[-1]["dense_held"],
            "top": {str(n): v for n, v in sorted(top.items())}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Plots of the recorded benchmark figures: ``bench/results/*.json`` → ``docs/benchmarks/*.svg``.

The benchmarks write their figures as JSON when asked (``bench/cluster.py --save FILE``,
``bench/scale.py --save FILE``, ``bench/catalogsim.py --json FILE``, ``bench/nodememory.py
--json``); the runs recorded in ``bench/results/`` (the command of each is in
:data:`FIGURES` and in docs/benchmarks.md) are drawn here, one SVG per figure, shown in
docs/benchmarks.md beside its tables. matplotlib (the ``bench`` extra) draws them, without
pyplot (no global state, no display).

Each SVG carries a stamp in its metadata: the SHA-256 of this file and of the results file
it was drawn from. ``--check`` reads the stamps only (no matplotlib needed) and fails, one
line per plot, when a plot is missing or was drawn from other results or by other code than
what is committed: regenerate with ``python bench/plots.py``. The SVGs are written
reproducibly (no date, fixed ids, text kept as text), so the same inputs and the same
matplotlib give the same bytes.

Usage: ``python bench/plots.py [--results bench/results] [--out docs/benchmarks] [--check]``.
Exit status 0; 1 when ``--check`` finds a plot missing or stale, a results file is missing or
malformed, or matplotlib is not installed (one line each, no traceback).
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect`` (which matplotlib imports):
# put the project root first on sys.path instead of this script's directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

RESULTS = Path(_ROOT) / "bench" / "results"
OUT = Path(_ROOT) / "docs" / "benchmarks"
#: What precedes the digest in an SVG's metadata (``dc:description``).
STAMP = "podplacement bench/plots.py sha256="
_STAMP_RE = re.compile(re.escape(STAMP) + r"([0-9a-f]{64})")
#: Text sizes and the figure width (inches) of every plot.
WIDTH = 7.5


class ResultsError(Exception):
    """A results file is missing or not what its figure expects (the message is one line)."""


@dataclass(frozen=True)
class Figure:
    """One plot: ``docs/benchmarks/<name>.svg`` drawn by ``draw`` from ``results/<source>``.

    ``command`` is how ``source`` was recorded (shown by ``--check`` and in the docs).
    """

    name: str
    source: str
    command: str
    draw: Callable[[Any], MplFigure]


def _new_figure(rows: int = 1, height: float = 3.6) -> tuple[MplFigure, Any]:
    """A figure of ``rows`` stacked axes (matplotlib's object API, no pyplot)."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(WIDTH, height * rows), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    return fig, axes


# ------------------------------------------------------------------ bench/catalogsim.py


def draw_catalog(data: Mapping[str, Any]) -> MplFigure:
    """The catalog's hit ratio along the pods, one line per catalog (``--json`` of
    bench/catalogsim.py: ``catalogs[].curve`` per ``curve_step`` pods)."""
    fig, (ax,) = _new_figure(height=3.8)
    step = int(data["curve_step"])
    for cat in data["catalogs"]:
        curve = [float(v) * 100 for v in cat["curve"]]
        xs = [(i * step + min(step, int(data["pods"]) - i * step) / 2) / 1000
              for i in range(len(curve))]
        label = ("unbounded (the ceiling)" if cat["bound"] is None
                 else f"LRU {cat['bound']:,} entries ({cat['held']:,} held)")
        ax.plot(xs, curve, label=label, linewidth=1.4,
                linestyle="--" if cat["bound"] is None else "-")
    ax.set_xlabel(f"pods created (thousands; each point: {step:,} pods)")
    ax.set_ylabel("pods the catalog held (%)")
    ax.set_title(f"Catalog hit ratio: Zipf s={data['skew']} over {int(data['tags']):,} tags, "
                 f"{int(data['ref_length'])}-character references, "
                 f"{int(data['max_bytes']):,}-byte bound", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


# ------------------------------------------------------------------ bench/cluster.py


def _cluster_arms(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """The product and floor arms, in the order of the first round that has them all."""
    if not rounds or any("bare" not in r for r in rounds):
        raise ResultsError("every round needs a bare arm")
    names: list[str] = []
    for r in rounds:
        names += [n for n in r if n != "bare" and n not in names]
    return names


def draw_cluster_ratio(rounds: Sequence[Mapping[str, Any]]) -> MplFigure:
    """Pods bound/s over bare's in the same round, per arm: each round a dot, the median a
    bar (``--save`` of bench/cluster.py: per round, per arm, ``bound_per_s``)."""
    arms = _cluster_arms(rounds)
    fig, (ax,) = _new_figure(height=3.4)
    for i, arm in enumerate(arms):
        ratios = [r[arm]["bound_per_s"] / r["bare"]["bound_per_s"] for r in rounds if arm in r]
        ax.bar(i, statistics.median(ratios), width=0.6, color="C0", alpha=0.45)
        ax.plot([i] * len(ratios), ratios, "o", color="C0", markersize=4)
        ax.annotate(f"{statistics.median(ratios):.2f}", (i + 0.3, statistics.median(ratios)),
                    textcoords="offset points", xytext=(3, 0), ha="left", va="center",
                    fontsize=8)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("pods bound/s ÷ bare's (same round)")
    bare = [r["bare"]["bound_per_s"] for r in rounds]
    ax.set_title(f"Rate against bare, {len(rounds)} rounds of {rounds[0]['bare']['pods']:,} "
                 f"pods (bare {min(bare):.0f} to {max(bare):.0f} pods/s); bar: median",
                 fontsize=10)
    return fig


def draw_cluster_cpu(rounds: Sequence[Mapping[str, Any]]) -> MplFigure:
    """CPU milliseconds per pod of every process group (bench/cluster.py's ``group_cpu``),
    median over rounds, stacked per arm."""
    from bench.cluster import HOST_GROUPS, group_cpu

    arms = ["bare", *_cluster_arms(rounds)]
    per_arm: dict[str, dict[str, float]] = {}
    for arm in arms:
        runs = [r[arm] for r in rounds if arm in r]
        groups = [group_cpu(run["cpu"], run["bench_cpu"]) for run in runs]
        per_arm[arm] = {g: statistics.median(x[g] * 1000 / run["pods"]
                                             for x, run in zip(groups, runs, strict=True))
                        for g in HOST_GROUPS}
    fig, (ax,) = _new_figure(height=3.6)
    left = [0.0] * len(arms)
    for k, group in enumerate(HOST_GROUPS):
        widths = [per_arm[a][group] for a in arms]
        ax.barh(range(len(arms)), widths, left=left, label=group, color=f"C{k}")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, total in enumerate(left):
        ax.annotate(f"{total:.1f}", (total, i), textcoords="offset points", xytext=(3, 0),
                    va="center", fontsize=8)
    ax.set_yticks(range(len(arms)), arms)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    ax.set_xlabel("CPU ms per pod, median over rounds (every process on the machine)")
    ax.set_title("Where the CPU goes, per arm", fontsize=10)
    ax.set_xlim(right=max(left) * 1.08)
    fig.legend(fontsize=8, ncol=len(HOST_GROUPS), loc="outside lower center")
    return fig


# ------------------------------------------------------------------ bench/scale.py

#: bench/scale.py's processes drawn (its PROCESS_ORDER's first five: the RSS table).
SCALE_PROCESSES = ("controller (leader)", "controller (standby)", "webhook", "kube-apiserver",
                   "etcd")


def draw_scale_memory(data: Mapping[str, Any]) -> MplFigure:
    """RSS (MiB) of each process at each checkpoint, with its peak as a thin line
    (``--save`` of bench/scale.py: ``checkpoints[].rss_kib`` / ``hwm_kib``)."""
    cps = data["checkpoints"]
    fig, (ax,) = _new_figure(height=3.8)
    pods = [int(cp["pods"]) for cp in cps]
    for k, name in enumerate(SCALE_PROCESSES):
        rss = [cp["rss_kib"].get(name) for cp in cps]
        hwm = [cp["hwm_kib"].get(name) for cp in cps]
        xs = [p for p, v in zip(pods, rss, strict=True) if v is not None]
        ax.plot(xs, [v / 1024 for v in rss if v is not None], "o-", color=f"C{k}", label=name)
        ax.plot(xs, [v / 1024 for v in hwm if v is not None], ":", color=f"C{k}",
                linewidth=0.9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(pods, [f"{p:,}" for p in pods])
    low, high = ax.get_ylim()
    ticks = [t for t in (50, 100, 200, 500, 1000, 2000, 5000, 10000) if low <= t <= high]
    ax.set_yticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("pods in the cluster")
    ax.set_ylabel("RSS MiB (dotted: peak)")
    ax.set_title("Memory at each checkpoint", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def draw_scale_share(data: Mapping[str, Any]) -> MplFigure:
    """At each checkpoint: the share of pods placed in-process (by the admission policy)
    against the catalog's ideal and LRU ceilings for the same pods, and the rate over bare at
    the same size (median over the stretch pairs)."""
    cps = data["checkpoints"]
    fig, (top, bottom) = _new_figure(rows=2, height=2.7)
    pods = [int(cp["pods"]) for cp in cps]
    placed, hit, ideal, lru, ratio = [], [], [], [], []
    for cp in cps:
        stretch = bool(cp["stretches"])
        paths = cp["paths_stretch"] if stretch else cp["paths_fill"]
        h = cp["hit_stretch"] if stretch else cp["hit_fill"]
        placed.append(100 * paths.get("admission", 0) / max(1, sum(paths.values())))
        hit.append(100 * h[0])
        ideal.append(100 * h[1])
        lru.append(100 * h[2])
        ratio.append(statistics.median(s["product"] / s["bare"] for s in cp["stretches"])
                     if stretch else float("nan"))
    top.plot(pods, placed, "o-", label="placed by the policy (all pods)")
    top.plot(pods, hit, "s-", label="placed by the policy (not Always)")
    top.plot(pods, lru, "^--", label="ceiling within the catalog's bound (LRU)")
    top.plot(pods, ideal, "v--", label="ceiling, unbounded catalog")
    top.set_ylabel("share of pods (%)")
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_title("In-process placement and its ceiling", fontsize=10)
    bottom.plot(pods, ratio, "o-", color="C4")
    bottom.set_ylim(0, max([1.0, *[r for r in ratio if r == r]]) * 1.1)
    bottom.set_ylabel("rate ÷ bare's")
    bottom.set_title("Pods bound/s against a bare stretch at the same size", fontsize=10)
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.set_xticks(pods, [f"{p:,}" for p in pods])
        ax.minorticks_off()
    bottom.set_xlabel("pods in the cluster")
    return fig


# ------------------------------------------------------------------ bench/nodememory.py


def draw_informers(data: Mapping[str, Mapping[str, float]]) -> MplFigure:
    """What each informer holds after a list and its peak during it, MiB (``--json`` of
    bench/nodememory.py)."""
    names = list(data)
    fig, (ax,) = _new_figure(height=3.2)
    ys = range(len(names))
    held = [float(data[n]["held_mib"]) for n in names]
    peak = [float(data[n]["peak_mib"]) for n in names]
    ax.barh([y - 0.2 for y in ys], held, height=0.4, label="held after the list")
    ax.barh([y + 0.2 for y in ys], peak, height=0.4, label="peak during the list")
    for y, h, p in zip(ys, held, peak, strict=True):
        ax.annotate(f"{h:.1f}", (h, y - 0.2), textcoords="offset points", xytext=(3, 0),
                    va="center", fontsize=7)
        ax.annotate(f"{p:.1f}", (p, y + 0.2), textcoords="offset points", xytext=(3, 0),
                    va="center", fontsize=7)
    ax.set_yticks(list(ys), [f"{n} ({int(data[n]['objects']):,})" for n in names])
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    ax.set_xlabel("MiB of Python heap (tracemalloc)")
    ax.set_title("What the controller's informers hold", fontsize=10)
    ax.set_xlim(right=max(peak + held) * 1.1)
    fig.legend(fontsize=8, ncol=2, loc="outside lower center")
    return fig


CLUSTER_RUN = ("python bench/cluster.py --scenario warm,always,new-images,floor-place "
               "--rounds 3 --pods 1000 --no-audit --save bench/results/cluster.json")
SCALE_RUN = ("python bench/scale.py --nodes 1000 --tags 10000 --checkpoints 2000,5000,10000 "
             "--stretch 500 --stretch-rounds 1 --lease-duration 8 "
             "--save bench/results/scale.json")

#: Every plot, in the order of docs/benchmarks.md.
FIGURES: tuple[Figure, ...] = (
    Figure("cluster-ratio", "cluster.json", CLUSTER_RUN, draw_cluster_ratio),
    Figure("cluster-cpu", "cluster.json", CLUSTER_RUN, draw_cluster_cpu),
    Figure("scale-memory", "scale.json", SCALE_RUN, draw_scale_memory),
    Figure("scale-share", "scale.json", SCALE_RUN, draw_scale_share),
    Figure("informer-memory", "nodememory.json",
           "python bench/nodememory.py --json > bench/results/nodememory.json",
           draw_informers),
    Figure("catalog-ceiling", "catalogsim.json",
           "python bench/catalogsim.py --json bench/results/catalogsim.json", draw_catalog),
)


def digest(source: bytes) -> str:
    """SHA-256 (hex) of this module's source and of a results file's bytes: what a plot was
    drawn by and from."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(b"\0")
    h.update(source)
    return h.hexdigest()


def stamp_of(svg: Path) -> str | None:
    """The digest stamped in ``svg``'s metadata, or None (no stamp, or unreadable)."""
    try:
        found = _STAMP_RE.search(svg.read_text(errors="replace"))
    except OSError:
        return None
    return found.group(1) if found else None


def _read(results: Path, fig: Figure) -> tuple[bytes, Any]:
    """The results file's bytes and its parsed JSON.

    Raises:
        ResultsError: missing or not JSON.
    """
    path = results / fig.source
    try:
        raw = path.read_bytes()
        return raw, json.loads(raw)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror}); record it with: "
                           f"{fig.command}") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not JSON ({exc})") from None


def render(fig: Figure, results: Path, out: Path) -> Path:
    """Draw ``fig`` from ``results`` into ``out/<name>.svg`` (reproducible bytes, stamped).

    Raises:
        ResultsError: the results file is missing or malformed (one-line message).
    """
    import matplotlib

    raw, data = _read(results, fig)
    matplotlib.rcParams.update({"svg.hashsalt": fig.name, "svg.fonttype": "none",
                                "font.size": 9, "axes.titlesize": 10})
    try:
        drawn = fig.draw(data)
    except (ResultsError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError,
            statistics.StatisticsError) as exc:
        raise ResultsError(f"{results / fig.source}: not what {fig.name} draws "
                           f"({type(exc).__name__}: {exc})") from None
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{fig.name}.svg"
    drawn.savefig(target, format="svg", metadata={
        "Date": None, "Title": fig.name, "Description": STAMP + digest(raw),
        "Creator": "bench/plots.py"})
    return target


def check(results: Path, out: Path) -> list[str]:
    """One line per plot of :data:`FIGURES` that is missing, or whose stamp does not match
    this module and its results file; empty when all are fresh. Needs no matplotlib."""
    problems = []
    for fig in FIGURES:
        target = out / f"{fig.name}.svg"
        try:
            raw = (results / fig.source).read_bytes()
        except OSError:
            problems.append(f"{results / fig.source}: missing (record it with: {fig.command})")
            continue
        if not target.is_file():
            problems.append(f"{target}: missing; run python bench/plots.py")
        elif stamp_of(target) != digest(raw):
            problems.append(f"{target}: stale (drawn from other results or by other code "
                            f"than {fig.source} and bench/plots.py); run python bench/plots.py")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Draw every plot, or ``--check`` them; see the module docstring for the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the recorded results (default bench/results)")
    ap.add_argument("--out", type=Path, default=OUT,
                    help="where the SVGs go (default docs/benchmarks)")
    ap.add_argument("--check", action="store_true",
                    help="draw nothing: fail if a plot is missing or stale")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.results, args.out)
        for line in problems:
            print(f"plots: {line}", file=sys.stderr)
        if not problems:
            print(f"plots: {len(FIGURES)} plots in {args.out} are fresh")
        return 1 if problems else 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots: matplotlib is not installed (the bench extra: pip install -e '.[bench]')",
              file=sys.stderr)
        return 1
    failed = 0
    for fig in FIGURES:
        try:
            print(render(fig, args.results, args.out))
        except ResultsError as exc:
            print(f"plots: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

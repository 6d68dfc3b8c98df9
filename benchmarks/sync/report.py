"""Tables, model fit, extrapolation and plot from measure.py's rows.

    python -m benchmarks.sync.report benchmarks/results/sync.json [--out benchmarks/results]

Writes sync.md, sync.json (rows + fits + extrapolation) and sync.png under --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.sync import model
from benchmarks.sync.model import Link
from benchmarks.table import markdown_table
from noloco_rt.config import load_config
from noloco_rt.consensus.file import stage_parameter_shapes

NOMINAL_WAN = ("100 Mbit/s, RTT 50 ms", Link(alpha_s=0.025, beta_bytes_per_s=100e6 / 8))
EXTRAPOLATE_N = (2, 8, 32, 128, 512, 1024)
NOLOCO = ("noloco-shuffle-zstd", "noloco-bf16-shuffle-zstd", "noloco-int8-zstd")


def preset_bytes(preset: str) -> int:
    """float32 bytes of a whole model of `preset` (config-default vocabulary, one stage)."""
    cfg = load_config(environ={}, overrides=[{"model": {"preset": preset}, "pipeline": {"stages": 1}}])
    return 4 * sum(shape.numel() for _, shape in stage_parameter_shapes(cfg, 0))


def fit_links(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per link label: ring fit of all-reduce, pairwise fit per codec (per-worker mean times)."""
    fits: dict[str, dict[str, Any]] = defaultdict(dict)
    sync = [r for r in rows if r["kind"] == "sync"]
    for label in sorted({r["link"] for r in sync}):
        ar = [(r["world"], r["raw_bytes"], r["mean_s"]) for r in sync if r["link"] == label and r["method"] == "allreduce"]
        if ar:
            link = model.fit_ring(ar)
            fits[label]["allreduce"] = {"alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s}
        for method in NOLOCO:
            pts = [(r["wire_bytes"], r["mean_s"]) for r in sync if r["link"] == label and r["method"] == method]
            if pts:
                rt, link = model.fit_pairwise(pts)
                fits[label][method] = {"round_trip_s": rt, "beta_bytes_per_s": link.beta_bytes_per_s}
    return dict(fits)


def _link(fit: dict[str, Any]) -> Link:
    return Link(alpha_s=fit.get("alpha_s", fit.get("round_trip_s", 0.0) / 2), beta_bytes_per_s=fit["beta_bytes_per_s"])


def predicted(row: dict[str, Any], fits: dict[str, dict[str, Any]]) -> float | None:
    fit = fits.get(row["link"], {}).get(row["method"])
    if fit is None:
        return None
    if row["method"] == "allreduce":
        return model.ring_allreduce_s(row["world"], row["raw_bytes"], _link(fit))
    return model.pairwise_exchange_s(row["wire_bytes"], _link(fit), round_trip_s=fit["round_trip_s"])


def _ring(n: int, *, size_bytes: float, link: Link) -> float:
    return model.ring_allreduce_s(n, size_bytes, link)


def _tree(n: int, *, size_bytes: float, link: Link) -> float:
    return model.tree_allreduce_s(n, size_bytes, link)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f}"


def _spread(values: list[float]) -> str:
    """Median and range over repeats: '1.23 (1.20–1.30)', or one value alone."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def straggler_section(straggler: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    """Time to the end of the next outer step, straggler vs its partners vs the rest, over repeats."""
    if not straggler:
        return ""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in straggler:
        groups[(r["link"], r["world"], r["size"], r["compute_s"], r["method"])].append(r)
    table, medians = [], {}
    for key, group in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2], kv[0][4] == "allreduce")):
        link, world, size, compute_s, method = key
        others = [r["others_s"] for r in group if r["others_s"]]
        partners = [t for r in group for t in r.get("partners_s", [])]
        # Lazily: at N = 2 the straggler's partner may be the only other rank (no "others").
        rest_mean = [r["non_straggler_mean_s"] if "non_straggler_mean_s" in r
                     else statistics.fmean(r["others_s"] + r.get("partners_s", [])) for r in group]
        medians[key] = statistics.median(rest_mean)
        table.append([link, world, size, compute_s, method, len(group), _spread([r["straggler_s"] for r in group]),
                      _spread(partners) + (f" [{len(partners)}]" if partners else ""),
                      _spread([min(o) for o in others]), _spread([statistics.fmean(o) for o in others]),
                      _spread([max(o) for o in others]), _spread(rest_mean), key])
    rows_out = []
    for row in table:
        key = row.pop()
        ar = medians.get((*key[:4], "allreduce"))
        ratio = f"{medians[key] / ar:.2f}" if ar and key[4] != "allreduce" else "—"
        rows_out.append([*row, f"{medians[key] / key[3]:.3f}" if key[3] else "—", ratio])
    command = extra.get("straggler_command")
    note = ("\nTime from the common start of the timed outer step to its end on each worker (that step "
            "includes the compute); noloco-overlap: from reaching the outer step to reaching the next one "
            "(the round runs in the background meanwhile). ÷ own compute: non-straggler mean over the "
            "nominal compute (1.0: never waits). Cells: median (range) over repeats. Partners: ranks whose exchange "
            "ended with the straggler ([n] = how many over all repeats); others: every other non-straggler "
            "rank, min / mean / max within a trial, each summarised over repeats. Ratio: median "
            "non-straggler mean, NoLoCo / all-reduce.")
    if command:
        note += (f" Run alone (`python -m benchmarks.sync.measure {command}`, "
                 f"{extra.get('straggler_wall_s', 0):.0f} s) and merged into these results.")
    return markdown_table(
        "## Straggler: one worker computes 2× the nominal inner phase, then sync",
        ["link", "N", "size", "nominal compute s", "method", "repeats", "straggler s", "partners s",
         "others min s", "others mean s", "others max s", "non-straggler mean s", "÷ own compute",
         "ratio vs all-reduce (non-straggler mean)"], rows_out) + note + "\n\n"


def write_reports(rows: list[dict[str, Any]], out: Path | None, *, wall_s: float,
                  extra: dict[str, Any] | None = None) -> None:
    fits = fit_links(rows)
    sync = sorted((r for r in rows if r["kind"] == "sync"), key=lambda r: (r["link"], r["size"], r["world"]))
    by_key = {(r["link"], r["size"], r["world"], r["method"]): r for r in sync}
    measured = []
    for r in sync:
        ar = by_key.get((r["link"], r["size"], r["world"], "allreduce"))
        ratio = f"{r['mean_s'] / ar['mean_s']:.2f}" if ar and r["method"] != "allreduce" else "—"
        pred = predicted(r, fits)
        measured.append([r["link"], r["size"], r["world"], r["method"], f"{r['mean_s']:.3f}", f"{r['max_s']:.3f}",
                         f"{r['idle_mean_s']:.3f}", _mb(r["raw_bytes"]), _mb(r["wire_bytes"]),
                         f"{r['peer_ok']}/{r['ranks']}", ratio, f"{pred:.3f}" if pred is not None else "—"])
    text = markdown_table(
        f"## Measured sync step (whole run {wall_s:.0f} s)",
        ["link", "size", "N", "method", "per-worker mean s", "max s", "idle mean s", "raw MB", "wire MB/worker",
         "peer ok", "ratio vs all-reduce (mean)", "model s"], measured)
    text += ("\nidle = mean over workers of (last worker's finish − own finish): how long each would "
             "wait at a barrier; NoLoCo has none, so it is time the others are already computing.\n\n")

    text += straggler_section([r for r in rows if r["kind"] == "straggler"], extra or {})

    fit_rows = []
    for label, methods in fits.items():
        for method, fit in methods.items():
            latency = fit.get("alpha_s", fit.get("round_trip_s"))
            fit_rows.append([label, method, "α one-way" if "alpha_s" in fit else "α_rt",
                             f"{1000 * latency:.1f}", f"{8 * fit['beta_bytes_per_s'] / 1e6:.0f}"])
    text += markdown_table("## Model fit (least squares on per-worker mean times)",
                           ["link", "method", "latency term", "ms", "effective Mbit/s"], fit_rows) + "\n"

    # Compression ratios measured on real weights (the small preset) carry over to 125m.
    small_ratio = {m: r["raw_bytes"] / r["wire_bytes"] for (_, size, _, m), r in by_key.items()
                   if size == "small" and m in NOLOCO}
    size_bytes = {"small": preset_bytes("small"), "synthetic100mb": 100_000_000, "125m": preset_bytes("125m")}
    extrap, cross_rows, curves = [], [], []
    scenarios: list[tuple[str, Link, dict[str, Link], dict[str, float]]] = [
        (NOMINAL_WAN[0] + " (nominal)", NOMINAL_WAN[1], {m: NOMINAL_WAN[1] for m in NOLOCO},
         {m: 2 * NOMINAL_WAN[1].alpha_s for m in NOLOCO})]
    for label, methods in fits.items():
        if "allreduce" in methods:
            pair = {m: _link(methods[m]) for m in NOLOCO if m in methods}
            scenarios.append((label + " (fitted)", _link(methods["allreduce"]), pair,
                              {m: methods[m]["round_trip_s"] for m in pair}))
    for name, ar_link, pair_links, rts in scenarios:
        for size, nbytes in size_bytes.items():
            for method, plink in pair_links.items():
                wire = nbytes / small_ratio.get(method, 1.0)
                pair_s = model.pairwise_exchange_s(wire, plink, round_trip_s=rts[method])
                ring = [model.ring_allreduce_s(n, nbytes, ar_link) for n in EXTRAPOLATE_N]
                tree = [model.tree_allreduce_s(n, nbytes, ar_link) for n in EXTRAPOLATE_N]
                extrap.append([name, size, method.removeprefix("noloco-"), f"{pair_s:.2f}",
                               " / ".join(f"{t:.1f}" for t in ring), " / ".join(f"{t:.1f}" for t in tree)])
                n_ring = model.crossover_n(10, functools.partial(_ring, size_bytes=nbytes, link=ar_link), pair_s)
                n_tree = model.crossover_n(10, functools.partial(_tree, size_bytes=nbytes, link=ar_link), pair_s)
                cross_rows.append([name, size, method.removeprefix("noloco-"), n_ring or "> 2^20",
                                   n_tree or "> 2^20"])
                if method == "noloco-bf16-shuffle-zstd" and size in ("125m", "small"):
                    curves.append((f"{name}, {size}", ar_link, nbytes, pair_s))
    text += markdown_table(
        f"## Model extrapolation: seconds per sync step at N = {' / '.join(map(str, EXTRAPOLATE_N))}",
        ["link", "size", "codec", "pairwise s (any N)", "ring all-reduce s", "tree all-reduce s"], extrap) + "\n"
    text += markdown_table("## N at which pairwise is 10× faster than all-reduce (model)",
                           ["link", "size", "codec", "vs ring", "vs tree"], cross_rows)
    text += (f"\nSizes: small = {_mb(size_bytes['small'])} MB, 125m = {_mb(size_bytes['125m'])} MB float32 "
             "(config-default vocabulary 256); wire bytes use the compression ratio measured on the small "
             f"preset's weights ({', '.join(f'{m}: {v:.2f}×' for m, v in small_ratio.items())}).\n")
    print(text)
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "sync.md").write_text(text)
    (out / "sync.json").write_text(json.dumps({"wall_s": wall_s, **(extra or {}), "rows": rows, "fits": fits,
                                               "extrapolation": extrap, "crossover": cross_rows}, indent=1))
    _plot(curves, out / "sync.png")


def _plot(curves: list[tuple[str, Link, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [2 ** k for k in range(1, 11)]
    fig, ax = plt.subplots(figsize=(9, 6))
    for index, (label, link, nbytes, pair_s) in enumerate(curves):
        color = f"C{index}"
        ax.plot(ns, [model.ring_allreduce_s(n, nbytes, link) for n in ns], color=color, label=f"ring: {label}")
        ax.plot(ns, [model.tree_allreduce_s(n, nbytes, link) for n in ns], color=color, ls=":",
                label=f"tree: {label}")
        ax.plot(ns, [pair_s] * len(ns), color=color, ls="--", label=f"pairwise bf16: {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers per stage N")
    ax.set_ylabel("sync step time (s)")
    ax.set_title("Sync step vs N (α–β model)")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows", type=Path, help="sync.json written by measure.py")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    data = json.loads(args.rows.read_text())
    extra = {k: v for k, v in data.items() if k.startswith("straggler_")}
    write_reports(data["rows"], args.out, wall_s=data.get("wall_s", 0.0), extra=extra)


if __name__ == "__main__":
    main()

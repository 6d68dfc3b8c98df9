"""Rendering of seeded benchmark results: a markdown table per group, JSON of rows and
records, and a perplexity-against-tokens plot (one panel per group, a min–max band over
seeds and a mean line per label)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.seed_stats import (
    AlongRun,
    Row,
    RunsBySeed,
    SeedRange,
    ratio_along_run,
    summarise,
    thinned,
)
from benchmarks.table import markdown_table
from noloco_rt.curves.png import save_figure


def fmt_range(value: SeedRange | None, digits: int, *, empty: str = "n/a") -> str:
    """'4.268 [4.201–4.330]'; a single seed shows no range; NaN (e.g. zero spread) shows `empty`."""
    if value is None or value.count == 0:
        return empty
    mean = f"{value.mean:.{digits}f}"
    if value.count == 1:
        return mean
    return f"{mean} [{value.lo:.{digits}f}–{value.hi:.{digits}f}]"


def rows_table(title: str, label_header: str, rows: Sequence[Row], baselines: Sequence[str]) -> str:
    header = [label_header, "H", "seeds", "final val ppl", *[f"ppl / {b}" for b in baselines],
              "final spread (mean)", "Pearson(spread, lr)", "fewer bytes than float32", "wall s (mean)"]
    body = [[row.label, "-" if row.h is None else row.h, len(row.seeds), fmt_range(row.ppl, 3),
             *[fmt_range(row.ratios.get(b), 4) for b in baselines],
             f"{row.final_spread_mean:.3e}", fmt_range(row.pearson, 3, empty="n/a (spread constant)"),
             "-" if row.fewer_bytes is None else f"{row.fewer_bytes:.1f}x", f"{row.wall_s_mean:.0f}"] for row in rows]
    return markdown_table(title, header, body)


ALONG_RUN_ROWS = 10


def along_run_table(title: str, runs: Mapping[str, RunsBySeed], baselines: Sequence[str]) -> str:
    """Every label's ppl over each baseline's at (at most ALONG_RUN_ROWS) evaluation steps,
    seed by seed then mean [min–max]: how a gap closes along the run. Empty text when no
    baseline ran or nothing else did."""
    order = {name: i for i, name in enumerate(baselines)}
    pairs = {(label, base): ratio_along_run(runs[label], runs[base])
             for base in baselines if base in runs for label in runs
             if label != base and order.get(label, len(order)) > order[base]}  # diloco / ddp, not also ddp / diloco
    pairs = {pair: points for pair, points in pairs.items() if points}
    if not pairs:
        return ""
    (_, first_base), first_points = next(iter(pairs.items()))
    by_step: dict[tuple[str, str], dict[int, AlongRun]] = {
        pair: {point.step: point for point in points} for pair, points in pairs.items()}
    header = ["inner step", "lr", f"{first_base} ppl", *[f"{label} / {base}" for label, base in pairs]]
    body = [[point.step, f"{point.lr:.1e}", fmt_range(point.baseline_ppl, 3),
             *[fmt_range(by_step[pair][point.step].ratio, 4) if point.step in by_step[pair] else "-"
               for pair in pairs]]
            for point in thinned(first_points, ALONG_RUN_ROWS)]
    return markdown_table(title, header, body)


def group_tables(title: str, label_header: str, runs: Mapping[str, RunsBySeed], baselines: Sequence[str],
                 rows: Sequence[Row] | None = None) -> str:
    """One group's report: its rows table, then its along-the-run table where there is one.
    `rows` when the caller summarised already."""
    rows = summarise(runs, baselines) if rows is None else rows
    texts = [rows_table(title, label_header, rows, baselines),
             along_run_table(f"{title}, along the run", runs, baselines)]
    return "\n".join(text for text in texts if text)


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN: write null (e.g. Pearson of ddp, whose spread is always 0)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


def report_json(sections: Mapping[str, tuple[Sequence[Row], Mapping[str, RunsBySeed]]]) -> str:
    """{group: {"rows": [...], "runs": {label: {seed: run}}}} with NaN written as null."""
    data = {group: {"rows": [dataclasses.asdict(row) for row in rows], "runs": runs}
            for group, (rows, runs) in sections.items()}
    return json.dumps(_finite_or_none(data), indent=1)


def ppl_band(runs: RunsBySeed) -> tuple[list[float], list[float], list[float], list[float]]:
    """(tokens, mean ppl, min ppl, max ppl) per evaluation, over the seeds' common evaluations."""
    series = [run["records"] for run in runs.values()]
    length = min(len(records) for records in series)
    tokens = [float(series[0][i]["tokens"]) for i in range(length)]
    columns = [[records[i]["val_ppl"] for records in series] for i in range(length)]
    return tokens, [sum(c) / len(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def plot_ppl_bands(groups: Mapping[str, Mapping[str, RunsBySeed]], path: Path, *, title: str = "") -> None:
    """One panel per group; per label a min–max band over seeds and the mean line."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, (group, labels) in zip(axes[0], groups.items(), strict=True):
        for label, runs in labels.items():
            tokens, mean, lo, hi = ppl_band(runs)
            line = ax.plot(tokens, mean, label=f"{label} ({len(runs)} seeds)")[0]
            ax.fill_between(tokens, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_yscale("log")
        ax.set_title(group)
        ax.set_xlabel("tokens trained (all replicas)")
        ax.set_ylabel("validation perplexity")
        ax.legend(fontsize="small")
    save_figure(fig, path, title)


def tables_from_json(path: Path, *, title: str, label_header: str, baselines: Sequence[str] = ()) -> str:
    """The markdown tables of a written report (OUT/{stem}.json) again, with today's columns;
    compared with `baselines` where given, else with the first label of each group."""
    data = json.loads(path.read_text())
    texts = []
    for group, section in data.items():
        runs = {label: {int(seed): run for seed, run in by_seed.items()} for label, by_seed in section["runs"].items()}
        texts.append(group_tables(f"{title}, {group}", label_header, runs, list(baselines) or [next(iter(runs))]))
    return "\n".join(texts)

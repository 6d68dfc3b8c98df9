"""Statistics over seeds for simulator benchmarks: pure functions of evaluation records.

A run is a mapping with "records" (the simulator's evaluations as dicts, first to last)
and "wall_s". Runs are grouped as {label: {seed: run}}, a label being a method or a
config variant. Ratios compare a label with a baseline seed by seed (same seed, same
weights, data order and routing), and only then are averaged, so seed-to-seed noise
shared by both does not widen the range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Run = Mapping[str, Any]
RunsBySeed = Mapping[int, Run]


@dataclass(frozen=True)
class SeedRange:
    """Mean, min and max of one quantity over seeds; NaN when no seed had a value."""

    mean: float
    lo: float
    hi: float
    count: int


def seed_range(values: Sequence[float]) -> SeedRange:
    """Mean and min–max of the finite values (a NaN Pearson on a constant spread is skipped)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return SeedRange(math.nan, math.nan, math.nan, 0)
    return SeedRange(sum(finite) / len(finite), min(finite), max(finite), len(finite))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; NaN with fewer than two points or when either side is constant."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else float("nan")


def ratios_per_seed(values: Mapping[int, float], baseline: Mapping[int, float]) -> dict[int, float]:
    """values[s] / baseline[s] for every seed s both have."""
    return {seed: values[seed] / baseline[seed] for seed in sorted(values) if seed in baseline}


def final_ppl(run: Run) -> float:
    return float(run["records"][-1]["val_ppl"])


def final_spread(run: Run) -> float:
    return float(run["records"][-1]["spread"])


def spread_lr_pearson(run: Run) -> float:
    """Pearson(spread, lr) over the evaluations after step 0 (step 0's spread is 0 by construction)."""
    trained = [r for r in run["records"] if r["step"] > 0]
    return pearson([r["spread"] for r in trained], [r["lr"] for r in trained])


@dataclass(frozen=True)
class Row:
    """One label's line of a table: every quantity over its seeds."""

    label: str
    seeds: tuple[int, ...]
    h: int | None
    ppl: SeedRange
    ratios: dict[str, SeedRange | None]
    """Per baseline label: ppl / baseline ppl over shared seeds; None when the baseline did not run."""
    final_spread_mean: float
    pearson: SeedRange
    wall_s_mean: float
    fewer_bytes: float | None = None
    """float32 bytes of the outer-step states sent over the bytes on the wire (mean over seeds);
    None when the runs did not count them (no outer step, or results from before the count)."""


def summarise_label(label: str, runs: RunsBySeed, all_runs: Mapping[str, RunsBySeed],
                    baselines: Sequence[str]) -> Row:
    ppl = {seed: final_ppl(run) for seed, run in runs.items()}
    ratios: dict[str, SeedRange | None] = {}
    for base in baselines:
        base_runs = all_runs.get(base)
        if base_runs is None:
            ratios[base] = None
            continue
        per_seed = ratios_per_seed(ppl, {seed: final_ppl(run) for seed, run in base_runs.items()})
        ratios[base] = seed_range(list(per_seed.values()))
    first = runs[min(runs)]
    return Row(
        label=label, seeds=tuple(sorted(runs)), h=first.get("outer", {}).get("h"),
        ppl=seed_range(list(ppl.values())), ratios=ratios,
        final_spread_mean=seed_range([final_spread(r) for r in runs.values()]).mean,
        pearson=seed_range([spread_lr_pearson(r) for r in runs.values()]),
        wall_s_mean=seed_range([float(r["wall_s"]) for r in runs.values()]).mean,
        fewer_bytes=fewer_bytes(runs),
    )


def fewer_bytes(runs: RunsBySeed) -> float | None:
    """Mean over seeds of raw float32 / wire bytes of the whole run's outer-step exchanges."""
    ratios = [final["exchange_raw_bytes"] / final["exchange_wire_bytes"]
              for final in (run["records"][-1] for run in runs.values()) if final.get("exchange_wire_bytes")]
    return sum(ratios) / len(ratios) if ratios else None


def summarise(all_runs: Mapping[str, RunsBySeed], baselines: Sequence[str]) -> list[Row]:
    """One Row per label, in the mapping's order."""
    return [summarise_label(label, runs, all_runs, baselines) for label, runs in all_runs.items()]


@dataclass(frozen=True)
class AlongRun:
    """One evaluation step of a run compared with its baseline: ratios seed by seed."""

    step: int
    lr: float
    baseline_ppl: SeedRange
    ratio: SeedRange


def _ppl_by_step(run: Run) -> dict[int, tuple[float, float]]:
    return {int(r["step"]): (float(r["val_ppl"]), float(r["lr"])) for r in run["records"] if r["step"] > 0}


def ratio_along_run(runs: RunsBySeed, baseline: RunsBySeed) -> list[AlongRun]:
    """label ppl / baseline ppl at every evaluation step that every shared seed of both
    evaluated (seed by seed, then averaged), first to last; empty when no seed is shared."""
    seeds = [seed for seed in sorted(runs) if seed in baseline]
    if not seeds:
        return []
    ours = {seed: _ppl_by_step(runs[seed]) for seed in seeds}
    theirs = {seed: _ppl_by_step(baseline[seed]) for seed in seeds}
    steps = set.intersection(*(set(ours[s]) & set(theirs[s]) for s in seeds))
    return [AlongRun(step=step, lr=theirs[seeds[0]][step][1],
                     baseline_ppl=seed_range([theirs[s][step][0] for s in seeds]),
                     ratio=seed_range([ours[s][step][0] / theirs[s][step][0] for s in seeds]))
            for step in sorted(steps)]


def thinned(points: Sequence[AlongRun], most: int) -> list[AlongRun]:
    """At most `most` points, evenly spaced, the last always kept (a table, not a plot)."""
    if len(points) <= most:
        return list(points)
    stride = math.ceil(len(points) / most)
    kept = list(points[len(points) - 1::-stride])[::-1]
    return kept[-most:]

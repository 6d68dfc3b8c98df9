"""Benchmarks that compare two sides, each a fresh child Python process running a script
(benchmarks/process_heap.py, benchmarks/worker_start.py): run the children with the sides
interleaved, and tabulate each figure as median [min-max] per side with their ratio."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.table import emit, median_range

Results = dict[str, list[dict[str, float]]]


@dataclass(frozen=True)
class ChildRun:
    figures: dict[str, float]
    """What the child printed as JSON on its last line."""
    started: float
    ended: float
    """Wall clock (time.time()) around the child, as its parent sees it."""
    cpu_s: float
    """The child's CPU seconds, user and system."""


def run_child(script: str, side: str) -> ChildRun:
    """`python -c SCRIPT SIDE`, to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    child = subprocess.run([sys.executable, "-c", script, side], capture_output=True, text=True, check=True,
                           timeout=300)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ChildRun(json.loads(child.stdout.strip().splitlines()[-1]), started, ended, cpu_s)


def ratio_rows(results: Results, sides: Sequence[str], metrics: Sequence[tuple[str, str, str]]) -> list[list[str]]:
    """One row per (key, label, format spec): each side's median [min-max], then second / first."""
    rows = []
    for key, label, spec in metrics:
        first, second = ([r[key] for r in results[side]] for side in sides)
        base = statistics.median(first)
        ratio = statistics.median(second) / base if base else float("nan")
        rows.append([label, median_range(first, spec), median_range(second, spec), f"{ratio:.2f}×"])
    return rows


def main(doc: str, sides: Sequence[str], measure: Callable[[str], dict[str, float]],
         render: Callable[[Results, int], str], argv: list[str] | None = None) -> None:
    """`--runs N` children a side, the sides' order alternating run by run; `--out FILE`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="Also write the table here (markdown).")
    args = parser.parse_args(argv)
    results: Results = {side: [] for side in sides}
    for run in range(args.runs):
        for side in sides if run % 2 == 0 else reversed(sides):
            results[side].append(measure(side))
            print(f"run {run + 1}/{args.runs} {side}: {results[side][-1]}", file=sys.stderr, flush=True)
    emit(render(results, args.runs), args.out)

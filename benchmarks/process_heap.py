"""What torch's start-up heap costs a process's garbage collector, with and without
noloco_rt.process.heap.settle_heap, in fresh child processes that import what a worker imports
and build a worker's replica (tiny preset, AdamW):

    PYTHONPATH=. .venv/bin/python -m benchmarks.process_heap [--runs 5] [--out benchmarks/results/process_heap.md]

Rows, median [min-max] over --runs child processes per side, the sides interleaved:
- one full collection (gc.collect()) right after start-up, ms: the pause a full collection
  would put on every thread of a training process (it holds the GIL);
- the interpreter's exit, s: from the script's last line to the process's end, as its parent
  sees it (the collections Python runs while it tears the modules down);
- the whole child's CPU time, s (start-up, the measured collection and exit).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.table import emit, markdown_table, median_range

CHILD = """
import gc, json, sys, time
import torch
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.process.heap import freeze_for_exit, settle_heap
import workers.worker  # what a worker process imports

replica = StageReplica.create(Config(), 0, device=torch.device("cpu"))
if sys.argv[1] == "settled":
    settle_heap()
started = time.perf_counter()
gc.collect()
collect_ms = (time.perf_counter() - started) * 1000
tracked = len(gc.get_objects())  # what the next full collection walks
if sys.argv[1] == "settled":
    freeze_for_exit()  # what cli.entry_point does before the interpreter tears down
print(json.dumps({"collect_ms": collect_ms, "tracked": tracked, "last_line": time.time()}), flush=True)
"""

SIDES = ("as-is", "settled")


def run_child(side: str) -> dict[str, float]:
    """One child: its figures, the seconds from its last line to its end, and its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.run([sys.executable, "-c", CHILD, side],
                           capture_output=True, text=True, check=True, timeout=300)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    figures["exit_s"] = ended - figures.pop("last_line")
    figures["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return figures


def render(results: dict[str, list[dict[str, float]]], runs: int) -> str:
    rows = []
    for key, label, spec in (("collect_ms", "one full collection after start-up, ms", ".1f"),
                             ("tracked", "objects it walks", ",.0f"),
                             ("exit_s", "interpreter exit, s", ".2f"),
                             ("cpu_s", "child's CPU, s", ".2f")):
        as_is = [r[key] for r in results["as-is"]]
        settled = [r[key] for r in results["settled"]]
        ratio = statistics.median(settled) / statistics.median(as_is) if statistics.median(as_is) else float("nan")
        rows.append([label, median_range(as_is, spec), median_range(settled, spec), f"{ratio:.2f}×"])
    return markdown_table(f"Start-up heap, {runs} child processes a side (median [min–max]):",
                          ["", "as is", "settle_heap()", "settled / as is"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="Also write the table here (markdown).")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for run in range(args.runs):
        for side in SIDES if run % 2 == 0 else reversed(SIDES):
            results[side].append(run_child(side))
            print(f"run {run + 1}/{args.runs} {side}: {results[side][-1]}", file=sys.stderr, flush=True)
    emit(render(results, args.runs), args.out)


if __name__ == "__main__":
    main()

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

from benchmarks import child_sides
from benchmarks.child_sides import Results, ratio_rows, run_child
from benchmarks.table import markdown_table

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


def measure(side: str) -> dict[str, float]:
    """One child: its figures, the seconds from its last line to its end, and its CPU seconds."""
    child = run_child(CHILD, side)
    figures = dict(child.figures)
    figures["exit_s"] = child.ended - figures.pop("last_line")
    figures["cpu_s"] = child.cpu_s
    return figures


def render(results: Results, runs: int) -> str:
    rows = ratio_rows(results, SIDES, (("collect_ms", "one full collection after start-up, ms", ".1f"),
                                       ("tracked", "objects it walks", ",.0f"),
                                       ("exit_s", "interpreter exit, s", ".2f"),
                                       ("cpu_s", "child's CPU, s", ".2f")))
    return markdown_table(f"Start-up heap, {runs} child processes a side (median [min–max]):",
                          ["", "as is", "settle_heap()", "settled / as is"], rows)


def main(argv: list[str] | None = None) -> None:
    child_sides.main(__doc__, SIDES, measure, render, argv)


if __name__ == "__main__":
    main()

"""What a worker process pays to start, with the inner optimizer on torch.optim's fused AdamW
(which imports torch._dynamo) and on the runtime's own driver of the same kernel
(noloco_rt/algo/fused_adamw.py), in fresh child processes that import what a worker imports,
build a worker's replica (tiny preset) and take two inner steps:

    PYTHONPATH=. .venv/bin/python -m benchmarks.worker_start [--runs 5] [--out benchmarks/results/worker_start.md]

Rows, median [min-max] over --runs children per side, the sides interleaved: wall time from
the process's start to its second inner step, the whole child's CPU (start-up, steps, exit),
its peak resident memory, and the objects the cyclic collector tracks after the steps.
"""

from __future__ import annotations

from benchmarks import child_sides
from benchmarks.child_sides import Results, ratio_rows, run_child
from benchmarks.table import markdown_table

CHILD = """
import gc, json, resource, sys, time
import torch
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
import workers.worker  # what a worker process imports

replica = StageReplica.create(Config(), 0, device=torch.device("cpu"))
if sys.argv[1] == "torch.optim":  # what InnerOptimizer built before noloco_rt/algo/fused_adamw.py
    cfg = replica.inner.cfg
    replica.inner.optimizer = torch.optim.AdamW(replica.inner.params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                                betas=(cfg.adam_beta1, cfg.adam_beta2), fused=True)
tokens = torch.randint(0, 256, (2, 32))
for _ in range(2):
    replica.module(tokens).float().mean().backward()
    replica.inner.step()
print(json.dumps({"stepped": time.time(), "tracked": len(gc.get_objects()),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "dynamo": "torch._dynamo" in sys.modules}), flush=True)
"""

SIDES = ("torch.optim", "runtime")


def measure(side: str) -> dict[str, float]:
    child = run_child(CHILD, side)
    figures = dict(child.figures)
    figures["ready_s"] = figures.pop("stepped") - child.started
    figures["cpu_s"] = child.cpu_s
    return figures


def render(results: Results, runs: int) -> str:
    rows = ratio_rows(results, SIDES, (("ready_s", "start to the second inner step, s", ".2f"),
                                       ("cpu_s", "child's CPU, s", ".2f"),
                                       ("rss_mb", "peak resident memory, MB", ".0f"),
                                       ("tracked", "objects the collector tracks", ",.0f")))
    rows.append(["imported torch._dynamo", *(f"{sum(r['dynamo'] for r in results[side])} of {runs}" for side in SIDES),
                 ""])
    return markdown_table(f"Worker start-up, {runs} child processes a side (median [min–max]):",
                          ["", "torch.optim.AdamW(fused=True)", "runtime's FusedAdamW", "runtime / torch.optim"],
                          rows)


def main(argv: list[str] | None = None) -> None:
    child_sides.main(__doc__, SIDES, measure, render, argv)


if __name__ == "__main__":
    main()

"""The inner optimizer step's own time: the runtime's (`InnerOptimizer.step` with the mean over
microbatches and the clip folded into fused AdamW's gradient scale) against dividing the summed
gradients, clipping them (`clip_grad_norm_`) and stepping fused AdamW, as a plain loop does.
Both alternate on the same stage's parameters and gradients, one torch thread.

    PYTHONPATH=. python benchmarks/inner_step.py [--preset tiny] [--stage 0] [--stages 2] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.table import emit, markdown_table, median_range
from noloco_rt.algo.optim import InnerOptimizer
from noloco_rt.config import OptimConfig
from noloco_rt.model.llama import build_stage

MICROBATCHES = 4


def timed(step: Callable[[], None], params: list[torch.nn.Parameter], grads: list[torch.Tensor]) -> float:
    """Milliseconds of one step, the gradients set afresh before it (not timed)."""
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad.clone()
    started = time.perf_counter()
    step()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = OptimConfig()
    modules = [build_stage(args.preset, vocab_size=256, stage=args.stage, num_stages=args.stages, seed=0)
               for _ in range(2)]
    runtime_params, plain_params = (list(m.parameters()) for m in modules)
    grads = [torch.randn_like(p) * MICROBATCHES for p in runtime_params]
    inner = InnerOptimizer(runtime_params, cfg, total_steps=10_000)
    plain = torch.optim.AdamW(plain_params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                              weight_decay=cfg.weight_decay, fused=True)

    def runtime_step() -> None:
        inner.step(grad_divisor=float(MICROBATCHES))

    def plain_step() -> None:
        torch._foreach_div_([p.grad for p in plain_params], float(MICROBATCHES))
        torch.nn.utils.clip_grad_norm_(plain_params, cfg.grad_clip, foreach=True)
        plain.step()
        plain.zero_grad(set_to_none=True)

    steps = {"divide, clip_grad_norm_, fused AdamW": (plain_step, plain_params),
             "InnerOptimizer.step (mean and clip in the kernel's scale)": (runtime_step, runtime_params)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3):  # warm-up
        for step, params in steps.values():
            timed(step, params, grads)
    for _ in range(args.repeats):
        for name, (step, params) in steps.items():
            times[name].append(timed(step, params, grads))
    baseline = statistics.median(times["divide, clip_grad_norm_, fused AdamW"])
    rows = [[name, median_range(v, ".3f"), f"{statistics.median(v) / baseline:.2f}×"]
            for name, v in times.items()]
    count = sum(p.numel() for p in runtime_params)
    title = (f"One inner optimizer step, preset {args.preset} stage {args.stage} of {args.stages} ({count:,} "
             f"parameters), gradients summed over {MICROBATCHES} microbatches, {args.repeats} alternations: "
             "median [min–max]")
    emit(markdown_table(title, ["step", "ms", "× divide, clip, step"], rows), None)


if __name__ == "__main__":
    main()

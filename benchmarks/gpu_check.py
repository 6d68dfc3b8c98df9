"""`make gpu-check`: `noloco-rt up` on CUDA, 2 stages x 2 replicas on one GPU, with the small
and 125m presets; per worker: tokens/s, peak GPU memory and model FLOPs utilisation (MFU).

    .venv/bin/python -m benchmarks.gpu_check [--presets small,125m] [--steps 60] [--seq-len 1024]
        [--peak-tflops 989] [--out benchmarks/results/gpu_check.md]

Tokens/s per worker: inner steps between its second and last progress lines (start-up and
warm-up left out) times the tokens of an inner step (pipeline.max_inflight microbatches of
data.batch_size x model.seq_len), over the time between them. Peak memory: the largest
`gpu_peak_mib` the worker logged (torch.cuda.max_memory_allocated). MFU: the stage's model
FLOPs per token, 6·N for forward and backward of its N parameters plus 12·L·T·d for the
attention scores (L layers of width d, T tokens of context), times tokens/s, over the GPU's
dense bfloat16 peak (known for common GPUs; else --peak-tflops). The workers share one GPU,
so the GPU's MFU is the sum of theirs. Without CUDA this says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.table import emit, markdown_table
from noloco_rt.logs import read_json_lines

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}
"""Dense bfloat16 tensor-core peaks from the vendors' data sheets (no sparsity)."""


@dataclass(frozen=True)
class WorkerFigures:
    name: str
    stage: int
    tokens_per_s: float
    gpu_peak_mib: float


def flops_per_token(preset: str, *, stage: int, stages: int, seq_len: int, vocab_size: int) -> float:
    """Model FLOPs of one token through one stage, forward and backward."""
    from noloco_rt.model import PRESETS, build_stage, stage_layer_range

    shape = PRESETS[preset]
    module = build_stage(preset, vocab_size=vocab_size, stage=stage, num_stages=stages, seed=0, device="meta")
    params = sum(p.numel() for p in module.parameters())
    layers = len(stage_layer_range(shape.n_layers, stages, stage))
    return 6.0 * params + 12.0 * layers * seq_len * shape.dim


def peak_tflops(device_name: str) -> float | None:
    """The dense bfloat16 peak of a GPU known by name, or None."""
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in device_name.upper()), None)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def worker_figures(logs: Path, tokens_per_step: int) -> list[WorkerFigures]:
    """One row per worker log that has enough progress lines to measure."""
    rows = []
    for path in sorted(logs.glob("*.log")):
        events, _ = read_json_lines(path)
        progress = [e for e in events if e.get("event") == "train_progress"]
        if len(progress) < 3:
            continue
        first, last = progress[1], progress[-1]  # the first line (step 1) includes start-up
        span = _seconds(last["timestamp"]) - _seconds(first["timestamp"])
        if span <= 0:
            continue
        rate = (last["inner_step"] - first["inner_step"]) * tokens_per_step / span
        peak = max((e.get("gpu_peak_mib", 0.0) for e in progress), default=0.0)
        rows.append(WorkerFigures(path.stem, int(last.get("stage", -1)), rate, peak))
    return rows


def run_up(preset: str, args: argparse.Namespace, out: Path) -> None:
    command = [sys.executable, "-m", "noloco_rt.cli", "up", "--stages", "2", "--replicas", "2", "--steps",
               str(args.steps), "--preset", preset, "--out", str(out), "--no-coordinator",
               "--set", f"model.seq_len={args.seq_len}"]
    print(f"gpu-check: {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, timeout=args.timeout_s)


def report(results: dict[str, list[WorkerFigures]], args: argparse.Namespace, device_name: str,
           tflops: float, tokens_per_step: int) -> str:
    rows: list[list[Any]] = []
    for preset, figures in results.items():
        total_mfu = 0.0
        for fig in figures:
            flops = flops_per_token(preset, stage=fig.stage, stages=2, seq_len=args.seq_len, vocab_size=256)
            mfu = fig.tokens_per_s * flops / (tflops * 1e12)
            total_mfu += mfu
            rows.append([preset, fig.name, fig.stage, f"{fig.tokens_per_s:.0f}", f"{fig.gpu_peak_mib:.0f}",
                         f"{100 * mfu:.2f} %"])
        rows.append([preset, "**the GPU (4 workers)**", "", f"{sum(f.tokens_per_s for f in figures if f.stage == 0):.0f}",
                     f"{sum(f.gpu_peak_mib for f in figures):.0f}", f"{100 * total_mfu:.2f} %"])
    title = (f"`noloco-rt up` on {device_name} (dense bf16 peak {tflops:.0f} TFLOPS), 2 stages × 2 replicas on "
             f"one GPU, {args.steps} steps, {tokens_per_step} tokens per inner step (seq_len {args.seq_len}); "
             "the GPU row: tokens/s through the pipeline (stage 0's workers), memory and MFU summed")
    return markdown_table(title, ["preset", "worker", "stage", "tokens/s", "peak GPU MiB", "MFU"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,125m")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not known")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per preset")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was run")
    device_name = torch.cuda.get_device_name(0)
    tflops = args.peak_tflops or peak_tflops(device_name)
    if tflops is None:
        raise SystemExit(f"gpu-check: the bf16 peak of {device_name!r} is not known; pass --peak-tflops")
    from noloco_rt.config import load_config

    cfg = load_config(environ={}, overrides=[{"model": {"seq_len": args.seq_len}}])
    tokens_per_step = cfg.pipeline.max_inflight * cfg.data.batch_size * args.seq_len
    results: dict[str, list[WorkerFigures]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for preset in [p.strip() for p in args.presets.split(",")]:
            out = Path(tmp) / preset
            run_up(preset, args, out)
            results[preset] = worker_figures(out / "logs", tokens_per_step)
            if not results[preset]:
                raise SystemExit(f"gpu-check: {preset}: no worker logged enough progress; see {out / 'logs'}")
    emit(report(results, args, device_name, tflops, tokens_per_step), args.out)


if __name__ == "__main__":
    main()

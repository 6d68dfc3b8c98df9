"""Pipeline efficiency: 2 stages × 1 replica as two real worker processes against the unsplit
model trained in one process with 2 threads, same batch, microbatches per step and steps.

    python -m benchmarks.pipeline [--preset small --steps 60] [--out benchmarks/results/pipeline.md]

Tokens/s are counted from the 10th inner step on (start-up and warm-up excluded): for the
pipeline from the first stage's train_progress events, for the baseline by its own clock.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.table import emit, markdown_table
from noloco_rt.algo.optim import InnerOptimizer
from noloco_rt.config import load_config
from noloco_rt.data import ShardedBatches, load_corpus
from noloco_rt.logs import record_seconds
from noloco_rt.model.llama import build_model, lm_loss
from workers.cluster.local_cluster import LocalCluster


def baseline_tokens_per_s(preset: str, steps: int, microbatches: int, threads: int) -> float:
    torch.set_num_threads(threads)
    cfg = load_config(environ={}, overrides=[{"model": {"preset": preset}, "run": {"steps": steps}}])
    model = build_model(preset, vocab_size=256, seed=0)
    inner = InnerOptimizer(model.parameters(), cfg.optim, total_steps=steps)
    batches = ShardedBatches(load_corpus(cfg.data).train, seq_len=cfg.model.seq_len,
                             batch_size=cfg.data.batch_size, shard=0, num_shards=1, seed=0)
    tokens, started = 0, None
    for step in range(steps):
        if step == 10:
            tokens, started = 0, time.perf_counter()
        for _ in range(microbatches):
            inputs, targets = batches.next_batch()
            lm_loss(model(inputs), targets).backward()
            tokens += inputs.numel()
        inner.step()
    return tokens / (time.perf_counter() - started)


def pipeline_tokens_per_s(preset: str, steps: int, microbatches: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), settings={"model.preset": preset, "pipeline.max_inflight": microbatches,
                                                    "worker.checkpoint_every": 0, "worker.checkpoint_interval_s": 0,
                                                    "outer.h": 1000})
        try:
            first = cluster.start_worker(0, "p0", steps=steps)
            cluster.start_worker(1, "p1")
            cluster.wait_event(first, "steps_done", timeout_s=1200)
            progress = {e["inner_step"]: e for e in first.events("train_progress")}
        finally:
            cluster.close()
    start, end = progress[10], progress[max(progress)]
    elapsed = record_seconds(end["timestamp"]) - record_seconds(start["timestamp"])
    tokens_per_step = microbatches * 8 * 64
    return (end["inner_step"] - start["inner_step"]) * tokens_per_step / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--microbatches", type=int, default=4, help="B: microbatches per inner step")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pipeline = pipeline_tokens_per_s(args.preset, args.steps, args.microbatches)
    baseline = baseline_tokens_per_s(args.preset, args.steps, args.microbatches, threads=2)
    title = (f"Pipeline efficiency, preset {args.preset}, B = {args.microbatches} microbatches of 8 × 64 tokens "
             f"per step, {args.steps} steps (`python -m benchmarks.pipeline`)")
    rows = [["unsplit model, 1 process, 2 threads", f"{baseline:.0f}", "1.00"],
            ["2 stages × 1 replica, 2 worker processes", f"{pipeline:.0f}", f"{pipeline / baseline:.2f}"]]
    emit(markdown_table(title, ["setup", "tokens/s", "ratio (target >= 0.9)"], rows), args.out)


if __name__ == "__main__":
    main()

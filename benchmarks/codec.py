"""Snapshot codec on trained weights of the small preset: ratio and MB/s per codec.

    python -m benchmarks.codec [--steps 150] [--out benchmarks/results/codec.md]

Weights are trained briefly first (random init compresses differently from trained
weights). Ratio = float32 bytes / bytes on the wire; speeds are of the raw float32 size.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.table import emit, markdown_table
from noloco_rt.algo.simulator import Simulation
from noloco_rt.config import load_config
from noloco_rt.net.codec import CODECS, decode_tensors, encode_tensors


def trained_weights(steps: int) -> list[torch.Tensor]:
    cfg = load_config(environ={}, overrides=[{"model": {"preset": "small"}, "pipeline": {"stages": 1, "replicas": 1},
                                              "run": {"steps": steps}, "optim": {"warmup_steps": 20}}])
    sim = Simulation(cfg)
    for _ in range(steps):
        sim.train_step()
    return [t.clone() for t in sim.replicas[0][0].fast]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    weights = trained_weights(args.steps)
    raw_mb = sum(t.numel() * 4 for t in weights) / 1e6
    rows = []
    for codec in CODECS:
        encode_s, decode_s = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            encoded = encode_tensors(weights, codec)
            encode_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            decode_tensors(encoded, max_decompressed_bytes=1 << 31)
            decode_s.append(time.perf_counter() - started)
        rows.append([codec, f"{encoded.wire_bytes / 1e6:.2f}", f"{encoded.ratio:.3f}",
                     f"{raw_mb / min(encode_s):.0f}", f"{raw_mb / min(decode_s):.0f}"])
    title = (f"Snapshot codec, small preset ({raw_mb:.1f} MB float32) after {args.steps} training steps "
             f"(`python -m benchmarks.codec`)")
    emit(markdown_table(title, ["codec", "wire MB", "ratio vs float32", "encode MB/s", "decode MB/s"], rows),
         args.out)


if __name__ == "__main__":
    main()

"""Snapshot codec on trained weights of the small preset: ratio, MB/s and error per codec.

    python -m benchmarks.codec [--steps 150] [--out benchmarks/results/codec.md]

Weights are trained briefly first (random init compresses differently from trained
weights). Ratio = float32 bytes / bytes on the wire; speeds are of the raw float32 size;
rel error = ‖x̂ − x‖ / ‖x‖ over all weights at once (0 for the lossless codecs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.table import emit, markdown_table
from noloco_rt.config import load_config
from noloco_rt.outer.codec import CODECS, decode_tensors, encode_tensors
from noloco_rt.simulation.simulator import Simulation


def trained_weights(steps: int) -> list[torch.Tensor]:
    cfg = load_config(environ={}, overrides=[{"model": {"preset": "small"}, "pipeline": {"stages": 1, "replicas": 1, "max_inflight": 1},
                                              "run": {"steps": steps}, "optim": {"warmup_steps": 20}}])
    sim = Simulation(cfg)
    for _ in range(steps):
        sim.train_step()
    return [t.clone() for t in sim.replicas[0][0].fast]


def relative_error(decoded: list[torch.Tensor], weights: list[torch.Tensor]) -> float:
    """‖x̂ − x‖ / ‖x‖ over all tensors taken as one vector (in float64)."""
    error = sum(float((d.double() - w.double()).square().sum()) for d, w in zip(decoded, weights, strict=True))
    norm = sum(float(w.double().square().sum()) for w in weights)
    return (error / norm) ** 0.5


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
        for repeat in range(args.repeats):
            generator = torch.Generator().manual_seed(repeat)  # stochastic rounding, reproducible
            started = time.perf_counter()
            encoded = encode_tensors(weights, codec, generator=generator)
            encode_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            decoded = decode_tensors(encoded, max_decompressed_bytes=1 << 31)
            decode_s.append(time.perf_counter() - started)
        rows.append([codec, f"{encoded.wire_bytes / 1e6:.2f}", f"{encoded.ratio:.3f}",
                     f"{raw_mb / min(encode_s):.0f}", f"{raw_mb / min(decode_s):.0f}",
                     f"{relative_error(decoded, weights):.2e}"])
    title = (f"Snapshot codec, small preset ({raw_mb:.1f} MB float32) after {args.steps} training steps "
             f"(`python -m benchmarks.codec`)")
    header = ["codec", "wire MB", "ratio vs float32", "encode MB/s", "decode MB/s", "rel error ‖x̂−x‖/‖x‖"]
    emit(markdown_table(title, header, rows), args.out)


if __name__ == "__main__":
    main()

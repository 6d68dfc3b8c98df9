"""The loss cost of each data-path wire dtype in real 2 × 2 runs (pipeline.wire_dtype).

    python -m benchmarks.wire_dtype [--steps 200] [--seeds 0,1,2] [--out benchmarks/results/wire_dtype.md]

For every seed, one `noloco-rt up --stages 2 --replicas 2` (real processes, embedded
Redis, tiny preset, no coordinator) per wire dtype, same seed and steps; the final val
loss of the consensus of the workers' last checkpoints. The table gives each dtype's
loss and its difference from float32 of the same seed, as median (range) over seeds,
and the bytes one activation crosses the wire in. Real runs are not bit-reproducible
(routing follows timing), so float32 against itself differs by seed noise too: the
float32 row's spread across seeds says how large that noise is.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.table import emit, markdown_table
from noloco_rt.config.choices import WIRE_DTYPES
from noloco_rt.logs import read_json_lines

BYTES_PER_ELEMENT = {"float32": "4", "bfloat16": "2", "float16": "2", "int8": "1 (+ 4 per token)"}


def run_once(wire: str, seed: int, *, steps: int, root: Path) -> dict[str, Any]:
    out = root / f"{wire}-seed{seed}"
    args = [sys.executable, "-m", "noloco_rt.cli", "up", "--stages", "2", "--replicas", "2", "--steps", str(steps),
            "--out", str(out), "--no-coordinator", "--set", f"run.seed={seed}", "--set", f"pipeline.wire_dtype={wire}"]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{wire} seed {seed}: `noloco-rt up` exited {done.returncode}:\n{done.stderr[-2000:]}")
    events, _ = read_json_lines(out / "metrics.jsonl")
    final = next((e for e in reversed(events) if e.get("kind") == "final"), None)
    if final is None:
        raise SystemExit(f"{wire} seed {seed}: no final val loss in {out / 'metrics.jsonl'}")
    return {"wire": wire, "seed": seed, "val_loss": float(final["val_loss"]), "wall_s": time.monotonic() - started}


def _spread(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)} – {format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--wire-dtypes", default=",".join(WIRE_DTYPES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    wires = [w.strip() for w in args.wire_dtypes.split(",")]
    if unknown := [w for w in wires if w not in WIRE_DTYPES]:
        parser.error(f"unknown wire dtypes {unknown}; known: {', '.join(WIRE_DTYPES)}")
    if "float32" not in wires:
        wires.insert(0, "float32")  # the baseline of every difference
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="wire-dtype-") as tmp:
        for seed in seeds:  # seed-major: a slow phase of the machine hits every dtype alike
            for wire in wires:
                print(f"seed {seed}, {wire} ...", flush=True)
                results[(wire, seed)] = run_once(wire, seed, steps=args.steps, root=Path(tmp))
    rows = []
    for wire in wires:
        losses = [results[(wire, s)]["val_loss"] for s in seeds]
        diffs = [100 * (results[(wire, s)]["val_loss"] / results[("float32", s)]["val_loss"] - 1) for s in seeds]
        rows.append([wire, BYTES_PER_ELEMENT[wire], _spread(losses, ".4f"), _spread(diffs, "+.2f") + " %",
                     _spread([results[(wire, s)]["wall_s"] for s in seeds], ".0f")])
    title = (f"Wire dtype, `noloco-rt up --stages 2 --replicas 2 --steps {args.steps}` (tiny, no coordinator), "
             f"seeds {args.seeds}: final val loss of the consensus, median (range)")
    emit(markdown_table(title, ["wire dtype", "bytes per activation element", "val loss",
                                "vs float32, same seed", "wall s"], rows), args.out)


if __name__ == "__main__":
    main()

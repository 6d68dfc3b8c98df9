"""What a checkpoint write costs the training thread: the write on a background thread, as a
worker's checkpoint writer runs it, while the calling thread launches small torch ops one after
another (a stand-in for a host-bound training thread: each op lets the GIL go while it runs and
needs it back to launch the next), against that thread alone. One torch thread, so the two
threads have a core each on a 2-core machine.

Two writers of the same state, side by side in each run: `torch.save` into a BytesIO and its
bytes written to the file (the writer before), and `checkpoint_writer` (torch.save straight
into the file, each record written with the GIL let go). The state is a 125m worker's on the
host: five copies of 136 M float32 values (θ, φ, δ and Adam's two moments, 2.7 GB) by
default, --values to change it.

    PYTHONPATH=. python benchmarks/checkpoint_write.py [--runs 3] [--values 136e6] [--out FILE]
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.table import emit, markdown_table, median_range
from noloco_rt.checkpoints.worker import (
    CHECKPOINT_VERSION,
    checkpoint_writer,
    publish_temporary,
    write_temporary,
)

PYTHON_ALONE_S = 1.0
"""How long the stand-in runs alone for its reference speed."""
OP_SIZE = 64
"""The stand-in's matrix side: a 64 x 64 matmul takes some tens of microseconds on a CPU."""


def python_work(stop: threading.Event) -> int:
    """Small matmuls launched one after another until `stop` is set; how many."""
    a, b = torch.randn(OP_SIZE, OP_SIZE), torch.randn(OP_SIZE, OP_SIZE)
    turns = 0
    while not stop.is_set():
        torch.mm(a, b)
        turns += 1
    return turns


def turns_per_s_alone() -> float:
    stop = threading.Event()
    timer = threading.Timer(PYTHON_ALONE_S, stop.set)
    timer.start()
    started = time.perf_counter()
    turns = python_work(stop)
    return turns / (time.perf_counter() - started)


def write_through_bytes(state: dict, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"version": CHECKPOINT_VERSION, **state}, buffer)
    publish_temporary(write_temporary(path, buffer.getvalue()), path)


def write_straight(state: dict, path: Path) -> None:
    publish_temporary(write_temporary(path, checkpoint_writer(state)), path)


def measure(write: Callable[[dict, Path], None], state: dict, path: Path) -> tuple[float, float]:
    """(seconds the write took, fsync included, ops/s of the launching thread meanwhile). The
    disk's write-back of what came before is waited for first: else it slows whichever
    writer comes next."""
    os.sync()
    stop = threading.Event()
    took: list[float] = []

    def writer() -> None:
        started = time.perf_counter()
        write(state, path)
        took.append(time.perf_counter() - started)
        stop.set()

    thread = threading.Thread(target=writer, name="checkpoint-writer")
    started = time.perf_counter()
    thread.start()
    turns = python_work(stop)
    elapsed = time.perf_counter() - started
    thread.join()
    path.unlink()
    return took[0], turns / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--values", type=float, default=136e6, help="float32 values per copy of the parameters")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    per_copy = int(args.values)
    pieces = [per_copy // 100] * 100
    state = {"run_id": "bench", "stage": 0,
             **{name: [torch.randn(n) for n in pieces] for name in ("fast", "slow", "momentum", "m", "v")}}
    gigabytes = 5 * per_copy * 4 / 1e9
    writers = {"torch.save into a BytesIO, then the file": write_through_bytes,
               "checkpoint_writer (straight into the file)": write_straight}
    seconds: dict[str, list[float]] = {name: [] for name in writers}
    ratios: dict[str, list[float]] = {name: [] for name in writers}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "w.pt"
        for run in range(args.runs):
            alone = turns_per_s_alone()
            order = list(writers.items())
            for name, write in order if run % 2 == 0 else reversed(order):  # neither always goes first
                took, turns = measure(write, state, path)
                seconds[name].append(took)
                ratios[name].append(turns / alone)
            print(f"checkpoint_write: run {run + 1}/{args.runs} done", flush=True)

    rows = [[name, median_range(seconds[name], ".2f"), median_range(ratios[name], ".2f")] for name in writers]
    title = (f"A checkpoint of {gigabytes:.1f} GB written on a background thread, {args.runs} run(s): "
             "median [min–max]")
    table = markdown_table(title, ["writer", "write s", "ops launched meanwhile, × alone"], rows)
    emit(table, args.out)


if __name__ == "__main__":
    main()

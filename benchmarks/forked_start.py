"""`up` with its workers forked from the preloaded fork server (worker.forked_start, the
default) against each started as a fresh interpreter, runs alternated.

    PYTHONPATH=. .venv/bin/python -m benchmarks.forked_start [--runs 3] [--out FILE]

Each run: `up --stages 2 --replicas 2 --steps 60 --preset tiny` (4 workers and a
coordinator). Columns: seconds from `up_started` to the first worker's first progress line
(start-up, which every restart repeats), the whole run's wall seconds, and the CPU seconds of
`up` and everything under it (user + system, the children's as the kernel sums them).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_check import child_env
from benchmarks.overhead import format_spread, spread
from benchmarks.table import emit, markdown_table
from noloco_rt.logs import read_json_lines, record_seconds

COMMAND = ["up", "--stages", "2", "--replicas", "2", "--steps", "60", "--preset", "tiny", "--no-tensorboard"]


def seconds_to_first_step(out: Path, up_output: str) -> float:
    """From up's `up_started` line to the earliest `train_progress` of any worker."""
    lines = [json.loads(line) for line in up_output.splitlines() if line.startswith("{")]
    started = next(record_seconds(r["timestamp"]) for r in lines if r.get("event") == "up_started")
    first = min(record_seconds(r["timestamp"]) for path in (out / "logs").glob("s*.log")
                for r in read_json_lines(path)[0] if r.get("event") == "train_progress")
    return first - started


def one_run(forked: bool, out: Path) -> tuple[float, float, float]:
    """(seconds to the first step, wall seconds, CPU seconds) of one `up`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "noloco_rt.cli", *COMMAND, "--out", str(out),
                           "--set", f"worker.forked_start={str(forked).lower()}"],
                          env=child_env(), capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"forked_start: `up` exited {done.returncode}:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds_to_first_step(out, done.stdout + done.stderr), wall, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each side, alternated")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="forked-start-") as tmp:
        for run in range(args.runs):
            for forked in (True, False):
                results[forked].append(one_run(forked, Path(tmp) / f"{forked}-{run}"))
                print(f"forked_start: run {run + 1}/{args.runs}, forked={forked}: {results[forked][-1]}", flush=True)
    rows = [[("forked (default)" if forked else "fresh interpreters"),
             *(format_spread(spread([r[k] for r in results[forked]]), ".1f", " s") for k in range(3))]
            for forked in (True, False)]
    emit(markdown_table(f"`noloco-rt {' '.join(COMMAND)}`, {args.runs} runs a side alternated: median [min–max]",
                        ["workers", "to the first step", "whole run", "CPU"], rows), args.out)


if __name__ == "__main__":
    main()

"""A small effect on a drifting machine: one `up` run of the overhead benchmark's pipeline
shape (benchmarks/overhead.py, 2 x 1), a treatment of its workers switched on and off from
outside every --phase-s seconds, and each phase's tokens/s set against the phase next to it.

    PYTHONPATH=. .venv/bin/python -m benchmarks.phase_toggle --treatment pin|nice-background
        [--steps 3000] [--phase-s 4] [--out FILE]

This project's 2-core machines drift by up to half within tens of seconds (benchmarks/README.md),
so whole runs, even alternated, cannot resolve a few percent; phases of one run a few seconds
apart can. Each phase's rate comes from the stage-0 worker's progress lines inside it (every
10th step), its first SETTLE_S left out. Treatments, on every thread of every worker:

- pin: each worker's threads on a core of its own (stage k: core k mod cores), as "one
  worker per stage, each with its own core" reads; off: every core;
- nice-background: every thread but a worker's main one (its data link, ZeroMQ's I/O
  threads, the exchange, heartbeats) at 10 nice levels below the main one; off: level with
  it (root only: lowering a nice value needs CAP_SYS_NICE).

Prints the phases' tokens/s with the treatment on and off (median [min-max]) and the ratio of
each on-phase to the off-phase after it: median [min-max], and how many of the pairs it won.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from benchmarks.overhead import SHAPES, git_commit, stage0_progress, up_with_workers
from benchmarks.table import emit, markdown_table

TREATMENTS = ("pin", "nice-background")
SETTLE_S = 0.5
"""Left out at the start of each phase: the treatment takes hold, the step under way ends."""
START_UP_S = 12.0
"""Left to the run before the first phase: start-up and warm-up."""
BACKGROUND_NICE = 10
"""How far below its main thread a worker's other threads go with nice-background."""


@dataclasses.dataclass(frozen=True)
class Phase:
    start: float
    """time.time() when the treatment was switched."""
    on: bool


def phase_rates(progress: Sequence[tuple[float, int]], phases: Sequence[Phase], *, phase_s: float,
                tokens_per_step: int, settle_s: float = SETTLE_S) -> list[tuple[bool, float]]:
    """(on, tokens/s) of each phase with two progress lines (time, inner step) inside it after
    its first settle_s, in order; phases end at the next one's start or after phase_s."""
    rates = []
    for index, phase in enumerate(phases):
        end = min(phase.start + phase_s, phases[index + 1].start if index + 1 < len(phases) else math.inf)
        inside = [(t, step) for t, step in progress if phase.start + settle_s <= t <= end]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            rates.append((phase.on, (inside[-1][1] - inside[0][1]) * tokens_per_step / (inside[-1][0] - inside[0][0])))
    return rates


def pair_ratios(rates: Sequence[tuple[bool, float]]) -> list[float]:
    """Each on-phase's rate over the rate of the off-phase right after it."""
    return [rate / after for (on, rate), (after_on, after) in itertools.pairwise(rates)
            if on and not after_on]


def threads_of(pid: int) -> list[int]:
    """A process's thread ids (none once it has exited)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def apply(treatment: str, on: bool, workers: dict[int, int]) -> None:
    """Switch `treatment` on or off for every thread of each worker ({stage: pid}). Taking a
    nice back needs CAP_SYS_NICE: without it, PermissionError (the run would be no A/B)."""
    cores = sorted(os.sched_getaffinity(0))
    for stage, pid in workers.items():
        for tid in threads_of(pid):
            try:
                if treatment == "pin":
                    os.sched_setaffinity(tid, {cores[stage % len(cores)]} if on else set(cores))
                elif tid != pid:  # relative to the main thread, which keeps its own
                    main = os.getpriority(os.PRIO_PROCESS, pid)
                    os.setpriority(os.PRIO_PROCESS, tid, main + BACKGROUND_NICE if on else main)
            except ProcessLookupError:
                pass  # the thread ended meanwhile


def by_stage(pids: dict[str, int]) -> dict[int, int]:
    """{stage: pid} of {worker name: pid} (one replica a stage: s<k>-r0)."""
    return {int(name.split("-")[0][1:]): pid for name, pid in pids.items()}


def progress_points(out: Path) -> list[tuple[float, int]]:
    return [(datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp(), int(r["inner_step"]))
            for r in stage0_progress(out)]


def run(treatment: str, *, steps: int, phase_s: float, out: Path, timeout_s: float = 900.0) -> list[tuple[bool, float]]:
    spec = dataclasses.replace(SHAPES["pipeline"], steps=steps)
    deadline = time.monotonic() + timeout_s
    with up_with_workers(spec, out, deadline=deadline) as (child, pids):
        workers = by_stage(pids)
        time.sleep(START_UP_S)
        phases: list[Phase] = []
        while child.poll() is None and time.monotonic() < deadline:
            on = not phases or not phases[-1].on
            apply(treatment, on, workers)
            phases.append(Phase(time.time(), on))
            time.sleep(phase_s)
    return phase_rates(progress_points(out), phases, phase_s=phase_s, tokens_per_step=spec.tokens_per_step)


def report(treatment: str, rates: Sequence[tuple[bool, float]], *, steps: int, phase_s: float) -> str:
    def spread(values: Sequence[float], digits: int) -> str:
        if not values:
            return "–"
        return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}–{max(values):,.{digits}f}]"

    on = [rate for is_on, rate in rates if is_on]
    off = [rate for is_on, rate in rates if not is_on]
    ratios = pair_ratios(rates)
    rows = [("on", len(on), spread(on, 0), "–"), ("off", len(off), spread(off, 0), "–"),
            ("on / the off after it", len(ratios), spread(ratios, 3), f"{sum(r > 1 for r in ratios)} of {len(ratios)}")]
    return markdown_table(
        f"Treatment {treatment} switched every {phase_s:g} s in one `up` of the pipeline shape ({steps} steps), "
        f"commit {git_commit()}", ("phases", "count", "tokens/s", "on faster"), rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--treatment", choices=TREATMENTS, required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--phase-s", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.steps < 100 or args.phase_s < 2 * SETTLE_S:
        parser.error(f"need --steps >= 100 and --phase-s >= {2 * SETTLE_S:g}")
    with tempfile.TemporaryDirectory(prefix="phase-toggle-") as tmp:
        rates = run(args.treatment, steps=args.steps, phase_s=args.phase_s, out=Path(tmp))
    emit(report(args.treatment, rates, steps=args.steps, phase_s=args.phase_s), args.out)


if __name__ == "__main__":
    main()

"""Where a worker's CPU goes, thread by thread: one `up` of an overhead benchmark shape
(benchmarks/overhead.py: the 2 x 1 pipeline, or the 1 x 1 launch shape), each worker's threads
read from /proc at the start and the end of a window of its training.

    PYTHONPATH=. .venv/bin/python -m benchmarks.thread_load [--shape pipeline|launch] [--window-s 10] [--out FILE]

Per thread (named as the worker names them, noloco_rt/process/thread_names.py; ZeroMQ names
its own; the main thread carries the process title): CPU in % of one core, and per inner step
its wakeups (voluntary context switches: it slept and was woken) and preemptions (involuntary:
it could run and another thread had its core). On this project's 2-core machines each wakeup
of a background thread takes a core from a training thread for a while, so the background rows
are what the runtime's own threads cost its training; the main thread's preemptions, how often
training was interrupted. Counts, not speed: they hardly move with the machine's drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.overhead import SHAPES, git_commit, up_with_workers
from benchmarks.phase_toggle import progress_points
from benchmarks.table import emit, markdown_table

START_UP_S = 12.0
"""Left to the run before the window: start-up and warm-up."""
MAIN = "main (training)"
"""The label of a worker's main thread, whose kernel name is the process title."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class ThreadCounts:
    """What the kernel has counted for one thread since it started."""

    name: str
    cpu_s: float
    wakeups: int
    preemptions: int


@dataclasses.dataclass(frozen=True)
class ThreadLoad:
    """One thread kind of one worker over the window (threads of the same name summed)."""

    worker: str
    thread: str
    cpu_share: float
    """CPU seconds per second: 1.0 is a whole core."""
    wakeups_per_step: float
    preemptions_per_step: float


def parse_thread(stat: str, status: str) -> ThreadCounts:
    """A thread's counts from /proc/PID/task/TID/stat and .../status (Linux's formats; the
    name in stat may hold spaces and parentheses, so it is read from the last ')')."""
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat
    switches = dict(line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line)
    return ThreadCounts(name, cpu_s, int(switches["voluntary_ctxt_switches"]),
                        int(switches["nonvoluntary_ctxt_switches"]))


def read_threads(pid: int) -> dict[int, ThreadCounts]:
    """{thread id: counts} of a live process (threads that end while read are left out)."""
    counts = {}
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return counts
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat, open(f"/proc/{pid}/task/{tid}/status") as status:
                counts[tid] = parse_thread(stat.read(), status.read())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return counts


def thread_loads(before: Mapping[str, Mapping[int, ThreadCounts]], after: Mapping[str, Mapping[int, ThreadCounts]],
                 pids: Mapping[str, int], *, seconds: float, steps: float) -> list[ThreadLoad]:
    """Each worker's threads over a window of `seconds` and `steps` inner steps, from the
    counts at its start and end ({worker: {tid: counts}}): threads alive at both, those of
    one name summed, the main one first, then by CPU."""
    if seconds <= 0 or steps <= 0:
        raise ValueError(f"an empty window: {seconds} s, {steps} steps")
    loads = []
    for worker, threads in after.items():
        summed: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for tid, end in threads.items():
            start = before.get(worker, {}).get(tid)
            if start is None:
                continue  # started inside the window: no count at its start
            total = summed[MAIN if tid == pids[worker] else end.name]
            total[0] += end.cpu_s - start.cpu_s
            total[1] += end.wakeups - start.wakeups
            total[2] += end.preemptions - start.preemptions
        loads += [ThreadLoad(worker, name, cpu / seconds, wakeups / steps, preemptions / steps)
                  for name, (cpu, wakeups, preemptions) in summed.items()]
    return sorted(loads, key=lambda load: (load.worker, load.thread != MAIN, -load.cpu_share, load.thread))


def background(loads: Sequence[ThreadLoad]) -> dict[str, ThreadLoad]:
    """Per worker, all its threads but the main one together."""
    totals: dict[str, ThreadLoad] = {}
    for load in loads:
        if load.thread == MAIN:
            continue
        seen = totals.get(load.worker, ThreadLoad(load.worker, "background, all", 0.0, 0.0, 0.0))
        totals[load.worker] = ThreadLoad(load.worker, seen.thread, seen.cpu_share + load.cpu_share,
                                         seen.wakeups_per_step + load.wakeups_per_step,
                                         seen.preemptions_per_step + load.preemptions_per_step)
    return totals


def steps_per_s(progress: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Stage 0's inner steps a second between its first and last progress line in [start, end]."""
    inside = [(t, step) for t, step in progress if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        raise ValueError(f"fewer than two progress lines in the window ({len(inside)})")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def run(shape: str, *, steps: int, window_s: float, out: Path, timeout_s: float = 900.0) -> list[ThreadLoad]:
    spec = dataclasses.replace(SHAPES[shape], steps=steps)
    deadline = time.monotonic() + timeout_s
    with up_with_workers(spec, out, deadline=deadline) as (child, pids):
        if len(pids) < spec.stages:
            raise RuntimeError(f"{len(pids)} of {spec.stages} workers started: see {out / 'up.out'}")
        time.sleep(START_UP_S)
        before = {worker: read_threads(pid) for worker, pid in pids.items()}
        started = time.time()
        time.sleep(window_s)
        after = {worker: read_threads(pid) for worker, pid in pids.items()}
        ended = time.time()
        if child.poll() is not None or not all(after.values()):
            raise RuntimeError(f"the run ended inside the window: raise --steps ({out / 'up.out'})")
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    rate = steps_per_s(progress_points(out), started, ended)
    return thread_loads(before, after, pids, seconds=ended - started, steps=rate * (ended - started))


def report(shape: str, loads: Sequence[ThreadLoad], *, window_s: float) -> str:
    rows = [(load.worker, load.thread, f"{100 * load.cpu_share:.1f}", f"{load.wakeups_per_step:.2f}",
             f"{load.preemptions_per_step:.2f}")
            for load in [*loads, *background(loads).values()]]
    return markdown_table(
        f"Each worker's threads over {window_s:g} s of training, `up` of the {shape} shape, commit {git_commit()}",
        ("worker", "thread", "CPU, % of a core", "wakeups / inner step", "preempted / inner step"), rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("pipeline", "launch"), default="pipeline")
    parser.add_argument("--steps", type=int, default=800, help="long enough to outlast start-up and the window")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.window_s <= 0:
        parser.error("--window-s must be positive")
    with tempfile.TemporaryDirectory(prefix="thread-load-") as tmp:
        loads = run(args.shape, steps=args.steps, window_s=args.window_s, out=Path(tmp))
    emit(report(args.shape, loads, window_s=args.window_s), args.out)


if __name__ == "__main__":
    main()

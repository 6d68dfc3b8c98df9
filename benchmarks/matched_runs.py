"""Outer steps matched in fault-free `noloco-rt up` runs, by pipeline shape, and with one
worker slowed from outside (DESIGN §4 "Drift").

Each run is `noloco-rt up` in a fresh directory, one after the other; the figures come
from the workers' logs: outer steps by kind per stage, uses of a partner's state not
returned by that partner (one-sided), microbatches re-sent and dropped against those
sent, and the share of its run each worker's training thread spent in outer steps.

    python -m benchmarks.matched_runs --shape 2x2:600 --shape 2x4:300 --shape 4x2:300 --runs 3
    python -m benchmarks.matched_runs --shape 1x4:200 --runs 3 --stop-duty 0.5

--stop-duty d stops one worker (s0-r0) with SIGSTOP for d of every STOP_PERIOD_S seconds
and lets it run (SIGCONT) for the rest, from outside the project: a straggler at 1 - d of
full speed. Its blocked share is left out of the "fast workers" column.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.table import emit, markdown_table
from noloco_rt.logs import record_seconds
from workers.cluster.local_cluster import one_sided_share, read_events

STOP_PERIOD_S = 1.0
SLOWED = "s0-r0"

Disturbance = Callable[[Path, threading.Event], None]
"""Something done to a running `up` from outside (its run directory, set when it has ended)."""


@dataclass
class RunFigures:
    kinds: dict[int, Counter] = field(default_factory=dict)
    """Outer steps by kind, per stage."""
    one_sided: float = 0.0
    sent: int = 0
    retried: int = 0
    dropped: int = 0
    blocked: dict[str, float] = field(default_factory=dict)
    """Worker name -> share of its run its training thread spent in outer steps."""
    wall_s: float = 0.0
    errors: int = 0
    delays: list[int] = field(default_factory=list)
    """Inner steps between each matched outer step and its correction (0: blocking)."""
    pulled: int = 0
    """Outer steps taken early because a partner's push for them had arrived."""
    jumped: int = 0
    """Outer steps never taken: a pull to a later one went over them."""
    skipped: int = 0
    """Inner steps pulls moved clocks over (never trained)."""
    trained: dict[str, int] = field(default_factory=dict)
    """Worker name -> microbatches whose backward its incarnations completed (a SIGKILLed
    incarnation writes no summary: a lower bound where workers were killed)."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """"SxR:STEPS" -> (stages, replicas, steps)."""
    try:
        shape, steps = text.split(":")
        stages, replicas = shape.split("x")
        return int(stages), int(replicas), int(steps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STAGESxREPLICAS:STEPS, e.g. 2x4:300, got {text!r}") from None


def _duty_cycle(out: Path, done: threading.Event, *, duty: float) -> None:
    """Stop and continue the slowed worker's process, found by its pid file, until `done`."""
    pid = None
    while not done.is_set() and pid is None:
        pid = worker_pids(out / "up.log").get(SLOWED)
        done.wait(0.2)
    while pid is not None and not done.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            done.wait(duty * STOP_PERIOD_S)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        done.wait((1 - duty) * STOP_PERIOD_S)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def worker_pids(up_log: Path) -> dict[str, int]:
    """Worker name -> pid of its newest incarnation, from `up`'s log so far (process_started
    lines; a restart logs a new one)."""
    pids: dict[str, int] = {}
    if not up_log.exists():
        return pids
    for line in up_log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "process_started" and str(event.get("name", "")).startswith("s"):
            pids[event["name"]] = int(event["pid"])
    return pids


def run_up(stages: int, replicas: int, steps: int, h: int, *, duty: float, seed: int, tmp: Path,
           settings: Sequence[str] = (), disturb: Disturbance | None = None) -> RunFigures:
    """One `up` run in tmp/SxR-SEED; `duty` > 0 slows one worker, `disturb(out, done)` runs
    beside the run in a thread of its own until `done` is set (the parity benchmark's faults)."""
    if duty > 0:
        disturb = functools.partial(_duty_cycle, duty=duty)
    out = tmp / f"{stages}x{replicas}-{seed}"
    command = [sys.executable, "-m", "noloco_rt.cli", "up", "--stages", str(stages), "--replicas", str(replicas),
               "--steps", str(steps), "--out", str(out), "--no-tensorboard", "--set", f"outer.h={h}",
               "--set", f"run.seed={seed}", *(arg for value in settings for arg in ("--set", value))]
    out.mkdir(parents=True)
    done = threading.Event()
    stopper = threading.Thread(target=disturb, args=(out, done), daemon=True) if disturb is not None else None
    started = time.monotonic()
    with (out / "up.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        if stopper is not None:
            stopper.start()
        code = process.wait()
    done.set()
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}; see {out / 'up.log'}")
    return figures_of(out, wall_s=time.monotonic() - started)


def figures_of(out: Path, *, wall_s: float) -> RunFigures:
    """What one finished up run in `out` shows in its workers' logs."""
    figures = RunFigures(wall_s=wall_s)
    used: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    for path in sorted((out / "logs").glob("s*-r*.log")):
        name = path.name.split(".")[0]
        events = read_events(path)
        started_events = [e for e in events if e.get("event") == "worker_started"]
        if started_events:
            names[started_events[0]["worker"][:8]] = name
        stage = int(name[1:name.index("-")])
        figures.errors += sum(1 for e in events if e.get("level") in ("error", "critical"))
        done_events = [e for e in events if e.get("event") == "outer_step_done"]
        figures.kinds.setdefault(stage, Counter()).update(e["kind"] for e in done_events)
        used.setdefault(name, []).extend(u for e in done_events for u in e["used"])
        figures.delays.extend(e["delay"] for e in done_events if e["used"])
        summary = [e for e in events if e.get("event") == "worker_summary"]
        if summary:
            figures.sent += summary[-1]["sent"]
            figures.retried += summary[-1]["retried"]
            figures.dropped += summary[-1]["dropped"]
            figures.pulled += summary[-1].get("pulled_outer_steps", 0)
            figures.jumped += summary[-1].get("skipped_outer_steps", 0)
            figures.skipped += summary[-1].get("skipped_steps", 0)
            figures.trained[name] = figures.trained.get(name, 0) + summary[-1].get("microbatches", 0)
            span = record_seconds(events[-1]["timestamp"]) - record_seconds(events[0]["timestamp"])
            figures.blocked[name] = summary[-1]["outer_blocked_s"] / span if span > 0 else 0.0
    figures.one_sided = one_sided_share({n: [names.get(u, u) for u in us] for n, us in used.items()})
    return figures


def row(shape: str, seed: int, f: RunFigures, duty: float) -> list[object]:
    matched = "; ".join(f"s{s}: {k['matched']}/{sum(k.values())} ({100 * k['matched'] / max(1, sum(k.values())):.0f} %)"
                        for s, k in sorted(f.kinds.items()))
    unmatched = Counter()
    for k in f.kinds.values():
        unmatched.update({kind: n for kind, n in k.items() if kind != "matched"})
    fast = {n: b for n, b in f.blocked.items() if not (duty > 0 and n == SLOWED)}
    blocked = f"{100 * max(fast.values(), default=0):.1f} %"
    resent = f"{f.retried} ({100 * f.retried / max(1, f.sent):.2f} %)" if f.sent else "-"
    at_most_one = sum(1 for d in f.delays if d <= 1)
    delay = f"{100 * at_most_one / len(f.delays):.0f} % ≤ 1, max {max(f.delays)}" if f.delays else "-"
    return [shape, seed, matched, dict(unmatched) or "-", f"{f.one_sided:.3f}", resent, f.dropped, blocked,
            delay, f"{f.pulled} ({f.jumped} jumped over)", f.errors, f"{f.wall_s:.0f}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=parse_shape, action="append", required=True,
                        help="STAGESxREPLICAS:STEPS, repeatable")
    parser.add_argument("--runs", type=int, default=3, help="runs per shape (seeds 0..runs-1)")
    parser.add_argument("--h", type=int, default=10, help="outer.h")
    parser.add_argument("--stop-duty", type=float, default=0.0,
                        help="share of each second the slowed worker is stopped (0: no worker slowed)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--keep", type=Path, help="leave the runs' directories here (default: a temporary one)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="passed on to every up run (repeatable), e.g. outer.overlap=false")
    args = parser.parse_args(argv)
    if not 0.0 <= args.stop_duty < 1.0:
        parser.error("--stop-duty must be in [0, 1)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="matched-runs-") as tmp:
        work = args.keep or Path(tmp)
        for stages, replicas, steps in args.shape:
            for seed in range(args.runs):
                figures = run_up(stages, replicas, steps, args.h, duty=args.stop_duty, seed=seed, tmp=work,
                                 settings=args.settings)
                rows.append(row(f"{stages}x{replicas}, {steps} steps", seed, figures, args.stop_duty))
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
    slowed = f", {SLOWED} stopped {args.stop_duty:.0%} of every {STOP_PERIOD_S:g} s" if args.stop_duty else ""
    emit(markdown_table(f"Outer steps matched, h = {args.h}{slowed}",
                        ["shape", "seed", "matched per stage", "not matched", "one-sided share",
                         "re-sent", "dropped", "max blocked share (fast workers)", "correction delay (inner steps)",
                         "pulled (outer steps jumped over)", "error events", "wall s"], rows),
         args.out)


if __name__ == "__main__":
    main()

"""Faults injected into a running `noloco-rt up` from outside, for the parity benchmark: a
seeded schedule that alternates SIGKILL (the supervisor restarts the worker, which rejoins
from a peer or its checkpoint) and SIGSTOP for a few seconds (a stalled machine), each on a
worker drawn at random. Light on purpose: one fault every `every_s` seconds, so that the
run's loss shows what elasticity costs, not a cluster that never settles.

The workers' pids come from `up`'s own log (benchmarks.matched_runs.worker_pids).
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.matched_runs import worker_pids

KINDS = ("sigkill", "sigstop")


@dataclass
class InjectedFaults:
    """What was done, for the table."""

    by_kind: Counter = field(default_factory=Counter)
    missed: int = 0
    """Faults whose worker had no live process at the time (restarting or finished)."""


def inject(up_log: Path, *, seed: int, every_s: float, hold_s: float, done: threading.Event,
           faults: InjectedFaults) -> None:
    """Until `done`: every `every_s` seconds one fault on a random worker, kinds in turn."""
    draw = random.Random(f"parity-faults-{seed}")
    turn = 0
    while not done.wait(every_s):
        pids = worker_pids(up_log)
        if not pids:
            continue
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        name = draw.choice(sorted(pids))
        if _apply(kind, pids[name], hold_s, done):
            faults.by_kind[kind] += 1
        else:
            faults.missed += 1


def _apply(kind: str, pid: int, hold_s: float, done: threading.Event) -> bool:
    try:
        if kind == "sigkill":
            os.kill(pid, signal.SIGKILL)
            return True
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    done.wait(hold_s)
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    return True

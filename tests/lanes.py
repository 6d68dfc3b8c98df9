"""The whole suite in two lanes at once, two pytest sessions side by side.

The `processes` lane: the tests marked `slow` that start real workers, servers and sockets
(but for a few that wait only on their runs' end: WAIT_ON_THEIR_END).
They spend much of their time waiting on them: over a single-lane run on 2 cores the machine
was busy 64 % of the time. The `rest` lane fills that idle third beside them: every other
test, the slow ones that only train in this process (IN_PROCESS) included, as they wait on
no deadline that a busy core could make them miss.

    python -m tests.lanes [PYTEST ARGS]   # what `make test` runs; the arguments go to both lanes

Each lane is a pytest given `-p tests.lanes --lane NAME`: this module is also the pytest
plugin that then deselects the other lane's tests (`lane_of`). The processes lane prints as it
goes; the other lane's report follows it, then one line for both. The exit status is the
first failing lane's (0: both passed). Ctrl-C or SIGTERM stops both lanes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

import pytest

PROCESSES, REST = "processes", "rest"
LANES = (PROCESSES, REST)
"""The first streams its output, the other is reported after it."""
IN_PROCESS = ("tests/simulation/", "tests/model/", "tests/memory/", "tests/benchmarks/")
"""Folders whose slow tests train in the test's own process (or a child that only computes),
not against real workers' deadlines: they run in the rest lane."""
WAIT_ON_THEIR_END = (
    "tests/cluster/test_hf_up.py",  # one `up` run with 10 s exchange deadlines, then export in process
    "tests/workers/test_host_reads.py",  # counts reads of runs to their end
)
"""Slow tests that start real processes, hold no machine-wide resource (network namespaces,
fixed ports) and wait on their runs' end rather than on a tight deadline: they run in the rest
lane too, which ended a quarter sooner (a CI run at 8abba39: the processes lane 928 s, the
rest 670)."""
LANE_ENV = {REST: {"OMP_NUM_THREADS": "1"}}
"""Beside the other lane, the rest computes on one torch thread: with two, each OpenMP region
waits for a second core the other lane holds (the simulator's learning tests took 6 times as
long as alone)."""
WAIT_TURN_S = 0.5
"""How long the wait for one lane lasts before the next one's turn (their end times are
this exact)."""
STOP_GRACE_S = 20.0
"""After Ctrl-C, how long a lane may take to tear its fixtures down before it is killed."""


def lane_of(nodeid: str, *, slow: bool) -> str:
    """The lane a test runs in, from its pytest node id (relative to the repository) and
    whether it is marked slow."""
    return PROCESSES if slow and not nodeid.startswith(IN_PROCESS + WAIT_ON_THEIR_END) else REST


def lane_command(lane: str, args: list[str]) -> list[str]:
    """One lane's pytest; only the streaming lane writes pytest's cache (two sessions would race)."""
    cache = [] if lane == LANES[0] else ["-p", "no:cacheprovider"]
    return [sys.executable, "-m", "pytest", "-q", "-p", "tests.lanes", "--lane", lane, *cache, *args]


def combined_status(codes: list[int]) -> int:
    """The first failing lane's status; 5 (nothing collected) counts as passing, since a
    lane may select nothing under a user's own selection (e.g. one test file)."""
    return next((code for code in codes if code not in (0, 5)), 0)


# -- the plugin, in each lane's pytest ---------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", choices=LANES, help="run only this lane's tests (tests/lanes.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("lane")
    if lane is None:
        return
    kept, other = [], []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (kept if lane_of(item.nodeid, slow=slow) == lane else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
    items[:] = kept


# -- the runner -------------------------------------------------------------------------------


@dataclass
class Lane:
    name: str
    process: subprocess.Popen
    log: IO[str] | None
    """Where a quiet lane's output waits to be printed (None: it prints as it goes)."""
    started: float
    seconds: float | None = None


def summary(lanes: list[Lane]) -> str:
    parts = [f"{lane.name} lane {'passed' if lane.process.returncode in (0, 5) else 'FAILED'} "
             f"(exit {lane.process.returncode}, {lane.seconds:.0f} s)" for lane in lanes]
    return "lanes: " + "; ".join(parts)


def _start(name: str, args: list[str], *, streams: bool) -> Lane:
    log = None if streams else tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(lane_command(name, args), stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **LANE_ENV.get(name, {})},
                               start_new_session=True)  # its own group: stopped by us, not by the terminal
    return Lane(name, process, log, time.monotonic())


def _wait_all(lanes: list[Lane]) -> None:
    """Until every lane has ended, each one's time taken as it ends."""
    while running := [lane for lane in lanes if lane.seconds is None]:
        for lane in running:
            try:
                lane.process.wait(WAIT_TURN_S)
            except subprocess.TimeoutExpired:
                continue
            lane.seconds = time.monotonic() - lane.started


def _stop_all(lanes: list[Lane]) -> None:
    """As Ctrl-C stops one pytest (its fixtures stop the processes they started), then for good."""
    for lane in lanes:
        if lane.process.poll() is None:
            os.killpg(lane.process.pid, signal.SIGINT)
    for lane in lanes:
        try:
            lane.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(lane.process.pid, signal.SIGKILL)
            lane.process.wait()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # SystemExit: the lanes are stopped as for Ctrl-C


def main(args: list[str]) -> int:
    # The lanes run in sessions of their own: a SIGTERM (a CI job cancelled) must reach them through us.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    lanes = [_start(name, args, streams=index == 0) for index, name in enumerate(LANES)]
    try:
        _wait_all(lanes)
    except BaseException:
        _stop_all(lanes)
        raise
    for lane in lanes[1:]:
        assert lane.log is not None
        print(f"\n===== the {lane.name} lane =====", flush=True)
        lane.log.seek(0)
        sys.stdout.write(lane.log.read())
    print(summary(lanes), flush=True)
    return combined_status([lane.process.returncode for lane in lanes])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

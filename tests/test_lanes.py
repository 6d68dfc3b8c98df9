"""The two-lane runner of `make test` (tests/lanes.py), on a small suite of its own: every test
runs in exactly one lane, a failure in either fails the whole, and the quiet lane's report is
printed, not lost; the rest lane on one torch thread; SIGTERM to the runner stops both lanes;
and which lane the suite's own tests take."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.lanes import PROCESSES, REST, combined_status, lane_of
from tests.support.paths import REPO

SUITE = textwrap.dedent("""
    import os

    import pytest

    @pytest.mark.slow
    def test_slow_one():
        print("slow lane threads", os.environ.get("OMP_NUM_THREADS"))

    @pytest.mark.slow
    def test_slow_two_fails():
        assert {fail} == 0

    def test_fast_one():
        print("rest lane threads", os.environ.get("OMP_NUM_THREADS"))

    def test_fast_two():
        pass
""")


def _small_suite(tmp_path, name: str, source: str) -> dict[str, str]:
    """A suite of one file in tmp_path, and the environment the runner needs to run it."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / name).write_text(source)
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _run_lanes(tmp_path, *, fail: int) -> subprocess.CompletedProcess:
    env = {**_small_suite(tmp_path, "test_small.py", SUITE.format(fail=fail)), "OMP_NUM_THREADS": "3"}
    return subprocess.run([sys.executable, "-m", "tests.lanes", "-rA"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_each_test_runs_in_one_lane_and_both_reports_are_printed(tmp_path):
    result = _run_lanes(tmp_path, fail=0)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    slow_report, fast_report = out.split("===== the rest lane =====")
    assert "2 passed, 2 deselected" in slow_report and "2 passed, 2 deselected" in fast_report
    assert "PASSED test_small.py::test_slow_one" in slow_report and "test_fast" not in slow_report
    assert "PASSED test_small.py::test_fast_two" in fast_report and "test_slow" not in fast_report
    # The rest lane computes on one torch thread; the other keeps the caller's setting.
    assert "slow lane threads 3" in slow_report and "rest lane threads 1" in fast_report
    assert out.rstrip().splitlines()[-1].startswith("lanes: processes lane passed (exit 0, ")


def test_a_failure_in_either_lane_fails_the_run(tmp_path):
    result = _run_lanes(tmp_path, fail=1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED test_small.py::test_slow_two_fails" in result.stdout
    last = result.stdout.rstrip().splitlines()[-1]
    assert "processes lane FAILED (exit 1" in last and "rest lane passed (exit 0" in last
    # A lane that selects nothing (a user's own selection) passes; any other failure is kept.
    assert combined_status([0, 5]) == 0 and combined_status([5, 2]) == 2 and combined_status([1, 0]) == 1


def test_slow_tests_of_real_processes_take_the_processes_lane_and_all_others_the_rest():
    assert lane_of("tests/cluster/test_chaos.py::test_short_chaos_run_keeps_every_invariant", slow=True) == PROCESSES
    assert lane_of("tests/net/test_auth.py::test_x", slow=True) == PROCESSES
    assert lane_of("tests/cluster/test_up.py::test_up_refuses_a_run_directory", slow=False) == REST
    assert lane_of("tests/simulation/test_simulate.py::test_every_method_learns[adam]", slow=True) == REST
    assert lane_of("tests/workers/test_host_reads.py::test_a_one_stage_worker_reads_nothing_back", slow=True) == REST


HELD = textwrap.dedent("""
    import os
    import time
    from pathlib import Path

    import pytest

    def _hold(name):
        Path(f"{name}.pid").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60  # bounded: the runner must stop us well before
        while time.monotonic() < deadline and not Path("release").exists():
            time.sleep(0.05)

    @pytest.mark.slow
    def test_held_slow():
        _hold("slow")

    def test_held_rest():
        _hold("rest")
""")


def test_sigterm_to_the_runner_stops_both_lanes(tmp_path):
    env = _small_suite(tmp_path, "test_held.py", HELD)
    runner = subprocess.Popen([sys.executable, "-m", "tests.lanes"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid_files = [tmp_path / "slow.pid", tmp_path / "rest.pid"]
        deadline = time.monotonic() + 60
        while not all(f.exists() and f.read_text() for f in pid_files) and time.monotonic() < deadline:
            time.sleep(0.05)
        lanes = [int(f.read_text()) for f in pid_files]  # each lane's pytest, inside its test
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 128 + signal.SIGTERM
        for pid in lanes:  # stopped by the runner, not left to run on in their own sessions
            assert not _running(pid), pid
    finally:
        (tmp_path / "release").touch()
        runner.kill()
        runner.wait()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False

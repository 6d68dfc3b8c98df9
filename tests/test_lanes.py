"""The two-lane runner of `make test` (tests/lanes.py), on a small suite of its own: every test
runs in exactly one lane, a failure in either fails the whole, and the quiet lane's report is
printed, not lost; the rest lane on one torch thread; and which lane the suite's own tests take."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def _run_lanes(tmp_path, *, fail: int) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "test_small.py").write_text(SUITE.format(fail=fail))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "3"}
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

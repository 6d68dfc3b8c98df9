"""Local clusters' workers forked from a preloaded process (workers/supervise/preloaded.py): the
child is `noloco-rt ARGS` with the environment it was given, logs to its file, and answers
poll, wait, signals and exit codes as a subprocess.Popen does."""

from __future__ import annotations

import signal
import subprocess

import pytest

from noloco_rt.membership.embedded_redis import free_port
from workers.supervise.preloaded import ForkedProcess, stop_server


def _start(tmp_path, args, **env) -> tuple[ForkedProcess, object]:
    log = tmp_path / "child.log"
    log.write_text("")
    return ForkedProcess(args, {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}, log), log


def test_a_forked_child_runs_the_command_with_its_own_environment_and_logs_to_its_file(tmp_path):
    child, log = _start(tmp_path, ["config", "show"], NOLOCO_OUTER_H="7")
    assert child.wait(60) == 0 and child.returncode == 0 and child.poll() == 0
    assert "\nh = 7\n" in log.read_text()


def test_a_usage_error_exits_2_as_the_command_line_does(tmp_path):
    child, log = _start(tmp_path, ["worker", "--stage", "-1"])
    assert child.wait(60) == 2
    assert "stage" in log.read_text().lower()


def test_a_running_child_times_out_a_wait_and_reports_the_signal_that_killed_it(tmp_path):
    # A worker waiting for a Redis nobody serves: it runs until told otherwise.
    child, _ = _start(tmp_path, ["worker", "--stage", "0"],
                      NOLOCO_NETWORK_REDIS_URL=f"redis://127.0.0.1:{free_port('127.0.0.1')}/0")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)
    assert child.poll() is None and child.returncode is None
    child.kill()
    assert child.wait(60) == -signal.SIGKILL
    child.send_signal(signal.SIGTERM)  # ended already: nothing to signal, no error


def test_stopping_the_server_kills_and_names_a_child_left_running(tmp_path):
    """The session's check that nothing outlives the suite (tests/conftest.py) sees forked
    children only through this: they are the fork server's, not pytest's."""
    child, _ = _start(tmp_path, ["worker", "--stage", "0"],
                      NOLOCO_NETWORK_REDIS_URL=f"redis://127.0.0.1:{free_port('127.0.0.1')}/0")
    assert stop_server() == [child.pid]
    assert child.poll() == -signal.SIGKILL
    assert stop_server() == []  # nothing left; a stopped server stops again quietly

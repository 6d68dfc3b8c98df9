"""Parent-death signal from the environment, with real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from noloco_rt.config import load_config
from noloco_rt.process.lifetime import PROCESS_ENV_VARS, set_parent_death_signal_from_env
from tests.support.command_env import settings_free_env

ARM = ("from noloco_rt.process.lifetime import set_parent_death_signal_from_env as arm; "
       "print(arm(), flush=True)")


def _run_child(**env: str) -> subprocess.CompletedProcess:
    clean = settings_free_env()
    return subprocess.run([sys.executable, "-c", ARM], env={**clean, **env}, capture_output=True, text=True,
                          timeout=30)


def test_not_asked_means_not_armed():
    assert set_parent_death_signal_from_env({}) is False
    assert _run_child().stdout.strip() == "False"


def test_armed_while_the_parent_is_the_expected_one():
    done = _run_child(NOLOCO_PARENT_DEATH_SIGNAL="15", NOLOCO_PARENT_PID=str(os.getpid()))
    assert (done.returncode, done.stdout.strip()) == (0, "True")


def test_a_child_orphaned_before_arming_signals_itself():
    # Its real parent is this test, not the pid it was told: as if the supervisor had died.
    not_our_pid = str(os.getppid())
    done = _run_child(NOLOCO_PARENT_DEATH_SIGNAL=str(int(signal.SIGTERM)), NOLOCO_PARENT_PID=not_our_pid)
    assert done.returncode == -signal.SIGTERM
    assert done.stdout == ""


@pytest.mark.parametrize("env", [{"NOLOCO_PARENT_DEATH_SIGNAL": "term"},
                                 {"NOLOCO_PARENT_DEATH_SIGNAL": "15", "NOLOCO_PARENT_PID": "-3"}])
def test_malformed_variables_name_themselves(env):
    with pytest.raises(ValueError, match="NOLOCO_PARENT"):
        set_parent_death_signal_from_env(env)


def test_process_variables_are_not_configuration():
    cfg = load_config(environ={name: "1" for name in PROCESS_ENV_VARS} | {"NOLOCO_OUTER_ALPHA": "0.3"})
    assert cfg.outer.alpha == 0.3

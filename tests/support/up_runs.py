"""Runs of `noloco-rt up` as a user starts them, each marked so that a test can find every process it left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.command_env import settings_free_env
from tests.support.waiting import wait_until as wait_until_every

MARK_VARIABLE = "UP_TEST_MARK"  # not NOLOCO_*: that prefix is configuration


# upstream_gone_s 1: these runs restart nobody, so stage 1 need not wait 5 s past stage 0's finish.
FAST = {"worker.heartbeat_interval_s": 0.25, "worker.exchange_timeout_s": 3.0, "worker.leave_grace_s": 10.0,
        "worker.upstream_gone_s": 1.0,
        "outer.h": 5, "pipeline.max_inflight": 2, "coordinator.eval_interval_s": 2.0,
        "coordinator.spread_interval_s": 4.0, "coordinator.max_pulls_per_s": 20.0, "run.eval_batches": 4}


def wait_until(condition, *, timeout_s: float, what: str, process: subprocess.Popen | None = None):
    return wait_until_every(condition, timeout_s, what, interval_s=0.2, process=process)


def start_up(out: Path, *, steps: int, mark: str, flags: tuple[str, ...] = (), **extra: object) -> subprocess.Popen:
    args = [sys.executable, "-m", "noloco_rt.cli", "up", "--steps", str(steps), "--out", str(out),
            "--interval", "0.5", *flags]
    for key, value in {**FAST, **extra}.items():
        args += ["--set", f"{key}={value}"]
    env = settings_free_env(**{MARK_VARIABLE: mark, "PYTHONUNBUFFERED": "1"})
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def marked_processes(mark: str) -> list[int]:
    """Pids of live processes that inherited our mark (workers, coordinator, redis-server)."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def finish(process: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"up did not exit within {timeout_s} s:\n{output[-4000:]}") from None
    return process.returncode, output


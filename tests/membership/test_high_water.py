"""A stage whose replicas all died must not silently restart from the seed: workers raise the
stage's high-water mark in Redis as they go, and a worker that finds no live peer of a stage
past step 0 refuses to seed it (one line, exit 3) unless --allow-reseed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.high_water import MALFORMED_MARK
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from tests.support.command_env import command_env
from workers.cluster.local_cluster import run_command, start_command
from workers.outer.bootstrap import StageProgressLost, check_may_seed

CLI = [sys.executable, "-m", "noloco_rt.cli"]


def test_only_a_stage_past_step_0_refuses_to_be_seeded():
    for high_water in (None, 0):
        check_may_seed(1, high_water, allow_reseed=False)
    check_may_seed(1, 7, allow_reseed=True)
    with pytest.raises(StageProgressLost, match="reached outer step 7 there.*--allow-reseed"):
        check_may_seed(1, 7, allow_reseed=False)


def test_a_mark_that_is_not_a_count_refuses_seeding_and_status_leaves_it_out():
    # Something else wrote the key (a Redis writer without the CURVE key): the worker exits 3
    # as designed, saying why, instead of crashing on int("x").
    with EmbeddedRedis() as server:
        membership = Membership(connect(server.url), run_id="default")
        membership.client.hset("noloco:default:high-water", mapping={"1": "x", "2": "-4", "0": "3", "3": "²"})
        assert membership.high_water.of(1) == MALFORMED_MARK and membership.high_water.of(2) == MALFORMED_MARK
        assert membership.high_water.of(3) == MALFORMED_MARK  # a digit to str.isdigit, not to int()
        with pytest.raises(StageProgressLost, match="not a step count"):
            check_may_seed(1, membership.high_water.of(1), allow_reseed=False)
        assert membership.high_water.by_stage() == {0: (3, 0)}
        result = subprocess.run([*CLI, "status", "--redis-url", server.url], capture_output=True, text=True,
                                timeout=60, env=command_env())
        assert result.returncode == 0, result.stderr


def _record(worker_id: str, outer_step: int, state: WorkerState = WorkerState.ONLINE) -> MemberRecord:
    return MemberRecord(worker_id, "default", 1, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", state,
                        outer_step=outer_step)


def test_heartbeats_raise_the_mark_and_never_lower_it():
    with EmbeddedRedis() as server:
        fast, slow = (Membership(connect(server.url), run_id="default") for _ in range(2))
        assert fast.high_water.of(1) == 0
        fast.register(_record("fast", 0, WorkerState.JOINING))
        fast.heartbeat(state=WorkerState.ONLINE, outer_step=5)
        slow.register(_record("slow", 3))
        slow.heartbeat(outer_step=3)  # behind: must not lower the stage's mark
        assert fast.high_water.of(1) == 5 and slow.high_water.of(1) == 5
        joining = Membership(connect(server.url), run_id="default")
        joining.register(_record("joiner", 9, WorkerState.JOINING))
        joining.heartbeat(outer_step=9)  # not ONLINE yet: its counters are not the stage's
        assert fast.high_water.of(0) == 0 and fast.high_water.of(1) == 5
        # A finishing worker's last heartbeat (LEAVING) carries its final outer step: status
        # said "reached outer step 9" of workers that logged 10.
        fast.heartbeat(state=WorkerState.LEAVING, outer_step=6)
        assert fast.high_water.of(1) == 6


@pytest.mark.slow
def test_a_lone_worker_of_a_stage_past_step_0_exits_3_unless_allowed_to_reseed(tmp_path):
    """...and, run as a Job runs it, touches its alive file and leaves with worker.left_exit_code."""
    with EmbeddedRedis() as server:
        Membership(connect(server.url), run_id="default").client.hset("noloco:default:high-water", "1", "7")
        args = ["worker", "--stage", "1", "--redis-url", server.url, "--name", "replacement",
                "--set", "run.log_format=json", "--set", f"paths.out_dir={tmp_path}"]
        code, refused = run_command(args, command_env(), tmp_path / "refused.log", timeout_s=120)
        assert code == 3, refused[-3000:]
        last = refused.strip().splitlines()[-1]
        assert last.startswith("Error: stage 1 has no live worker") and "--allow-reseed" in last
        assert "Traceback" not in refused and "member_online" not in refused
        assert Membership(connect(server.url), run_id="default").live_members(stage=1, states=None) == []

        # Allowed; and as a Kubernetes Job runs it: a liveness file, and exit 75 when it leaves unfinished.
        log_path, alive = tmp_path / "allowed.log", tmp_path / "alive"
        job_like = ["--set", "worker.left_exit_code=75", "--set", f"worker.alive_file={alive}"]
        allowed = start_command([*args, "--allow-reseed", *job_like], command_env(), log_path)
        try:
            deadline = time.monotonic() + 90
            while '"member_online"' not in log_path.read_text() and time.monotonic() < deadline:
                assert allowed.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.1)
            events = [json.loads(line)["event"] for line in log_path.read_text().splitlines() if line.startswith("{")]
            assert "first_of_stage" in events and "member_online" in events
            # The training loop touches the file about once a second (a stage 1 with no upstream still loops).
            touched = alive.stat().st_mtime if alive.exists() else 0.0
            while time.time() - touched > 3 and time.monotonic() < deadline:
                time.sleep(0.2)
                touched = alive.stat().st_mtime if alive.exists() else 0.0
            first_touch = touched
            while touched == first_touch and time.monotonic() < deadline:
                time.sleep(0.2)
                touched = alive.stat().st_mtime
            assert touched > first_touch, "the alive file was not touched again"
            allowed.send_signal(signal.SIGTERM)
            assert allowed.wait(timeout=60) == 75
        finally:
            if allowed.poll() is None:
                allowed.kill()
                allowed.wait()


@pytest.mark.slow
def test_a_late_worker_of_a_stage_that_finished_exits_0_instead_of_3(tmp_path):
    """Its peers reached run.steps and left while a later stage still trains (no run-finished
    mark yet): nothing to train and nobody to bootstrap from, which is not an error."""
    with EmbeddedRedis() as server:
        membership = Membership(connect(server.url), run_id="default")
        membership.client.hset("noloco:default:high-water", "0", "7")  # outer step 7 of h = 10: step 70
        assert membership.mark_stage_finished(0)
        args = ["worker", "--stage", "0", "--redis-url", server.url, "--name", "late", "--set", "outer.h=10",
                "--set", "run.log_format=json", "--set", f"paths.out_dir={tmp_path}"]
        code, late = run_command([*args, "--steps", "70"], command_env(), tmp_path / "late.log", timeout_s=120)
        assert code == 0, late[-3000:]
        events = [json.loads(line)["event"] for line in late.splitlines() if line.startswith("{")]
        assert "stage_already_finished" in events and "member_online" not in events
        assert membership.stage_finished(0)  # never registered: the mark still tells stage 1
        # A run extended past what the stage reached is not over: no donor, no checkpoint, exit 3.
        code, extended = run_command([*args, "--steps", "80"], command_env(), tmp_path / "extended.log", timeout_s=120)
        assert code == 3, extended[-3000:]
        assert "stage_already_finished" not in extended

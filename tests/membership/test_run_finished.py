"""The end of a run: a later stage waits for an upstream stage that vanished unfinished (its
replacements resume from the store and need a downstream), and once the last stage has
finished, a worker that starts exits 0 at once instead of training with nobody downstream.
Real Redis, a real folder store, a real worker process."""

from __future__ import annotations

from structlog.testing import capture_logs

from noloco_rt.logs import get_logger
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from noloco_rt.store.backend import RunStore
from noloco_rt.store.run_mark import RunFinishedMark
from tests.support.command_env import command_env
from tests.support.fake_clock import FakeClock
from workers.cluster.local_cluster import run_command
from workers.finish import UPSTREAM_CHECK_S, UPSTREAM_GONE_S, UpstreamFinished
from workers.run_finished import run_is_over

LOST_S = 60.0


def _upstream(server: EmbeddedRedis, worker_id: str) -> Membership:
    """A stage-0 worker, registered and ONLINE."""
    membership = Membership(connect(server.url), run_id="default")
    assert membership.register(MemberRecord(worker_id, "default", 0, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2",
                                            WorkerState.ONLINE))
    return membership


def _stage_1_rule(server: EmbeddedRedis, clock: FakeClock, **gone_s: float) -> UpstreamFinished:
    """Stage 1's finishing rule, always idle (nothing of its own in flight), on `clock`."""
    return UpstreamFinished(Membership(connect(server.url), run_id="default"), 1, idle=lambda: True,
                            received_from_upstream=lambda: False, lost_s=LOST_S,
                            log=get_logger(test="finish"), clock=clock, **gone_s)


def _finished_after(rule: UpstreamFinished, clock: FakeClock, seconds: float) -> bool:
    """Poll the rule as the training loop does (every 0.1 s) for `seconds` of the fake clock."""
    for _ in range(round(seconds / 0.1)):
        clock.now += 0.1
        if rule.finished():
            return True
    return False


def test_a_later_stage_waits_for_an_upstream_that_vanished_unfinished():
    with EmbeddedRedis() as server:
        clock = FakeClock(1000.0)
        rule = _stage_1_rule(server, clock)
        first = _upstream(server, "a" * 32)
        assert not _finished_after(rule, clock, 2.0)  # live upstream

        first.leave()  # every stage-0 worker gone, none finished: a whole stage reclaimed
        assert not _finished_after(rule, clock, 3 * UPSTREAM_GONE_S)
        replacement = _upstream(server, "b" * 32)  # resumed from the store: we are still here
        assert not _finished_after(rule, clock, 2.0)

        replacement.mark_stage_finished(0)
        replacement.leave()
        assert _finished_after(rule, clock, UPSTREAM_GONE_S + 1.0)


def test_worker_upstream_gone_s_sets_the_margin_after_a_marked_finish():
    with EmbeddedRedis() as server:
        clock = FakeClock(1000.0)
        rule = _stage_1_rule(server, clock, gone_s=1.0)
        upstream = _upstream(server, "a" * 32)
        upstream.mark_stage_finished(0)
        upstream.leave()
        assert not _finished_after(rule, clock, 0.5)
        assert _finished_after(rule, clock, 1.0)


def test_a_finish_mark_stops_counting_once_the_upstream_stage_trains_again():
    with EmbeddedRedis() as server:
        clock = FakeClock(1000.0)
        rule = _stage_1_rule(server, clock)
        early = _upstream(server, "a" * 32)
        early.mark_stage_finished(0)
        early.leave()
        assert not _finished_after(rule, clock, 1.0)  # marked and gone, but not for UPSTREAM_GONE_S yet
        replacement = _upstream(server, "b" * 32)  # a killed worker's replacement: training again
        assert not _finished_after(rule, clock, 2 * UPSTREAM_GONE_S)
        replacement.leave()  # killed too, unfinished; its registration cleared the earlier mark
        assert not _finished_after(rule, clock, 2 * UPSTREAM_GONE_S)
        # Nobody comes back and no mark appears (say Redis lost it): the run does not end on a
        # guess. The wait is reported every lost_s, and a restarted upstream that finishes (it
        # resumes at run.steps) ends it.
        with capture_logs() as logs:
            assert not _finished_after(rule, clock, 3.5 * LOST_S)
        lost = [e for e in logs if e["event"] == "upstream_lost"]
        assert len(lost) == 3 and all(e["stage"] == 0 and "start one of its workers again" in e["note"]
                                      for e in lost), lost
        back = _upstream(server, "c" * 32)
        back.mark_stage_finished(0)
        back.leave()
        assert _finished_after(rule, clock, UPSTREAM_GONE_S + 1.0)


def test_a_forward_heard_from_upstream_shows_it_live_without_a_redis_round_trip():
    # The training thread polls the rule whenever it is idle, between microbatches: while
    # forwards flow it must not wait on Redis (milliseconds on a loaded machine, a second or
    # more with Redis unreachable). Redis is gone here: any read would mark it unavailable.
    clock = FakeClock(1000.0)
    heard_at: list[float | None] = [None]
    with EmbeddedRedis() as server:
        membership = Membership(connect(server.url), run_id="default")
        rule = UpstreamFinished(membership, 1, idle=lambda: True, received_from_upstream=lambda: True,
                                lost_s=LOST_S, log=get_logger(test="finish"), clock=clock,
                                heard_from_upstream_at=lambda: heard_at[0])
    heard_at[0] = clock.now
    for _ in range(4):
        clock.now += UPSTREAM_CHECK_S / 5
        assert not rule.finished()
    assert membership.redis_available, "the rule asked Redis although upstream had just sent a forward"
    clock.now += UPSTREAM_CHECK_S  # upstream silent: now the rule asks, and finds Redis gone
    assert not rule.finished()
    assert not membership.redis_available


def test_the_run_finished_mark_lives_in_redis_and_in_the_store(tmp_path):
    assert run_is_over(100, 100)
    assert not run_is_over(None, 100) and not run_is_over(100, 200)  # more steps: train on
    assert not run_is_over(999_999_999, 100)  # one write to Redis does not end every start
    mark = RunFinishedMark(RunStore(str(tmp_path)), "default")
    assert mark.steps() is None
    mark.write(100, by="b0")
    assert mark.steps() == 100
    (tmp_path / "default" / "finished.json").write_text("{not json")
    assert mark.steps() is None  # unreadable: not finished, rather than a crash
    with EmbeddedRedis() as server:
        membership = Membership(connect(server.url), run_id="default")
        assert membership.run_finished_steps() is None
        assert membership.mark_run_finished(100) and membership.run_finished_steps() == 100
        assert Membership(connect(server.url), run_id="other").run_finished_steps() is None


def test_a_worker_started_after_the_run_finished_exits_0_at_once(tmp_path):
    """Redis lost everything (a fresh server); the store still says the run finished."""
    RunFinishedMark(RunStore(str(tmp_path / "store")), "default").write(50, by="b0")
    with EmbeddedRedis() as server:
        code, output = run_command(
            ["worker", "--stage", "0", "--redis-url", server.url, "--name", "late", "--steps", "50",
             "--set", "run.log_format=json", "--set", f"store.url={tmp_path / 'store'}",
             "--set", f"paths.out_dir={tmp_path}"], command_env(), tmp_path / "late.log", timeout_s=120)
        assert code == 0, output[-3000:]
        assert '"run_already_finished"' in output and '"finished_steps": 50' in output
        assert "member_online" not in output and "train_progress" not in output
        assert Membership(connect(server.url), run_id="default").live_members(stage=None, states=None) == []

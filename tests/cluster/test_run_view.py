"""Pure parts of `up` and the coordinator: samples, run directories, rate limits, pooled spread."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import pytest

from coordinator.pull import RateLimiter
from noloco_rt.algo.diagnostics import pooled_spread
from noloco_rt.config import load_config
from noloco_rt.membership.records import MemberRecord, WorkerState
from workers.cluster.run_dir import MetricsLog, RunDirError, prepare_run_dir, read_metrics
from workers.cluster.run_view import WorkerRow, build_sample, headline, log_fields, render_table


@dataclass
class Proc:
    state: str
    restarts: int = 0


def record(name: str, stage: int, *, step: int, loss: float | None, beat: float, state=WorkerState.ONLINE):
    return MemberRecord(worker_id=f"id-{name}-{beat}", run_id="r", stage=stage, data_addr="tcp://x:1",
                        exchange_addr="tcp://x:2", state=state, heartbeat_time=beat, name=name, inner_step=step,
                        loss=loss, tokens_per_s=100.0, outer_matched=2, outer_local=1, retried=1)


def test_sample_takes_the_newest_record_per_name_and_keeps_figures_of_workers_that_left():
    names = {"s0-r0": 0, "s1-r0": 1}
    last_seen: dict = {}
    records = [record("s0-r0", 0, step=10, loss=None, beat=1.0), record("s0-r0", 0, step=20, loss=None, beat=2.0),
               record("s1-r0", 1, step=18, loss=3.5, beat=2.0)]
    sample = build_sample(now=110.0, started=100.0, steps=40, names_by_stage=names,
                          processes={"s0-r0": Proc("running"), "s1-r0": Proc("running", restarts=1)},
                          records=records, last_seen=last_seen, coordinator_status=None, coordinator_state="off",
                          redis_up=True)
    rows = {row.name: row for row in sample.workers}
    assert rows["s0-r0"].inner_step == 20 and rows["s1-r0"].loss == 3.5 and rows["s1-r0"].restarts == 1
    assert sample.progress == pytest.approx((20 + 18) / 80)
    assert sample.remaining_s == pytest.approx(10.0 * (1 - 38 / 80) / (38 / 80))
    # The last-stage worker finished and left the table: its last figures stay, its state is the supervisor's.
    later = build_sample(now=120.0, started=100.0, steps=40, names_by_stage=names,
                         processes={"s0-r0": Proc("running"), "s1-r0": Proc("finished")},
                         records=[record("s0-r0", 0, step=30, loss=None, beat=3.0)], last_seen=last_seen,
                         coordinator_status={"last_eval": {"val_loss": 2.5, "step": 25},
                                             "last_spread": {"spread": 1e-3}},
                         coordinator_state="ok", redis_up=False)
    rows = {row.name: row for row in later.workers}
    assert rows["s1-r0"].state == "finished" and rows["s1-r0"].inner_step == 18 and rows["s1-r0"].loss == 3.5
    assert later.val_loss == 2.5 and later.eval_step == 25 and later.spread == 1e-3 and later.redis == "unreachable"
    fields = log_fields(later)
    assert fields["min_step"] == 18 and fields["states"] == {"ONLINE": 1, "finished": 1}
    assert "val loss 2.500" in headline(later)
    assert render_table(later, title="t").row_count == 2
    assert later.to_json()["kind"] == "workers"


def test_progress_of_an_empty_or_finished_run():
    empty = build_sample(now=1.0, started=0.0, steps=10, names_by_stage={}, processes={}, records=[],
                         last_seen={}, coordinator_status=None, coordinator_state="off", redis_up=True)
    assert empty.progress == 0.0 and empty.remaining_s is None
    done = build_sample(now=5.0, started=0.0, steps=10, names_by_stage={"a": 0}, processes={"a": Proc("running")},
                        records=[record("a", 0, step=10, loss=1.0, beat=1.0)], last_seen={},
                        coordinator_status=None, coordinator_state="off", redis_up=True)
    assert done.progress == 1.0 and done.remaining_s == 0.0


def test_run_dir_is_reused_by_the_same_config_and_refused_for_another(tmp_path):
    cfg = load_config(None, environ={}, overrides=[{"pipeline": {"stages": "2"}}])
    out = tmp_path / "run"
    config_file = prepare_run_dir(out, cfg)
    assert config_file.read_text().count("[pipeline]") == 1 and (out / "logs").is_dir()
    assert prepare_run_dir(out, cfg) == config_file  # same config: resumed
    other = load_config(None, environ={}, overrides=[{"pipeline": {"stages": "2"}, "model": {"preset": "small"}}])
    with pytest.raises(RunDirError, match="model.preset: 'tiny' -> 'small'"):
        prepare_run_dir(out, other)


def test_metrics_log_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"kind": "workers", "n": 1})
    log.close()
    with path.open("a") as handle:
        handle.write('{"kind": "work')  # killed mid-write
    records = read_metrics(path)
    assert [r["n"] for r in records] == [1] and "time" in records[0]


def test_rate_limiter_spaces_acquisitions_evenly():
    now = [100.0]
    limiter = RateLimiter(4.0, clock=lambda: now[0])
    assert limiter.delay_s() == 0.0
    limiter.take()
    assert limiter.delay_s() == pytest.approx(0.25)
    now[0] += 0.1
    assert limiter.delay_s() == pytest.approx(0.15)
    now[0] += 10.0  # idle for long: no burst credit builds up
    limiter.take()
    assert limiter.delay_s() == pytest.approx(0.25)
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_rate_limiter_acquire_gives_up_when_stopped():
    import threading

    limiter = RateLimiter(0.01)  # one per 100 s
    limiter.take()
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert limiter.acquire(stop) is False
    assert time.monotonic() - started < 5.0


def test_pooled_spread_weights_stages_by_parameter_count():
    assert pooled_spread([1.0, 3.0], [1, 1]) == pytest.approx(math.sqrt(5.0))
    assert pooled_spread([2.0, 0.0], [3, 1]) == pytest.approx(math.sqrt(3.0))
    assert pooled_spread([], []) == 0.0


def test_a_running_worker_missing_from_the_table_is_leaving_if_it_was_online_else_starting():
    names = {"a": 0}
    last_seen: dict = {}
    build_sample(now=1.0, started=0.0, steps=10, names_by_stage=names, processes={"a": Proc("running")},
                 records=[record("a", 0, step=5, loss=None, beat=1.0)], last_seen=last_seen,
                 coordinator_status=None, coordinator_state="off", redis_up=True)
    gone = build_sample(now=2.0, started=0.0, steps=10, names_by_stage=names, processes={"a": Proc("running")},
                        records=[], last_seen=last_seen, coordinator_status=None, coordinator_state="off",
                        redis_up=True)
    assert gone.workers[0].state == "leaving" and gone.workers[0].inner_step == 5
    restarted = build_sample(now=3.0, started=0.0, steps=10, names_by_stage=names,
                             processes={"a": Proc("running", restarts=1)}, records=[], last_seen=last_seen,
                             coordinator_status=None, coordinator_state="off", redis_up=True)
    assert restarted.workers[0].state == "starting" and restarted.workers[0].restarts == 1


def test_run_dir_config_holds_no_secret_and_the_processes_get_them_by_environment(tmp_path):
    import zmq

    from workers.cluster.processes import child_env

    secret = zmq.curve_keypair()[1].decode()
    cfg = load_config(None, environ={}, overrides=[{
        "network": {"redis_url": "redis://:s3cret@10.0.0.1:6379/0", "curve_secret_key": secret},
        "store": {"url": "s3://key:st0re-pw@bucket/runs"}}])
    path = prepare_run_dir(tmp_path / "run", cfg)
    text = path.read_text()
    assert "s3cret" not in text and secret not in text and "st0re-pw" not in text and "[network]" in text
    env = child_env(cfg, cfg.network.redis_url)
    assert env["NOLOCO_NETWORK_CURVE_SECRET_KEY"] == secret and env["NOLOCO_STORE_URL"] == cfg.store.url
    assert load_config(path, environ=env).store.url == cfg.store.url  # a child's view: the real URL


def _row(name: str, stage: int, **fields) -> WorkerRow:
    return WorkerRow(name=name, stage=stage, state="ONLINE", inner_step=10, outer_step=2, **fields)


def test_outer_steps_are_counted_by_kind_per_stage_in_one_vocabulary():
    from noloco_rt.membership.progress import (
        OUTER_STEP_KINDS,
        outer_kinds_by_stage,
        outer_kinds_text,
    )

    rows = [_row("a", 0, outer_matched=3, outer_local=1), _row("b", 0, outer_matched=4),
            _row("c", 1, outer_failed=2, outer_dropped_late=1, outer_partial=1)]
    by_stage = outer_kinds_by_stage(rows)
    assert by_stage == {0: {"matched": 7, "partial": 0, "local": 1, "dropped_late": 0, "failed": 0},
                        1: {"matched": 0, "partial": 1, "local": 0, "dropped_late": 1, "failed": 2}}
    assert list(by_stage[0]) == list(OUTER_STEP_KINDS)
    assert outer_kinds_text(by_stage) == ("stage 0: 7 of 8 matched, 0 partial, 1 local, 0 dropped_late, 0 failed; "
                                          "stage 1: 0 of 4 matched, 1 partial, 0 local, 1 dropped_late, 2 failed")
    assert outer_kinds_text({}) == "no outer step yet"
    sample = build_sample(now=1.0, started=0.0, steps=10, names_by_stage={}, processes={}, records=[],
                          last_seen={}, coordinator_status=None, coordinator_state="off", redis_up=True)
    sample.workers = rows
    assert log_fields(sample)["outer_steps"]["1"]["failed"] == 2
    assert render_table(sample, title="t").columns[7].header == "matched/partial/local/late/failed"


def test_the_final_row_comes_from_every_incarnations_summary(tmp_path):
    from workers.cluster.run_outcome import final_row, incarnation_logs, worker_summaries

    logs = tmp_path / "logs"
    logs.mkdir()
    summary = {"event": "worker_summary", "inner_steps": 12, "outer_steps": 3, "retried": 1, "dropped": 0,
               "outer_kinds": {"matched": 2, "partial": 0, "local": 1, "dropped_late": 0, "failed": 0}}
    (logs / "w.0.log").write_text(json.dumps(summary) + "\n")
    (logs / "w.1.log").write_text('{"event": "train_progress"}\nnot json\n'
                                  + json.dumps({**summary, "inner_steps": 20, "outer_steps": 5, "dropped": 2,
                                                "outer_kinds": {"matched": 1, "failed": 1},
                                                "checkpoint": {"written": 1, "failed": {"ENOSPC": 2, "EIO": 1}}})
                                  + "\n")
    (logs / "w.10.log").write_text("")  # an incarnation killed before its summary
    (logs / "w.x.log").write_text(json.dumps(summary) + "\n")  # not an incarnation
    (logs / "w2.0.log").write_text(json.dumps(summary) + "\n")  # another worker
    paths = incarnation_logs(logs, "w")
    assert [p.name for p in paths] == ["w.0.log", "w.1.log", "w.10.log"]
    row = final_row(_row("w", 0, queue_depth=3, tokens_per_s=50.0), worker_summaries(paths))
    assert (row.inner_step, row.outer_step, row.retried, row.dropped) == (20, 5, 2, 2)  # counts summed
    assert (row.outer_matched, row.outer_local, row.outer_failed, row.queue_depth, row.tokens_per_s) == (3, 1, 1, 0, 0.0)
    assert row.checkpoint_failed == 3  # failed checkpoint writes of every kind and incarnation
    sample = build_sample(now=1.0, started=0.0, steps=10, names_by_stage={}, processes={}, records=[],
                          last_seen={}, coordinator_status=None, coordinator_state="off", redis_up=True)
    sample.workers = [row, _row("v", 0, checkpoint_failed=1)]
    assert log_fields(sample)["checkpoint_failed"] == 4
    table = render_table(sample, title="t")
    column = [c.header for c in table.columns].index("ckpt failed")
    assert list(table.columns[column].cells) == ["1", "3"]  # rows sorted by name: v, w
    untouched = _row("v", 0, outer_matched=4)
    assert final_row(untouched, []) == untouched
    # A pulled worker's inner step is its clock, as its heartbeat shows it: trained plus skipped.
    pulled = final_row(_row("w", 0), [{**summary, "inner_steps": 37, "skipped_steps": 3}])
    assert pulled.inner_step == 40


def test_up_warns_when_a_stage_of_several_replicas_matched_under_ninety_percent():
    from workers.cluster.run_outcome import matched_warning, outer_outcome

    by_stage = {0: {"matched": 9, "local": 1}, 1: {"matched": 8, "local": 2}, 2: {"local": 10}}
    reasons = {1: {"no_push": 1, "failed:RuntimeError": 1, "push_failed": 0}, 2: {"alone": 10}}
    warning = matched_warning(by_stage, reasons, {0: 2, 1: 2, 2: 1})
    # 90 % is enough; a stage of one replica has nobody to match with.
    assert warning is not None and warning.startswith("stage 1 matched 8 of 10 outer steps (80%, under 90%)")
    assert "stage 0" not in warning and "stage 2" not in warning
    assert "most often no_push (1)" in warning or "most often failed:RuntimeError (1)" in warning
    assert matched_warning({0: {"matched": 10}}, {}, {0: 2}) is None
    rows = [_row("a", 0, outer_matched=1, outer_failed=3), _row("b", 0, outer_matched=1, outer_failed=3)]
    summaries = {"a": [{"unmatched_reasons": {"failed:RuntimeError": 3}}],
                 "b": [{"unmatched_reasons": {"failed:RuntimeError": 3}}]}
    text, warning = outer_outcome(rows, summaries, {"a": 0, "b": 0})
    assert text == "stage 0: 2 of 8 matched, 0 partial, 0 local, 0 dropped_late, 6 failed"
    assert warning == "stage 0 matched 2 of 8 outer steps (25%, under 90%), most often failed:RuntimeError (6)"

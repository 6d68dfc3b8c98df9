"""The chaos driver's conclusions from logs, on hand-made records."""

from __future__ import annotations

from workers.cluster.chaos_report import (
    invariants,
    largest_progress_gap_s,
    loss_ratio_check,
    mean_kept,
    microbatch_accounting,
    not_rejoined,
    observed_counts,
    render,
    unexpected_exits,
)


def progress(second: float) -> dict:
    return {"event": "train_progress", "timestamp": f"2026-01-01T00:00:{second:06.3f}Z"}


def test_the_largest_gap_is_across_all_workers():
    logs = {("a", 0): [progress(1), progress(9)], ("b", 0): [progress(2), progress(4)], ("c", 0): []}
    assert largest_progress_gap_s(logs) == 5.0
    assert largest_progress_gap_s({}) == 0.0


def test_accounting_checks_graceful_exits_and_counts_killed_ones():
    summary = {"event": "worker_summary", "sent": 10, "microbatches": 8, "dropped": 2, "retried": 3}
    bad = {**summary, "dropped": 1}
    logs = {("s0-r0", 0): [summary], ("s0-r0", 1): [{"event": "member_online"}], ("s0-r1", 0): [bad],
            ("s1-r0", 0): [bad]}
    result = microbatch_accounting(logs, ["s0-r0", "s0-r1"])
    assert (result.graceful, result.killed, result.sent, result.trained, result.retried) == (2, 1, 20, 16, 6)
    assert result.mismatches == ["s0-r1.0: sent 10 != trained 8 + dropped 1"]


def test_rejoin_needs_online_and_state():
    logs = {("a", 0): [], ("a", 1): [{"event": "member_online"}, {"event": "resumed_checkpoint"}],
            ("b", 1): [{"event": "member_online"}], ("c", 2): [{"event": "bootstrapped"}]}
    assert not_rejoined(logs) == ["b.1", "c.2"]


def test_a_restart_from_the_seed_counts_only_before_the_stage_s_first_outer_step():
    # Killed 2 s in, before any checkpoint or snapshot existed: the seed is the stage's state.
    logs = {("a", 0): [{"event": "outer_step_done", "stage": 0, "timestamp": "2026-01-01T00:00:10.000Z"}],
            ("a", 1): [{"event": "first_of_stage", "stage": 0, "timestamp": "2026-01-01T00:00:04.000Z"},
                       {"event": "member_online"}],
            ("b", 1): [{"event": "first_of_stage", "stage": 0, "timestamp": "2026-01-01T00:00:12.000Z"},
                       {"event": "member_online"}],
            ("c", 1): [{"event": "first_of_stage", "stage": 1, "timestamp": "2026-01-01T00:00:12.000Z"},
                       {"event": "member_online"}]}
    assert not_rejoined(logs) == ["b.1"]  # b lost the stage's trained state; c's stage had none yet
    # Its peers' records still said outer step 0 (a heartbeat behind the log): the seed, pulled
    # along at its first outer step. Past RECORD_LAG_S that is no longer a record's lag.
    seeded_beside = [{"event": "stage_at_seed", "stage": 0, "timestamp": "2026-01-01T00:00:11.000Z"},
                     {"event": "first_of_stage", "stage": 0, "timestamp": "2026-01-01T00:00:11.000Z"},
                     {"event": "member_online"}]
    late = [{**e, "timestamp": "2026-01-01T00:00:16.000Z"} if "timestamp" in e else e for e in seeded_beside]
    assert not_rejoined({**logs, ("b", 1): seeded_beside, ("d", 1): late}) == ["d.1"]


def test_a_replacement_that_finds_the_run_finished_came_back():
    # Preempted near the end: its replacement starts after the last stage finished, logs
    # run_already_finished and exits 0. Nothing was left to rejoin; the fault had its effect.
    logs = {("a", 0): [{"event": "member_online"}, {"event": "leaving"}],
            ("a", 1): [{"event": "run_already_finished"}], ("b", 1): []}
    assert not_rejoined(logs) == ["b.1"]
    exits = [{"name": "a", "incarnation": 0, "returncode": 0}, {"name": "a", "incarnation": 1, "returncode": 0}]
    injected = [{"kind": "sigterm", "target": "a", "incarnation": 0}]
    assert observed_counts(injected, logs, exits)["sigterm"] == 1


def test_exits_and_loss_ratio():
    exits = [{"name": "a", "incarnation": 0, "returncode": -9}, {"name": "b", "incarnation": 0, "returncode": 1},
             {"name": "c", "incarnation": 0, "returncode": 0}]
    assert unexpected_exits(exits, {("a", 0)}) == ["b.0 exited with 1"]
    assert loss_ratio_check(2.1, 2.0) == (1.05, True)
    # At most 10 % worse; lower is no fault (a faulty phase trains further past --steps).
    assert loss_ratio_check(1.7, 2.0) == (0.85, True)
    assert loss_ratio_check(2.2, 2.0)[1] and not loss_ratio_check(2.21, 2.0)[1]
    assert loss_ratio_check(2.5, 2.0) == (1.25, False)
    assert loss_ratio_check(None, 2.0) == (None, False)


def test_the_report_names_a_kind_that_never_fired():
    phase = {"injected": [{"kind": "sigkill"}], "skipped": [], "observed": {"sigkill": 1}, "elapsed_s": 30.0,
             "val_loss": 5.0, "not_injected": {"sigterm": "training ended before its turn at 20.0 s"}}
    report = {"faulty": phase, "kinds": ["sigkill", "sigterm"], "failed": [],
              "invariants": {"final_loss": {"ok": True, "ratio": 1.0, "detail": "-"}}}
    text = render(report)
    assert "not injected: sigterm (training ended before its turn at 20.0 s)" in text
    assert "not injected: sigkill" not in text


def at(second: float, **fields) -> dict:
    return {"timestamp": f"2026-01-01T00:00:{second:06.3f}Z", **fields}


def wall(second: float) -> float:
    from noloco_rt.logs import record_seconds

    return record_seconds(f"2026-01-01T00:00:{second:06.3f}Z")


def test_the_mean_is_checked_over_complete_rounds_only():
    def done(worker: str, group: list[str], c: float, step: int = 3, used: list[str] | None = None) -> dict:
        return {"event": "outer_step_done", "worker": worker, "stage": 0, "outer_step": step, "group": group,
                "used": group if used is None else used, "correction_sum": c, "correction_abs": abs(c) + 1.0}

    logs = {("a", 0): [done("aaaaaaaa", ["bbbbbbbb"], 0.5), done("aaaaaaaa", ["cccccccc"], 0.7, step=4)],
            ("b", 0): [done("bbbbbbbb", ["aaaaaaaa"], -0.5)],
            # c's half of step 4 is missing (it died): incomplete, not judged
            ("d", 0): [done("dddddddd", ["eeeeeeee"], 0.2, step=5)], ("e", 0): [done("eeeeeeee", ["dddddddd"], 0.1,
                                                                                      step=5)]}
    # f used g's state, g declined f's (its push unacknowledged): one-sided, counted apart.
    logs[("f", 0)] = [done("ffffffff", ["gggggggg"], 0.4, step=6)]
    logs[("g", 0)] = [done("gggggggg", ["ffffffff"], 0.0, step=6, used=[])]
    result = mean_kept(logs)
    assert result["checked"] == 3
    assert result["broken"] == ["stage 0 outer step 5: Σc = 0.3 over 2"]
    assert result["one_sided"] == ["stage 0 outer step 6: Σc = 0.4 over 2"]


def test_a_one_sided_round_fails_the_mean_invariant_like_a_broken_one():
    """A lost acknowledgement is asked about (workers/outer/confirm.py): one left one-sided
    is the replicas' mean moved, not an excuse."""
    accounting = {"mismatches": [], "graceful": 2, "sent": 10, "trained": 10, "dropped": 0, "retried": 0, "killed": 0}
    phase = {"timed_out": False, "reached": {}, "largest_progress_gap_s": 1.0, "unexpected_exits": [],
             "not_rejoined": [], "accounting": accounting, "checkpoint_failures": [], "checkpoint_loads": 1,
             "val_loss": 2.0, "consensus_step": 10}
    verdicts = {}
    for name, kept in {"clean": {"checked": 4, "broken": [], "one_sided": []},
                       "one_sided": {"checked": 4, "broken": [], "one_sided": ["stage 0 outer step 6"]},
                       "broken": {"checked": 4, "broken": ["stage 0 outer step 5"], "one_sided": []}}.items():
        verdicts[name] = invariants({**phase, "mean_kept": kept}, 4, 30.0, None)["mean_kept"]["ok"]
    assert verdicts == {"clean": True, "one_sided": False, "broken": False}


def test_the_new_kinds_are_observed_from_their_evidence():
    logs = {("s0-r0", 0): [at(1, event="worker_started", worker="aaaaaaaa1"),
                           at(12, event="outer_step_done", used=["bbbbbbbb"]),
                           at(21, event="checkpoint_failed", kind="ENOSPC"), at(26, event="checkpoint_written")],
            ("s0-r1", 0): [at(1, event="worker_started", worker="bbbbbbbb1"), at(31, event="member_reregistered")]}
    injected = [
        {"kind": "partition", "target": "network", "wall": wall(5), "resumed_wall": wall(10),
         "sides": [["s0-r0"], ["s0-r1"]], "redis_side": 0},  # a used b's state after the heal
        {"kind": "partition", "target": "network", "wall": wall(40), "resumed_wall": wall(45),
         "sides": [["s0-r0"], ["s0-r1"]], "redis_side": 0},  # nothing after this heal
        {"kind": "disk_full", "target": "disk", "wall": wall(20), "resumed_wall": wall(24)},
        {"kind": "disk_full", "target": "disk", "wall": wall(27), "resumed_wall": wall(29)},  # no write failed
        {"kind": "redis_flush", "target": "redis", "wall": wall(30)},
        {"kind": "coordinator_sigstop", "target": "coordinator", "status_after": True},
        {"kind": "coordinator_sigstop", "target": "coordinator", "status_after": False},
    ]
    counts = observed_counts(injected, logs, [])
    assert (counts["partition"], counts["disk_full"], counts["redis_flush"], counts["coordinator_sigstop"]) == \
        (1, 1, 1, 1)


def test_a_partition_leaves_every_stage_on_both_sides():
    import random

    from workers.cluster.chaos_faults import split_groups

    names = {f"s{k}-r{j}": k for k in range(3) for j in range(3)}
    for seed in range(50):
        a, b = split_groups(names, random.Random(seed))
        assert sorted(a + b) == sorted(names)
        assert {names[n] for n in a} == {names[n] for n in b} == {0, 1, 2}
    assert split_groups({"s0-r0": 0, "s0-r1": 0, "s1-r0": 1}, random.Random(0)) is None

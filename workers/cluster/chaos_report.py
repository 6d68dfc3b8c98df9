"""What `noloco-rt chaos` concludes from a run: worker logs plus what the driver did.

Pure functions over parsed records (no processes, no sockets), so the invariants are
tested on their own terms; workers/cluster/chaos_driver.py gathers the records and
workers/cluster/chaos.py prints the tables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noloco_rt.logs import read_json_lines, record_seconds
from workers.cluster.chaos_schedule import ALL_KINDS

LOG_NAME = re.compile(r"(?P<name>.+)\.(?P<incarnation>\d+)\.log")
LOSS_TOLERANCE = 0.10
"""Final validation loss at most this fraction above the fault-free baseline's. Lower is no
fault: a faulty phase trains on while the driver awaits its last restarts, so its replicas
end further past --steps than the baseline's (the detail shows both consensus steps)."""

Event = dict[str, Any]


def read_logs(log_dir: Path) -> dict[tuple[str, int], list[Event]]:
    """(worker name, incarnation) -> its structured log events."""
    found = {}
    for path in log_dir.glob("*.log"):
        match = LOG_NAME.fullmatch(path.name)
        if match:
            found[(match["name"], int(match["incarnation"]))] = read_json_lines(path)[0]
    return found


def event_time(record: Event) -> float | None:
    stamp = record.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return record_seconds(stamp)
    except ValueError:
        return None


def largest_progress_gap_s(logs: Mapping[tuple[str, int], Sequence[Event]]) -> float:
    """Largest gap between consecutive train_progress lines of all workers together: the
    longest time during which no worker of the run completed a logged inner step."""
    times = sorted(t for events in logs.values() for e in events
                   if e.get("event") == "train_progress" and (t := event_time(e)) is not None)
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


@dataclass
class Accounting:
    graceful: int = 0
    """Stage-0 incarnations that logged worker_summary (exited gracefully)."""
    sent: int = 0
    trained: int = 0
    dropped: int = 0
    retried: int = 0
    mismatches: list[str] = field(default_factory=list)
    killed: int = 0
    """Stage-0 incarnations with no summary (SIGKILLed): each lost at most B in flight."""


def injected_network_faults(logs: Mapping[tuple[str, int], Sequence[Event]]) -> dict[str, int]:
    """Data-path messages lost and delayed on purpose, over every incarnation that exited gracefully."""
    totals = {"lost": 0, "delayed": 0}
    for events in logs.values():
        summary = next((e for e in reversed(events) if e.get("event") == "worker_summary"), None)
        if summary is not None:
            totals["lost"] += int(summary.get("injected_lost", 0))
            totals["delayed"] += int(summary.get("injected_delayed", 0))
    return totals


def microbatch_accounting(logs: Mapping[tuple[str, int], Sequence[Event]], first_stage: Iterable[str]) -> Accounting:
    """For every stage-0 incarnation that exited gracefully: sent == trained + dropped."""
    names = set(first_stage)
    result = Accounting()
    for (name, incarnation), events in sorted(logs.items()):
        if name not in names:
            continue
        summary = next((e for e in reversed(events) if e.get("event") == "worker_summary"), None)
        if summary is None:
            result.killed += 1
            continue
        sent, trained, dropped = (int(summary.get(k, 0)) for k in ("sent", "microbatches", "dropped"))
        result.graceful += 1
        result.sent += sent
        result.trained += trained
        result.dropped += dropped
        result.retried += int(summary.get("retried", 0))
        if sent != trained + dropped:
            result.mismatches.append(f"{name}.{incarnation}: sent {sent} != trained {trained} + dropped {dropped}")
    return result


FOUND_RUN_FINISHED = "run_already_finished"
"""What a worker logs when it starts after the run's last stage finished: it exits 0 with
nothing to rejoin (a replacement that came up late), which is a correct way to come back."""


RECORD_LAG_S = 5.0
"""How far a worker's record in Redis may trail its log: the outer step it finished shows at
its next heartbeat (1 s by default), and a heartbeat can be late on a loaded machine."""


def not_rejoined(logs: Mapping[tuple[str, int], Sequence[Event]]) -> list[str]:
    """Restarted incarnations (>= 1) that did not log member_online and a state they took:
    bootstrapped, resumed_checkpoint, or first_of_stage while its stage had taken no outer
    step yet (killed before its first checkpoint, a worker restarts from the run seed, which
    is then still every replica's φ). One that took the seed because its live peers' records
    said outer step 0 (stage_at_seed) may do so up to RECORD_LAG_S after the stage's first
    outer step. One that found the run finished had nothing to rejoin."""
    first_outer_step: dict[Any, float] = {}
    for events in logs.values():
        for e in events:
            if e.get("event") == "outer_step_done" and (t := event_time(e)) is not None:
                first_outer_step[e.get("stage")] = min(first_outer_step.get(e.get("stage"), t), t)
    missing = []
    for (name, incarnation), events in sorted(logs.items()):
        if incarnation < 1:
            continue
        kinds = {e.get("event") for e in events}
        if FOUND_RUN_FINISHED in kinds:
            continue
        lag = RECORD_LAG_S if "stage_at_seed" in kinds else 0.0
        from_seed = any(e.get("event") == "first_of_stage" and (t := event_time(e)) is not None
                        and t < first_outer_step.get(e.get("stage"), math.inf) + lag for e in events)
        if "member_online" not in kinds or not (kinds & {"bootstrapped", "resumed_checkpoint"} or from_seed):
            missing.append(f"{name}.{incarnation}")
    return missing


def observed_counts(injected: Sequence[Mapping[str, Any]], logs: Mapping[tuple[str, int], Sequence[Event]],
                    exits: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Per fault kind, how many injected faults had their expected effect, from the evidence:
    sigkill: that incarnation exited by SIGKILL and the next one came online (or found the
    run finished); sigterm: it logged `leaving`, exited 0 and the next one came back so; sigstop: the worker logged
    something after its SIGCONT; redis_restart and redis_flush: some worker re-registered after
    it; partition: after the heal, a worker used the state of one from the other side, or one
    of the side cut from Redis found it again (a short run may end before the sides pair);
    disk_full: a checkpoint write failed with ENOSPC while the disk was full and one succeeded
    after; coordinator_sigstop: the coordinator's /status answered after its SIGCONT."""
    online = {key for key, events in logs.items()
              if any(e.get("event") in ("member_online", FOUND_RUN_FINISHED) for e in events)}
    codes = {(e["name"], e["incarnation"]): e.get("returncode") for e in exits}
    counts = dict.fromkeys(ALL_KINDS, 0)
    names_of = worker_names_by_id(logs)
    for fault in injected:
        kind, name, incarnation = fault["kind"], fault["target"], fault.get("incarnation")
        if kind == "sigkill":
            hit = codes.get((name, incarnation)) == -9 and (name, incarnation + 1) in online
        elif kind == "sigterm":
            left = any(e.get("event") == "leaving" for e in logs.get((name, incarnation), []))
            hit = left and codes.get((name, incarnation)) == 0 and (name, incarnation + 1) in online
        elif kind == "sigstop":
            resumed_at = fault.get("resumed_wall")
            hit = resumed_at is not None and any((t := event_time(e)) is not None and t > resumed_at
                                                 for e in logs.get((name, incarnation), []))
        elif kind == "partition":
            hit = _paired_across(fault, logs, names_of)
        elif kind == "disk_full":
            hit = _disk_full_seen(fault, logs)
        elif kind == "coordinator_sigstop":
            hit = bool(fault.get("status_after"))
        else:  # redis_restart, redis_flush
            back_at = fault.get("resumed_wall", fault.get("wall") if kind == "redis_flush" else None)
            hit = back_at is not None and any(
                e.get("event") in ("member_reregistered", "redis_recovered") and (t := event_time(e)) is not None
                and t >= back_at for events in logs.values() for e in events)
        counts[kind] += int(hit)
    return counts


def worker_names_by_id(logs: Mapping[tuple[str, int], Sequence[Event]]) -> dict[str, str]:
    """The 8-character worker id (as outer_step_done's `used` names it) -> worker name."""
    return {str(e["worker"])[:8]: name for (name, _), events in logs.items() for e in events
            if e.get("event") == "worker_started" and e.get("worker")}


def _paired_across(fault: Mapping[str, Any], logs: Mapping[tuple[str, int], Sequence[Event]],
                   names_of: Mapping[str, str]) -> bool:
    healed_at, sides = fault.get("resumed_wall"), fault.get("sides")
    if healed_at is None or not sides:
        return False
    side_of = {name: index for index, side in enumerate(sides) for name in side}
    without_redis = 1 - int(fault.get("redis_side", 0))
    for (name, _), events in logs.items():
        for e in events:
            if (t := event_time(e)) is None or t < healed_at:
                continue
            if e.get("event") in ("redis_recovered", "member_reregistered") and side_of.get(name) == without_redis:
                return True
            if e.get("event") == "outer_step_done" and any(
                    side_of.get(names_of.get(u, "")) not in (None, side_of.get(name)) for u in e.get("used", [])):
                return True
    return False


def _disk_full_seen(fault: Mapping[str, Any], logs: Mapping[tuple[str, int], Sequence[Event]]) -> bool:
    full_at, freed_at = fault.get("wall"), fault.get("resumed_wall")
    if full_at is None or freed_at is None:
        return False
    events = [e for evs in logs.values() for e in evs if (t := event_time(e)) is not None and t >= full_at]
    failed = any(e.get("event") == "checkpoint_failed" and e.get("kind") == "ENOSPC"
                 and event_time(e) <= freed_at + 1.0 for e in events)
    return failed and any(e.get("event") == "checkpoint_written" and event_time(e) > freed_at for e in events)


def mean_kept(logs: Mapping[tuple[str, int], Sequence[Event]], *, tolerance: float = 1e-4) -> dict[str, Any]:
    """Σ c over each complete round: one whose every member (by its own group) logged it with the
    same group and applied a correction. NoLoCo keeps the replicas' mean there: Σ c = 0 up to
    float rounding (a round a member died in has no other half, and is not complete).

    A round where one member used a partner's state that the partner did not use back is
    one-sided, and counted apart: an acknowledgement lost after the push it acknowledges had
    arrived leaves the pusher unsure; it asks its partner what it decided
    (workers/outer/confirm.py), and only a partner unreachable for the whole window leaves
    the round one-sided (the pusher counts it `unconfirmed`)."""
    rounds: dict[tuple[Any, ...], list[Event]] = {}
    for (_, _), events in logs.items():
        for e in events:
            if e.get("event") != "outer_step_done" or "correction_sum" not in e or not e.get("worker"):
                continue
            members = frozenset([str(e["worker"])[:8], *e.get("group", [])])
            rounds.setdefault((e.get("stage"), e.get("outer_step"), members), []).append(e)
    checked, broken, one_sided = 0, [], []
    for (stage, outer_step, members), events in sorted(rounds.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if {str(e["worker"])[:8] for e in events} != set(members) or len(events) != len(members):
            continue
        checked += 1
        total = sum(e["correction_sum"] for e in events)
        where = f"stage {stage} outer step {outer_step}: Σc = {total:.3g} over {len(members)}"
        used = {str(e["worker"])[:8]: set(e.get("used", [])) for e in events}
        if any(a in used[b] and b not in used[a] for a in used for b in used if a != b):
            one_sided.append(where)
        elif abs(total) > tolerance * max(sum(e["correction_abs"] for e in events), 1e-12):
            broken.append(where)
    return {"checked": checked, "broken": broken, "one_sided": one_sided}


def unexpected_exits(exits: Sequence[Mapping[str, Any]], caused: set[tuple[str, int]]) -> list[str]:
    """Exits the driver did not cause. Exit 0 after the worker's own steps is a finish, not a fault."""
    return [f"{e['name']}.{e['incarnation']} exited with {e.get('returncode')}" for e in exits
            if (e["name"], e["incarnation"]) not in caused and e.get("returncode") != 0]


def loss_ratio_check(val_loss: float | None, baseline_loss: float | None) -> tuple[float | None, bool]:
    if val_loss is None or baseline_loss is None or baseline_loss <= 0:
        return None, False
    ratio = val_loss / baseline_loss
    return ratio, ratio <= 1.0 + LOSS_TOLERANCE


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def invariants(phase: Mapping[str, Any], max_inflight: int, stall_bound_s: float,
               baseline: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each invariant of a faulty phase: whether it held, and the evidence (`baseline`: the
    fault-free phase's val_loss and consensus_step, when there is one)."""
    accounting = phase["accounting"]
    baseline = baseline or {}
    baseline_loss = baseline.get("val_loss")
    ratio, loss_ok = loss_ratio_check(phase.get("val_loss"), baseline_loss)
    return {
        "finished": {"ok": not phase["timed_out"], "detail": f"every worker reached its steps: {phase['reached']}"},
        "no_stall": {"ok": phase["largest_progress_gap_s"] <= stall_bound_s,
                     "detail": f"largest gap {phase['largest_progress_gap_s']} s <= {stall_bound_s} s"},
        "no_unexpected_exit": {"ok": not phase["unexpected_exits"], "detail": phase["unexpected_exits"]},
        "restarted_rejoined": {"ok": not phase["not_rejoined"], "detail": phase["not_rejoined"]},
        "microbatch_accounting": {
            "ok": not accounting["mismatches"],
            "detail": (f"{accounting['graceful']} graceful stage-0 exits: sent {accounting['sent']} = trained "
                       f"{accounting['trained']} + dropped {accounting['dropped']} (retried "
                       f"{accounting['retried']}); {accounting['killed']} lost with a killed worker "
                       f"(<= {max_inflight} each); {accounting['mismatches']}")},
        "mean_kept": {"ok": not phase["mean_kept"]["broken"] and not phase["mean_kept"].get("one_sided"),
                      "detail": f"Σc = 0 and each pair used each other's state or neither, in every "
                                f"complete round: {phase['mean_kept']['checked']} complete rounds, "
                                f"{len(phase['mean_kept'].get('one_sided', []))} one-sided (an "
                                f"acknowledgement lost and never confirmed: "
                                f"{phase['mean_kept'].get('one_sided', [])[:3]}); broken: "
                                f"{phase['mean_kept']['broken'][:5]}"},
        "checkpoints_load": {"ok": not phase["checkpoint_failures"] and phase["checkpoint_loads"] > 0,
                             "detail": f"{phase['checkpoint_loads']} loads, failures {phase['checkpoint_failures']}"},
        "final_loss": {"ok": loss_ok, "ratio": ratio,
                       "detail": f"val loss {phase.get('val_loss')} at step {phase.get('consensus_step')} vs baseline "
                                 f"{baseline_loss} at step {baseline.get('consensus_step')} (at most "
                                 f"{1 + LOSS_TOLERANCE:.2f}x)"},
    }


def render(report: Mapping[str, Any]) -> str:
    """The report as the tables `noloco-rt chaos` prints."""
    phase = report["faulty"]
    kinds = report["kinds"]
    rows = [(kind, sum(f["kind"] == kind for f in phase["injected"]),
             sum(f["kind"] == kind for f in phase["skipped"]), phase["observed"].get(kind, 0)) for kind in kinds]
    faults = format_table(rows, ("fault", "injected", "skipped", "observed"))
    checks = format_table([(name, "ok" if c["ok"] else "FAILED", c["detail"])
                           for name, c in report["invariants"].items()], ("invariant", "result", "detail"))
    baseline = report.get("baseline") or {}
    ratio = report["invariants"]["final_loss"]["ratio"]
    lines = [faults, ""]
    lines += [f"not injected: {kind} ({why.lstrip('; ')})" for kind, why in phase.get("not_injected", {}).items()]
    lines += [checks, "",
             f"faulty run: {phase['elapsed_s']} s, val loss {phase.get('val_loss')}; baseline: "
             f"{baseline.get('elapsed_s')} s, val loss {baseline.get('val_loss')}; ratio "
             f"{'n/a' if ratio is None else f'{ratio:.3f}'}",
             "all invariants hold" if not report["failed"] else f"FAILED: {', '.join(report['failed'])}"]
    return "\n".join(lines)


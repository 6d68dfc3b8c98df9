"""A seeded fault schedule for the chaos driver (`noloco-rt chaos`): pure, no I/O.

Faults come one per slot, every `every_s` seconds from the time training starts. The
first slots cover every requested kind once (in a seeded order), so a short run still
sees each kind; later slots draw a kind at random, and a drawn kind that cannot be placed
yet is placed at the first slot where it can (every kind gets its share).

Placement rules (what `violations` checks):
- A worker fault occupies its target for a window: SIGSTOP for its hold, SIGKILL and
  SIGTERM for `recover_s` (restart + rejoin). A worker never has two windows at once.
- At least one worker per stage is outside every window at all times: a stage with no
  live replica stalls the whole pipeline, which is an outage, not a fault to survive.
- A fault of the whole cluster overlaps no other fault but the coordinator's: a Redis
  outage (its hold plus `recover_s` for workers to re-register; a worker restarted while
  Redis is down cannot join), a Redis that loses its data (`recover_s` to re-register), a
  network partition (its hold plus `recover_s` to pair again) and a full checkpoint disk
  (its hold). Each fault's effect should be observable on its own.
- The coordinator's SIGSTOP only never overlaps another of its own: training does not
  depend on the coordinator, so it may come at any time.
A slot whose kind cannot be placed is left empty; a kind from the first pass that could
not be placed is tried again at the next slot.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

WORKER_FAULTS = ("sigkill", "sigterm", "sigstop")
FAULT_KINDS = (*WORKER_FAULTS, "redis_restart")
"""The default kinds: processes and a Redis restart, which any machine can inject."""
CLUSTER_FAULTS = ("redis_restart", "redis_flush", "partition", "disk_full")
ALL_KINDS = (*WORKER_FAULTS, *CLUSTER_FAULTS, "coordinator_sigstop")
"""Also: FLUSHALL, a partition (network namespaces: root), a full checkpoint disk (a tmpfs:
root), the coordinator stopped."""
REDIS_TARGET = "redis"
MAX_OWED = 2
"""Drawn faults of one kind kept for a later slot, at most (a backlog would come in bursts)."""
TARGETS = {"redis_restart": REDIS_TARGET, "redis_flush": REDIS_TARGET, "partition": "network",
           "disk_full": "disk", "coordinator_sigstop": "coordinator"}
"""The target of each fault that is not a worker's."""
HELD = ("sigstop", "redis_restart", "partition", "disk_full", "coordinator_sigstop")
"""Kinds that last `hold_s` before they are undone."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Seconds after training started."""
    kind: str
    """One of FAULT_KINDS."""
    target: str
    """A worker name, or REDIS_TARGET."""
    hold_s: float = 0.0
    """How long a SIGSTOP, a Redis outage, a partition or a full disk lasts; 0 otherwise."""

    def window(self, recover_s: float) -> tuple[float, float]:
        """[start, end) during which the target counts as down (see the module's rules)."""
        if self.kind in ("sigstop", "disk_full", "coordinator_sigstop"):
            return self.at_s, self.at_s + self.hold_s
        if self.kind in ("redis_restart", "partition"):
            return self.at_s, self.at_s + self.hold_s + recover_s
        return self.at_s, self.at_s + recover_s

    @property
    def of_cluster(self) -> bool:
        return self.kind in CLUSTER_FAULTS

    def to_json(self) -> dict[str, object]:
        return {"at_s": self.at_s, "kind": self.kind, "target": self.target, "hold_s": self.hold_s}


def build_schedule(seed: int, duration_s: float, every_s: float, worker_names: Mapping[str, int],
                   kinds: Sequence[str] = FAULT_KINDS, *, hold_s: float = 3.0,
                   recover_s: float = 8.0) -> list[Fault]:
    """Faults at every_s, 2·every_s, ... < duration_s; worker_names maps name -> stage."""
    unknown = sorted(set(kinds) - set(ALL_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; expected {', '.join(ALL_KINDS)}")
    if every_s <= 0 or hold_s < 0 or recover_s < 0:
        raise ValueError(f"every_s = {every_s} must be > 0, hold_s = {hold_s} and recover_s = {recover_s} >= 0")
    if not kinds:
        return []
    rng = random.Random(seed)
    first_pass = list(dict.fromkeys(kinds))
    rng.shuffle(first_pass)
    names = sorted(worker_names)
    faults: list[Fault] = []
    owed: list[str] = []
    slot = 1
    while slot * every_s < duration_s:
        at_s = round(slot * every_s, 3)
        slot += 1
        # The first pass tries its kinds in order (the first that fits wins); later slots draw one,
        # or retry one drawn earlier that did not fit (owed): a kind whose windows exclude every
        # other fault (a partition) would otherwise get far fewer than its share.
        if first_pass:
            placed = next((p for kind in first_pass
                           if (p := _place(faults, at_s, kind, names, worker_names, hold_s, recover_s, rng))), None)
            if placed is not None:
                faults.append(placed)
                first_pass.remove(placed.kind)
            continue
        drawn = rng.choice(list(kinds))
        for index, kind in enumerate([*owed, drawn]):
            placed = _place(faults, at_s, kind, names, worker_names, hold_s, recover_s, rng)
            if placed is not None:
                faults.append(placed)
                if index < len(owed):
                    del owed[index]
                    if owed.count(drawn) < MAX_OWED:
                        owed.append(drawn)
                break
        else:
            if owed.count(drawn) < MAX_OWED:
                owed.append(drawn)
    return faults


def _place(faults: list[Fault], at_s: float, kind: str, names: list[str], worker_names: Mapping[str, int],
           hold_s: float, recover_s: float, rng: random.Random) -> Fault | None:
    hold = hold_s if kind in HELD else 0.0
    # Faults come in time order and the earlier ones keep the rules: only those whose windows
    # can still be open at at_s can conflict with the candidate (a soak places thousands).
    horizon = at_s - hold_s - recover_s
    recent: list[Fault] = []
    for fault in reversed(faults):
        if fault.at_s < horizon:
            break
        recent.append(fault)
    recent.reverse()
    if kind in TARGETS:
        candidate = Fault(at_s, kind, TARGETS[kind], hold)
        return None if violations([*recent, candidate], worker_names, recover_s) else candidate
    targets = [n for n in names if not violations([*recent, Fault(at_s, kind, n, hold)], worker_names, recover_s)]
    return Fault(at_s, kind, rng.choice(targets), hold) if targets else None


def violations(faults: Sequence[Fault], worker_names: Mapping[str, int], recover_s: float) -> list[str]:
    """Every broken placement rule, as a sentence (empty: the schedule is valid)."""
    found: list[str] = []
    replicas: dict[int, int] = {}
    for stage in worker_names.values():
        replicas[stage] = replicas.get(stage, 0) + 1
    worker_faults = [f for f in faults if f.kind in WORKER_FAULTS]
    for index, a in enumerate(faults):
        if a.kind in WORKER_FAULTS and a.target not in worker_names:
            found.append(f"{a.kind} at {a.at_s} s targets unknown worker {a.target!r}")
        a_start, a_end = a.window(recover_s)
        for b in faults[index + 1:]:
            b_start, b_end = b.window(recover_s)
            if not (a_start < b_end and b_start < a_end):
                continue
            if a.target == b.target:
                found.append(f"{a.target}: {a.kind} at {a.at_s} s overlaps {b.kind} at {b.at_s} s")
            elif "coordinator_sigstop" in (a.kind, b.kind):
                continue
            elif a.of_cluster or b.of_cluster:
                cluster, other = (a, b) if a.of_cluster else (b, a)
                what = "Redis outage" if cluster.kind == "redis_restart" else cluster.kind.replace("_", " ")
                found.append(f"{what} overlaps {other.kind} at {max(a.at_s, b.at_s)} s")
    # The number of down workers of a stage only rises at window starts: checking there suffices.
    for fault in worker_faults:
        start = fault.window(recover_s)[0]
        stage = worker_names.get(fault.target)
        down = {f.target for f in worker_faults if worker_names.get(f.target) == stage
                and f.window(recover_s)[0] <= start < f.window(recover_s)[1]}
        if stage is not None and len(down) >= replicas[stage]:
            found.append(f"stage {stage} has no live worker at {start} s ({', '.join(sorted(down))} down)")
    return found

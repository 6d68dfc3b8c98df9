"""The Redis membership table (docs/architecture.md §5): discovery only, never collectives.

Every worker incarnation has a hash with a TTL of a few heartbeats, and sits in its stage's
index (noloco_rt.membership.layout), so that reading one stage costs what that stage holds,
never a scan of the run. Two reads:

- `stage_view(k)`: the members of stage k as last published (addresses, state, key, a
  queue-depth hint), kept up to date from the stage's change log: what workers route and
  exchange on, read by a background refresher (noloco_rt.membership.refresher).
- `live_members(...)`: every field, fresh from each member's hash, for status and tools.

Readers keep their last view and use it while Redis is unreachable; a heartbeat that finds
its record gone (Redis restarted, TTL lapsed and pruned) registers again. A member whose
hash expired is pruned from its stage's index by the first reader that notices.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import redis

from noloco_rt.logs import get_logger
from noloco_rt.membership.high_water import StageHighWater
from noloco_rt.membership.layout import LOG_MAX_ENTRIES, TableKeys, run_id_of_key
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import ACCESS_ERRORS, REDIS_ERRORS
from noloco_rt.membership.stage_view import StageView

# A run's "stage finished" marks outlive any run of a day; after that Redis forgets them.
FINISHED_MARK_TTL_S = 24 * 3600
ONLINE_ONLY = frozenset({WorkerState.ONLINE})
VIEW_FIELDS = ("state", "data_addr", "exchange_addr", "public_key", "name", "metrics_addr", "stage")
"""Fields whose change is published to the stage's view at once (the rest: at most every hint_interval_s)."""


def table_settling_s(redis_uptime_s: float, ttl_s: float) -> float:
    """How long a Redis up for `redis_uptime_s` (whole seconds, rounded down) may still miss
    live members whose records live `ttl_s` (pure)."""
    return max(0.0, ttl_s + 1.0 - redis_uptime_s)  # +1: uptime is whole seconds


class Membership:
    def __init__(self, client: redis.Redis, *, run_id: str, prefix: str = "noloco", heartbeat_interval_s: float = 1.0,
                 ttl_s: float | None = None, hint_interval_s: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.run_id = run_id
        self.prefix = prefix
        self.keys = TableKeys(prefix, run_id)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.ttl_s = ttl_s if ttl_s is not None else 3 * heartbeat_interval_s
        self.hint_interval_s = hint_interval_s if hint_interval_s is not None else max(5.0, 5 * heartbeat_interval_s)
        """How often a changed queue depth is republished to the stage view: a slow routing hint."""
        self.clock = clock
        self.record: MemberRecord | None = None
        self._published: tuple[MemberRecord, float] | None = None
        self.redis_available = True
        self.outages = 0
        self._malformed_rows = 0
        self._views: dict[int, StageView] = {}
        self._cache: dict[int, list[MemberRecord]] = {}
        self._lock = threading.Lock()
        self.high_water = StageHighWater(client, self.keys)
        self._views_lock = threading.Lock()
        self.log = get_logger(run=run_id)

    def key(self, worker_id: str) -> str:
        return self.keys.worker(worker_id)

    @property
    def malformed_records(self) -> int:
        """Rows of the table that were not a well-formed member record (skipped, never raised)."""
        return self._malformed_rows + sum(view.malformed for view in list(self._views.values()))

    # -- "stage finished" marks (workers/finish.py) ---------------------------------------------

    def mark_stage_finished(self, stage: int) -> bool:
        """Say that a worker of `stage` finished its work, so the next stage knows that an
        upstream it never saw live (it restarted after they left) is done, not late."""
        try:
            self.client.set(self.keys.finished(stage), "1", ex=FINISHED_MARK_TTL_S)
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return False
        return True

    def stage_finished(self, stage: int) -> bool:
        """Whether a worker of `stage` finished since the stage last had a worker join."""
        try:
            return bool(self.client.exists(self.keys.finished(stage)))
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return False

    def mark_run_finished(self, steps: int) -> bool:
        """Say that the run's last stage finished `steps` (run.steps): a worker that starts
        later has nothing to train with and nobody downstream. False if Redis is unreachable."""
        try:
            self.client.set(self.keys.run_finished(), str(steps))
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return False
        return True

    def run_ids(self, *, limit: int = 100) -> list[str] | None:
        """The runs this Redis holds keys of (any run, not just ours), sorted; at most `limit`
        (a SCAN, never KEYS); None if Redis is unreachable."""
        found: set[str] = set()
        try:
            for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
                run_id = run_id_of_key(key, self.prefix)
                if run_id is not None:
                    found.add(run_id)
                if len(found) >= limit:
                    break
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return None
        return sorted(found)

    def run_finished_steps(self) -> int | None:
        """run.steps of the run's finish, if it finished; None if not (or Redis is unreachable)."""
        try:
            value = self.client.get(self.keys.run_finished())
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return None
        try:
            return int(value) if value is not None else None
        except ValueError:  # not ours: someone else wrote the key
            return None

    def settling_s(self) -> float:
        """Seconds until this Redis' table lists every live member again, when it (re)started
        less than a record's TTL ago (its data lost: members re-register at their next
        heartbeat); 0 otherwise or when Redis does not answer. Before that, an empty stage
        may only mean its members have not re-registered yet."""
        try:
            uptime_s = float(self.client.info("server")["uptime_in_seconds"])
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return 0.0
        return table_settling_s(uptime_s, self.ttl_s)

    def _mark(self, available: bool, error: Exception | None = None) -> None:
        if available and not self.redis_available:
            self.log.info("redis_recovered")
        elif not available and self.redis_available:
            self.outages += 1
            if isinstance(error, ACCESS_ERRORS):  # credentials rotated or ACL changed mid-run
                self.log.error("redis_access_denied", error=str(error), note="using the cached member view; "
                               "fix the credentials or ACL, the worker keeps retrying")
            else:
                self.log.warning("redis_unreachable", note="using the cached member view")
        self.redis_available = available

    # -- writing our own record -------------------------------------------------------------

    def _queue_publish(self, pipe: Any, record: MemberRecord) -> None:
        """Put `record` in its stage's view and log the change (no execute)."""
        pipe.hset(self.keys.members(record.stage), record.worker_id, record.to_json())
        pipe.xadd(self.keys.log(record.stage), {"id": record.worker_id}, maxlen=LOG_MAX_ENTRIES, approximate=True)
        pipe.sadd(self.keys.stages(), record.stage)

    def _queue_beat(self, pipe: Any, record: MemberRecord) -> None:
        key = self.key(record.worker_id)
        pipe.hset(key, mapping=record.to_fields())
        pipe.pexpire(key, int(self.ttl_s * 1000))
        pipe.zadd(self.keys.beats(record.stage), {record.worker_id: record.heartbeat_time})

    def queue_heartbeat(self, pipe: Any, record: MemberRecord, *, publish: bool) -> None:
        """One heartbeat's commands (no execute); the first two replies say whether our hash
        and our row of the stage view still exist. Batched by benchmarks/membership.py."""
        pipe.exists(self.key(record.worker_id))
        pipe.hexists(self.keys.members(record.stage), record.worker_id)
        self._queue_beat(pipe, record)
        if publish:
            self._queue_publish(pipe, record)
        # A bootstrapped joiner's counters are the stage's too; a finishing worker's last heartbeat
        # (LEAVING) carries the final outer step, which status shows.
        if record.state in (WorkerState.ONLINE, WorkerState.LEAVING):
            self.high_water.queue_raise(pipe, record.stage, record.outer_step)

    def register(self, record: MemberRecord) -> bool:
        """Publish our record; False if Redis is unreachable (the heartbeat retries)."""
        with self._lock:
            self.record = replace(record, heartbeat_time=self.clock())
            try:
                pipe = self.client.pipeline(transaction=True)
                self._queue_beat(pipe, self.record)
                self._queue_publish(pipe, self.record)
                # A stage with a new worker is training again: its old "finished" mark is stale.
                pipe.delete(self.keys.finished(record.stage))
                pipe.execute()
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            self._published = (self.record, self.record.heartbeat_time)
            self._mark(True)
            return True

    def _view_is_stale(self, record: MemberRecord) -> bool:
        if self._published is None:
            return True
        published, at = self._published
        if any(getattr(published, name) != getattr(record, name) for name in VIEW_FIELDS):
            return True
        return published.queue_depth != record.queue_depth and record.heartbeat_time - at >= self.hint_interval_s

    def heartbeat(self, **updates: Any) -> bool:
        """Refresh the TTL with the given field updates; re-register if our record vanished.
        O(1) Redis work; the stage view is rewritten only when what it shows changed.
        Never raises for Redis errors; returns whether Redis took it."""
        with self._lock:
            if self.record is None:
                return False
            self.record = replace(self.record, heartbeat_time=self.clock(), **updates)
            record = self.record
            publish = self._view_is_stale(record)
            try:
                pipe = self.client.pipeline(transaction=True)
                self.queue_heartbeat(pipe, record, publish=publish)
                existed, listed = pipe.execute()[:2]
                if not listed and not publish:  # pruned while we were away: be seen again
                    pipe = self.client.pipeline(transaction=True)
                    self._queue_publish(pipe, record)
                    pipe.execute()
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            self._published = (record, record.heartbeat_time) if publish or not listed else self._published
            was_down = not self.redis_available
            self._mark(True)
            if not existed or not listed:
                self.high_water.forget_sent()  # Redis may have lost the mark with our record
                self.log.info("member_reregistered", after_outage=was_down)
            return True

    def set_state(self, state: WorkerState) -> bool:
        return self.heartbeat(state=state)

    def leave(self) -> bool:
        """Remove our record at once (no waiting for the TTL)."""
        with self._lock:
            record, self.record = self.record, None
            self._published = None
            if record is None:
                return True
            try:
                self._remove(record.stage, [record.worker_id])
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            return True

    def _remove(self, stage: int, worker_ids: list[str]) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(*(self.key(w) for w in worker_ids))
        pipe.zrem(self.keys.beats(stage), *worker_ids)
        pipe.hdel(self.keys.members(stage), *worker_ids)
        for worker_id in worker_ids:
            pipe.xadd(self.keys.log(stage), {"id": worker_id}, maxlen=LOG_MAX_ENTRIES, approximate=True)
        pipe.execute()

    def _prune(self, stage: int, candidates: Iterable[str]) -> int:
        """Drop from the stage's index the candidates whose hash Redis expired (dead workers).
        The hash's TTL runs on Redis' clock, so a skewed worker clock never prunes the living."""
        candidates = list(candidates)
        if not candidates:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for worker_id in candidates:
            pipe.exists(self.key(worker_id))
        dead = [w for w, alive in zip(candidates, pipe.execute(), strict=True) if not alive]
        if dead:
            self._remove(stage, dead)
        return len(dead)

    # -- reading ----------------------------------------------------------------------------

    def stage_view(self, stage: int, states: frozenset[WorkerState] | set[WorkerState] | None = ONLINE_ONLY
                   ) -> list[MemberRecord]:
        """Members of `stage` as published (sorted by id; some states, or all with None),
        read from the stage's change log: cheap enough to call every second at 10,000 workers.
        While Redis is unreachable, the last view read."""
        with self._views_lock:
            view = self._views.setdefault(stage, StageView(self.keys, stage))
            try:
                stale = view.refresh(self.client, prune_before=self.clock() - self.ttl_s)
                if self._prune(stage, stale):
                    view.refresh(self.client, prune_before=float("-inf"))
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
            else:
                self._mark(True)
            members = view.members()
        return [r for r in members if states is None or r.state in states]

    def view_reads(self, stage: int) -> tuple[int, int]:
        """(whole reads, change-log reads) of `stage`'s view so far: what following it cost Redis."""
        with self._views_lock:
            view = self._views.get(stage)
            return (0, 0) if view is None else (view.full_reads, view.change_reads)

    def live_members(self, stage: int | None = None,
                     states: frozenset[WorkerState] | set[WorkerState] | None = ONLINE_ONLY, *,
                     exclude_id: str | None = None) -> list[MemberRecord]:
        """Members of this run (optionally one stage, some states, all but `exclude_id`) with
        every field fresh from their hashes, sorted by (stage, id). Costs the stages read, not
        the run. While Redis is unreachable, the last view read. Malformed rows are skipped
        and counted in `malformed_records`, never raised."""
        try:
            stages = [stage] if stage is not None else self._stages()
            by_stage = {k: self._read_stage(k) for k in stages}
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            by_stage = {k: v for k, v in self._cache.items() if stage is None or k == stage}
        else:
            self._mark(True)
            self._cache.update(by_stage)
        records = [r for k in sorted(by_stage) for r in by_stage[k]]
        return [r for r in records if (states is None or r.state in states) and r.worker_id != exclude_id]

    def stages(self) -> list[int]:
        """The stages of this run that ever had a member ([] if Redis is unreachable)."""
        try:
            return self._stages()
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return []

    def _stages(self) -> list[int]:
        stages = []
        for raw in self.client.smembers(self.keys.stages()):
            try:
                stages.append(int(raw))
            except ValueError:
                self._malformed_rows += 1
        return sorted(stages)

    def _read_stage(self, stage: int) -> list[MemberRecord]:
        ids = sorted(w.decode() if isinstance(w, bytes) else w for w in self.client.zrange(self.keys.beats(stage), 0, -1))
        pipe = self.client.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(self.key(worker_id))
        # raise_on_error=False: a foreign non-hash key at a member's place is one malformed row.
        rows = pipe.execute(raise_on_error=False)
        records, expired = [], []
        for worker_id, row in zip(ids, rows, strict=True):
            if not row:
                expired.append(worker_id)
                continue
            try:
                if isinstance(row, redis.ResponseError):
                    raise ValueError(str(row))
                record = MemberRecord.from_fields(row)
            except ValueError:
                self._malformed_rows += 1
                continue
            if record.worker_id == worker_id and record.stage == stage:
                records.append(record)
            else:
                self._malformed_rows += 1
        self._prune(stage, expired)
        return records

"""The Redis membership table (DESIGN §5): discovery only, never collectives.

One hash per worker incarnation at `<prefix>:<run>:worker:<uuid>` with a TTL of a few
heartbeats. Readers cache the last view and keep using it while Redis is unreachable;
a heartbeat that finds its key gone (Redis restarted, TTL lapsed) registers again.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse, urlunparse

import redis

from noloco_rt.config import ConfigError
from noloco_rt.logs import get_logger
from noloco_rt.membership.progress import WorkerProgress, progress_from_text, progress_to_text

# An AuthenticationError is a ConnectionError and NOPERM (an ACL change) a ResponseError: during a
# run both are handled like an outage (cached view, retries) but logged as access errors.
ACCESS_ERRORS = (redis.AuthenticationError, redis.exceptions.NoPermissionError)
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.NoPermissionError)
# A run's "stage finished" marks outlive any run of a day; after that Redis forgets them.
FINISHED_MARK_TTL_S = 24 * 3600


class RedisAccessError(ConfigError):
    """Redis refused our credentials or permissions: a configuration mistake, reported at startup."""


class WorkerState(enum.StrEnum):
    JOINING = "JOINING"
    ONLINE = "ONLINE"
    LEAVING = "LEAVING"


@dataclass(frozen=True)
class MemberRecord(WorkerProgress):
    """One worker incarnation in the table: where to reach it, its state, and its progress
    (the WorkerProgress fields, keyword-only, after these)."""

    worker_id: str
    run_id: str
    stage: int
    data_addr: str
    exchange_addr: str
    state: WorkerState
    public_key: str = ""
    heartbeat_time: float = 0.0
    name: str = ""
    metrics_addr: str = ""

    def to_fields(self) -> dict[str, str]:
        return {"worker_id": self.worker_id, "run_id": self.run_id, "stage": str(self.stage),
                "data_addr": self.data_addr, "exchange_addr": self.exchange_addr, "state": self.state.value,
                "public_key": self.public_key, "heartbeat_time": repr(self.heartbeat_time),
                "name": self.name, "metrics_addr": self.metrics_addr, **progress_to_text(self)}

    @classmethod
    def from_fields(cls, fields: dict[Any, Any]) -> MemberRecord:
        """Strict parse; raises ValueError on anything malformed."""
        text = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
                for k, v in fields.items()}
        try:
            return cls(worker_id=text["worker_id"], run_id=text["run_id"], stage=int(text["stage"]),
                       data_addr=text["data_addr"], exchange_addr=text["exchange_addr"],
                       state=WorkerState(text["state"]), public_key=text.get("public_key", ""),
                       heartbeat_time=float(text["heartbeat_time"]),
                       name=text.get("name", ""), metrics_addr=text.get("metrics_addr", ""),
                       **progress_from_text(text))
        except KeyError as exc:
            raise ValueError(f"missing field {exc}") from None


def connect(url: str, *, socket_timeout_s: float = 1.0) -> redis.Redis:
    """A client for redis://, rediss:// (TLS) or unix:// URLs, passwords included, with short timeouts
    so a dead Redis never stalls training for long."""
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis URL must start with redis://, rediss:// or unix://, got {url!r}")
    return redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
                                health_check_interval=0)


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***, for messages and logs."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    user = parsed.username or ""
    host = parsed.hostname or ""
    port = f":{parsed.port}" if parsed.port else ""
    return urlunparse(parsed._replace(netloc=f"{user}:***@{host}{port}"))


def check_access(client: redis.Redis, url: str, *, key_prefix: str = "noloco") -> bool:
    """At startup: raise RedisAccessError (one clear line, exit 2 from the CLI) when Redis refuses
    our password, user or key permissions; True if reachable, False if merely unreachable (the
    caller decides whether to wait for it, as workers do)."""
    try:
        client.ping()
        # ACL users may be limited to some keys (~noloco:*): probe the commands the table uses.
        probe = f"{key_prefix}:access-check"
        client.exists(probe)
        client.scan(match=f"{key_prefix}:*", count=1)
    except ACCESS_ERRORS as exc:
        raise RedisAccessError("network.redis_url", redact_url(url),
                               f"Redis refused access ({exc}); check the user and password in the URL "
                               f"and the user's ACL (it needs ~{key_prefix}:*)") from None
    except redis.ResponseError as exc:
        if "AUTH" in str(exc).upper():  # e.g. a password sent to a server that has none
            raise RedisAccessError("network.redis_url", redact_url(url), f"Redis refused AUTH ({exc})") from None
        raise
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    return True


class Membership:
    def __init__(self, client: redis.Redis, *, run_id: str, prefix: str = "noloco", heartbeat_interval_s: float = 1.0,
                 ttl_s: float | None = None, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.run_id = run_id
        self.prefix = prefix
        self.heartbeat_interval_s = heartbeat_interval_s
        self.ttl_s = ttl_s if ttl_s is not None else 3 * heartbeat_interval_s
        self.clock = clock
        self.record: MemberRecord | None = None
        self.redis_available = True
        self.outages = 0
        self.malformed_records = 0
        self._cache: list[MemberRecord] = []
        self._lock = threading.Lock()
        self.log = get_logger(run=run_id)

    def key(self, worker_id: str) -> str:
        return f"{self.prefix}:{self.run_id}:worker:{worker_id}"

    def _pattern(self) -> str:
        return f"{self.prefix}:{self.run_id}:worker:*"

    def _finished_key(self, stage: int) -> str:
        return f"{self.prefix}:{self.run_id}:finished:{stage}"

    def mark_stage_finished(self, stage: int) -> bool:
        """Say that a worker of `stage` finished its work, so the next stage knows that an
        upstream it never saw live (it restarted after they left) is done, not late."""
        try:
            self.client.set(self._finished_key(stage), "1", ex=FINISHED_MARK_TTL_S)
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return False
        return True

    def stage_finished(self, stage: int) -> bool:
        """Whether a worker of `stage` finished since the stage last had a worker join."""
        try:
            return bool(self.client.exists(self._finished_key(stage)))
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            return False

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

    def _write(self, record: MemberRecord) -> None:
        key = self.key(record.worker_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=record.to_fields())
        pipe.pexpire(key, int(self.ttl_s * 1000))
        pipe.execute()

    def register(self, record: MemberRecord) -> bool:
        """Publish our record; False if Redis is unreachable (the heartbeat retries)."""
        with self._lock:
            self.record = replace(record, heartbeat_time=self.clock())
            try:
                self._write(self.record)
                # A stage with a new worker is training again: its old "finished" mark is stale.
                self.client.delete(self._finished_key(record.stage))
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            self._mark(True)
            return True

    def heartbeat(self, **updates: Any) -> bool:
        """Refresh the TTL with the given field updates; re-register if our key vanished.
        Never raises for Redis errors; returns whether Redis took it."""
        with self._lock:
            if self.record is None:
                return False
            self.record = replace(self.record, heartbeat_time=self.clock(), **updates)
            record = self.record
            try:
                key = self.key(record.worker_id)
                pipe = self.client.pipeline(transaction=True)
                pipe.exists(key)
                pipe.hset(key, mapping=record.to_fields())
                pipe.pexpire(key, int(self.ttl_s * 1000))
                existed, _, _ = pipe.execute()
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            was_down = not self.redis_available
            self._mark(True)
            if not existed:
                self.log.info("member_reregistered", after_outage=was_down)
            return True

    def set_state(self, state: WorkerState) -> bool:
        return self.heartbeat(state=state)

    def leave(self) -> bool:
        """Remove our record at once (no waiting for the TTL)."""
        with self._lock:
            record, self.record = self.record, None
            if record is None:
                return True
            try:
                self.client.delete(self.key(record.worker_id))
            except REDIS_ERRORS as exc:
                self._mark(False, exc)
                return False
            return True

    def live_members(self, stage: int | None = None,
                     states: set[WorkerState] | None = frozenset({WorkerState.ONLINE}), *,
                     exclude_id: str | None = None) -> list[MemberRecord]:
        """Members of this run (optionally one stage, some states, all but `exclude_id`). While
        Redis is unreachable, the last view read successfully. Keys that are not a well-formed
        member hash are skipped and counted in `malformed_records`, never raised."""
        try:
            keys = list(self.client.scan_iter(match=self._pattern(), count=500))
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            # raise_on_error=False: a foreign non-hash key under our pattern (WRONGTYPE)
            # is one malformed row, not a failed read of the whole table.
            rows = pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            self._mark(False, exc)
            records = self._cache
        else:
            self._mark(True)
            records = []
            for row in rows:
                if isinstance(row, redis.ResponseError):
                    self.malformed_records += 1
                    continue
                if not row:
                    continue  # expired between SCAN and HGETALL
                try:
                    records.append(MemberRecord.from_fields(row))
                except ValueError:
                    self.malformed_records += 1
            self._cache = records
        return [r for r in records if (stage is None or r.stage == stage)
                and (states is None or r.state in states) and r.worker_id != exclude_id]


class HeartbeatThread:
    """Heartbeats from a daemon thread; Redis errors are absorbed so training never stops for them.

    When `leave_event` is set (a SIGTERM handler sets it) the thread deletes the record at
    once, whatever the training thread is busy with, and stops heartbeating.
    """

    TICK_S = 0.02

    def __init__(self, membership: Membership, updates: Callable[[], dict[str, Any]] | None = None, *,
                 leave_event: threading.Event | None = None) -> None:
        self.membership = membership
        self.updates = updates or dict
        self.leave_event = leave_event or threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.beats = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_beat = time.monotonic() + self.membership.heartbeat_interval_s
        while not self._stop.is_set():
            if self.leave_event.is_set():
                self.membership.leave()
                return
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.membership.heartbeat_interval_s
                try:
                    ok = self.membership.heartbeat(**self.updates())
                except Exception:  # noqa: BLE001 - the thread's last line of defence
                    # e.g. OOM or READONLY from Redis: a dead heartbeat thread would let the
                    # record expire while this worker keeps training, so log and beat again.
                    self.membership.log.exception("heartbeat_failed")
                    ok = False
                if ok:
                    self.beats += 1
                else:
                    self.failures += 1
            self._stop.wait(self.TICK_S)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

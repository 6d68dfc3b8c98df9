"""A simulated fleet: thousands of membership clients in one process, no training.

Each simulated worker heartbeats every heartbeat interval and checks the views of the
stages it talks to (its own and the next) every refresh interval, with the commands a real
worker sends (Membership.queue_heartbeat inside MULTI/EXEC, StageView.queue_check, HMGET of
the rows that changed since its previous check). Python's Redis client packs commands too
slowly to offer Redis the load of 10,000 workers from two cores, so the commands are
pre-encoded RESP written to a raw socket, one batch per tick, and the replies are skipped
up to a sentinel ECHO. A real StageView per stage follows each log and prunes the dead; a
simulated check uses the cursor its worker had one refresh interval ago, so it asks for,
and Redis sends, what a real worker's check would. Churn: a fraction of the fleet per
second is replaced, half by a graceful leave, half by a crash (its hash expires and a
reader prunes it).
"""

from __future__ import annotations

import bisect
import random
import select
import socket
import time
import uuid
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.stage_view import entry_order
from noloco_rt.membership.table import Membership

TICK_S = 0.05


def bulk(arg: bytes | str | int) -> bytes:
    data = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def resp(*args: bytes | str | int) -> bytes:
    """One command in the Redis protocol."""
    return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)


@dataclass
class FleetSpec:
    url: str
    run_id: str
    first: int
    count: int
    stages: int
    heartbeat_s: float
    refresh_s: float
    churn_per_s: float
    seed: int


@dataclass
class FleetCounts:
    heartbeats: int = 0
    checks: int = 0
    changed_reads: int = 0
    joins: int = 0
    leaves: int = 0
    crashes: int = 0
    late_ticks: int = 0
    ticks: int = 0
    max_tick_s: float = 0.0
    first_slow_tick_at: float | None = None
    """Seconds into the window of the first tick longer than a heartbeat interval."""


def member(run_id: str, index: int, stage: int, generation: int = 0) -> MemberRecord:
    return MemberRecord(worker_id=f"sim{index:06d}g{generation}", run_id=run_id, stage=stage,
                        data_addr=f"tcp://10.0.{index // 250}.{index % 250}:5555",
                        exchange_addr=f"tcp://10.0.{index // 250}.{index % 250}:5556",
                        state=WorkerState.ONLINE, name=f"sim-{index}", heartbeat_time=time.time())


class RawConnection:
    """A socket speaking RESP: write a batch, skip its replies up to a sentinel."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30.0)
        self.sock.setblocking(False)
        self.sentinel = uuid.uuid4().hex.encode()
        self.end = b"$%d\r\n%s\r\n" % (len(self.sentinel), self.sentinel)
        if parsed.password:
            self.roundtrip([resp("AUTH", parsed.password)])

    def roundtrip(self, commands: list[bytes]) -> None:
        """Send while reading: a large batch written whole before any reply is read can fill
        both directions' buffers and stall."""
        out = memoryview(b"".join(commands) + resp("ECHO", self.sentinel))
        tail, sent = b"", 0
        deadline = time.monotonic() + 120.0
        while not tail.endswith(self.end):
            if time.monotonic() > deadline:
                raise TimeoutError("redis did not answer a batch within 120 s")
            readable, writable, _ = select.select([self.sock], [self.sock] if sent < len(out) else [], [], 1.0)
            if writable:
                sent += self.sock.send(out[sent:sent + (1 << 20)])
            if readable:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("redis closed the connection")
                tail = (tail + chunk)[-len(self.end):]

class HeartbeatBytes:
    """A worker's heartbeat, pre-encoded but for its time."""

    def __init__(self, table: Membership, record: MemberRecord) -> None:
        fields = [x for k, v in record.to_fields().items() if k != "heartbeat_time" for x in (k, v)]
        key, wid = table.key(record.worker_id), record.worker_id
        self.head = (resp("MULTI") + resp("EXISTS", key) + resp("HEXISTS", table.keys.members(record.stage), wid))
        # HSET key <fields> heartbeat_time <now>: all but the last argument, encoded once.
        self.hset = b"*%d\r\n" % (len(fields) + 4) + b"".join(bulk(a) for a in ("HSET", key, *fields, "heartbeat_time"))
        self.tail = resp("PEXPIRE", key, int(table.ttl_s * 1000))
        self.zadd_key, self.wid = table.keys.beats(record.stage), wid

        self.zadd = b"*4\r\n" + bulk("ZADD") + bulk(self.zadd_key)
        self.end = bulk(self.wid) + resp("EXEC")

    def at(self, now: bytes) -> bytes:
        """The heartbeat at `now` (the time as text, fixed format)."""
        stamp = bulk(now)
        return self.head + self.hset + stamp + self.tail + self.zadd + stamp + self.end


class StageLog:
    """One stage's change log as the generator follows it: the entries, and our cursor over time."""

    def __init__(self, table: Membership, stage: int) -> None:
        self.table, self.stage = table, stage
        self.entries: list[tuple[tuple[int, int], str, str]] = []  # (order, entry id, worker id)
        self.cursors: list[tuple[float, str]] = []

    def follow(self, client, now: float) -> None:
        cursor = self.entries[-1][1] if self.entries else "0-0"
        for entry_id, fields in client.xrange(self.table.keys.log(self.stage), min=f"({cursor}"):
            entry = entry_id.decode()
            self.entries.append((entry_order(entry), entry, fields[b"id"].decode()))
        self.cursors.append((now, self.entries[-1][1] if self.entries else "0-0"))
        stale = client.zrangebyscore(self.table.keys.beats(self.stage), "-inf", time.time() - self.table.ttl_s,
                                     start=0, num=32)
        self.table._prune(self.stage, [s.decode() for s in stale])

    def cursor_at(self, when: float) -> str:
        """The cursor a worker whose previous check was at `when` holds."""
        i = bisect.bisect_right(self.cursors, (when, "~")) - 1
        return self.cursors[max(i, 0)][1] if self.cursors else "0-0"

    def changed_since(self, cursor: str) -> list[str]:
        i = bisect.bisect_right(self.entries, (entry_order(cursor), "~", "~"))
        return sorted({worker for _, _, worker in self.entries[i:]})

    def check(self, cursor: str, prune_before: float) -> list[bytes]:
        keys = self.table.keys
        commands = [resp("XRANGE", keys.log(self.stage), f"({cursor}", "+", "COUNT", 1000),
                    resp("XRANGE", keys.log(self.stage), "-", "+", "COUNT", 1),
                    resp("ZRANGEBYSCORE", keys.beats(self.stage), "-inf", f"{prune_before:.6f}", "LIMIT", 0, 32)]
        changed = self.changed_since(cursor)
        if changed:
            commands.append(resp("HMGET", keys.members(self.stage), *changed))
        return commands


@dataclass
class SimWorker:
    index: int
    record: MemberRecord
    beat: HeartbeatBytes
    watched: list[int]
    phase: float
    generation: int = 0


class Fleet:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.client = connect(spec.url, socket_timeout_s=30.0)
        self.raw = RawConnection(spec.url)
        self.table = Membership(self.client, run_id=spec.run_id, heartbeat_interval_s=spec.heartbeat_s)
        self.rng = random.Random(spec.seed)
        self.counts = FleetCounts()
        self.logs = [StageLog(self.table, stage) for stage in range(spec.stages)]
        # Sorted by phase, so the workers due in a tick are one or two slices (_due).
        self.workers = sorted((self._worker(i) for i in range(spec.first, spec.first + spec.count)),
                              key=lambda w: w.phase)
        self.phases = [w.phase for w in self.workers]

    def _worker(self, index: int, generation: int = 0, phase: float | None = None) -> SimWorker:
        stage = index % self.spec.stages
        record = member(self.spec.run_id, index, stage, generation)
        return SimWorker(index, record, HeartbeatBytes(self.table, record),
                         sorted({stage, min(stage + 1, self.spec.stages - 1)}),
                         self.rng.random() if phase is None else phase, generation)

    def register_all(self) -> None:
        for start in range(0, len(self.workers), 1000):
            pipe = self.client.pipeline(transaction=False)
            for worker in self.workers[start:start + 1000]:
                self.table._queue_beat(pipe, replace(worker.record, heartbeat_time=time.time()))
                self.table._queue_publish(pipe, worker.record)
            pipe.execute()

    def _due(self, last: float, now: float, period: float) -> list[SimWorker]:
        """Workers whose periodic event (at k·period + phase·period) falls in (last, now]."""
        n = len(self.workers)
        if now - last >= period:
            return list(self.workers)
        a, b = (last / period) % 1.0, (now / period) % 1.0
        lo, hi = bisect.bisect_right(self.phases, a), bisect.bisect_right(self.phases, b)
        return self.workers[lo:hi] if a <= b else self.workers[lo:n] + self.workers[:hi]

    def run(self, until: float, count_from: float, *, checks: bool = True) -> FleetCounts:
        last = time.monotonic()
        while (now := time.monotonic()) < until:
            counting = now >= count_from
            self._tick(last, now, counting, checks)
            last = now
            spare = TICK_S - (time.monotonic() - now)
            if counting:
                self.counts.ticks += 1
                self.counts.late_ticks += spare < 0
                took = time.monotonic() - now
                self.counts.max_tick_s = max(self.counts.max_tick_s, took)
                if took > self.spec.heartbeat_s and self.counts.first_slow_tick_at is None:
                    self.counts.first_slow_tick_at = now - count_from
            time.sleep(max(0.0, spare))
        return self.counts

    def _tick(self, last: float, now: float, counting: bool, checks: bool) -> None:
        wall = time.time()
        for log in self.logs:
            log.follow(self.client, now)
        stamp = f"{wall:.6f}".encode()
        # Heartbeats travel alone, before the checks: each real worker beats from its own
        # thread, so a slow batch of view reads must not let the simulated records expire.
        beats = [w.beat.at(stamp) for w in self._due(last, now, self.spec.heartbeat_s)]
        self.raw.roundtrip(beats)
        commands: list[bytes] = []
        checked = changed = 0
        if checks:
            # Workers whose previous check fell at the same cursor send the same bytes: encode once.
            encoded: dict[tuple[int, str], list[bytes]] = {}
            for worker in self._due(last, now, self.spec.refresh_s):
                for stage in worker.watched:
                    cursor = self.logs[stage].cursor_at(now - self.spec.refresh_s)
                    check = encoded.get((stage, cursor))
                    if check is None:
                        check = encoded[stage, cursor] = self.logs[stage].check(cursor, wall - self.table.ttl_s)
                    commands += check
                    checked += 1
                    changed += len(check) > 3
        self.raw.roundtrip(commands)
        self._churn(now - last)
        if counting:
            self.counts.heartbeats += len(beats)
            self.counts.checks += checked
            self.counts.changed_reads += changed

    def _churn(self, elapsed: float) -> None:
        expected = self.spec.churn_per_s * len(self.workers) * elapsed
        replaced = int(expected) + (self.rng.random() < expected - int(expected))
        for _ in range(replaced):
            slot = self.rng.randrange(len(self.workers))
            old = self.workers[slot]
            if self.rng.random() < 0.5:
                self.table._remove(old.record.stage, [old.record.worker_id])
                self.counts.leaves += 1
            else:
                self.counts.crashes += 1  # stops beating; its hash expires, a reader prunes it
            new = self._worker(old.index, old.generation + 1, old.phase)
            pipe = self.client.pipeline(transaction=True)
            self.table._queue_beat(pipe, replace(new.record, heartbeat_time=time.time()))
            self.table._queue_publish(pipe, new.record)
            pipe.execute()
            self.workers[slot] = new
            self.counts.joins += 1


def fleet_process(spec: FleetSpec, ready, go, result_queue, reads_done) -> None:
    """One generator process: register its share, signal ready, run, then keep the table
    alive (heartbeats only) while the main process times whole reads."""
    fleet = Fleet(spec)
    fleet.register_all()
    ready.put(spec.first)
    start, count_from, until, keep_beating_until = go.get()
    time.sleep(max(0.0, start - time.time()))
    offset = time.monotonic() - time.time()
    result_queue.put(fleet.run(until + offset, count_from + offset))
    while not reads_done.is_set() and time.time() < keep_beating_until:
        fleet.run(time.monotonic() + 1.0, float("inf"), checks=False)

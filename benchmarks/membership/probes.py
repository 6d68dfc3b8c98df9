"""What one real worker sees while the simulated fleet loads Redis: the latency of its
heartbeat and of its view read, how long a change takes to reach its refresher's view, a
joiner's first (whole) read, and the read of the table this design replaced."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import redis

from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.refresher import ViewRefresher
from noloco_rt.membership.stage_view import StageView
from noloco_rt.membership.table import Membership

PROBE_HZ = 20.0


@dataclass
class ProbeResult:
    heartbeat_ms: list[float] = field(default_factory=list)
    view_read_ms: list[float] = field(default_factory=list)
    change_seen_s: list[float] = field(default_factory=list)
    changes_missed: int = 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def probe_record(run_id: str, name: str, stage: int) -> MemberRecord:
    return MemberRecord(worker_id=name, run_id=run_id, stage=stage, data_addr="tcp://127.0.0.1:1",
                        exchange_addr="tcp://127.0.0.1:2", state=WorkerState.ONLINE, name=name)


def _latencies(url: str, run_id: str, heartbeat_s: float, until: float, result: ProbeResult) -> None:
    """A real worker of stage 0: heartbeats and reads of stage 1's view, timed, PROBE_HZ each."""
    table = Membership(connect(url, socket_timeout_s=10.0), run_id=run_id, heartbeat_interval_s=heartbeat_s)
    table.register(probe_record(run_id, "probe-latency", 0))
    table.stage_view(1)  # the first read is a joiner's whole read: timed separately
    while time.monotonic() < until:
        started = time.perf_counter()
        table.heartbeat()
        result.heartbeat_ms.append(1e3 * (time.perf_counter() - started))
        started = time.perf_counter()
        table.stage_view(1)
        result.view_read_ms.append(1e3 * (time.perf_counter() - started))
        time.sleep(1.0 / PROBE_HZ)
    table.leave()


def _propagation(url: str, run_id: str, refresh_s: float, until: float, result: ProbeResult) -> None:
    """A refresher at the fleet's interval; a marker joins stage 0 once a second and we time
    how long until the refresher's view holds it (the view's staleness as a worker lives it)."""
    views = ViewRefresher(Membership(connect(url, socket_timeout_s=10.0), run_id=run_id), {0}, interval_s=refresh_s)
    writer = Membership(connect(url, socket_timeout_s=10.0), run_id=run_id)
    views.start()
    try:
        marker = 0
        while time.monotonic() + refresh_s + 1.0 < until:
            name = f"probe-marker-{marker}"
            writer.register(probe_record(run_id, name, 0))
            joined = time.monotonic()
            while all(m.worker_id != name for m in views.view(0)):
                if time.monotonic() - joined > 10 * refresh_s + 5.0:
                    result.changes_missed += 1
                    break
                time.sleep(0.005)
            else:
                result.change_seen_s.append(time.monotonic() - joined)
            writer.leave()
            marker += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - joined)))
    finally:
        views.stop()


def run_probes(url: str, run_id: str, *, heartbeat_s: float, refresh_s: float, window_s: float) -> ProbeResult:
    result = ProbeResult()
    until = time.monotonic() + window_s
    threads = [threading.Thread(target=_latencies, args=(url, run_id, heartbeat_s, until, result), daemon=True),
               threading.Thread(target=_propagation, args=(url, run_id, refresh_s, until, result), daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(window_s + 60.0)
    return result


def joiner_read_ms(url: str, run_id: str, stage: int, repeats: int = 3) -> float:
    """Median time of a whole read of one stage (what a joiner, or a reader fallen off the log, pays)."""
    client = connect(url, socket_timeout_s=30.0)
    keys = Membership(client, run_id=run_id).keys
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        StageView(keys, stage).refresh(client, prune_before=float("-inf"))
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def legacy_read(client: redis.Redis, prefix: str, run_id: str, stage: int) -> list[MemberRecord]:
    """The read this design replaced, kept to measure against: SCAN every key of the run, HGETALL
    every member, filter by stage on the client."""
    keys = list(client.scan_iter(match=f"{prefix}:{run_id}:worker:*", count=500))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    records = []
    for row in pipe.execute(raise_on_error=False):
        try:
            records.append(MemberRecord.from_fields(row))
        except (ValueError, AttributeError):
            continue
    return sorted((r for r in records if r.stage == stage), key=lambda r: r.worker_id)


def legacy_read_ms(url: str, run_id: str, stage: int, *, budget_s: float = 10.0, repeats: int = 5) -> list[float]:
    client = connect(url, socket_timeout_s=60.0)
    times: list[float] = []
    deadline = time.monotonic() + budget_s
    while len(times) < repeats and time.monotonic() < deadline:
        started = time.perf_counter()
        legacy_read(client, "noloco", run_id, stage)
        times.append(1e3 * (time.perf_counter() - started))
    return times


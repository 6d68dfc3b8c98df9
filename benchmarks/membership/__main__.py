"""Membership at scale: a simulated fleet against one real redis-server on this machine.

    python -m benchmarks.membership [--fleets 100:4,1000:4,10000:4,2000:2,8000:8] \\
        [--heartbeat-s 1.0] [--refresh-s 0 (auto)] [--churn 0.001] [--window-s 15] \\
        [--out benchmarks/results/membership.md]

A fleet N:S is N workers over S stages, simulated by two generator processes
(benchmarks/membership/fleet.py) sending the commands real workers send at the configured
heartbeat and view-refresh rates, with a fraction of the fleet replaced every second.
Meanwhile one real worker (benchmarks/membership/probes.py) times its heartbeats and its
view reads, and a real refresher times how long a join takes to reach its view. Redis'
commands per second and CPU come from INFO over the measurement window. "before" is the
read this design replaced (SCAN of the run, HGETALL of every member), timed on the same
table; the last column is its ratio to the new view read (p50 against p50).

Targets (docs/architecture.md §5): 10,000 workers on one Redis, p99 view read under 10 ms, Redis below
one core, and a view read whose cost does not depend on the number of other stages
(compare 2000:2 with 8000:8: 1,000 workers per stage in both).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.membership.fleet import FleetCounts, FleetSpec, fleet_process
from benchmarks.membership.probes import joiner_read_ms, legacy_read_ms, percentile, run_probes
from benchmarks.table import emit, markdown_table
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.refresher import auto_refresh_interval_s

RUN = "bench"
GENERATORS = 2
WARMUP_S = 3.0
LEGACY_BUDGET_S = 10.0


def parse_fleets(text: str) -> list[tuple[int, int]]:
    fleets = []
    for item in text.split(","):
        workers, sep, stages = item.strip().partition(":")
        if not sep or not workers.isdigit() or not stages.isdigit() or int(workers) < 2 or int(stages) < 2:
            raise argparse.ArgumentTypeError(f"a fleet is WORKERS:STAGES (both >= 2), got {item!r}")
        fleets.append((int(workers), int(stages)))
    return fleets


@dataclass
class RedisUsage:
    commands_per_s: float
    cpu_cores: float


def redis_totals(client) -> tuple[float, int]:
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], client.info("stats")["total_commands_processed"]


def measure_fleet(workers: int, stages: int, args: argparse.Namespace) -> list[object]:
    refresh_s = args.refresh_s or auto_refresh_interval_s(workers)
    context = multiprocessing.get_context("spawn")
    with EmbeddedRedis() as server:
        ready, go, results, reads_done = context.Queue(), context.Queue(), context.Queue(), context.Event()
        share = workers // GENERATORS
        specs = [FleetSpec(url=server.url, run_id=RUN, first=g * share, stages=stages,
                           count=share if g < GENERATORS - 1 else workers - share * (GENERATORS - 1),
                           heartbeat_s=args.heartbeat_s, refresh_s=refresh_s, churn_per_s=args.churn, seed=g)
                 for g in range(GENERATORS)]
        processes = [context.Process(target=fleet_process, args=(spec, ready, go, results, reads_done),
                                     daemon=True)
                     for spec in specs]
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=600)
        start = time.time() + 2.0
        count_from, until = start + WARMUP_S, start + WARMUP_S + args.window_s
        for _ in processes:
            # The fleet goes on after the window while the whole reads below are timed.
            go.put((start, count_from, until, until + LEGACY_BUDGET_S + 10.0))
        client = connect(server.url, socket_timeout_s=30.0)
        time.sleep(max(0.0, count_from - time.time()))
        cpu0, commands0, t0 = *redis_totals(client), time.monotonic()
        probes = run_probes(server.url, RUN, heartbeat_s=args.heartbeat_s, refresh_s=refresh_s,
                            window_s=until - time.time())
        cpu1, commands1, t1 = *redis_totals(client), time.monotonic()
        joiner_ms = joiner_read_ms(server.url, RUN, stage=1)
        before = legacy_read_ms(server.url, RUN, stage=1, budget_s=LEGACY_BUDGET_S)
        reads_done.set()
        counts: list[FleetCounts] = [results.get(timeout=120) for _ in processes]
        print("  generators:", counts, flush=True)
        for process in processes:
            process.join(30)
    usage = RedisUsage((commands1 - commands0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0))
    return table_row(workers, stages, refresh_s, args, counts, usage, probes, joiner_ms, before)


def table_row(workers, stages, refresh_s, args, counts, usage, probes, joiner_ms, before) -> list[object]:
    window = args.window_s
    views_per_worker = (2 * (stages - 1) + 1) / stages  # the last stage watches only its own
    beats, checks = sum(c.heartbeats for c in counts), sum(c.checks for c in counts)
    late = sum(c.late_ticks for c in counts) / max(1, sum(c.ticks for c in counts))
    after_p50 = percentile(probes.view_read_ms, 0.5)
    before_text = f"{statistics.median(before):.1f}" if before else "n/a"
    ratio = f"{statistics.median(before) / after_p50:.0f}x" if before else "n/a"
    return [f"{workers:,}", stages, f"{refresh_s:g}",
            f"{workers / args.heartbeat_s:,.0f} / {beats / window:,.0f}",
            f"{workers * views_per_worker / refresh_s:,.0f} / {checks / window:,.0f}",
            f"{late:.0%}", f"{usage.commands_per_s:,.0f}", f"{usage.cpu_cores:.2f}",
            f"{percentile(probes.heartbeat_ms, 0.5):.2f} / {percentile(probes.heartbeat_ms, 0.99):.2f}",
            f"{after_p50:.2f} / {percentile(probes.view_read_ms, 0.99):.2f}",
            f"{joiner_ms:.1f}",
            f"{percentile(probes.change_seen_s, 0.5):.2f} / {percentile(probes.change_seen_s, 0.99):.2f}"
            + (f" ({probes.changes_missed} missed)" if probes.changes_missed else ""),
            before_text, ratio]


HEADER = ["workers", "stages", "refresh s", "heartbeats/s target / done", "view checks/s target / done",
          "late ticks", "Redis cmds/s", "Redis CPU cores", "heartbeat ms p50 / p99", "view read ms p50 / p99",
          "joiner whole read ms", "join seen after s p50 / p99", "before: read ms p50", "before / after"]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleets", type=parse_fleets, default=parse_fleets("100:4,1000:4,10000:4,2000:2,8000:8"))
    parser.add_argument("--heartbeat-s", type=float, default=1.0)
    parser.add_argument("--refresh-s", type=float, default=0.0, help="0: the workers' auto interval")
    parser.add_argument("--churn", type=float, default=0.001, help="fraction of the fleet replaced per second")
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.heartbeat_s <= 0 or args.refresh_s < 0 or not 0 <= args.churn < 1 or args.window_s < 5:
        parser.error("need --heartbeat-s > 0, --refresh-s >= 0, 0 <= --churn < 1, --window-s >= 5")
    rows = []
    for workers, stages in args.fleets:
        print(f"fleet {workers} workers x {stages} stages ...", flush=True)
        rows.append(measure_fleet(workers, stages, args))
    title = (f"Membership, one redis-server, {GENERATORS} generator processes, heartbeat {args.heartbeat_s:g} s, "
             f"churn {args.churn:g}/s, {args.window_s:g} s window")
    text = markdown_table(title, HEADER, rows)
    emit(text, args.out)
    return text


if __name__ == "__main__":
    main()

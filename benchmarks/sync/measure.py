"""Measure NoLoCo's pairwise outer exchange against gloo all-reduce over emulated WAN links.

    python -m benchmarks.sync.measure --out benchmarks/results [--quick]
    python -m benchmarks.sync.measure --out benchmarks/results --only-straggler \
        --straggler-size tiny --straggler-codec bf16-shuffle-zstd --straggler-worlds 8,4 \
        --straggler-rtt-ms 50 --straggler-compute-s 2 --repeats 3

For each link (tbf rate, relay delay) and each N, N processes (benchmarks/sync/node.py),
one per network namespace, time every (size, method) trial side by side; then a
straggler trial (one rank's compute 2x a nominal inner phase). Writes sync.md and
sync.json under --out, then the model's fit, extrapolation and plot (report.py).
Falls back to loopback (no shaping, no delay) if namespaces cannot be made.
--only-straggler runs only the straggler trials and merges their rows into an existing
<out>/sync.json (its old straggler rows replaced, every other row kept), then rewrites the
reports from the merged rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.sync.report import write_reports
from workers.faults import netns
from workers.faults.netns import LinkSpec

SIZES = ("tiny", "small", "synthetic100mb")
METHODS = ("noloco-shuffle-zstd", "noloco-bf16-shuffle-zstd", "noloco-int8-zstd", "allreduce")
GLOO_PORT = 29650



@contextlib.contextmanager
def namespaces_or_loopback(size: int) -> Iterator[bool]:
    """Hosts for `size` processes: True with network namespaces (a killed run's leftovers
    removed first, everything removed after), False where they cannot be made (loopback)."""
    netns.cleanup()
    try:
        try:
            netns.create(size)
            shaped = True
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            print(f"network namespaces unavailable ({exc}); falling back to loopback", flush=True)
            shaped = False
        yield shaped
    finally:
        netns.cleanup()

def sync_trials(sizes: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"kind": "sync", "size": size, "method": method} for size in sizes for method in METHODS]


def straggler_trials(size: str, compute_s: float, codec: str = "shuffle-zstd",
                     repeats: int = 1) -> list[dict[str, Any]]:
    # Two outer steps: the first (no compute) warms up and leaves every rank a published
    # snapshot; the second has everyone compute, rank 0 twice as long. Repeats alternate the
    # methods, so slow phases of a noisy machine hit all alike. noloco-overlap-*: the worker's
    # overlapped step (provisional local step, next inner phase at once).
    return [{"kind": "straggler", "size": size, "method": method, "outer_steps": 2, "compute_s": compute_s,
             "straggler_rank": 0, "straggler_factor": 2.0, "repeat": repeat}
            for repeat in range(repeats) for method in (f"noloco-{codec}", f"noloco-overlap-{codec}", "allreduce")]


def run_group(world: int, link: LinkSpec | None, trials: list[dict[str, Any]], timeout_s: float) -> list[dict]:
    """Run one set of `world` node processes over `link` (None: loopback); their records."""
    results_dir = Path(tempfile.mkdtemp(prefix="nls-results-"))
    ips = [netns.worker_ip(r) if link else "127.0.0.1" for r in range(world)]
    relay = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if link is not None:
            netns.shape(world, link)
            if link.delay_s > 0:
                relay = subprocess.Popen([*netns.hub_prefix(), sys.executable, "-m", "benchmarks.sync.relay",
                                          "--port", str(netns.RELAY_PORT), "--delay-s", str(link.delay_s)],
                                         stdout=subprocess.DEVNULL)
                time.sleep(1.0)
        for rank in range(world):
            plan = {"rank": rank, "world": world, "ips": ips, "init_method": f"tcp://{ips[0]}:{GLOO_PORT}",
                    "results_dir": str(results_dir), "trials": trials, "exchange_timeout_s": 120.0,
                    "start_margin_s": 0.3 + 4 * (link.delay_s if link else 0.0)}
            env_prefix = ["env", f"GLOO_SOCKET_IFNAME={netns.worker_ifname(rank) if link else 'lo'}"]
            prefix = netns.exec_prefix(rank) if link else []
            procs.append(subprocess.Popen([*prefix, *env_prefix, sys.executable, "-m", "benchmarks.sync.node",
                                           json.dumps(plan)]))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                raise RuntimeError(f"a node exited with {rc}")
        records = []
        for path in sorted(results_dir.glob("rank*.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines()]
        return records
    finally:
        for proc in [*procs, *([relay] if relay else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(results_dir, ignore_errors=True)


def summarise(records: list[dict], link_label: str) -> list[dict[str, Any]]:
    """One row per (trial, world): per-worker sync time, idle time behind the slowest."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record["step"] == record.get("outer_steps", 1):  # the timed step (straggler: the second)
            groups[(record["kind"], record["world"], record["size"], record["method"],
                    record["trial"])].append(record)
    rows = []
    for (kind, world, size, method, _), group in groups.items():
        elapsed = [r["elapsed_s"] for r in group]
        last_done = max(r["done"] for r in group)
        row = {"kind": kind, "link": link_label, "world": world, "size": size, "method": method,
               "mean_s": statistics.fmean(elapsed), "max_s": max(elapsed), "min_s": min(elapsed),
               "idle_mean_s": statistics.fmean(last_done - r["done"] for r in group),
               "raw_bytes": group[0]["raw_bytes"], "wire_bytes": statistics.fmean(r["wire_bytes"] for r in group),
               "peer_ok": sum(bool(r.get("peer_ok", True)) for r in group), "ranks": len(group),
               "encode_mean_s": statistics.fmean(r.get("encode_s", 0.0) for r in group)}
        if kind == "straggler":
            straggler = [r for r in group if r["rank"] == r["straggler_rank"]]
            # NoLoCo: the straggler's partners are the ranks whose exchange ended with it
            # (they asked it, or took its snapshot from their inbox); all-reduce has none.
            rest = [r for r in group if r["rank"] != r["straggler_rank"]]
            partners = [r for r in rest if r.get("peer") == f"rank{r['straggler_rank']}"]
            others = [r for r in rest if r not in partners]
            row["straggler_s"] = straggler[0]["elapsed_s"]
            row["straggler_peer"] = straggler[0].get("peer")
            row["partners_s"] = sorted(r["elapsed_s"] for r in partners)
            row["others_s"] = sorted(r["elapsed_s"] for r in others)
            row["non_straggler_mean_s"] = statistics.fmean(r["elapsed_s"] for r in rest)
            row["compute_s"] = group[0]["compute_s"]
            row["repeat"] = group[0].get("repeat", 0)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for sync.md, sync.json, sync.png")
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--quick", action="store_true", help="tiny and small only, one link")
    parser.add_argument("--straggler-compute-s", type=float, default=1.0, help="nominal inner-phase time")
    parser.add_argument("--only-straggler", action="store_true",
                        help="run only the straggler trials; merge them into <out>/sync.json")
    parser.add_argument("--straggler-size", default="small")
    parser.add_argument("--straggler-codec", default="shuffle-zstd")
    parser.add_argument("--straggler-worlds", default=None, help="default: the largest of --worlds")
    parser.add_argument("--straggler-rate-mbit", type=int, default=100)
    parser.add_argument("--straggler-rtt-ms", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=1, help="straggler trials per method")
    args = parser.parse_args()
    if args.only_straggler:
        run_straggler_only(args)
        return
    worlds = [int(w) for w in args.worlds.split(",")]
    links = [LinkSpec(100, 0.0), LinkSpec(1000, 0.0), LinkSpec(100, 0.025)]
    sizes_for = {LinkSpec(100, 0.0): SIZES, LinkSpec(1000, 0.0): SIZES, LinkSpec(100, 0.025): ("tiny", "small")}
    if args.quick:
        links, sizes_for = [LinkSpec(100, 0.0)], {LinkSpec(100, 0.0): ("tiny", "small")}
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    with namespaces_or_loopback(max(worlds)) as shaped:
        usable: list[LinkSpec | None] = list(links) if shaped else [None]
        for link in usable:
            label = link.label if link else "loopback (no shaping)"
            sizes = sizes_for[link] if link else SIZES
            for world in worlds:
                trials = sync_trials(sizes)
                if link == links[0] and world == max(worlds):
                    trials += straggler_trials(args.straggler_size, args.straggler_compute_s,
                                               args.straggler_codec, args.repeats)
                print(f"[{time.monotonic() - began:6.1f}s] {label}, N={world}: {len(trials)} trials", flush=True)
                rows += summarise(run_group(world, link, trials, timeout_s=600.0), label)
    wall_s = time.monotonic() - began
    if args.out is not None:  # raw rows first: report.py can be re-run on them alone
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sync.json").write_text(json.dumps({"wall_s": wall_s, "rows": rows}, indent=1))
    write_reports(rows, args.out, wall_s=wall_s)


def run_straggler_only(args: argparse.Namespace) -> None:
    """Straggler trials alone, merged into an existing sync.json (other rows untouched)."""
    worlds = [int(w) for w in (args.straggler_worlds or args.worlds).split(",")]
    worlds = worlds if args.straggler_worlds else [max(worlds)]
    link = LinkSpec(args.straggler_rate_mbit, args.straggler_rtt_ms / 2000)
    previous: dict[str, Any] = {}
    if args.out is not None and (args.out / "sync.json").exists():
        previous = json.loads((args.out / "sync.json").read_text())
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    with namespaces_or_loopback(max(worlds)) as shaped:
        usable: LinkSpec | None = link if shaped else None
        label = usable.label if usable else "loopback (no shaping)"
        for world in worlds:
            trials = straggler_trials(args.straggler_size, args.straggler_compute_s, args.straggler_codec,
                                      args.repeats)
            print(f"[{time.monotonic() - began:6.1f}s] {label}, N={world}: {len(trials)} straggler trials",
                  flush=True)
            rows += summarise(run_group(world, usable, trials, timeout_s=600.0), label)
    straggler_wall_s = time.monotonic() - began
    print(f"straggler trials took {straggler_wall_s:.0f} s", flush=True)
    merged = [r for r in previous.get("rows", []) if r["kind"] != "straggler"] + rows
    write_reports(merged, args.out, wall_s=previous.get("wall_s", straggler_wall_s),
                  extra={"straggler_wall_s": straggler_wall_s, "straggler_command": " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()

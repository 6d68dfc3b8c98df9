"""Distance ratios between honest replicas at their outer exchanges (real 2 × 2 run).

Starts a local cluster (redis-server, 2 stages × 2 workers), trains, and reads every
`peer_exchange_done` event's distance_ratios (noloco_rt.outer.peer_checks): the figures the
default of worker.max_peer_distance_ratio must clear with margin.

    .venv/bin/python -m benchmarks.peer_distance --steps 200 --h 50 [--out table.md]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from workers.cluster.local_cluster import LocalCluster


def measure(steps: int, h: int, gamma: float | None, tmp: Path) -> list[float]:
    settings: dict[str, object] = {"outer.h": h}
    if gamma is not None:
        settings["outer.gamma"] = gamma
    cluster = LocalCluster(tmp, settings=settings)
    try:
        first = [cluster.start_worker(0, f"a{r}", steps=steps) for r in range(2)]
        last = [cluster.start_worker(1, f"b{r}") for r in range(2)]
        for worker in first:
            cluster.wait_event(worker, "steps_done", timeout_s=60 + steps * 2.0)
        ratios = [r for w in first + last for e in w.events("peer_exchange_done")
                  for r in e.get("distance_ratios", {}).values()]
    finally:
        cluster.close()
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--h", type=int, default=50)
    parser.add_argument("--gamma", type=float, default=None, help="set != beta for slow+grad snapshots")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ratios = sorted(measure(args.steps, args.h, args.gamma, Path(tmp)))
    if not ratios:
        raise SystemExit("no peer exchange happened")
    table = ("| steps | h | gamma | exchanges×parts | min | median | max |\n|---|---|---|---|---|---|---|\n"
             f"| {args.steps} | {args.h} | {args.gamma} | {len(ratios)} | {ratios[0]:.4g} | "
             f"{ratios[len(ratios) // 2]:.4g} | {ratios[-1]:.4g} |")
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()

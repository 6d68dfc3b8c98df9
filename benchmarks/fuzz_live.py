"""Fuzz a live worker with many invalid messages and print what it counted (long version
of tests/cluster/test_fuzz_live.py).

    .venv/bin/python -m benchmarks.fuzz_live --count 10000 [--out table.md]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from workers.cluster.fuzz_live import fuzz, start_target
from workers.cluster.local_cluster import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp))
        try:
            target = start_target(cluster)
            report = fuzz(cluster, target, count=args.count, seed=args.seed)
            alive = target.process.poll() is None
        finally:
            cluster.close()
    lines = ["| reason | sent | counted |", "|---|---|---|"]
    for reason in sorted(set(report.sent) | set(report.counted)):
        lines.append(f"| {reason} | {report.sent.get(reason, 0)} | {report.counted.get(reason, 0):.0f} |")
    lines.append(f"| **total** | {sum(report.sent.values())} | {sum(report.counted.values()):.0f} |")
    lines += ["", f"data socket: {report.sent_data}, exchange socket: {report.sent_exchange} "
              f"(ERROR replies {report.error_replies}, missing {report.missing_replies}), "
              f"regenerated (predicted valid): {report.skipped_valid}",
              f"worker alive: {alive}; inner steps {report.inner_before} -> {report.inner_after_fuzz}; "
              f"VmRSS {report.rss_before_kb / 1024:.1f} MiB -> {report.rss_after_kb / 1024:.1f} MiB; "
              f"{report.seconds:.1f} s of sending"]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()

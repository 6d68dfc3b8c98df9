"""How long the training thread waits at outer steps in a real local run, per exchange mode.

    python -m benchmarks.outer_blocking [--replicas 4] [--steps 300] [--out benchmarks/results/outer_blocking.md]

Each variant is one `noloco-rt up --stages 2 --replicas R --steps N` (real processes,
embedded Redis, tiny preset) with its settings; from every worker's log: the seconds its
training thread spent in outer steps (worker_summary.outer_blocked_s) against its
training time (first to last train_progress), microbatch retries, and outer steps by
kind. The first variant is the baseline of the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.table import emit, markdown_table
from noloco_rt.logs import read_json_lines, record_seconds

VARIANTS: dict[str, list[str]] = {
    "blocking": ["outer.overlap=false"],
    "overlap": ["outer.overlap=true"],
    "overlap+ready": ["outer.overlap=true", "outer.pairing=ready"],
}


def worker_figures(log: Path) -> dict[str, Any] | None:
    """One worker's blocked seconds, training seconds, retries and outer-step kinds."""
    events, _ = read_json_lines(log)
    progress = [e for e in events if e.get("event") == "train_progress"]
    summary = next((e for e in reversed(events) if e.get("event") == "worker_summary"), None)
    if len(progress) < 2 or summary is None:
        return None
    return {"blocked_s": float(summary.get("outer_blocked_s", 0.0)),
            "train_s": record_seconds(progress[-1]["timestamp"]) - record_seconds(progress[0]["timestamp"]),
            "retried": int(summary.get("retried", 0)),
            "kinds": Counter(e["kind"] for e in events if e.get("event") == "outer_step_done")}


def run_variant(name: str, settings: list[str], *, replicas: int, steps: int, root: Path) -> dict[str, Any]:
    out = root / name
    args = [sys.executable, "-m", "noloco_rt.cli", "up", "--stages", "2", "--replicas", str(replicas),
            "--steps", str(steps), "--out", str(out), "--no-coordinator", "--set", "outer.h=25"]
    for setting in settings:
        args += ["--set", setting]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: `noloco-rt up` exited {done.returncode}:\n{done.stderr[-2000:]}")
    figures = [f for log in sorted((out / "logs").glob("*.log")) if (f := worker_figures(log)) is not None]
    kinds: Counter = sum((f["kinds"] for f in figures), Counter())
    blocked, train = sum(f["blocked_s"] for f in figures), sum(f["train_s"] for f in figures)
    return {"variant": name, "workers": len(figures), "blocked_share": blocked / train if train else 0.0,
            "retried": sum(f["retried"] for f in figures), "kinds": dict(kinds),
            "train_s_mean": train / len(figures) if figures else 0.0, "wall_s": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",")]
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="outer-blocking-") as tmp:
        for name in names:
            print(f"running {name} ...", flush=True)
            results.append(run_variant(name, VARIANTS[name], replicas=args.replicas, steps=args.steps, root=Path(tmp)))
    base = results[0]["train_s_mean"] or 1.0
    for r in results:
        total = sum(r["kinds"].values()) or 1
        rows.append([r["variant"], r["workers"], f"{100 * r['blocked_share']:.2f} %", r["retried"],
                     f"{r['kinds'].get('matched', 0) / total:.2f}", json.dumps(r["kinds"], sort_keys=True),
                     f"{r['train_s_mean']:.1f}", f"{r['train_s_mean'] / base:.3f}"])
    title = (f"Outer-step blocking, `noloco-rt up --stages 2 --replicas {args.replicas} --steps {args.steps}` "
             "(tiny, H = 25, no coordinator), per variant")
    emit(markdown_table(title, ["variant", "workers", "blocked share of training time", "microbatch retries",
                                "matched share", "outer steps by kind", "training s (mean per worker)",
                                "training s / first"], rows), args.out)


if __name__ == "__main__":
    main()

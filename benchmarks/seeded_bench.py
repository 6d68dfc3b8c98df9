"""What the convergence benchmark and the ablation runner share: the run-shape flags, the
seed list, and run-everything-then-write-the-report."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.seed_report import group_tables, plot_ppl_bands, report_json
from benchmarks.seed_stats import RunsBySeed, summarise
from benchmarks.sim_runs import SimJob, check_jobs, run_jobs


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; rejects non-integers, negatives and repeats."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_run_flags(parser: argparse.ArgumentParser, *, default_out: Path) -> None:
    """Flags that shape every run alike (they override the config file; --set comes after them)."""
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--microbatches", type=positive_int, default=1,
                        help="microbatches per inner step (pipeline.max_inflight): 1 for the figures in "
                             "benchmarks/README.md; 4 is what up and simulate train by default")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="inner warmup steps; default: the config file's (or the built-in default)")
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="e.g. 0,1,2 (run.seed)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field in every run (repeatable)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="simulations in parallel")


def run_flag_assignments(args: argparse.Namespace) -> list[str]:
    shape = [f"run.steps={args.steps}", f"pipeline.replicas={args.replicas}", f"pipeline.stages={args.stages}",
             f"model.preset={args.preset}", f"pipeline.max_inflight={args.microbatches}",
             f"run.eval_every={args.eval_every}",
             f"run.eval_batches={args.eval_batches}"]
    if args.warmup_steps is not None:
        shape.append(f"optim.warmup_steps={args.warmup_steps}")
    return shape + list(args.assignments)


def threads_per_job(parallel: int) -> int:
    """Share the cores among the parallel runs, at least one torch thread each."""
    return max(1, (os.cpu_count() or 1) // max(1, parallel))


def run_shape(args: argparse.Namespace) -> str:
    return (f"{args.stages} stages x {args.replicas} replicas, preset {args.preset}, {args.steps} inner steps, "
            f"seeds {','.join(map(str, args.seeds))}")


def check_jobs_or_exit(parser: argparse.ArgumentParser, jobs: Sequence[SimJob]) -> None:
    """Every config validates before anything runs, or the command exits naming the bad one."""
    try:
        check_jobs(jobs)
    except ValueError as exc:
        parser.error(str(exc))


def run_and_report(jobs: Sequence[SimJob], *, out: Path, stem: str, label_header: str,
                   baselines: Sequence[str], title: str, parallel: int) -> str:
    """Run every job (checked already: check_jobs_or_exit) and write OUT/{stem}.md, .json and .png; returns the
    markdown (also printed). Tables and plot panels follow the order of `jobs`."""
    print(f"{title}: {len(jobs)} simulations, {parallel} in parallel", flush=True)
    results = run_jobs(jobs, out / f"{stem}_runs", parallel=parallel)
    groups: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for result in results:
        groups.setdefault(result["group"], {}).setdefault(result["label"], {})[result["seed"]] = result
    sections: dict[str, tuple[list, dict[str, RunsBySeed]]] = {}
    texts = []
    for group, runs in groups.items():
        rows = summarise(runs, baselines)
        sections[group] = (rows, runs)
        texts.append(group_tables(f"{title}, {group}", label_header, runs, baselines, rows))
    text = "\n".join(texts)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(report_json(sections))
    plot_ppl_bands(groups, out / f"{stem}.png", title=title)
    return text

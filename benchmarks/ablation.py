"""Ablation runner: config variants over seeds in the simulator, compared with the first.

    python -m benchmarks.ablation --out benchmarks/results/ablation --steps 2000 --seeds 0,1,2 \\
        [--config configs/paper.toml] \\
        --variant base: \\
        --variant 'h25:--set outer.h=25' \\
        --variant fast:optim.lr=6e-3,optim.lr_min=6e-4

`--report-only` prints the tables of OUT/ablation.json again with today's columns.

A variant is NAME: followed by comma-separated SECTION.FIELD=VALUE assignments (an optional
leading `--set`; quote a variant that holds a space), applied over the config file, the
run-shape flags and every --set. Every (variant, seed) pair is one simulation, at most
--jobs at a time. The table (ratios against
the first variant, seed by seed), JSON and plot are written as OUT/ablation.{md,json,png},
each run's folder under OUT/ablation_runs/GROUP/VARIANT/seedN.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks import seeded_bench as bench
from benchmarks.seed_report import tables_from_json
from benchmarks.sim_runs import SimJob
from noloco_rt.config import ConfigError, parse_assignment

VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
SET_PREFIX = "--set"


@dataclass(frozen=True)
class Variant:
    name: str
    assignments: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    """'bf16:--set worker.snapshot_codec=bf16-shuffle-zstd,outer.h=25' -> Variant('bf16', (...)).
    Raises argparse.ArgumentTypeError naming the variant and what is wrong with it."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not colon or not VARIANT_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: expected NAME:[--set ]SECTION.FIELD=VALUE,... with NAME of letters, digits, "
            "'_.+-' (e.g. 'base:' or 'h25:--set outer.h=25')")
    rest = rest.strip()
    if rest.startswith(SET_PREFIX):  # '--set a=b' and '--set=a=b' both
        rest = rest[len(SET_PREFIX):].strip().removeprefix("=").strip()
    if not rest:
        return Variant(name, ())
    assignments = tuple(part.strip() for part in rest.split(","))
    for assignment in assignments:
        if not assignment or SET_PREFIX in assignment:
            raise argparse.ArgumentTypeError(
                f"variant {name!r}: bad assignment list {rest!r}; separate SECTION.FIELD=VALUE by commas, "
                "one --set at most")
        try:
            parse_assignment(assignment)
        except ConfigError:
            raise argparse.ArgumentTypeError(
                f"variant {name!r}: {assignment!r} is not SECTION.FIELD=VALUE (e.g. outer.h=25)") from None
    return Variant(name, assignments)


def ablation_jobs(args: argparse.Namespace) -> list[SimJob]:
    """Variant-major, then seed: the order of rows and plot lines."""
    shape = bench.run_flag_assignments(args)
    threads = bench.threads_per_job(args.jobs)
    return [SimJob(group=args.group, label=variant.name, seed=seed, config_path=args.config,
                   assignments=(*shape, *variant.assignments), threads=threads)
            for variant in args.variants for seed in args.seeds]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_run_flags(parser, default_out=Path("benchmarks/results/ablation"))
    parser.add_argument("--config", default=None, help="base config file (default: built-in defaults)")
    parser.add_argument("--variant", dest="variants", type=parse_variant, action="append", default=[],
                        metavar="NAME:[--set ]A=B,...", help="repeatable; the first is the baseline")
    parser.add_argument("--group", default=None, help="table and panel title (default: the config's name)")
    parser.add_argument("--report-only", action="store_true",
                        help="print the tables of OUT/ablation.json again (nothing is run)")
    args = parser.parse_args(argv)
    if args.report_only:
        report = args.out / "ablation.json"
        if not report.is_file():
            parser.error(f"--report-only: {report} does not exist")
        text = tables_from_json(report, title=f"Ablation ({report})", label_header="variant")
        print(text)
        return text
    if not args.variants:
        parser.error("at least one --variant is needed (the first is the baseline)")
    names = [variant.name for variant in args.variants]
    if len(set(names)) != len(names):
        parser.error(f"variant names must be distinct, got {', '.join(names)}")
    if args.config is not None and not Path(args.config).is_file():
        parser.error(f"--config {args.config!r} does not exist")
    args.group = args.group or (Path(args.config).stem if args.config else "defaults")
    jobs = ablation_jobs(args)
    bench.check_jobs_or_exit(parser, jobs)
    return bench.run_and_report(jobs, out=args.out, stem="ablation", label_header="variant", baselines=[names[0]],
                                title=f"Ablation, {bench.run_shape(args)}", parallel=args.jobs)


if __name__ == "__main__":
    main()

"""Convergence benchmark: several training methods over several seeds and recipes, in the
simulator, under the same data and compute (R replicas x S stages, same microbatches per
inner step).

    python -m benchmarks.convergence --out benchmarks/results --steps 2000 --replicas 8 \\
        --seeds 0,1,2 --methods ddp,diloco,noloco,local \\
        --recipe defaults= --recipe paper=configs/paper.toml

A recipe is NAME=CONFIG_FILE (empty file: the built-in defaults); a method is any value
outer.method accepts. The seed (run.seed) changes weights, data order and routing. Per
recipe and method the table gives mean and min–max over seeds of the final validation
perplexity, its ratio to each baseline method (same seed against same seed), the final
replica spread and Pearson(spread, lr). Writes OUT/convergence.md, OUT/convergence.json
(rows and every evaluation of every run), OUT/convergence.png (perplexity against tokens,
a min–max band per method, one panel per recipe) and each run's own folder under
OUT/convergence_runs/RECIPE/METHOD/seedN.

The paper's claims it checks: noloco's perplexity is at most diloco's (up to 4% lower),
both close to ddp, and noloco's spread follows the learning rate (Pearson 0.91-0.97).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import seeded_bench as bench
from benchmarks.seed_report import tables_from_json
from benchmarks.sim_runs import SimJob


def parse_recipe(text: str) -> tuple[str, str | None]:
    """'paper=configs/paper.toml' -> ('paper', 'configs/paper.toml'); 'defaults=' -> ('defaults', None)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"recipe must be NAME=CONFIG_FILE (file may be empty), got {text!r}")
    path = path.strip()
    if path and not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"recipe {name.strip()!r}: config file {path!r} does not exist")
    return name.strip(), path or None


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods or len(set(methods)) != len(methods):
        raise argparse.ArgumentTypeError(f"methods must be distinct comma-separated names, got {text!r}")
    return methods


def convergence_jobs(args: argparse.Namespace) -> list[SimJob]:
    """Recipe-major, then method, then seed: the order of tables, rows and the plot."""
    shape = bench.run_flag_assignments(args)
    threads = bench.threads_per_job(args.jobs)
    return [SimJob(group=recipe, label=method, seed=seed, config_path=path,
                   assignments=(*shape, f"outer.method={method}"), threads=threads)
            for recipe, path in args.recipes for method in args.methods for seed in args.seeds]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_run_flags(parser, default_out=Path("benchmarks/results"))
    parser.add_argument("--methods", type=parse_methods, default=["ddp", "diloco", "noloco", "local"])
    parser.add_argument("--recipe", dest="recipes", type=parse_recipe, action="append", default=None,
                        metavar="NAME=CONFIG_FILE", help="repeatable; default: defaults= (built-in config)")
    parser.add_argument("--baselines", type=parse_methods, default=["ddp", "diloco"],
                        help="methods every other is compared with, seed by seed")
    parser.add_argument("--report-only", action="store_true",
                        help="print the tables of OUT/convergence.json again (nothing is run)")
    args = parser.parse_args(argv)
    if args.report_only:
        report = args.out / "convergence.json"
        if not report.is_file():
            parser.error(f"--report-only: {report} does not exist")
        text = tables_from_json(report, title=f"Convergence ({report})", label_header="method",
                                baselines=args.baselines)
        print(text)
        return text
    args.recipes = args.recipes or [("defaults", None)]
    if len({name for name, _ in args.recipes}) != len(args.recipes):
        parser.error("recipe names must be distinct")
    jobs = convergence_jobs(args)
    bench.check_jobs_or_exit(parser, jobs)
    return bench.run_and_report(jobs, out=args.out, stem="convergence", label_header="method",
                                baselines=args.baselines, title=f"Convergence, {bench.run_shape(args)}",
                                parallel=args.jobs)


if __name__ == "__main__":
    main()

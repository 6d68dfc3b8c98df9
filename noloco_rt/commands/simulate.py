"""`noloco-rt simulate`: the algorithm in one process, no network."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from noloco_rt.cli import config_options
from noloco_rt.commands._init_from import check_init_from, init_from_option, init_from_value
from noloco_rt.config import METHODS


@click.command()
@click.option("--method", type=click.Choice(METHODS), default=None, help="Outer method (default: outer.method).")
@click.option("--stages", type=click.IntRange(min=1), default=None, help="Pipeline stages S.")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Replicas per stage R.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Inner steps N.")
@click.option("--preset", default=None, help="Model preset (tiny, small, 125m, 1b, 7b).")
@click.option("--seed", type=int, default=None, help="Run seed.")
@click.option("--eval-every", type=click.IntRange(min=1), default=None, help="Steps between evaluations K.")
@click.option("--out", "out_dir", default=None, help="Run directory (default: paths.out_dir).")
@init_from_option
@config_options
def simulate(method: str | None, stages: int | None, replicas: int | None, steps: int | None,
             preset: str | None, seed: int | None, eval_every: int | None, out_dir: str | None,
             init_from: Path | None, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Train R replicas of S stages in one process with random routing and the outer step.

    Writes OUT/metrics.jsonl, OUT/config.toml and OUT/curves.png.
    """
    from noloco_rt.commands import effective_config

    cfg = effective_config(config_path, assignments, {
        "outer": {"method": method},
        "pipeline": {"stages": stages, "replicas": replicas},
        "run": {"steps": steps, "seed": seed, "eval_every": eval_every},
        "model": {"preset": preset, "init_from": init_from_value(init_from)},
        "paths": {"out_dir": out_dir},
    })
    check_init_from(cfg)

    from noloco_rt.algo.simulator import run_simulation
    from noloco_rt.logs import configure_logging, get_logger

    configure_logging(cfg.run.log_format)
    log = get_logger(run=cfg.run.run_id, worker="simulator", stage="all")
    out = Path(cfg.paths.out_dir)
    outer = cfg.outer.resolved()
    log.info("simulation_started", method=outer.method, stages=cfg.pipeline.stages,
             replicas=cfg.pipeline.replicas, steps=cfg.run.steps, preset=cfg.model.preset, h=outer.h,
             alpha=outer.alpha, beta=outer.beta, gamma=outer.gamma, out=str(out))

    def log_eval(rec) -> None:
        log.info("evaluation", step=rec.step, val_loss=round(rec.val_loss, 4), val_ppl=round(rec.val_ppl, 2),
                 spread=f"{rec.spread:.3e}", lr=f"{rec.lr:.2e}")

    if sys.stderr.isatty():
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                      transient=False) as progress:
            task = progress.add_task(outer.method, total=cfg.run.steps, status="")

            def on_progress(step: int, rec) -> None:
                if rec is not None:
                    progress.update(task, status=f"val_loss {rec.val_loss:.3f}  spread {rec.spread:.2e}")
                progress.update(task, completed=step)

            records = run_simulation(cfg, out, on_progress=on_progress)
    else:
        records = run_simulation(cfg, out, on_progress=lambda step, rec: rec is not None and log_eval(rec))
    final = records[-1]
    log.info("simulation_done", step=final.step, val_loss=round(final.val_loss, 4), val_ppl=round(final.val_ppl, 2),
             spread=f"{final.spread:.3e}", elapsed_s=round(final.elapsed_s, 1), out=str(out))

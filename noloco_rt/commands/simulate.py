"""`noloco-rt simulate`: the algorithm in one process, no network."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.cli import config_options
from noloco_rt.commands.shared_options import (
    check_init_from,
    check_model,
    init_from_option,
    init_from_value,
    model_name,
    model_option,
    model_value,
)
from noloco_rt.config import METHODS, SIMULATION_ROUTINGS, RoutingConfig

if TYPE_CHECKING:
    from noloco_rt.curves.scalar_log import ScalarLog


@click.command(help=f"""Train R replicas of S stages in one process: microbatches routed as
routing.simulation says (default {RoutingConfig().simulation}; one of {", ".join(SIMULATION_ROUTINGS)}: --set
routing.simulation=NAME), then the outer step.

Writes OUT/metrics.jsonl, OUT/config.toml, OUT/curves.png and OUT/consensus.safetensors (and, with --tensorboard,
event files: `tensorboard --logdir DIR`).
""")
@click.option("--method", type=click.Choice(METHODS), default=None, help="Outer method (default: outer.method).")
@click.option("--stages", type=click.IntRange(min=1), default=None, help="Pipeline stages S.")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Replicas per stage R.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Inner steps N.")
@click.option("--preset", default=None, help="Model preset (tiny, small, 125m, 1b, 7b).")
@click.option("--seed", type=int, default=None, help="Run seed.")
@click.option("--eval-every", type=click.IntRange(min=1), default=None, help="Steps between evaluations K.")
@click.option("--out", "out_dir", default=None, help="Run directory (default: paths.out_dir).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write TensorBoard scalars (each evaluation) to this directory (needs tensorboard).")
@click.option("--wandb", "with_wandb", is_flag=True, help="Also log to W&B, offline, under OUT/wandb (needs wandb).")
@init_from_option
@model_option
@config_options
def simulate(method: str | None, stages: int | None, replicas: int | None, steps: int | None,
             preset: str | None, seed: int | None, eval_every: int | None, out_dir: str | None,
             tensorboard_dir: str | None, with_wandb: bool, init_from: Path | None, model_factory: str | None,
             config_path: str | None, assignments: tuple[str, ...]) -> None:
    # The help text is the command's (above): it names routing.simulation's default from the config.
    from noloco_rt.commands import effective_config
    from noloco_rt.curves.scalar_log import ScalarLogUnavailable, open_scalar_log, usage_error

    cfg = effective_config(config_path, assignments, {
        "outer": {"method": method},
        "pipeline": {"stages": stages, "replicas": replicas},
        "run": {"steps": steps, "seed": seed, "eval_every": eval_every},
        "model": {"preset": preset, "init_from": init_from_value(init_from), "factory": model_value(model_factory)},
        "paths": {"out_dir": out_dir},
    })
    check_init_from(cfg)
    check_model(cfg)
    out = Path(cfg.paths.out_dir)
    try:  # a backend asked for but missing: refused before any work
        scalar_log = open_scalar_log(Path(tensorboard_dir) if tensorboard_dir else None,
                                     wandb_dir=out / "wandb" if with_wandb else None, run_name=cfg.run.run_id)
    except ScalarLogUnavailable as exc:
        raise usage_error(exc) from None

    from noloco_rt.logs import configure_logging, get_logger

    configure_logging(cfg.run.log_format)
    log = get_logger(run=cfg.run.run_id, worker="simulator", stage="all")
    outer = cfg.outer.resolved()
    log.info("simulation_started", method=outer.method, stages=cfg.pipeline.stages,
             replicas=cfg.pipeline.replicas, steps=cfg.run.steps, model=model_name(cfg), h=outer.h,
             alpha=outer.alpha, beta=outer.beta, gamma=outer.gamma, out=str(out))
    curves = SimulationCurves(scalar_log)
    try:
        records = _run(cfg, out, log, curves)
    finally:
        curves.close()
    final = records[-1]
    log.info("simulation_done", step=final.step, val_loss=round(final.val_loss, 4), val_ppl=round(final.val_ppl, 2),
             spread=f"{final.spread:.3e}", elapsed_s=round(final.elapsed_s, 1), out=str(out))


def _run(cfg, out: Path, log, curves: SimulationCurves) -> list:
    from noloco_rt.simulation.simulator import run_simulation

    outer = cfg.outer.resolved()

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
                    curves.record(rec)
                    progress.update(task, status=f"val_loss {rec.val_loss:.3f}  spread {rec.spread:.2e}")
                progress.update(task, completed=step)

            return run_simulation(cfg, out, on_progress=on_progress)

    def on_record(step: int, rec) -> None:
        if rec is not None:
            curves.record(rec)
            if step > 0:  # the untrained baseline is a curve point, not a progress line
                log_eval(rec)

    return run_simulation(cfg, out, on_progress=on_record)


class SimulationCurves:
    """Each evaluation record of the simulator as scalars (None: nothing is written). The
    simulator has no network, so no exchange bytes; its train loss is the mean over replicas."""

    def __init__(self, scalar_log: ScalarLog | None) -> None:
        self.scalar_log = scalar_log
        self.previous: Any = None

    def record(self, rec: Any) -> None:
        if self.scalar_log is None:
            return
        rate = None
        if self.previous is not None and rec.elapsed_s > self.previous.elapsed_s:
            rate = (rec.tokens - self.previous.tokens) / (rec.elapsed_s - self.previous.elapsed_s)
        self.previous = rec
        self.scalar_log.scalars(rec.step, {"train_loss": rec.train_loss, "lr": rec.lr, "tokens_per_s": rate,
                                           "val_loss": rec.val_loss, "val_ppl": rec.val_ppl})
        self.scalar_log.scalars(rec.step, {"spread": rec.spread}, suffix="all")
        for stage, spread in enumerate(rec.spread_by_stage):
            self.scalar_log.scalars(rec.step, {"spread": spread}, suffix=f"stage{stage}")

    def close(self) -> None:
        if self.scalar_log is not None:
            self.scalar_log.close()

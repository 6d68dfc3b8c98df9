"""`noloco-rt up`: a whole distributed training on this machine (the command and its
options here; the run itself in workers/cluster/up_run.py).

A redis-server (embedded unless --redis-url), the coordinator and S × R workers, each
a real process supervised like `noloco-rt launch` does (workers/supervise/supervisor.py): a
crashed worker is restarted and resumes. A live table on a terminal, a log line every
few seconds elsewhere; metrics.jsonl gets a sample every --interval. When every worker
has finished its steps (or on Ctrl-C / SIGTERM: workers leave gracefully), the
coordinator and Redis are stopped, the consensus checkpoint is built from the workers'
final checkpoints and scored, and curves.png is drawn. TensorBoard scalars go to OUT/tb
(workers/ from the workers' logs, written here; coordinator/ written by the coordinator).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from noloco_rt.cli import config_options
from noloco_rt.commands import effective_config
from noloco_rt.commands.shared_options import (
    check_init_from,
    check_model,
    init_from_option,
    init_from_value,
    model_option,
    model_value,
)
from noloco_rt.config import Config
from noloco_rt.curves.scalar_log import ScalarLogUnavailable, check_available, usage_error
from noloco_rt.logs import get_logger
from workers.cluster.run_dir import RunDirError, prepare_run_dir
from workers.cluster.up_run import CurvesSettings, UpRun
from workers.methods import worker_outer_error

# torch (through the supervisor, the export and the learning-rate schedule), matplotlib,
# redis, zmq and rich's live view are imported where they are used, not here: `noloco-rt
# up --help` imports this module and needs none of them.


@click.command()
@click.option("--stages", type=click.IntRange(min=1), default=None, help="Pipeline stages S (pipeline.stages).")
@click.option("--replicas", type=click.IntRange(min=1), default=None,
              help="Workers per stage R (pipeline.replicas).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Inner steps per worker (run.steps).")
@click.option("--preset", default=None, help="Model preset (model.preset).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run directory (paths.out_dir); a run of the same config there is resumed.")
@click.option("--redis-url", default=None, help="Use this Redis instead of starting an embedded one.")
@click.option("--coordinator/--no-coordinator", "with_coordinator", default=True, show_default=True,
              help="Run the coordinator (evaluation, spread, consensus during the run).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=5, show_default=True,
              help="Restarts of a crashed worker before giving up on it.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between samples (metrics.jsonl, live view).")
@click.option("--secure", is_flag=True,
              help="CURVE on: use OUT/keys (a fresh key pair the first time) unless keys are configured.")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="TensorBoard scalars: DIR/workers/<name> (train loss, tokens/s, lr, exchange bytes of each worker) and "
                   "DIR/coordinator (val loss/ppl, spread). Default: OUT/tb when tensorboard is installed.")
@click.option("--no-tensorboard", is_flag=True, help="No TensorBoard scalars.")
@click.option("--wandb", "with_wandb", is_flag=True, help="Also log the scalars to W&B, offline, under OUT/wandb.")
@init_from_option
@model_option
@config_options
def up(stages: int | None, replicas: int | None, steps: int | None, preset: str | None, out_dir: str | None,
       redis_url: str | None, with_coordinator: bool, max_restarts: int, interval: float, secure: bool,
       tensorboard_dir: str | None, no_tensorboard: bool, with_wandb: bool, init_from: Path | None,
       model_factory: str | None, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Train S stages × R replicas on this machine until --steps, then export the model.

    Leaves OUT/config.toml, OUT/logs/, OUT/metrics.jsonl, OUT/checkpoints/,
    OUT/consensus.safetensors (try `noloco-rt eval` and `noloco-rt sample` on it),
    OUT/curves.png and OUT/tb/ (`tensorboard --logdir OUT/tb`, when tensorboard is installed).
    """
    cfg = effective_config(config_path, assignments, {
        "pipeline": {"stages": stages, "replicas": replicas},
        "run": {"steps": steps},
        "model": {"preset": preset, "init_from": init_from_value(init_from), "factory": model_value(model_factory)},
        "paths": {"out_dir": out_dir},
        "network": {"redis_url": redis_url},
    })
    if (why := worker_outer_error(cfg.outer)) is not None:
        raise click.UsageError(why)
    check_init_from(cfg)
    check_model(cfg)

    from noloco_rt.process.startup import process_startup

    out = Path(cfg.paths.out_dir)
    curves = curves_settings(out, tensorboard_dir, no_tensorboard, with_wandb)
    cfg = _with_curve(cfg, out, secure)
    from noloco_rt.net.exposure import open_door

    if (why := open_door(cfg.network)) is not None:  # once here, not in every worker's restarts
        raise click.UsageError(f"{why} (`up --secure` makes keys for this run)")
    # A bad key file or a refused Redis password fails now (exit 2), not in every child;
    # no ZeroMQ here: `up` only supervises.
    with process_startup(cfg, zmq_context=False):
        try:
            # The secret key value (if given as one) goes to the children by environment, never into config.toml.
            config_file = prepare_run_dir(out, dataclasses.replace(
                cfg, network=dataclasses.replace(cfg.network, curve_secret_key="")))
        except RunDirError as exc:
            raise click.UsageError(str(exc)) from None
        code = UpRun(cfg, out, config_file, with_coordinator=with_coordinator, max_restarts=max_restarts,
                     interval_s=interval, curves=curves).run()
    sys.exit(code)


def curves_settings(out: Path, tensorboard_dir: str | None, no_tensorboard: bool, with_wandb: bool) -> CurvesSettings:
    """Where the scalars go. A backend asked for but not installed stops `up` (one line, exit 2);
    the default OUT/tb without tensorboard installed is one warning and no curves."""
    if tensorboard_dir and no_tensorboard:
        raise click.UsageError("--tensorboard and --no-tensorboard contradict each other")
    try:
        check_available(tensorboard=bool(tensorboard_dir), wandb=with_wandb)
    except ScalarLogUnavailable as exc:
        raise usage_error(exc) from None
    if tensorboard_dir:
        return CurvesSettings(Path(tensorboard_dir).resolve(), with_wandb)
    if no_tensorboard:
        return CurvesSettings(None, with_wandb)
    try:
        check_available(tensorboard=True)
    except ScalarLogUnavailable as exc:
        get_logger(role="up").warning("tensorboard_off", reason=str(exc), hint="--no-tensorboard silences this")
        return CurvesSettings(None, with_wandb)
    return CurvesSettings((out / "tb").resolve(), with_wandb)


def _with_curve(cfg: Config, out: Path, secure: bool) -> Config:
    """The config with CURVE settled: --secure without keys uses OUT/keys, generated the first
    time; a configured key directory is made absolute (the keys are checked at start-up)."""
    from noloco_rt.net.curve import write_key_pair

    network = cfg.network
    if secure and not (network.curve_key_dir or network.curve_secret_key):
        keys_dir = out / "keys"
        if not (keys_dir / "cluster.secret").exists():
            write_key_pair(keys_dir, "cluster")
        network = dataclasses.replace(network, curve_key_dir=str(keys_dir.resolve()))
    elif network.curve_key_dir:  # children may not share our working directory's meaning
        network = dataclasses.replace(network, curve_key_dir=str(Path(network.curve_key_dir).resolve()))
    return dataclasses.replace(cfg, network=network)

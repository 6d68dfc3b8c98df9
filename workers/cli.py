"""`noloco-rt worker`: run one stage worker until its steps are done or it is told to leave."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from noloco_rt.cli import config_options
from noloco_rt.commands.shared_options import (
    check_init_from,
    check_model,
    check_store,
    init_from_option,
    init_from_value,
    model_option,
    model_value,
)

if TYPE_CHECKING:  # the command body imports these when it runs, so that `--help` stays fast
    from noloco_rt.config import Config
    from noloco_rt.logs import EventLog
    from noloco_rt.membership.table import Membership
    from noloco_rt.process.startup import Started

GIL_SWITCH_INTERVAL_S = 0.0005
"""How long a thread holds the GIL when another waits for it (Python's default: 5 ms)."""


@click.command()
@click.option("--stage", type=click.IntRange(min=0), required=True, help="Pipeline stage this worker holds.")
@click.option("--redis-url", default=None, help="Membership table (redis:// or rediss://; a password here shows in `ps`: "
                   "prefer NOLOCO_NETWORK_REDIS_URL or network.redis_password_file).")
@click.option("--name", default=None, help="Stable name across restarts (checkpoint file, data stream); "
                                            "default <host>-s<stage>-r<LOCAL_RANK>.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Inner steps before exiting (run.steps).")
@click.option("--bind-host", default=None, help="Interface to bind (network.bind_host).")
@click.option("--advertise-host", default=None, help="Address peers use to reach us (network.advertise_host).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="Prometheus port (0: free one).")
@click.option("--redis-wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Retry an unreachable Redis at start this long, then exit 2 (worker.redis_wait_s, default 120).")
@click.option("--allow-reseed", is_flag=True, default=None,
              help="Start the stage from the seed even if the run is past step 0 there and no peer or "
                   "checkpoint holds it (worker.allow_reseed; otherwise exit 3).")
@init_from_option
@model_option
@config_options
def worker(stage: int, redis_url: str | None, name: str | None, steps: int | None, bind_host: str | None,
           advertise_host: str | None, metrics_port: int | None, redis_wait: float | None,
           allow_reseed: bool | None, init_from: Path | None, model_factory: str | None,
           config_path: str | None,
           assignments: tuple[str, ...]) -> None:
    """Hold one replica of pipeline stage STAGE and train with live peers found through Redis."""
    from noloco_rt.commands import effective_config

    cfg = effective_config(config_path, assignments, {
        "network": {"redis_url": redis_url, "bind_host": bind_host, "advertise_host": advertise_host,
                    "metrics_port": metrics_port},
        "run": {"steps": steps},
        "worker": {"redis_wait_s": redis_wait, "allow_reseed": allow_reseed},
        "model": {"init_from": init_from_value(init_from), "factory": model_value(model_factory)},
    })
    if not cfg.network.redis_url:
        raise click.UsageError("--redis-url (or network.redis_url) is required: workers find each other there")
    from workers.methods import worker_outer_error

    if (why := worker_outer_error(cfg.outer)) is not None:
        raise click.UsageError(why)
    if stage >= cfg.pipeline.stages:
        raise click.BadParameter(f"{stage} is not a stage of a {cfg.pipeline.stages}-stage pipeline "
                                 f"(pipeline.stages)", param_hint="--stage")
    from noloco_rt.net.exposure import open_door

    if (why := open_door(cfg.network)) is not None:
        raise click.UsageError(why)
    check_init_from(cfg)
    check_model(cfg)
    check_store(cfg)
    from noloco_rt.process.startup import process_startup

    # A bad key file or a refused password fails here, before anything starts. An unreachable
    # Redis is waited for (it may start after us), within worker.redis_wait_s.
    from workers.outer.bootstrap import StageProgressLost

    try:
        with process_startup(cfg, redis_wait=True) as started:
            code = _run_worker(cfg, stage, name, started)
    except StageProgressLost as exc:  # not a bad flag: exit 3, so an orchestrator retries later
        error = click.ClickException(str(exc))
        error.exit_code = 3
        raise error from None
    sys.exit(code)


def _run_worker(cfg: Config, stage: int, name: str | None, started: Started) -> int:
    """Compose the worker from its parts and run it until its steps are done or it leaves."""
    from noloco_rt.membership.table import Membership
    from noloco_rt.process.heap import settle_heap
    from noloco_rt.process.stack_dumps import arm_exit_watchdog, dump_stacks_on_sigusr1
    from workers.faults.checkpoint_writes import disk_full_from_env
    from workers.faults.data_path import data_faults_from_env
    from workers.health_metrics import register_health_collector
    from workers.metrics import WorkerMetrics
    from workers.worker import (
        StageWorker,
        default_worker_name,
        install_signal_handlers,
        pick_device,
    )

    dump_stacks_on_sigusr1()
    # The training thread hands the GIL to the data link's thread several times a microbatch;
    # at Python's default 5 ms switch interval each handback can wait that long (a 2 x 1
    # pipeline on 2 cores: +4 % tokens/s at 0.5 ms, 3 of 3 paired runs, benchmarks/README.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    name = name or default_worker_name(stage)
    checkpoint_dir = Path(cfg.paths.checkpoint_dir or Path(cfg.paths.out_dir) / "checkpoints")
    metrics = WorkerMetrics()
    metrics_port_bound = metrics.serve(cfg.network.metrics_port, host=cfg.network.bind_host)
    membership = Membership(started.client, run_id=cfg.run.run_id,
                            heartbeat_interval_s=cfg.worker.heartbeat_interval_s)
    if _run_already_over(cfg, stage, name, membership):
        return 0  # a Job's late pod completes instead of training with nobody downstream
    stage_worker = StageWorker(cfg, stage, membership=membership, ctx=started.ctx, name=name,
                               device=pick_device(int(os.environ.get("LOCAL_RANK", "0"))),
                               checkpoint_path=checkpoint_dir / f"{name}.pt", metrics=metrics,
                               data_faults=data_faults_from_env(os.environ, name=name),
                               checkpoint_fault=disk_full_from_env(os.environ))
    register_health_collector(metrics.registry, membership, stage_worker.replica.inner,
                              stage_worker.exchange_server, stage_worker.views)
    stage_worker.metrics_addr = f"{cfg.network.advertise_host or cfg.network.bind_host}:{metrics_port_bound}"
    install_signal_handlers(stage_worker)
    settle_heap()  # torch, torch._dynamo and the replica: out of every collection from here on
    stage_worker.log.info("metrics_serving", port=metrics_port_bound)
    stage_worker.log.info("curve", enabled=started.curve is not None,
                          public_key=started.curve.public_key.decode() if started.curve else "")
    try:
        code = stage_worker.run()
    finally:
        arm_exit_watchdog()  # a clean clone's test once saw a finished worker never exit
    # Done and summarised. Python restores the default SIGTERM action while it shuts down, so a
    # stop racing our own exit would turn exit 0 into death by signal: ignore it from here on.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


def _run_already_over(cfg: Config, stage: int, name: str, membership: Membership) -> bool:
    """The run's last stage finished before we started (workers/run_finished.py), or our own
    stage did and left nobody: say so."""
    from noloco_rt.logs import get_logger
    from workers.run_finished import finished_steps, run_is_over

    log = get_logger(run=cfg.run.run_id, stage=stage, name=name)
    marked = finished_steps(cfg, membership, log)
    if not run_is_over(marked, cfg.run.steps):
        if marked is not None and marked > cfg.run.steps:
            log.warning("run_finished_mark_ignored", finished_steps=marked, run_steps=cfg.run.steps,
                        note="the run-finished mark names more steps than run.steps: not this run's finish")
        return _stage_already_over(cfg, stage, membership, log)
    log.warning("run_already_finished", finished_steps=marked,
                note="the run's last stage finished before this worker started: nothing to train, exit 0")
    return True


def _stage_already_over(cfg: Config, stage: int, membership: Membership, log: EventLog) -> bool:
    """Our stage's workers finished this config's steps and none is left, while a later stage
    still trains: a late joiner (a slow start, a Job's late pod) has nothing to train and
    nobody to take the stage's state from. Without this it would find the stage past step 0
    and exit 3 to be retried. A config with more steps than the stage reached goes on (a run
    extended from its checkpoints). Checked before we register: registering clears the mark."""
    if not membership.stage_finished(stage) or membership.live_members(stage=stage):  # ONLINE: a donor
        return False
    reached = membership.high_water.of(stage)  # outer steps; None: unknown, MALFORMED_MARK: not a count
    if reached is None or reached < 0 or reached * cfg.outer.resolved().h < cfg.run.steps:
        return False
    log.warning("stage_already_finished", outer_step=reached,
                note="this stage's workers finished this run's steps before this worker started and none is "
                     "left: nothing to train, exit 0")
    return True

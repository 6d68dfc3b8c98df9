"""`noloco-rt coordinator`: observe a run (evaluation, spread, consensus checkpoint, status)."""

from __future__ import annotations

from pathlib import Path

import click

from noloco_rt.cli import config_options


@click.command()
@click.option("--redis-url", default=None, help="Membership table of the run (network.redis_url).")
@click.option("--status-port", type=click.IntRange(0, 65535), default=None,
              help="Port of /status and /metrics (coordinator.status_port; 0: a free one).")
@click.option("--host", default=None, help="Interface for the live page, /status and /metrics "
              "(coordinator.status_host; default 127.0.0.1: CURVE does not cover this port).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the consensus checkpoint goes (paths.out_dir).")
@click.option("--redis-wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Retry an unreachable Redis at start this long, then exit 2 (worker.redis_wait_s, default 120).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write val loss/ppl and replica spread as TensorBoard scalars here (needs tensorboard).")
@click.option("--wandb", "with_wandb", is_flag=True, help="Also log them to W&B, offline, under OUT/wandb (needs wandb).")
@config_options
def coordinator(redis_url: str | None, status_port: int | None, host: str | None, out_dir: str | None,
                redis_wait: float | None, tensorboard_dir: str | None, with_wandb: bool, config_path: str | None,
                assignments: tuple[str, ...]) -> None:
    """Pull snapshots read-only, evaluate, measure replica spread and export a consensus
    checkpoint; serve /status and /metrics. Workers never depend on it."""
    cfg = coordinator_config(config_path, assignments, redis_url=redis_url, status_port=status_port, host=host,
                             out_dir=out_dir, redis_wait=redis_wait)
    if not cfg.network.redis_url:
        raise click.UsageError("--redis-url (or network.redis_url) is required: the coordinator finds workers there")

    from noloco_rt.commands.shared_options import check_store
    from noloco_rt.process.startup import process_startup

    check_store(cfg)
    scalar_log = _open_curves(cfg, tensorboard_dir, with_wandb)  # a missing package: refused before connecting

    # Snapshot pulls (DEALER requests) made from the context present the run's keys.
    with process_startup(cfg, redis_wait=True) as started:
        _serve_and_observe(cfg, started, scalar_log)


def coordinator_config(config_path: str | None, assignments: tuple[str, ...], *, redis_url: str | None,
                       status_port: int | None, host: str | None, out_dir: str | None, redis_wait: float | None):
    """The run's config with the command's flags on top (a flag not given changes nothing)."""
    from noloco_rt.commands import effective_config

    return effective_config(config_path, assignments, {
        "network": {"redis_url": redis_url},
        "coordinator": {"status_port": status_port, "status_host": host},
        "paths": {"out_dir": out_dir},
        "worker": {"redis_wait_s": redis_wait},
    })


def _serve_and_observe(cfg, started, scalar_log) -> None:
    """The coordinator once connected: the observer, the HTTP port and the live page's own
    reading of the members, until stopped or the run finished."""
    import signal
    import threading

    from coordinator.observer import Observer
    from coordinator.page_refresher import start_page_refresher
    from coordinator.pull import RateLimiter, SnapshotPuller
    from coordinator.run_page import RunPage
    from coordinator.server import CoordinatorMetrics
    from noloco_rt.logs import get_logger
    from noloco_rt.membership.table import Membership
    from noloco_rt.process.lifetime import set_event_from_signal_handler

    log = get_logger(run=cfg.run.run_id, role="coordinator")
    out = Path(cfg.paths.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = CoordinatorMetrics()
    membership = Membership(started.client, run_id=cfg.run.run_id)
    puller = SnapshotPuller(cfg, started.ctx, metrics=metrics, log=log,
                            limiter=RateLimiter(cfg.coordinator.max_pulls_per_s))
    page = RunPage(cfg.run.run_id)
    observer = Observer(cfg, membership, puller, out_dir=out, metrics=metrics, log=log, scalar_log=scalar_log,
                        page=page)
    server = _status_server(cfg, observer, metrics, page)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: set_event_from_signal_handler(stop))
    server.start()
    start_page_refresher(page, Membership(started.client, run_id=cfg.run.run_id), stop, log)
    host = cfg.coordinator.status_host
    log.info("coordinator_started", page=f"http://{host}:{server.port}/", status=f"http://{host}:{server.port}/status",
             port=server.port, out=str(out), curve=started.curve is not None)
    try:
        _observe_until_done(cfg, observer, stop, log)
    finally:
        server.stop()
        if scalar_log is not None:
            scalar_log.close()
        log.info("coordinator_stopped", evaluations=observer.status.evaluations,
                 run_finished=observer.status.final is not None)
    if observer.status.final is not None:  # the run's last line: where its model is
        log.info("coordinator_done", **observer.status.final)


def _observe_until_done(cfg, observer, stop, log) -> None:
    """Observe until stopped or the run finished; then, unless coordinator.exit_when_finished,
    keep serving its final status until stopped (a Kubernetes Deployment restarts what exits)."""
    if observer.run(stop) and not cfg.coordinator.exit_when_finished:
        log.info("serving_final_status", final=observer.status.final)
        stop.wait()


def _status_server(cfg, observer, metrics, page):
    """The live page, /status and /metrics on coordinator.status_host:status_port; a port in
    use: one line."""
    from coordinator.server import StatusServer

    host = cfg.coordinator.status_host
    try:
        return StatusServer(host, cfg.coordinator.status_port, status_json=observer.status_json,
                            registry=metrics.registry, page=page)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{cfg.coordinator.status_port}: {exc.strerror}") from None


def _open_curves(cfg, tensorboard_dir: str | None, with_wandb: bool):
    """The ScalarLog of --tensorboard / --wandb (None without either); a package asked for
    but not installed: one line, exit 2."""
    from noloco_rt.curves.scalar_log import ScalarLogUnavailable, open_scalar_log, usage_error

    try:
        return open_scalar_log(Path(tensorboard_dir) if tensorboard_dir else None,
                               wandb_dir=Path(cfg.paths.out_dir) / "wandb" if with_wandb else None,
                               run_name=f"{cfg.run.run_id}-coordinator")
    except ScalarLogUnavailable as exc:
        raise usage_error(exc) from None

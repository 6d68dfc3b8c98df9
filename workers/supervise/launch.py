"""`noloco-rt launch`: supervise N local workers of one stage on a bare-metal node.

torchrun's role without its rendezvous: workers find each other through Redis, so this
command only starts `noloco-rt worker` processes, restarts the one that fails (its
neighbours are untouched, see workers.supervise.supervisor) and passes SIGTERM / SIGINT on as a
graceful leave.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from noloco_rt.cli import config_options
from noloco_rt.commands.shared_options import check_model, model_option, model_value
from noloco_rt.config import parse_assignment

if TYPE_CHECKING:  # the supervisor imports torch: only when the command runs
    from noloco_rt.config import Config
    from workers.supervise.supervisor import ProcessSpec

STOP_MARGIN_S = 5.0
"""After worker.leave_grace_s a worker should be gone; this allows for interpreter shutdown
(`up` and `chaos` give their supervisors the same margin)."""


@click.command()
@click.option("--stage", type=click.IntRange(min=0), required=True, help="Pipeline stage the workers hold.")
@click.option("--nproc", type=click.IntRange(min=1), required=True,
              help="Workers to run on this machine (one per accelerator); LOCAL_RANK 0..N-1.")
@click.option("--redis-url", default=None, help="Membership table (redis:// or rediss://; a password here shows in `ps`: "
                   "prefer NOLOCO_NETWORK_REDIS_URL or network.redis_password_file).")
@click.option("--name-prefix", default=None, help="Workers are named <prefix>-r<i>; default <host>-s<stage>.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=10, show_default=True,
              help="Restarts per worker before it is given up (the others carry on).")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Worker logs, <name>.<incarnation>.log (log) / .out (stdout); default <paths.out_dir>/logs.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Inner steps per worker (run.steps).")
@click.option("--metrics-port-base", type=click.IntRange(1, 65535), default=None,
              help="Worker i serves Prometheus on base + i (default: a free port each).")
@click.option("--data-port-base", type=click.IntRange(1, 65535), default=None,
              help="Worker i takes activations and gradients on base + i (network.data_port; default: a free "
                   "port each). Fixed ports are what a firewall between machines can open.")
@click.option("--exchange-port-base", type=click.IntRange(1, 65535), default=None,
              help="Worker i takes its partners' outer-step pushes on base + i (network.exchange_port; "
                   "default: a free port each).")
@click.option("--bind-host", default=None, help="Interface the workers bind (network.bind_host; 0.0.0.0: all).")
@click.option("--advertise-host", default=None,
              help="Address other machines reach these workers at (network.advertise_host).")
@model_option
@config_options
def launch(stage: int, nproc: int, redis_url: str | None, name_prefix: str | None, max_restarts: int,
           log_dir: str | None, steps: int | None, metrics_port_base: int | None, data_port_base: int | None,
           exchange_port_base: int | None, bind_host: str | None, advertise_host: str | None,
           model_factory: str | None, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Run NPROC workers of pipeline stage STAGE here, restarting each one that fails."""
    from noloco_rt.commands import effective_config

    cfg = effective_config(config_path, assignments, {
        "network": {"redis_url": redis_url, "bind_host": bind_host, "advertise_host": advertise_host},
        "run": {"steps": steps}, "model": {"factory": model_value(model_factory)}})
    if not cfg.network.redis_url:
        raise click.UsageError("--redis-url (or network.redis_url) is required: workers find each other there")
    if stage >= cfg.pipeline.stages:
        raise click.BadParameter(f"{stage} is not a stage of a {cfg.pipeline.stages}-stage pipeline "
                                 f"(pipeline.stages)", param_hint="--stage")
    bases = {"--metrics-port-base": metrics_port_base, "--data-port-base": data_port_base,
             "--exchange-port-base": exchange_port_base}
    for flag, base in bases.items():
        if base is not None and base + nproc - 1 > 65535:
            raise click.BadParameter(f"{base} + {nproc} workers runs past port 65535", param_hint=flag)
    ranges = sorted((base, base + nproc - 1, flag) for flag, base in bases.items() if base is not None)
    for (_, high, flag), (low, _, other) in zip(ranges, ranges[1:], strict=False):
        if low <= high:
            raise click.BadParameter(f"its ports overlap those of {flag}", param_hint=other)
    for field, flag, base in (("data_port", "--data-port-base", data_port_base),
                              ("exchange_port", "--exchange-port-base", exchange_port_base)):
        if nproc > 1 and base is None and getattr(cfg.network, field):
            raise click.UsageError(f"network.{field} = {getattr(cfg.network, field)} would be the same port for "
                                   f"all {nproc} workers: give {flag} instead (worker i takes base + i)")
        forwarded = f"advertise_{field}"
        if nproc > 1 and getattr(cfg.network, forwarded):
            raise click.UsageError(f"network.{forwarded} = {getattr(cfg.network, forwarded)} would be one public "
                                   f"port for all {nproc} workers: start one worker per forwarded port "
                                   f"(`noloco-rt worker`)")
    check_model(cfg)
    from workers.methods import worker_outer_error

    if (why := worker_outer_error(cfg.outer)) is not None:
        raise click.UsageError(why)
    from noloco_rt.process.startup import process_startup

    prefix = name_prefix or f"{socket.gethostname()}-s{stage}"
    logs = Path(log_dir) if log_dir else Path(cfg.paths.out_dir) / "logs"
    specs = worker_specs(stage=stage, nproc=nproc, prefix=prefix, redis_url=cfg.network.redis_url, steps=steps,
                         metrics_port_base=metrics_port_base, config_path=config_path, assignments=assignments,
                         data_port_base=data_port_base, exchange_port_base=exchange_port_base,
                         hosts={"--bind-host": bind_host, "--advertise-host": advertise_host,
                                "--model": model_value(model_factory)})
    # Fail once, here, rather than in N workers restarted over and over: bad key files, wrong password.
    with process_startup(cfg, zmq_context=False):
        code = _supervise(cfg, stage, specs, logs, max_restarts)
    sys.exit(code)


def _supervise(cfg: Config, stage: int, specs: list[ProcessSpec], logs: Path, max_restarts: int) -> int:
    """Run the workers until they are done or a signal asks them to leave; the supervisor's exit code."""
    from noloco_rt.logs import get_logger
    from workers.supervise.elastic import quiet_torch_elastic_logs
    from workers.supervise.supervisor import RestartPolicy, Supervisor

    # The supervisor reports exits and restarts as structured events; torch's own lines
    # about the same exits would only repeat them in another format.
    quiet_torch_elastic_logs()
    log = get_logger(component="launch", stage=stage)
    supervisor = Supervisor(specs, log_dir=logs, policy=RestartPolicy(max_restarts=max_restarts),
                            grace_s=cfg.worker.leave_grace_s + STOP_MARGIN_S, log=log,
                            preloaded=cfg.worker.forked_start)
    stop = threading.Event()
    received: list[int] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        # Only flag it: logging here could deadlock on a write lock the main thread holds.
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    click.echo(f"worker logs: {logs.resolve()}/<name>.<incarnation>.log (stdout goes to .out)")
    log.info("launch_started", workers=[s.name for s in specs], log_dir=str(logs.resolve()),
             max_restarts=max_restarts, grace_s=supervisor.grace_s)
    code = supervisor.run(stop)
    log.info("launch_done", code=code, signal=signal.Signals(received[0]).name if received else None,
             returncodes=supervisor.stop())
    return code

def worker_specs(*, stage: int, nproc: int, prefix: str, redis_url: str, steps: int | None,
                 metrics_port_base: int | None, config_path: str | None, assignments: tuple[str, ...],
                 data_port_base: int | None = None, exchange_port_base: int | None = None,
                 hosts: dict[str, str | None] | None = None) -> list[ProcessSpec]:
    """One `noloco-rt worker` per local rank; `hosts`: worker flags for all (--bind-host,
    --advertise-host, --model), None ones left out. The Redis URL travels in the environment,
    not on the command line, where `ps` would show its password to every local user."""
    from workers.supervise.supervisor import ProcessSpec

    common = [sys.executable, "-m", "noloco_rt.cli", "worker", "--stage", str(stage)]
    if config_path:
        common += ["--config", str(Path(config_path).resolve())]
    for assignment in assignments:
        if "redis_url" not in parse_assignment(assignment).get("network", {}):  # resolved; sent by env
            common += ["--set", assignment]
    if steps is not None:
        common += ["--steps", str(steps)]
    for flag, value in (hosts or {}).items():
        if value is not None:
            common += [flag, value]
    specs = []
    for rank in range(nproc):
        port = 0 if metrics_port_base is None else metrics_port_base + rank
        name = f"{prefix}-r{rank}"
        ports = [arg for field, base in (("data_port", data_port_base), ("exchange_port", exchange_port_base))
                 if base is not None for arg in ("--set", f"network.{field}={base + rank}")]
        specs.append(ProcessSpec(name=name, args=(*common, *ports, "--name", name, "--metrics-port", str(port)),
                                 env={"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc),
                                      "NOLOCO_NETWORK_REDIS_URL": redis_url}))
    return specs

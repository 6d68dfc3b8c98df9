"""One `noloco-rt up` run once its config is settled (workers/cluster/up.py): start Redis,
the coordinator and the workers under a supervisor, watch them (live table, metrics.jsonl,
curves), shut everything down on the last step or a signal, and build the consensus.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from noloco_rt.commands.shared_options import model_name
from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url
from noloco_rt.curves.scalar_log import open_scalar_log
from noloco_rt.logs import EventLog, get_logger
from noloco_rt.process.lifetime import set_event_from_signal_handler
from workers.cluster.run_curves import WorkerLogCurves
from workers.cluster.run_dir import MetricsLog, read_metrics
from workers.cluster.run_outcome import final_row, incarnation_logs, outer_outcome, worker_summaries
from workers.cluster.run_view import RunSample, WorkerRow, build_sample, log_fields, render_table

if TYPE_CHECKING:
    from noloco_rt.membership.table import Membership
    from workers.supervise.supervisor import ProcessSpec, ProcessStatus, Supervisor

# torch (through the supervisor, the export and the learning-rate schedule), matplotlib,
# redis, zmq and rich's live view are imported where they are used, not here.

COORDINATOR = "coordinator"
EXIT_INTERRUPTED = 130


@dataclasses.dataclass(frozen=True)
class CurvesSettings:
    """Where the run's scalars go (workers/cluster/up.py settles it from the options)."""

    tensorboard: Path | None
    wandb: bool


def _schedule(cfg: Config) -> Callable[[int], float]:
    from noloco_rt.algo.optim import lr_at

    optim, steps = cfg.optim, cfg.run.steps
    return lambda step: lr_at(step, lr=optim.lr, lr_min=optim.lr_min, warmup_steps=optim.warmup_steps_for(steps),
                              total_steps=steps)


def status_port_for(host: str, wanted: int, log: EventLog) -> int:
    """coordinator.status_port when it is free (the README's 8780 by default); otherwise (taken,
    e.g. by another run here, or 0) a free port, with a warning naming both."""
    from noloco_rt.membership.embedded_redis import free_port

    if wanted:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server will
                probe.bind((host, wanted))
            return wanted
        except OSError as exc:
            port = free_port(host)
            log.warning("status_port_taken", wanted=wanted, port=port, error=exc.strerror)
            return port
    return free_port(host)


class UpRun:
    """One `up` invocation: start everything, watch it, shut it down, finalise."""

    def __init__(self, cfg: Config, out: Path, config_file: Path, *, with_coordinator: bool, max_restarts: int,
                 interval_s: float, curves: CurvesSettings | None = None) -> None:
        from workers.cluster.processes import names_by_stage

        self.cfg = cfg
        self.out = out
        self.config_file = config_file
        self.with_coordinator = with_coordinator
        self.max_restarts = max_restarts
        self.interval_s = interval_s
        self.log = get_logger(run=cfg.run.run_id, role="up")
        self.stop = threading.Event()
        self.interrupted = False
        self.names_by_stage = names_by_stage(cfg)
        self.coordinator_port = 0
        self._lr_at = _schedule(cfg)
        self.started = time.time()
        self.curves_settings = curves or CurvesSettings(None, False)
        self.curves: WorkerLogCurves | None = None
        self.last_seen: dict[str, WorkerRow] = {}
        """Each worker's newest row while watching (kept once it left the membership table)."""
        self._earlier_logs: set[Path] = set()
        """Worker logs of an earlier `up` in the same OUT (resumed): not this run's outcome."""

    # -- processes ------------------------------------------------------------------------

    def _coordinator_url(self) -> str:
        """Where this machine reaches the coordinator's page (a wildcard address: loopback)."""
        host = self.cfg.coordinator.status_host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://[{host}]:{self.coordinator_port}" if ":" in host else f"http://{host}:{self.coordinator_port}"

    def _specs(self, redis_url: str) -> list[ProcessSpec]:
        from workers.cluster.processes import child_env, run_command, worker_process_specs
        from workers.supervise.supervisor import ProcessSpec

        specs = worker_process_specs(self.cfg, self.config_file, self.names_by_stage, redis_url)
        if self.with_coordinator:
            self.coordinator_port = status_port_for(self.cfg.coordinator.status_host, self.cfg.coordinator.status_port,
                                                    self.log)
            specs.append(ProcessSpec(name=COORDINATOR, env=child_env(self.cfg, redis_url),
                                     args=run_command(self.config_file, "coordinator", "--status-port",
                                                      str(self.coordinator_port), "--out", str(self.out),
                                                      *self._coordinator_curve_args())))
        return specs

    def _coordinator_curve_args(self) -> list[str]:
        """The coordinator writes its own curves (one writer per process) next to the workers'."""
        settings = self.curves_settings
        return ((["--tensorboard", str(settings.tensorboard / COORDINATOR)] if settings.tensorboard else [])
                + (["--wandb"] if settings.wandb else []))

    def _open_curves(self) -> None:
        settings = self.curves_settings
        scalar_log = open_scalar_log(settings.tensorboard / "workers" if settings.tensorboard else None,
                                     wandb_dir=self.out / "wandb" if settings.wandb else None,
                                     run_name=f"{self.cfg.run.run_id}-workers", file_per_suffix=True)
        if scalar_log is not None:
            self.curves = WorkerLogCurves(self.out / "logs", self.names_by_stage, scalar_log)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.interrupted:  # a second Ctrl-C: stop waiting for graceful exits
            raise KeyboardInterrupt
        self.interrupted = True
        set_event_from_signal_handler(self.stop)

    def run(self) -> int:
        from noloco_rt.membership.embedded_redis import EmbeddedRedis, embedded_redis_password
        from noloco_rt.membership.redis_access import connect_network
        from noloco_rt.membership.table import Membership
        from workers.cluster.processes import supervisor_grace_s
        from workers.supervise.elastic import quiet_torch_elastic_logs
        from workers.supervise.supervisor import RestartPolicy, Supervisor

        quiet_torch_elastic_logs()
        redis = None
        redis_url = self.cfg.network.redis_url
        if not redis_url:
            redis = EmbeddedRedis(password=embedded_redis_password(self.cfg.network)).start()
            redis_url = redis.url
        supervisor = Supervisor(self._specs(redis_url), log_dir=self.out / "logs",
                                policy=RestartPolicy(max_restarts=self.max_restarts),
                                grace_s=supervisor_grace_s(self.cfg), log=self.log,
                                preloaded=self.cfg.worker.forked_start)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.log.info("up_started", stages=self.cfg.pipeline.stages, replicas=self.cfg.pipeline.replicas,
                      steps=self.cfg.run.steps, model=model_name(self.cfg), redis=redact_url(redis_url),
                      out=str(self.out), curve=bool(self.cfg.network.curve_key_dir or self.cfg.network.curve_secret_key),
                      logs=str(self.out / "logs"), tensorboard=str(self.curves_settings.tensorboard or "off"),
                      page=f"{self._coordinator_url()}/" if self.with_coordinator else None,
                      status=f"{self._coordinator_url()}/status" if self.with_coordinator else None)
        metrics = MetricsLog(self.out / "metrics.jsonl")
        self._earlier_logs = set((self.out / "logs").glob("*.log"))
        self._open_curves()  # before the workers start: their log files of earlier runs are skipped
        membership = Membership(connect_network(self.cfg.network, url=redis_url), run_id=self.cfg.run.run_id)
        gave_up = False
        try:
            supervisor.start()
            gave_up = self._watch(supervisor, membership, metrics)
        except KeyboardInterrupt:
            self.interrupted = True
            supervisor.stop(grace_s=0)
        finally:
            codes = supervisor.stop()
            summaries = {name: self._summaries(name) for name in self.names_by_stage}
            final = self._final_sample(supervisor, membership, summaries)  # Redis still up: the last records too
            metrics.write(final.to_json())
            if redis is not None:
                redis.stop()
            self.log.info("processes_stopped", codes=codes)
        try:
            outer, warning = outer_outcome(final.workers, summaries, self.names_by_stage)
            self._finalise(metrics, outer)
            if warning is not None:  # the run's last line, whether or not a consensus could be made
                self.log.warning("outer_steps_unmatched", detail=warning, outer_steps=outer)
        finally:
            metrics.close()
            if self.curves is not None:
                self.curves.close()
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 1 if gave_up else 0

    def _watch(self, supervisor: Supervisor, membership: Membership, metrics: MetricsLog) -> bool:
        """Poll until every worker has finished (or gave up) or we are told to stop; True if one gave up."""
        from rich.console import Console
        from rich.live import Live

        console = Console()
        live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
        seen_evals: set[tuple[str, Any]] = set()
        next_sample = next_line = time.monotonic()
        if live:
            live.start()
        try:
            while not self.stop.is_set():
                supervisor.poll()
                statuses = {s.name: s for s in supervisor.statuses()}
                workers = [statuses[n] for n in self.names_by_stage if n in statuses]
                if workers and all(s.state in ("finished", "failed") for s in workers):
                    return any(s.state == "failed" for s in workers)
                if time.monotonic() >= next_sample:
                    next_sample = time.monotonic() + self.interval_s
                    coordinator_status = self._coordinator_status()
                    sample = self._sample(statuses, membership, self.last_seen, coordinator_status)
                    metrics.write(sample.to_json())
                    self._record_coordinator(coordinator_status, seen_evals, metrics)
                    if self.curves is not None:
                        self.curves.poll()
                    if live:
                        live.update(render_table(sample, title=f"noloco-rt up: run {self.cfg.run.run_id} "
                                                               f"({self.out})"))
                    elif time.monotonic() >= next_line:
                        next_line = time.monotonic() + max(10.0, self.interval_s)
                        self.log.info("progress", **log_fields(sample))
                self.stop.wait(0.2)
            return False
        finally:
            if live:
                live.stop()

    def _sample(self, statuses: dict[str, ProcessStatus], membership: Membership, last_seen: dict[str, Any],
                coordinator_status: dict[str, Any] | None) -> RunSample:
        coordinator_state = "off" if not self.with_coordinator else (
            "ok" if coordinator_status else getattr(statuses.get(COORDINATOR), "state", "?"))
        return build_sample(now=time.time(), started=self.started, steps=self.cfg.run.steps,
                            names_by_stage=self.names_by_stage, processes=statuses,
                            records=membership.live_members(stage=None, states=None), last_seen=last_seen,
                            coordinator_status=coordinator_status, coordinator_state=coordinator_state,
                            redis_up=membership.redis_available)

    def _coordinator_status(self) -> dict[str, Any] | None:
        if not self.with_coordinator:
            return None
        try:
            with urllib.request.urlopen(f"{self._coordinator_url()}/status", timeout=0.5) as reply:
                return json.loads(reply.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None  # not up yet, restarting, or busy: the next sample will tell

    @staticmethod
    def _record_coordinator(status: dict[str, Any] | None, seen: set[tuple[str, Any]], metrics: MetricsLog) -> None:
        """Each new evaluation and spread measurement of the coordinator, once, into metrics.jsonl."""
        if not status:
            return
        for kind, key in (("eval", "last_eval"), ("spread", "last_spread")):
            result = status.get(key)
            if result and (kind, result.get("time")) not in seen:
                seen.add((kind, result.get("time")))
                metrics.write({"kind": kind, "source": "coordinator", **result})

    # -- the end ---------------------------------------------------------------------------

    def _summaries(self, name: str) -> list[dict[str, Any]]:
        """The worker_summary lines of this run's incarnations of `name`, oldest first."""
        return worker_summaries(p for p in incarnation_logs(self.out / "logs", name) if p not in self._earlier_logs)

    def _final_sample(self, supervisor: Supervisor, membership: Membership,
                      summaries: dict[str, list[dict[str, Any]]]) -> RunSample:
        """The run as it ended: a last sample, each worker's row completed from its summary lines."""
        sample = self._sample({s.name: s for s in supervisor.statuses()}, membership, self.last_seen, None)
        sample.workers = [final_row(row, summaries.get(row.name, [])) for row in sample.workers]
        sample.extra["final"] = True
        return sample

    def _finalise(self, metrics: MetricsLog, outer: str) -> None:
        """Consensus of the workers' last checkpoints: written, scored, plotted; the closing
        line reports outer steps by kind per stage (`outer`)."""
        from noloco_rt.consensus.file import ExportError
        from noloco_rt.consensus.scored import consensus_of_checkpoints, scoring_device
        from noloco_rt.curves.png import plot_distributed_run

        checkpoint_dir = Path(self.cfg.paths.checkpoint_dir or self.out / "checkpoints")
        path = self.out / "consensus.safetensors"
        try:
            final = consensus_of_checkpoints(self.cfg, checkpoint_dir, path, source="final checkpoints",
                                             device=scoring_device()).to_json()  # the workers have exited
        except ExportError as exc:
            self.log.warning("no_consensus", reason=str(exc), outer_steps=outer)
            return
        metrics.write({"kind": "final", **final})
        if self.curves is not None:
            self.curves.final(final)
        plot_distributed_run(read_metrics(self.out / "metrics.jsonl"), self.out / "curves.png",
                             title=f"noloco-rt up: {self.cfg.pipeline.stages} stages × "
                                   f"{self.cfg.pipeline.replicas} replicas, {model_name(self.cfg)}",
                             lr=self._lr_at, total_steps=self.cfg.run.steps, outer_every=self.cfg.outer.resolved().h)
        self.log.info("up_done", step=final["step"], val_loss=round(final["val_loss"], 4),
                      val_ppl=round(final["val_ppl"], 3), spread=f"{final['spread']:.3e}", outer_steps=outer,
                      consensus=str(path), curves=str(self.out / "curves.png"),
                      elapsed_s=round(time.time() - self.started, 1),
                      next=next_commands(self.cfg, path))


def next_commands(cfg: Config, path: Path) -> str:
    """What to run on the consensus, naming the model code and data the run used (a consensus
    file never picks them itself)."""
    if cfg.model.factory and cfg.model.hf_folder is None:
        return f"noloco-rt eval {path} --model {cfg.model.factory}"
    data = "".join(f" --data {shlex.quote(p)}" for p in cfg.data.paths) if cfg.data.source != "stdlib" else ""
    if cfg.model.factory:  # a Hugging Face folder: named, as the data is
        data += f" --model {shlex.quote(cfg.model.factory)}"
    prompt = "'def '" if cfg.data.source == "stdlib" else "'The '"
    return f"noloco-rt eval {path}{data}; noloco-rt sample {path}{data} --prompt {prompt}"

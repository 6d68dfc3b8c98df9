"""The driver of one `noloco-rt chaos` phase: starts the cluster, applies the fault
schedule while it trains, stops it once every worker reached its steps.

It follows the workers through their JSON logs (read as they grow) and the supervisor's
exit events, and re-checks before each fault that its target is still a fair one (running,
online, not already faulted, not the last live worker of its stage).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from noloco_rt.checkpoints.worker import CheckpointError, load_checkpoint
from noloco_rt.config import Config
from noloco_rt.logs import get_logger
from noloco_rt.membership.embedded_redis import EmbeddedRedis, embedded_redis_password, free_port
from noloco_rt.membership.redis_access import connect
from workers.cluster.chaos_faults import FullDisk, HeldClusterFault, Partitions
from workers.cluster.chaos_progress import WorkerLogFollower
from workers.cluster.chaos_report import (
    injected_network_faults,
    largest_progress_gap_s,
    mean_kept,
    microbatch_accounting,
    not_rejoined,
    observed_counts,
    read_logs,
    unexpected_exits,
)
from workers.cluster.chaos_schedule import Fault
from workers.cluster.processes import (
    child_env,
    names_by_stage,
    run_command,
    supervisor_grace_s,
    worker_process_specs,
)
from workers.faults import netns
from workers.supervise.supervisor import ProcessSpec, RestartPolicy, Supervisor, SupervisorEvent

TICK_S = 0.1
CHECKPOINT_CHECK_EVERY_S = 2.0
RETRY_SKIPPED_S = 1.0
COORDINATOR = "coordinator"
CHECKPOINT_TMPFS_MB = 256
"""The tmpfs of a run with disk_full faults: room for every checkpoint of a small preset and its temporary."""
STATUS_TIMEOUT_S = 5.0


class ChaosDriver:
    """Starts the cluster, applies the schedule while it trains, stops it at target_steps."""

    def __init__(self, cfg: Config, out: Path, config_file: Path, target_steps: int, schedule: list[Fault],
                 timeout_s: float, *, extra_env: dict[str, str] | None = None, min_faults: int = 0) -> None:
        self.min_faults = min_faults
        """Train on past target_steps (up to the workers' own run.steps) until this many faults were injected."""
        self.extra_env = extra_env or {}
        """Added to every worker's environment (data-path loss and delay for the faulty phase)."""
        self.cfg = cfg
        self.out = out
        self.config_file = config_file
        self.target_steps = target_steps
        self.pending = sorted(schedule, key=lambda f: f.at_s)
        self.scheduled_kinds = sorted({f.kind for f in schedule})
        self.timeout_s = timeout_s
        self.log = get_logger(run=cfg.run.run_id, role="chaos")
        self.names = names_by_stage(cfg)
        self.checkpoint_dir = out / "checkpoints"
        self.progress = WorkerLogFollower(out / "logs", target_steps)
        self.injected: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.exits: list[dict[str, Any]] = []
        self.caused: set[tuple[str, int]] = set()
        self.awaiting_respawn: set[str] = set()
        self.stopped: dict[str, tuple[float, dict[str, Any]]] = {}
        self.redis_down: tuple[float, dict[str, Any]] | None = None
        self.checkpoint_loads = 0
        self.checkpoint_failures: list[str] = []
        self.timed_out = False
        kinds = set(self.scheduled_kinds)
        self.partitions = Partitions(self.names) if "partition" in kinds else None
        self.disk = FullDisk(self.checkpoint_dir, CHECKPOINT_TMPFS_MB) if "disk_full" in kinds else None
        self.held = HeldClusterFault(self.names, self.partitions, self.disk, cfg.run.seed)
        self.flushed_at: float | None = None
        """Wall time of a FLUSHALL no worker has re-registered after yet (the run waits for one)."""
        self.with_coordinator = "coordinator_sigstop" in kinds
        self.coordinator_port = 0

    def run(self) -> None:
        if self.partitions is not None:
            # Every worker in its own network namespace, Redis in the hub between them (this
            # process reaches it by its Unix socket).
            self.partitions.create()
            self.redis = EmbeddedRedis(host=netns.SERVICE_IP, port=6379, prefix=netns.hub_prefix(),
                                       password=embedded_redis_password(self.cfg.network)).start()
            workers_url = self.redis.tcp_url
        else:
            self.redis = EmbeddedRedis(password=embedded_redis_password(self.cfg.network)).start()
            workers_url = self.redis.url
        if self.disk is not None:
            self.disk.mount()
        try:
            self._run(workers_url)
        finally:
            if self.disk is not None:
                self.disk.unmount_keeping_files()
            if self.partitions is not None:
                self.partitions.close()
        self.check_checkpoints()

    def _specs(self, workers_url: str) -> list[ProcessSpec]:
        hosts = None
        if self.partitions is not None:
            hosts = {name: (self.partitions.prefix(name), self.partitions.address(name)) for name in self.names}
        specs = worker_process_specs(self.cfg, self.config_file, self.names, workers_url, extra_env=self.extra_env,
                                     hosts=hosts)
        if self.with_coordinator:
            self.coordinator_port = free_port()
            specs.append(ProcessSpec(name=COORDINATOR, env=child_env(self.cfg, self.redis.url),
                                     args=run_command(self.config_file, "coordinator", "--status-port",
                                                      str(self.coordinator_port), "--out", str(self.out))))
        return specs

    def _run(self, workers_url: str) -> None:
        specs = self._specs(workers_url)
        # Quick restarts, and enough of them for a long run's kills and preemptions.
        policy = RestartPolicy(max_restarts=1000, backoff_initial_s=0.5, backoff_max_s=2.0)
        self.supervisor = Supervisor(specs, log_dir=self.out / "logs", policy=policy,
                                     grace_s=supervisor_grace_s(self.cfg), log=self.log,
                                     preloaded=self.cfg.worker.forked_start)
        deadline = time.monotonic() + self.timeout_s
        next_check = time.monotonic()
        try:
            self.supervisor.start()
            while not self._done():
                if time.monotonic() > deadline:
                    self.timed_out = True
                    self.log.error("chaos_timed_out", timeout_s=self.timeout_s, reached=self.progress.reached)
                    break
                self._on_events(self.supervisor.poll())
                self._read_logs()
                if self.progress.train_started is not None:
                    self._apply_due(time.monotonic() - self.progress.train_started)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CHECKPOINT_CHECK_EVERY_S
                    self.check_checkpoints()
                time.sleep(TICK_S)  # the pace of a polling loop; every wait above has a condition
        finally:
            for name in list(self.stopped):
                self._resume(name)
            if self.redis_down is not None:
                self._redis_back()
            self.held.undo()
            self.supervisor.stop()
            self.redis.stop()

    # -- progress -------------------------------------------------------------------------

    def _done(self) -> bool:
        """Every worker logged target_steps, no fault is still in effect, every worker we
        killed or preempted has come back online, and every running incarnation has come
        online (so a last restart is seen to rejoin)."""
        if not self._all_reached():
            return False
        if (any(f.kind in self._kinds_not_seen() for f in self.pending) or self._faults_owed()) \
                and not self._all_finishing():
            return False  # the workers train on (to twice the steps) until every kind has fired
        if self.stopped or self.redis_down is not None or self.awaiting_respawn or self.held.active \
                or (self.flushed_at is not None and not self._all_finishing()):
            return False
        # The supervisor notices a SIGKILL only at its next poll: until then the killed
        # incarnation still looks running and online, and the run would end unrecovered.
        if any((name, incarnation + 1) not in self.progress.online for name, incarnation in self.caused):
            return False
        return all((s.name, s.incarnation) in self.progress.online for s in self.supervisor.statuses()
                   if s.state == "running" and s.name in self.names)

    def _all_finishing(self) -> bool:
        """Every worker's current incarnation logged its steps done: no fault can land any more."""
        return all((s.name, s.incarnation) in self.progress.steps_done for s in self.supervisor.statuses()
                   if s.name in self.names)

    def _faults_owed(self) -> bool:
        return len(self.injected) < self.min_faults and bool(self.pending)

    def _kinds_not_seen(self) -> set[str]:
        return set(self.scheduled_kinds) - {f["kind"] for f in self.injected}

    def _all_reached(self) -> bool:
        return self.progress.all_reached(list(self.names))

    def _read_logs(self) -> None:
        self.progress.read()
        if self.flushed_at is not None and self.progress.reregistered_since(self.flushed_at):
            self.flushed_at = None

    def _on_events(self, events: list[SupervisorEvent]) -> None:
        for event in events:
            if event.kind != "exited":
                continue
            self.exits.append({"name": event.name, "incarnation": event.incarnation,
                               "returncode": event.returncode, "time": time.time()})
            if event.name in self.awaiting_respawn and event.returncode == 0:
                self.awaiting_respawn.discard(event.name)
                self.supervisor.respawn(event.name)  # the preempted machine's replacement

    # -- faults ---------------------------------------------------------------------------

    def _apply_due(self, now_s: float) -> None:
        for name, (until, _) in list(self.stopped.items()):
            if time.monotonic() >= until:
                self._resume(name)
        if self.redis_down is not None and time.monotonic() >= self.redis_down[0]:
            self._redis_back()
        full_since = self.held.record.get("wall") if self.held.record is not None else None
        self.held.undo_due(time.monotonic(),
                           write_failed=full_since is not None and self.progress.write_failed_since(full_since))
        while self.pending and self.pending[0].at_s <= now_s:
            fault = self.pending.pop(0)
            # Once every worker is there only a kind not yet seen is injected (a fast run can
            # get there before the first pass is over); the recoveries are awaited.
            if not self._all_reached() or fault.kind in self._kinds_not_seen() or self._faults_owed():
                self._inject(fault)

    def _inject(self, fault: Fault) -> None:
        record = {**fault.to_json(), "wall": time.time()}
        if fault.kind == "redis_restart":
            if self.redis_down is not None or self.held.active:
                self._skip(record, "Redis already down" if self.redis_down is not None
                           else "another fault of the whole cluster is in effect")
                return
            self.redis.stop()
            self.redis_down = (time.monotonic() + fault.hold_s, record)
            self.injected.append(record)
            self.log.info("chaos_fault", **record)
            return
        if fault.kind in ("redis_flush", "partition", "disk_full"):
            self._inject_cluster_fault(fault, record)
            return
        statuses = {s.name: s for s in self.supervisor.statuses()}
        status = statuses[fault.target]
        # The schedule assumed recovery within --recover; re-check what is true now.
        online = (fault.target, status.incarnation) in self.progress.online or fault.target == COORDINATOR  # never a member
        if status.state != "running" or status.pid is None or not online:
            self._skip(record, f"target {status.state}, not yet online" if status.state == "running"
                       else f"target {status.state}", fault)
            return
        if fault.target in self.stopped or fault.target in self.awaiting_respawn:
            self._skip(record, "target already faulted", fault)
            return
        if fault.kind == "coordinator_sigstop":
            self._stop_process(fault, record, status)
            return
        if (fault.target, status.incarnation) in self.progress.steps_done:  # its exit, not the fault's effect, comes next
            self._skip(record, "target finishing its steps", fault)
            return
        stage = self.names.get(fault.target)
        healthy = [s for n, s in statuses.items() if self.names.get(n) == stage and n != fault.target
                   and s.state == "running" and (n, s.incarnation) in self.progress.online and n not in self.stopped]
        if not healthy:
            self._skip(record, f"no other live worker in stage {stage}", fault)
            return
        record["incarnation"] = status.incarnation
        record["pid"] = status.pid
        if fault.kind == "sigkill":
            self.caused.add((fault.target, status.incarnation))
            os.kill(status.pid, signal.SIGKILL)
        elif fault.kind == "sigterm":
            self.caused.add((fault.target, status.incarnation))
            self.awaiting_respawn.add(fault.target)
            os.kill(status.pid, signal.SIGTERM)
        else:
            self._stop_process(fault, record, status)
            return
        self.injected.append(record)
        self.log.info("chaos_fault", **record)

    def _stop_process(self, fault: Fault, record: dict[str, Any], status: Any) -> None:
        record["incarnation"] = status.incarnation
        record["pid"] = status.pid
        os.kill(status.pid, signal.SIGSTOP)
        self.stopped[fault.target] = (time.monotonic() + fault.hold_s, record)
        self.injected.append(record)
        self.log.info("chaos_fault", **record)

    def _inject_cluster_fault(self, fault: Fault, record: dict[str, Any]) -> None:
        if self.redis_down is not None or self.held.active:
            self._skip(record, "another fault of the whole cluster is in effect", fault)
            return
        if fault.kind == "redis_flush":
            with connect(self.redis.url) as client:
                client.flushall()  # every record, mark and queue: a Redis that lost its data
            self.flushed_at = record["wall"]
        elif fault.kind == "partition":
            if (why := self.held.split(fault.hold_s, record, time.monotonic())) is not None:
                self._skip(record, why)
                return
        else:
            self.held.fill(fault.hold_s, record, time.monotonic())
        self.injected.append(record)
        self.log.info("chaos_fault", **record)

    def not_injected(self) -> dict[str, str]:
        """Scheduled kinds that never fired, each with why: a run that ends first shows it."""
        missing: dict[str, str] = {}
        for kind in self.scheduled_kinds:
            if any(f["kind"] == kind for f in self.injected):
                continue
            due = [f.at_s for f in self.pending if f.kind == kind]
            skips = [f["skipped"] for f in self.skipped if f["kind"] == kind]
            missing[kind] = (f"training ended before its turn at {min(due)} s" if due else "") + \
                (f"; skipped: {skips[-1]}" if skips else "")
        return missing

    def _skip(self, record: dict[str, Any], reason: str, fault: Fault | None = None) -> None:
        if fault is not None and self.progress.train_started is not None and \
                not any(f["kind"] == fault.kind for f in self.injected):
            # A kind not seen yet is tried again shortly, so that a short run still sees every kind.
            retry_at = time.monotonic() - self.progress.train_started + RETRY_SKIPPED_S
            self.pending.append(dataclasses.replace(fault, at_s=round(retry_at, 3)))
            self.pending.sort(key=lambda f: f.at_s)
        record["skipped"] = reason
        self.skipped.append(record)
        self.log.info("chaos_fault_skipped", **record)

    def _resume(self, name: str) -> None:
        _, record = self.stopped.pop(name)
        try:
            os.kill(record["pid"], signal.SIGCONT)
        except ProcessLookupError:
            return
        record["resumed_wall"] = time.time()
        if name == COORDINATOR:  # its effect: it serves /status again
            record["status_after"] = self._status_answers()

    def _status_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.coordinator_port}/status",
                                        timeout=STATUS_TIMEOUT_S) as response:
                return response.status == 200
        except OSError:
            return False

    def _redis_back(self) -> None:
        assert self.redis_down is not None
        _, record = self.redis_down
        self.redis.start()
        record["resumed_wall"] = time.time()
        self.redis_down = None

    # -- checkpoints ----------------------------------------------------------------------

    def check_checkpoints(self) -> None:
        """Load every checkpoint on disk: none may ever be unreadable (writes are atomic)."""
        for path in sorted(self.checkpoint_dir.glob("*.pt")):
            stage = self.names.get(path.stem)
            if stage is None:
                continue
            try:
                load_checkpoint(path, run_id=self.cfg.run.run_id, stage=stage)
            except FileNotFoundError:
                continue  # replaced between glob and open: the rename is atomic, the next check sees it
            except CheckpointError as exc:
                self.checkpoint_failures.append(str(exc))
            self.checkpoint_loads += 1

    def summary(self) -> dict[str, Any]:
        logs = read_logs(self.out / "logs")
        accounting = microbatch_accounting(logs, [n for n, s in self.names.items() if s == 0])
        return {"injected": self.injected, "skipped": self.skipped, "exits": self.exits,
                "not_injected": self.not_injected(),
                "observed": observed_counts(self.injected, logs, self.exits),
                "largest_progress_gap_s": round(largest_progress_gap_s(logs), 2),
                "unexpected_exits": unexpected_exits(self.exits, self.caused),
                "not_rejoined": not_rejoined({k: v for k, v in logs.items() if k[0] in self.names}),
                "mean_kept": mean_kept(logs),
                "accounting": dataclasses.asdict(accounting),
                "checkpoint_loads": self.checkpoint_loads, "checkpoint_failures": self.checkpoint_failures,
                "timed_out": self.timed_out, "reached": self.progress.reached,
                "network_faults": injected_network_faults(logs)}

"""`noloco-rt chaos`: train a local cluster while injecting faults, then check the invariants.

A cluster like `noloco-rt up` (real Redis, S × R real worker processes under the
supervisor; no coordinator, no live view) trains while a seeded schedule
(workers/cluster/chaos_schedule.py) SIGKILLs workers (the supervisor restarts them),
SIGTERMs them (a preemption: they leave gracefully and the driver starts them again),
SIGSTOPs them for a while, and stops Redis for a while. With --baseline the same
cluster first runs without faults. Then: consensus of the final checkpoints, scored,
and the invariants (workers/cluster/chaos_report.py), in a table and OUT/chaos.json.

Workers are given twice --steps and the run stops when every worker has logged
--steps: a restarted worker redoes the steps since its last checkpoint and needs live
peers downstream and upstream to do so; peers that had exited at exactly --steps would
leave it stalled forever. The baseline runs the same way, so the losses compare.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from noloco_rt.cli import config_options
from noloco_rt.net.transport import DATA_DELAY_ENV, DATA_LOSS_ENV
from workers.cluster.chaos_schedule import FAULT_KINDS, Fault, build_schedule

# Fast failure detection and recovery, so that a short run sees every fault recovered.
CHAOS_SETTINGS = {"outer.h": 5, "pipeline.max_inflight": 2, "worker.heartbeat_interval_s": 0.25,
                  "worker.deadline_floor_s": 1.0, "worker.deadline_ceiling_s": 5.0,
                  "worker.exchange_timeout_s": 3.0, "worker.leave_grace_s": 6.0, "run.eval_batches": 4,
                  "run.log_format": "json"}
TICK_S = 0.1
CHECKPOINT_CHECK_EVERY_S = 2.0
RETRY_SKIPPED_S = 1.0


@click.command()
@click.option("--steps", type=click.IntRange(min=1), default=80, show_default=True,
              help="Inner steps every worker must reach.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fault schedule and run seed (run.seed).")
@click.option("--every", "every_s", type=click.FloatRange(min=0.5), default=3.0, show_default=True,
              help="Seconds between faults.")
@click.option("--kinds", default=",".join(FAULT_KINDS), show_default=True, help="Fault kinds, comma-separated.")
@click.option("--hold", "hold_s", type=click.FloatRange(min=0.0), default=3.0, show_default=True,
              help="SIGSTOP length and Redis outage length, seconds.")
@click.option("--recover", "recover_s", type=click.FloatRange(min=0.0), default=8.0, show_default=True,
              help="Seconds a killed or preempted worker counts as down when placing faults.")
@click.option("--stages", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--replicas", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/chaos", show_default=True,
              help="Run directory; its baseline/ and faulty/ are replaced.")
@click.option("--stall-bound", "stall_bound_s", type=click.FloatRange(min=0.0), default=30.0, show_default=True,
              help="Largest allowed gap between train_progress lines of the whole run, seconds.")
@click.option("--baseline", is_flag=True, help="First run the same cluster without faults.")
@click.option("--baseline-from", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Take the baseline from this earlier chaos.json instead.")
@click.option("--net-loss", type=click.FloatRange(0.0, 0.5), default=0.0, show_default=True,
              help="Fraction of data-path messages every worker loses (faulty phase).")
@click.option("--net-delay-ms", type=click.FloatRange(0.0, 1000.0), default=0.0, show_default=True,
              help="Delay added to every data-path send (faulty phase).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1.0), default=900.0, show_default=True,
              help="Give up on a phase after this many seconds (an invariant failure).")
@config_options
def chaos(steps: int, seed: int, every_s: float, kinds: str, hold_s: float, recover_s: float, stages: int,
          replicas: int, out_dir: str, stall_bound_s: float, baseline: bool, baseline_from: str | None,
          net_loss: float, net_delay_ms: float, timeout_s: float, config_path: str | None,
          assignments: tuple[str, ...]) -> None:
    """Train under injected faults; exit 0 if every invariant held, 1 otherwise (named)."""
    from noloco_rt.commands import effective_config
    from noloco_rt.logs import configure_logging
    from workers.supervise.elastic import quiet_torch_elastic_logs

    wanted = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = sorted(set(wanted) - set(FAULT_KINDS))
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(FAULT_KINDS)}",
                                 param_hint="--kinds")
    defaults = [f"{key}={value}" for key, value in CHAOS_SETTINGS.items()]
    out = Path(out_dir)
    cfg = effective_config(config_path, [*defaults, *assignments], {
        "pipeline": {"stages": stages, "replicas": replicas}, "run": {"steps": 2 * steps, "seed": seed}})
    configure_logging(cfg.run.log_format)
    quiet_torch_elastic_logs()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"steps": steps, "seed": seed, "every_s": every_s, "kinds": list(wanted),
                              "hold_s": hold_s, "recover_s": recover_s, "stall_bound_s": stall_bound_s,
                              "stages": stages, "replicas": replicas, "net_loss": net_loss,
                              "net_delay_ms": net_delay_ms}
    baseline_loss = None
    if baseline_from:
        previous = json.loads(Path(baseline_from).read_text())
        if (previous.get("steps"), previous.get("seed")) != (steps, seed) or not previous.get("baseline"):
            raise click.BadParameter(f"{baseline_from} holds no baseline of --steps {steps} --seed {seed}",
                                     param_hint="--baseline-from")
        report["baseline"] = previous["baseline"]
    elif baseline:
        report["baseline"] = run_phase(cfg, out / "baseline", steps, [], stall_bound_s, timeout_s)
    if report.get("baseline"):
        baseline_loss = report["baseline"].get("val_loss")
    names = names_by_stage(cfg)
    schedule = build_schedule(seed, timeout_s, every_s, names, wanted, hold_s=hold_s, recover_s=recover_s)
    network_faults = {DATA_LOSS_ENV: str(net_loss), DATA_DELAY_ENV: str(net_delay_ms)} \
        if net_loss or net_delay_ms else {}
    report["faulty"] = run_phase(cfg, out / "faulty", steps, schedule, stall_bound_s, timeout_s,
                                 extra_env=network_faults)
    report["invariants"] = invariants(report["faulty"], cfg, stall_bound_s, baseline_loss)
    report["failed"] = [name for name, check in report["invariants"].items() if not check["ok"]]
    (out / "chaos.json").write_text(json.dumps(report, indent=2, default=str))
    click.echo(render(report))
    sys.exit(1 if report["failed"] else 0)


def names_by_stage(cfg: Any) -> dict[str, int]:
    return {f"s{k}-r{j}": k for k in range(cfg.pipeline.stages) for j in range(cfg.pipeline.replicas)}


def run_phase(cfg: Any, out: Path, target_steps: int, schedule: list[Fault], stall_bound_s: float,
              timeout_s: float, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One cluster from scratch to every worker at target_steps, under `schedule`."""
    from workers.cluster.run_dir import prepare_run_dir

    if out.exists():
        shutil.rmtree(out)  # a phase always starts fresh: stale checkpoints would be resumed
    cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, out_dir=str(out), checkpoint_dir=""))
    config_file = prepare_run_dir(out, cfg)
    driver = ChaosDriver(cfg, out, config_file, target_steps, schedule, timeout_s, extra_env=extra_env)
    started = time.monotonic()
    driver.run()
    result = driver.summary()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result.update(finalise(cfg, out))
    return result


class ChaosDriver:
    """Starts the cluster, applies the schedule while it trains, stops it at target_steps."""

    def __init__(self, cfg: Any, out: Path, config_file: Path, target_steps: int, schedule: list[Fault],
                 timeout_s: float, *, extra_env: dict[str, str] | None = None) -> None:
        from noloco_rt.logs import get_logger

        self.extra_env = extra_env or {}
        """Added to every worker's environment (data-path loss and delay for the faulty phase)."""
        self.cfg = cfg
        self.out = out
        self.config_file = config_file
        self.target_steps = target_steps
        self.pending = sorted(schedule, key=lambda f: f.at_s)
        self.timeout_s = timeout_s
        self.log = get_logger(run=cfg.run.run_id, role="chaos")
        self.names = names_by_stage(cfg)
        self.checkpoint_dir = out / "checkpoints"
        self.tails: dict[Path, int] = {}
        self.reached: dict[str, int] = {}
        self.online: set[tuple[str, int]] = set()
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
        self.train_started: float | None = None

    def run(self) -> None:
        from noloco_rt.membership.embedded_redis import EmbeddedRedis
        from workers.cluster.up import worker_process_specs
        from workers.supervise.supervisor import RestartPolicy, Supervisor

        self.redis = EmbeddedRedis().start()
        specs = worker_process_specs(self.cfg, self.config_file, self.names, self.redis.url,
                                     extra_env=self.extra_env)
        # Quick restarts, and enough of them for a long run's kills and preemptions.
        policy = RestartPolicy(max_restarts=1000, backoff_initial_s=0.5, backoff_max_s=2.0)
        self.supervisor = Supervisor(specs, log_dir=self.out / "logs", policy=policy,
                                     grace_s=self.cfg.worker.leave_grace_s + 5.0, log=self.log)
        deadline = time.monotonic() + self.timeout_s
        next_check = time.monotonic()
        try:
            self.supervisor.start()
            while not self._done():
                if time.monotonic() > deadline:
                    self.timed_out = True
                    self.log.error("chaos_timed_out", timeout_s=self.timeout_s, reached=self.reached)
                    break
                self._on_events(self.supervisor.poll())
                self._read_logs()
                if self.train_started is not None:
                    self._apply_due(time.monotonic() - self.train_started)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CHECKPOINT_CHECK_EVERY_S
                    self.check_checkpoints()
                time.sleep(TICK_S)  # the pace of a polling loop; every wait above has a condition
        finally:
            for name in list(self.stopped):
                self._resume(name)
            if self.redis_down is not None:
                self._redis_back()
            self.supervisor.stop()
            self.redis.stop()
        self.check_checkpoints()

    # -- progress -------------------------------------------------------------------------

    def _done(self) -> bool:
        """Every worker logged target_steps, no fault is still in effect, and every running
        incarnation has come online (so a last restart is seen to rejoin)."""
        if not self._all_reached():
            return False
        if self.stopped or self.redis_down is not None or self.awaiting_respawn:
            return False
        return all((s.name, s.incarnation) in self.online for s in self.supervisor.statuses()
                   if s.state == "running")

    def _all_reached(self) -> bool:
        return all(self.reached.get(name, 0) >= self.target_steps for name in self.names)

    def _read_logs(self) -> None:
        for path in (self.out / "logs").glob("*.log"):
            offset = self.tails.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits
            self.tails[path] = offset + len(complete)
            name, _, incarnation = path.name[:-len(".log")].rpartition(".")
            for line in complete.decode(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                event = record.get("event")
                if event == "member_online":
                    self.online.add((name, int(incarnation)))
                if isinstance(record.get("inner_step"), int) and event in (
                        "train_progress", "steps_done", "checkpoint_written"):
                    self.reached[name] = max(self.reached.get(name, 0), record["inner_step"])
                if event == "train_progress" and self.train_started is None:
                    self.train_started = time.monotonic()  # the schedule's clock starts with training

    def _on_events(self, events: list[Any]) -> None:
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
        if self._all_reached():
            return  # nothing new once every worker is there: only the recoveries are awaited
        while self.pending and self.pending[0].at_s <= now_s:
            self._inject(self.pending.pop(0))

    def _inject(self, fault: Fault) -> None:
        record = {**fault.to_json(), "wall": time.time()}
        if fault.kind == "redis_restart":
            if self.redis_down is not None:
                self._skip(record, "Redis already down")
                return
            self.redis.stop()
            self.redis_down = (time.monotonic() + fault.hold_s, record)
            self.injected.append(record)
            self.log.info("chaos_fault", **record)
            return
        statuses = {s.name: s for s in self.supervisor.statuses()}
        status = statuses[fault.target]
        # The schedule assumed recovery within --recover; re-check what is true now.
        if status.state != "running" or status.pid is None or (fault.target, status.incarnation) not in self.online:
            self._skip(record, f"target {status.state}, not yet online" if status.state == "running"
                       else f"target {status.state}", fault)
            return
        if fault.target in self.stopped or fault.target in self.awaiting_respawn:
            self._skip(record, "target already faulted", fault)
            return
        stage = self.names[fault.target]
        healthy = [s for n, s in statuses.items() if self.names[n] == stage and n != fault.target
                   and s.state == "running" and (n, s.incarnation) in self.online and n not in self.stopped]
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
            os.kill(status.pid, signal.SIGSTOP)
            self.stopped[fault.target] = (time.monotonic() + fault.hold_s, record)
        self.injected.append(record)
        self.log.info("chaos_fault", **record)

    def _skip(self, record: dict[str, Any], reason: str, fault: Fault | None = None) -> None:
        if fault is not None and self.train_started is not None and \
                not any(f["kind"] == fault.kind for f in self.injected):
            # A kind not seen yet is tried again shortly, so that a short run still sees every kind.
            retry_at = time.monotonic() - self.train_started + RETRY_SKIPPED_S
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

    def _redis_back(self) -> None:
        assert self.redis_down is not None
        _, record = self.redis_down
        self.redis.start()
        record["resumed_wall"] = time.time()
        self.redis_down = None

    # -- checkpoints ----------------------------------------------------------------------

    def check_checkpoints(self) -> None:
        """Load every checkpoint on disk: none may ever be unreadable (writes are atomic)."""
        from noloco_rt.checkpoint import CheckpointError, load_checkpoint

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
        from workers.cluster.chaos_report import (
            injected_network_faults,
            largest_progress_gap_s,
            microbatch_accounting,
            not_rejoined,
            observed_counts,
            read_logs,
            unexpected_exits,
        )

        logs = read_logs(self.out / "logs")
        accounting = microbatch_accounting(logs, [n for n, s in self.names.items() if s == 0])
        return {"injected": self.injected, "skipped": self.skipped, "exits": self.exits,
                "observed": observed_counts(self.injected, logs, self.exits),
                "largest_progress_gap_s": round(largest_progress_gap_s(logs), 2),
                "unexpected_exits": unexpected_exits(self.exits, self.caused),
                "not_rejoined": not_rejoined(logs),
                "accounting": dataclasses.asdict(accounting),
                "checkpoint_loads": self.checkpoint_loads, "checkpoint_failures": self.checkpoint_failures,
                "timed_out": self.timed_out, "reached": self.reached,
                "network_faults": injected_network_faults(logs)}


def finalise(cfg: Any, out: Path) -> dict[str, Any]:
    """Consensus of the final checkpoints, scored on the validation split (as `up` does)."""
    from noloco_rt.export import ExportError
    from workers.cluster.run_dir import consensus_of_final_checkpoints

    try:
        final = consensus_of_final_checkpoints(cfg, out / "checkpoints", out / "consensus.safetensors",
                                               source="final checkpoints (chaos)")
    except ExportError as exc:
        return {"val_loss": None, "consensus_error": str(exc)}
    return {"val_loss": final["val_loss"], "consensus_step": final["step"], "consensus": final["consensus"]}


def invariants(phase: dict[str, Any], cfg: Any, stall_bound_s: float,
               baseline_loss: float | None) -> dict[str, dict[str, Any]]:
    from workers.cluster.chaos_report import loss_ratio_check

    accounting = phase["accounting"]
    ratio, loss_ok = loss_ratio_check(phase.get("val_loss"), baseline_loss)
    bound = cfg.pipeline.max_inflight
    return {
        "finished": {"ok": not phase["timed_out"], "detail": f"every worker reached its steps: {phase['reached']}"},
        "no_stall": {"ok": phase["largest_progress_gap_s"] <= stall_bound_s,
                     "detail": f"largest gap {phase['largest_progress_gap_s']} s <= {stall_bound_s} s"},
        "no_unexpected_exit": {"ok": not phase["unexpected_exits"], "detail": phase["unexpected_exits"]},
        "restarted_rejoined": {"ok": not phase["not_rejoined"], "detail": phase["not_rejoined"]},
        "microbatch_accounting": {
            "ok": not accounting["mismatches"],
            "detail": (f"{accounting['graceful']} graceful stage-0 exits: sent {accounting['sent']} = trained "
                       f"{accounting['trained']} + dropped {accounting['dropped']} (retried "
                       f"{accounting['retried']}); {accounting['killed']} lost with a killed worker "
                       f"(<= {bound} each); {accounting['mismatches']}")},
        "checkpoints_load": {"ok": not phase["checkpoint_failures"] and phase["checkpoint_loads"] > 0,
                             "detail": f"{phase['checkpoint_loads']} loads, failures {phase['checkpoint_failures']}"},
        "final_loss": {"ok": loss_ok, "ratio": ratio,
                       "detail": f"val loss {phase.get('val_loss')} vs baseline {baseline_loss}"},
    }


def render(report: dict[str, Any]) -> str:
    from workers.cluster.chaos_report import format_table

    phase = report["faulty"]
    kinds = report["kinds"]
    rows = [(kind, sum(f["kind"] == kind for f in phase["injected"]),
             sum(f["kind"] == kind for f in phase["skipped"]), phase["observed"].get(kind, 0)) for kind in kinds]
    faults = format_table(rows, ("fault", "injected", "skipped", "observed"))
    checks = format_table([(name, "ok" if c["ok"] else "FAILED", c["detail"])
                           for name, c in report["invariants"].items()], ("invariant", "result", "detail"))
    baseline = report.get("baseline") or {}
    ratio = report["invariants"]["final_loss"]["ratio"]
    lines = [faults, "", checks, "",
             f"faulty run: {phase['elapsed_s']} s, val loss {phase.get('val_loss')}; baseline: "
             f"{baseline.get('elapsed_s')} s, val loss {baseline.get('val_loss')}; ratio "
             f"{'n/a' if ratio is None else f'{ratio:.3f}'}",
             "all invariants hold" if not report["failed"] else f"FAILED: {', '.join(report['failed'])}"]
    return "\n".join(lines)


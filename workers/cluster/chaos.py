"""`noloco-rt chaos`: train a local cluster while injecting faults, then check the invariants.

A cluster like `noloco-rt up` (real Redis, S × R real worker processes under the
supervisor; no coordinator, no live view) trains while a seeded schedule
(workers/cluster/chaos_schedule.py) SIGKILLs workers (the supervisor restarts them),
SIGTERMs them (a preemption: they leave gracefully and the driver starts them again),
SIGSTOPs them for a while, and stops Redis for a while; with --kinds all also flushes
Redis (its data lost), splits the network into two sides (each worker in its own network
namespace; workers/cluster/chaos_faults.py), fills the checkpoint disk (a tmpfs) and
SIGSTOPs the coordinator. A soak is the same with many steps and faults close together
(benchmarks/README.md, "Soak"). With --baseline the same
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
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from noloco_rt.cli import config_options
from noloco_rt.commands import effective_config
from noloco_rt.config import Config
from noloco_rt.logs import configure_logging
from workers.cluster.chaos_faults import FullDisk, Partitions
from workers.cluster.chaos_report import invariants, render
from workers.cluster.chaos_schedule import ALL_KINDS, FAULT_KINDS, Fault, build_schedule
from workers.cluster.run_dir import prepare_run_dir
from workers.faults.data_path import data_faults_env

# Fast failure detection and recovery, so that a short run sees every fault recovered.
# A checkpoint at every outer step: restarts resume, and a full disk meets writes, within the faults' seconds.
CHAOS_SETTINGS = {"outer.h": 5, "pipeline.max_inflight": 2, "worker.checkpoint_every": 1,
                  "worker.heartbeat_interval_s": 0.25,
                  "worker.deadline_floor_s": 1.0, "worker.deadline_ceiling_s": 5.0,
                  "worker.exchange_timeout_s": 3.0, "worker.leave_grace_s": 6.0, "run.eval_batches": 4,
                  "run.log_format": "json"}


@click.command()
@click.option("--steps", type=click.IntRange(min=1), default=80, show_default=True,
              help="Inner steps every worker must reach.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fault schedule and run seed (run.seed).")
@click.option("--every", "every_s", type=click.FloatRange(min=0.5), default=3.0, show_default=True,
              help="Seconds between faults.")
@click.option("--kinds", default=",".join(FAULT_KINDS), show_default=True,
              help=f"Fault kinds, comma-separated, or 'all': {', '.join(ALL_KINDS)}. partition and disk_full need "
                   "root (network namespaces, a tmpfs).")
@click.option("--hold", "hold_s", type=click.FloatRange(min=0.0), default=3.0, show_default=True,
              help="SIGSTOP length, Redis outage, partition and full-disk length, seconds (a full disk "
                   "stays full past it until a checkpoint write has failed on it, at most 60 s more).")
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
@click.option("--min-faults", type=click.IntRange(min=0), default=0, show_default=True,
              help="A soak: keep training past --steps (up to twice) and injecting until this many faults "
                   "were injected.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1.0), default=900.0, show_default=True,
              help="Give up on a phase after this many seconds (an invariant failure).")
@config_options
def chaos(steps: int, seed: int, every_s: float, kinds: str, hold_s: float, recover_s: float, stages: int,
          replicas: int, out_dir: str, stall_bound_s: float, baseline: bool, baseline_from: str | None,
          net_loss: float, net_delay_ms: float, min_faults: int, timeout_s: float, config_path: str | None,
          assignments: tuple[str, ...]) -> None:
    """Train under injected faults; exit 0 if every invariant held, 1 otherwise (named)."""
    wanted = ALL_KINDS if kinds.strip() == "all" else tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = sorted(set(wanted) - set(ALL_KINDS))
    if unknown or not wanted:
        raise click.BadParameter(f"unknown {', '.join(unknown) or 'nothing'}; choose from {', '.join(ALL_KINDS)} "
                                 f"or all", param_hint="--kinds")
    for kind, why_not in (("partition", Partitions.unavailable), ("disk_full", FullDisk.unavailable)):
        if kind in wanted and (why := why_not()) is not None:
            raise click.BadParameter(f"{kind} cannot be injected here: {why}", param_hint="--kinds")
    defaults = [f"{key}={value}" for key, value in CHAOS_SETTINGS.items()]
    out = Path(out_dir)
    cfg = effective_config(config_path, [*defaults, *assignments], {
        "pipeline": {"stages": stages, "replicas": replicas}, "run": {"steps": 2 * steps, "seed": seed}})
    configure_logging(cfg.run.log_format)
    # The cluster's parts import torch: here, not at import, so that `chaos --help` stays fast.
    from workers.cluster.processes import names_by_stage
    from workers.supervise.elastic import quiet_torch_elastic_logs

    quiet_torch_elastic_logs()
    # SIGTERM (a `kill`, a CI timeout) unwinds like Ctrl-C: stopped processes continued, the
    # network healed, namespaces and the checkpoint tmpfs removed, every process stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"steps": steps, "seed": seed, "every_s": every_s, "kinds": list(wanted),
                              "hold_s": hold_s, "recover_s": recover_s, "stall_bound_s": stall_bound_s,
                              "stages": stages, "replicas": replicas, "net_loss": net_loss,
                              "net_delay_ms": net_delay_ms, "min_faults": min_faults}
    if baseline_from:
        previous = json.loads(Path(baseline_from).read_text())
        if (previous.get("steps"), previous.get("seed")) != (steps, seed) or not previous.get("baseline"):
            raise click.BadParameter(f"{baseline_from} holds no baseline of --steps {steps} --seed {seed}",
                                     param_hint="--baseline-from")
        report["baseline"] = previous["baseline"]
    elif baseline:
        report["baseline"] = run_phase(cfg, out / "baseline", steps, [], stall_bound_s, timeout_s)
    names = names_by_stage(cfg)
    schedule = build_schedule(seed, timeout_s, every_s, names, wanted, hold_s=hold_s, recover_s=recover_s)
    report["faulty"] = run_phase(cfg, out / "faulty", steps, schedule, stall_bound_s, timeout_s,
                                 extra_env=data_faults_env(net_loss, net_delay_ms), min_faults=min_faults)
    report["invariants"] = invariants(report["faulty"], cfg.pipeline.microbatches_per_step, stall_bound_s, report.get("baseline"))
    report["failed"] = [name for name, check in report["invariants"].items() if not check["ok"]]
    (out / "chaos.json").write_text(json.dumps(report, indent=2, default=str))
    click.echo(render(report))
    sys.exit(1 if report["failed"] else 0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_phase(cfg: Config, out: Path, target_steps: int, schedule: list[Fault], stall_bound_s: float,
              timeout_s: float, extra_env: dict[str, str] | None = None, min_faults: int = 0) -> dict[str, Any]:
    """One cluster from scratch to every worker at target_steps, under `schedule`."""
    from workers.cluster.chaos_driver import ChaosDriver

    if out.exists():
        shutil.rmtree(out)  # a phase always starts fresh: stale checkpoints would be resumed
    cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, out_dir=str(out), checkpoint_dir=""))
    config_file = prepare_run_dir(out, cfg)
    driver = ChaosDriver(cfg, out, config_file, target_steps, schedule, timeout_s, extra_env=extra_env,
                         min_faults=min_faults)
    started = time.monotonic()
    driver.run()
    result = driver.summary()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result.update(finalise(cfg, out))
    return result


def finalise(cfg: Config, out: Path) -> dict[str, Any]:
    """Consensus of the final checkpoints, scored on the validation split (as `up` does)."""
    from noloco_rt.consensus.file import ExportError
    from noloco_rt.consensus.scored import consensus_of_checkpoints

    try:
        final = consensus_of_checkpoints(cfg, out / "checkpoints", out / "consensus.safetensors",
                                         source="final checkpoints (chaos)")
    except ExportError as exc:
        return {"val_loss": None, "consensus_error": str(exc)}
    return {"val_loss": final.val_loss, "consensus_step": final.step, "consensus": str(final.path)}

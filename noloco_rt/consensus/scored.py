"""The consensus of a run's replicas, written and scored: from the workers' checkpoint files
(`up` and `chaos` at the end of a run) or from replicas pulled live (the coordinator), both
through write_scored_consensus, which also measures the replica spread."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from noloco_rt.algo.diagnostics import perplexity
from noloco_rt.algo.spread_sample import (
    SpreadEstimate,
    estimate_spread,
    finite_or_none,
    pooled_estimate,
)
from noloco_rt.checkpoints.worker import CHECKPOINT_VERSION
from noloco_rt.config import Config
from noloco_rt.consensus.file import (
    ExportError,
    check_tensors,
    load_consensus,
    mean_over_replicas,
    save_consensus,
    stage_parameter_shapes,
)
from noloco_rt.counts import is_count
from noloco_rt.evaluation import Batch, validation_loss
from noloco_rt.logs import get_logger


def _usable_slow(state: Any, cfg: Config, shapes: list[list[tuple[str, torch.Size]]]) -> tuple[int, list] | str:
    """(stage, slow tensors) of a checkpoint of this run, or why it cannot be used."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a checkpoint dict"
    if state.get("version") != CHECKPOINT_VERSION:
        return f"version {state.get('version')!r}, expected {CHECKPOINT_VERSION}"
    if state.get("run_id") != cfg.run.run_id:
        return f"belongs to run {state.get('run_id')!r}"
    stage = state.get("stage")
    if not isinstance(stage, int) or not 0 <= stage < len(shapes):
        return f"stage {stage!r} is not in [0, {len(shapes)})"
    slow = state.get("slow")
    if not isinstance(slow, list):
        return "has no list of slow weights"
    try:
        check_tensors(slow, shapes[stage], f"stage {stage} slow weights")
    except ExportError as exc:
        return str(exc)
    return stage, slow


@dataclass
class WorkerCheckpoints:
    """The usable checkpoints of one run in a folder, and what was left out."""

    cfg: Config = field(repr=False)
    """The run the checkpoints must belong to."""
    replicas_by_stage: list[list[list[torch.Tensor]]]
    """Per stage, every replica's slow weights (float32)."""
    inner_steps_by_stage: list[list[int]]
    """Per stage, the clock of each checkpoint used: its inner steps, plus any a pull skipped."""
    skipped: list[tuple[Path | str, str]] = field(default_factory=list)
    """(file, reason) for every *.pt not used: unreadable, another run, wrong stage or shapes."""
    shapes: list[list[tuple[str, torch.Size]]] = field(default_factory=list, repr=False)
    """Per stage, its parameters' (name, shape): what a checkpoint must hold."""

    @classmethod
    def for_run(cls, cfg: Config) -> WorkerCheckpoints:
        """None yet, for the run `cfg` describes."""
        shapes = [stage_parameter_shapes(cfg, s) for s in range(cfg.pipeline.stages)]
        return cls(cfg, replicas_by_stage=[[] for _ in shapes], inner_steps_by_stage=[[] for _ in shapes],
                   shapes=shapes)

    def add(self, path: Path | str, state: Any) -> None:
        """One worker's state (loaded from `path`): used, or recorded as skipped with its reason."""
        usable = _usable_slow(state, self.cfg, self.shapes)
        if isinstance(usable, str):
            self.skipped.append((path, usable))
            return
        stage, slow = usable
        self.replicas_by_stage[stage].append([t.float() for t in slow])
        counters = state.get("counters") or {}
        clock = counters.get("clock_steps", counters.get("inner_steps", 0))
        self.inner_steps_by_stage[stage].append(clock if is_count(clock) else 0)

    def missing_stages(self) -> list[int]:
        return [s for s, replicas in enumerate(self.replicas_by_stage) if not replicas]


def read_worker_checkpoints(checkpoint_dir: Path, cfg: Config) -> WorkerCheckpoints:
    """Every usable ``*.pt`` of run cfg.run.run_id in checkpoint_dir, in name order.

    A file that cannot be read or does not fit is recorded in ``skipped``; one bad file
    never stops the export. Holds every replica in memory at once (the replica spread needs them).
    """
    if not Path(checkpoint_dir).is_dir():
        raise ExportError(f"{checkpoint_dir}: no such folder")
    return read_checkpoint_files(sorted(Path(checkpoint_dir).glob("*.pt")), cfg)


def checkpoint_files(sources: Sequence[Path]) -> list[Path]:
    """The worker checkpoints named by `sources`: files as given, folders' ``*.pt`` in name
    order (a worker's older files, ``*.pt.1``, are not its newest), each once."""
    files: list[Path] = []
    for source in sources:
        if Path(source).is_dir():
            files.extend(sorted(Path(source).glob("*.pt")))
        elif Path(source).is_file():
            files.append(Path(source))
        else:
            raise ExportError(f"{source}: no such file or folder")
    unique = {path.resolve(): path for path in files}
    return list(unique.values())


def read_checkpoint_files(paths: Sequence[Path], cfg: Config) -> WorkerCheckpoints:
    """read_worker_checkpoints of given files (gathered from several machines, say)."""
    found = WorkerCheckpoints.for_run(cfg)
    for path in paths:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a damaged or foreign file
            found.skipped.append((path, f"cannot be read: {type(exc).__name__}: {exc}"))
            continue
        found.add(path, state)
    return found


def read_store_checkpoints(cfg: Config) -> WorkerCheckpoints:
    """Each stage's checkpoints of its newest outer step in the run's durable store (store.url)
    whose bytes match their manifests: after the run, every replica's final state (each writes
    it as it finishes); during it, the stage's elected writer's newest. Checkpoints passed over
    are recorded in ``skipped``; StoreError or OSError when the store cannot be read."""
    from noloco_rt.store.backend import RunStore
    from noloco_rt.store.stage_checkpoints import StageCheckpoints

    store = RunStore(cfg.store.url)
    checkpoints = StageCheckpoints(store, cfg.run.run_id)
    found = WorkerCheckpoints.for_run(cfg)
    for stage in range(cfg.pipeline.stages):
        where = f"{store.shown}/{cfg.run.run_id}/stage-{stage}"
        states, problems = checkpoints.newest_step_states(stage)
        found.skipped.extend((where, problem) for problem in problems)
        for loaded in states:
            found.add(f"{where}/{loaded.info.data_file}", loaded.state)
    return found


# -- the consensus, scored -------------------------------------------------------------


@dataclass
class ScoredConsensus:
    """A consensus file just written, with its validation score and the replica spread it came from."""

    path: Path
    step: int
    """Lowest inner step among the replicas averaged."""
    val_loss: float
    val_ppl: float
    spread: float
    spread_by_stage: list[float]
    replicas_per_stage: list[int]
    """Replicas averaged per stage (a sample of replicas_live, or all of them)."""
    replicas_live: list[int]
    """Live replicas per stage the averaged ones were drawn from."""
    estimate: SpreadEstimate
    """The spread over all stages with its 95% interval (a point when every replica was averaged)."""
    stage_estimates: list[SpreadEstimate]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "val_loss": self.val_loss, "val_ppl": self.val_ppl, "spread": self.spread,
                "spread_low": self.estimate.low, "spread_high": finite_or_none(self.estimate.high),
                "spread_by_stage": self.spread_by_stage, "replicas_per_stage": self.replicas_per_stage,
                "replicas_live": self.replicas_live, "consensus": str(self.path)}


def _replica_metadata(sampled: Sequence[int], live: Sequence[int]) -> dict[str, str]:
    """How many replicas were averaged and how many were live, per stage ("8,8" for two stages).
    replicas_per_stage, the only key of older files, equals replicas_sampled."""
    joined = [",".join(map(str, counts)) for counts in (sampled, live)]
    return {"replicas_per_stage": joined[0], "replicas_sampled": joined[0], "replicas_live": joined[1]}


def scoring_device() -> str:
    """Where a consensus made after training is scored: the GPU when there is one (a 1b model's
    8 validation batches take minutes on a CPU). The coordinator scores on the CPU: it runs
    beside workers sized to the GPU's memory."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def write_scored_consensus(path: Path, cfg: Config, replicas_by_stage: Sequence[Sequence[Sequence[torch.Tensor]]],
                           *, step: int, source: str, val_batches: Sequence[Batch] | None = None,
                           live_per_stage: Sequence[int] | None = None, device: str = "cpu") -> ScoredConsensus:
    """Average each stage's replicas into the consensus file at `path`, load it back (what a
    user will load) and score it on the validation batches (on `device`); also the replica spread.

    replicas_by_stage[k] may be a random sample of stage k's live_per_stage[k] replicas: the
    spread is then estimated, with a 95% interval (noloco_rt.algo.spread_sample). Without
    live_per_stage the replicas given are every replica, and the spread is exact.
    """
    counts = [len(stage) for stage in replicas_by_stage]
    live = list(live_per_stage) if live_per_stage is not None else counts
    if len(live) != len(counts) or any(n < c for n, c in zip(live, counts, strict=False)):
        raise ExportError(f"{path}: {counts} replicas averaged per stage cannot be drawn from {live} live")
    save_consensus(path, cfg, [mean_over_replicas(stage) for stage in replicas_by_stage], metadata={
        "step": str(step), **_replica_metadata(counts, live), "source": source, "created": f"{time.time():.3f}"})
    _, model, _ = load_consensus(path, device, factory=cfg.model.factory)  # our own run's code, not the file's
    loss = validation_loss(model, cfg, val_batches=val_batches, device=device)
    del model  # its device memory, before the spread's arithmetic
    estimates = [estimate_spread(stage, population) for stage, population in zip(replicas_by_stage, live, strict=True)]
    numels = [sum(t.numel() for t in stage[0]) for stage in replicas_by_stage]
    pooled = pooled_estimate(estimates, numels)
    return ScoredConsensus(path=Path(path), step=step, val_loss=loss, val_ppl=perplexity(loss), spread=pooled.spread,
                           spread_by_stage=[e.spread for e in estimates], replicas_per_stage=counts,
                           replicas_live=live, estimate=pooled, stage_estimates=estimates)


def consensus_of_checkpoints(cfg: Config, checkpoint_dir: Path, path: Path, *, source: str,
                             device: str = "cpu") -> ScoredConsensus:
    """The consensus of the workers' checkpoint files (`up` and `chaos` at the end of a run).

    Files that cannot be used are logged (event ``checkpoint_skipped``) and left out;
    a stage with no usable checkpoint is an ExportError.
    """
    found = read_worker_checkpoints(checkpoint_dir, cfg)
    log = get_logger(run=cfg.run.run_id, worker="export", stage="all")
    for skipped, reason in found.skipped:
        log.warning("checkpoint_skipped", path=str(skipped), reason=reason)
    return consensus_of_found(cfg, found, path, source=source, where=str(checkpoint_dir), device=device)


def consensus_of_found(cfg: Config, found: WorkerCheckpoints, path: Path, *, source: str, where: str,
                       val_batches: Sequence[Batch] | None = None, device: str = "cpu") -> ScoredConsensus:
    """The scored consensus of checkpoints already read; ExportError naming `where` when a
    stage has none."""
    empty = found.missing_stages()
    if empty:
        raise ExportError(f"{where}: no usable checkpoint of run {cfg.run.run_id!r} for stage(s) "
                          f"{', '.join(map(str, empty))} ({len(found.skipped)} files skipped)")
    # The run's step is stage 0's: a later stage's replicas count unequal shares of the same data.
    return write_scored_consensus(path, cfg, found.replicas_by_stage, step=min(found.inner_steps_by_stage[0]),
                                  source=source, val_batches=val_batches, device=device)

"""The consensus checkpoint: one safetensors file holding the whole model.

Every worker keeps its own slow weights φ; the model a run has learned is their mean
over the replicas of each stage. This module averages them (from tensors in memory or
from the workers' checkpoint files), writes the result as one safetensors file whose
metadata carries the run's config, and loads it back as the whole model, so a
consensus file is usable without the run's config file or cluster. The coordinator
(a random sample of each stage's replicas, pulled live) and `up` / `chaos` (every
final checkpoint) build and score it with the same write_scored_consensus.

Writes are atomic (temporary file, fsync, rename): a reader sees the previous complete
file or the new one, never a torn one. The file gets the mode any new file of the user's
gets (0644 under umask 022), not the temporary's private 0600.
"""

from __future__ import annotations

import hashlib
import os
import time
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import nn

from noloco_rt.algo.diagnostics import perplexity
from noloco_rt.algo.spread_sample import (
    SpreadEstimate,
    estimate_spread,
    finite_or_none,
    pooled_estimate,
)
from noloco_rt.checkpoint import CHECKPOINT_VERSION, publish_temporary, write_temporary
from noloco_rt.config import Config, ConfigError, config_to_toml, load_config
from noloco_rt.config.presets import PRESETS
from noloco_rt.evaluation import Batch, validation_loss
from noloco_rt.logs import get_logger
from noloco_rt.model import PipelineStage
from noloco_rt.staged_model import staged_model

CONSENSUS_FORMAT = "noloco-consensus/1"
RESERVED_METADATA = ("format", "config", "sha256")


class ExportError(ValueError):
    """A consensus cannot be built, written or read; the message names the file and the problem."""


# -- shapes -------------------------------------------------------------------------------


def _empty_stage(cfg: Config, stage: int, num_stages: int) -> PipelineStage:
    # On the meta device: names and shapes without allocating or initialising weights.
    with torch.device("meta"):
        return PipelineStage(PRESETS[cfg.model.preset], cfg.model.vocab_size, stage, num_stages)


def whole_model(cfg: Config) -> nn.Module:
    """The whole model, its weights to be loaded: a preset's single stage of every layer (on
    the meta device), or your own model's stages in an nn.Sequential (model.factory)."""
    if not cfg.model.factory:
        return _empty_stage(cfg, 0, 1)
    model = staged_model(cfg)
    return nn.Sequential(*(model.build_stage(k) for k in range(model.num_stages)))


def stage_parameter_shapes(cfg: Config, stage: int) -> list[tuple[str, torch.Size]]:
    """(name, shape) of stage `stage`'s parameters in `module.parameters()` order, named as in
    whole_model (a preset's stage names its layers by their global index; your own model's
    stage k is the Sequential's k)."""
    if cfg.model.factory:
        module = staged_model(cfg).build_stage(stage)
        return [(f"{stage}.{name}", param.shape) for name, param in module.named_parameters()]
    module = _empty_stage(cfg, stage, cfg.pipeline.stages)
    return [(name, param.shape) for name, param in module.named_parameters()]


def _check_tensors(tensors: Sequence[torch.Tensor], expected: list[tuple[str, torch.Size]], where: str) -> None:
    if len(tensors) != len(expected):
        raise ExportError(f"{where}: {len(tensors)} tensors, expected {len(expected)}")
    for tensor, (name, shape) in zip(tensors, expected, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise ExportError(f"{where}: {name} is a {type(tensor).__name__}, not a tensor")
        if tensor.shape != shape:
            raise ExportError(f"{where}: {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
        if not tensor.is_floating_point():
            raise ExportError(f"{where}: {name} has dtype {tensor.dtype}, expected a floating-point type")


# -- averaging ----------------------------------------------------------------------------


@dataclass
class _MeanAccumulator:
    """Running elementwise float32 sum: one float32 copy of the result beside the replicas
    (float32: R·eps relative error, fine for R replicas)."""

    sums: list[torch.Tensor] | None = None
    count: int = 0

    def add(self, tensors: Sequence[torch.Tensor]) -> None:
        if self.sums is None:
            self.sums = [t.detach().to("cpu", torch.float32, copy=True) for t in tensors]
        else:
            if len(tensors) != len(self.sums):
                raise ExportError(f"replica {self.count} has {len(tensors)} tensors, replica 0 has {len(self.sums)}")
            for index, (total, tensor) in enumerate(zip(self.sums, tensors, strict=True)):
                if tensor.shape != total.shape:
                    raise ExportError(f"replica {self.count} tensor {index} has shape {tuple(tensor.shape)}, "
                                      f"replica 0 has {tuple(total.shape)}")
                total.add_(tensor.detach().to("cpu", torch.float32))
        self.count += 1

    def mean(self) -> list[torch.Tensor]:
        if self.sums is None:
            raise ExportError("mean over no replicas")
        return [total / self.count for total in self.sums]


def mean_over_replicas(replicas: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Elementwise float32 mean of the replicas' tensor lists (same length and shapes each)."""
    accumulator = _MeanAccumulator()
    for tensors in replicas:
        accumulator.add(tensors)
    return accumulator.mean()


# -- writing ------------------------------------------------------------------------------


def save_consensus(path: Path, cfg: Config, stages: Sequence[Sequence[torch.Tensor]], *,
                   metadata: Mapping[str, str] | None = None) -> None:
    """Write the whole model to `path` atomically.

    stages[k] holds stage k's tensors in ``build_stage(...).parameters()`` order. The
    file's metadata holds ``format``, ``config`` (TOML) and the given metadata.
    """
    path = Path(path)
    if len(stages) != cfg.pipeline.stages:
        raise ExportError(f"{path}: {len(stages)} stages given, config has pipeline.stages = {cfg.pipeline.stages}")
    extra = dict(metadata or {})
    for key, value in extra.items():
        if key in RESERVED_METADATA:
            raise ExportError(f"{path}: metadata key {key!r} is reserved")
        if not isinstance(key, str) or not isinstance(value, str):
            raise ExportError(f"{path}: metadata must map str to str, got {key!r}: {value!r}")
    named: dict[str, torch.Tensor] = {}
    for stage, tensors in enumerate(stages):
        expected = stage_parameter_shapes(cfg, stage)
        _check_tensors(tensors, expected, f"{path}: stage {stage}")
        for (name, _), tensor in zip(expected, tensors, strict=True):
            named[name] = tensor.detach().to("cpu").contiguous()
    header = {**extra, "format": CONSENSUS_FORMAT, "config": config_to_toml(cfg), "sha256": tensors_sha256(named)}
    write_shared_file(path, safetensors_bytes(named, metadata=header))


def umask() -> int:
    """The process umask, read without changing it where the system allows (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o077)  # elsewhere: set and restore (briefly stricter, never looser)
    os.umask(current)
    return current


def make_shared(path: Path) -> None:
    """Give `path` the mode open() gives a new file (0o666 less the umask): a temporary from
    mkstemp is 0600, right for a worker's checkpoint but not for a file a user hands on."""
    os.chmod(path, 0o666 & ~umask())


def write_shared_file(path: Path, data: bytes) -> None:
    """atomic_write_bytes, with the file's mode that of any new file of the user's (make_shared)."""
    tmp = write_temporary(path, data)
    try:
        make_shared(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    publish_temporary(tmp, path)


def tensors_sha256(named: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes in name order: a flipped byte anywhere
    in the data changes it (safetensors itself checks only the header's offsets)."""
    digest = hashlib.sha256()
    for name in sorted(named):
        tensor = named[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


# -- reading ------------------------------------------------------------------------------


def _config_from_toml(text: str, path: Path) -> Config:
    try:
        # environ={}: the file's config is what the model was trained with, whatever NOLOCO_* says here.
        return load_config(None, environ={}, overrides=[tomllib.loads(text)])
    except (tomllib.TOMLDecodeError, ConfigError) as exc:
        raise ExportError(f"{path}: embedded config is invalid: {exc}") from None


def _read_tensors(handle: Any, expected: dict[str, torch.Size], path: Path) -> dict[str, torch.Tensor]:
    names = set(handle.keys())
    missing, unexpected = sorted(expected.keys() - names), sorted(names - expected.keys())
    if missing:
        raise ExportError(f"{path}: missing tensors {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else ""))
    if unexpected:
        raise ExportError(f"{path}: unexpected tensors {', '.join(unexpected[:5])}"
                          + (" …" if len(unexpected) > 5 else ""))
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        shape_in_file = tuple(handle.get_slice(name).get_shape())  # checked before reading the data
        if shape_in_file != tuple(shape):
            raise ExportError(f"{path}: tensor {name} has shape {shape_in_file}, expected {tuple(shape)}")
        tensors[name] = handle.get_tensor(name)
        if not tensors[name].is_floating_point():
            raise ExportError(f"{path}: tensor {name} has dtype {tensors[name].dtype}, expected floating point")
    return tensors


def verify_contents(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], path: Path) -> None:
    """Refuse a damaged file (checksum) and weights no model should hold (NaN or inf)."""
    expected = metadata.get("sha256")
    if expected is None:
        raise ExportError(f"{path}: no checksum in its metadata (written before noloco-rt checked them); "
                          "export it again from the run's checkpoints")
    if tensors_sha256(tensors) != expected:
        raise ExportError(f"{path}: checksum mismatch: the file is damaged")
    for name, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise ExportError(f"{path}: tensor {name} holds NaN or infinite values")


def not_safetensors(path: Path) -> str | None:
    """Why `path` is plainly not a safetensors file, naming what it is and what to pass instead;
    None when its first bytes could be one. safetensors alone says "header too large" of a
    worker checkpoint, which tells a user nothing."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
        size = path.stat().st_size
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror})"
    header_bytes = int.from_bytes(head[:8], "little") if len(head) == 9 else -1
    if 0 < header_bytes <= size - 8 and head[8:9] == b"{":
        return None  # an 8-byte header length that fits the file, then the JSON header
    if head.startswith(b"PK\x03\x04") and _is_torch_zip(path):
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        consensus = run_dir / "consensus.safetensors" if run_dir is not None else None
        instead = (f"pass {consensus} instead" if consensus is not None and consensus.is_file() else
                   "pass the run's consensus.safetensors instead (noloco-rt up, simulate and the coordinator "
                   "write it in the run directory: OUT/consensus.safetensors)")
        return (f"{path} is a torch checkpoint (a worker's .pt: one replica of one stage), not a consensus "
                f"file; {instead}")
    return f"{path}: not a readable safetensors file (it does not start with a safetensors header)"


def _is_torch_zip(path: Path) -> bool:
    """A zip holding a pickle, as torch.save writes it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def load_consensus(path: Path, device: torch.device | str = "cpu") -> tuple[Config, nn.Module, dict[str, str]]:
    """(config, whole model with the consensus weights, metadata) of a consensus file.

    The config is the one embedded in the file (NOLOCO_* variables do not change it).
    Raises ExportError, naming the file and the problem, for a missing or unreadable
    file, another format, or tensors that do not match the config's model exactly.
    """
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    if (what := not_safetensors(path)) is not None:
        raise ExportError(what)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            found = metadata.get("format")
            if found != CONSENSUS_FORMAT:
                raise ExportError(f"{path}: format is {found!r}, expected {CONSENSUS_FORMAT!r}")
            if "config" not in metadata:
                raise ExportError(f"{path}: metadata has no config")
            cfg = _config_from_toml(metadata["config"], path)
            model = whole_model(cfg)
            expected = {name: param.shape for name, param in model.named_parameters()}
            tensors = _read_tensors(handle, expected, path)
            verify_contents(tensors, metadata, path)
    except SafetensorError as exc:
        raise ExportError(f"{path}: not a readable safetensors file ({exc})") from None
    except OSError as exc:  # e.g. no permission to read it
        raise ExportError(f"{path}: cannot be read ({exc})") from None
    model.load_state_dict(tensors, strict=True, assign=True)  # names and shapes were checked above
    return cfg, model.to(device), metadata


# -- from worker checkpoints --------------------------------------------------------------


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
        _check_tensors(slow, shapes[stage], f"stage {stage} slow weights")
    except ExportError as exc:
        return str(exc)
    return stage, slow


@dataclass
class WorkerCheckpoints:
    """The usable checkpoints of one run in a folder, and what was left out."""

    replicas_by_stage: list[list[list[torch.Tensor]]]
    """Per stage, every replica's slow weights (float32)."""
    inner_steps_by_stage: list[list[int]]
    """Per stage, the clock of each checkpoint used: its inner steps, plus any a pull skipped."""
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """(file, reason) for every *.pt not used: unreadable, another run, wrong stage or shapes."""


def read_worker_checkpoints(checkpoint_dir: Path, cfg: Config) -> WorkerCheckpoints:
    """Every usable ``*.pt`` of run cfg.run.run_id in checkpoint_dir, in name order.

    A file that cannot be read or does not fit is recorded in ``skipped``; one bad file
    never stops the export. Holds every replica in memory at once (the replica spread needs them).
    """
    if not Path(checkpoint_dir).is_dir():
        raise ExportError(f"{checkpoint_dir}: no such folder")
    shapes = [stage_parameter_shapes(cfg, s) for s in range(cfg.pipeline.stages)]
    found = WorkerCheckpoints(replicas_by_stage=[[] for _ in shapes], inner_steps_by_stage=[[] for _ in shapes])
    for path in sorted(Path(checkpoint_dir).glob("*.pt")):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a damaged or foreign file
            found.skipped.append((path, f"cannot be read: {type(exc).__name__}: {exc}"))
            continue
        usable = _usable_slow(state, cfg, shapes)
        if isinstance(usable, str):
            found.skipped.append((path, usable))
            continue
        stage, slow = usable
        found.replicas_by_stage[stage].append([t.float() for t in slow])
        counters = state.get("counters") or {}
        found.inner_steps_by_stage[stage].append(int(counters.get("clock_steps", counters.get("inner_steps", 0))))
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


def write_scored_consensus(path: Path, cfg: Config, replicas_by_stage: Sequence[Sequence[Sequence[torch.Tensor]]],
                           *, step: int, source: str, val_batches: Sequence[Batch] | None = None,
                           live_per_stage: Sequence[int] | None = None) -> ScoredConsensus:
    """Average each stage's replicas into the consensus file at `path`, load it back (what a
    user will load) and score it on the validation batches; also the replica spread.

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
    _, model, _ = load_consensus(path)
    loss = validation_loss(model, cfg, val_batches=val_batches)
    estimates = [estimate_spread(stage, population) for stage, population in zip(replicas_by_stage, live, strict=True)]
    numels = [sum(t.numel() for t in stage[0]) for stage in replicas_by_stage]
    pooled = pooled_estimate(estimates, numels)
    return ScoredConsensus(path=Path(path), step=step, val_loss=loss, val_ppl=perplexity(loss), spread=pooled.spread,
                           spread_by_stage=[e.spread for e in estimates], replicas_per_stage=counts,
                           replicas_live=live, estimate=pooled, stage_estimates=estimates)


def consensus_of_checkpoints(cfg: Config, checkpoint_dir: Path, path: Path, *, source: str) -> ScoredConsensus:
    """The consensus of the workers' checkpoint files (`up` and `chaos` at the end of a run).

    Files that cannot be used are logged (event ``checkpoint_skipped``) and left out;
    a stage with no usable checkpoint is an ExportError.
    """
    found = read_worker_checkpoints(checkpoint_dir, cfg)
    log = get_logger(run=cfg.run.run_id, worker="export", stage="all")
    for skipped, reason in found.skipped:
        log.warning("checkpoint_skipped", path=str(skipped), reason=reason)
    empty = [s for s, replicas in enumerate(found.replicas_by_stage) if not replicas]
    if empty:
        raise ExportError(f"{checkpoint_dir}: no usable checkpoint of run {cfg.run.run_id!r} for stage(s) "
                          f"{', '.join(map(str, empty))} ({len(found.skipped)} files skipped)")
    # The run's step is stage 0's: a later stage's replicas count unequal shares of the same data.
    return write_scored_consensus(path, cfg, found.replicas_by_stage, step=min(found.inner_steps_by_stage[0]),
                                  source=source)

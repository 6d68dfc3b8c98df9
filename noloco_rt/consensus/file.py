"""The consensus checkpoint: one safetensors file holding the whole model.

Every worker keeps its own slow weights φ; the model a run has learned is their mean
over the replicas of each stage. This module averages them, writes the result as one
safetensors file whose metadata carries the run's config, and loads it back as the whole
model, so a consensus file is usable without the run's config file or cluster. Where the
replicas come from, and the score, is noloco_rt/consensus/scored.py.

Writes are atomic (temporary file, fsync, rename): a reader sees the previous complete
file or the new one, never a torn one. The file gets the mode any new file of the user's
gets (0644 under umask 022), not the temporary's private 0600.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import nn

from noloco_rt.checkpoints.shared_files import write_shared_file
from noloco_rt.config import Config, ConfigError, config_to_toml, load_config
from noloco_rt.config.presets import PRESETS
from noloco_rt.consensus.standalone import standalone_metadata
from noloco_rt.model.llama import PipelineStage
from noloco_rt.model.staged import staged_model

CONSENSUS_FORMAT = "noloco-consensus/1"
RESERVED_METADATA = ("format", "config", "sha256")


class ExportError(ValueError):
    """A consensus cannot be built, written or read; the message names the file and the problem."""


class OwnModelNotNamed(ExportError):
    """A consensus of your own model (model.factory) loaded without naming its code: a file is
    data and never chooses code to run, so the caller names the factory it trusts."""

    def __init__(self, path: Path, factory: str) -> None:
        self.factory = factory
        super().__init__(f"{path} holds your own model ({factory!r}): a file never chooses code to run, "
                         f"so name it yourself (eval --model MODULE:FUNCTION, or "
                         f"load_consensus(path, factory=...))")


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


def check_tensors(tensors: Sequence[torch.Tensor], expected: list[tuple[str, torch.Size]], where: str) -> None:
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
        check_tensors(tensors, expected, f"{path}: stage {stage}")
        for (name, _), tensor in zip(expected, tensors, strict=True):
            named[name] = tensor.detach().to("cpu").contiguous()
    # The config redacted: a file people share holds no Redis password or CURVE secret. The
    # run's tokenizer travels with it (noloco_rt/consensus/standalone.py).
    header = {**standalone_metadata(cfg), **extra, "format": CONSENSUS_FORMAT,
              "config": config_to_toml(cfg, redact=True), "sha256": tensors_sha256(named)}
    write_shared_file(path, safetensors_bytes(named, metadata=header))


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


def with_trusted_code(cfg: Config, factory: str, path: Path) -> Config:
    """A file's embedded config with the model code the caller names (pure): a preset's file
    needs none; your own model's needs `factory`, which replaces the one the file names."""
    if not cfg.model.factory:
        if factory:
            raise ExportError(f"{path} holds the built-in preset {cfg.model.preset}: no model code to name")
        return cfg
    if not factory:
        raise OwnModelNotNamed(path, cfg.model.factory)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory=factory))


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
                   "write it in the run directory: OUT/consensus.safetensors), or make one from the workers' "
                   "checkpoints: noloco-rt consensus CHECKPOINT_OR_FOLDER... --config RUN.toml")
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


def load_consensus(path: Path, device: torch.device | str = "cpu", *,
                   factory: str = "") -> tuple[Config, nn.Module, dict[str, str]]:
    """(config, whole model with the consensus weights, metadata) of a consensus file.

    The config is the one embedded in the file (NOLOCO_* variables do not change it), except
    for the code: a file of your own model is built with `factory`, the model code the caller
    trusts (its own run's model.factory, or --model), never with the one the file names
    (OwnModelNotNamed without one). Raises ExportError, naming the file and the problem, for a
    missing or unreadable file, another format, or tensors that do not match the model exactly.
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
            cfg = with_trusted_code(_config_from_toml(metadata["config"], path), factory, path)
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



"""What noloco-rt trains: a model split into pipeline stages, with its loss and its data.

A run trains either a built-in Llama preset on the run's token data (`preset_model`) or
your own model (`model.factory = "package.module:function"`): a function of the run's
Config returning a StagedModel. Workers, the coordinator and the exchange see only this
interface, so the presets are one user of it (docs/own-model.md).

Every replica of a stage must start from the same weights: `build_stage(k)` must return
the same values on every call and every machine (seed it from cfg.run.seed).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from noloco_rt.config import Config
from noloco_rt.config.presets import PRESETS
from noloco_rt.data import DataCursor

HF_FACTORY = "noloco_rt.hf_model.build:hf_staged_model"
"""What model.factory = "hf:PATH" runs: loaded by name, as a user's factory is, so this
module (which hf_model builds on) never imports it."""

Batch = tuple[torch.Tensor, torch.Tensor]
"""(inputs of stage 0, targets of the loss) for one microbatch."""


class StagedModelError(ValueError):
    """model.factory cannot be loaded, or what it returned is not a usable StagedModel."""


@dataclass(frozen=True)
class StagedModel:
    """A model split into `num_stages` stages.

    build_stage(k): stage k as an nn.Module, deterministically initialised. Stage k's
        forward takes what stage k-1 returned (stage 0: the batch's inputs); the last
        stage's output goes to `loss`. Tensors between stages must be floating point.
    loss(output, targets): a scalar to minimise (the mean over the microbatch).
    train_batches(stream_seed): an endless iterator of (inputs, targets) microbatches;
        each first-stage worker gets its own seed (its stream). None: the run's token data
        (the data section), inputs and targets of shape (batch_size, seq_len).
    val_batches(): a fixed, finite list of validation batches for the coordinator's
        evaluations. None with train_batches None: the run's token data's; None otherwise:
        no evaluation.
    input_shape(k): the shape of stage k's input for one microbatch (k >= 1); forwards of
        another shape are refused. None: any shape whose first dimension is the targets'.
    """

    num_stages: int
    build_stage: Callable[[int], nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    train_batches: Callable[[int], Iterator[Batch]] | None = None
    val_batches: Callable[[], Iterable[Batch]] | None = None
    input_shape: Callable[[int], tuple[int, ...]] | None = None
    targets_ok: Callable[[torch.Tensor], bool] | None = None
    """Whether a forward's targets are acceptable (the presets: ids inside the vocabulary)."""

    @property
    def own_data(self) -> bool:
        return self.train_batches is not None

    def forward_ok(self, stage: int, activations: torch.Tensor, targets: torch.Tensor) -> bool:
        """Whether a forward from stage-1 is of the shapes stage `stage` takes."""
        if not activations.is_floating_point() or activations.dim() == 0 or targets.dim() == 0:
            return False
        if self.input_shape is not None:
            if tuple(activations.shape) != tuple(self.input_shape(stage)):
                return False
        elif activations.shape[0] != targets.shape[0]:
            return False
        return self.targets_ok is None or bool(self.targets_ok(targets))


def staged_model(cfg: Config) -> StagedModel:
    """The run's model: model.factory's when set, else the built-in preset."""
    if cfg.model.hf_folder is not None:  # a transformers folder: staged by our own factory
        model = load_factory(HF_FACTORY)(cfg)
    else:
        model = load_factory(cfg.model.factory)(cfg) if cfg.model.factory else preset_model(cfg)
    return checked(model, cfg)


def preset_model(cfg: Config) -> StagedModel:
    """A built-in Llama preset on the run's token data."""
    from noloco_rt.model.llama import (  # the presets' code, only when one is used
        build_stage,
        lm_loss,
    )

    shape = PRESETS[cfg.model.preset]
    stages, vocab = cfg.pipeline.stages, cfg.model.vocab_size

    def stage(k: int) -> nn.Module:
        return build_stage(shape, vocab_size=vocab, stage=k, num_stages=stages, seed=cfg.run.seed)

    batch, seq = cfg.data.batch_size, cfg.model.seq_len

    def targets_ok(targets: torch.Tensor) -> bool:  # (B, T) token ids inside the vocabulary
        # Received targets are host memory: read through numpy, no tensor op (and on a GPU
        # worker no device read) on the training thread.
        ids = targets.numpy(force=True)
        return tuple(targets.shape) == (batch, seq) and (ids.size == 0 or (ids.min() >= 0 and ids.max() < vocab))

    return StagedModel(num_stages=stages, build_stage=stage, loss=lm_loss,
                       input_shape=lambda k: (batch, seq, shape.dim), targets_ok=targets_ok)


def checked(model: object, cfg: Config) -> StagedModel:
    """`model` if it is a StagedModel of the run's stage count; StagedModelError otherwise."""
    where = f"model.factory {cfg.model.factory}" if cfg.model.factory else "the preset"
    if not isinstance(model, StagedModel):
        raise StagedModelError(f"{where} returned {type(model).__name__}, not a noloco_rt.model.staged.StagedModel")
    if model.num_stages != cfg.pipeline.stages:
        raise StagedModelError(f"{where} has {model.num_stages} stages but pipeline.stages is "
                               f"{cfg.pipeline.stages}: set pipeline.stages = {model.num_stages}")
    for name in ("build_stage", "loss"):
        if not callable(getattr(model, name)):
            raise StagedModelError(f"{where}: {name} is not callable")
    if model.train_batches is not None and model.val_batches is None:
        raise StagedModelError(f"{where} brings its own train_batches but no val_batches: evaluations "
                               f"need validation batches of the same data")
    return model


def load_factory(reference: str) -> Callable[[Config], object]:
    """The function `reference` names: "package.module:function" (imported as usual: the
    package must be on sys.path) or "path/to/file.py:function" (loaded from that file)."""
    module_name, _, function = reference.rpartition(":")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            module = _module_from_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise StagedModelError(f"model.factory {reference}: cannot import {module_name} ({exc})") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise StagedModelError(f"model.factory {reference}: {module_name} has no function {function}")
    return factory


def _module_from_file(path: Path) -> object:
    if not path.is_file():
        raise ImportError(f"no file {path}")
    name = f"noloco_user_model_{zlib.crc32(str(path.resolve()).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class CountedBatches:
    """Your own model's training stream, resumable: a cursor counts the batches taken, and a
    restarted worker skips as many of the same stream (its seed) before going on."""

    def __init__(self, batches: Callable[[int], Iterator[Batch]], *, seed: int,
                 cursor: DataCursor | None = None) -> None:
        self.cursor = DataCursor(position=cursor.position if cursor is not None else 0)
        self._stream = iter(batches(seed))
        for _ in range(self.cursor.position):
            self._take()

    def next_batch(self) -> Batch:
        batch = self._take()
        self.cursor.position += 1
        return batch

    def _take(self) -> Batch:
        try:
            item = next(self._stream)
        except StopIteration:
            raise StagedModelError("train_batches ran out: it must be endless (cycle over your data)") from None
        if not (isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(t, torch.Tensor) for t in item)):
            raise StagedModelError(f"train_batches must yield (inputs, targets) pairs of tensors, got {type(item).__name__}")
        return item[0], item[1]

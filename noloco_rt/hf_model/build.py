"""`--model hf:PATH`: a transformers causal-LM folder as a StagedModel on the run's token data.

Stage k is built from the folder's config.json with transformers' own modules and holds a
contiguous run of decoder layers (embedding on stage 0; final norm and head on the last),
the runs balanced by parameter count. With weights in the folder each stage reads only its
own tensors; without, every stage builds the whole model from run.seed and keeps its part,
so all replicas of a stage start alike on every machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from noloco_rt.hf_model.families import (
    Family,
    UnstageableModel,
    family_of,
    hidden_size,
    layer_count,
)
from noloco_rt.hf_model.split import split_layers
from noloco_rt.hf_model.weights import read_weights, weight_files
from noloco_rt.model.staged import StagedModel, StagedModelError


@dataclass(frozen=True)
class StagePlan:
    """What every stage of a folder's model needs to know, worked out once per process."""

    config: Any
    family: Family
    runs: tuple[range, ...]
    weights: dict[str, Path] | None


@functools.lru_cache(maxsize=4)
def stage_plan(folder: Path, stages: int) -> StagePlan:
    config = load_config(folder)
    family = family_of(config)
    layers = layer_count(config)
    if layers < stages:
        raise UnstageableModel(f"{config.model_type} has {layers} layers, fewer than pipeline.stages = {stages}")
    with torch.device("meta"):
        lm = _causal_lm(config)
    base = getattr(lm, family.base)
    per_layer = [_count(layer) for layer in getattr(base, family.layers)]
    first = _count(getattr(base, family.embed)) + (_count(getattr(base, family.position_embed))
                                                    if family.position_embed else 0)
    last = _count(getattr(base, family.norm)) + _count(getattr(lm, family.head))
    runs = split_layers(per_layer, first_extra=first, last_extra=last, stages=stages)
    return StagePlan(config=config, family=family, runs=tuple(runs), weights=weight_files(folder))


def load_config(folder: Path) -> Any:
    if not (folder / "config.json").is_file():
        raise UnstageableModel(f"{folder} has no config.json: hf:PATH names a transformers model folder")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise UnstageableModel("--model hf:PATH needs transformers: pip install 'noloco-rt[hf]'") from None
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise UnstageableModel(f"{folder}/config.json: {exc}".splitlines()[0]) from None


def build_stage(plan: StagePlan, stage: int, *, seed: int) -> nn.Module:
    """Stage `stage` in float32 on the CPU, in training mode."""
    # stage.py imports transformers: only here, after load_config said it is installed
    from noloco_rt.hf_model.stage import HFStage

    first, last = stage == 0, stage == len(plan.runs) - 1
    if plan.weights is None:
        with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
            torch.manual_seed(seed)
            module = HFStage(_causal_lm(plan.config), plan.family, plan.runs[stage], first=first, last=last)
    else:
        with torch.device("meta"):
            module = HFStage(_causal_lm(plan.config), plan.family, plan.runs[stage], first=first, last=last)
        module.load_state_dict(read_weights(plan.weights, module.state_dict().keys()), strict=True, assign=True)
        _rebuild_rotary(module)
    leftover = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if leftover:
        raise UnstageableModel(f"{plan.config.model_type}: {leftover[0]} is neither a weight of the folder nor "
                               f"made by its module: this family cannot be staged from weights yet")
    return module.train()


def stage_input_shape(plan: StagePlan, batch: int, seq: int) -> tuple[int, int, int]:
    return (batch, seq, hidden_size(plan.config))


def _rebuild_rotary(module: nn.Module) -> None:
    """The rotary tables are not weights (not in the file): made again on the CPU."""
    name = module.family.rotary
    if name is None:
        return
    rotary = getattr(module.base, name)
    setattr(module.base, name, type(rotary)(config=module.config))


def _causal_lm(config: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def hf_staged_model(cfg: Any) -> StagedModel:
    """model.factory = "hf:PATH": the folder's model on the run's token data (the data
    section). What cannot be staged: StagedModelError, one line naming it."""
    try:
        return _hf_staged_model(cfg)
    except UnstageableModel as exc:
        raise StagedModelError(f"model.factory {cfg.model.factory}: {exc}") from None


def _hf_staged_model(cfg: Any) -> StagedModel:
    from noloco_rt.model.llama import lm_loss

    plan = stage_plan(Path(cfg.model.hf_folder), cfg.pipeline.stages)
    vocab = int(plan.config.vocab_size)
    if cfg.model.vocab_size > vocab:
        raise UnstageableModel(f"the run's data has {cfg.model.vocab_size} token ids (model.vocab_size) but "
                               f"{plan.config.model_type}'s vocabulary holds {vocab}")
    max_positions = getattr(plan.config, "max_position_embeddings", None) or getattr(plan.config, "n_positions", None)
    if max_positions is not None and cfg.model.seq_len > max_positions:
        raise UnstageableModel(f"model.seq_len = {cfg.model.seq_len} is longer than {plan.config.model_type}'s "
                               f"{max_positions} positions")
    batch, seq = cfg.data.batch_size, cfg.model.seq_len

    def targets_ok(targets: torch.Tensor) -> bool:
        ids = targets.numpy(force=True)  # host memory: no device read on the training thread
        return tuple(targets.shape) == (batch, seq) and (ids.size == 0 or (ids.min() >= 0 and ids.max() < vocab))

    def stage(k: int) -> nn.Module:
        try:
            return build_stage(plan, k, seed=cfg.run.seed)
        except UnstageableModel as exc:
            raise StagedModelError(f"model.factory {cfg.model.factory}: {exc}") from None

    return StagedModel(num_stages=cfg.pipeline.stages, build_stage=stage,
                       loss=lm_loss, input_shape=lambda k: stage_input_shape(plan, batch, seq),
                       targets_ok=targets_ok)

"""Settings that fit a memory budget: the in-flight count and activation checkpointing a
worker uses (pipeline.max_inflight = 0, model.activation_checkpointing = auto), and the
smallest stage count that fits a budget (`noloco-rt plan --fit-gb`). Pure for the presets:
the budget comes in as a number; the worker reads its device's memory (workers/device.py).
An hf:PATH model's stages are measured once per process on fake tensors
(noloco_rt.hf_model.memory, imported only then); activation checkpointing does not apply to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from noloco_rt.config import Config
from noloco_rt.config.pipeline import DEFAULT_MAX_INFLIGHT
from noloco_rt.config.presets import PRESETS
from noloco_rt.memory.plan import StageMemory, plan
from noloco_rt.memory.settings import MeasuredStage, PlanSettings

GB = 10**9


@dataclass(frozen=True)
class MemoryChoice:
    """What a worker runs with, and why."""

    max_inflight: int
    activation_checkpointing: bool
    budget_bytes: int | None
    """None: no budget (the CPU without worker.memory_budget_gb)."""
    peak_bytes: int | None
    """The plan's largest per-worker peak over the run's stages with these settings; None:
    not planned (a model of your own code, or hf:PATH with no budget to choose for)."""
    fits: bool

    @property
    def reason(self) -> str:
        checkpointing = "on" if self.activation_checkpointing else "off"
        if self.budget_bytes is None:
            return f"no memory budget: {self.max_inflight} in flight, checkpointing {checkpointing}"
        verdict = "fits" if self.fits else "does NOT fit (the closest setting)"
        return (f"planned peak {self.peak_bytes / GB:.2f} GB {verdict} in {self.budget_bytes / GB:.2f} GB: "
                f"{self.max_inflight} in flight, checkpointing {checkpointing}")


def compute_precision(precision: str, device_type: str) -> str:
    """model.precision as the forward runs it (workers/device.autocast_dtype's rule)."""
    if precision == "bfloat16" or (precision == "auto" and device_type == "cuda"):
        return "bfloat16"
    return "float32"


def plan_settings(cfg: Config, *, device_type: str, max_inflight: int, activation_checkpointing: bool) -> PlanSettings:
    """The run's plan inputs with the given in-flight count and checkpointing."""
    outer = cfg.outer.resolved()
    precision = compute_precision(cfg.model.precision, device_type)
    return PlanSettings(
        preset=cfg.model.preset, stages=cfg.pipeline.stages, micro_batch=cfg.data.batch_size,
        seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size,
        precision=precision, activation_checkpointing=activation_checkpointing and not cfg.model.hf_folder,
        max_inflight=max_inflight,
        wire_dtype=cfg.pipeline.wire_dtype, snapshot_codec=cfg.worker.snapshot_codec,
        group_size=outer.group_size, theta_only=outer.gamma == outer.beta, device=device_type,
        error_feedback=bool(cfg.worker.delta_codec) and cfg.worker.error_feedback,
        measured=measured_stages(cfg, precision))


def measured_stages(cfg: Config, precision: str) -> tuple[MeasuredStage, ...]:
    """An hf:PATH model's stages measured (cached per folder and settings); () for a preset."""
    if not cfg.model.hf_folder:
        return ()
    from noloco_rt.hf_model import memory  # torch and transformers: only for such a model

    return memory.measured_stages(cfg.model.hf_folder, cfg.pipeline.stages, cfg.model.seq_len, precision,
                                  cfg.data.batch_size)


def layer_count(cfg: Config) -> int:
    """Layers the model has: the most stages it can be cut into."""
    if not cfg.model.hf_folder:
        return PRESETS[cfg.model.preset].n_layers
    from noloco_rt.hf_model import build, families

    return families.layer_count(build.stage_plan(Path(cfg.model.hf_folder), 1).config)


def worst_peak(stages: list[StageMemory]) -> int:
    return max(stage.peak for stage in stages)


def candidates(max_inflight: int, checkpointing: str, *, can_checkpoint: bool = True) -> Iterator[tuple[int, bool]]:
    """(in flight, checkpointing) from most to least preferred. The in-flight count is also
    the inner step's batch, so the default count is kept as long as checkpointing (one more
    forward of compute) can make it fit; only then fewer microbatches."""
    counts = [max_inflight] if max_inflight else list(range(DEFAULT_MAX_INFLIGHT, 0, -1))
    modes = {"on": [True], "off": [False], "auto": [False, True]}[checkpointing] if can_checkpoint else [False]
    for index, count in enumerate(counts):
        for mode in modes:
            if index > 0 and len(modes) == 2 and not mode:
                continue  # fewer microbatches only once checkpointing is on
            yield count, mode


def choose(cfg: Config, *, device_type: str, budget_bytes: int | None) -> MemoryChoice:
    """The settings a worker uses: explicit values are kept; 0 in flight and auto checkpointing
    take the first candidate whose planned peak (the worst stage of the run, so every worker
    of a run with the same budget agrees) fits the budget, or the last one if none does."""
    explicit, mode = cfg.pipeline.max_inflight, cfg.model.activation_checkpointing
    if budget_bytes is None:
        count, checkpointing = explicit or DEFAULT_MAX_INFLIGHT, mode == "on" and not cfg.model.hf_folder
        if cfg.model.hf_folder:  # nothing to choose: its stages are not measured (seconds of a worker's start)
            return MemoryChoice(count, checkpointing, None, None, True)
        peak = worst_peak(plan(plan_settings(cfg, device_type=device_type, max_inflight=count,
                                             activation_checkpointing=checkpointing)))
        return MemoryChoice(count, checkpointing, None, peak, True)
    tried = []
    for count, checkpointing in candidates(explicit, mode, can_checkpoint=not cfg.model.hf_folder):
        peak = worst_peak(plan(plan_settings(cfg, device_type=device_type, max_inflight=count,
                                             activation_checkpointing=checkpointing)))
        tried.append(MemoryChoice(count, checkpointing, budget_bytes, peak, peak <= budget_bytes))
        if tried[-1].fits:
            break
    return tried[-1]


def budget_bytes(memory_budget_gb: float, *, device_type: str, device_total_bytes: int | None,
                 workers_sharing: int) -> int | None:
    """worker.memory_budget_gb, else on CUDA the device's memory over the workers sharing it;
    None on the CPU (no budget: today's fixed settings)."""
    if memory_budget_gb > 0:
        return int(memory_budget_gb * GB)
    if device_type == "cuda" and device_total_bytes:
        return device_total_bytes // max(1, workers_sharing)
    return None


def resolved_config(cfg: Config, choice: MemoryChoice) -> Config:
    """The config with the chosen numbers in place of 0 and auto, so every reader of
    pipeline.max_inflight and model.activation_checkpointing sees what the worker does."""
    return dataclasses.replace(
        cfg,
        pipeline=dataclasses.replace(cfg.pipeline, max_inflight=choice.max_inflight),
        model=dataclasses.replace(cfg.model, activation_checkpointing="on" if choice.activation_checkpointing else "off"))


@dataclass(frozen=True)
class Fit:
    stages: int
    choice: MemoryChoice
    plan: list[StageMemory]


def fit_stages(cfg: Config, *, device_type: str, budget: int) -> Fit | None:
    """The fewest stages (and their settings, by `choose`) whose every worker fits `budget`;
    None if even one layer per stage does not."""
    for stages in range(1, layer_count(cfg) + 1):
        staged = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, stages=stages))
        choice = choose(staged, device_type=device_type, budget_bytes=budget)
        if choice.fits:
            settings = plan_settings(staged, device_type=device_type, max_inflight=choice.max_inflight,
                                     activation_checkpointing=choice.activation_checkpointing)
            return Fit(stages, choice, plan(settings))
    return None

"""`noloco-rt plan`: each stage's worker memory (noloco_rt.memory.plan), and with --fit-gb the
fewest stages whose every worker fits a budget."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from noloco_rt.cli import OneLineError, config_options
from noloco_rt.commands import effective_config
from noloco_rt.commands.shared_options import check_model, model_name, model_option, model_value
from noloco_rt.config import Config
from noloco_rt.config.presets import PRESETS
from noloco_rt.config.training import ACTIVATION_CHECKPOINTING, PRECISIONS
from noloco_rt.memory.fit import (
    GB,
    MemoryChoice,
    budget_bytes,
    choose,
    compute_precision,
    fit_stages,
    layer_count,
    plan_settings,
)
from noloco_rt.memory.plan import StageMemory, plan

GPUS = (("H100 80 GB", 78 * 2**30), ("H200 141 GB", 139 * 2**30))
"""Device memory torch reports as the total of each (about 78 and 139 GiB), what a worker
alone on the GPU sizes itself for."""
COLUMNS = ("stage", "layers", "params", "weights", "grads", "inner opt", "outer φ δ", "activations",
           "wire", "exchange", "peak", "peak at", "host")


def _size(n_bytes: int, unit: tuple[str, int]) -> str:
    return f"{n_bytes / unit[1]:,.2f}"


def render_table(stages: list[StageMemory], unit: tuple[str, int]) -> str:
    """One row per stage, sizes in `unit`; activations as per-microbatch × held."""
    rows = [[str(m.stage), str(m.layers), f"{m.params / 1e6:,.1f}M", _size(m.weights, unit), _size(m.grads, unit),
             _size(m.inner_optimizer, unit), _size(m.outer_state, unit),
             f"{_size(m.activations_per_microbatch, unit)} × {m.held_microbatches}", _size(m.wire_copies, unit),
             _size(m.exchange, unit), _size(m.peak, unit), m.peak_moment, _size(m.host, unit) if m.host else "–"]
            for m in stages]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def gpu_fits(cfg: Config) -> list[str]:
    """One line per common GPU: whether one worker of each stage alone on it fits, and with
    what in flight and checkpointing (what a worker with no worker.memory_budget_gb would
    choose there, for pipeline.max_inflight = 0)."""
    lines = []
    for name, total in GPUS:
        budget = budget_bytes(0, device_type="cuda", device_total_bytes=total, workers_sharing=1)
        choice = choose(cfg, device_type="cuda", budget_bytes=budget)
        verdict = "fits" if choice.fits else "does not fit"
        lines.append(f"{name}: {verdict}, {choice.max_inflight} in flight, activation checkpointing "
                     f"{'on' if choice.activation_checkpointing else 'off'}, peak {choice.peak_bytes / GB:,.1f} GB "
                     f"of {total / GB:,.1f}")
    return lines


def unit_for(stages: list[StageMemory]) -> tuple[str, int]:
    return ("GB", GB) if max(m.peak for m in stages) >= GB else ("MB", 10**6)


def describe(cfg: Config, device: str, choice: MemoryChoice) -> str:
    measured = " (its stages measured on fake tensors)" if cfg.model.hf_folder else ""
    return (f"{model_name(cfg)}{measured}, {cfg.pipeline.stages} stages, {cfg.data.batch_size} x {cfg.model.seq_len} "
            f"tokens a microbatch, vocabulary {cfg.model.vocab_size}, {device}, "
            f"{compute_precision(cfg.model.precision, device)} compute, wire {cfg.pipeline.wire_dtype}, codec {cfg.worker.snapshot_codec}\n{choice.reason}")


def print_plan(cfg: Config, device: str, choice: MemoryChoice) -> None:
    stages = plan(plan_settings(cfg, device_type=device, max_inflight=choice.max_inflight,
                                activation_checkpointing=choice.activation_checkpointing))
    unit = unit_for(stages)
    click.echo(describe(cfg, device, choice))
    click.echo(f"per worker, {unit[0]} ({'10^9' if unit[0] == 'GB' else '10^6'} bytes); activations: per "
               "microbatch × held; host: CUDA's host-memory share (exchange copies, wire copies)\n")
    click.echo(render_table(stages, unit))


@click.command("plan")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None, help="model.preset")
@click.option("--stages", type=click.IntRange(min=1), default=None, help="pipeline.stages")
@click.option("--micro-batch", type=click.IntRange(min=1), default=None, help="data.batch_size: sequences a microbatch")
@click.option("--seq-len", type=click.IntRange(min=2), default=None, help="model.seq_len")
@click.option("--vocab-size", type=click.IntRange(min=2), default=None, help="model.vocab_size")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None, help="model.precision (auto: by --device)")
@click.option("--activation-checkpointing", type=click.Choice(ACTIVATION_CHECKPOINTING), default=None,
              help="model.activation_checkpointing")
@click.option("--max-inflight", type=click.IntRange(min=0), default=None,
              help="pipeline.max_inflight (0: the most up to 4 that fit --memory-gb)")
@click.option("--memory-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="worker.memory_budget_gb: the budget 0 in flight and auto checkpointing are chosen for")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Where the workers compute: cuda counts device memory (host copies apart), cpu all of it.")
@click.option("--fit-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Find the fewest stages (and in-flight count, checkpointing) whose every worker fits this many GB.")
@model_option
@config_options
def plan_command(config_path: str | None, assignments: tuple[str, ...], device: str, fit_gb: float | None,
                 model_factory: str | None, **flags: Any) -> None:
    """Memory of each stage's worker: weights, gradients, optimizer states, activations of the
    microbatches in flight, exchange buffers, and the peak (docs/architecture.md, memory).
    A preset's is derived from its shape; an hf:PATH model's stages are measured."""
    cfg = effective_config(config_path, assignments, {
        "model": {"preset": flags["preset"], "seq_len": flags["seq_len"], "vocab_size": flags["vocab_size"],
                  "precision": flags["precision"], "activation_checkpointing": flags["activation_checkpointing"],
                  "factory": model_value(model_factory)},
        "data": {"batch_size": flags["micro_batch"]},
        "pipeline": {"stages": flags["stages"], "max_inflight": flags["max_inflight"]},
        "worker": {"memory_budget_gb": flags["memory_gb"]},
    })
    if cfg.model.factory and not cfg.model.hf_folder:
        raise OneLineError(f"{model_name(cfg)} is code of your own: its memory cannot be planned (hf:PATH and the "
                           "presets can); a worker runs it with pipeline.max_inflight, or 4")
    check_model(cfg)
    if fit_gb is not None:
        fit = fit_stages(cfg, device_type=device, budget=int(fit_gb * GB))
        if fit is None:
            raise OneLineError(f"{model_name(cfg)} does not fit {fit_gb:g} GB a worker even on {layer_count(cfg)} "
                               "stages (one layer each) with 1 microbatch in flight: lower --micro-batch or --seq-len")
        click.echo(f"fits {fit_gb:g} GB a worker on {fit.stages} stages\n")
        cfg = fit_config(cfg, fit.stages)
        print_plan(cfg, device, fit.choice)
        return
    budget = budget_bytes(cfg.worker.memory_budget_gb, device_type=device, device_total_bytes=None, workers_sharing=1)
    print_plan(cfg, device, choose(cfg, device_type=device, budget_bytes=budget))
    if device == "cuda":
        click.echo("\none worker a GPU (pipeline.max_inflight = 0 and checkpointing auto choose as the worker would):")
        click.echo("\n".join(gpu_fits(cfg)))


def fit_config(cfg: Config, stages: int) -> Config:
    return dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, stages=stages))

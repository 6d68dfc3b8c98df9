"""What each stage of an hf:PATH model keeps in memory, measured rather than derived.

The memory plan's formulas know the built-in Llama blocks op by op; a transformers family
saves other tensors (GPT-2's dropout masks and biased LayerNorms, grouped-query attention's
narrower k and v). So each stage runs one forward and backward on fake tensors (torch's
FakeTensorMode: shapes and dtypes, no data, no arithmetic, so a stage of a large model costs
what a small one does), and noloco_rt.memory.tracker counts the storages as they come and
go. Two batch sizes, the run's and one more sequence, separate what a microbatch keeps
whatever its size (autocast's weight casts) from what grows with its sequences: exact at the
run's size (a batch of one can skip a copy, so sizes are not exactly linear from there), and
the fake run's bytes equal a real run's (tests/memory/test_hf_memory.py).

The forward runs on fake CPU tensors, so the kernels and bfloat16 casts are the CPU's: a CUDA
worker's attention kernels and autocast may keep a little more or less (not yet measured on
a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from noloco_rt.hf_model.build import StagePlan, build_stage, stage_plan
from noloco_rt.hf_model.families import hidden_size
from noloco_rt.memory.settings import MeasuredStage
from noloco_rt.memory.tracker import TensorMemoryTracker


@functools.lru_cache(maxsize=8)
def measured_stages(folder: str, stages: int, seq_len: int, precision: str,
                    micro_batch: int) -> tuple[MeasuredStage, ...]:
    """Every stage of the folder's model with `stages` stages, microbatches of `micro_batch`
    sequences of `seq_len` tokens, computing in `precision` (float32, or bfloat16 autocast)."""
    plan = dataclasses.replace(stage_plan(Path(folder), stages), weights=None)  # random weights: never read
    return tuple(_measure_stage(plan, stage, seq_len, precision, micro_batch) for stage in range(stages))


def _measure_stage(plan: StagePlan, stage: int, seq_len: int, precision: str, micro_batch: int) -> MeasuredStage:
    (params, *at), (_, *above) = (_one_microbatch(plan, stage, seq_len, precision, sequences)
                                  for sequences in (micro_batch, micro_batch + 1))
    return MeasuredStage(
        params=params, layers=len(plan.runs[stage]), width=hidden_size(plan.config),
        activations_fixed=at[0] - micro_batch * (above[0] - at[0]), activations_per_sequence=above[0] - at[0],
        backward_fixed=at[1] - micro_batch * (above[1] - at[1]), backward_per_sequence=above[1] - at[1])


def _fake_stage(plan: StagePlan, stage: int) -> torch.nn.Module:
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = build_stage(plan, stage, seed=0)
    module.masks = functools.partial(_masks_from_real_shapes, module)
    return module


def _one_microbatch(plan: StagePlan, stage: int, seq_len: int, precision: str,
                    sequences: int) -> tuple[int, int, int]:
    """(the stage's parameters, bytes one microbatch keeps after its forward, the peak of its
    first backward), the bytes counting the stage's input and all the passes allocate."""
    module = _fake_stage(plan, stage)
    params = sum(p.numel() for p in module.parameters())
    width = hidden_size(plan.config)
    first, last = stage == 0, stage == len(plan.runs) - 1
    from noloco_rt.model.llama import lm_loss

    with FakeTensorMode(allow_non_fake_inputs=True), TensorMemoryTracker() as tracker:
        inputs = (torch.zeros(sequences, seq_len, dtype=torch.long) if first
                  else torch.zeros(sequences, seq_len, width, requires_grad=True))  # a received activation
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            output = module(inputs)
        if last:  # the loss and its backward at once; the logits stay alive, as in the worker
            targets = torch.zeros(sequences, seq_len, dtype=torch.long)
            loss = lm_loss(output.float(), targets)
        kept = tracker.live_bytes
        tracker.reset_peak()
        if last:
            loss.backward()
        else:
            output.backward(torch.zeros_like(output))  # the gradient that comes back
        return params, kept, tracker.peak_bytes


def _masks_from_real_shapes(module: Any, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str, Any]:
    """The stage's masks made from real stand-ins of the same shape: transformers cannot tell
    on fake tensors that a causal mask can be left to the attention kernel, and would make a
    (B, 1, T, T) mask a real run never has."""
    with unset_fake_temporarily():
        stand_in = torch.empty((hidden.shape[0], hidden.shape[1], 0), dtype=hidden.dtype)
        real_positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        return type(module).masks(module, stand_in, real_positions)

"""The memory plan (noloco_rt/memory/plan.py) against the model itself: parameter counts,
what a block saves for backward, and the whole peak of a real stage replica on the CPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks.memory_plan import measured_peak
from noloco_rt.config.presets import PRESETS
from noloco_rt.memory.plan import plan, stage_memory
from noloco_rt.memory.preset_ops import (
    block_activation_bytes_per_token,
    microbatch_activation_bytes,
    stage_params,
)
from noloco_rt.memory.settings import PlanSettings
from noloco_rt.memory.tracker import TensorMemoryTracker
from noloco_rt.model.llama import Block, PipelineStage, rotary_tables


def settings(preset: str = "tiny", **changes) -> PlanSettings:
    values = dict(preset=preset, stages=2, micro_batch=4, seq_len=64, vocab_size=256, precision="float32",
                  activation_checkpointing=False, max_inflight=4)
    return PlanSettings(**(values | changes))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_stage_parameter_counts_are_the_models_own(preset: str) -> None:
    for stages in (1, 3):
        for stage in range(stages):
            with torch.device("meta"):  # shapes only: the 7b preset costs nothing
                module = PipelineStage(PRESETS[preset], 1000, stage, stages)
            assert stage_params(PRESETS[preset], 1000, stages, stage) == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_blocks_saved_tensors_are_the_derived_bytes(precision: str) -> None:
    """What one block keeps for backward, measured, equals the formula to the byte (the
    bfloat16 weight casts apart, which the plan counts separately)."""
    shape, batch, seq = PRESETS["small"], 2, 32
    block = Block(shape)
    linear = sum(p.numel() for p in block.parameters() if p.dim() == 2)
    cos, sin = rotary_tables(seq, shape.dim // shape.n_heads, torch.device("cpu"))
    with TensorMemoryTracker() as tracker:
        x = torch.randn(batch, seq, shape.dim, requires_grad=True)
        before = tracker.live_bytes
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            out = block(x, cos, sin)
        saved = tracker.live_bytes - before - out.untyped_storage().nbytes()
    casts = 2 * linear if precision == "bfloat16" else 0
    assert saved - casts == batch * seq * block_activation_bytes_per_token(shape, precision) - batch * seq * 4 * shape.dim
    # (the formula counts the block's input, which the caller created: x above)


def test_checkpointing_keeps_only_the_blocks_inputs_and_more_in_flight_costs_whole_microbatches() -> None:
    plain, checkpointed = settings("small"), settings("small", activation_checkpointing=True)
    tokens, dim = plain.tokens, PRESETS["small"].dim
    # stage 0: three blocks' inputs, the token ids, the stage's output
    assert microbatch_activation_bytes(checkpointed, 0) == tokens * (3 * 4 * dim + 8 + 4 * dim)
    assert microbatch_activation_bytes(plain, 0) > 10 * microbatch_activation_bytes(checkpointed, 0)
    four, five = stage_memory(plain, 0), stage_memory(settings("small", max_inflight=5), 0)
    assert five.peak - four.peak == four.activations_per_microbatch + four.wire_copies // 4
    last = stage_memory(plain, 1)
    assert last.held_microbatches == 1 and last.wire_copies == 0  # the loss and its backward at once


def test_cuda_keeps_the_exchange_copies_on_the_host() -> None:
    cpu, cuda = stage_memory(settings("1b", precision="bfloat16"), 0), \
        stage_memory(settings("1b", precision="bfloat16", device="cuda"), 0)
    assert cpu.host == 0 and cuda.host > 0
    assert cuda.exchange == 0 and cpu.exchange > 4 * cpu.weights
    assert cuda.outer_working == 3 * cuda.weights  # θ's clone until it is on the host, Δ and β·Δ
    assert cuda.peak < cpu.peak


@pytest.mark.parametrize("bad", [dict(stages=5), dict(max_inflight=0), dict(precision="auto"), dict(preset="huge"),
                                 dict(wire_dtype="float8"), dict(snapshot_codec="gzip"), dict(device="tpu")])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        settings(**bad)


@pytest.mark.parametrize(("preset", "checkpointing", "stage"), [
    ("tiny", False, 0), ("tiny", False, 1), ("tiny", True, 0), ("tiny", True, 1),
    ("small", False, 0), ("small", False, 1), ("small", True, 0),
])
def test_planned_peak_is_within_15_percent_of_a_real_replicas(preset: str, checkpointing: bool, stage: int) -> None:
    """A real StageReplica: max_inflight forwards held, their backwards, the optimizer step,
    the outer step's buffers held over one more inner step (benchmarks/memory_plan.py)."""
    s = settings(preset, activation_checkpointing=checkpointing)
    planned, measured = plan(s)[stage].peak, measured_peak(s, stage)
    assert 0.85 <= planned / measured <= 1.15, (planned, measured)


def test_checkpointing_lowers_the_measured_peak_as_planned() -> None:
    plain, checkpointed = settings("small"), settings("small", activation_checkpointing=True)
    measured_plain, measured_checkpointed = measured_peak(plain, 0), measured_peak(checkpointed, 0)
    saved = measured_plain - measured_checkpointed
    planned_saving = stage_memory(plain, 0).peak - stage_memory(checkpointed, 0).peak
    assert saved > 0.3 * measured_plain
    assert 0.8 <= planned_saving / saved <= 1.2, (planned_saving, saved)

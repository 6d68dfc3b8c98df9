"""What one worker of a stage holds in memory, from the model's shape and the run's settings.

Pure arithmetic (no torch): shapes and settings in, bytes out, so `noloco-rt plan`, the
in-flight budget (noloco_rt.memory.fit) and the Kubernetes sizing share one estimate, and
tests hold it against peaks measured on a real StageReplica (benchmarks/memory_plan.py).

A worker holds, all at once in the worst case:

- weights θ, their gradients, AdamW's two moments, slow weights φ and outer momentum δ:
  float32 always (autocast computes in bfloat16 but keeps float32 parameters);
- the activations autograd saved for every microbatch waiting for its gradient. Stage 0
  and middle stages hold up to max_inflight of them; the last stage computes the loss and
  its backward at once, so it holds one;
- the outer exchange's buffers: our contribution at the outer step (θ, or φ and Δ) kept
  for the correction, its encoded copy, the partners' decoded contributions, and the
  copy of φ and δ published for joiners; with the overlapped step these live on across the
  next inner steps, so they are counted beside the activations (on CUDA they are host
  memory: the device holds our contribution only while it is copied out);
- the gradients, and the working memory of one block's backward (or of the optimizer step).

What one microbatch saves per block, and the first backward's worst moment, are derived
op by op for the presets in noloco_rt.memory.preset_ops.

A model the formulas do not know (`--model hf:PATH`) comes in measured instead: each stage
run on fake tensors (shapes, no data: noloco_rt.hf_model.memory) at the run's microbatch and
one sequence more, which gives what one microbatch keeps and the peak of its first backward
as a part fixed per microbatch and a part per sequence (MeasuredStage). The weights,
optimizers and exchange are the same arithmetic on its parameter count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from noloco_rt.memory.preset_ops import (
    backward_working_bytes,
    microbatch_activation_bytes,
    stage_layers,
    stage_params,
)
from noloco_rt.memory.settings import PlanSettings
from noloco_rt.memory.sizes import (
    CODEC_BYTES,
    FP32,
    OPTIMIZER_STEP_TENSORS,
    TOKEN_ID,
    WIRE_BYTES,
)


@dataclass(frozen=True)
class StageMemory:
    """Bytes one worker of `stage` holds, by what they are for."""

    stage: int
    layers: int
    params: int
    weights: int
    grads: int
    inner_optimizer: int
    outer_state: int
    """φ and δ (and with worker.delta_codec's error feedback, what is still unsent)."""
    exchange: int
    """The outer exchange's lasting buffers in the memory `peak` counts: on the CPU all of
    them; on CUDA none (our contribution is copied to the host at the outer step)."""
    exchange_host: int
    """The exchange's buffers in host memory on CUDA (0 on the CPU: they are `exchange`)."""
    activations_per_microbatch: int
    held_microbatches: int
    """Microbatches whose activations wait for their gradient at once (1 on the last stage)."""
    wire_copies: int
    """Sent microbatches kept in wire form for a re-send, all held ones together."""
    backward_working: int
    """The worst moment of a backward beyond the lasting state: every held microbatch's
    activations and wire copies, the gradients allocated so far, a block's working memory."""
    step_working: int
    """The optimizer step's: the gradients and the step's temporaries (activations are gone)."""
    outer_working: int
    """The outer step's, at an inner-step boundary (gradients freed): Δ and β·Δ, and on CUDA
    our contribution's clone on the device until its copy to the host is done."""

    @property
    def activations(self) -> int:
        return self.activations_per_microbatch * self.held_microbatches

    @property
    def lasting(self) -> int:
        """What stays between steps: weights, both optimizers' state, the exchange's buffers."""
        return self.weights + self.inner_optimizer + self.outer_state + self.exchange

    @property
    def peak(self) -> int:
        """The worst moment, in the memory the stage computes in (the device's on CUDA)."""
        return self.lasting + max(self.backward_working, self.step_working, self.outer_working)

    @property
    def peak_moment(self) -> str:
        """When the peak happens: backward, optimizer step, or outer step."""
        moments = {"backward": self.backward_working, "optimizer step": self.step_working,
                   "outer step": self.outer_working}
        return max(moments, key=lambda name: moments[name])

    @property
    def host(self) -> int:
        """Host memory beside the device's on CUDA (the exchange, wire copies); 0 on the CPU."""
        return 0 if self.exchange_host == 0 else self.exchange_host + self.wire_copies


def contribution_elements(s: PlanSettings, params: int) -> int:
    return params * (1 if s.theta_only else 2)


def exchange_host_bytes(s: PlanSettings, params: int) -> int:
    """The exchange's copies on the host: our contribution's encoding (and, on CUDA, its raw
    copy, kept for the correction), the partners' decoded contributions, and φ and δ
    published for joiners."""
    parts = contribution_elements(s, params)
    own_copy = FP32 * parts if s.device == "cuda" else 0  # on the CPU it is the kept contribution itself
    encoded = round(CODEC_BYTES[s.snapshot_codec] * parts)
    partners = (s.group_size - 1) * FP32 * parts
    bootstrap = 2 * FP32 * params
    return own_copy + encoded + partners + bootstrap


def outer_step_working_bytes(s: PlanSettings, params: int) -> int:
    """The provisional outer step's temporaries (Δ and β·Δ), and on CUDA the clone of our
    contribution on the device (on the CPU it is the kept contribution, in `exchange`)."""
    clone = FP32 * contribution_elements(s, params) if s.device == "cuda" else 0
    return clone + 2 * FP32 * params


def wire_copy_bytes(s: PlanSettings, stage: int) -> int:
    """A sent microbatch in wire form (activations and targets), kept until its gradient returns."""
    if stage == s.stages - 1:
        return 0
    c = s.measured[stage].width if s.measured else s.shape.dim
    per_token = WIRE_BYTES[s.wire_dtype] * c + (FP32 if s.wire_dtype in ("int8", "int4") else 0) + TOKEN_ID
    return round(s.tokens * per_token)


def held_microbatches(s: PlanSettings, stage: int) -> int:
    """The last stage (and a one-stage pipeline) computes each backward at once."""
    return 1 if stage == s.stages - 1 else s.max_inflight  # one stage: one batch (as_computed)


def as_computed(s: PlanSettings) -> PlanSettings:
    """The settings as the worker computes: a one-stage pipeline takes its step's microbatches
    as one batch (workers/data_path/roles.py, Alone), so it holds one batch of them all."""
    if s.stages > 1 or s.max_inflight == 1:
        return s
    return dataclasses.replace(s, micro_batch=s.micro_batch * s.max_inflight, max_inflight=1)


def stage_memory(s: PlanSettings, stage: int) -> StageMemory:
    if not 0 <= stage < s.stages:
        raise ValueError(f"stage must be in [0, {s.stages}), got {stage}")
    s = as_computed(s)
    held = held_microbatches(s, stage)
    wire = held * wire_copy_bytes(s, stage)
    wire_on_device = 0 if s.device == "cuda" else wire
    if s.measured:
        measured = s.measured[stage]
        params, layers, activations = measured.params, measured.layers, measured.activations(s.micro_batch)
        # the other held microbatches beside the first backward, which counts its own activations
        backward = (held - 1) * activations + wire_on_device + measured.first_backward(s.micro_batch)
    else:
        params = stage_params(s.shape, s.vocab_size, s.stages, stage)
        layers = stage_layers(s.shape.n_layers, s.stages, stage)
        activations = microbatch_activation_bytes(s, stage)
        backward = backward_working_bytes(s, stage, held, activations, wire_on_device)
    return _stage_memory(s, stage, params=params, layers=layers, held=held, activations=activations, wire=wire,
                         backward=backward)


def _stage_memory(s: PlanSettings, stage: int, *, params: int, layers: int, held: int, activations: int,
                  wire: int, backward: int) -> StageMemory:
    """The lasting state from the parameter count, beside a microbatch's activations."""
    on_device = s.device == "cuda"
    return StageMemory(
        stage=stage,
        layers=layers,
        params=params,
        weights=FP32 * params,
        grads=FP32 * params,
        inner_optimizer=2 * FP32 * params,
        outer_state=(3 if s.error_feedback else 2) * FP32 * params,
        exchange=0 if on_device else FP32 * contribution_elements(s, params) + exchange_host_bytes(s, params),
        exchange_host=exchange_host_bytes(s, params) if on_device else 0,
        activations_per_microbatch=activations,
        held_microbatches=held,
        wire_copies=wire,
        backward_working=backward,
        step_working=FP32 * params + OPTIMIZER_STEP_TENSORS * FP32 * params,
        outer_working=outer_step_working_bytes(s, params),
    )


def plan(s: PlanSettings) -> list[StageMemory]:
    """Every stage's estimate."""
    return [stage_memory(s, stage) for stage in range(s.stages)]

"""What one worker of a stage holds in memory, from the model's shape and the run's settings.

Pure arithmetic (no torch): shapes and settings in, bytes out, so `noloco-rt plan`, the
in-flight budget (noloco_rt.memory_fit) and the Kubernetes sizing share one estimate, and
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

Saved activations per token of one block, derived from what the model's ops save for
backward (noloco_rt/model.py), C = dim, F = ffn_dim, H = heads:

    float32: RMSNorm x (4C), x·rsqrt (4C), its output for wq/wk/wv (4C); rotated q and k
    (8C); v (4C); attention output and its log-sum-exp (4C + 4H); the output reshaped for
    wo (4C); the attention residual x1 (4C) with the second RMSNorm's x1·rsqrt (4C) and
    output (4C); w1 x, silu(w1 x), w3 x and their product (16F): 44C + 16F + 4H bytes.
    bfloat16 autocast: the residual stream and the norms stay float32 (4C + 4C, 4C + 4C),
    each linear saves its own bfloat16 cast of its input (3 · 2C for wq/wk/wv, 2 · 2C for
    w1/w3), q, k, v, the attention output and its reshape are bfloat16 (10C), the feed-
    forward's four tensors too (8F): 36C + 8F + 4H + 8 bytes, plus every linear weight's
    bfloat16 cast (2 bytes per parameter) kept by each microbatch's graph.
    Checkpointed: the block's input only (4C); one block is recomputed at a time in backward.

Measured on the CPU (float32 and bfloat16 autocast) these match to the byte; the whole
peak is checked within 15 % by tests/test_memory_plan.py.

A model the formulas do not know (`--model hf:PATH`) comes in measured instead: each stage
run on fake tensors (shapes, no data: noloco_rt.hf_model.memory) at the run's microbatch and
one sequence more, which gives what one microbatch keeps and the peak of its first backward
as a part fixed per microbatch and a part per sequence (MeasuredStage). The weights,
optimizers and exchange are the same arithmetic on its parameter count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from noloco_rt.config.presets import PRESETS, ModelShape

FP32 = 4
BF16 = 2
TOKEN_ID = 8  # int64 token ids and targets
WIRE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0}
# Encoded snapshot bytes per float32 element, upper ends (the docs measure shuffle-zstd at
# 1.16x and int8-zstd at 3.9x fewer bytes than raw; trained weights compress better than these).
CODEC_BYTES = {"raw": 4.0, "zstd": 4.0, "shuffle-zstd": 4.0, "bf16-shuffle-zstd": 2.0, "int8-zstd": 1.05,
               "int4-zstd": 0.55, "int2-zstd": 0.31}
PRECISION_BYTES = {"float32": FP32, "bfloat16": BF16}
OPTIMIZER_STEP_TENSORS = 1  # AdamW's temporary (foreach: the denominator), at most a float32 copy of the parameters


@dataclass(frozen=True)
class MeasuredStage:
    """One stage of a model measured rather than derived: bytes from a run on fake tensors."""

    params: int
    layers: int
    width: int
    """The stage's output features (what a wire copy carries per token)."""
    activations_fixed: int
    """What a microbatch's graph keeps whatever its size (autocast's weight casts)."""
    activations_per_sequence: int
    """What it keeps per sequence of model.seq_len tokens: saved tensors, the output, the ids."""
    backward_fixed: int
    """The first backward's peak beyond the lasting state, counting that microbatch's own
    activations and the gradients it allocates: the part fixed per microbatch..."""
    backward_per_sequence: int
    """...and the part per sequence."""

    def activations(self, sequences: int) -> int:
        return self.activations_fixed + sequences * self.activations_per_sequence

    def first_backward(self, sequences: int) -> int:
        return self.backward_fixed + sequences * self.backward_per_sequence


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What the estimate depends on besides the model's shape."""

    preset: str
    stages: int
    micro_batch: int
    """Sequences per microbatch (data.batch_size)."""
    seq_len: int
    vocab_size: int
    precision: str
    """float32 or bfloat16 (autocast): already resolved for the device."""
    activation_checkpointing: bool
    max_inflight: int
    wire_dtype: str = "float16"
    snapshot_codec: str = "int8-zstd"
    group_size: int = 2
    theta_only: bool = True
    """The outer exchange sends θ alone (γ = β) rather than φ and Δ."""
    error_feedback: bool = False
    """worker.delta_codec with its error feedback: one more copy of the stage (what is unsent)."""
    device: str = "cpu"
    """cpu: everything is one memory. cuda: the peak is the device's; the exchange's host
    copies and the wire copies are host memory (StageMemory.host)."""
    measured: tuple[MeasuredStage, ...] = ()
    """A model's stages measured (hf:PATH), one per stage; the preset is then not used."""

    def __post_init__(self) -> None:
        if self.measured:
            if len(self.measured) != self.stages:
                raise ValueError(f"{len(self.measured)} measured stages for stages = {self.stages}")
        elif self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}: one of {', '.join(PRESETS)}")
        elif not 1 <= self.stages <= PRESETS[self.preset].n_layers:
            raise ValueError(f"stages must be in [1, {PRESETS[self.preset].n_layers}] for preset {self.preset}, "
                             f"got {self.stages}")
        for name in ("micro_batch", "seq_len", "vocab_size", "max_inflight", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.precision not in PRECISION_BYTES:
            raise ValueError(f"precision must be float32 or bfloat16, got {self.precision!r}")
        if self.wire_dtype not in WIRE_BYTES:
            raise ValueError(f"wire_dtype must be one of {', '.join(WIRE_BYTES)}, got {self.wire_dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.snapshot_codec not in CODEC_BYTES:
            raise ValueError(f"snapshot_codec must be one of {', '.join(CODEC_BYTES)}, got {self.snapshot_codec!r}")

    @property
    def shape(self) -> ModelShape:
        return PRESETS[self.preset]

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch."""
        return self.micro_batch * self.seq_len


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


def stage_layers(n_layers: int, num_stages: int, stage: int) -> int:
    """Blocks of `stage` (noloco_rt.model.stage_layer_range's count, without importing torch)."""
    base, extra = divmod(n_layers, num_stages)
    return base + (1 if stage < extra else 0)


def block_params(shape: ModelShape) -> int:
    return 4 * shape.dim * shape.dim + 3 * shape.dim * shape.ffn_dim + 2 * shape.dim


def stage_params(shape: ModelShape, vocab_size: int, num_stages: int, stage: int) -> int:
    """Parameters of a stage: its blocks, the embedding on the first, final norm and head on the last."""
    params = stage_layers(shape.n_layers, num_stages, stage) * block_params(shape)
    if stage == 0:
        params += vocab_size * shape.dim
    if stage == num_stages - 1:
        params += shape.dim + vocab_size * shape.dim
    return params


def block_activation_bytes_per_token(shape: ModelShape, precision: str) -> int:
    """What one block saves for backward, per token (the module docstring derives it)."""
    c, f, h = shape.dim, shape.ffn_dim, shape.n_heads
    norms = 2 * FP32  # each RMSNorm's rsqrt, one float32 per token
    if precision == "float32":
        return 44 * c + 16 * f + 4 * h + norms
    return 36 * c + 8 * f + 4 * h + norms


def block_weight_casts(s: PlanSettings) -> int:
    """The bfloat16 copies of one block's linear weights a microbatch's graph keeps under autocast."""
    if s.precision == "float32":
        return 0
    return BF16 * (4 * s.shape.dim * s.shape.dim + 3 * s.shape.dim * s.shape.ffn_dim)


def head_activation_bytes(s: PlanSettings) -> int:
    """What the last stage's final norm, head and loss keep for one microbatch: the norm's
    input and x·rsqrt (float32), its output as the head's input, the logits (alive while the
    loss backward runs, as the worker holds them) and the log-probabilities the loss saves."""
    c, v = s.shape.dim, s.vocab_size
    width = PRECISION_BYTES[s.precision]
    head_cast = 0 if s.precision == "float32" else BF16 * v * c
    return s.tokens * (2 * FP32 * c + width * c + width * v + FP32 * v) + head_cast


def microbatch_activation_bytes(s: PlanSettings, stage: int) -> int:
    """Everything one microbatch keeps alive on the stage until its gradient is applied."""
    shape, n = s.shape, s.tokens
    layers = stage_layers(shape.n_layers, s.stages, stage)
    first, last = stage == 0, stage == s.stages - 1
    if s.activation_checkpointing:
        per_token = layers * FP32 * shape.dim  # each block's input
    else:
        per_token = layers * block_activation_bytes_per_token(shape, s.precision)
    if first:
        per_token += TOKEN_ID  # the token ids the embedding saves
    if not last:
        per_token += FP32 * shape.dim  # the stage's output, kept for the gradient that comes back
    casts = 0 if s.activation_checkpointing else layers * block_weight_casts(s)
    return n * per_token + casts + (head_activation_bytes(s) if last else 0)


def block_working_bytes(s: PlanSettings) -> int:
    """Working memory of one block's backward: gradients of its widest tensors (the feed-
    forward's F-wide ones) beside the residual stream's; when checkpointing, the block being
    recomputed also holds its full activations (and, under autocast, its weights' casts)."""
    shape, n = s.shape, s.tokens
    c, f = shape.dim, shape.ffn_dim
    working = n * (3 * FP32 * f + 4 * FP32 * c)
    if s.activation_checkpointing:
        working += n * block_activation_bytes_per_token(shape, s.precision) + block_weight_casts(s)
    return working


def backward_working_bytes(s: PlanSettings, stage: int, held: int, activations: int, wire: int) -> int:
    """The worst moment of the first backward, when every held microbatch is still there.

    Backward runs the blocks from last to first: each frees that microbatch's saved tensors
    of the block and allocates the block's gradients (the head's first on the last stage,
    whose loss backward also holds two float32 gradients of the logits; the embedding's last
    on stage 0). Which moment is worst depends on whether a block's activations outweigh its
    gradients, so every block boundary is tried. Later microbatches' backwards hold fewer
    activations and no new gradients, so they never exceed the first's."""
    shape, n = s.shape, s.tokens
    layers = stage_layers(shape.n_layers, s.stages, stage)
    first, last = stage == 0, stage == s.stages - 1
    saved_per_block = n * (FP32 * shape.dim if s.activation_checkpointing
                           else block_activation_bytes_per_token(shape, s.precision))
    casts_per_block = 0 if s.activation_checkpointing else block_weight_casts(s)
    block_grads = FP32 * block_params(shape)
    others = (held - 1) * activations + wire  # the other held microbatches, and all wire copies
    live = others + activations
    worst = live
    if last:  # the loss and head backward first: two float32 logits gradients, the head's own
        live += FP32 * (shape.dim + s.vocab_size * shape.dim)
        worst = live + n * 2 * FP32 * s.vocab_size
        live -= head_activation_bytes(s)  # freed once the head's backward is done
    for _ in range(layers):
        worst = max(worst, live + block_grads + block_working_bytes(s))
        live += block_grads - saved_per_block - casts_per_block
    if first:
        worst = max(worst, live + FP32 * s.vocab_size * shape.dim)  # the embedding's gradient, dense
    return worst


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
    per_token = WIRE_BYTES[s.wire_dtype] * c + (FP32 if s.wire_dtype == "int8" else 0) + TOKEN_ID
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

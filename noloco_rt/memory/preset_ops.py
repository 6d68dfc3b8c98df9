"""What the presets' ops keep for backward, op by op (pure arithmetic, no torch): one block's
saved activations per token, a microbatch's on a stage, and the worst moment of the first
backward. The memory plan (noloco_rt.memory.plan) adds the weights, optimizers and exchange.

Saved activations per token of one block, derived from what the model's ops save for
backward (noloco_rt/model/llama.py), C = dim, F = ffn_dim, H = heads:

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
peak is checked within 15 % by tests/memory/test_memory_plan.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from noloco_rt.memory.sizes import BF16, FP32, PRECISION_BYTES, TOKEN_ID

if TYPE_CHECKING:
    from noloco_rt.config.presets import ModelShape
    from noloco_rt.memory.settings import PlanSettings


def stage_layers(n_layers: int, num_stages: int, stage: int) -> int:
    """Blocks of `stage` (noloco_rt.model.llama.stage_layer_range's count, without importing torch)."""
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

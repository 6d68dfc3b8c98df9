"""A Llama-style decoder that cuts into pipeline stages by layer ranges.

Stage 0 holds the token embedding, the last stage the final norm, the head and the
loss. Parameter names are those of the whole model (``layers.3.attn.wq.weight``), and
every parameter is initialised from a generator seeded by (seed, name), so a stage
built alone is bit-identical to the same layers of the whole model, and every
replica of a stage built from one seed starts identical.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from noloco_rt.config.presets import PRESETS, ModelShape


def stage_layer_range(n_layers: int, num_stages: int, stage: int) -> range:
    """Layers of `stage` when n_layers are cut into num_stages contiguous, near-equal ranges."""
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"num_stages must be in [1, {n_layers}], got {num_stages}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage must be in [0, {num_stages}), got {stage}")
    base, extra = divmod(n_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


def rotary_tables(seq_len: int, head_dim: int, device: torch.device,
                  base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (T, head_dim/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, T, D); rotate interleaved pairs (x0, x1) by the position's angle.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.n_heads = shape.n_heads
        self.head_dim = shape.dim // shape.n_heads
        self.wq = nn.Linear(shape.dim, shape.dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.dim, bias=False)
        self.wo = nn.Linear(shape.dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w3 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w2 = nn.Linear(shape.ffn_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(shape.dim)
        self.attn = Attention(shape)
        self.ffn_norm = RMSNorm(shape.dim)
        self.ffn = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class PipelineStage(nn.Module):
    """Layers `layer_range` of the model, plus the embedding (first stage) or the head (last).

    forward takes token ids (B, T) on the first stage and hidden states (B, T, C)
    elsewhere; it returns hidden states, or logits (B, T, V) on the last stage. Built on the
    meta device for its shapes; build_stage gives it weights (init_parameters).
    """

    def __init__(self, shape: ModelShape, vocab_size: int, stage: int, num_stages: int) -> None:
        super().__init__()
        self.shape = shape
        self.vocab_size = vocab_size
        self.stage = stage
        self.num_stages = num_stages
        self.layer_range = stage_layer_range(shape.n_layers, num_stages, stage)
        self.is_first = stage == 0
        self.is_last = stage == num_stages - 1
        # Embedding's own normal_ init is skipped (its weight is given): build_stage initialises every
        # parameter anyway, and on the meta device that normal_ imports torch._dynamo, ~2 s per process.
        self.embed = nn.Embedding(vocab_size, shape.dim, _weight=torch.empty(vocab_size, shape.dim)) \
            if self.is_first else None
        self.layers = nn.ModuleDict({str(i): Block(shape) for i in self.layer_range})
        self.norm = RMSNorm(shape.dim) if self.is_last else None
        self.head = nn.Linear(shape.dim, vocab_size, bias=False) if self.is_last else None
        self._rotary_cache: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self.activation_checkpointing = False
        """Keep only each block's input for backward and recompute the block then: about one
        more forward of compute for a block's activations in memory (noloco_rt.memory.plan)."""

    def rotary(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables (cos, sin) for `seq_len` positions on `device`, made on first use."""
        key = (seq_len, device)
        if key not in self._rotary_cache:
            self._rotary_cache[key] = rotary_tables(seq_len, self.shape.dim // self.shape.n_heads, device)
        return self._rotary_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)  # (B, T) -> (B, T, C)
        cos, sin = self.rotary(x.shape[1], x.device)
        checkpointed = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.layers.values():
            # Non-reentrant: gradients identical to the plain forward, autocast state replayed.
            x = checkpoint(block, x, cos, sin, use_reentrant=False) if checkpointed else block(x, cos, sin)
        if self.head is not None:
            assert self.norm is not None
            x = self.head(self.norm(x))  # (B, T, V)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in nats; logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _param_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


@torch.no_grad()
def init_parameters(module: PipelineStage, seed: int) -> None:
    """Deterministic init that depends only on (seed, parameter name): N(0, 0.02) for
    matrices, scaled by 1/sqrt(2·layers) on residual outputs; ones for norms."""
    residual_scale = 1.0 / math.sqrt(2 * module.shape.n_layers)
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        generator = torch.Generator().manual_seed(_param_seed(seed, name))
        std = 0.02 * (residual_scale if name.endswith(("wo.weight", "w2.weight")) else 1.0)
        values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
        param.copy_(values.to(param.dtype))


def build_stage(shape: ModelShape | str, *, vocab_size: int, stage: int, num_stages: int, seed: int,
                device: torch.device | str = "cpu") -> PipelineStage:
    """One stage, initialised so that it equals the same layers of build_model(seed)."""
    if isinstance(shape, str):
        shape = PRESETS[shape]
    with torch.device("meta"):
        module = PipelineStage(shape, vocab_size, stage, num_stages)
    module.to_empty(device=device)
    init_parameters(module, seed)
    return module


def build_model(shape: ModelShape | str, *, vocab_size: int, seed: int,
                device: torch.device | str = "cpu") -> PipelineStage:
    """The whole model: a single stage holding every layer."""
    return build_stage(shape, vocab_size=vocab_size, stage=0, num_stages=1, seed=seed, device=device)

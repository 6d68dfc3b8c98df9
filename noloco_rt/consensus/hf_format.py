"""The Hugging Face Llama layout of a noloco-rt model, both ways: tensor names, the rotary
permutation of wq / wk, and config.json.

Pure logic: no files, and no `transformers` import (it is a test-only dependency).

The two models differ in one place beyond names. noloco_rt.model.llama rotates interleaved
pairs (features 2i, 2i+1 of a head share frequency i); HF Llama's rotate_half pairs
feature i with i + head_dim/2. Permuting the rows of wq and wk within each head turns
one into the other; q·k is unchanged because both get the same permutation, and wv,
wo see no rotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from noloco_rt.config.presets import ModelShape

ROPE_THETA = 10000.0
"""noloco_rt.model.llama.rotary_tables' base."""
RMS_NORM_EPS = 1e-6
"""noloco_rt.model.llama.RMSNorm's eps."""

_TOP_LEVEL = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "head.weight": "lm_head.weight"}
_IN_LAYER = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
             "attn.wo": "self_attn.o_proj", "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj",
             "ffn.w2": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_ROTATED = ("attn.wq.weight", "attn.wk.weight")


class HFFormatError(ValueError):
    """Something cannot be mapped between the two layouts; the message names it."""


# -- names --------------------------------------------------------------------------------


def hf_name(name: str) -> str:
    """The HF Llama name of noloco parameter `name` (``layers.3.attn.wq.weight`` →
    ``model.layers.3.self_attn.q_proj.weight``)."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
        module, _, leaf = parts[2].rpartition(".")
        if module in _IN_LAYER and leaf == "weight":
            return f"model.layers.{parts[1]}.{_IN_LAYER[module]}.weight"
    raise HFFormatError(f"parameter {name} has no Hugging Face Llama counterpart")


def is_rotated(name: str) -> bool:
    """Whether noloco parameter `name` feeds the rotary embedding (its rows get permuted)."""
    return name.startswith("layers.") and name.endswith(_ROTATED)


# -- the rotary permutation ---------------------------------------------------------------


def _head_view(weight: torch.Tensor, n_heads: int) -> tuple[int, int, int]:
    rows, columns = weight.shape
    if rows % n_heads or (rows // n_heads) % 2:
        raise HFFormatError(f"{rows} rows do not split into {n_heads} heads of an even size")
    return rows, columns, rows // n_heads


def interleaved_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """wq / wk rows reordered per head from interleaved rotary pairs to HF's halves."""
    rows, columns, head_dim = _head_view(weight, n_heads)
    return weight.reshape(n_heads, head_dim // 2, 2, columns).transpose(1, 2).reshape(rows, columns)


def halves_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of interleaved_to_halves."""
    rows, columns, head_dim = _head_view(weight, n_heads)
    return weight.reshape(n_heads, 2, head_dim // 2, columns).transpose(1, 2).reshape(rows, columns)


def to_hf(name: str, tensor: torch.Tensor, n_heads: int) -> tuple[str, torch.Tensor]:
    """(HF name, HF tensor) of noloco parameter `name`."""
    mapped = hf_name(name)
    return mapped, interleaved_to_halves(tensor, n_heads) if is_rotated(name) else tensor


def from_hf(name: str, tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
    """noloco parameter `name` from the HF tensor stored under hf_name(name)."""
    return halves_to_interleaved(tensor, n_heads) if is_rotated(name) else tensor


# -- config.json --------------------------------------------------------------------------


def hf_config(shape: ModelShape, *, vocab_size: int, seq_len: int, eos_token_id: int | None = None) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM equal to the noloco model of this shape."""
    rope = {"rope_type": "default", "rope_theta": ROPE_THETA}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": shape.dim, "intermediate_size": shape.ffn_dim,
        "num_hidden_layers": shape.n_layers, "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_heads, "head_dim": shape.dim // shape.n_heads,
        "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS, "max_position_embeddings": seq_len,
        # transformers 5 reads rope_parameters, 4.x rope_theta; both say the same.
        "rope_parameters": rope, "rope_theta": ROPE_THETA,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        # dtype for transformers 5, torch_dtype for 4.x: the weights are float32.
        "initializer_range": 0.02, "use_cache": True, "dtype": "float32", "torch_dtype": "float32",
        # Byte-level runs have no special tokens; a run on prepared data ends each document with
        # one, which `generate` must stop at.
        "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None,
    }


def generation_config(eos_token_id: int | None = None) -> dict[str, Any]:
    return {"_from_model_config": True, "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None}


def _rope_theta(config: Mapping[str, Any]) -> tuple[float, str]:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise HFFormatError(f"config.json: rope_parameters = {rope!r} is not an object")
    theta = rope.get("rope_theta", config.get("rope_theta", ROPE_THETA))
    return float(theta), str(rope.get("rope_type", rope.get("type", "default")))


def check_hf_config(config: Mapping[str, Any], shape: ModelShape) -> None:
    """Refuse an HF config whose model computes something else than noloco's of `shape`
    even where the tensor shapes agree (tensor shapes are checked one by one elsewhere)."""
    theta, rope_type = _rope_theta(config)
    heads = config.get("num_attention_heads")
    checks = [
        ("model_type", config.get("model_type"), "llama"),
        ("hidden_act", config.get("hidden_act", "silu"), "silu"),
        ("rope type", rope_type, "default"),
        ("rope_theta", theta, ROPE_THETA),
        ("rms_norm_eps", float(config.get("rms_norm_eps", RMS_NORM_EPS)), RMS_NORM_EPS),
        ("num_attention_heads", heads, shape.n_heads),
        ("num_key_value_heads", config.get("num_key_value_heads") or heads, shape.n_heads),
        ("head_dim", config.get("head_dim") or shape.dim // shape.n_heads, shape.dim // shape.n_heads),
        ("num_hidden_layers", config.get("num_hidden_layers"), shape.n_layers),
        ("attention_bias", bool(config.get("attention_bias", False)), False),
        ("mlp_bias", bool(config.get("mlp_bias", False)), False),
    ]
    for field, found, wanted in checks:
        if found != wanted:
            raise HFFormatError(f"config.json: {field} = {found!r}, the run's model needs {wanted!r}")

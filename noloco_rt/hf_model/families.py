"""Where each supported transformers family keeps its parts: pure data, no torch.

A family is staged only if its decoder is embedding -> a list of layers that take the hidden
states alone (plus positions and a causal mask, which every stage recomputes from the
sequence length) -> final norm -> head. Families outside this table, and options that break
that shape, are refused at start in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnstageableModel(ValueError):
    """The model folder cannot be staged: one line naming what and why."""


@dataclass(frozen=True)
class Family:
    base: str
    """The decoder's attribute on the causal LM (model.embed_tokens, transformer.wte, ...)."""
    embed: str
    layers: str
    norm: str
    position_embed: str | None = None
    """Learned absolute positions added on stage 0 (GPT-2's wpe); None: rotary."""
    rotary: str | None = "rotary_emb"
    """The decoder's rotary module, recomputed on every stage; None: no rotary."""
    embed_dropout: str | None = None
    head: str = "lm_head"


ROTARY_DECODER = Family(base="model", embed="embed_tokens", layers="layers", norm="norm")

FAMILIES: dict[str, Family] = {
    "llama": ROTARY_DECODER,
    "qwen2": ROTARY_DECODER,
    "mistral": ROTARY_DECODER,
    "gpt2": Family(base="transformer", embed="wte", layers="h", norm="ln_f", position_embed="wpe",
                   rotary=None, embed_dropout="drop"),
}


def family_of(config: Any) -> Family:
    """The family of a transformers config, or UnstageableModel naming what cannot be staged."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise UnstageableModel(f"model_type {model_type!r} cannot be staged yet: supported are "
                               f"{', '.join(sorted(FAMILIES))}")
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention", False):
        raise UnstageableModel(f"{model_type} with cross-attention cannot be staged: a stage passes only the "
                               f"decoder's hidden states")
    if _ties_embeddings(config):
        raise UnstageableModel(f"{model_type} ties its input embedding to its output head "
                               f"(tie_word_embeddings = true), which noloco-rt cannot keep tied (with "
                               f"stages they sit apart): set tie_word_embeddings = false in config.json "
                               f"(the head then trains on its own)")
    return FAMILIES[model_type]


def _ties_embeddings(config: Any) -> bool:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text_config, "tie_word_embeddings", False))


def layer_count(config: Any) -> int:
    return int(config.num_hidden_layers if hasattr(config, "num_hidden_layers") else config.n_layer)


def hidden_size(config: Any) -> int:
    return int(config.hidden_size if hasattr(config, "hidden_size") else config.n_embd)

"""One pipeline stage of a transformers causal LM, made of the model's own modules.

The stage keeps the causal LM's attribute names (model.layers.3..., lm_head), so its
state_dict keys are the folder's own weight names: loading and exporting need no renaming.
Stage 0 takes token ids; the others take the previous stage's hidden states. Positions and
the causal mask depend only on the sequence length, so every stage recomputes them rather
than receiving them: a few kilobytes of work against sending T x head_dim tables per
microbatch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import masking_utils  # only hf:PATH runs import this module

from noloco_rt.hf_model.families import Family


class HFStage(nn.Module):
    def __init__(self, lm: nn.Module, family: Family, layers: range, *, first: bool, last: bool) -> None:
        super().__init__()
        base = getattr(lm, family.base)
        all_layers = getattr(base, family.layers)
        kept = nn.ModuleDict({str(i): all_layers[i] for i in layers})
        for name in (family.embed, family.position_embed, family.embed_dropout):
            if name and not first:
                delattr(base, name)
        if not last:
            delattr(base, family.norm)
        delattr(base, family.layers)
        base.add_module(family.layers, kept)
        self.add_module(family.base, base)
        if last:
            self.add_module(family.head, getattr(lm, family.head))
        self.config = lm.config
        self.family = family
        self.first, self.last = first, last
        self.layer_kinds = {str(i): _attention_kind(lm.config, i) for i in layers}

    @property
    def base(self) -> nn.Module:
        return getattr(self, self.family.base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        family, base = self.family, self.base
        if self.first:
            hidden = getattr(base, family.embed)(x)
        else:
            hidden = x
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        if self.first and family.position_embed:
            hidden = hidden + getattr(base, family.position_embed)(positions)
        if self.first and family.embed_dropout:
            hidden = getattr(base, family.embed_dropout)(hidden)
        masks = self.masks(hidden, positions)
        extra: dict[str, Any] = {}
        if family.rotary:
            extra = {"position_embeddings": getattr(base, family.rotary)(hidden, positions), "position_ids": positions}
        for index, layer in getattr(base, family.layers).items():
            hidden = layer(hidden, attention_mask=masks[self.layer_kinds[index]], **extra)
        if not self.last:
            return hidden
        hidden = getattr(base, family.norm)(hidden)
        return getattr(self, family.head)(hidden)

    def masks(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str, Any]:
        """Each attention kind's mask (noloco_rt.hf_model.memory swaps this while it measures)."""
        return {kind: _mask(kind, self.config, hidden, positions) for kind in set(self.layer_kinds.values())}


def _attention_kind(config: Any, index: int) -> str:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return str(layer_types[index])
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"


def _mask(kind: str, config: Any, hidden: torch.Tensor, positions: torch.Tensor) -> Any:
    """transformers' own mask for this attention kind (None where its attention can take
    is_causal instead: no padding in training batches)."""
    make = (masking_utils.create_sliding_window_causal_mask if kind == "sliding_attention"
            else masking_utils.create_causal_mask)
    return make(config=config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=positions)

"""Evaluate and sample a whole model: validation loss in nats, byte-level generation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from noloco_rt.config import Config
from noloco_rt.data import (
    BYTE_VOCAB_SIZE,
    DOCUMENT_SEPARATOR,
    Corpus,
    decode,
    encode,
    load_corpus,
    validation_batches,
    validation_capacity,
)
from noloco_rt.model.llama import lm_loss
from noloco_rt.model.staged import staged_model

Batch = tuple[torch.Tensor, torch.Tensor]


def load_validation_batches(cfg: Config, *, batches: int | None = None, corpus: Corpus | None = None) -> list[Batch]:
    """The run's fixed validation batches (the same ones the simulator and observer use):
    your own model's val_batches() when it brings its own data (model.factory). Of the token
    data, `batches` (default run.eval_batches) but never more than the split holds distinct:
    more would repeat windows and weigh them twice."""
    if cfg.model.factory and (own := staged_model(cfg)).val_batches is not None:
        return list(own.val_batches())
    corpus = corpus or load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
    capacity = validation_capacity(corpus.val, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size)
    return validation_batches(corpus.val, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size,
                              count=max(1, min(batches or cfg.run.eval_batches, capacity)))


@torch.no_grad()
def validation_loss(model: nn.Module, cfg: Config, *, batches: int | None = None, device: torch.device | str = "cpu",
                    corpus: Corpus | None = None, val_batches: Sequence[Batch] | None = None) -> float:
    """Mean loss of the whole model over the validation batches: next-token loss in nats for
    a preset, your own model's loss with model.factory.

    Pass `val_batches` (or `corpus`) when evaluating repeatedly, to load the corpus once.
    """
    if val_batches is None:
        val_batches = load_validation_batches(cfg, batches=batches, corpus=corpus)
    loss = staged_model(cfg).loss if cfg.model.factory else lm_loss
    was_training = model.training
    model.eval()
    try:
        # The batches are equal-sized, so the mean of batch means is the mean over tokens.
        losses = [float(loss(model(inputs.to(device)).float(), targets.to(device))) for inputs, targets in val_batches]
    finally:
        model.train(was_training)
    return sum(losses) / len(losses)


def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator,
                limit: int | None = BYTE_VOCAB_SIZE) -> int:
    """Sample one id below `limit` (None: any) from logits (V,); temperature 0 is greedy."""
    logits = logits[:limit].float()  # byte-level text: ids above 255 are not characters
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


class Codec(Protocol):
    """Text <-> ids of a run's tokenizer (noloco_rt.prepare.tokenizer.TextCodec)."""

    separator: list[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


@torch.no_grad()
def generate(model: nn.Module, prompt: str, *, max_new_tokens: int, temperature: float, top_k: int | None,
             seed: int, context_len: int, codec: Codec | None = None, vocab_size: int | None = None) -> str:
    """Continue `prompt` by `max_new_tokens` tokens (bytes unless `codec` is given) and
    return only the new text.

    The model sees the last `context_len` tokens (the length it was trained on); an
    empty prompt starts as a new document does. Same seed, same text. `vocab_size`: sample
    only the first ids (the data's, where the model's vocabulary is larger).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:  # also rejects NaN
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens = (codec.encode(prompt) or list(codec.separator)) if codec else (encode(prompt) or list(DOCUMENT_SEPARATOR))
    new: list[int] = []
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            context = torch.tensor([tokens[-context_len:]], dtype=torch.long, device=device)  # (1, T)
            logits = model(context)[0, -1]  # (V,) at the last position
            limit = vocab_size if vocab_size is not None else (None if codec else BYTE_VOCAB_SIZE)
            token = _next_token(logits, temperature, top_k, generator, limit)
            tokens.append(token)
            new.append(token)
    finally:
        model.train(was_training)
    return codec.decode(new) if codec else decode(new)

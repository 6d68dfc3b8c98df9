"""Small random transformers model folders, written by the tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 300
"""Above the byte-level data's 256 ids, so the run's default data fits every family."""


def family_config(family: str, *, layers: int = 4, tie: bool = False):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    rotary = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=tie)
    if family == "llama":
        return LlamaConfig(**rotary)
    if family == "qwen2":
        return Qwen2Config(**rotary)
    if family == "mistral":  # a window shorter than the test's sequences: the sliding mask matters
        return MistralConfig(**rotary, sliding_window=8)
    if family == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=128,
                          tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0)
    raise ValueError(family)


def write_folder(folder: Path, family: str, *, weights: bool = True, seed: int = 1, **options: object):
    """A transformers folder (config.json, and model.safetensors when `weights`); returns the
    reference AutoModelForCausalLM in eval mode, sdpa attention."""
    from transformers import AutoModelForCausalLM

    config = family_config(family, **options)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    if weights:
        model.save_pretrained(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(folder)
    return model

"""Hugging Face causal LMs staged for the pipeline (`--model hf:PATH`): a transformers model
folder split into stages built from transformers' own modules (docs/own-model.md)."""

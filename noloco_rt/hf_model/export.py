"""A consensus of an `hf:PATH` model written back as a transformers folder of the same
architecture: the folder's config (float32, the run's end-of-document id when known) and
the consensus weights under their own names, loadable with AutoModelForCausalLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from noloco_rt.hf_model.build import load_config

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"


def hf_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights under the folder's names: the consensus's stages are an
    nn.Sequential, so each name loses its leading stage index and nothing else."""
    return {name.split(".", 1)[1]: tensor.detach().to("cpu", torch.float32).contiguous()
            for name, tensor in model.state_dict().items()}


def hf_folder_config(folder: str, eos_token_id: int | None) -> dict[str, Any]:
    config = load_config(Path(folder))
    config.dtype = torch.float32
    if eos_token_id is not None:
        config.eos_token_id = eos_token_id
    written = json.loads(config.to_json_string())
    written.pop("_name_or_path", None)  # a path on the machine that trained it, nothing to load
    return written

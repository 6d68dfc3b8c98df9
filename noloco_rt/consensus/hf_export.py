"""Write a noloco-rt model as a Hugging Face LlamaForCausalLM folder: config.json,
model.safetensors, generation_config.json and, when the run names one, tokenizer.json.

The mapping itself is noloco_rt.consensus.hf_format; this module only writes files. Every file is
written atomically (temporary file, then rename), so an interrupted export never leaves
a half-written file under the final name, and gets the mode of any new file of the user's
(0644 under umask 022).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from noloco_rt.checkpoints.shared_files import make_shared, write_shared_file
from noloco_rt.config import Config
from noloco_rt.config.prepared_manifest import run_tokenizer_path
from noloco_rt.consensus.hf_format import generation_config, hf_config, to_hf
from noloco_rt.model.llama import PipelineStage

WEIGHTS_FILE = "model.safetensors"


class HFExportError(ValueError):
    """The folder cannot be written; the message says why in one line."""


def check_out_dir(out: Path, *, force: bool) -> None:
    """Refuse an OUT that is a file, or a folder with something in it unless force."""
    if out.exists() and not out.is_dir():
        raise HFExportError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise HFExportError(f"{out} exists and is not empty; choose another folder or pass --force")


def hf_state_dict(model: PipelineStage) -> dict[str, torch.Tensor]:
    """The whole model's parameters under HF names, float32, contiguous, on the CPU."""
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        mapped, tensor = to_hf(name, param.detach().to("cpu", torch.float32), model.shape.n_heads)
        tensors[mapped] = tensor.contiguous()
    return tensors


def _write_json(path: Path, value: dict) -> None:
    write_shared_file(path, (json.dumps(value, indent=2) + "\n").encode())


def _write_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    # save_file streams to disk (no second copy of the model in memory); "pt" is what
    # transformers requires in the metadata.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt"})
        make_shared(Path(tmp))  # mkstemp made it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_tokenizer_file(cfg: Config) -> Path | None:
    """The tokenizer.json a config names (data.tokenizer, or its prepared directory's), if it
    is here: a tokenizer.json file or a folder holding one. Only for a config the user gave
    (commands.export puts what they named in it): a file's own never picks files to copy."""
    path = run_tokenizer_path(cfg)
    if path is None:
        return None
    candidate = path / "tokenizer.json" if path.is_dir() else path
    return candidate if candidate.is_file() else None


def write_hf_folder(out: Path, cfg: Config, model: PipelineStage | torch.nn.Module, *, force: bool = False,
                    tokenizer: Path | None = None, eos_token_id: int | None = None) -> list[Path]:
    """Write the folder, with `tokenizer` (a tokenizer.json the caller chose) as its
    tokenizer.json and `eos_token_id` (the end-of-document token) in its configs; returns the
    files written."""
    check_out_dir(out, force=force)
    if cfg.model.hf_folder is not None:  # a transformers folder's model: its own names and config
        from noloco_rt.hf_model.export import hf_folder_config, hf_weights

        tensors, config = hf_weights(model), hf_folder_config(cfg.model.hf_folder, eos_token_id)
    elif not model.is_first or not model.is_last:
        raise HFExportError("only a whole model (one stage holding every layer) can be exported")
    else:
        tensors = hf_state_dict(model)
        config = hf_config(model.shape, vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len,
                           eos_token_id=eos_token_id)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "config.json", out / WEIGHTS_FILE, out / "generation_config.json"]
    _write_weights(out / WEIGHTS_FILE, tensors)
    _write_json(written[0], config)
    _write_json(written[2], generation_config(eos_token_id))
    if tokenizer is not None:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        written.append(out / "tokenizer.json")
    return written

"""A model folder's weights, read by name from safetensors files (one, or shards with an
index), so a stage reads only its own tensors. Pickled weights (pytorch_model.bin) are
refused: loading them runs code the file chooses."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from noloco_rt.hf_model.families import UnstageableModel

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def weight_files(folder: Path) -> dict[str, Path] | None:
    """Weight name -> the file holding it; None when the folder has no weights (the stages
    then start from run.seed)."""
    if (folder / INDEX).is_file():
        try:
            index = json.loads((folder / INDEX).read_text())
            return {name: folder / file for name, file in index["weight_map"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UnstageableModel(f"{folder / INDEX} is not a safetensors index ({exc})") from None
    if (folder / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(str(folder / SINGLE), framework="pt") as handle:
            return {name: folder / SINGLE for name in handle.keys()}  # noqa: SIM118 (not a dict)
    pickled = sorted(p.name for p in folder.glob("*.bin"))
    if pickled:
        raise UnstageableModel(f"{folder} holds weights only as {pickled[0]} (a pickle, which runs code "
                               f"when loaded): convert them to model.safetensors first")
    return None


def read_weights(files: dict[str, Path], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The named tensors as float32, each file opened once; UnstageableModel naming the
    first weight the folder lacks."""
    from safetensors import safe_open

    wanted = list(names)
    missing = [name for name in wanted if name not in files]
    if missing:
        raise UnstageableModel(f"the folder's weights lack {missing[0]}"
                               + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for file, file_names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in file_names:
                tensors[name] = handle.get_tensor(name).float()
    return tensors

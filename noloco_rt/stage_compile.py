"""torch.compile for a worker's stage (model.compile): each transformer block on its own.

Blocks, not the whole stage: every block runs the same code, so one compiled graph serves
them all and compiling costs one block's time whatever the depth; the embedding, the
head and the rotary tables (a cache filled on first use, which a whole-stage graph would
recompile for) stay eager. `nn.Module.compile` compiles in place, so parameter names,
checkpoints and the outer step see the same module as without it.
"""

from __future__ import annotations

import torch
from torch import nn

from noloco_rt.model import PipelineStage


def compile_wanted(setting: str, device: torch.device | str) -> bool:
    """Whether model.compile = `setting` compiles on `device` (auto: on CUDA only)."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"model.compile = {setting!r}: expected auto, on or off")
    return setting == "on" or (setting == "auto" and torch.device(device).type == "cuda")


def compile_blocks(module: PipelineStage | nn.Module, *, backend: str = "inductor") -> int:
    """Compile each block of `module` in place (lazily: at its first forward); returns how many.
    A module that is not a preset's stage (your own model) is compiled whole: one."""
    if not isinstance(module, PipelineStage):
        module.compile(backend=backend)
        return 1
    blocks = list(module.layers.values())
    for block in blocks:
        block.compile(backend=backend)
    return len(blocks)

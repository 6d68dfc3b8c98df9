"""torch.compile for a worker's stage (model.compile), per model.compile_scope.

block (the default): each transformer block on its own. Every block runs the same code, so
one compiled graph serves them all and compiling costs one block's time whatever the depth;
the embedding, the head and the rotary tables stay eager. stage: the whole stage as one
graph (fewer, fused launches; a compile that grows with depth); its rotary tables for the
run's sequence length are made before compiling, since the graph guards on that cache and a
first call that fills it would compile the stage a second time. `nn.Module.compile` compiles
in place, so parameter names, checkpoints and the outer step see the same module as without it.

model.cuda_graphs = on compiles in torch.compile's reduce-overhead mode on CUDA: each compiled
graph replays as a CUDA graph. A replay writes its outputs into memory the next one reuses, so
the worker keeps gradient buffers of its own (noloco_rt.algo.optim) and copies what a graph
made before the wire reads it (workers/device.py).
"""

from __future__ import annotations

import torch
from torch import nn

from noloco_rt.model.llama import PipelineStage


def compile_wanted(setting: str, device: torch.device | str) -> bool:
    """Whether model.compile = `setting` compiles on `device` (auto: on CUDA only)."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"model.compile = {setting!r}: expected auto, on or off")
    return setting == "on" or (setting == "auto" and torch.device(device).type == "cuda")


def cuda_graphs_wanted(setting: str, device: torch.device | str) -> bool:
    """Whether model.cuda_graphs = `setting` replays compiled graphs as CUDA graphs on `device`
    (on CUDA only: elsewhere there is nothing to replay)."""
    if setting not in ("off", "on"):
        raise ValueError(f"model.cuda_graphs = {setting!r}: expected off or on")
    return setting == "on" and torch.device(device).type == "cuda"


def compile_blocks(module: PipelineStage | nn.Module, *, backend: str = "inductor", mode: str | None = None) -> int:
    """Compile each block of `module` in place (lazily: at its first forward); returns how many.
    A module that is not a preset's stage (your own model) is compiled whole: one. `mode`:
    torch.compile's (None: its default; reduce-overhead: CUDA graphs)."""
    if not isinstance(module, PipelineStage):
        module.compile(backend=backend, mode=mode)
        return 1
    blocks = list(module.layers.values())
    for block in blocks:
        block.compile(backend=backend, mode=mode)
    return len(blocks)


def compile_stage(module: PipelineStage | nn.Module, *, scope: str, seq_len: int, backend: str = "inductor",
                  cuda_graphs: bool = False) -> int:
    """Compile `module` in place as model.compile_scope says (block or stage), its graphs
    replayed as CUDA graphs if `cuda_graphs`; returns how many compiled callables it now holds.
    Your own model is compiled whole whatever the scope."""
    if scope not in ("block", "stage"):
        raise ValueError(f"model.compile_scope = {scope!r}: expected block or stage")
    mode = "reduce-overhead" if cuda_graphs else None
    if scope == "block" or not isinstance(module, PipelineStage):
        return compile_blocks(module, backend=backend, mode=mode)
    device = next(module.parameters()).device  # the inputs' device: the cache's key
    module.rotary(seq_len, device)  # filled before the graph is traced: no second compile
    module.compile(backend=backend, mode=mode)
    return 1

"""A worker's stage compiled as model.compile, model.compile_scope and model.cuda_graphs say.

CUDA graphs replay into memory the next replay reuses: with them on, the inner optimizer
keeps gradient buffers of its own (noloco_rt/algo/optim.py), and the data path copies what a
graph made before the wire reads it (its `graph_outputs`, workers/device.py).
"""

from __future__ import annotations

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import ModelConfig
from noloco_rt.logs import EventLog
from noloco_rt.model.compile_stage import compile_stage, compile_wanted, cuda_graphs_wanted


def compile_for_device(replica: StageReplica, model_cfg: ModelConfig, device: torch.device, log: EventLog) -> bool:
    """Compile `replica`'s module in place if model.compile asks for it on `device`, its graphs
    replayed as CUDA graphs if model.cuda_graphs does and `device` is CUDA; returns whether
    CUDA graphs are in effect. Graphs asked for where they cannot be are said in the log."""
    compiled = compile_wanted(model_cfg.compile, device)
    cuda_graphs = compiled and cuda_graphs_wanted(model_cfg.cuda_graphs, device)
    if compiled:
        count = compile_stage(replica.module, scope=model_cfg.compile_scope, seq_len=model_cfg.seq_len,
                              cuda_graphs=cuda_graphs)
        if cuda_graphs:
            replica.inner.keep_gradient_buffers()
        log.info("stage_compiled", scope=model_cfg.compile_scope, compiled=count, cuda_graphs=cuda_graphs,
                 note="compiles at its first forward")
    if model_cfg.cuda_graphs == "on" and not cuda_graphs:  # said, since it was asked for
        log.info("cuda_graphs_unused", device=str(device), note="CUDA graphs need a CUDA device")
    return cuda_graphs

"""model.compile: which devices compile, and a compiled stage computes what the eager one does."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.model.compile_stage import (
    compile_blocks,
    compile_stage,
    compile_wanted,
    cuda_graphs_wanted,
)
from noloco_rt.model.llama import build_stage, lm_loss


def test_auto_compiles_on_cuda_only_and_bad_values_are_refused():
    assert compile_wanted("auto", "cuda") and compile_wanted("auto", torch.device("cuda", 1))
    assert not compile_wanted("auto", "cpu")
    assert compile_wanted("on", "cpu") and not compile_wanted("off", "cuda")
    with pytest.raises(ValueError, match="model.compile = 'yes'"):
        compile_wanted("yes", "cpu")


def test_cuda_graphs_are_wanted_on_cuda_only_when_asked_and_bad_values_are_refused():
    assert cuda_graphs_wanted("on", "cuda") and cuda_graphs_wanted("on", torch.device("cuda", 1))
    assert not cuda_graphs_wanted("on", "cpu") and not cuda_graphs_wanted("off", "cuda")
    with pytest.raises(ValueError, match="model.cuda_graphs = 'yes'"):
        cuda_graphs_wanted("yes", "cuda")


def _forward_backward(stage: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = lm_loss(stage(tokens), tokens)
    loss.backward()
    grads = [p.grad.detach().clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _eager_and_to_compile(checkpointed: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two copies of one tiny stage, with or without activation checkpointing."""
    eager = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=3)
    compiled = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=3)
    eager.activation_checkpointing = compiled.activation_checkpointing = checkpointed  # recomputes the compiled code
    return eager, compiled


def _assert_matches_eager_and_compiles_once(compiled: torch.nn.Module, eager: torch.nn.Module) -> None:
    """The compiled stage's loss and gradients equal eager's, and the next microbatch reuses
    its graphs: no recompilation."""
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    loss, grads = _forward_backward(compiled, tokens)
    want_loss, want_grads = _forward_backward(eager, tokens)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again, _ = _forward_backward(compiled, tokens)
    torch.testing.assert_close(again, want_loss, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "activation-checkpointing"])
def test_a_compiled_stage_matches_eager_and_compiles_once(checkpointed):
    # The CPU runs inductor's real code generation (C++), the path a CUDA worker takes with
    # Triton kernels instead: same graphs, same guards. Every block shares one graph.
    eager, compiled = _eager_and_to_compile(checkpointed)
    names = [name for name, _ in compiled.named_parameters()]
    assert compile_blocks(compiled) == len(compiled.layers) > 1
    assert [name for name, _ in compiled.named_parameters()] == names  # checkpoints and the exchange see no change
    _assert_matches_eager_and_compiles_once(compiled, eager)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "activation-checkpointing"])
def test_a_stage_compiled_whole_matches_eager_and_compiles_once(checkpointed):
    # aot_eager traces the forward and the backward as inductor would, without its C++ code
    # generation (the per-block test above runs that): what is under test is one graph for
    # the stage and no second compile once the rotary tables exist.
    eager, compiled = _eager_and_to_compile(checkpointed)
    names = [name for name, _ in compiled.named_parameters()]
    torch._dynamo.reset()
    assert compile_stage(compiled, scope="stage", seq_len=32, backend="aot_eager") == 1
    assert [name for name, _ in compiled.named_parameters()] == names
    _assert_matches_eager_and_compiles_once(compiled, eager)


def test_compile_scope_block_compiles_each_block_and_a_bad_scope_is_refused():
    stage = build_stage("tiny", vocab_size=256, stage=0, num_stages=2, seed=3)
    assert compile_stage(stage, scope="block", seq_len=32) == len(stage.layers)
    with pytest.raises(ValueError, match="model.compile_scope = 'graph'"):
        compile_stage(stage, scope="graph", seq_len=32)

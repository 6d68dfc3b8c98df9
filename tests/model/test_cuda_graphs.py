"""model.cuda_graphs on CUDA: a stage whose compiled graphs replay as CUDA graphs trains what the
eager stage trains, in the orders a worker runs microbatches. A replay reuses the memory of the
outputs before it, so these tests keep what a worker keeps: forwards in flight whose gradients
come back out of order (a first stage), input gradients copied for the wire while the next
microbatch replays (a last stage), and gradients summed over microbatches."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from noloco_rt.algo.optim import InnerOptimizer
from noloco_rt.config import OptimConfig
from noloco_rt.model.compile_stage import compile_stage
from noloco_rt.model.llama import build_stage, lm_loss
from workers.device import HostCopy, HostStaging

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device; this machine has none")

SEQ, BATCH, MICROBATCHES, STEPS = 32, 4, 4, 3


def _eager_and_graphed(stage: int, scope: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    eager = build_stage("tiny", vocab_size=256, stage=stage, num_stages=2, seed=3, device="cuda")
    graphed = copy.deepcopy(eager)
    compile_stage(graphed, scope=scope, seq_len=SEQ, cuda_graphs=True)
    return eager, graphed


@dataclasses.dataclass
class Twins:
    """An eager stage and its graphed copy, each with its inner optimizer (the graphed one
    keeping its gradient buffers, as a worker with model.cuda_graphs does)."""

    eager: torch.nn.Module
    graphed: torch.nn.Module
    eager_inner: InnerOptimizer
    graphed_inner: InnerOptimizer

    @classmethod
    def of_stage(cls, stage: int, scope: str) -> Twins:
        eager, graphed = _eager_and_graphed(stage, scope)
        cfg = OptimConfig(lr=0.01, grad_clip=1.0)
        kept = InnerOptimizer(graphed.parameters(), cfg, total_steps=10)
        kept.keep_gradient_buffers()
        return cls(eager, graphed, InnerOptimizer(eager.parameters(), cfg, total_steps=10), kept)

    def step(self) -> None:
        """Both take their inner step on gradients that must match first."""
        for got, want in zip(self.graphed.parameters(), self.eager.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-3, atol=1e-5)
        self.eager_inner.step(grad_divisor=MICROBATCHES)
        self.graphed_inner.step(grad_divisor=MICROBATCHES)

    def assert_trained_alike(self) -> None:
        for got, want in zip(self.graphed.parameters(), self.eager.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
        _assert_no_graph_was_skipped()


def _assert_no_graph_was_skipped() -> None:
    from torch._dynamo.utils import counters
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def _on_host(copy: HostCopy) -> torch.Tensor:
    if copy.ready is not None:
        copy.ready()
    return copy.tensors[0]


@pytest.mark.parametrize("scope", ["block", "stage"])
def test_a_first_stage_with_microbatches_in_flight_trains_as_eager(scope):
    twins = Twins.of_stage(0, scope)
    staging = HostStaging(torch.device("cuda"))
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        tokens = [torch.randint(0, 256, (BATCH, SEQ), generator=generator).cuda() for _ in range(MICROBATCHES)]
        returned = [torch.randn(BATCH, SEQ, 64, generator=generator).cuda() for _ in range(MICROBATCHES)]
        order = torch.randperm(MICROBATCHES, generator=generator).tolist()  # gradients come back in any order
        wire = {}
        for name, net, graphs in (("eager", twins.eager, False), ("graphed", twins.graphed, True)):
            outputs = [net(t) for t in tokens]  # all in flight before any gradient returns
            wire[name] = [staging.to_host([out], graph_outputs=graphs) for out in outputs]
            for index in order:
                outputs[index].backward(returned[index])
        for got, want in zip(wire["graphed"], wire["eager"], strict=True):
            torch.testing.assert_close(_on_host(got), _on_host(want), rtol=1e-4, atol=1e-5)
        twins.step()
    twins.assert_trained_alike()


@pytest.mark.parametrize("scope", ["block", "stage"])
def test_a_last_stage_replies_input_gradients_that_later_replays_do_not_overwrite(scope):
    twins = Twins.of_stage(1, scope)
    staging = HostStaging(torch.device("cuda"))
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        hidden = [torch.randn(BATCH, SEQ, 64, generator=generator).cuda() for _ in range(MICROBATCHES)]
        targets = [torch.randint(0, 256, (BATCH, SEQ), generator=generator).cuda() for _ in range(MICROBATCHES)]
        replies = {}
        for name, net, graphs in (("eager", twins.eager, False), ("graphed", twins.graphed, True)):
            replies[name] = []
            for x, y in zip(hidden, targets, strict=True):
                x = x.clone().requires_grad_(True)
                lm_loss(net(x), y).backward()
                # Read only after the microbatches behind it have replayed: a copy of graph
                # memory still being read would show the last microbatch's gradient here.
                replies[name].append(staging.to_host([x.grad], graph_outputs=graphs))
        for got, want in zip(replies["graphed"], replies["eager"], strict=True):
            torch.testing.assert_close(_on_host(got), _on_host(want), rtol=1e-3, atol=1e-6)
        twins.step()
    twins.assert_trained_alike()

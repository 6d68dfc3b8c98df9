"""pipeline.simulate_wire_dtype: the simulator rounds what crosses a stage boundary as workers
pack it, activations forward in wire_dtype and gradients backward in its gradient dtype."""

from __future__ import annotations

import torch

from noloco_rt.config import load_config, parse_assignment
from noloco_rt.net.wire_dtype import pack, unpack
from noloco_rt.simulation.simulator import Simulation
from noloco_rt.simulation.wire import through_wire


def test_activations_go_as_packed_and_gradients_come_back_in_the_gradient_dtype():
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 5, 16, generator=generator, requires_grad=True)
    upstream = torch.randn(2, 5, 16, generator=generator) * 1e-3
    sent = through_wire(hidden, "int8")
    assert torch.equal(sent, unpack(pack(hidden.detach(), "int8")))
    assert not torch.equal(sent, hidden)
    sent.backward(upstream)
    assert torch.equal(hidden.grad, upstream.to(torch.bfloat16).float())  # int8's gradients travel in bfloat16


def test_gradients_go_in_the_chosen_gradient_dtype_even_under_float32_activations():
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 5, 16, generator=generator, requires_grad=True)
    upstream = torch.randn(2, 5, 16, generator=generator)
    sent = through_wire(hidden, "float32", "int8")
    assert torch.equal(sent, hidden.detach())  # activations exact
    sent.backward(upstream)
    assert torch.equal(hidden.grad, unpack(pack(upstream, "int8"))) and not torch.equal(hidden.grad, upstream)


def test_float32_is_exact_and_float16_rounds_both_ways():
    hidden = torch.full((3, 4), 1 / 3, requires_grad=True)
    assert through_wire(hidden, "float32") is hidden
    out = through_wire(hidden, "float16")
    assert torch.equal(out, hidden.detach().half().float())
    out.backward(torch.full((3, 4), 1 / 7))
    assert torch.equal(hidden.grad, torch.full((3, 4), 1 / 7).half().float())


def _val_loss(*settings: str) -> float:
    torch.manual_seed(0)
    cfg = load_config(None, environ={}, overrides=[parse_assignment(a) for a in (
        "pipeline.replicas=2", "pipeline.stages=2", "pipeline.max_inflight=1", "run.eval_batches=2", *settings)])
    sim = Simulation(cfg)
    for _ in range(6):
        sim.train_step()
    return sim.validation_loss()


def test_the_simulator_changes_only_when_the_wire_rounds():
    exact = _val_loss()
    assert _val_loss("pipeline.simulate_wire_dtype=true", "pipeline.wire_dtype=float32") == exact
    rounded = _val_loss("pipeline.simulate_wire_dtype=true", "pipeline.wire_dtype=int8")
    assert rounded != exact and abs(rounded - exact) < 0.05 * exact
    gradients_too = _val_loss("pipeline.simulate_wire_dtype=true", "pipeline.wire_dtype=int8",
                              "pipeline.gradient_wire_dtype=int8")
    assert gradients_too not in (rounded, exact) and abs(gradients_too - exact) < 0.05 * exact

"""What only a GPU can show of the device crossings: the checkpoint's copy that the training
thread does not wait for, and the contribution quantised on the device. Skipped, saying so,
on a machine without CUDA (CI); `make gpu-check` machines run them."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.outer.codec import decode_tensors, encode_quantized_tensors
from noloco_rt.outer.formula import PeerOuterState
from workers.background_writer import state_to_host
from workers.device import HostStaging, PinnedArena
from workers.outer.device_boundary import ExchangeBoundary

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")


def test_a_state_copy_the_training_thread_does_not_wait_for_holds_the_values_of_when_it_began():
    cuda = torch.device("cuda")
    weights = torch.randn(2048, 2048, device=cuda)
    state = {"slow": [weights], "inner": {"state": {0: {"exp_avg": torch.ones(300, device=cuda)}}, "n": 3},
             "host": torch.arange(5)}
    expected = weights.cpu()
    arena = PinnedArena(1 << 30)
    copy = state_to_host(state, HostStaging(cuda), arena)
    for _ in range(20):  # the training stream changes the weights in place at once
        weights.mul_(1.5).add_(1.0)
    got = copy.get()
    assert not copy.blocked
    assert torch.equal(got["slow"][0], expected)
    assert torch.equal(got["inner"]["state"][0]["exp_avg"], torch.ones(300))
    assert got["inner"]["n"] == 3 and torch.equal(got["host"], torch.arange(5))
    again = state_to_host(state, HostStaging(cuda), arena).get()  # the arena is reused, the first copy kept
    assert arena.pins == 1
    assert torch.equal(got["slow"][0], expected) and torch.equal(again["slow"][0], weights.cpu())


@pytest.mark.parametrize("codec", ["int8-zstd", "int4-zstd"])
def test_a_contribution_quantised_on_the_device_decodes_on_the_host_to_exactly_its_values(codec):
    cuda = torch.device("cuda")
    parts = [torch.randn(1000, 77, device=cuda), torch.randn(3, device=cuda), torch.randn(0, device=cuda)]
    contribution = ExchangeBoundary.on(cuda, quantize_codec=codec).contribution_to_host(PeerOuterState(fast=parts))
    values = contribution.state().fast
    quantized = contribution.quantized()
    assert all(t.device.type == "cpu" for t in values) and quantized is not None
    encoded = encode_quantized_tensors(quantized, codec)
    decoded = decode_tensors(encoded, max_decompressed_bytes=1 << 30)
    for value, back, part in zip(values, decoded, parts, strict=True):
        assert torch.equal(value.reshape(-1), back)  # the same bits: a pair's corrections cancel exactly
        if part.numel():  # within a code step of the original (a block's step is at most its absmax / 7)
            assert (value - part.cpu()).abs().max().item() <= part.abs().max().item() / 7

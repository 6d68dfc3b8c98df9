"""Activations and gradients in the wire dtype (noloco_rt/net/wire_dtype.py, pipeline.wire_dtype):
each dtype round-trips through a real data message within its stated bound, the receiver
always gets float32, and a packing that does not hold together is refused."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.config import ConfigError, load_config
from noloco_rt.net import messages
from noloco_rt.net.wire import RejectReason, WireReject
from noloco_rt.net.wire_dtype import WIRE_DTYPES, WireDtypeError, gradient_wire_dtype, pack, unpack

RUN = "run-wire"


def _round_trip(tensor: torch.Tensor, wire: str) -> torch.Tensor:
    """Through a real forward message: encode, frames as received, decode."""
    targets = torch.randint(0, 256, tensor.shape[:-1])
    outgoing = messages.forward(RUN, "s", 0, 1, "tcp://127.0.0.1:1", pack(tensor, wire), targets)
    received = messages.decode([bytes(p) for p in outgoing.parts()], run_id=RUN)
    assert torch.equal(received.tensors[1], targets)
    return received.tensors[0]


@pytest.mark.parametrize("wire", WIRE_DTYPES)
def test_each_wire_dtype_round_trips_within_its_bound(wire):
    torch.manual_seed(0)
    acts = torch.randn(4, 16, 64) * torch.logspace(-3, 2, 16).view(1, 16, 1)  # tokens of very different ranges
    got = _round_trip(acts, wire)
    assert got.dtype == torch.float32 and got.shape == acts.shape
    error = (got - acts).abs()
    if wire == "float32":
        assert torch.equal(got, acts)
    elif wire in ("bfloat16", "float16"):
        rel = 2.0 ** (-8 if wire == "bfloat16" else -11)
        tiny = 0.0 if wire == "bfloat16" else 2.0 ** -24  # float16 subnormals: an absolute floor
        assert bool((error <= rel * acts.abs() + tiny).all())
    else:
        scale = acts.abs().amax(dim=-1, keepdim=True) / (127 if wire == "int8" else 7)
        assert bool((error <= scale / 2 * (1 + 1e-5)).all())  # half a step of its own token's scale


def test_int8_sends_a_quarter_of_the_bytes_and_gradients_go_in_bfloat16():
    acts = torch.randn(8, 32, 128)
    sizes = {w: sum(t.numel() * t.element_size() for t in pack(acts, w)) for w in WIRE_DTYPES}
    assert sizes["bfloat16"] == sizes["float16"] == sizes["float32"] // 2
    assert sizes["int8"] == sizes["float32"] // 4 + 8 * 32 * 4  # codes, plus one float32 scale per token
    assert gradient_wire_dtype("int8") == "bfloat16" and gradient_wire_dtype("float16") == "float16"
    assert gradient_wire_dtype("int8", "int8") == "int8" and gradient_wire_dtype("float16", "float32") == "float32"
    grad = torch.randn(8, 32, 128)
    packed = pack(grad, gradient_wire_dtype("int8"))
    outgoing = messages.backward(RUN, "s", 1, 3, 0, packed)
    received = messages.decode([bytes(p) for p in outgoing.parts()], run_id=RUN)
    assert received.tensors[0].dtype == torch.float32 and len(received.tensors) == 1


def test_int4_sends_two_codes_a_byte_and_an_odd_last_dimension_as_int8():
    acts = torch.randn(8, 32, 128)
    codes, scale = pack(acts, "int4")
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (8, 32, 64) and tuple(scale.shape) == (8, 32, 1)
    assert gradient_wire_dtype("int4") == "bfloat16"
    odd = torch.randn(2, 3, 5)
    packed = pack(odd, "int4")
    assert packed[0].dtype == torch.int8  # no half byte to spare: int8's packing, which the receiver knows
    assert bool(((unpack(packed) - odd).abs() <= odd.abs().amax(-1, keepdim=True) / 254 * (1 + 1e-5)).all())
    # The extremes and zero are exact: codes ±7 and 0.
    token = torch.tensor([[-7.0, 7.0, 0.0, 3.0]])
    assert torch.equal(unpack(pack(token, "int4")), token)


def test_a_hostile_int4_byte_decodes_within_its_tokens_scale():
    codes = torch.tensor([[0x00, 0xFF, 0x0F, 0xF0]], dtype=torch.uint8)  # nibble 0 names no level: clamped to -7
    got = unpack([codes, torch.ones(1, 1)])
    assert got.shape == (1, 8) and bool((got.abs() <= 7).all())


def test_float16_saturates_instead_of_overflowing():
    acts = torch.tensor([[1e6, -1e6, 3.0]])
    got = unpack(pack(acts, "float16"))
    assert torch.equal(got, torch.tensor([[65504.0, -65504.0, 3.0]]))


def test_an_all_zero_token_stays_zero_in_int8():
    acts = torch.zeros(2, 3, 8)
    acts[0, 0] = torch.arange(8.0)
    got = unpack(pack(acts, "int8"))
    assert torch.equal(got[1], torch.zeros(3, 8)) and torch.allclose(got[0, 0], torch.arange(8.0), atol=7 / 254)


@pytest.mark.parametrize("frames", [
    [torch.zeros(2, 3, dtype=torch.int8)],  # codes without scales
    [torch.zeros(2, 3, dtype=torch.int8), torch.ones(2, 3)],  # scales of the wrong shape
    [torch.zeros(2, 3, dtype=torch.int8), torch.ones(2, 1, dtype=torch.float16)],
    [torch.zeros(2, 3), torch.zeros(2, 3)],
    [torch.zeros(2, 3, dtype=torch.int64)],
    [torch.zeros(2, 3, dtype=torch.uint8)],  # int4 codes without scales
    [torch.zeros(2, 3, dtype=torch.uint8), torch.ones(2, 6)],  # scales of the wrong shape
])
def test_a_packing_that_does_not_hold_together_is_refused(frames):
    with pytest.raises(WireDtypeError):
        unpack(frames)


def test_the_receiver_refuses_a_forward_whose_packing_is_broken():
    codes = torch.zeros(2, 4, 8, dtype=torch.int8)
    targets = torch.zeros(2, 4, dtype=torch.int64)
    for tensors in ([codes, targets], [codes, torch.ones(2, 4, 2), targets], [codes, torch.ones(2, 4, 1)]):
        outgoing = messages.forward(RUN, "s", 0, 1, "tcp://127.0.0.1:1", tensors[:-1], tensors[-1])
        with pytest.raises(WireReject) as refused:
            messages.decode([bytes(p) for p in outgoing.parts()], run_id=RUN)
        assert refused.value.reason is RejectReason.FRAME_COUNT_MISMATCH


def test_the_config_names_the_allowed_wire_dtypes():
    assert load_config(environ={}, overrides=[{"pipeline": {"wire_dtype": "int8"}}]).pipeline.wire_dtype == "int8"
    with pytest.raises(ConfigError, match="float32, bfloat16, float16, int8"):
        load_config(environ={}, overrides=[{"pipeline": {"wire_dtype": "fp8"}}])
    gradients = load_config(environ={}, overrides=[{"pipeline": {"gradient_wire_dtype": "int8"}}]).pipeline
    assert gradients.gradient_wire_dtype == "int8" and gradients.wire_dtype == "float16"
    with pytest.raises(ConfigError, match="auto, float32, bfloat16, float16, int8"):
        load_config(environ={}, overrides=[{"pipeline": {"gradient_wire_dtype": "int4"}}])

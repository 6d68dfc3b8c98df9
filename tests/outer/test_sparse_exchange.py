"""The sparse outer exchange (docs/architecture.md §4, "Fewer bytes"): the top-k codecs, the
error feedback, the symmetric use of what was sent, and every malformed sparse body refused
with its reason."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.config import ConfigError, load_config
from noloco_rt.net.wire import decode_message
from noloco_rt.outer.codec import CodecError, decode_tensors, encode_tensors
from noloco_rt.outer.codecs.sparse import CHUNK, KEEP, kept_count, sparse_round_trip
from noloco_rt.outer.correction import correction_term
from noloco_rt.outer.delta_exchange import (
    ErrorFeedback,
    delta_as_sent,
    delta_local_step,
    sends_whole_state,
)
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState
from noloco_rt.outer.peer_checks import check_peer_distance
from noloco_rt.outer.snapshot import SnapshotReader, SnapshotRejected
from workers.cluster.fuzz_messages import (
    SPARSE_FAULTS,
    bad_sparse_push,
    snapshot_push,
    stage_shapes,
)

SPARSE = ("topk2-zstd", "topk4-zstd")
BITS = {"topk2-zstd": 2, "topk4-zstd": 4}
COEFFS = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)


def _heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    """Like an outer gradient: most entries small, a few large."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) ** 3 * 1e-3


@pytest.mark.parametrize("codec", SPARSE)
@given(n=st.integers(1, 3 * CHUNK + 7), seed=st.integers(0, 2**31))
@settings(max_examples=15, deadline=None)
def test_decoding_gives_exactly_what_the_sender_computes_without_bytes(codec, n, seed):
    x = _heavy_tailed(n, seed)
    encoded = encode_tensors([x], codec)
    assert encoded.wire_bytes > 0
    decoded = decode_tensors(encoded, max_decompressed_bytes=1 << 30)[0]
    assert torch.equal(decoded, sparse_round_trip(x, BITS[codec]))
    assert int((decoded != 0).sum()) <= kept_count(n)


@pytest.mark.parametrize("codec", SPARSE)
def test_a_chunk_keeps_its_largest_entries_and_at_least_a_hundredth_of_the_bytes_go_out(codec):
    x = _heavy_tailed(64 * CHUNK)
    encoded = encode_tensors([x], codec)
    assert encoded.raw_bytes / encoded.wire_bytes > 100  # 64 of 4,096 entries, 2 or 4 bits and an index each
    decoded = sparse_round_trip(x, BITS[codec])
    kept = decoded.view(-1, CHUNK) != 0
    assert (kept.sum(dim=1) == KEEP).all()
    # Every kept entry is at least as large as every dropped one of its chunk.
    magnitude = x.view(-1, CHUNK).abs()
    smallest_kept = torch.where(kept, magnitude, torch.inf).amin(dim=1)
    largest_dropped = torch.where(kept, 0.0, magnitude).amax(dim=1)
    assert (smallest_kept >= largest_dropped).all()
    # The largest entry of a chunk comes back (it sets the scale, to the float32 rounding of
    # s · L / L), signs are kept.
    top = magnitude.argmax(dim=1)
    rows = torch.arange(len(top))
    assert torch.allclose(decoded.view(-1, CHUNK)[rows, top], x.view(-1, CHUNK)[rows, top], rtol=1e-6, atol=0)
    assert (torch.sign(decoded[decoded != 0]) == torch.sign(x[decoded != 0])).all()


@pytest.mark.parametrize("codec", SPARSE)
@given(n=st.integers(1, 2 * CHUNK + 99), seed=st.integers(0, 2**31))
@settings(max_examples=15, deadline=None)
def test_what_was_sent_encodes_to_itself(codec, n, seed):
    """A worker encodes x̂ (computed where its weights are) on the host: it must stay x̂."""
    sent = sparse_round_trip(_heavy_tailed(n, seed), BITS[codec])
    assert torch.equal(sparse_round_trip(sent, BITS[codec]), sent)


def _state(seed: int, n: int = 6000) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    slow = [torch.randn(n, generator=torch.Generator().manual_seed(seed))]
    return slow, [torch.zeros(n)], [slow[0] + _heavy_tailed(n, seed + 1)]


def test_a_sparse_round_moves_the_slow_weights_by_what_was_sent_and_keeps_the_rest():
    slow, momentum, fast = _state(0)
    before_slow, delta = slow[0].clone(), fast[0] - slow[0]
    feedback = ErrorFeedback()
    sent = delta_local_step(slow, momentum, fast, COEFFS, feedback, delta_codec="topk2-zstd", whole=False,
                            theta_only=True)
    assert sent.grad_only and torch.equal(sent.outer_grad[0], delta_as_sent([delta], "topk2-zstd")[0])
    assert torch.allclose(slow[0], before_slow + COEFFS.beta * sent.outer_grad[0]) and torch.equal(fast[0], slow[0])
    assert torch.allclose(feedback.residual[0] + sent.outer_grad[0], delta)  # nothing lost: kept for later
    # The next round sends Δ plus what is still unsent; a whole-state round sends it all.
    unsent = feedback.residual[0].clone()
    phi = slow[0].clone()
    fast[0] += 0.001
    again = delta_local_step(slow, momentum, fast, COEFFS, feedback, delta_codec="topk2-zstd", whole=True,
                             theta_only=True)
    assert feedback.residual is None
    assert torch.allclose(again.fast[0], phi + 0.001 + unsent, atol=1e-6)


def test_error_feedback_sends_everything_eventually():
    """Σ of what was sent + what is still unsent = Σ of every Δ: nothing is lost, only late."""
    slow, momentum, fast = _state(1)
    feedback = ErrorFeedback()
    total_delta = torch.zeros(6000)
    total_sent = torch.zeros(6000)
    for seed in range(6):
        fast[0] += _heavy_tailed(6000, 10 + seed)
        total_delta += fast[0] - slow[0]
        total_sent += delta_local_step(slow, momentum, fast, COEFFS, feedback, delta_codec="topk4-zstd",
                                       whole=False, theta_only=True).outer_grad[0]
    assert torch.allclose(total_sent + feedback.residual[0], total_delta, atol=1e-5)
    restored = ErrorFeedback()
    restored.load_state_dict(feedback.state_dict(), like=slow)
    assert torch.equal(restored.residual[0], feedback.residual[0])
    with pytest.raises(ValueError, match="does not fit"):
        restored.load_state_dict([torch.zeros(5)], like=slow)


def test_a_pair_that_uses_what_was_sent_moves_by_equal_and_opposite_amounts():
    mine, theirs = (delta_as_sent([_heavy_tailed(9000, s)], "topk2-zstd") for s in (1, 2))
    c_mine = correction_term(PeerOuterState(outer_grad=mine), [PeerOuterState(outer_grad=theirs)], COEFFS)
    c_theirs = correction_term(PeerOuterState(outer_grad=theirs), [PeerOuterState(outer_grad=mine)], COEFFS)
    assert torch.equal(c_mine[0], -c_theirs[0])
    with pytest.raises(ValueError, match="gradient-only"):
        correction_term(PeerOuterState(outer_grad=mine), [PeerOuterState(fast=theirs)], COEFFS)


def test_every_theta_every_th_step_sends_the_whole_state():
    assert [sends_whole_state(k, delta_codec="topk2-zstd", theta_every=4) for k in range(6)] == \
        [True, False, False, False, True, False]
    assert all(sends_whole_state(k, delta_codec="", theta_every=4) for k in range(6))


def test_a_gradient_only_peer_is_checked_against_our_weights():
    phi = [torch.ones(100)]
    own = PeerOuterState(outer_grad=[torch.zeros(100)])
    near, far = PeerOuterState(outer_grad=[torch.full((100,), 0.1)]), PeerOuterState(outer_grad=[torch.full((100,), 5.0)])
    assert check_peer_distance(near, own, max_ratio=2.0, scale=phi).ok
    assert not check_peer_distance(far, own, max_ratio=2.0, scale=phi).ok
    assert not check_peer_distance(PeerOuterState(fast=[torch.ones(100)]), own, max_ratio=2.0, scale=phi).ok
    with pytest.raises(ValueError, match="scale"):
        check_peer_distance(near, own, max_ratio=2.0)


def test_config_names_the_codecs_each_field_takes():
    cfg = load_config(environ={}, overrides=[{"worker": {"delta_codec": "topk4-zstd", "theta_every": 4}}])
    assert cfg.worker.delta_codec == "topk4-zstd"
    with pytest.raises(ConfigError, match="worker.delta_codec"):
        load_config(environ={}, overrides=[{"worker": {"delta_codec": "int8-zstd"}}])
    with pytest.raises(ConfigError, match="worker.snapshot_codec"):
        load_config(environ={}, overrides=[{"worker": {"snapshot_codec": "topk2-zstd"}}])
    with pytest.raises(ConfigError, match="worker.theta_every"):
        load_config(environ={}, overrides=[{"worker": {"theta_every": 0}}])


# -- malformed sparse bodies, each refused with its reason ------------------------------------

def _reject_reason(frames: list[bytes]) -> str:
    reader = SnapshotReader("default", stage_shapes())
    decoded = decode_message(frames, expected_run_id="default")
    try:
        reader.chunk(decoded)
    except SnapshotRejected as reject:
        return reject.reason
    raise AssertionError("accepted")


@pytest.mark.parametrize("fault", SPARSE_FAULTS)
@pytest.mark.parametrize("seed", range(4))
def test_every_malformed_sparse_push_is_refused_with_its_reason(fault, seed):
    expected = "shape_mismatch" if fault == "oversized" else "codec"
    reader_reason = _reject_reason(bad_sparse_push(fault, random.Random(seed)))
    assert reader_reason == expected, fault


def test_a_sparse_codec_carries_gradients_only_and_gradients_travel_sparse_only():
    shapes = stage_shapes()
    dense = encode_tensors([torch.randn(s) for s in shapes], "int8-zstd").payload
    sparse = encode_tensors([torch.randn(s) for s in shapes], "topk2-zstd").payload
    assert _reject_reason(snapshot_push(dense, codec="int8-zstd", parts="grad")) == "wrong_codec"
    assert _reject_reason(snapshot_push(sparse, codec="topk2-zstd", parts="fast")) == "wrong_codec"
    honest = snapshot_push(sparse, codec="topk2-zstd", parts="grad")
    reader = SnapshotReader("default", shapes)
    chunk = reader.chunk(decode_message(honest, expected_run_id="default"))
    assert [tuple(t.shape) for t in chunk.values] == [(math.prod(s),) for s in shapes]
    assert chunk.snapshot.parts_kind == "grad" and msgpack.unpackb(honest[0])["extra"]["codec"] == "topk2-zstd"


def test_a_body_of_the_wrong_size_is_refused_before_decoding():
    encoded = encode_tensors([_heavy_tailed(5000)], "topk2-zstd")
    with pytest.raises(CodecError):
        decode_tensors(replace(encoded, payload=encoded.payload[:-3]), max_decompressed_bytes=1 << 30)

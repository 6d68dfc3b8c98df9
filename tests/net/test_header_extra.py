"""The header's `extra` map as one typed structure: what a sender writes comes back equal,
and a key or a type no sender of ours writes is one reject before kind-specific code runs."""

from __future__ import annotations

import msgpack
import pytest
import torch

from noloco_rt.net.header_extra import ExtraError, HeaderExtra
from noloco_rt.net.messages import backward, decode, forward
from noloco_rt.net.wire import MessageKind, RejectReason, WireReject, decode_message
from noloco_rt.outer.snapshot import snapshot_message

EVERY_FIELD = HeaderExtra(reply_to="tcp://127.0.0.1:5", origin_step=3, held_us=1500, codec="int8-zstd", parts="fast",
                          specs=[[[2, 3], "float32"], [[], "float32"]], checksum="ab" * 8,
                          counters={"inner_steps": 7, "outer_steps": 1}, for_step=4, group=2, chunk=[0, 1],
                          pieces=[[0, 0, 6]], verdict="used", observer=True, preparing=True)


def test_every_field_round_trips_and_absent_fields_are_not_sent():
    assert HeaderExtra.from_wire(EVERY_FIELD.to_wire()) == EVERY_FIELD
    assert HeaderExtra().to_wire() == {}
    assert HeaderExtra(origin_step=0, observer=False).to_wire() == {"origin_step": 0}  # 0 is a step, False is absent


def test_messages_carry_it_through_the_wire():
    sent = forward("run", "w", 0, 5, "tcp://127.0.0.1:9", [torch.zeros(2)], torch.zeros(2, dtype=torch.int64),
                   origin_step=11)
    header = decode_message(sent.parts(), expected_run_id="run", check_finite=False).header
    assert header.extra == HeaderExtra(reply_to="tcp://127.0.0.1:9", origin_step=11)
    reply = decode(backward("run", "w", 1, 5, 0, [torch.zeros(2)], held_s=0.0125).parts(), run_id="run")
    assert reply.held_s == pytest.approx(0.0125) and reply.received_at is None  # the link stamps arrival
    assert decode(backward("run", "w", 1, 5, 0, [torch.zeros(2)]).parts(), run_id="run").held_s is None
    asked = snapshot_message(MessageKind.BOOTSTRAP_REQUEST, run_id="run", stage=0, sender="c",
                             extra=HeaderExtra(observer=True))
    assert decode_message(asked, expected_run_id="run").header.extra.observer is True


@pytest.mark.parametrize(("wire", "says"), [
    ([], "not a map"),
    ({"surprise": 1}, "unknown extra field"),
    ({"reply_to": None}, "reply_to"),  # nil is not "absent": no sender of ours writes it
    ({"origin_step": True}, "origin_step"),
    ({"origin_step": -1}, "origin_step"),
    ({"held_us": -5}, "held_us"),
    ({"held_us": 0.5}, "held_us"),
    ({"for_step": 2.0}, "for_step"),
    ({"group": "2"}, "group"),
    ({"chunk": [0]}, "chunk"),
    ({"chunk": [0, True]}, "chunk"),
    ({"pieces": [[0, 0]]}, "pieces"),
    ({"pieces": [[0, 0, "6"]]}, "pieces"),
    ({"specs": [[["a"], "float32"]]}, "specs"),
    ({"specs": [[[2], 4]]}, "specs"),
    ({"specs": [[[-2], "float32"]]}, "specs"),
    ({"counters": {"inner_steps": "x"}}, "counters"),
    ({"counters": {"inner_steps": True}}, "counters"),
    ({"counters": [1, 2]}, "counters"),
    ({"observer": 1}, "observer"),
    ({"verdict": b"used"}, "verdict"),
])
def test_a_key_or_type_no_sender_writes_is_refused(wire, says):
    with pytest.raises(ExtraError, match=says):
        HeaderExtra.from_wire(wire)


def test_on_the_wire_it_is_a_malformed_header():
    good = snapshot_message(MessageKind.OUTER_VERDICT, run_id="run", stage=0, sender="w",
                            extra=HeaderExtra(verdict="used"))
    assert decode_message(good, expected_run_id="run").header.extra.verdict == "used"
    header = msgpack.unpackb(bytes(good[0]), raw=False)
    header["extra"] = {"verdict": ["used"]}
    with pytest.raises(WireReject) as refused:
        decode_message([msgpack.packb(header, use_bin_type=True), *good[1:]], expected_run_id="run")
    assert refused.value.reason == RejectReason.MALFORMED_HEADER and "verdict" in str(refused.value)

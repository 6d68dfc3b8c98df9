"""Downloading a peer's bootstrap snapshot over its exchange socket.

A joiner downloads slow weights, momentum and counters from a live peer of its stage;
the coordinator pulls the same snapshot read-only (`observer=True`, which the donor does
not log). Both validate it in full (noloco_rt.outer.snapshot) before using it. A donor copies
its state when asked: until the copy is made (its next inner-step boundary) it answers
"preparing", and we ask again within the same timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import zmq

from noloco_rt.logs import EventLog
from noloco_rt.net.header_extra import HeaderExtra
from noloco_rt.net.transport import request
from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.snapshot import (
    SnapshotReader,
    SnapshotRejected,
    bootstrap_preparing,
    require_kind,
    snapshot_message,
)

ASK_AGAIN_S = 0.05
"""The pause before asking a donor that is preparing our copy again (doubling, at most 1 s)."""


@dataclass(frozen=True)
class BootstrapState:
    """What a donor served: φ and δ of its stage, its counters, and the payload checksum."""

    slow: list[torch.Tensor]
    momentum: list[torch.Tensor]
    inner_steps: int
    outer_steps: int
    checksum: str


def pull_bootstrap(ctx: zmq.Context, donor_id: str, address: str, reader: SnapshotReader, *, stage: int,
                   sender: str, timeout_s: float, on_reject: Callable[[str], None], log: EventLog,
                   observer: bool = False) -> BootstrapState | None:
    """The donor's bootstrap state, or None: a timeout is logged, a refusal passed to on_reject."""
    frames = snapshot_message(MessageKind.BOOTSTRAP_REQUEST, run_id=reader.run_id, stage=stage, sender=sender,
                              outer_step=0, extra=HeaderExtra(observer=observer))
    deadline = time.monotonic() + timeout_s
    pause = ASK_AGAIN_S
    while True:
        reply = request(ctx, address, frames, timeout_s=max(0.0, deadline - time.monotonic()))
        if reply is None:
            log.warning("bootstrap_timeout", donor=donor_id[:8], timeout_s=timeout_s)
            return None
        try:
            decoded = reader.message(reply)
            if not bootstrap_preparing(decoded):
                require_kind(decoded, MessageKind.BOOTSTRAP_REPLY)
                snapshot, tensors = reader.bootstrap(decoded)
                break
        except SnapshotRejected as rejected:
            on_reject(rejected.reason)
            return None
        if time.monotonic() + pause >= deadline:
            log.warning("bootstrap_timeout", donor=donor_id[:8], timeout_s=timeout_s, note="the donor was still preparing it")
            return None
        time.sleep(pause)
        pause = min(1.0, 2 * pause)
    half = len(tensors) // 2
    return BootstrapState(slow=tensors[:half], momentum=tensors[half:],
                          inner_steps=snapshot.counters.get("inner_steps", 0),
                          outer_steps=snapshot.counters.get("outer_steps", 0), checksum=snapshot.digest)

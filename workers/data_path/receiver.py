"""Taking messages off the data link: decoded, deduplicated, then handed on by kind.

Everything received is untrusted: a message that fails wire validation, a forward of
the wrong stage or shape, or a kind this worker does not take is rejected and counted.
A (sender, microbatch, attempt) seen before is a duplicate and ignored. Decoding runs on
the link's thread (`decoder`), off the training thread; so do the copies into pinned
memory that a CUDA device needs. Sends the link could not make come back here too.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq

from noloco_rt.net import messages
from noloco_rt.net.data_link import SendFailed
from noloco_rt.net.wire import MessageKind, WireReject
from workers.data_path.context import DataContext
from workers.device import HostStaging

RECEIVE_POLL_S = 0.05
SEEN_MEMORY = 4096
"""Message keys remembered for deduplication."""
PER_SENDER_STEPS = 4
"""Forwards queued from one sender, in step budgets: an honest sender has at most one step's
microbatches in flight (its own budget, which its memory plan may have made larger than ours,
and their re-sends); more is a flood, refused as `over_budget`."""
ALL_SENDERS_STEPS = 16
"""Forwards queued from all senders together, in step budgets: eight upstream replicas'
worth, a bound on memory whoever sends."""


def decoder(run_id: str, staging: HostStaging) -> Callable[[list[zmq.Frame]], messages.DataMessage | WireReject]:
    """What the data link runs on each message it receives: the decoded message, its tensors
    pinned for a CUDA device, or the rejection (never raised: the link thread serves on)."""

    def decode(frames: list[zmq.Frame]) -> messages.DataMessage | WireReject:
        arrived = time.monotonic()  # before decoding: a peer's link round trip leaves our work out
        try:
            message = messages.decode(frames, run_id=run_id)
        except WireReject as reject:
            return reject
        return replace(message, tensors=[staging.pinned(t) for t in message.tensors], received_at=arrived)

    return decode


class ForwardIntake:
    """Forwards from the previous stage, checked, queued until the step budget takes them."""

    def __init__(self, ctx: DataContext) -> None:
        self.ctx = ctx
        self.pending: collections.deque[messages.DataMessage] = collections.deque()
        self.queued_by_sender: collections.Counter[str] = collections.Counter()
        self.heard_at: float | None = None
        """When the last forward from the previous stage arrived (time.monotonic; None: none
        yet): the finishing rule takes upstream as live without asking Redis."""

    @property
    def upstream_seen(self) -> bool:
        """Whether a forward from the previous stage ever arrived (the finishing rule asks)."""
        return self.heard_at is not None

    def __len__(self) -> int:
        return len(self.pending)

    def offer(self, message: messages.DataMessage, *, accepting: bool) -> None:
        if not accepting or self.ctx.leave_requested.is_set():
            return  # leaving: the sender's deadline re-routes it
        if message.stage != self.ctx.stage - 1 or not self._well_formed(message):
            self.ctx.rejected.count("wrong_stage_or_shape")
            return
        self.heard_at = time.monotonic()
        if not self._within_budget(message.sender):
            self.ctx.rejected.count("over_budget")  # an honest sender's deadline re-sends it
            return
        self.pending.append(message)
        self.queued_by_sender[message.sender] += 1

    def _within_budget(self, sender: str) -> bool:
        """Whether one more forward of `sender` fits: what one peer, or all together, can make
        this worker hold (each forward within the data socket's frame bound) is bounded while
        the training thread waits, e.g. for gradients."""
        budget = self.ctx.budget
        return (self.queued_by_sender[sender] < PER_SENDER_STEPS * budget
                and len(self.pending) < ALL_SENDERS_STEPS * budget)

    def _well_formed(self, message: messages.DataMessage) -> bool:
        """Activations and targets of the shapes the run's model takes (a preset: (B, T, C) and
        (B, T), targets inside the vocabulary; noloco_rt.model.staged)."""
        if len(message.tensors) != 2:
            return False
        activations, targets = message.tensors
        return self.ctx.model.forward_ok(self.ctx.stage, activations, targets)

    def take(self) -> messages.DataMessage:
        """The oldest queued forward."""
        message = self.pending.popleft()
        self.queued_by_sender[message.sender] -= 1
        if not self.queued_by_sender[message.sender]:
            del self.queued_by_sender[message.sender]
        return message

    def clear(self) -> None:
        self.pending.clear()
        self.queued_by_sender.clear()


class Receiver:
    """One message at a time: gradients to `on_gradient`, forwards to `intake` (None: this
    stage takes no forwards, the first one)."""

    def __init__(self, ctx: DataContext, *, on_gradient: Callable[[messages.DataMessage], None],
                 intake: ForwardIntake | None) -> None:
        self.ctx = ctx
        self.on_gradient = on_gradient
        self.intake = intake
        self._seen: collections.OrderedDict[tuple[str, int, int], None] = collections.OrderedDict()

    def poll(self, *, accept_forwards: bool) -> None:
        """Handle at most one message, waiting up to RECEIVE_POLL_S for it."""
        item: Any = self.ctx.data.receive(RECEIVE_POLL_S)
        if item is None:
            return
        if isinstance(item, SendFailed):
            item.handle()
            return
        if isinstance(item, WireReject):
            self.ctx.rejected.count(item.reason)
            return
        message: messages.DataMessage = item
        if self._duplicate(message):
            self.ctx.discard("duplicate")
            return
        if message.kind == MessageKind.BACKWARD:
            self.on_gradient(message)
        elif message.kind == MessageKind.FORWARD and self.intake is not None:
            self.intake.offer(message, accepting=accept_forwards)
        else:
            self.ctx.rejected.count("unexpected_kind")

    def _duplicate(self, message: messages.DataMessage) -> bool:
        key = (message.sender, message.microbatch_id, message.attempt)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > SEEN_MEMORY:
            self._seen.popitem(last=False)
        return False

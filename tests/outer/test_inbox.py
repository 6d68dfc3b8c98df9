"""The bounded inbox of partners' pushes (workers/outer/inbox.py): keyed by (sender, our
step), refusing steps we are past, evicting the furthest step when full."""

from __future__ import annotations

import threading

import torch

from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import PartsKind, encode_snapshot
from workers.outer.inbox import SnapshotInbox


def push(step: int):
    tensors = [torch.full((2,), float(step))]
    return encode_snapshot(tensors, "shuffle-zstd", step, PartsKind.FAST), PeerOuterState(fast=tensors)


def test_pushes_are_kept_per_sender_and_step_and_taken_once():
    inbox = SnapshotInbox(fresh_s=60)
    assert inbox.keep("a", 3, *push(3)) and inbox.keep("a", 4, *push(4))
    assert inbox.take(4, "b") is None
    snapshot, state, group_size = inbox.take(3, "a")
    assert snapshot.outer_step == 3 and float(state.fast[0][0]) == 3.0
    assert inbox.take(3, "a") is None and len(inbox) == 1


def test_steps_we_are_past_are_refused_and_forgotten():
    inbox = SnapshotInbox(fresh_s=60)
    inbox.keep("a", 5, *push(5))
    inbox.advance(6)
    assert len(inbox) == 0
    assert not inbox.keep("b", 5, *push(5))
    assert inbox.keep("b", 6, *push(6))


def test_a_full_inbox_refuses_and_never_drops_a_push_it_acknowledged():
    """A kept push was acknowledged, so its sender may use ours: dropping it for a nearer
    step (as the inbox once did) left a soak round one-sided."""
    inbox = SnapshotInbox(fresh_s=60, max_size=3)
    for sender, step in (("a", 2), ("b", 9), ("c", 3)):
        assert inbox.keep(sender, step, *push(step))
    assert not inbox.keep("d", 10, *push(10)) and not inbox.keep("e", 1, *push(1))
    assert inbox.take(9, "b") is not None and inbox.take(1, "e") is None
    assert inbox.keep("e", 1, *push(1))  # room again once one was taken
    inbox.advance(3)  # a's step 2 is behind us: its room is free
    assert inbox.keep("d", 10, *push(10))


def test_latest_pushes_names_each_senders_latest_step_from_the_one_asked():
    now = [0.0]
    inbox = SnapshotInbox(fresh_s=10, clock=lambda: now[0])
    for sender, step in (("a", 2), ("a", 4), ("b", 3), ("c", 1)):
        inbox.keep(sender, step, *push(step))
    # a's push for 2 is not counted: it pushed for 4 since, so its round 2 is closed.
    assert inbox.latest_pushes(2) == {4: {"a"}, 3: {"b"}}
    assert inbox.latest_pushes(4) == {4: {"a"}}
    now[0] = 11.0
    assert inbox.latest_pushes(1) == {}  # stale
    assert len(inbox) == 4  # nothing was taken


def test_stale_pushes_expire():
    now = [0.0]
    inbox = SnapshotInbox(fresh_s=10, clock=lambda: now[0])
    inbox.keep("a", 1, *push(1))
    now[0] = 11.0
    assert inbox.take(1, "a") is None


def test_wait_for_returns_when_the_partners_are_in_or_stop_says_so():
    inbox = SnapshotInbox(fresh_s=60)
    arrive = threading.Timer(0.05, lambda: inbox.keep("a", 2, *push(2)))
    arrive.start()
    assert inbox.wait_for(2, ["a"], timeout_s=10) == {"a"}
    assert inbox.wait_for(2, ["a", "b"], timeout_s=10, stop=lambda here: "a" in here) == {"a"}
    assert inbox.wait_for(2, ["b"], timeout_s=0.05) == set()


def test_a_closed_step_refuses_new_pushes_and_names_the_ones_kept_before():
    """A round given up as late: a partner whose push was kept may use ours (it was
    acknowledged), so it is named and stays; one arriving later is refused, and its sender,
    never acknowledged, drops its side too."""
    inbox = SnapshotInbox(fresh_s=60)
    assert inbox.keep("a", 4, *push(4))
    assert inbox.keep("c", 5, *push(5))
    assert inbox.close(4) == {"a"}
    assert not inbox.accepts(4) and not inbox.accepts(3) and inbox.accepts(5)
    assert not inbox.keep("b", 4, *push(4))
    assert inbox.take(4, "a") is not None  # the kept one is still there for its round
    assert inbox.keep("b", 5, *push(5))  # a later step is open
    # taken by its round (which may still be computing with it): still committed when closed
    assert inbox.take(5, "c") is not None and inbox.close(5) == {"b", "c"}
    inbox.advance(6)
    assert inbox.close(5) == set()  # the round is over: forgotten


def test_a_push_decided_without_is_refused_if_it_comes_after_the_decision():
    """A round that found no push from a partner decides without it; the push arriving a
    moment later must not be kept (and so acknowledged): its sender would then use ours."""
    inbox = SnapshotInbox(fresh_s=60.0)
    assert inbox.keep("a", 3, *push(3))
    assert inbox.here_or_refused(3, "a")
    assert not inbox.here_or_refused(3, "b")
    assert not inbox.accepts(3, "b") and not inbox.keep("b", 3, *push(3))
    assert inbox.accepts(3, "c") and inbox.accepts(4, "b")  # others, and b's next step, still welcome
    inbox.advance(4)
    assert inbox.accepts(4, "b")

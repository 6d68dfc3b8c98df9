"""A donor copies φ and δ for joiners when one asks, not at every outer step.

Two workers' real exchange parts over loopback ZeroMQ (tests/support/exchange_pair.py): a request
that finds no copy is answered "preparing" and the donor's training thread copies its state
at the next inner-step boundary where it is final: never between an overlapped step's local
update and its correction. A joiner's pull asks again until then.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import zmq

from noloco_rt.net.transport import request
from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.snapshot import SnapshotReader, bootstrap_preparing, snapshot_message
from noloco_rt.outer.snapshot_client import BootstrapState, pull_bootstrap
from tests.support.exchange_pair import ExchangeParts, RecordingLog, overlapped_pair
from tests.support.other_device import values
from tests.support.waiting import wait_until
from workers.outer import service as service_module


def reader_for(donor: ExchangeParts) -> SnapshotReader:
    return SnapshotReader("devices", [tuple(t.shape) for t in donor.replica.slow])


def ask_once(ctx: zmq.Context, donor: ExchangeParts) -> tuple[bool, BootstrapState | None]:
    """One bootstrap request: (whether the donor said it is preparing, the state it served)."""
    frames = snapshot_message(MessageKind.BOOTSTRAP_REQUEST, run_id="devices", stage=0, sender="j" * 32, outer_step=0)
    reply = request(ctx, donor.server.address, frames, timeout_s=10.0)
    assert reply is not None, "the donor did not answer"
    reader = reader_for(donor)
    decoded = reader.message(reply)
    if bootstrap_preparing(decoded):
        return True, None
    snapshot, tensors = reader.bootstrap(decoded)
    half = len(tensors) // 2
    return False, BootstrapState(slow=tensors[:half], momentum=tensors[half:], checksum=snapshot.digest,
                                 inner_steps=snapshot.counters["inner_steps"],
                                 outer_steps=snapshot.counters["outer_steps"])


def assert_serves_its_state(state: BootstrapState | None, donor: ExchangeParts) -> None:
    assert state is not None
    for served, own in zip(state.slow + state.momentum, donor.replica.slow + donor.replica.momentum, strict=True):
        assert torch.equal(served, values(own).float())
    assert (state.inner_steps, state.outer_steps) == (donor.counters.clock_steps, donor.counters.outer_steps)


def start_as_worker(parts: ExchangeParts) -> None:
    """What a worker does once started: its state at start-up is final."""
    parts.step.service.state_final(parts.replica, parts.counters.clock_steps, parts.counters.outer_steps)


def test_a_request_is_answered_preparing_and_served_after_the_next_inner_step_boundary():
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        start_as_worker(a)
        preparing, _ = ask_once(ctx, a)
        assert preparing, "nothing was copied at start-up, yet a state was served"
        preparing, _ = ask_once(ctx, a)
        assert preparing, "the training thread has not reached a boundary: still nothing to serve"

        a.step.after_inner_step()  # the training thread's boundary: the copy is made here

        preparing, state = ask_once(ctx, a)
        assert not preparing
        assert_serves_its_state(state, a)


def test_no_copy_between_an_overlapped_local_step_and_its_correction():
    with overlapped_pair() as (a, b), zmq.Context() as ctx:
        start_as_worker(a)
        start_as_worker(b)
        a.step.take()  # a's local step: φ and δ are provisional until b's state corrects them
        assert a.step.pending is not None
        assert ask_once(ctx, a)[0]
        a.step.after_inner_step()  # b has not pushed: the round is still open
        assert a.step.pending is not None
        assert ask_once(ctx, a)[0], "a provisional φ was served"

        taking = threading.Thread(target=b.step.take)
        taking.start()
        taking.join(timeout=30)
        assert not taking.is_alive()

        def corrected() -> bool:
            a.step.after_inner_step()  # boundaries without an inner step between: still within the delay
            return a.step.pending is None

        wait_until(corrected)
        assert dict(a.counters.outer_kinds) == {"matched": 1}, a.log.lines
        preparing, state = ask_once(ctx, a)
        assert not preparing, "the request stayed unanswered after the correction"
        assert_serves_its_state(state, a)  # the corrected φ, at outer step 1
        assert state.outer_steps == 1


def test_while_asked_for_each_final_step_copies_at_once_and_without_demand_the_copy_is_dropped(monkeypatch):
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        start_as_worker(a)
        ask_once(ctx, a)
        a.step.after_inner_step()
        assert not ask_once(ctx, a)[0]

        a.counters.inner_steps += 5
        start_as_worker(a)  # a final state while requests came recently: copied at once
        preparing, state = ask_once(ctx, a)
        assert not preparing
        assert_serves_its_state(state, a)

        monkeypatch.setattr(service_module, "BOOTSTRAP_DEMAND_S", 0.0)
        ask_once(ctx, a)  # sets the demand window to end now
        a.counters.inner_steps += 5
        start_as_worker(a)  # nobody asked within the window: the copy goes, none is made
        assert ask_once(ctx, a)[0], "an older state was served after a newer one became final"


def test_a_joiner_asks_again_until_the_donor_has_copied_its_state():
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        start_as_worker(a)
        rejects: list[str] = []
        log = RecordingLog()
        pulled: list[BootstrapState | None] = []
        joiner = threading.Thread(target=lambda: pulled.append(pull_bootstrap(
            ctx, a.worker_id, a.server.address, reader_for(a), stage=0, sender="j" * 32, timeout_s=20.0,
            on_reject=rejects.append, log=log)))
        joiner.start()
        wait_until(lambda: a.step.service.bootstrap_asked())  # the joiner's first request came
        while joiner.is_alive():  # the donor's training thread, stepping on
            a.step.after_inner_step()
            joiner.join(timeout=0.01)
        assert rejects == [] and log.events("bootstrap_timeout") == []
        assert_serves_its_state(pulled[0], a)


def test_a_donor_that_never_copies_costs_a_joiner_its_timeout_and_no_reject():
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        start_as_worker(a)
        rejects: list[str] = []
        log = RecordingLog()
        state = pull_bootstrap(ctx, a.worker_id, a.server.address, reader_for(a), stage=0, sender="j" * 32,
                               timeout_s=0.5, on_reject=rejects.append, log=log)
        assert state is None
        assert rejects == [], "a donor preparing our copy was counted as refusing it"
        assert [e.get("note") for e in log.events("bootstrap_timeout")] == ["the donor was still preparing it"]


class _ListedPeers:
    """A stage view listing members that do not answer (records a Redis writer could add)."""

    def __init__(self, members) -> None:
        from noloco_rt.routing.peers import Blacklist

        self.members = members
        self.blacklist = Blacklist()

    def refresh_now(self, stage: int) -> None:
        pass

    def random_peers(self, stage: int, *, site: str = ""):
        return [m for m in self.members if not self.blacklist.blocked(m.worker_id)]


def _silent_members(outer_steps: list[int]) -> list:
    """Records of stage 0's members at these outer steps, at an address nobody answers."""
    from noloco_rt.membership.records import MemberRecord, WorkerState

    return [MemberRecord(f"{i}" * 32, "devices", 0, "tcp://127.0.0.1:1", "tcp://127.0.0.1:1", WorkerState.ONLINE,
                         outer_step=step) for i, step in enumerate(outer_steps)]


def test_listed_members_that_serve_nothing_end_in_no_donor_served_not_a_crash():
    from workers.outer.bootstrap import NoDonorServed, bootstrap_from_stage

    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        fakes = _silent_members([0, 0, 0])
        with pytest.raises(NoDonorServed, match="no peer of stage 0 served a bootstrap"):
            bootstrap_from_stage(ctx, _ListedPeers(fakes), a.step.service, timeout_s=0.6, pull_timeout_s=0.25,
                                 leave_requested=threading.Event())


@pytest.mark.parametrize(("outer_steps", "high_water", "seeds"), [
    ([0, 0], 0, True),  # every peer still holds the seed's φ, δ = 0: nothing to wait for
    ([0, 2], 0, False),  # a peer is past step 0 (the mark lags its heartbeat): ask
    ([0, 0], 1, False),  # the stage was past step 0 (peers restarted from the seed?): ask
    ([0, 0], None, False),  # Redis did not answer: the mark is unknown, so ask
])
def test_a_joiner_takes_the_seed_while_its_stage_is_at_outer_step_0_without_asking_a_peer(
        outer_steps, high_water, seeds):
    from workers.outer.bootstrap import NoDonorServed, bootstrap_from_stage, stage_at_seed

    assert stage_at_seed(outer_steps, lambda: high_water) is seeds
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        fakes = _silent_members(outer_steps)  # a joiner that asked one ends in NoDonorServed
        a.step.service.log = log = RecordingLog()
        started = time.monotonic()
        if seeds:
            assert bootstrap_from_stage(ctx, _ListedPeers(fakes), a.step.service, timeout_s=5.0, pull_timeout_s=0.25,
                                        leave_requested=threading.Event(), stage_high_water=lambda: high_water) is None
            assert time.monotonic() - started < 1.0  # no pull was tried (each waits 0.25 s)
            assert log.events("stage_at_seed")[0]["donors"] == len(fakes)
        else:
            with pytest.raises(NoDonorServed):
                bootstrap_from_stage(ctx, _ListedPeers(fakes), a.step.service, timeout_s=0.6, pull_timeout_s=0.25,
                                     leave_requested=threading.Event(), stage_high_water=lambda: high_water)
            assert not log.events("stage_at_seed")


def test_the_training_thread_never_waits_for_a_joiners_copy_being_compressed(monkeypatch):
    """The server thread compresses a joiner's copy (seconds for a large stage); a final step of
    the training thread meanwhile goes on at once, and the joiner still gets a final state."""
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        start_as_worker(a)
        assert ask_once(ctx, a)[0]
        a.step.after_inner_step()  # the copy a joiner asked for
        compressing, release = threading.Event(), threading.Event()
        encode = service_module.encode_snapshot

        def slow_encode(*args, **kwargs):
            compressing.set()
            release.wait(20)
            return encode(*args, **kwargs)

        monkeypatch.setattr(service_module, "encode_snapshot", slow_encode)
        answers: list[tuple[bool, BootstrapState | None]] = []
        asking = threading.Thread(target=lambda: answers.append(ask_once(ctx, a)))
        asking.start()
        try:
            assert compressing.wait(10)
            started = time.monotonic()
            start_as_worker(a)  # a final step while the joiner's copy is being compressed
            assert time.monotonic() - started < 1.0, "the training thread waited for the compression"
            assert asking.is_alive()
        finally:
            release.set()
            asking.join(timeout=30)
        [(preparing, state)] = answers
        assert not preparing
        assert_serves_its_state(state, a)
        preparing, state = ask_once(ctx, a)  # the newer copy, compressed for the next joiner
        assert not preparing
        assert_serves_its_state(state, a)


class _LeavingPeers(_ListedPeers):
    """A stage view whose members are gone from the second look on."""

    def random_peers(self, stage: int, *, site: str = ""):
        listed, self.members = self.members, []
        return listed


def test_a_bootstrap_that_finds_no_member_is_judged_by_the_mark_read_then_not_an_earlier_tries():
    """A donor past step 0 while the stage's mark (lagging its heartbeat) still reads 0, nobody
    near yet: the joiner waits a try; the donor leaves meanwhile and the mark catches up. The
    seed check reads 2 (refusing the seed), not the 0 of the first try."""
    from workers.outer.bootstrap import (
        MarkAsSeen,
        StageProgressLost,
        bootstrap_from_stage,
        check_may_seed,
    )

    marks = iter([0, 2])
    mark = MarkAsSeen(lambda: next(marks))
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        a.step.service.log = log = RecordingLog()
        probe = lambda donors: {d.worker_id: 0.05 for d in donors}  # noqa: E731 - nobody near: wait for a reference
        assert bootstrap_from_stage(ctx, _LeavingPeers(_silent_members([2])), a.step.service, timeout_s=5.0,
                                    pull_timeout_s=0.25, leave_requested=threading.Event(),
                                    stage_high_water=mark, probe=probe) is None
    assert mark.seen == [0, 2] and not log.events("stage_at_seed")
    with pytest.raises(StageProgressLost, match="outer step 2"):
        check_may_seed(0, mark.for_seed_check(), allow_reseed=False)

"""Re-sending forwards (workers/data_path/downstream.py), with stand-ins for sockets and Redis."""

from __future__ import annotations

import threading

import pytest
import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.model.staged import preset_model
from noloco_rt.routing.peers import Blacklist, PeerView
from tests.support.fake_clock import FakeClock
from workers.counters import Counters
from workers.data_path.context import DataContext
from workers.data_path.downstream import Downstream
from workers.device import HostStaging
from workers.metrics import WorkerMetrics


class StageOne:
    """The member views, reduced to two live next-stage workers."""

    def view(self, stage):
        return [MemberRecord(worker_id=w, run_id="r", stage=1, data_addr=f"tcp://{w}:1", exchange_addr="",
                             state=WorkerState.ONLINE) for w in ("a", "b")]

    def request(self):
        pass


class SilentSocket:
    """Takes every send (the peers then never answer)."""

    address = "tcp://me:1"
    curve = None

    def __init__(self) -> None:
        self.sent_to: list[str] = []

    def send(self, address, parts, *, ready=None, on_failure=None):
        self.sent_to.append(address)
        self.on_failure = on_failure


class QuietLog:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _downstream(clock: FakeClock) -> tuple[Downstream, SilentSocket, Counters]:
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}, "worker": {"max_retries": 5}}])
    peers = PeerView(StageOne(), own_id="me")
    peers.blacklist = Blacklist(base_s=1.0, clock=clock)
    data, counters = SilentSocket(), Counters()
    ctx = DataContext(cfg=cfg, stage=0, worker_id="me", model=preset_model(cfg), replica=StageReplica.create(cfg, 0),
                      staging=HostStaging(torch.device("cpu")), data=data, peers=peers, counters=counters,
                      metrics=WorkerMetrics(), log=QuietLog(), leave_requested=threading.Event())
    return Downstream(ctx, clock=clock), data, counters


def test_a_retry_never_goes_back_to_a_peer_that_failed_the_microbatch():
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    output = torch.zeros(2, 3, 4)
    downstream.forward(output, torch.zeros(2, 3, dtype=torch.long), output, downstream.choose(exclude={"b"}))
    assert data.sent_to == ["tcp://a:1"]
    clock.now += 100.0  # a's deadline passes: a is blacklisted, the retry goes to b
    downstream.retry_expired()
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"]
    # b's deadline passes too; a's blacklisting has lapsed, but a failed this one already:
    # nothing is sent again, it waits on a and b, and is dropped after max_retries + 1 (6) deadlines.
    waits = []
    for _ in range(4):
        clock.now += 100.0
        downstream.retry_expired()
        assert len(downstream) == 1 and counters.dropped == 0
        waits.append(downstream.inflight.get(0).deadline_at - clock.now)
    assert waits == [20.0, 30.0, 30.0, 30.0]  # twice the 10 s deadline, then at the 30 s ceiling
    clock.now += 100.0
    downstream.retry_expired()
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"]
    assert len(downstream) == 0 and (counters.sent, counters.retried, counters.dropped) == (1, 1, 1)


def test_a_peer_given_up_on_that_answers_late_resolves_the_microbatch_and_teaches_the_deadline():
    """A downstream worker stalled in a blocking outer step, not dead: its late gradient is
    used (the microbatch is not lost), its round trip raises the deadline, and it is no
    longer blacklisted."""
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    downstream.forward(output, torch.zeros(2, 3, dtype=torch.long), output, downstream.choose(exclude={"b"}))
    before = downstream.latency.deadline_s()
    clock.now += 12.0  # past the initial 10 s deadline: re-sent to b
    downstream.retry_expired()
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"] and peers.blacklist.blocked("a")
    clock.now += 0.5
    entry = downstream.resolve(0, 0)  # a's reply to the first attempt, 12.5 s after it left
    assert entry is not None and entry.answered_by == "a" and counters.answered_late == 1
    assert not peers.blacklist.blocked("a") and (peers.local_load("a"), peers.local_load("b")) == (0, 0)
    assert before == 10.0 and downstream.latency.deadline_s() == 30.0  # 4 x 12.5 s, at the ceiling
    assert downstream.resolve(0, 1) is None  # b's reply is the duplicate now


def test_a_reply_that_waited_for_our_training_thread_does_not_make_its_peer_look_slow():
    """The peer's round trip ends where our link took its reply: at the start our first step
    held the first replies ~240 ms, and routing passed their peer over for a second."""
    clock = FakeClock()
    downstream, _, _ = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    for mb, peer in enumerate("ab"):
        downstream.forward(output, targets, output, downstream.choose(exclude={"ab".replace(peer, "")}))
        clock.now += 0.004
        arrived = clock.now  # our link took both replies 4 ms after they left
        clock.now += 0.25 if peer == "b" else 0.0  # b's waited for our busy training thread
        assert downstream.resolve(mb, 0, received_at=arrived) is not None
    assert peers.round_trip_s("a") == pytest.approx(0.004) and peers.round_trip_s("b") == pytest.approx(0.004)
    assert {downstream.choose().worker_id for _ in range(40)} == {"a", "b"}  # neither is passed over
    # The deadline still learns the whole wait, ours included: a microbatch is not given up too soon.
    assert list(downstream.latency._samples) == pytest.approx([0.004, 0.254])
    assert (peers.local_load("a"), peers.local_load("b")) == (0, 0)


def test_round_trips_and_give_ups_teach_the_routing_which_peer_is_slow():
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    downstream.forward(output, targets, output, downstream.choose(exclude={"b"}))
    assert peers.local_load("a") == 1
    clock.now += 0.2
    assert downstream.resolve(0, 0) is not None  # a answered in 0.2 s
    downstream.forward(output, targets, output, downstream.choose(exclude={"a"}))
    clock.now += 100.0  # b never answers: given up after its deadline, re-sent to a
    downstream.retry_expired()
    assert (peers.local_load("a"), peers.local_load("b")) == (1, 0)
    clock.now += 0.2
    assert downstream.resolve(1, 1) is not None
    assert (peers.local_load("a"), peers.local_load("b")) == (0, 0)
    clock.now += 10.0  # b's blacklisting lapses; its owed time still makes it look slow
    assert not peers.blacklist.blocked("b")
    assert {downstream.choose().worker_id for _ in range(20)} == {"a"}
    assert data.sent_to == ["tcp://a:1", "tcp://b:1", "tcp://a:1"] and counters.retried == 1


def test_leaving_releases_what_is_in_flight_without_blaming_the_peer():
    clock = FakeClock()
    downstream, _, counters = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    for peer in ("a", "b"):
        downstream.forward(output, torch.zeros(2, 3, dtype=torch.long), output,
                           downstream.choose(exclude={"a", "b"} - {peer}))
    clock.now += 0.5
    assert downstream.resolve(1, 0) is not None  # b answered in 0.5 s; a is still working
    downstream.drop_expired("leaving", now=float("inf"))  # forced before a's deadline
    assert len(downstream) == 0 and counters.dropped == 1 and peers.local_load("a") == 0
    clock.now += 10.0
    # a, never measured, is explored at the best measured round trip: no penalty for our leaving.
    assert "a" in {downstream.choose().worker_id for _ in range(20)}


def test_a_send_the_link_reports_failed_goes_to_another_peer_unless_its_deadline_moved_on_first():
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    downstream.forward(output, targets, output, downstream.choose(exclude={"b"}))
    assert data.sent_to == ["tcp://a:1"] and peers.local_load("a") == 1
    data.on_failure()  # the link could not send to a: a is blacklisted, its load released, b gets it
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"] and counters.retried == 1
    assert peers.blacklist.blocked("a") and (peers.local_load("a"), peers.local_load("b")) == (0, 1)
    assert downstream.resolve(0, 1) is not None
    # A failure reported after the deadline already re-sent the microbatch changes nothing more.
    downstream.forward(output, targets, output, downstream.choose(exclude={"a"}))
    failed_first_send = data.on_failure
    clock.now += 100.0
    downstream.retry_expired()
    assert data.sent_to[-2:] == ["tcp://b:1", "tcp://a:1"] and counters.retried == 2
    failed_first_send()
    assert len(data.sent_to) == 4 and counters.retried == 2 and len(downstream) == 1


class Appearing(StageOne):
    """No next-stage worker at first (a view still empty at start-up), then a and b."""

    def __init__(self) -> None:
        self.live = False

    def view(self, stage):
        return super().view(stage) if self.live else []


def test_a_forward_with_no_worker_downstream_yet_waits_for_one_instead_of_being_dropped():
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    views = Appearing()
    downstream.ctx.peers.views = views
    output = torch.zeros(2, 3, 4)
    downstream.forward(output, torch.zeros(2, 3, dtype=torch.long), output, downstream.choose(5))
    assert data.sent_to == [] and len(downstream) == 1 and counters.dropped == 0
    views.live = True
    clock.now += 2.0  # the floor: look again
    downstream.retry_expired()
    assert len(data.sent_to) == 1 and counters.dropped == 0
    assert downstream.resolve(0, 1) is not None and len(downstream) == 0


def test_waiting_on_a_given_up_attempt_releases_its_peer_once():
    """b's attempt is given up on and waited on several times, then answers: b's count of our
    microbatches in flight stays right for the others we have there."""
    clock = FakeClock()
    downstream, data, counters = _downstream(clock)
    peers = downstream.ctx.peers
    output = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    downstream.forward(output, targets, output, downstream.choose(exclude={"a"}))  # mb 0 to b
    clock.now += 100.0
    downstream.retry_expired()  # given up on b, re-sent to a
    clock.now += 100.0
    downstream.retry_expired()  # given up on a: nobody untried, waits
    clock.now += 100.0
    downstream.retry_expired()  # waits again
    assert (peers.local_load("a"), peers.local_load("b")) == (0, 0)
    peers.blacklist.succeed("b")
    downstream.forward(output, targets, output, downstream.choose(exclude={"a"}))  # mb 1 to b
    assert peers.local_load("b") == 1
    assert downstream.resolve(0, 1) is not None  # a answers mb 0 at last
    assert (peers.local_load("a"), peers.local_load("b")) == (0, 1) and counters.answered_late == 1
    assert not peers.blacklist.blocked("a") and counters.dropped == 0

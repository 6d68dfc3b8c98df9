"""What a worker observes of its next-stage peers (noloco_rt/routing/peer_load.py), and
the peer view routing on it without asking Redis for more than the member list."""

from __future__ import annotations

import random

import pytest

from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.routing.peer_load import PeerLoad
from noloco_rt.routing.peers import PeerView


def test_inflight_counts_rise_and_fall_and_never_go_negative():
    load = PeerLoad()
    load.sent("a")
    load.sent("a")
    load.sent("b")
    assert (load.inflight("a"), load.inflight("b"), load.inflight("c")) == (2, 1, 0)
    load.returned("a")
    load.returned("b")
    load.returned("b")  # more returns than sends (a stray report) stays at zero
    assert (load.inflight("a"), load.inflight("b")) == (1, 0)


def test_rtt_is_a_moving_average_of_what_returned():
    load = PeerLoad(ema_weight=0.5)
    assert load.rtt_ema("a") is None
    load.sent("a")
    load.returned("a", 0.2)
    assert load.rtt_ema("a") == pytest.approx(0.2)  # the first sample is taken as is
    load.observe("a", 0.4)
    assert load.rtt_ema("a") == pytest.approx(0.3)
    load.returned("a")  # no time given: nothing learnt
    assert load.rtt_ema("a") == pytest.approx(0.3)
    with pytest.raises(ValueError):
        load.observe("a", -1.0)
    with pytest.raises(ValueError):
        PeerLoad(ema_weight=0.0)


class TwoLive:
    """The member views, reduced to two live stage-1 workers advertising queue depths."""

    def __init__(self, depth_a: int = 0, depth_b: int = 0) -> None:
        self.depths = {"a": depth_a, "b": depth_b}

    def view(self, stage):
        return [MemberRecord(worker_id=w, run_id="r", stage=1, data_addr=f"tcp://{w}:1", exchange_addr="",
                             state=WorkerState.ONLINE, queue_depth=d) for w, d in self.depths.items()]


def _view(membership: TwoLive) -> PeerView:
    return PeerView(membership, own_id="me", rng=random.Random(0))


def test_choose_next_hop_prefers_the_peer_that_answered_faster():
    view = _view(TwoLive())
    for peer, rtt in (("a", 0.5), ("b", 0.05)):
        view.sent_to(peer)
        view.returned_from(peer, rtt)
    assert {view.choose_next_hop(1, "p2c").worker_id for _ in range(20)} == {"b"}
    # Until b has enough of ours in flight that waiting behind them costs more than a's round trip.
    for _ in range(10):
        view.sent_to("b")
    assert view.local_load("b") == 10
    assert view.choose_next_hop(1, "p2c").worker_id == "a"


def test_a_peer_given_up_on_looks_slow():
    view = _view(TwoLive())
    for peer in ("a", "b"):
        view.sent_to(peer)
        view.returned_from(peer, 0.05)
    view.sent_to("a")
    view.returned_from("a", 5.0)  # its deadline passed: the time owed is folded in
    assert view.local_load("a") == 0
    assert {view.choose_next_hop(1, "p2c").worker_id for _ in range(20)} == {"b"}


def test_advertised_depth_only_tips_an_otherwise_equal_choice():
    view = _view(TwoLive(depth_a=4, depth_b=0))
    assert {view.choose_next_hop(1, "p2c").worker_id for _ in range(20)} == {"b"}
    view = _view(TwoLive(depth_a=4, depth_b=0))
    for peer, rtt in (("a", 0.05), ("b", 0.5)):
        view.sent_to(peer)
        view.returned_from(peer, rtt)
    assert {view.choose_next_hop(1, "p2c").worker_id for _ in range(20)} == {"a"}
    assert view.choose_next_hop(1, "p2c", exclude={"a"}).worker_id == "b"
    assert view.choose_next_hop(1, "p2c", exclude={"a", "b"}) is None


def test_the_deal_sends_a_step_to_both_peers_and_passes_over_a_slow_one():
    from noloco_rt.routing.balanced import DealSlot
    from workers.data_path.deal import DealPosition

    view = _view(TwoLive())
    assert view.rank(1) == 2  # "me" after "a" and "b": our own stage's view here is the same table
    deal = DealPosition(seed=1, stage=0, per_sender=2, rank=lambda: 0)
    chosen = []
    for _ in range(2):
        peer, passed_over = view.deal_next_hop(1, deal.slot(5))
        deal.taken(5)
        chosen.append(peer.worker_id)
        assert not passed_over
    assert sorted(chosen) == ["a", "b"]  # one each: B = 2 over two receivers
    assert deal.slot(5).index == 2 and deal.slot(6).index == 0
    # "a" answers 100x slower than "b": whatever the deal says, "b" gets the microbatch.
    view.returned_from("a", 5.0)
    view.returned_from("b", 0.05)
    for step in range(1, 20):
        peer, passed_over = view.deal_next_hop(1, DealSlot(seed=1, stage=0, step=step, sender_rank=0, per_sender=1, index=0))
        assert peer.worker_id == "b"
    view.blacklist.fail("a")
    view.blacklist.fail("b")
    assert view.deal_next_hop(1, deal.slot(7)) == (None, False)

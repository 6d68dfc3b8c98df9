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


class TwoSites:
    """Stage 0: us ("me", site x) and "o" (site y); stage 1: a and b at site x, c and d at y."""

    SITES = {"me": "x", "o": "y", "a": "x", "b": "x", "c": "y", "d": "y"}

    def view(self, stage):
        names = ("me", "o") if stage == 0 else ("a", "b", "c", "d")
        return [MemberRecord(worker_id=w, run_id="r", stage=stage, data_addr=f"tcp://{w}:1", exchange_addr="",
                             state=WorkerState.ONLINE, site=self.SITES[w]) for w in names]


def test_a_worker_that_names_its_site_deals_most_microbatches_inside_it():
    from collections import Counter

    from noloco_rt.routing.balanced import DealSlot

    view = PeerView(TwoSites(), own_id="me", rng=random.Random(0))
    assert view.rank(0) == 0 and view.rank(0, site="x") == 0 and view.rank(1, site="y") == 2

    def deal(far_share: float, steps: int = 500) -> Counter:
        return Counter(view.deal_next_hop(1, DealSlot(seed=3, stage=0, step=step, sender_rank=0, per_sender=4,
                                                      index=index), site="x", far_share=far_share)[0].worker_id
                       for step in range(steps) for index in range(4))

    kept = deal(0.0)
    assert set(kept) == {"a", "b"} and kept["a"] == kept["b"] == 1000  # the site's two, evenly
    mixed = deal(0.1)
    far = mixed["c"] + mixed["d"]
    assert 140 <= far <= 260 and min(mixed.values()) > 0, mixed  # 10 % of 2,000 leave the site
    assert abs(mixed["a"] - mixed["b"]) < 150 and abs(mixed["c"] - mixed["d"]) < 80
    assert set(deal(1.0, steps=20)) == {"c", "d"}
    anywhere = Counter(view.deal_next_hop(1, DealSlot(seed=3, stage=0, step=step, sender_rank=0, per_sender=4,
                                                      index=0))[0].worker_id for step in range(400))
    assert set(anywhere) == {"a", "b", "c", "d"}  # no site named: all four
    nowhere = Counter(view.deal_next_hop(1, DealSlot(seed=3, stage=0, step=step, sender_rank=0, per_sender=4,
                                                     index=0), site="z", far_share=0.0)[0].worker_id
                      for step in range(400))
    assert set(nowhere) == {"a", "b", "c", "d"}  # a site with no next-stage worker deals among all


def test_a_joiner_asks_the_donors_of_its_own_site_first():
    view = PeerView(TwoSites(), own_id="me", rng=random.Random(0))
    for _ in range(20):  # random order inside each site, ours always first
        donors = [m.worker_id for m in view.random_peers(1, site="y")]
        assert set(donors[:2]) == {"c", "d"} and set(donors[2:]) == {"a", "b"}
    assert {tuple(m.worker_id for m in view.random_peers(1)) for _ in range(40)} != {("a", "b", "c", "d")}
    assert {m.worker_id for m in view.random_peers(1, site="z")} == {"a", "b", "c", "d"}  # none there: all of them


def test_a_member_record_carries_its_site_and_a_bad_one_is_refused():
    record = MemberRecord(worker_id="w", run_id="r", stage=0, data_addr="tcp://127.0.0.1:1",
                          exchange_addr="tcp://127.0.0.1:2", state=WorkerState.ONLINE, site="eu-west-1a")
    assert MemberRecord.from_fields(record.to_fields()).site == "eu-west-1a"
    assert MemberRecord.from_json(record.to_json()) == record
    for bad in ("a b", "x" * 64, "site\n"):
        with pytest.raises(ValueError, match="site"):
            MemberRecord.from_fields({**record.to_fields(), "site": bad})


def test_a_failing_peer_is_avoided_doubling_up_to_the_configured_cap():
    view = PeerView(TwoLive(), own_id="me", backoff_max_s=4.0)  # worker.peer_backoff_max_s
    assert [view.blacklist.fail("a") for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert [r.worker_id for r in view.members(1)] == ["b"]
    view.blacklist.succeed("a")
    assert [r.worker_id for r in view.members(1)] == ["a", "b"]


def test_a_peer_passed_over_on_an_old_slow_figure_is_measured_again_once_it_is_stale():
    """A slow first round trip (a compile, a bootstrap served) must not starve a peer for good:
    only sending to it can correct its figure (the CI failure at 659eece: stage 0 passed over
    one stage-1 worker 492 times after its first 4 microbatches)."""
    from noloco_rt.routing.peer_load import STALE_MIN_S, STALE_RTTS

    now = [100.0]
    load = PeerLoad(ema_weight=0.5, clock=lambda: now[0])
    load.sent("slow")
    load.returned("slow", 0.8)  # its warm-up
    load.observe("fast", 0.02)
    assert deal_to_slow(load) == (False, True)  # dealt to "slow", passed over for "fast"
    now[0] += STALE_RTTS * 0.8 - 0.01  # not yet stale: still passed over
    assert load.rtt_ema("slow") == pytest.approx(0.8)
    now[0] += 0.02
    assert load.rtt_ema("slow") is None  # stale: it looks like an unmeasured peer and gets its share
    assert deal_to_slow(load) == (True, False)
    load.sent("slow")
    assert load.rtt_ema("slow") == pytest.approx(0.8)  # while ours is in flight there, the old figure holds
    load.returned("slow", 0.03)
    assert load.rtt_ema("slow") == pytest.approx(0.03)  # measured afresh, not folded into 0.8
    load.observe("fast", 0.02)
    now[0] += STALE_MIN_S - 0.01  # a fast peer's figure lasts at least STALE_MIN_S
    assert load.rtt_ema("fast") == pytest.approx(0.02)
    now[0] += 0.02
    assert load.rtt_ema("fast") is None


def deal_to_slow(load: PeerLoad) -> tuple[bool, bool]:
    """(whether "slow" gets a slot the deal gives it, passed_over) by the routing's own costs."""
    from noloco_rt.routing.balanced import DealSlot, balanced_next_hop
    from noloco_rt.routing.next_hop import next_hop_costs

    costs = next_hop_costs([(peer, load.rtt_ema(peer), load.inflight(peer), 0) for peer in ("fast", "slow")])
    slot = next(DealSlot(seed=0, stage=0, step=step, sender_rank=0, per_sender=1, index=0) for step in range(100)
                if DealSlot(seed=0, stage=0, step=step, sender_rank=0, per_sender=1, index=0).receiver(2) == 1)
    chosen, passed_over = balanced_next_hop(costs, slot, random.Random(0))
    return chosen == "slow", passed_over

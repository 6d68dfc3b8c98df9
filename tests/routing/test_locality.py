"""Near and far next-stage peers from measured link round trips (noloco_rt/routing/locality.py),
and the balanced deal that keeps most microbatches at near ones when no site is named."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.routing.balanced import DealSlot
from noloco_rt.routing.locality import (
    FAR_MARGIN_S,
    LINK_WINDOW,
    MIN_SAMPLES,
    LinkTimes,
    donor_plan,
    far_peers,
    link_round_trip,
)
from noloco_rt.routing.peers import PeerView


def test_the_link_is_the_round_trip_less_what_the_receiver_held():
    assert link_round_trip(0.060, 0.010) == pytest.approx(0.050)
    assert link_round_trip(0.010, 0.010) == 0.0
    assert link_round_trip(0.010, 0.011) is None  # held longer than the whole trip: a lie or a bad stamp
    assert link_round_trip(0.010, -0.001) is None


def test_far_needs_both_the_factor_and_the_margin():
    assert far_peers({}) == set()
    assert far_peers({"a": 0.001, "b": 0.0012, "c": 0.051, "d": 0.052}) == {"c", "d"}  # two sites, 50 ms apart
    # Large messages inside one site: 100 against 130 ms is 30 ms more but not twice.
    assert far_peers({"a": 0.100, "b": 0.130}) == set()
    # Small messages on a busy host: 0.2 against 2 ms is ten times but not 10 ms more.
    assert far_peers({"a": 0.0002, "b": 0.002}) == set()
    assert far_peers({"a": 0.0, "b": FAR_MARGIN_S}) == {"b"}
    assert far_peers({"a": 0.0, "b": FAR_MARGIN_S * 0.99}) == set()


def test_a_peer_is_judged_on_its_best_recent_link_after_enough_samples():
    links = LinkTimes()
    for _ in range(MIN_SAMPLES - 1):
        links.observe("near", 0.001)
        links.observe("far", 0.050)
    assert links.far(["near", "far"]) == set()  # too few samples (the first holds the connection's set-up)
    links.observe("near", 0.001)
    links.observe("far", 0.050)
    assert links.far(["near", "far"]) == {"far"}
    assert links.far(["far"]) == set()  # judged against the nearest of the peers asked about
    links.observe("near", 0.200)  # one slow trip (a queue, a busy receiver) does not move the best
    assert links.far(["near", "far"]) == {"far"} and links.best("near") == 0.001
    links.observe("far", 0.001)  # a far peer whose link got better is near at once
    assert links.far(["near", "far"]) == set()
    for _ in range(LINK_WINDOW):  # one whose link got worse: once a window of trips has shown it
        links.observe("near", 0.060)
    assert links.far(["near", "far"]) == {"near"}
    assert sorted(links.peers()) == ["far", "near"] and links.best("never") is None
    with pytest.raises(ValueError, match="negative"):
        links.observe("near", -1.0)


class OneStageAhead:
    """Stage 0: us; stage 1: a and b near us, c and d behind a slow link. Nobody names a site."""

    def view(self, stage):
        names = ("me",) if stage == 0 else ("a", "b", "c", "d")
        return [MemberRecord(worker_id=w, run_id="r", stage=stage, data_addr=f"tcp://{w}:1", exchange_addr="",
                             state=WorkerState.ONLINE) for w in names]


def _deal(view: PeerView, *, far_share: float, measured: bool = True, steps: int = 200) -> Counter:
    return Counter(view.deal_next_hop(1, DealSlot(seed=3, stage=0, step=step, sender_rank=0, per_sender=4, index=index),
                                      far_share=far_share, measured=measured)[0].worker_id
                   for step in range(steps) for index in range(4))


def test_measured_links_keep_the_deal_near_with_no_site_named():
    view = PeerView(OneStageAhead(), own_id="me", rng=random.Random(0))
    assert set(_deal(view, far_share=0.0)) == {"a", "b", "c", "d"}  # nothing measured: all near
    for _ in range(MIN_SAMPLES):
        for peer, round_trip in (("a", 0.012), ("b", 0.013), ("c", 0.062), ("d", 0.061)):
            view.link_measured(peer, round_trip, held_s=0.010)  # 2-3 ms against 51-52 ms of link
    kept = _deal(view, far_share=0.0)
    assert kept == Counter({"a": 400, "b": 400}) and view.far_ids == {"c", "d"}
    mixed = _deal(view, far_share=0.1)
    assert 50 <= mixed["c"] + mixed["d"] <= 110 and min(mixed.values()) > 0, mixed  # 10 % of 800 leave
    assert set(_deal(view, far_share=0.0, measured=False)) == {"a", "b", "c", "d"}  # locality = labels
    view.link_measured("c", 0.010, held_s=0.5)  # held past the round trip: not learnt
    assert view.links.best("c") == pytest.approx(0.052)


# -- a joiner's donors, from probes ------------------------------------------------------------

def test_a_joiner_asks_near_donors_first_then_unanswered_then_far():
    links = {"near-slow": 0.004, "near-fast": 0.001, "far": 0.060, "other-stage-here": 0.0008}
    plan = donor_plan(["far", "silent", "near-slow", "near-fast"], links)
    assert plan.order == ["near-fast", "near-slow", "silent", "far"]
    assert plan.far == {"far"} and not plan.all_far


def test_a_stage_held_only_by_another_site_is_all_far_when_a_worker_of_ours_answers_nearer():
    """The joiner's reference is a worker of another stage in its own site."""
    donors = ["b1", "b2"]
    assert donor_plan(donors, {"b1": 0.052, "b2": 0.051, "a-stage1": 0.0005}).all_far
    # No reference nearer than the donors: nothing tells the other site from ours.
    assert not donor_plan(donors, {"b1": 0.052, "b2": 0.051}).far
    # A donor that did not answer may be near: not all far.
    assert not donor_plan(donors, {"b1": 0.052, "a-stage1": 0.0005}).all_far
    assert not donor_plan([], {"a-stage1": 0.0005}).all_far

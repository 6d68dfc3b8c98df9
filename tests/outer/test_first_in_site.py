"""A joiner whose site holds no worker of its stage starts from the seed while the stage has
taken no outer step, rather than wait for a state to cross the slow link between sites: its
site named (worker.site), or told by probed links (noloco_rt/routing/locality.py donor_plan)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from noloco_rt.membership.records import MemberRecord, WorkerState
from tests.support.exchange_pair import RecordingLog
from workers.outer.bootstrap import order_by_measured_links, seeds_in_its_site


@pytest.mark.parametrize(("donor_sites", "site", "high_water", "seeds"), [
    (["b", "b"], "a", 0, True),  # nobody here, the stage untrained: the seed
    (["b", "a"], "a", 0, False),  # a donor of our site: its state, over a fast link
    (["b", "b"], "a", 3, False),  # the stage trained: its state, whatever the link
    (["b", "b"], "a", None, False),  # Redis not answering: the stage may be past step 0
    (["b", "b"], "", 0, False),  # no site named: every donor is as near as any
    ([], "a", 0, True),
])
def test_the_seed_only_for_the_first_of_an_untrained_stage_in_its_site(donor_sites, site, high_water, seeds):
    asked = []

    def mark() -> int | None:
        asked.append(1)
        return high_water

    assert seeds_in_its_site(donor_sites, site, mark) is seeds
    assert asked == ([1] if site and site not in donor_sites else [])  # Redis asked only when it decides


def _donor(worker_id: str) -> MemberRecord:
    return MemberRecord(worker_id=worker_id, run_id="r", stage=0, data_addr="tcp://127.0.0.1:1",
                        exchange_addr=f"tcp://127.0.0.1:{len(worker_id)}", state=WorkerState.ONLINE)


@pytest.mark.parametrize(("links", "high_water", "order"), [
    # A worker of another stage answers 100x sooner than both donors: the stage is elsewhere.
    ({"b1": 0.051, "b2": 0.050, "a-s1": 0.0005}, 0, None),
    ({"b1": 0.051, "b2": 0.050, "a-s1": 0.0005}, 4, ["b2", "b1"]),  # trained: the nearest donor's state
    ({"b1": 0.051, "a2": 0.0007, "a-s1": 0.0005}, 0, ["a2", "b1"]),  # a donor in our site first
    ({"b1": 0.051, "b2": 0.050}, 0, ["b2", "b1"]),  # nobody nearer (and no more waiting): nothing is far
    ({"b1": 0.051, "a-s1": 0.0005}, 0, ["b2", "b1"]),  # b2 silent: it may be near, so asked before b1
])
def test_without_a_site_the_probed_links_order_the_donors_and_an_untrained_stage_elsewhere_seeds(
        links, high_water, order):
    log = RecordingLog()
    donors = [_donor("b1"), _donor("b2")] if "a2" not in links else [_donor("b1"), _donor("a2")]
    probed: list[list[str]] = []

    def probe(asked: list[MemberRecord]) -> dict[str, float]:
        probed.append([d.worker_id for d in asked])
        return links

    verdict, ordered = order_by_measured_links(donors, probe, SimpleNamespace(log=log), lambda: high_water)
    assert probed == [[d.worker_id for d in donors]]
    assert (verdict, [d.worker_id for d in ordered]) == (("seed", []) if order is None else ("ask", order))
    assert bool(log.events("first_in_site")) is (order is None)
    assert log.events("donor_links")[0]["probed"] == len(links)


@pytest.mark.parametrize(("links", "high_water", "may_wait", "verdict"), [
    ({"b1": 0.051, "b2": 0.050}, 0, True, "wait"),  # only donors answered, 50 ms away: who else is starting?
    ({"b1": 0.051, "b-s1": 0.049}, 0, True, "wait"),  # others too, but none near: ours may still register
    ({"b1": 0.051, "b2": 0.050}, 0, False, "ask"),  # waited long enough
    ({"b1": 0.051, "b2": 0.050}, 2, True, "ask"),  # a trained stage's state is pulled wherever it is
    ({"b1": 0.002, "b2": 0.050}, 0, True, "ask"),  # b1 within FAR_MARGIN_S: near whatever answers later
    ({}, 0, True, "ask"),  # nobody answered: ask them in turn
])
def test_at_step_0_a_joiner_that_found_nobody_near_waits_for_a_reference(
        links, high_water, may_wait, verdict):
    log = RecordingLog()
    got, _ = order_by_measured_links([_donor("b1"), _donor("b2")], lambda _: links, SimpleNamespace(log=log),
                                     lambda: high_water, may_wait=may_wait)
    assert got == verdict
    assert bool(log.events("donor_links")) is (verdict != "wait")  # a line per decision, not per wait

"""At the end of a run, a later stage's worker that trained none of the last outer-step
boundary's microbatches (its peers took them all) still takes that outer step when its
partner has pushed for it (workers/inner_step.py take_last_steps)."""

from __future__ import annotations

from tests.support.exchange_pair import ExchangeParts, assert_both_matched_once, overlapped_pair
from tests.support.waiting import wait_until
from workers.counters import TokenRate
from workers.inner_step import InnerStep
from workers.metrics import WorkerMetrics


class _AtABoundary:
    """A data path at an inner-step boundary with nothing partial: its last inner step closed."""

    def holds_partial_step(self) -> bool:
        return False


def _inner_step_at_a_boundary(worker: ExchangeParts) -> InnerStep:
    """The worker's inner step over a data path with no partial step held."""
    metrics = WorkerMetrics()
    return InnerStep(data_path=_AtABoundary(), replica=worker.replica, outer=worker.step, counters=worker.counters,
                     tokens=TokenRate(metrics), metrics=metrics, log=worker.log)


def test_a_worker_whose_last_boundary_data_all_went_to_peers_takes_the_outer_step_its_partner_pushed():
    with overlapped_pair(max_delay_steps=4) as (a, b):
        h = a.step.settings.h
        b.counters.inner_steps = h - 1  # its data reached step h - 1; step h's went to its peers
        a.counters.inner_steps = h
        a.step.take()  # a's data reached h: outer step 1, pushed to b
        wait_until(lambda: b.step.pulled_to() == 1)
        _inner_step_at_a_boundary(b).take_last_steps()  # the run is over for b
        assert b.counters.outer_steps == 1 and b.counters.pulled_outer_steps == 1
        b.step.finish()
        assert_both_matched_once(a, b, 1)


def test_with_no_push_for_its_next_step_a_worker_takes_no_outer_step_at_the_end():
    with overlapped_pair(max_delay_steps=4) as (_, b):
        b.counters.inner_steps = b.step.settings.h - 1
        _inner_step_at_a_boundary(b).take_last_steps()
        assert b.counters.outer_steps == 0 and dict(b.counters.outer_kinds) == {}

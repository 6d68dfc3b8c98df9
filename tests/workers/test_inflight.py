from __future__ import annotations

import pytest

from workers.data_path.inflight import InflightTable


def test_resolve_once_and_stale_attempts():
    table = InflightTable()
    table.add(7, peer="a", now=0.0, deadline_s=1.0, context="graph")
    assert table.resolve(7, 1) is None  # no such attempt
    entry = table.resolve(7, 0)
    assert entry is not None and entry.context == "graph"
    assert table.resolve(7, 0) is None  # duplicate reply
    assert len(table) == 0


def test_expiry_and_retry_supersede_the_old_attempt():
    table = InflightTable()
    table.add(1, peer="a", now=0.0, deadline_s=1.0)
    table.add(2, peer="a", now=0.5, deadline_s=1.0)
    assert [e.microbatch_id for e in table.expired(1.2)] == [1]
    entry = table.retry(1, peer="b", now=1.2, deadline_s=1.0)
    assert (entry.attempt, entry.peer, entry.tried) == (1, "b", ["a", "b"])
    assert table.resolve(1, 2) is None  # no such attempt
    late = table.resolve(1, 0)  # the given-up first attempt answers first: it resolves the microbatch
    assert late is not None and (late.answered, late.answered_by) == (0, "a")
    assert late.round_trip_s(2.0) == pytest.approx(2.0)  # from the first attempt's send
    assert table.resolve(1, 1) is None  # the re-send's reply is then a duplicate
    assert table.expired(1.6) and table.expired(1.6)[0].microbatch_id == 2


def test_double_add_is_a_bug():
    table = InflightTable()
    table.add(1, peer="a", now=0.0, deadline_s=1.0)
    with pytest.raises(ValueError):
        table.add(1, peer="a", now=0.0, deadline_s=1.0)
    assert table.abandon(1) is not None and len(table) == 0


def test_waiting_again_moves_the_deadline_and_counts():
    table = InflightTable()
    entry = table.add(3, peer="a", now=0.0, deadline_s=1.0)
    assert entry.any_out()
    table.wait_again(3, now=1.0, deadline_s=2.0)
    assert (entry.waits, entry.deadline_at) == (1, 3.0) and not table.expired(2.5)
    entry.unsent.add(0)  # the link reported the only send failed: nothing can answer
    assert not entry.any_out()

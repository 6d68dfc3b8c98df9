"""When an outer step is due (noloco_rt/outer/schedule.py), and the origin step that forwards
carry for it (noloco_rt/net/messages.py)."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.net import messages
from noloco_rt.net.wire import WireReject
from noloco_rt.outer.schedule import outer_step_due, pull_target
from workers.counters import Counters


def test_stage_zero_counts_its_own_inner_steps():
    assert [s for s in range(1, 31) if outer_step_due(s, (s - 1) // 10, 10)] == [10, 20, 30]


def test_a_later_stage_follows_the_data_whatever_its_own_count():
    # Two replicas with unequal shares (7 and 13 inner steps of their own) when data of
    # stage-0 step 10 reached them: the data clock is what counts, so both take outer step
    # 1 then, and not again before data of step 20.
    assert not outer_step_due(9, 0, 10)
    assert outer_step_due(10, 0, 10)
    assert not outer_step_due(19, 1, 10)
    assert outer_step_due(21, 1, 10)


def test_a_worker_behind_takes_one_outer_step_per_inner_step_until_caught_up():
    taken = 0
    for _ in range(1, 10):
        if outer_step_due(35, taken, 10):
            taken += 1
    assert taken == 3


def test_only_a_push_from_a_partner_of_that_step_pulls_and_the_earliest_wins():
    partners = {4: ["b"], 5: ["c", "d"], 6: ["b"]}.get
    assert pull_target({4: {"b"}}, partners, 4) == 4
    assert pull_target({4: {"x"}}, partners, 4) is None  # not our partner of step 4
    assert pull_target({}, partners, 4) is None
    # Behind by more than one step (a slow joiner): step 4's partner moved on without us,
    # step 5's pushed; the earliest step a partner waits on is the one to take.
    assert pull_target({6: {"b"}, 5: {"d"}}, partners, 4) == 5
    assert pull_target({3: {"b"}, 6: {"b"}}, partners, 4) == 6  # a step behind us is no pull
    assert pull_target({5: {"b"}}, lambda step: [], 4) is None


def test_a_pulled_clock_jumps_to_the_step_start_and_counts_on_from_there():
    counters = Counters(inner_steps=14, outer_steps=1)
    assert counters.pull_clock_to(2, h=10) == 6  # a partner pushed for step 2 at our step 14
    assert counters.clock_steps == 20 and counters.pulled_outer_steps == 1
    assert counters.skipped_outer_steps == 0
    counters.outer_steps = 2
    counters.inner_steps += 9
    assert not outer_step_due(counters.clock_steps, counters.outer_steps, 10)
    counters.inner_steps += 1
    assert outer_step_due(counters.clock_steps, counters.outer_steps, 10)  # H steps after the pull
    assert counters.pull_clock_to(3, h=10) == 0  # already there: nothing skipped
    assert counters.pull_clock_to(6, h=10) == 30 and counters.skipped_outer_steps == 3  # 3, 4 and 5 jumped over


def test_restored_counts_keep_a_clock_that_was_pulled_ahead():
    counters = Counters()
    counters.set_steps(25, 4, h=10)  # pulled ahead of its own count before it was saved
    assert counters.clock_steps == 40
    counters.set_steps(47, 4, h=10)
    assert counters.clock_steps == 47 and counters.skipped_steps == 0
    counters.set_steps(25, 4, h=10, clock_steps=43)  # the clock saved with them, exactly
    assert counters.clock_steps == 43 and counters.skipped_steps == 18


def _decoded(origin_step):
    outgoing = messages.forward("run", "s0-a", 0, 7, "tcp://127.0.0.1:1", [torch.zeros(1, 2, 4)],
                                torch.zeros(1, 2, dtype=torch.int64), origin_step=origin_step)
    return messages.decode(outgoing.parts(), run_id="run")


def test_a_forward_carries_its_origin_step_and_absent_means_unknown():
    assert _decoded(12).origin_step == 12
    assert _decoded(None).origin_step is None


@pytest.mark.parametrize("bad", [-1, "3", 2.5, True])
def test_an_origin_step_that_is_no_step_is_refused(bad):
    with pytest.raises(WireReject, match="origin_step"):
        _decoded(bad)

"""When an outer step is due (noloco_rt/outer/schedule.py), and the origin step that forwards
carry for it (noloco_rt/net/messages.py)."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.net import messages
from noloco_rt.net.wire import WireReject
from noloco_rt.outer.schedule import outer_step_due


def test_stage_zero_counts_its_own_inner_steps():
    assert [s for s in range(1, 31) if outer_step_due(s, 0, 10)] == [10, 20, 30]


def test_a_later_stage_follows_the_data_whatever_its_own_count():
    # Two replicas with unequal shares: one took 7 inner steps, the other 13, when data of
    # stage-0 step 10 reached them: both take outer step 1 then, and not again before step 20.
    for own_steps in (7, 13):
        assert not outer_step_due(own_steps - 1, 0, 10, data_step=9)
        assert outer_step_due(own_steps, 0, 10, data_step=10)
        assert not outer_step_due(own_steps + 1, 1, 10, data_step=19)
        assert outer_step_due(own_steps + 5, 1, 10, data_step=21)


def test_a_worker_behind_takes_one_outer_step_per_inner_step_until_caught_up():
    taken, data_step = 0, 35
    for inner in range(1, 10):
        if outer_step_due(inner, taken, 10, data_step=data_step):
            taken += 1
    assert taken == 3


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

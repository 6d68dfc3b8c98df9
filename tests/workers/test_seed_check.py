"""The seed check reads the high-water mark the bootstrap's decision read (workers/outer/bootstrap.py)."""

from __future__ import annotations

import pytest

from workers.outer.bootstrap import MarkAsSeen, StageProgressLost, check_may_seed


def test_a_seed_taken_beside_peers_at_step_0_stands_when_one_finishes_step_1_meanwhile():
    marks = iter([0, 1])  # Redis: the stage at outer step 0, then a peer finishes outer step 1
    mark = MarkAsSeen(lambda: next(marks))
    assert mark() == 0  # the bootstrap: every live peer at step 0, take the seed
    check_may_seed(0, mark.for_seed_check(), allow_reseed=False)  # no StageProgressLost
    assert mark.seen == [0]


def test_without_a_bootstrap_read_the_check_reads_redis_and_refuses_a_trained_stage():
    mark = MarkAsSeen(lambda: 3)  # no bootstrap read the mark (a bootstrap that finds no member reads it too)
    with pytest.raises(StageProgressLost, match="outer step 3"):
        check_may_seed(0, mark.for_seed_check(), allow_reseed=False)

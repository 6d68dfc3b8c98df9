"""The injected slowdown (worker.fault_slowdown) stretches training time only."""

from __future__ import annotations

import pytest

from tests.support.fake_clock import FakeClock
from workers.faults.slowdown import InjectedSlowdown


def test_a_stall_between_steps_is_not_stretched_only_the_training_time_is():
    clock = FakeClock(100.0)
    slowdown = InjectedSlowdown(2.0, clock=clock, sleep=clock.sleep)
    slowdown.after_compute()  # the first step: nothing to measure from
    clock.now += 4.5  # its outer step waited for a partner that died
    slowdown.resume()
    clock.now += 0.3  # the next step's compute
    slowdown.after_compute()
    assert clock.slept == [pytest.approx(0.3)]


def test_a_factor_of_one_never_sleeps():
    clock = FakeClock(100.0)
    slowdown = InjectedSlowdown(1.0, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        slowdown.resume()
        clock.now += 1.0
        slowdown.after_compute()
    assert clock.slept == []

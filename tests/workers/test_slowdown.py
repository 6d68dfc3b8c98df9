"""The injected slowdown (worker.fault_slowdown) stretches training time only."""

from __future__ import annotations

import pytest

from workers.faults.slowdown import InjectedSlowdown


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_stall_between_steps_is_not_stretched_only_the_training_time_is():
    time = FakeTime()
    slowdown = InjectedSlowdown(2.0, clock=time.clock, sleep=time.sleep)
    slowdown.after_compute()  # the first step: nothing to measure from
    time.now += 4.5  # its outer step waited for a partner that died
    slowdown.resume()
    time.now += 0.3  # the next step's compute
    slowdown.after_compute()
    assert time.slept == [pytest.approx(0.3)]


def test_a_factor_of_one_never_sleeps():
    time = FakeTime()
    slowdown = InjectedSlowdown(1.0, clock=time.clock, sleep=time.sleep)
    for _ in range(3):
        slowdown.resume()
        time.now += 1.0
        slowdown.after_compute()
    assert time.slept == []

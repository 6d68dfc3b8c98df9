"""The tokens/s a worker reports: over its last TOKEN_WINDOW additions, kept as the window moves."""

from __future__ import annotations

import pytest

from tests.support.fake_clock import FakeClock
from workers import counters
from workers.counters import TOKEN_WINDOW, TokenRate
from workers.metrics import WorkerMetrics


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(100.0)
    monkeypatch.setattr(counters.time, "monotonic", fake)
    return fake


def test_rate_is_zero_until_two_additions(clock: FakeClock) -> None:
    rate = TokenRate(WorkerMetrics())
    assert rate.per_s() == 0.0
    rate.add(256)
    assert rate.per_s() == 0.0


def test_rate_counts_what_came_after_the_windows_first_addition(clock: FakeClock) -> None:
    rate = TokenRate(WorkerMetrics())
    rate.add(1000)  # before the span: not counted
    clock.now += 2.0
    rate.add(256)
    clock.now += 2.0
    rate.add(256)
    assert rate.per_s() == pytest.approx(512 / 4.0)


def test_window_moves_past_old_additions(clock: FakeClock) -> None:
    """After a slow start, only the newest TOKEN_WINDOW additions set the rate, and the
    Prometheus gauge follows it; the total counter keeps everything."""
    metrics = WorkerMetrics()
    rate = TokenRate(metrics)
    for _ in range(TOKEN_WINDOW):  # slow: 10 tokens a second
        rate.add(10)
        clock.now += 1.0
    for _ in range(TOKEN_WINDOW):  # fast: 100 tokens a second
        rate.add(100)
        clock.now += 1.0
    assert rate.per_s() == pytest.approx(100.0)
    assert metrics.registry.get_sample_value("noloco_tokens_per_second") == pytest.approx(100.0)
    assert metrics.registry.get_sample_value("noloco_tokens_total") == TOKEN_WINDOW * 110

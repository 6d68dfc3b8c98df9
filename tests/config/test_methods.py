"""Workers refuse the methods only the simulator runs, and say why."""

from __future__ import annotations

import pytest

from noloco_rt.config import METHODS
from noloco_rt.config.training import OuterConfig
from workers.methods import WORKER_METHODS, worker_method_error, worker_outer_error


@pytest.mark.parametrize("method", WORKER_METHODS)
def test_workers_run_noloco_and_local(method):
    assert worker_method_error(method) is None


@pytest.mark.parametrize(("method", "why"), [("diloco", "needs a global collective"),
                                             ("ddp", "needs a global collective"),
                                             ("adam", "simulator baseline")])
def test_workers_refuse_simulator_methods(method, why):
    message = worker_method_error(method)
    assert message is not None and why in message and repr(method) in message


def test_every_method_is_run_or_refused():
    assert set(WORKER_METHODS) < set(METHODS)
    assert all((worker_method_error(m) is None) == (m in WORKER_METHODS) for m in METHODS)


def test_workers_run_the_overlapped_step_when_a_correction_lands_before_the_next_outer_step():
    assert worker_outer_error(OuterConfig(method="noloco", overlap=True, h=10, max_delay_steps=9)) is None
    message = worker_outer_error(OuterConfig(method="noloco", overlap=True, h=10, max_delay_steps=10))
    assert message is not None and "outer.max_delay_steps" in message
    assert "global collective" in (worker_outer_error(OuterConfig(method="diloco", overlap=True)) or "")


def test_workers_refuse_the_random_peer_pairing_of_the_simulator():
    assert worker_outer_error(OuterConfig(method="noloco", pairing="matched")) is None
    message = worker_outer_error(OuterConfig(method="noloco", pairing="random-peer"))
    assert message is not None and "outer.pairing" in message and "simulator" in message
    assert "\n" not in message


def test_workers_refuse_the_deferred_overlap_correction_of_the_simulator():
    assert worker_outer_error(OuterConfig(method="noloco", overlap=True, overlap_correction="provisional")) is None
    message = worker_outer_error(OuterConfig(method="noloco", overlap=True, overlap_correction="deferred"))
    assert message is not None and "outer.overlap_correction" in message and "simulator" in message


def test_the_default_delay_bound_fits_below_any_h_and_overlap_needs_an_h_of_two():
    assert OuterConfig(method="noloco").resolved().max_delay_steps == 49
    assert OuterConfig(method="noloco", h=3).resolved().max_delay_steps == 2
    assert OuterConfig(method="noloco", h=3, max_delay_steps=1).resolved().max_delay_steps == 1
    assert worker_outer_error(OuterConfig(method="noloco", h=2)) is None  # overlap on by default, delay 1
    message = worker_outer_error(OuterConfig(method="noloco", h=1))
    assert message is not None and "outer.h >= 2" in message and "outer.overlap = false" in message
    assert worker_outer_error(OuterConfig(method="noloco", h=1, overlap=False)) is None

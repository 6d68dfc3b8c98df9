"""The outer exchange with the replica on another device than the host, on a CPU-only machine.

On CUDA every outer round once failed: the peer check compared a partner's state, decoded
on the host, with our own state on the device, and a catch-all turned each failure into
a silent local step. Here two workers' exchange parts (snapshot service, exchange server,
exchanger, outer step) run for real over loopback ZeroMQ, each replica's tensors on the
stand-in device of tests/support/other_device.py, which refuses host/device mixes as CUDA does
(tests/support/exchange_pair.py).
"""

from __future__ import annotations

import threading

import pytest
import torch
import zmq

from noloco_rt.config import load_config
from noloco_rt.outer.codec import encode_tensors
from noloco_rt.outer.correction import correction_term
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState, group_outer_step
from noloco_rt.outer.peer_checks import check_peer_distance
from noloco_rt.outer.snapshot import PartsKind
from tests.support.exchange_pair import (
    assert_both_matched_once,
    exchange_parts,
    overlapped_pair,
    see_each_other_and_take_a_step,
)
from tests.support.other_device import OTHER_DEVICE, OnOtherDevice, on_other_device, values
from tests.support.waiting import wait_until
from workers.device import HostCopy
from workers.outer import exchanger as exchanger_module
from workers.outer.device_boundary import ExchangeBoundary, HostContribution
from workers.outer.exchanger import OuterRound
from workers.outer.partners import Partner

COEFFS = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)


@pytest.mark.parametrize("gamma", [0.7, 0.0], ids=["theta-only", "slow-and-outer-gradient"])
def test_a_replica_on_a_device_exchanges_matched_and_applies_the_exact_group_step(gamma):
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "devices"},
                                              "outer": {"method": "noloco", "overlap": False, "gamma": gamma},
                                              "worker": {"snapshot_codec": "shuffle-zstd"}}])  # lossless: exact
    coeffs = OuterCoefficients.from_config(cfg.outer.resolved())
    ctx = zmq.Context()
    workers = [exchange_parts(ctx, cfg, "a" * 32, seed=1), exchange_parts(ctx, cfg, "b" * 32, seed=2)]
    try:
        before = [{name: [values(t) for t in getattr(w.replica, name)] for name in ("fast", "slow", "momentum")}
                  for w in workers]
        see_each_other_and_take_a_step(workers)

        for index, worker in enumerate(workers):
            assert worker.log.errors() == [], worker.log.errors()
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, (worker.counters.outer_kinds, worker.log.lines)
            # The replica stayed on its device: the correction crossed back, nothing was swapped for host tensors.
            assert all(isinstance(t, OnOtherDevice) for t in worker.replica.slow + worker.replica.fast
                       + worker.replica.momentum)
            # The same result as the paper's blocking group step on host copies of both replicas.
            mine, theirs = before[index], before[1 - index]
            expected = {name: [t.clone() for t in mine[name]] for name in ("fast", "slow", "momentum")}
            partner = PeerOuterState.of(theirs["fast"], theirs["slow"], theta_only=coeffs.theta_shortcut)
            group_outer_step(expected["slow"], expected["momentum"], expected["fast"], [partner], coeffs)
            for name in ("fast", "slow", "momentum"):
                for got, want in zip(getattr(worker.replica, name), expected[name], strict=True):
                    torch.testing.assert_close(values(got), want, rtol=0, atol=1e-6)
    finally:
        for worker in workers:
            worker.close()
        ctx.term()


def test_a_round_that_raises_is_counted_as_failed_not_passed_off_as_local():
    """Our contribution handed to the exchanger still on the device (the boundary skipped):
    the round fails at the encoder's door, and says so in the result and the log."""
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "devices"}, "outer": {"method": "noloco"}}])
    ctx = zmq.Context()
    worker = exchange_parts(ctx, cfg, "a" * 32, seed=1)
    try:
        skipped = HostContribution(HostCopy([t.clone() for t in worker.replica.fast]), PartsKind.FAST)
        worker.exchanger.begin(OuterRound(1, skipped, [Partner("b" * 32, "tcp://127.0.0.1:1", 1)], COEFFS))
        result = worker.exchanger.result(1, wait_s=30)
        assert result is not None and result.failed == "ValueError" and result.used == []
        (event, fields), = worker.log.errors()
        assert event == "outer_round_failed" and "expected host tensors" in fields["error"]
    finally:
        worker.close()
        ctx.term()


def test_a_round_given_up_as_late_is_dropped_on_both_sides():
    """Overlapped, max_delay_steps 1: a reaches its step and pushes to b, which is not there
    yet (b keeps a's push and acknowledges it); a trains two inner steps with no word from b
    and gives its round up. b then reaches its step: a refuses b's push, so b must not use
    a's either, acknowledged or not. Neither applies a correction: the pair's mean is kept."""
    with overlapped_pair() as (a, b):
        a.step.take()
        wait_until(lambda: len(b.exchanger.service.inbox) == 1)  # a's push kept (and acknowledged) at b
        for _ in range(2):  # delay 1 is still allowed; delay 2 is past max_delay_steps
            a.counters.inner_steps += 1
            a.step.after_inner_step()
        assert a.step.pending is None and dict(a.counters.outer_kinds) == {"dropped_late": 1}
        b.step.take()
        b.step.finish()
        assert dict(b.counters.outer_kinds) == {"local": 1}, b.log.lines
        assert dict(b.counters.unmatched_reasons) == {"push_failed": 1}  # refused by a: the round was closed
        for worker in (a, b):
            done = [fields for _, event, fields in worker.log.lines if event == "outer_step_done"]
            assert [d["used"] for d in done] == [[]] and "correction_sum" not in done[0], done
            assert worker.log.errors() == []


def test_a_round_settled_but_seen_late_is_applied_on_both_sides():
    """Both pushes were kept and acknowledged, so b applies its side; a only looks after two
    inner steps (past max_delay_steps 1). Dropping it then would be one-sided (the pair's
    mean moves): a applies it, late, and the two corrections cancel."""
    with overlapped_pair() as (a, b):
        a.step.take()
        b.step.take()
        b.step.finish()
        a.counters.inner_steps += 2  # two inner steps with no boundary seen: a busy training thread
        # a's round is over too (its result kept, not yet applied): read, not taken
        assert a.exchanger.round_over(1, wait_s=30)
        a.step.after_inner_step()
        sums = []
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
            (done,) = [fields for _, event, fields in worker.log.lines if event == "outer_step_done"]
            sums.append(done["correction_sum"])
        assert [d for _, e, d in a.log.lines if e == "outer_step_done"][0]["delay"] == 2
        assert abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums)


def test_a_round_seen_late_while_its_correction_is_computed_is_applied_on_both_sides(monkeypatch):
    """On a GPU (125m, 2 x 2) a round's last act, the correction on the host, outlasted
    max_delay_steps after both pushes had crossed: the partner's push was already taken from
    the inbox, so closing the round named no committed partner and a dropped its side while b
    applied its: one-sided. Held here in a's correction: a must wait for it and apply it late."""
    computing, release = threading.Event(), threading.Event()
    compute = exchanger_module.correction_term

    def held_on_a(*args, **kwargs):
        if threading.current_thread() is a.exchanger.thread:
            computing.set()
            assert release.wait(30), "the test never released a's correction"
        return compute(*args, **kwargs)

    monkeypatch.setattr(exchanger_module, "correction_term", held_on_a)
    with overlapped_pair() as (a, b):
        a.step.take()
        b.step.take()
        b.step.finish()
        assert dict(b.counters.outer_kinds) == {"matched": 1}, b.log.lines  # b used a's: a must use b's
        assert computing.wait(30), "a's round never reached its correction"
        for _ in range(2):  # past max_delay_steps 1, with b's push taken and a's correction not done
            a.counters.inner_steps += 1
            a.step.after_inner_step()
        assert a.step.pending is not None and a.step.pending.committed == {"b" * 32}
        assert dict(a.counters.outer_kinds) == {}, a.log.lines  # not dropped
        release.set()
        a.step.finish()
        sums = []
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
            assert worker.log.errors() == []
            (done,) = [fields for _, event, fields in worker.log.lines if event == "outer_step_done"]
            sums.append(done["correction_sum"])
        assert abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums)


def test_a_partners_push_for_our_next_step_pulls_us_to_it_and_the_pair_matches():
    """b is behind (its clock at 3 of h = 10): a reaches step 1 and pushes. Before a's push
    b is not pulled; once it is kept, b takes step 1 at once, its clock jumps to 10, and the
    round matches on both sides."""
    with overlapped_pair(max_delay_steps=4) as (a, b):
        h = a.step.settings.h
        b.counters.inner_steps = 3
        assert b.step.pulled_to() is None
        a.counters.inner_steps = h
        a.step.take()
        wait_until(lambda: b.step.pulled_to() == 1)
        b.step.take(pulled_to=1)
        assert b.counters.clock_steps == h and b.counters.skipped_steps == h - 3
        assert b.counters.pulled_outer_steps == 1 and b.step.pulled_to() is None
        assert not b.step.due(b.counters.clock_steps)  # the next one is h inner steps away
        b.step.finish()
        assert_both_matched_once(a, b, 1)
        assert [f["skipped_steps"] for _, e, f in b.log.lines if e == "outer_step_pulled"] == [h - 3]


def test_a_worker_two_steps_behind_is_pulled_over_the_step_its_partner_took_without_it():
    """b joined late (outer step 0) while a took step 1 without it and now pushes for step 2:
    b jumps straight to step 2 (step 1 is skipped, not taken local) and the pair matches."""
    with overlapped_pair(max_delay_steps=4) as (a, b):
        h = a.step.settings.h
        a.counters.outer_steps, a.counters.inner_steps = 1, 2 * h
        a.step.take()
        wait_until(lambda: b.step.pulled_to() == 2)
        b.step.take(pulled_to=2)
        assert b.counters.outer_steps == 2 and b.counters.skipped_outer_steps == 1
        assert b.counters.clock_steps == 2 * h
        b.step.finish()
        assert_both_matched_once(a, b, 2)


def _host_and_device_states() -> tuple[PeerOuterState, PeerOuterState]:
    host = [torch.ones(4, 3), torch.zeros(3)]
    return PeerOuterState(fast=host), PeerOuterState(fast=[on_other_device(t) for t in host])


def test_pure_functions_refuse_mixed_devices_naming_both():
    host, device = _host_and_device_states()
    calls = {
        "check_peer_distance": lambda: check_peer_distance(host, device, max_ratio=1.0),
        "correction_term": lambda: correction_term(device, [host], COEFFS),
        "group_outer_step": lambda: group_outer_step([on_other_device(torch.ones(4, 3))],
                                                     [on_other_device(torch.zeros(4, 3))],
                                                     [on_other_device(torch.ones(4, 3))],
                                                     [PeerOuterState(fast=[torch.ones(4, 3)])], COEFFS),
        "encode_tensors": lambda: encode_tensors([host.fast[0], device.fast[1]], "int8-zstd"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"{name}: tensors on two devices, (cpu and meta|meta and cpu)"):
            call()


def test_the_boundary_copies_both_ways_and_keeps_the_replica_dtype():
    boundary = ExchangeBoundary.on(OTHER_DEVICE)
    state = PeerOuterState(fast=[on_other_device(torch.arange(6.0).reshape(2, 3))])
    host = boundary.contribution_to_host(state).state()
    assert type(host.fast[0]) is torch.Tensor and host.fast[0].device.type == "cpu"
    assert torch.equal(host.fast[0], torch.arange(6.0).reshape(2, 3))
    like = [on_other_device(torch.zeros(2, 3, dtype=torch.bfloat16))]
    back = boundary.to_device(boundary.ready_for_device(host.fast), like=like)
    assert isinstance(back[0], OnOtherDevice) and back[0].dtype == torch.bfloat16
    assert torch.equal(values(back[0]), torch.arange(6.0).reshape(2, 3).bfloat16())
    # Live weights are cloned before they cross: a later in-place update does not reach the copy.
    live = [on_other_device(torch.ones(3))]
    copied = boundary.weights_to_host(live)
    live[0].add_(on_other_device(torch.ones(3)))
    assert torch.equal(copied.tensors[0], torch.ones(3))


@pytest.mark.parametrize("gamma", [0.7, 0.0], ids=["theta-only", "slow-and-outer-gradient"])
def test_a_contribution_quantised_at_the_boundary_is_sent_as_its_codes_and_the_pair_corrections_cancel(
        gamma, monkeypatch):
    """On a GPU a blockwise codec quantises at the device boundary and the host only packs the
    codes (here the boundary quantises on the host's own device, the same code path). The
    host codec's rounding is never used, and each side's correction starts from its values
    as its partner decoded them: the pair's corrections cancel element by element."""
    from noloco_rt.outer.codecs.quantized import Int8ZstdCodec

    def host_rounding(*args, **kwargs):
        raise AssertionError("the contribution was rounded on the host")
    monkeypatch.setattr(Int8ZstdCodec, "encode", host_rounding)
    corrections: dict[str, list[torch.Tensor]] = {}
    real_correction = exchanger_module.correction_term

    def recorded(own, states, coeffs, **kwargs):
        correction = real_correction(own, states, coeffs, **kwargs)
        corrections[threading.current_thread().name + str(id(own))] = correction
        return correction
    monkeypatch.setattr(exchanger_module, "correction_term", recorded)
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "devices"},
                                              "outer": {"method": "noloco", "overlap": False, "gamma": gamma},
                                              "worker": {"snapshot_codec": "int8-zstd"}}])
    ctx = zmq.Context()
    workers = [exchange_parts(ctx, cfg, worker_id, seed=seed,
                              boundary=ExchangeBoundary.on("cpu", quantize_codec="int8-zstd"))
               for worker_id, seed in (("a" * 32, 1), ("b" * 32, 2))]
    try:
        see_each_other_and_take_a_step(workers)
        for worker in workers:
            assert worker.log.errors() == [], worker.log.errors()
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, (worker.counters.outer_kinds, worker.log.lines)
        assert len(corrections) == 2
        first, second = corrections.values()
        assert any(float(c.abs().max()) > 0 for c in first)
        for c_a, c_b in zip(first, second, strict=True):
            torch.testing.assert_close(c_a + c_b, torch.zeros_like(c_a), rtol=0, atol=1e-7)
    finally:
        for worker in workers:
            worker.close()
        ctx.term()


def test_only_a_gpu_with_a_blockwise_codec_and_no_injected_faults_quantises_at_the_boundary():
    from workers.outer.device_boundary import quantizes_on_device

    assert quantizes_on_device("cuda", "int8-zstd", faults_on=False) == "int8-zstd"
    assert quantizes_on_device("cuda", "int4-zstd", faults_on=False) == "int4-zstd"
    assert quantizes_on_device("cpu", "int8-zstd", faults_on=False) is None
    assert quantizes_on_device("cuda", "int8-zstd", faults_on=True) is None
    assert quantizes_on_device("cuda", "bf16-shuffle-zstd", faults_on=False) is None

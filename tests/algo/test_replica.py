"""Replicas that start identical and see the same data stay bit-identical."""

from __future__ import annotations

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.model.llama import lm_loss
from noloco_rt.outer.formula import OuterCoefficients


def _assert_identical(a: StageReplica, b: StageReplica) -> None:
    for name, xs, ys in (("fast", a.fast, b.fast), ("slow", a.slow, b.slow), ("momentum", a.momentum, b.momentum)):
        for x, y in zip(xs, ys, strict=True):
            assert torch.equal(x, y), name
    for sa, sb in zip(a.inner.optimizer.state.values(), b.inner.optimizer.state.values(), strict=True):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_identical_replicas_with_identical_data_stay_bit_identical():
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}, "run": {"steps": 20}}])
    coeffs = OuterCoefficients.from_config(cfg.outer.resolved())
    pipelines = [[StageReplica.create(cfg, s) for s in range(2)] for _ in range(2)]  # two replicas of each stage
    generator = torch.Generator().manual_seed(0)
    for step in range(1, 9):
        tokens = torch.randint(0, 256, (4, 33), generator=generator)
        for pipeline in pipelines:
            hidden = tokens[:, :-1]
            for replica in pipeline:
                hidden = replica.module(hidden)
                replica.record_microbatch()
            lm_loss(hidden, tokens[:, 1:]).backward()
            for replica in pipeline:
                replica.finish_inner_step()
        if step % 4 == 0:  # outer step: the two replicas of each stage form a group
            for stage in range(2):
                a, b = pipelines[0][stage], pipelines[1][stage]
                state_a = a.outer_state(theta_only=True)
                state_b = b.outer_state(theta_only=True)
                a.apply_outer_step([state_b], coeffs)
                b.apply_outer_step([state_a], coeffs)
    for stage in range(2):
        a, b = pipelines[0][stage], pipelines[1][stage]
        _assert_identical(a, b)
        assert a.outer_steps == 2
        # and they did train: weights moved away from the initial ones
        fresh = StageReplica.create(cfg, stage)
        assert any(not torch.equal(x, y) for x, y in zip(a.fast, fresh.fast, strict=True))

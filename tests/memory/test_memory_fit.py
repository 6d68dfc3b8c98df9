"""The in-flight count and checkpointing a worker picks for its memory (noloco_rt/memory/fit.py)."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.config import Config, ConfigError, load_config
from noloco_rt.memory.fit import (
    GB,
    budget_bytes,
    choose,
    fit_stages,
    plan_settings,
    resolved_config,
    worst_peak,
)
from noloco_rt.memory.plan import plan
from workers.device import memory_choice, workers_sharing_device


def config(**sections: dict) -> Config:
    base = {"model": {"preset": "1b", "seq_len": 1024}, "data": {"batch_size": 8}, "pipeline": {"stages": 2}}
    for name, values in sections.items():
        base[name] = base.get(name, {}) | values
    return load_config(environ={}, overrides=[base])


def peak(cfg: Config, inflight: int, checkpointing: bool) -> int:
    return worst_peak(plan(plan_settings(cfg, device_type="cuda", max_inflight=inflight,
                                         activation_checkpointing=checkpointing)))


def test_without_a_budget_the_cpu_keeps_todays_settings() -> None:
    cfg = config()
    assert cfg.pipeline.max_inflight == 0  # the default: from memory
    choice = choose(cfg, device_type="cpu", budget_bytes=None)
    assert (choice.max_inflight, choice.activation_checkpointing, choice.fits) == (4, False, True)
    explicit = choose(config(pipeline={"max_inflight": 2}, model={"activation_checkpointing": "on"}),
                      device_type="cpu", budget_bytes=None)
    assert (explicit.max_inflight, explicit.activation_checkpointing) == (2, True)


def test_auto_keeps_four_in_flight_turning_checkpointing_on_before_taking_fewer() -> None:
    cfg = config(model={"seq_len": 8192})  # long enough that checkpointed activations outweigh the outer step
    plain, checkpointed = peak(cfg, 4, False), peak(cfg, 4, True)
    assert checkpointed < plain
    roomy = choose(cfg, device_type="cuda", budget_bytes=plain)
    assert (roomy.max_inflight, roomy.activation_checkpointing, roomy.fits) == (4, False, True)
    tight = choose(cfg, device_type="cuda", budget_bytes=plain - 1)
    assert (tight.max_inflight, tight.activation_checkpointing, tight.fits) == (4, True, True)
    tighter = choose(cfg, device_type="cuda", budget_bytes=checkpointed - 1)
    assert (tighter.max_inflight, tighter.activation_checkpointing) == (3, True)
    assert tighter.fits and tighter.peak_bytes <= checkpointed - 1


def test_off_or_an_explicit_count_is_kept_and_a_budget_too_small_says_so() -> None:
    cfg = config(model={"activation_checkpointing": "off"})
    choice = choose(cfg, device_type="cuda", budget_bytes=peak(cfg, 2, False))
    assert (choice.max_inflight, choice.activation_checkpointing) == (2, False)
    explicit = config(pipeline={"max_inflight": 4})
    assert choose(explicit, device_type="cuda", budget_bytes=peak(explicit, 4, True)).activation_checkpointing
    hopeless = choose(config(), device_type="cuda", budget_bytes=GB)
    assert (hopeless.max_inflight, hopeless.activation_checkpointing, hopeless.fits) == (1, True, False)
    assert "does NOT fit" in hopeless.reason


def test_the_budget_is_the_setting_or_the_device_shared() -> None:
    assert budget_bytes(20.0, device_type="cpu", device_total_bytes=None, workers_sharing=1) == 20 * GB
    assert budget_bytes(0.0, device_type="cuda", device_total_bytes=80 * GB, workers_sharing=4) == 20 * GB
    assert budget_bytes(0.0, device_type="cpu", device_total_bytes=None, workers_sharing=1) is None
    assert workers_sharing_device({}) == 1
    assert workers_sharing_device({"LOCAL_WORLD_SIZE": "3"}) == (3 if torch.cuda.device_count() <= 1 else 2)


def test_a_worker_on_the_cpu_resolves_the_config_every_reader_sees() -> None:
    cfg = load_config(environ={}, overrides=[{"model": {"preset": "tiny"}}])
    resolved = resolved_config(cfg, memory_choice(cfg, torch.device("cpu")))
    assert (resolved.pipeline.max_inflight, resolved.model.activation_checkpointing) == (4, "off")
    assert cfg.pipeline.microbatches_per_step == 4 and resolved.pipeline.microbatches_per_step == 4
    budgeted = load_config(environ={}, overrides=[{"model": {"preset": "small", "seq_len": 512},
                                                   "worker": {"memory_budget_gb": 0.3}}])
    choice = memory_choice(budgeted, torch.device("cpu"))
    assert choice.fits and choice.activation_checkpointing and choice.peak_bytes <= 0.3 * GB


def test_zero_in_flight_is_accepted_and_negative_refused() -> None:
    with pytest.raises(ConfigError, match="pipeline.max_inflight"):
        load_config(environ={}, overrides=[{"pipeline": {"max_inflight": -1}}])
    with pytest.raises(ConfigError, match="worker.memory_budget_gb"):
        load_config(environ={}, overrides=[{"worker": {"memory_budget_gb": -2}}])


def test_the_7b_preset_fits_80_gb_a_worker_on_the_fewest_stages() -> None:
    cfg = config(model={"preset": "7b"})
    fit = fit_stages(cfg, device_type="cuda", budget=80 * GB)
    assert fit is not None
    assert all(stage.peak <= 80 * GB for stage in fit.plan)
    fewer = config(model={"preset": "7b"}, pipeline={"stages": fit.stages - 1})
    assert not choose(fewer, device_type="cuda", budget_bytes=80 * GB).fits
    assert (fit.stages, fit.choice.max_inflight, fit.choice.activation_checkpointing) == (3, 4, True)

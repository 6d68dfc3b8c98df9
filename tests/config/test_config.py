from __future__ import annotations

import pytest

from noloco_rt.config import ConfigError, config_to_toml, load_config, parse_assignment
from tests.support.paths import REPO


def test_defaults_are_valid():
    cfg = load_config(environ={})
    assert cfg.outer.method == "noloco" and cfg.model.preset == "tiny"
    assert cfg.outer.resolved().gamma == cfg.outer.resolved().beta
    assert cfg.coordinator.spread_sample == 8


def test_precedence_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[outer]\nmethod = "diloco"\nalpha = 0.1\nbeta = 0.2\n[run]\nsteps = 7\n')
    cfg = load_config(path, environ={})
    assert (cfg.outer.method, cfg.outer.alpha, cfg.outer.beta, cfg.run.steps) == ("diloco", 0.1, 0.2, 7)
    cfg = load_config(path, environ={"NOLOCO_OUTER_ALPHA": "0.3", "NOLOCO_RUN_STEPS": "9"})
    assert (cfg.outer.alpha, cfg.outer.beta, cfg.run.steps) == (0.3, 0.2, 9)
    cfg = load_config(path, environ={"NOLOCO_OUTER_ALPHA": "0.3"}, overrides=[parse_assignment("outer.alpha=0.4")])
    assert cfg.outer.alpha == 0.4


def test_environment_types_and_lists():
    cfg = load_config(environ={"NOLOCO_DATA_SOURCE": "files", "NOLOCO_DATA_PATHS": "a.txt, b/*.txt",
                               "NOLOCO_OPTIM_WARMUP_STEPS": "12", "NOLOCO_OUTER_GAMMA": "none"})
    assert cfg.data.paths == ["a.txt", "b/*.txt"]
    assert cfg.optim.warmup_steps == 12
    assert cfg.outer.gamma is None


@pytest.mark.parametrize(("environ", "field", "shown", "fragment"), [
    ({"NOLOCO_OUTER_METHOD": "sgd"}, "outer.method", "'sgd'", "noloco, diloco, local, ddp"),
    ({"NOLOCO_OUTER_ALPHA": "fast"}, "outer.alpha", "'fast'", "must be a number"),
    ({"NOLOCO_OUTER_ALPHA": "nan"}, "outer.alpha", "'nan'", "finite"),
    ({"NOLOCO_OUTER_BETA": "5"}, "outer.beta", "5.0", "[0, 2]"),
    ({"NOLOCO_RUN_STEPS": "0"}, "run.steps", "= 0", ">= 1"),
    ({"NOLOCO_MODEL_SEQ_LEN": "99999999999"}, "model.seq_len", "99999999999", "between 2 and 1048576"),
    ({"NOLOCO_MODEL_VOCAB_SIZE": "5000000000"}, "model.vocab_size", "5000000000", "stored as uint32"),
    ({"NOLOCO_DATA_BATCH_SIZE": "1000000"}, "data.batch_size", "1000000", "between 1 and 65536"),
    ({"NOLOCO_WORKER_MIN_BANDWIDTH_MBIT_S": "1e-9"}, "worker.min_bandwidth_mbit_s", "1e-09", ">= 0.01"),
    ({"NOLOCO_NETWORK_REDIS_URL": "redis://x:1/0", "NOLOCO_NETWORK_REDIS_TLS_CA_FILE": "/ca.pem"},
     "network.redis_url", "redis://x:1/0", "need a rediss:// URL"),
    ({"NOLOCO_RUN_STEPS": "1.5"}, "run.steps", "'1.5'", "integer"),
    ({"NOLOCO_MODEL_PRESET": "huge"}, "model.preset", "'huge'", "tiny"),
    ({"NOLOCO_OPTIM_LR_MIN": "1"}, "optim.lr_min", "1.0", "optim.lr"),
    ({"NOLOCO_PIPELINE_STAGES": "9"}, "pipeline.stages", "9", "at most 4"),
    ({"NOLOCO_NETWORK_REDIS_URL": "http://x"}, "network.redis_url", "'http://x'", "redis://"),
    ({"NOLOCO_DATA_SOURCE": "files"}, "data.paths", "[]", "needs at least one"),
    ({"NOLOCO_OUTER_NOPE": "1"}, "outer.nope", "'1'", "unknown field"),
    ({"NOLOCO_ROUTING_SIMULATION": "round-robin"}, "routing.simulation", "'round-robin'",
     "balanced, balanced-sequence, local, fixed, p2c, random"),
    ({"NOLOCO_DATA_MICROBATCHES": "2"}, "data.microbatches", "'2'", "set pipeline.max_inflight"),
    ({"NOLOCO_OPTIM_WARMUP_FRACTION": "1.5"}, "optim.warmup_fraction", "1.5", "[0, 1)"),
    ({"NOLOCO_COORDINATOR_SPREAD_SAMPLE": "1"}, "coordinator.spread_sample", "= 1", ">= 2"),
    ({"NOLOCO_MODEL_COMPILE": "yes"}, "model.compile", "'yes'", "auto, on, off"),
    ({"NOLOCO_MODEL_CUDA_GRAPHS": "yes"}, "model.cuda_graphs", "'yes'", "off, on"),
    ({"NOLOCO_MODEL_CUDA_GRAPHS": "on", "NOLOCO_MODEL_COMPILE": "off"}, "model.cuda_graphs", "'on'",
     "needs model.compile auto or on"),
    ({"NOLOCO_WORKER_SITE": "eu west"}, "worker.site", "'eu west'", "at most 63 letters"),
    ({"NOLOCO_WORKER_PEER_BACKOFF_MAX_S": "0.5"}, "worker.peer_backoff_max_s", "0.5", ">= 1 second"),
    ({"NOLOCO_ROUTING_FAR_SHARE": "1.5"}, "routing.far_share", "1.5", "[0, 1]"),
    ({"NOLOCO_ROUTING_SIMULATION": "local", "NOLOCO_ROUTING_SITES": "3"}, "routing.sites", "3",
     "must divide pipeline.replicas = 2"),
])
def test_bad_values_name_field_value_and_allowed(environ, field, shown, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(environ=environ)
    message = str(info.value)
    assert info.value.field_name == field
    assert message.startswith(f"invalid {field} = ")
    assert shown in message
    assert fragment in message


def test_foreign_noloco_variables_are_listed_not_read():
    from noloco_rt.config.loading import env_overrides, foreign_env_vars

    environ = {"NOLOCO_CKPT_KILLS": "3", "NOLOCO_RUN_STEPS": "9", "NOLOCO_PARENT_PID": "1", "HOME": "/root"}
    assert env_overrides(environ) == {"run": {"steps": "9"}}
    assert foreign_env_vars(environ) == ["NOLOCO_CKPT_KILLS"]
    assert load_config(environ=environ).run.steps == 9


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("[outer\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken, environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[trainer]\nx = 1\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(unknown, environ={})


def test_bad_assignment():
    with pytest.raises(ConfigError, match="SECTION.FIELD=VALUE"):
        parse_assignment("alpha=0.3")


def test_toml_round_trip(tmp_path):
    cfg = load_config(environ={"NOLOCO_OUTER_METHOD": "diloco", "NOLOCO_DATA_PATHS": "x.txt",
                               "NOLOCO_RUN_RUN_ID": "exp-1", "NOLOCO_OUTER_ALPHA": "0.25"})
    text = config_to_toml(cfg)
    assert "# h = 100  (method default)" in text
    path = tmp_path / "back.toml"
    path.write_text(text)
    assert load_config(path, environ={}) == cfg


def test_toml_round_trip_with_unset_and_set_optional_fields(tmp_path):
    for environ in ({}, {"NOLOCO_OPTIM_WARMUP_FRACTION": "0.04"}):
        cfg = load_config(environ=environ)
        text = config_to_toml(cfg)
        assert ("# warmup_fraction unset" in text) == (cfg.optim.warmup_fraction is None)
        path = tmp_path / "back.toml"
        path.write_text(text)
        assert load_config(path, environ={}) == cfg


def test_routing_defaults():
    cfg = load_config(environ={})
    assert cfg.routing.simulation == "balanced"  # the simulator: every replica its share
    assert cfg.routing.policy == "balanced"  # workers deal each step evenly too (DESIGN §4 "Drift")


PAPER = REPO / "configs" / "paper.toml"


def test_paper_recipe():
    cfg = load_config(PAPER, environ={})
    optim = cfg.optim
    assert (optim.lr, optim.lr_min, optim.weight_decay) == (6e-4, 6e-5, 0.0)
    assert (optim.adam_beta1, optim.adam_beta2, optim.grad_clip) == (0.9, 0.999, 1.0)
    assert optim.warmup_fraction == 0.04  # 1,000 of 25,000 steps
    assert [optim.warmup_steps_for(n) for n in (1000, 2000, 25000)] == [40, 80, 1000]
    assert cfg.routing.simulation == "balanced-sequence"
    # outer coefficients are left to each method's paper default
    assert (cfg.outer.alpha, cfg.outer.beta, cfg.outer.gamma, cfg.outer.h) == (None, None, None, None)
    noloco = load_config(PAPER, environ={"NOLOCO_OUTER_METHOD": "noloco"}).outer.resolved()
    assert (noloco.h, noloco.alpha, noloco.beta, noloco.gamma) == (50, 0.5, 0.7, 0.7)
    diloco = load_config(PAPER, environ={"NOLOCO_OUTER_METHOD": "diloco"}).outer.resolved()
    assert (diloco.h, diloco.alpha, diloco.beta, diloco.gamma) == (100, 0.3, 0.7, 0.0)

"""Evaluation and sampling of a consensus file, and the `eval` / `sample` commands as a user runs them."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from noloco_rt.cli import main
from noloco_rt.config import load_config
from noloco_rt.consensus.file import load_consensus, save_consensus, stage_parameter_shapes
from noloco_rt.data import ShardedBatches, load_corpus
from noloco_rt.evaluation import generate, load_validation_batches, validation_loss
from noloco_rt.model.llama import build_model, lm_loss
from tests.support.command_env import command_env

TRAIN_STEPS = 60


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # On 2 busy cores, two spinning OpenMP threads make a tiny model ~10x slower than one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(load_config(environ={}).data)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A tiny whole model trained for a few dozen Adam steps, saved as a 2-stage consensus."""
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "evaltest", "seed": 3, "eval_batches": 2},
                                              "pipeline": {"stages": 2}, "data": {"batch_size": 8}}])
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=256, seed=cfg.run.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = ShardedBatches(corpus.train, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size, shard=0,
                             num_shards=1, seed=cfg.run.seed)
    for _ in range(TRAIN_STEPS):
        inputs, targets = batches.next_batch()
        optimizer.zero_grad()
        lm_loss(model(inputs), targets).backward()
        optimizer.step()
    state = {name: p.detach() for name, p in model.named_parameters()}
    stages = [[state[name] for name, _ in stage_parameter_shapes(cfg, s)] for s in range(2)]
    path = tmp_path_factory.mktemp("consensus") / "consensus.safetensors"
    save_consensus(path, cfg, stages, metadata={"step": str(TRAIN_STEPS)})
    return path, cfg


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI entry point in-process: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


# -- library ------------------------------------------------------------------------------


def test_validation_loss_of_untrained_model_is_near_uniform_and_restores_training_mode(trained, corpus):
    _, cfg = trained
    model = build_model("tiny", vocab_size=256, seed=cfg.run.seed)
    model.train()
    batches = load_validation_batches(cfg, batches=2, corpus=corpus)
    loss = validation_loss(model, cfg, val_batches=batches)
    assert abs(loss - math.log(256)) < 0.1  # N(0, 0.02) init: logits near zero
    assert model.training
    assert validation_loss(model, cfg, batches=2, corpus=corpus) == loss  # same fixed batches either way


def test_trained_consensus_beats_the_untrained_model(trained, corpus):
    path, cfg = trained
    _, model, _ = load_consensus(path)
    untrained = build_model("tiny", vocab_size=256, seed=cfg.run.seed)
    batches = load_validation_batches(cfg, corpus=corpus)
    assert validation_loss(model, cfg, val_batches=batches) < validation_loss(untrained, cfg, val_batches=batches) - 0.5


def test_generate_is_deterministic_and_top_k_1_is_greedy(trained):
    _, model, _ = load_consensus(trained[0])
    kwargs = {"max_new_tokens": 30, "seed": 1, "context_len": 64}
    greedy = generate(model, "def ", temperature=0.0, top_k=None, **kwargs)
    assert len(greedy.encode("utf-8", errors="replace")) >= 10
    assert generate(model, "def ", temperature=1.0, top_k=1, **kwargs) == greedy
    sampled = generate(model, "def ", temperature=1.0, top_k=40, **kwargs)
    assert generate(model, "def ", temperature=1.0, top_k=40, **kwargs) == sampled
    assert generate(model, "def ", temperature=1.0, top_k=40, **{**kwargs, "seed": 2}) != sampled


def test_generate_sees_only_the_last_context_len_tokens():
    model = build_model("tiny", vocab_size=256, seed=11)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(20)  # large weights: every token in the window moves the logits
    kwargs = {"max_new_tokens": 20, "temperature": 0.0, "top_k": None, "seed": 0}
    prefix, tail = "0123456789" * 5, "abcdefgh"
    assert generate(model, prefix + tail, context_len=64, **kwargs) != generate(model, tail, context_len=64, **kwargs)
    assert generate(model, prefix + tail, context_len=8, **kwargs) == generate(model, tail, context_len=8, **kwargs)


def test_generate_from_an_empty_prompt_and_rejects_bad_arguments(trained):
    _, model, _ = load_consensus(trained[0])
    assert len(generate(model, "", max_new_tokens=5, temperature=0.0, top_k=None, seed=0, context_len=64)) >= 1
    base = {"max_new_tokens": 5, "temperature": 0.5, "top_k": 5, "seed": 0, "context_len": 64}
    for bad, fragment in [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1.0}, "temperature"),
                          ({"temperature": float("nan")}, "temperature"), ({"top_k": 0}, "top_k"),
                          ({"context_len": 0}, "context_len")]:
        with pytest.raises(ValueError, match=fragment):
            generate(model, "a", **{**base, **bad})


# -- commands -----------------------------------------------------------------------------


def test_eval_json_as_a_subprocess_reports_training_helped(trained):
    path, _ = trained
    env = command_env()
    result = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "eval", str(path), "--batches", "2", "--json"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"val_loss", "val_ppl", "untrained_val_loss", "untrained_val_ppl", "checkpoint"}
    assert report["val_loss"] < report["untrained_val_loss"] - 0.5
    assert abs(report["untrained_val_loss"] - math.log(256)) < 0.1
    assert report["val_ppl"] == pytest.approx(math.exp(report["val_loss"]))
    assert report["checkpoint"] == str(path)


def test_eval_table_names_the_step_and_both_models(trained, capsys):
    path, _ = trained
    code, out, err = run_main(capsys, "eval", str(path), "--batches", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert f"step {TRAIN_STEPS}" in lines[0] and "run evaltest" in lines[0]
    trained_row = next(line for line in lines if line.startswith("checkpoint"))
    untrained_row = next(line for line in lines if line.startswith("untrained"))
    assert float(trained_row.split()[1]) < float(untrained_row.split()[1])


def test_sample_prints_the_prompt_then_new_text_and_greedy_repeats(trained, capsys):
    path, _ = trained
    args = ("sample", str(path), "--prompt", "class ", "--tokens", "40", "--temperature", "0")
    code, first, err = run_main(capsys, *args)
    assert code == 0, err
    assert first.startswith("class ") and len(first.rstrip("\n")) > len("class ")
    assert run_main(capsys, *args, "--seed", "7")[1] == first  # greedy ignores the seed


def test_sample_with_temperature_is_reproducible_per_seed(trained, capsys):
    path, _ = trained
    args = ("sample", str(path), "--prompt", "import ", "--tokens", "30", "--temperature", "0.9", "--top-k", "20")
    first = run_main(capsys, *args, "--seed", "3")
    assert first[0] == 0, first[2]
    assert run_main(capsys, *args, "--seed", "3") == first


@pytest.mark.parametrize(("args", "fragment"), [
    (["--prompt", "a", "--tokens", "0"], "--tokens"),
    (["--prompt", "a", "--temperature", "-0.5"], "--temperature"),
    (["--prompt", "a", "--temperature", "nan"], "not a finite number"),
    (["--prompt", "a", "--top-k", "0"], "--top-k"),
    (["--prompt", "a", "--device", "nonsense"], "'nonsense' is not a torch device"),
    (["--prompt", "\udcff"], "not valid UTF-8"),  # what `--prompt $'\xff'` becomes in Python's argv
    (["--prompt", "a", "--seed", "99999999999999999999"], "--seed"),
    (["--prompt", "a", "--seed", "-1"], "--seed"),
    ([], "Missing option '--prompt'"),
])
def test_sample_rejects_bad_arguments(trained, capsys, args, fragment):
    code, out, err = run_main(capsys, "sample", str(trained[0]), *args)
    assert code == 2
    assert fragment in err and out == ""


@pytest.mark.parametrize("batches", ["99999999999999999999", "100000"])
def test_eval_refuses_more_batches_than_the_validation_split_holds(trained, capsys, batches):
    code, out, err = run_main(capsys, "eval", str(trained[0]), "--batches", batches)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--batches" in err and "distinct batches" in err


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_a_nan_weight_is_one_line_and_exit_2(tmp_path, capsys, trained, command):
    cfg, model, _ = load_consensus(trained[0])
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    poisoned = tmp_path / "nan.safetensors"
    save_consensus(poisoned, cfg, [_split(cfg, model, k) for k in range(cfg.pipeline.stages)])
    code, out, err = run_main(capsys, command, str(poisoned), *(["--prompt", "x"] if command == "sample" else []))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "holds NaN or infinite values" in err


def _split(cfg, model, stage):
    named = dict(model.named_parameters())
    return [named[name].detach() for name, _ in stage_parameter_shapes(cfg, stage)]


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_unusable_checkpoint_is_one_line_and_exit_2(tmp_path, capsys, command):
    missing = tmp_path / "absent.safetensors"
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x01\x02 definitely not safetensors" * 4)
    extra = ["--prompt", "x"] if command == "sample" else []
    for path, fragment in [(missing, "no such file"), (garbage, "not a readable safetensors file")]:
        code, out, err = run_main(capsys, command, str(path), *extra)
        assert code == 2
        assert err.count("\n") == 1 and err.startswith("Error: ") and str(path) in err and fragment in err
        assert out == ""

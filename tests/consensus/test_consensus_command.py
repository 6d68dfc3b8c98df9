"""`noloco-rt consensus`: the model of a run on several machines, from its workers' checkpoints
gathered in one place (files and folders) or from its durable store; the same file `up` makes."""

from __future__ import annotations

import json

import torch

from noloco_rt.checkpoints.worker import save_checkpoint
from noloco_rt.consensus.file import load_consensus, mean_over_replicas, stage_parameter_shapes
from noloco_rt.store.backend import RunStore
from noloco_rt.store.stage_checkpoints import StageCheckpoints
from tests.support.in_process import run_cli_in_process
from tests.support.weights import random_stages, worker_state

RUN = ["--set", "run.run_id=exp", "--set", "run.seed=5", "--set", "pipeline.stages=2", "--set", "run.steps=10"]


def _config():
    from noloco_rt.config import load_config

    return load_config(environ={}, overrides=[{"run": {"run_id": "exp", "seed": 5, "steps": 10},
                                               "pipeline": {"stages": 2}}])


def _weights(path):
    _, model, metadata = load_consensus(path)
    return {name: param.detach() for name, param in model.named_parameters()}, metadata


def test_checkpoints_gathered_from_two_machines_make_the_consensus_of_all_of_them(tmp_path, capsys, monkeypatch):
    cfg = _config()
    replicas = [random_stages(cfg, seed=30 + r) for r in range(2)]
    machines = [tmp_path / "machine-a", tmp_path / "machine-b"]
    for machine in machines:
        machine.mkdir()
    # Machine a ran stage 0's replicas, machine b stage 1's; one file of b is passed by name.
    for r in range(2):
        save_checkpoint(machines[0] / f"s0-r{r}.pt", worker_state(cfg, 0, replicas[r][0]))
        save_checkpoint(machines[1] / f"s1-r{r}.pt", worker_state(cfg, 1, replicas[r][1]))
    save_checkpoint(machines[1] / "other.pt", worker_state(cfg, 1, replicas[0][1], run_id="another-run"))
    out = tmp_path / "final.safetensors"
    code, stdout, stderr = run_cli_in_process(capsys, monkeypatch, "consensus", str(machines[0]),
                                              str(machines[1] / "s1-r0.pt"), str(machines[1]), *RUN,
                                              "--out", str(out), "--json")
    assert code in (0, None), stderr
    result = json.loads(stdout)
    assert result["replicas_per_stage"] == [2, 2] and result["skipped"] == 1  # s1-r0.pt counted once
    assert "other.pt: belongs to run 'another-run'" in stderr
    weights, metadata = _weights(out)
    assert metadata["source"] == "worker checkpoints" and metadata["step"] == "10"
    for stage in range(2):
        expected = mean_over_replicas([replicas[0][stage], replicas[1][stage]])
        names = [name for name, _ in stage_parameter_shapes(cfg, stage)]
        assert all(torch.equal(weights[n], t) for n, t in zip(names, expected, strict=True))
    # eval scores the file as the command did.
    code, stdout, _ = run_cli_in_process(capsys, monkeypatch, "eval", str(out), "--json")
    assert json.loads(stdout)["val_loss"] == result["val_loss"]


def test_the_consensus_of_the_store_holds_each_stage_s_newest_checkpoint(tmp_path, capsys, monkeypatch):
    cfg = _config()
    store = tmp_path / "store"
    checkpoints = StageCheckpoints(RunStore(str(store)), "exp")
    old, new = random_stages(cfg, seed=1), random_stages(cfg, seed=2)
    for stage in range(2):
        for outer_step, weights in ((1, old), (2, new)):
            state = worker_state(cfg, stage, weights[stage])
            checkpoints.save(stage, {k: v for k, v in state.items() if k not in ("run_id", "stage")},
                             outer_step=outer_step, inner_step=5 * outer_step, writer="w0")
    out = tmp_path / "c.safetensors"
    code, stdout, stderr = run_cli_in_process(capsys, monkeypatch, "consensus", "--from-store", *RUN,
                                              "--set", f"store.url={store}", "--out", str(out))
    assert code in (0, None), stderr
    assert f"{out}: run exp, step 10 of 10, replicas per stage [1, 1]" in stdout
    weights, metadata = _weights(out)
    assert metadata["source"] == "durable store"
    for stage in range(2):
        names = [name for name, _ in stage_parameter_shapes(cfg, stage)]
        assert all(torch.equal(weights[n], t) for n, t in zip(names, new[stage], strict=True))


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    cfg = _config()
    save_checkpoint(tmp_path / "s0.pt", worker_state(cfg, 0, random_stages(cfg, seed=3)[0]))
    cases = [
        ([], "give the checkpoints (files or folders) or --from-store"),
        (["--from-store"], "--from-store needs the run's store.url"),
        ([str(tmp_path / "absent")], "absent: no such file or folder"),
        ([str(tmp_path)], "no usable checkpoint of run 'exp' for stage(s) 1"),
    ]
    for args, fragment in cases:
        code, _, stderr = run_cli_in_process(capsys, monkeypatch, "consensus", *args, *RUN,
                                             "--out", str(tmp_path / "c.safetensors"))
        assert code == 2 and fragment in stderr and "Traceback" not in stderr, (args, stderr)
    assert not (tmp_path / "c.safetensors").exists()
    # eval, given a worker's checkpoint, names the command that makes a model of it.
    code, _, stderr = run_cli_in_process(capsys, monkeypatch, "eval", str(tmp_path / "s0.pt"))
    assert code == 2 and "noloco-rt consensus CHECKPOINT_OR_FOLDER... --config RUN.toml" in stderr, stderr

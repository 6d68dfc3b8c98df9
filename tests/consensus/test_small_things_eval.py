"""A file that is not a consensus given to eval, sample or export: what it is and what to pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from noloco_rt.checkpoints.worker import save_checkpoint
from noloco_rt.cli import main
from noloco_rt.consensus.file import stage_parameter_shapes
from tests.support.weights import one_torch_thread, random_consensus  # noqa: F401 (an autouse fixture)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory as `up` leaves it: a worker checkpoint (as workers/worker.py writes one)
    in checkpoints/ and consensus.safetensors beside it."""
    cfg, state = random_consensus(tmp_path / "consensus.safetensors")
    slow = [state[name] for name, _ in stage_parameter_shapes(cfg, 0)]
    save_checkpoint(tmp_path / "checkpoints" / "s0-r0.pt", {
        "run_id": cfg.run.run_id, "stage": 0, "name": "s0-r0", "slow": slow, "fast": slow,
        "momentum": slow, "inner_optimizer": {"state": {}}, "counters": {"inner_steps": 4, "outer_steps": 1},
        "cursor": {"epoch": 0, "position": 0}})
    return tmp_path


@pytest.mark.parametrize("command", ["eval", "sample", "export"])
def test_a_worker_checkpoint_is_named_and_the_runs_consensus_offered(run_dir, tmp_path, capsys, command):
    worker = run_dir / "checkpoints" / "s0-r0.pt"
    extra = {"eval": [], "sample": ["--prompt", "ab", "--tokens", "2"], "export": [tmp_path / "hf"]}[command]
    code, stdout, err = run_main(capsys, command, worker, *extra)
    assert code == 2, stdout
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert f"{worker} is a torch checkpoint (a worker's .pt" in err
    assert f"pass {run_dir / 'consensus.safetensors'} instead" in err
    assert "header" not in err.lower()


def test_without_a_consensus_beside_it_says_where_a_run_writes_one(run_dir, capsys):
    (run_dir / "consensus.safetensors").unlink()
    worker = run_dir / "checkpoints" / "s0-r0.pt"
    code, _, err = run_main(capsys, "eval", worker)
    assert code == 2
    assert "is a torch checkpoint" in err and "OUT/consensus.safetensors" in err


def test_a_text_file_is_not_a_safetensors_file(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text("[run]\nsteps = 10\n")
    code, _, err = run_main(capsys, "eval", config)
    assert code == 2
    assert f"{config}: not a readable safetensors file (it does not start with a safetensors header)" in err

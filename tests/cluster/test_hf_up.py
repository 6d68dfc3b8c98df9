"""`up --model hf:PATH` with real workers, then `eval`, `sample` and `export` to a folder
transformers loads."""

from __future__ import annotations

import json
import math
import uuid

import pytest
import torch
from click.testing import CliRunner

from noloco_rt.cli import cli
from noloco_rt.config import load_config
from noloco_rt.consensus.file import load_consensus, save_consensus
from noloco_rt.model.staged import staged_model
from tests.support.hf_folders import write_folder
from tests.support.up_runs import finish, marked_processes, start_up

pytestmark = pytest.mark.slow  # real processes: left out of the fast loop (pytest -m "not slow")

pytest.importorskip("transformers", reason="transformers is a dev dependency: pip install -e '.[dev]'")


def _matched(outer_steps: str, stage: int) -> int:
    return int(outer_steps.split(f"stage {stage}: ")[1].split(" of ")[0])


@pytest.mark.timeout(300)
def test_up_trains_a_transformers_folder_and_export_writes_it_back(tmp_path):
    """2 stages x 2 replicas of a small random model of a rotary family: every worker
    finishes, both stages take matched outer steps, the consensus
    (built by `up` from the final states: no coordinator, to keep the suite short) beats the
    folder's own weights on the run's validation data, and the exported folder loads with
    AutoModelForCausalLM and gives the consensus's logits. The other families' round trip
    is checked in process below.

    Steps enough for ~10 s of training: the four workers start up to a few seconds apart on
    2 busy cores (each imports torch and transformers), and a run of 30 steps (~2 s) could
    end before a stage's second worker was in, leaving nobody to match with."""
    family = "llama"
    folder, out, mark = tmp_path / family, tmp_path / "run", uuid.uuid4().hex
    write_folder(folder, family)
    factory = f"hf:{folder}"
    process = start_up(out, steps=150, mark=mark, flags=("--no-coordinator", "--no-tensorboard"),
                       **{"model.factory": factory, "pipeline.stages": 2, "pipeline.replicas": 2,
                          "optim.warmup_steps": 5})
    code, output = finish(process, 240)
    assert code == 0, output[-4000:]
    assert marked_processes(mark) == []
    done = next(json.loads(line) for line in output.splitlines() if '"up_done"' in line)
    assert _matched(done["outer_steps"], 0) >= 1 and _matched(done["outer_steps"], 1) >= 1, done["outer_steps"]
    print(f"{family} up:", done["outer_steps"])
    assert f"noloco-rt sample {out / 'consensus.safetensors'} --model {factory} --prompt" in done["next"], done["next"]
    _check_trained_and_exported(tmp_path, out / "consensus.safetensors", factory, family)


def _check_trained_and_exported(tmp_path, consensus_file, factory: str, family: str) -> None:
    runner = CliRunner()
    scored = runner.invoke(cli, ["eval", str(consensus_file), "--model", factory, "--json"])
    assert scored.exit_code == 0, scored.output
    losses = json.loads(scored.output.strip().splitlines()[-1])
    print(f"{family}:", losses)
    assert losses["val_loss"] < min(0.8 * math.log(256), losses["untrained_val_loss"]), losses
    _check_export(tmp_path, consensus_file, factory, family)


def _check_export(tmp_path, consensus_file, factory: str, family: str) -> None:
    from transformers import AutoModelForCausalLM

    runner = CliRunner()
    for command in (["export", str(consensus_file), str(tmp_path / "x")], ["sample", str(consensus_file), "--prompt", "x"]):
        unnamed = runner.invoke(cli, command)
        assert unnamed.exit_code == 2 and "name its folder: --model hf:PATH" in unnamed.output, unnamed.output
    sampled = runner.invoke(cli, ["sample", str(consensus_file), "--prompt", "def ", "--tokens", "20", "--model", factory])
    assert sampled.exit_code == 0 and sampled.output.startswith("def ") and len(sampled.output) > 8, sampled.output
    exported = runner.invoke(cli, ["export", str(consensus_file), str(tmp_path / "hf"), "--model", factory])
    assert exported.exit_code == 0, exported.output
    assert "Hugging Face model" in exported.output
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert loaded.config.model_type == family
    assert "_name_or_path" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    _, consensus, _ = load_consensus(consensus_file, factory=factory)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, consensus.eval()(ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "mistral"])
def test_a_consensus_of_each_family_exports_to_a_folder_with_the_same_logits(tmp_path, family):
    """GPT-2 (learned positions), Qwen2 (attention biases) and
    Mistral (a sliding window shorter than the sequence): a consensus of the folder's stages,
    moved off its weights, exports to a folder that transformers loads and that computes the
    consensus's logits; eval and sample read it. (Each family's stages against the whole
    model, and their training: tests/model/test_hf_stages.py.)"""
    folder = tmp_path / family
    write_folder(folder, family)
    factory = f"hf:{folder}"
    cfg = load_config(environ={}, overrides=[{"model": {"factory": factory}, "pipeline": {"stages": 2},
                                              "run": {"eval_batches": 2}}])
    stages = staged_model(cfg)
    generator = torch.Generator().manual_seed(3)
    tensors = [[(p.detach() + 0.02 * torch.randn(p.shape, generator=generator)) for p in stages.build_stage(k).parameters()]
               for k in range(2)]
    save_consensus(tmp_path / "consensus.safetensors", cfg, tensors)
    runner = CliRunner()
    scored = runner.invoke(cli, ["eval", str(tmp_path / "consensus.safetensors"), "--model", factory, "--json"])
    assert scored.exit_code == 0 and math.isfinite(json.loads(scored.output.strip().splitlines()[-1])["val_loss"])
    _check_export(tmp_path, tmp_path / "consensus.safetensors", factory, family)

"""--init-from: every stage starts from a consensus file's or a Hugging Face folder's weights;
what does not fit the run's model is one line naming the tensor (or field), exit 2."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from noloco_rt.cli import main
from noloco_rt.config import load_config
from noloco_rt.consensus.file import load_consensus
from noloco_rt.data import load_corpus
from noloco_rt.evaluation import load_validation_batches, validation_loss
from noloco_rt.model.init_weights import initial_replica, load_stage_weights
from noloco_rt.model.llama import build_stage
from noloco_rt.simulation.simulator import Simulation
from tests.support.weights import one_torch_thread, random_consensus  # noqa: F401 (an autouse fixture)

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is a dev extra, not installed")


@pytest.fixture(scope="module")
def consensus(tmp_path_factory):
    path = tmp_path_factory.mktemp("consensus") / "consensus.safetensors"
    _, state = random_consensus(path, seed=11)
    return path, state


@pytest.fixture(scope="module")
def hf_folder(consensus, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "model"
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(consensus[0]), "--format", "hf", str(out)])
    assert exit_info.value.code == 0
    return out


def run_main(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _stages_from(path, stages: int = 2) -> dict[str, torch.Tensor]:
    """Every stage built from the seed, then loaded from `path`: the whole model by name."""
    loaded = {}
    for stage in range(stages):
        module = build_stage("tiny", vocab_size=256, stage=stage, num_stages=stages, seed=0)
        load_stage_weights(module, path)
        loaded.update({name: p.detach() for name, p in module.named_parameters()})
    return loaded


def _assert_same(loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name


# -- the simulator starts at the file's weights --------------------------------------------


def test_every_replica_starts_at_the_consensus_weights(consensus):
    path, state = consensus
    cfg = load_config(environ={}, overrides=[{"model": {"init_from": str(path)}, "run": {"seed": 3},
                                              "pipeline": {"stages": 2, "replicas": 2}}])
    simulation = Simulation(cfg, corpus=load_corpus(cfg.data))
    for stage in simulation.replicas:
        for replica in stage:
            names = [name for name, _ in replica.module.named_parameters()]
            for name, fast, slow in zip(names, replica.fast, replica.slow, strict=True):
                assert torch.equal(fast, state[name]) and torch.equal(slow, state[name]), name


def test_simulate_command_evaluates_the_consensus_at_step_0(consensus, tmp_path, capsys):
    path, _ = consensus
    code, _, err = run_main(capsys, "simulate", "--init-from", path, "--steps", "1", "--eval-every", "1",
                            "--out", tmp_path, "--set", "run.eval_batches=2", "--set", "run.log_format=json")
    assert code == 0, err
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    cfg, model, _ = load_consensus(path)
    batches = load_validation_batches(cfg, batches=2)
    assert first["step"] == 0
    assert first["val_loss"] == pytest.approx(validation_loss(model, cfg, val_batches=batches), abs=1e-5)
    seeded = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=0)
    assert abs(first["val_loss"] - validation_loss(seeded, cfg, val_batches=batches)) > 0.01
    assert load_config(tmp_path / "config.toml", environ={}).model.init_from == str(path.resolve())


# -- Hugging Face folders ----------------------------------------------------------------------


def test_hf_round_trip_is_exact(consensus, hf_folder):
    _assert_same(_stages_from(hf_folder), consensus[1])


@needs_transformers
def test_a_sharded_hf_folder_saved_by_transformers(consensus, hf_folder, tmp_path):
    from transformers import LlamaForCausalLM

    sharded = tmp_path / "sharded"
    LlamaForCausalLM.from_pretrained(hf_folder).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    _assert_same(_stages_from(sharded, stages=4), consensus[1])


def test_tied_embeddings_give_the_head_the_embedding(hf_folder, tmp_path):
    folder = tmp_path / "tied"
    folder.mkdir()
    tensors = load_file(hf_folder / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((hf_folder / "config.json").read_text()) | {"tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = _stages_from(folder)
    assert torch.equal(loaded["head.weight"], tensors["model.embed_tokens.weight"])


# -- refusals --------------------------------------------------------------------------------


def _worker_args(path):
    return ["worker", "--stage", "0", "--redis-url", "redis://127.0.0.1:1", "--init-from", path]


@pytest.mark.parametrize("command", ["simulate", "up", "worker"])
def test_a_consensus_of_another_preset_is_one_line_naming_the_tensor(command, consensus, tmp_path, capsys):
    args = _worker_args(consensus[0]) if command == "worker" else [command, "--init-from", consensus[0]]
    code, _, err = run_main(capsys, *args, "--set", "model.preset=small", "--set", f"paths.out_dir={tmp_path}")
    assert code == 2
    assert err.splitlines() == [f"Error: init-from {consensus[0]}: tensor embed.weight has shape (256, 64), "
                                "the run's model needs (256, 256): the weights are of another shape; choose the "
                                "preset they were trained with (--preset)"]
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_weights_of_another_vocabulary_name_the_data_settings_that_match_them(consensus, tmp_path, capsys):
    # README's --init-from of a run on prepared data, given without the data: the message says
    # what makes the run's vocabulary the weights' (it once pointed at model.vocab_size alone).
    code, _, err = run_main(capsys, "simulate", "--init-from", consensus[0], "--set", "model.vocab_size=300",
                            "--set", f"paths.out_dir={tmp_path}")
    assert code == 2 and err.count("\n") == 1, err
    assert "tensor embed.weight has shape (256, 64), the run's model needs (300, 64): the weights have a " \
           "vocabulary of 256 tokens, the run 300" in err and "--set data.paths=DIR" in err, err


@pytest.mark.parametrize("command", ["simulate", "up", "worker"])
def test_a_damaged_consensus_is_refused_before_anything_starts(command, consensus, tmp_path, capsys):
    """A flipped byte in the tensor data keeps every shape: only the file's checksum sees it."""
    damaged = tmp_path / "damaged.safetensors"
    data = bytearray(consensus[0].read_bytes())
    data[len(data) - len(data) // 3] ^= 0x10  # in the tensor data, far from the header
    damaged.write_bytes(bytes(data))
    out = tmp_path / "out"
    args = _worker_args(damaged) if command == "worker" else [command, "--init-from", damaged]
    code, _, err = run_main(capsys, *args, "--set", f"paths.out_dir={out}")
    assert code == 2
    assert err.splitlines() == [f"Error: init-from {damaged}: checksum mismatch: the file is damaged"]
    assert not out.exists()  # nothing was started


def _edited_copy(hf_folder, folder, *, config=None, drop=None):
    folder.mkdir()
    tensors = load_file(hf_folder / "model.safetensors")
    if drop == "add a bias":
        tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    tensors.pop(drop, None)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(json.loads((hf_folder / "config.json").read_text()) | (config or {})))
    return folder


@pytest.mark.parametrize(("config", "drop", "expected"), [
    ({}, "model.layers.3.mlp.down_proj.weight", "no tensor model.layers.3.mlp.down_proj.weight (for layers.3.ffn.w2.weight)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, None, "rope_theta = 500000.0"),
    ({"num_attention_heads": 8, "num_key_value_heads": 8}, None, "num_attention_heads = 8"),
    ({}, "add a bias", "tensor model.layers.0.self_attn.q_proj.bias has no place in the run's model"),
])
def test_an_hf_folder_that_does_not_fit_is_one_line(hf_folder, tmp_path, capsys, config, drop, expected):
    folder = _edited_copy(hf_folder, tmp_path / "edited", config=config, drop=drop)
    code, _, err = run_main(capsys, "simulate", "--init-from", folder, "--out", tmp_path / "run")
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"Error: init-from {folder}") and expected in err


def test_a_missing_path_is_one_line(tmp_path, capsys):
    code, _, err = run_main(capsys, "simulate", "--init-from", tmp_path / "nothing", "--out", tmp_path / "run")
    assert code == 2 and err.splitlines() == [f"Error: init-from {tmp_path / 'nothing'}: no such file or folder"]


def test_a_workers_own_checkpoint_wins_over_init_from(consensus, tmp_path):
    """The order StageWorker composes: the replica is built (from --init-from), then its own
    checkpoint, when there is one, is loaded over it."""
    from noloco_rt.algo.replica import StageReplica
    from workers.counters import Counters
    from workers.lifecycle import WorkerCheckpoint

    class Quiet:
        def info(self, *args, **kwargs) -> None:
            pass

    path, state = consensus
    plain = load_config(environ={}, overrides=[{"run": {"seed": 11}}])
    from_file = load_config(environ={}, overrides=[{"run": {"seed": 11}, "model": {"init_from": str(path)}}])

    def checkpoint_of(replica: StageReplica, counters: Counters) -> WorkerCheckpoint:
        return WorkerCheckpoint(tmp_path / "w.pt", run_id="default", stage=1, name="w", replica=replica,
                                counters=counters, cursor_state=lambda: None, h=5, log=Quiet())

    earlier = StageReplica.create(plain, 1)
    with torch.no_grad():
        for tensor in earlier.slow + earlier.fast:
            tensor.add_(0.125)
    checkpoint_of(earlier, Counters(inner_steps=40, outer_steps=8)).save("periodic")

    restarted = initial_replica(from_file, 1)
    names = [name for name, _ in restarted.module.named_parameters()]
    assert torch.equal(restarted.slow[names.index("norm.weight")], state["norm.weight"])  # the file's weights
    counters = Counters()
    resumed, _ = checkpoint_of(restarted, counters).resume()
    assert resumed and counters.inner_steps == 40
    for mine, theirs in zip(restarted.slow, earlier.slow, strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.slow
def test_a_worker_says_which_weights_it_started_from(consensus, tmp_path):
    from workers.cluster.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.method": "local"})
    try:
        worker = cluster.start_worker(0, "solo", steps=2, **{"model.init_from": str(consensus[0])})
        assert cluster.wait_exit(worker, timeout_s=120) == 0, worker.log_text()[-2000:]
        [loaded] = worker.events("init_from_loaded")
        assert loaded["path"] == str(consensus[0]) and loaded["stage"] == 0 and loaded["tensors"] > 0
    finally:
        cluster.close()

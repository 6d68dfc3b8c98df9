"""`--model hf:PATH`: transformers folders staged from their own modules (in process)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from noloco_rt.config import load_config
from noloco_rt.hf_model.split import split_layers
from noloco_rt.model.staged import StagedModelError, staged_model
from tests.support.hf_folders import VOCAB, write_folder

pytest.importorskip("transformers", reason="transformers is a dev dependency: pip install -e '.[dev]'")

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")


def _cfg(folder, stages: int = 2, **sections: dict):
    overrides = {"model": {"factory": f"hf:{folder}"}, "pipeline": {"stages": stages}, **sections}
    return load_config(environ={}, overrides=[overrides])


def _chain(stages, ids):
    hidden = ids
    for stage in stages:
        hidden = stage(hidden)
    return hidden


def test_layers_are_split_by_parameter_count_with_the_embedding_and_head_counted():
    assert split_layers([10] * 4, first_extra=0, last_extra=0, stages=2) == [range(0, 2), range(2, 4)]
    # A large embedding on stage 0 moves layers to the later stages, a large head the other way.
    assert split_layers([10] * 4, first_extra=25, last_extra=5, stages=2) == [range(0, 1), range(1, 4)]
    assert split_layers([10] * 6, first_extra=0, last_extra=25, stages=3) == [range(0, 3), range(3, 5), range(5, 6)]
    assert split_layers([1, 1], first_extra=0, last_extra=0, stages=2) == [range(0, 1), range(1, 2)]
    with pytest.raises(ValueError, match="3 layers cannot fill 4 stages"):
        split_layers([1, 1, 1], first_extra=0, last_extra=0, stages=4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_staged_logits_equal_the_causal_lm_on_the_same_weights(tmp_path, family, stages):
    reference = write_folder(tmp_path / family, family)
    model = staged_model(_cfg(tmp_path / family, stages))
    built = [model.build_stage(k).eval() for k in range(stages)]
    assert sum(len(list(stage.parameters())) for stage in built) == len(list(reference.parameters()))
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference(ids).logits, _chain(built, ids)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
    if stages > 1:  # what passes between stages is the hidden state alone, of the declared shape
        hidden = built[0](ids)
        assert tuple(hidden.shape) == (2, 24, 32) and hidden.is_floating_point()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_folder_without_weights_starts_every_replica_of_a_stage_alike_from_the_seed(tmp_path, family):
    write_folder(tmp_path / family, family, weights=False)
    model = staged_model(_cfg(tmp_path / family))
    again = staged_model(_cfg(tmp_path / family))
    for k in range(2):
        first, second = model.build_stage(k).state_dict(), again.build_stage(k).state_dict()
        assert first.keys() == second.keys()
        assert all(torch.equal(first[name], second[name]) for name in first)
    seed_0 = model.build_stage(0).state_dict()
    other_seed = staged_model(_cfg(tmp_path / family, run={"seed": 7})).build_stage(0).state_dict()
    assert any(not torch.equal(other_seed[name], seed_0[name]) for name in other_seed)


def test_the_stages_train_the_loss_down_in_process(tmp_path):
    """Backward reaches every weight of every stage, through the hidden states between them."""
    write_folder(tmp_path / "llama", "llama")
    model = staged_model(_cfg(tmp_path / "llama"))
    stages = [model.build_stage(k) for k in range(2)]
    params = [p for stage in stages for p in stage.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(30):
        loss = model.loss(_chain(stages, ids[:, :-1]), ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None for p in params)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize(("change", "message"), [
    ({"tie": True}, "ties its input embedding to its output head"),
    ({"layers": 1}, "has 1 layers, fewer than pipeline.stages = 2"),
])
def test_what_cannot_be_staged_is_refused_in_one_line(tmp_path, change, message):
    write_folder(tmp_path / "m", "llama", **change)
    with pytest.raises(StagedModelError, match=message) as refused:
        staged_model(_cfg(tmp_path / "m"))
    assert "\n" not in str(refused.value)


def test_an_unsupported_family_a_missing_config_and_pickled_weights_are_refused(tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(StagedModelError, match="model_type 'bert' cannot be staged yet: supported are gpt2, llama"):
        staged_model(_cfg(tmp_path / "bert"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StagedModelError, match="has no config.json"):
        staged_model(_cfg(tmp_path / "empty"))
    write_folder(tmp_path / "cross", "gpt2", weights=False)
    config = json.loads((tmp_path / "cross" / "config.json").read_text())
    (tmp_path / "cross" / "config.json").write_text(json.dumps({**config, "add_cross_attention": True}))
    with pytest.raises(StagedModelError, match="gpt2 with cross-attention cannot be staged"):
        staged_model(_cfg(tmp_path / "cross"))
    write_folder(tmp_path / "pickled", "llama", weights=False)
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(StagedModelError, match="only as pytorch_model.bin .a pickle"):
        staged_model(_cfg(tmp_path / "pickled"))


def test_data_the_model_cannot_read_is_refused(tmp_path):
    write_folder(tmp_path / "m", "llama")
    with pytest.raises(StagedModelError, match="the run's data has 1000 token ids .model.vocab_size. but llama's "
                                               "vocabulary holds 300"):
        staged_model(_cfg(tmp_path / "m", model={"factory": f"hf:{tmp_path / 'm'}", "vocab_size": 1000}))
    with pytest.raises(StagedModelError, match="model.seq_len = 256 is longer than llama's 128 positions"):
        staged_model(_cfg(tmp_path / "m", model={"factory": f"hf:{tmp_path / 'm'}", "seq_len": 256}))


def test_missing_weights_name_the_first_one(tmp_path):
    from safetensors.torch import load_file, save_file

    write_folder(tmp_path / "m", "llama")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    model = staged_model(_cfg(tmp_path / "m"))
    model.build_stage(0)  # stage 0 does not need the head
    with pytest.raises(StagedModelError, match="the folder's weights lack lm_head.weight"):
        model.build_stage(1)


def test_without_transformers_the_refusal_says_what_to_install(tmp_path, monkeypatch):
    write_folder(tmp_path / "m", "llama", weights=False)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(StagedModelError, match=r"needs transformers: pip install 'noloco-rt\[hf\]'"):
        staged_model(_cfg(tmp_path / "m"))

"""`noloco-rt export --format hf`: the folder loads in transformers and computes the same
logits as noloco-rt's own model; what cannot be written is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from noloco_rt.cli import main
from noloco_rt.consensus.file import load_consensus
from noloco_rt.consensus.hf_export import write_hf_folder
from noloco_rt.consensus.hf_format import (
    HFFormatError,
    halves_to_interleaved,
    hf_name,
    interleaved_to_halves,
)
from tests.support.weights import one_torch_thread, random_consensus  # noqa: F401 (an autouse fixture)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is a dev extra, not installed")


@pytest.fixture(scope="module")
def consensus(tmp_path_factory):
    path = tmp_path_factory.mktemp("consensus") / "consensus.safetensors"
    random_consensus(path, seed=7)
    return path


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


# -- the mapping ------------------------------------------------------------------------


def test_rotary_permutation_moves_pair_partners_to_halves_and_back():
    weight = torch.arange(16.0).reshape(8, 2)  # 2 heads of head_dim 4, rows numbered 0..7
    halves = interleaved_to_halves(weight, n_heads=2)
    assert halves[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]  # rows 0,2,1,3 | 4,6,5,7
    assert torch.equal(halves_to_interleaved(halves, n_heads=2), weight)
    with pytest.raises(HFFormatError, match="even size"):
        interleaved_to_halves(torch.zeros(6, 2), n_heads=2)  # head_dim 3 has no pairs


def test_names():
    assert hf_name("layers.3.attn.wk.weight") == "model.layers.3.self_attn.k_proj.weight"
    assert hf_name("layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("head.weight") == "lm_head.weight"
    with pytest.raises(HFFormatError, match="layers.0.attn.wq.bias"):
        hf_name("layers.0.attn.wq.bias")


# -- the command ------------------------------------------------------------------------


@needs_transformers
def test_export_loads_in_transformers_with_the_same_logits(consensus, tmp_path, capsys):
    from transformers import GenerationConfig, LlamaForCausalLM

    out = tmp_path / "hf"
    code, stdout, _ = run_main(capsys, "export", consensus, "--format", "hf", out)
    assert code == 0 and str(out) in stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    hf = LlamaForCausalLM.from_pretrained(out).eval()  # on the CPU: no device_map
    GenerationConfig.from_pretrained(out)  # loadable too
    cfg, ours, _ = load_consensus(consensus)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, logits = ours.eval()(tokens), hf(tokens).logits
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max().item() <= 1e-4
    assert expected.std().item() > 0.1  # random weights: logits that differ by position and token
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 192 and config["tie_word_embeddings"] is False


def test_refusals_are_one_line_and_exit_2(consensus, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    for args, expected in [((consensus, full), "not empty"),
                           ((consensus, full / "notes.txt"), "not a folder"),
                           ((tmp_path / "missing.safetensors", tmp_path / "new"), "no such file"),
                           ((consensus, consensus / "under-a-file"), "cannot be written")]:
        code, _, err = run_main(capsys, "export", *args)
        assert code == 2
        assert len(err.strip().splitlines()) == 1 and err.startswith("Error: ") and expected in err
    assert not (tmp_path / "new").exists()
    code, _, _ = run_main(capsys, "export", consensus, full, "--force")
    assert code == 0 and (full / "model.safetensors").is_file() and (full / "notes.txt").read_text() == "mine"


@needs_transformers
def test_the_tokenizer_named_is_copied(consensus, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer_file = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).save(str(tokenizer_file))
    cfg, model, _ = load_consensus(consensus)
    written = write_hf_folder(tmp_path / "hf", cfg, model, tokenizer=tokenizer_file)
    assert tmp_path / "hf" / "tokenizer.json" in written
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path / "hf")("hello")["input_ids"] == [1]

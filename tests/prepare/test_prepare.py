"""`noloco-rt prepare`: text and JSONL -> token shards, resumable, and training/sampling on them.

Real `tokenizers` (a small byte-level BPE trained on generated text), the real CLI in-process,
and a subprocess that SIGKILLs itself through the command's hidden test hook.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from noloco_rt.cli import main
from noloco_rt.config import ConfigError, load_config
from noloco_rt.data import load_corpus
from noloco_rt.prepare import dtype_for_vocab, read_manifest, run_tokenizer_path
from noloco_rt.prepare.documents import DOC_BYTES, expand_inputs, is_validation
from noloco_rt.prepare.documents import documents as read_documents
from noloco_rt.prepare.tokenizer import TextCodec, load_tokenizer, train_bpe
from tests.support.prepare_inputs import file_tree, paragraph, run_main

VOCAB = 400




@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Three small text files, one over DOC_BYTES (so it is cut into documents) and a JSONL file."""
    root = tmp_path_factory.mktemp("inputs")
    rng = random.Random(7)
    for index, paragraphs in enumerate((40, 60, 1500)):
        text = "\n\n".join(paragraph(rng) for _ in range(paragraphs)) + "\r\n"
        (root / f"doc{index}.txt").write_text(text, encoding="utf-8", newline="")
    assert (root / "doc2.txt").stat().st_size > 2 * DOC_BYTES
    with open(root / "records.jsonl", "w", encoding="utf-8") as handle:
        for index in range(150):
            handle.write(json.dumps({"id": index, "text": paragraph(rng)}) + "\n")
            if index % 50 == 0:
                handle.write("\n")  # blank lines are skipped
    return root




def prepare_args(inputs: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", str(inputs / "*.txt"), str(inputs / "records.jsonl"), "--out", str(out),
            "--train-bpe", str(VOCAB), "--shard-tokens", "4000", "--val-percent", "20", *extra]


@pytest.fixture(scope="module")
def prepared(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(prepare_args(inputs, out))
    assert exit_info.value.code == 0
    return out


def _split_documents(path: Path, dtype: str, eos_id: int, files: list[Path]) -> list[list[int]]:
    stream = np.concatenate([np.fromfile(f, dtype=dtype) for f in files]).astype(np.int64)
    assert stream[-1] == eos_id  # every document ends with the separator
    cuts = np.flatnonzero(stream == eos_id)
    return [stream[a + 1:b].tolist() for a, b in zip(np.r_[-1, cuts[:-1]], cuts, strict=True)]


def test_manifest_dtype_split_and_counts(prepared, inputs):
    manifest = json.loads((prepared / "prepared.json").read_text())
    assert manifest["format"] == "noloco-rt-prepared" and manifest["version"] == 1
    assert manifest["vocab_size"] == VOCAB and manifest["token_dtype"] == "uint16"
    assert load_tokenizer(prepared / manifest["tokenizer"]).get_vocab_size() == VOCAB
    assert manifest["eos_token"] == "<|endoftext|>"
    for split in ("train", "val"):
        shards = manifest["shards"][split]
        assert shards, split
        assert all(s["tokens"] == 4000 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 4000
        assert [(prepared / s["file"]).stat().st_size for s in shards] == [2 * s["tokens"] for s in shards]
        assert manifest["tokens"][split] == sum(s["tokens"] for s in shards)
    sources = {Path(s["path"]).name: s for s in manifest["sources"]}
    assert sources["records.jsonl"]["kind"] == "jsonl" and sources["records.jsonl"]["documents"] == 150
    assert sources["doc2.txt"]["documents"] > 2 and sources["doc0.txt"]["documents"] == 1
    assert sum(s["documents"] for s in sources.values()) == sum(manifest["documents"].values())
    # the keys hold this run's temporary folder, so the split is checked against the hash, not a share
    expected_val = sum(is_validation(source.split_key, doc.index, 20.0)
                       for source in expand_inputs([str(inputs / "*.txt"), str(inputs / "records.jsonl")])
                       for doc in read_documents(source, field="text"))
    assert manifest["documents"]["val"] == expected_val
    assert sorted(p.name for p in prepared.iterdir()) == sorted(
        ["prepared.json", "tokenizer.json"] + [s["file"] for v in manifest["shards"].values() for s in v])


@pytest.mark.parametrize("val_percent", [5.0, 20.0, 50.0])
def test_the_split_takes_the_asked_share_of_documents(val_percent):
    share = sum(is_validation("corpus/records", index, val_percent) for index in range(20_000)) / 20_000
    assert abs(share - val_percent / 100) < 0.01
    assert is_validation("corpus/records", 7, val_percent) == is_validation("corpus/records", 7, val_percent)


def test_decoding_the_shards_gives_back_the_text(prepared, inputs):
    manifest = read_manifest(prepared)
    codec = TextCodec(manifest.tokenizer)
    decoded = {split: [codec.decode(ids) for ids in _split_documents(prepared, manifest.token_dtype,
                                                                       manifest.eos_id, files)]
               for split, files in (("train", manifest.train), ("val", manifest.val))}
    expected: dict[str, list[str]] = {"train": [], "val": []}
    for source in expand_inputs([str(inputs / "*.txt"), str(inputs / "records.jsonl")]):
        docs = list(read_documents(source, field="text"))
        if source.kind == "text":  # the documents of a text file are the file, cut
            assert "".join(d.text for d in docs) == source.path.read_bytes().decode("utf-8")
        else:
            lines = [json.loads(line)["text"] for line in source.path.read_text().splitlines() if line]
            assert [d.text for d in docs] == lines
        for doc in docs:
            expected["val" if is_validation(source.split_key, doc.index, 20.0) else "train"].append(doc.text)
    assert decoded == expected


def test_given_tokenizer_jsonl_field_and_uint32(tmp_path, capsys):
    """--tokenizer is copied as is; a vocabulary over 65536 ids gives uint32 shards; </s> found."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(70_000)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "wide.json"))
    rows = [{"body": f"w{i} w{69_999 - i} w{i * 7}"} for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code, stdout, err = run_main(capsys, "prepare", str(tmp_path / "rows.jsonl"), "--out", str(out),
                                 "--tokenizer", str(tmp_path / "wide.json"), "--jsonl-field", "body")
    assert code == 0, err
    manifest = read_manifest(out)
    assert (manifest.vocab_size, manifest.token_dtype, manifest.eos_id) == (70_002, "uint32", 1)
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "wide.json").read_bytes()
    stream = np.concatenate([np.fromfile(f, dtype="uint32") for f in manifest.train + manifest.val])
    assert stream.max() == 70_001 and len(stream) == 40 * 4
    assert "uint32" in stdout




@pytest.mark.parametrize("kill_after", [1, 5, "all"])  # all: the last shards written, no manifest yet
def test_killed_run_resumes_to_identical_bytes(prepared, inputs, tmp_path, capsys, kill_after):
    if kill_after == "all":
        kill_after = sum(len(v) for v in json.loads((prepared / "prepared.json").read_text())["shards"].values())
    out = tmp_path / "out"
    args = prepare_args(inputs, out)
    killed = subprocess.run([sys.executable, "-m", "noloco_rt.cli", *args, "--kill-after-shards", str(kill_after)],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    progress = json.loads((out / "prepare-progress.json").read_text())
    assert sum(len(v) for v in progress["shards"].values()) >= kill_after
    assert not (out / "prepared.json").exists()
    code, _, err = run_main(capsys, *args)
    assert code == 0, err
    assert file_tree(out) == file_tree(prepared)


def test_rerun_same_is_a_no_op_other_arguments_refused_force_restarts(prepared, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    args = prepare_args(inputs, out)
    assert run_main(capsys, *args)[0] == 0
    before = file_tree(out)
    code, stdout, _ = run_main(capsys, *args)
    assert code == 0 and "nothing to do" in stdout and file_tree(out) == before
    code, _, err = run_main(capsys, *prepare_args(inputs, out, "--val-percent", "10"))
    assert code == 2 and err.count("\n") == 1 and "--force" in err
    code, _, err = run_main(capsys, *prepare_args(inputs, out, "--val-percent", "10", "--force"))
    assert code == 0, err
    assert json.loads((out / "prepared.json").read_text())["val_percent"] == 10


def test_interrupted_run_refuses_other_arguments(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-m", "noloco_rt.cli", *prepare_args(inputs, out),
                             "--kill-after-shards", "1"], capture_output=True, timeout=60)
    assert killed.returncode == -9
    code, _, err = run_main(capsys, *prepare_args(inputs, out, "--shard-tokens", "5000"))
    assert code == 2 and err.count("\n") == 1 and "interrupted" in err


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "ok.txt").write_text("hello world\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    (tmp_path / "nofield.jsonl").write_text('{"text": "fine"}\n{"body": "x"}\n')
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "garbage.json").write_text("{not a tokenizer")
    return {name: tmp_path / name for name in ("ok.txt", "bad.jsonl", "nofield.jsonl", "latin1.txt", "garbage.json")}


@pytest.mark.parametrize(("case", "fragment"), [
    ("nomatch", "matches no file"),
    ("notjson", "bad.jsonl:2: not a JSON line"),
    ("nofield", "nofield.jsonl:2: no string field 'text'"),
    ("notutf8", "is not UTF-8"),
    ("garbage_tokenizer", "cannot read tokenizer"),
    ("missing_tokenizer", "cannot read tokenizer"),
    ("both", "exactly one of --tokenizer"),
    ("neither", "exactly one of --tokenizer"),
    ("tiny_bpe", "at least 257"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case, fragment):
    files = _bad_inputs(tmp_path)
    out = ["--out", str(tmp_path / "out")]
    bpe = ["--train-bpe", "300"]
    args = {
        "nomatch": [str(tmp_path / "none*.txt"), *out, *bpe],
        "notjson": [str(files["bad.jsonl"]), *out, *bpe],
        "nofield": [str(files["nofield.jsonl"]), *out, *bpe],
        "notutf8": [str(files["latin1.txt"]), *out, *bpe],
        "garbage_tokenizer": [str(files["ok.txt"]), *out, "--tokenizer", str(files["garbage.json"])],
        "missing_tokenizer": [str(files["ok.txt"]), *out, "--tokenizer", str(tmp_path / "absent.json")],
        "both": [str(files["ok.txt"]), *out, *bpe, "--tokenizer", str(files["garbage.json"])],
        "neither": [str(files["ok.txt"]), *out],
        "tiny_bpe": [str(files["ok.txt"]), *out, "--train-bpe", "100"],
    }[case]
    code, _, err = run_main(capsys, "prepare", *args)
    assert code == 2
    lines = err.splitlines()  # progress lines may come first; the error is one line, no traceback
    assert lines[-1].startswith("Error: ") and fragment in lines[-1], err
    assert all(line.startswith("prepare: ") for line in lines[:-1]), err


def test_vocab_too_large_for_uint32_is_a_config_error():
    assert dtype_for_vocab(65_536) == "uint16" and dtype_for_vocab(65_537) == "uint32"
    with pytest.raises(ConfigError, match="uint32"):
        dtype_for_vocab((1 << 32) + 1)


def _tokens_config(prepared: Path, **model):
    overrides = [{"data": {"source": "tokens", "paths": [str(prepared)]}}]
    if model:
        overrides.append({"model": model})
    return load_config(environ={}, overrides=overrides)


def test_config_and_corpus_follow_the_prepared_directory(prepared):
    cfg = _tokens_config(prepared)
    assert cfg.model.vocab_size == VOCAB and cfg.data.token_dtype == "uint16"
    assert run_tokenizer_path(cfg) == prepared / "tokenizer.json"
    assert _tokens_config(prepared, vocab_size=512).model.vocab_size == 512
    with pytest.raises(ConfigError, match="smaller than the 400 tokens"):
        _tokens_config(prepared, vocab_size=300)
    manifest = read_manifest(prepared)
    corpus = load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
    assert np.array_equal(corpus.train, np.concatenate([np.fromfile(f, dtype="uint16") for f in manifest.train]))
    assert np.array_equal(corpus.val, np.concatenate([np.fromfile(f, dtype="uint16") for f in manifest.val]))
    assert run_tokenizer_path(load_config(environ={})) is None
    raw = load_config(environ={}, overrides=[{"data": {"source": "tokens", "paths": [str(manifest.train[0])],
                                                       "tokenizer": str(manifest.tokenizer)},
                                              "model": {"vocab_size": VOCAB}}])
    assert run_tokenizer_path(raw) == manifest.tokenizer  # plain token files name theirs in data.tokenizer


def test_smaller_vocab_size_than_the_tokenizer_is_one_line_exit_2(prepared, capsys):
    code, _, err = run_main(capsys, "config", "show", "--set", "data.source=tokens", "--set", f"data.paths={prepared}",
                            "--set", "model.vocab_size=300")
    assert code == 2 and err.startswith("Error: invalid model.vocab_size = 300") and err.count("\n") == 1, err


def test_simulate_trains_on_the_prepared_directory(prepared, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    code, _, err = run_main(capsys, "simulate", "--preset", "tiny", "--steps", "4", "--eval-every", "2",
                            "--stages", "2", "--replicas", "2", "--out", str(run),
                            "--set", "data.source=tokens", "--set", f"data.paths={prepared}",
                            "--set", "model.seq_len=32", "--set", "data.batch_size=2",
                            "--set", "run.eval_batches=1")
    assert code == 0, err
    assert tomllib.loads((run / "config.toml").read_text())["model"]["vocab_size"] == VOCAB
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records and all(math.isfinite(r["val_loss"]) for r in records)
    assert abs(records[0]["val_loss"] - math.log(VOCAB)) < 1.0  # an untrained model over 400 ids
    _exported_run_loads_in_transformers(run, prepared, tmp_path, capsys)
    _the_consensus_stands_alone(run, prepared, tmp_path, capsys, monkeypatch)


def _the_consensus_stands_alone(run: Path, prepared: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """On another machine (another folder, no copy of the data): sample decodes with the
    tokenizer the file carries, export writes it with the end-of-document token that makes
    `generate` stop, and eval names the flag for the validation data it needs."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(run / "consensus.safetensors", elsewhere / "model.safetensors")
    monkeypatch.chdir(elsewhere)
    eos = read_manifest(prepared).eos_id
    args = ("--prompt", "alpha beta", "--tokens", "8", "--temperature", "0")
    code, carried, err = run_main(capsys, "sample", "model.safetensors", *args)
    assert code == 0, err
    code, named, err = run_main(capsys, "sample", "model.safetensors", *args, "--data", str(prepared))
    assert code == 0 and carried == named, (carried, named, err)
    code, _, err = run_main(capsys, "export", "model.safetensors", "--format", "hf", "hf")
    assert code == 0, err
    assert (elsewhere / "hf" / "tokenizer.json").read_bytes() == (prepared / "tokenizer.json").read_bytes()
    for name in ("config.json", "generation_config.json"):
        assert json.loads((elsewhere / "hf" / name).read_text())["eos_token_id"] == eos, name
    if importlib.util.find_spec("transformers") is not None:
        from transformers import GenerationConfig

        assert GenerationConfig.from_pretrained(elsewhere / "hf").eos_token_id == eos  # where generate stops
    code, _, err = run_main(capsys, "eval", "model.safetensors")
    assert code == 2 and "--data PATH" in err, err
    code, _, err = run_main(capsys, "eval", "model.safetensors", "--data", str(prepared))
    assert code == 0, err
    # README's --init-from of the export: without the run's data the line says which settings
    # match the weights; with them, it trains on.
    small = ("--steps", "2", "--eval-every", "2", "--stages", "2", "--replicas", "1", "--set", "model.seq_len=32",
             "--set", "data.batch_size=2", "--set", "run.eval_batches=1")
    code, _, err = run_main(capsys, "simulate", "--init-from", "hf", "--out", "more", *small)
    assert code == 2 and "--set data.source=tokens --set data.paths=DIR" in err, err
    code, _, err = run_main(capsys, "simulate", "--init-from", "hf", "--out", "more", *small,
                            "--set", "data.source=tokens", "--set", f"data.paths={prepared}")
    assert code == 0, err


def _exported_run_loads_in_transformers(run: Path, prepared: Path, tmp_path: Path, capsys) -> None:
    """The end of the user's path: the run's consensus exported as a Hugging Face folder that
    transformers loads with its tokenizer, and computes what noloco-rt computes."""
    if importlib.util.find_spec("transformers") is None:
        print("transformers is not installed (a dev dependency): the export half of the path was not run")
        return
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from noloco_rt.consensus.file import load_consensus

    code, _, err = run_main(capsys, "export", str(run / "consensus.safetensors"), "--format", "hf", str(tmp_path / "hf"),
                            "--data", str(prepared))  # the run's tokenizer: named by the user, never by the file
    assert code == 0, err
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path / "hf")
    text = "alpha beta gamma Zürich"
    ids = tokenizer(text)["input_ids"]
    assert ids == TextCodec(prepared / "tokenizer.json").encode(text)
    hf_model = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    _, ours, _ = load_consensus(run / "consensus.safetensors")
    with torch.no_grad():
        batch = torch.tensor([ids])
        difference = (hf_model(batch).logits - ours.eval()(batch)).abs().max().item()
    assert difference <= 1e-4, difference


def test_sample_decodes_with_the_runs_tokenizer(prepared, tmp_path, capsys):
    from noloco_rt.consensus.file import save_consensus, stage_parameter_shapes
    from noloco_rt.evaluation import generate
    from noloco_rt.model.llama import build_model

    cfg = _tokens_config(prepared)
    model = build_model("tiny", vocab_size=cfg.model.vocab_size, seed=0)
    state = {name: p.detach() for name, p in model.named_parameters()}
    path = tmp_path / "consensus.safetensors"
    save_consensus(path, cfg, [[state[n] for n, _ in stage_parameter_shapes(cfg, s)] for s in range(2)],
                   metadata={"step": "0"})
    code, out, err = run_main(capsys, "sample", str(path), "--prompt", "alpha beta", "--tokens", "12",
                              "--temperature", "0", "--data", str(prepared))
    assert code == 0, err
    codec = TextCodec(prepared / "tokenizer.json")
    with torch.no_grad():
        expected = generate(model, "alpha beta", max_new_tokens=12, temperature=0.0, top_k=40, seed=0,
                            context_len=cfg.model.seq_len, codec=codec)
    assert out == "alpha beta" + expected + "\n"


def test_bpe_training_is_deterministic():
    texts = [f"the {i} quick brown fox {i * i}" for i in range(200)]
    assert train_bpe(iter(texts), 300).to_str() == train_bpe(iter(texts), 300).to_str()


def test_generate_with_a_tokenizer_reaches_ids_above_the_byte_range(prepared):
    from noloco_rt.evaluation import generate

    class PrefersTheLastId(torch.nn.Module):
        """Logits whose maximum is the tokenizer's last id (a merge, far above 255)."""

        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            logits = torch.zeros(*ids.shape, VOCAB)
            logits[..., VOCAB - 1] = 10.0
            return logits + self.anchor

    codec = TextCodec(prepared / "tokenizer.json")
    text = generate(PrefersTheLastId(), "alpha", max_new_tokens=3, temperature=0.0, top_k=None, seed=0,
                    context_len=8, codec=codec)
    assert text == codec.decode([VOCAB - 1] * 3)

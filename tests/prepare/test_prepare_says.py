"""`prepare` and `eval` say what they do: progress with a rate and the time left (the BPE's
reading too), a resumed run says so, a validation split too small is warned about when it is
made and never repeated by an evaluation, a refused --out names what changed."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from noloco_rt.config import load_config
from noloco_rt.evaluation import load_validation_batches
from noloco_rt.prepare.changes import describe_change
from tests.support.prepare_inputs import paragraph, run_main
from tests.support.weights import random_consensus


def _corpus(folder: Path, paragraphs: int, seed: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with open(folder / "notes.jsonl", "w", encoding="utf-8") as handle:
        for _ in range(paragraphs):
            handle.write(json.dumps({"text": paragraph(rng)}) + "\n")
    return folder / "notes.jsonl"


def test_a_small_validation_split_is_warned_when_made_and_evaluations_never_repeat_it(tmp_path, capsys, monkeypatch):
    # The split hashes the input's path as given: relative, so that it is the same every run
    # (under pytest's temporary folder it changed with the folder's name: one CI run's split
    # held 226 tokens, not one batch; here it holds 13 of the 120 documents).
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "in", 120)
    out = tmp_path / "prepared"
    code, _, err = run_main(capsys, "prepare", "in/notes.jsonl", "--out", str(out), "--train-bpe", "300",
                            "--val-percent", "10")
    assert code == 0, err
    manifest = json.loads((out / "prepared.json").read_text())
    held = ((manifest["tokens"]["val"] - 1) // 64) // 8
    assert 1 <= held < 8, manifest["tokens"]
    assert f"warning: the validation split holds {manifest['tokens']['val']:,} tokens, {held} distinct batches" in err
    cfg = load_config(environ={}, overrides=[{"data": {"source": "tokens", "paths": [str(out)]},
                                              "model": {"vocab_size": manifest["vocab_size"]}}])
    batches = load_validation_batches(cfg)
    assert len(batches) == held  # not run.eval_batches = 8
    windows = [tuple(row.tolist()) for inputs_, _ in batches for row in inputs_]
    assert len(set(windows)) == len(windows)  # no window twice

    # eval says it took all the split holds, and refuses more than that by name.
    consensus = tmp_path / "consensus.safetensors"
    random_consensus(consensus, model={"preset": "tiny", "vocab_size": manifest["vocab_size"]},
                     data={"source": "tokens", "paths": [str(out)]}, run={"eval_batches": 8})
    code, stdout, err = run_main(capsys, "eval", str(consensus), "--data", str(out))
    assert code == 0, err
    assert f"{held} validation batches of 8×64 tokens (all the split holds)" in stdout
    code, _, err = run_main(capsys, "eval", str(consensus), "--data", str(out), "--batches", str(held + 1))
    assert code == 2 and f"holds {held} distinct batches" in err


def test_progress_has_a_rate_and_time_left_and_a_resumed_run_says_it_resumed(tmp_path):
    inputs = _corpus(tmp_path / "in", 3000)
    args = [sys.executable, "-m", "noloco_rt.cli", "prepare", str(inputs), "--out", str(tmp_path / "out"),
            "--train-bpe", "300", "--shard-tokens", "5000"]
    killed = subprocess.run([*args, "--kill-after-shards", "3"], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    lines = killed.stderr.splitlines()  # not a terminal: plain lines
    assert any("training a byte-level BPE of 300 tokens: reading" in line for line in lines), lines
    assert any("training a byte-level BPE of 300 tokens: merging" in line for line in lines), lines
    encoding = [line for line in lines if "tokens/s" in line]
    assert encoding and all("notes.jsonl, " in line for line in encoding), lines
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed an interrupted prepare: " in resumed.stderr and " shards were already written" in resumed.stderr


def test_a_refused_out_names_what_changed(tmp_path, capsys):
    inputs = _corpus(tmp_path / "in", 40)
    out = tmp_path / "out"
    assert run_main(capsys, "prepare", str(inputs), "--out", str(out), "--train-bpe", "300")[0] == 0
    code, _, err = run_main(capsys, "prepare", str(inputs), "--out", str(out), "--train-bpe", "300",
                            "--val-percent", "20")
    assert code == 2 and "other arguments (--val-percent 5.0 -> 20.0)" in err and err.count("\n") == 1, err
    _corpus(tmp_path / "in", 41)
    code, _, err = run_main(capsys, "prepare", str(inputs), "--out", str(out), "--train-bpe", "300")
    assert code == 2 and f"inputs: {inputs.as_posix()} changed size" in err, err


def test_describe_change_exact():
    before = {"inputs": [["a.txt", "text", 10], ["b.txt", "text", 5]], "val_percent": 5.0, "jsonl_field": "text"}
    now = {"inputs": [["a.txt", "text", 12], ["c.txt", "text", 1]], "val_percent": 5.0, "jsonl_field": "body"}
    assert describe_change(before, now) == ("inputs: a.txt changed size (10 -> 12 bytes), b.txt gone, c.txt added; "
                                            "--text-field text -> body")
    assert describe_change(before, before) == "nothing (the recorded arguments are unreadable)"


@pytest.fixture(autouse=True)
def _no_terminal(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)

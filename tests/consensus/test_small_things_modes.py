"""Files a user hands on (a consensus, an exported folder, prepared shards) get the mode of any
new file of theirs, under their umask, not the 0600 of a private temporary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from noloco_rt.cli import main
from noloco_rt.consensus.file import load_consensus
from tests.support.weights import one_torch_thread, random_consensus  # noqa: F401 (an autouse fixture)


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def user_umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def run_main(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


def test_a_consensus_file_honours_the_umask_and_replacing_it_too(tmp_path, user_umask):
    path = tmp_path / "consensus.safetensors"
    random_consensus(path, seed=1)
    assert mode(path) == 0o666 & ~user_umask
    random_consensus(path, seed=2)  # replaced atomically: the new file has the mode too
    assert mode(path) == 0o666 & ~user_umask
    assert load_consensus(path)[0].run.seed == 2
    assert [p.name for p in tmp_path.iterdir()] == ["consensus.safetensors"]  # no temporary left


def test_every_file_of_an_exported_folder_honours_the_umask(tmp_path, user_umask):
    consensus = tmp_path / "consensus.safetensors"
    random_consensus(consensus, seed=3)
    out = tmp_path / "hf"
    assert run_main("export", consensus, out) == 0
    files = sorted(out.iterdir())
    assert {p.name for p in files} >= {"config.json", "model.safetensors", "generation_config.json"}
    assert {p.name: mode(p) for p in files} == {p.name: 0o666 & ~user_umask for p in files}


def test_prepared_files_honour_the_umask(tmp_path, user_umask):
    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n\n" * 50)
    out = tmp_path / "out"
    assert run_main("prepare", text, "--out", out, "--train-bpe", "300") == 0
    files = sorted(out.iterdir())
    assert {"prepared.json", "tokenizer.json"} <= {p.name for p in files}
    assert any(p.suffix == ".bin" for p in files)
    assert {p.name: mode(p) for p in files} == {p.name: 0o666 & ~user_umask for p in files}

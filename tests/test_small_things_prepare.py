"""`noloco-rt prepare` on inputs it cannot use: one line naming the file, exit 2, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from noloco_rt.cli import main


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("content", "fragment"), [
    (b"", "is empty (0 bytes)"),
    (b"\n  \n\t\n", "holds only blank space"),
])
def test_an_empty_input_fails_naming_it_and_writes_nothing(tmp_path, capsys, content, fragment):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(content)
    out = tmp_path / "out"
    code, stdout, err = run_main(capsys, "prepare", empty, "--out", out, "--train-bpe", "300")
    assert code == 2, stdout
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert str(empty) in err and fragment in err
    assert not out.exists()


def test_an_empty_input_among_good_ones_fails_and_leaves_an_existing_out_as_it_was(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text to tokenize\n")
    (tmp_path / "b.txt").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine\n")
    code, _, err = run_main(capsys, "prepare", tmp_path / "*.txt", "--out", out, "--train-bpe", "300")
    assert code == 2 and str(tmp_path / "b.txt") in err and "is empty" in err
    assert _tree(out) == {"notes.md": b"mine\n"}

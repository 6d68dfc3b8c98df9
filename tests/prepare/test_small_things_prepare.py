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


def file_tree(directory: Path) -> dict[str, bytes]:
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
    assert file_tree(out) == {"notes.md": b"mine\n"}


PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"


@pytest.mark.parametrize(("content", "fragment"), [
    (PNG_HEAD * 50, "is not a text file (a NUL byte at offset 8)"),
    ("naïve café\n".encode("latin-1") * 10, "is not UTF-8 text (byte 0xef at offset 2)"),
])
def test_a_binary_input_fails_saying_why_and_makes_no_out_folder(tmp_path, capsys, content, fragment):
    binary = tmp_path / "picture.dat"
    binary.write_bytes(content)
    out = tmp_path / "new" / "out"
    code, _, err = run_main(capsys, "prepare", binary, "--out", out, "--train-bpe", "300")
    assert code == 2
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert str(binary) in err and fragment in err
    assert not (tmp_path / "new").exists()


def _text_going_bad_after_the_sniff(path: Path) -> None:
    """Good UTF-8 text past what check_readable reads, then a byte that is not UTF-8."""
    from noloco_rt.prepare.documents import SNIFF_BYTES

    line = "the quick brown fox jumps over the lazy dog\n"
    path.write_bytes((line * (2 * SNIFF_BYTES // len(line))).encode() + b"caf\xe9\n")


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    from noloco_rt.prepare.tokenizer import train_bpe

    path = tmp_path / "tok.json"
    train_bpe(["the quick brown fox jumps over the lazy dog"], 300).save(str(path))
    return path


@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "existing-out"])
def test_a_bad_byte_found_mid_way_takes_back_what_the_run_wrote(tmp_path, capsys, tokenizer_file, existing):
    bad = tmp_path / "bad.txt"
    _text_going_bad_after_the_sniff(bad)
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "notes.md").write_text("mine\n")
    # With --tokenizer, tokenizer.json and the progress file are on disk when the bad byte is read.
    code, _, err = run_main(capsys, "prepare", bad, "--out", out, "--tokenizer", tokenizer_file)
    assert code == 2
    assert err.splitlines()[-1].startswith("Error: ") and f"{bad}: the text before line" in err, err
    if existing:
        assert file_tree(out) == {"notes.md": b"mine\n"}
    else:
        assert not out.exists()

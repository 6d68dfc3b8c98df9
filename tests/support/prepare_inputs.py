"""Text inputs for `noloco-rt prepare`, its command run in process, and the tree of files it writes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from noloco_rt.cli import main

_LETTERS = random.Random(1)
WORDS = ("alpha beta gamma delta résumé naïve Zürich 東京 emoji🙂 tab\tseparated".split(" ")
         + ["".join(_LETTERS.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_LETTERS.randint(2, 9)))
            for _ in range(400)])


def paragraph(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI entry point in-process: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def file_tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}

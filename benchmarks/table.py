"""Markdown tables for benchmark output: printed, and written to a file when asked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def markdown_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def emit(text: str, out: Path | None) -> None:
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)

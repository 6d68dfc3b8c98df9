"""Markdown tables for benchmark output: printed, and written to a file when asked."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path


def median_range(values: Sequence[float], spec: str) -> str:
    """'1.23 [1.10–1.40]': the median and [min–max] of the runs, each formatted by `spec`."""
    return f"{statistics.median(values):{spec}} [{min(values):{spec}}–{max(values):{spec}}]"


def markdown_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def emit(text: str, out: Path | None) -> None:
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)

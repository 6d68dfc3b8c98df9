"""Secrets planted in a run, and the files of a run that hold them."""

from __future__ import annotations

from pathlib import Path

PASSWORD = "Planted-Redis-Passw0rd"


def files_holding(out: Path, secrets: list[str]) -> list[str]:
    """Every file under `out` holding one of `secrets` (as bytes), by path."""
    needles = [s.encode() for s in secrets]
    return [str(f) for f in sorted(out.rglob("*")) if f.is_file() and any(n in f.read_bytes() for n in needles)]


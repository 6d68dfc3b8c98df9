"""The progress file: what an interrupted `prepare` had finished, so a rerun continues there.

It is replaced atomically after every finished shard and only then are the files it
no longer names removed, so after a kill at any instant it describes shards that are
complete on disk and pending tokens that were saved with it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from noloco_rt.config.prepared_manifest import atomic_write_text
from noloco_rt.prepare.documents import InputError, Position

PROGRESS_NAME = "prepare-progress.json"
SPLITS = ("train", "val")


@dataclass
class PrepareState:
    arguments: dict[str, Any]
    """The fingerprint of the command (inputs, tokenizer, split, shard size): a rerun must match it."""
    tokenizer_ready: bool = False
    source: int = 0
    """Index of the input being read; those before it are done."""
    position: Position = field(default_factory=Position)
    """Where reading `source` resumes."""
    checkpoint: int = 0
    shards: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    """Finished shard files per split: {"file": name, "tokens": count}."""
    pending: dict[str, str | None] = field(default_factory=lambda: {s: None for s in SPLITS})
    """Per split, the file holding tokens read but not yet in a shard (None: none)."""
    documents: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    source_documents: list[int] = field(default_factory=list)
    """Documents of every finished input."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PrepareState:
        raw = json.loads(text)
        raw["position"] = Position(**raw["position"])
        return cls(**raw)


def load_state(out: Path) -> PrepareState | None:
    path = out / PROGRESS_NAME
    if not path.is_file():
        return None
    try:
        return PrepareState.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{path} is unreadable ({exc}); rerun with --force to start over") from None


def save_state(out: Path, state: PrepareState) -> None:
    atomic_write_text(out / PROGRESS_NAME, state.to_json())

"""A worker's last N checkpoints (worker.checkpoint_keep): `<name>.pt`, the newest, where
every reader looks, then `<name>.pt.1`, `<name>.pt.2`, ... older ones.

Older files end in `.pt.<k>`, not `.pt`: code that takes every `*.pt` of a checkpoint folder
as one worker's newest (export, the consensus of final checkpoints, the chaos driver) never
sees them, and no worker's name can collide with another worker's older file (`a.1.pt`
would be both worker `a.1`'s newest and worker `a`'s older one).

A new checkpoint is complete in its temporary before anything is renamed, so the oldest
kept file is only dropped once a newer one exists. Between moving the newest to `.pt.1` and
renaming the new one into place there is an instant without `<name>.pt`; a worker killed
there resumes from `.pt.1`, which is the checkpoint it would have had.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noloco_rt.checkpoints.worker import (
    CheckpointError,
    FileWriter,
    load_checkpoint,
    publish_temporary,
    write_temporary,
)


def kept_paths(path: Path, keep: int) -> list[Path]:
    """The files of the last `keep` checkpoints of `path`, newest first (pure)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    return [path] + [path.with_name(f"{path.name}.{k}") for k in range(1, keep)]


def older_index(path: Path, candidate: Path) -> int | None:
    """k when `candidate` is `path`'s older file `<name>.pt.<k>`, else None (pure)."""
    prefix = f"{path.name}."
    if candidate.parent != path.parent or not candidate.name.startswith(prefix):
        return None
    suffix = candidate.name[len(prefix):]
    return int(suffix) if suffix.isdigit() and int(suffix) >= 1 else None


def remove_beyond(path: Path, keep: int) -> list[Path]:
    """Delete `path`'s older files past the last `keep` (left by a larger keep before)."""
    removed = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        index = older_index(path, candidate)
        if index is not None and index >= keep:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def _shift_older(path: Path, keep: int) -> None:
    """Each kept file one place older; the oldest is overwritten (dropped)."""
    files = kept_paths(path, keep)
    for newer, older in reversed(list(zip(files[:-1], files[1:], strict=True))):
        if newer.exists():
            os.replace(newer, older)


def write_kept(path: Path, content: bytes | FileWriter, *, keep: int, fault: Callable[[], None] | None = None) -> None:
    """`content` (bytes, or a writer of the file) becomes `path`, the file it replaces `<name>.pt.1` and so on, `keep` files in
    all. Raises OSError when the write fails (the kept files are then as they were, save
    for a rename that failed midway: each file is still a complete checkpoint)."""
    tmp = write_temporary(path, content, fault=fault)
    publish_temporary(tmp, path, before=(lambda: _shift_older(path, keep)) if keep > 1 else (lambda: None))
    remove_beyond(path, keep)


def load_newest_usable(path: Path, *, keep: int, run_id: str,
                       stage: int) -> tuple[dict[str, Any] | None, Path | None, list[str]]:
    """(state, its file, why newer files were passed over) of the newest kept checkpoint that
    loads; (None, None, []) when there is none. Raises the newest one's CheckpointError when
    files exist but none can be used (a worker never silently drops its own state)."""
    problems: list[str] = []
    errors: list[CheckpointError] = []
    for candidate in kept_paths(path, keep):
        try:
            state = load_checkpoint(candidate, run_id=run_id, stage=stage)
        except CheckpointError as exc:
            problems.append(str(exc))
            errors.append(exc)
            continue
        if state is not None:
            return state, candidate, problems
    if errors:
        raise errors[0]
    return None, None, []

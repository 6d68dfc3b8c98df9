"""Crash-safe worker checkpoints: write to a temporary file, fsync, rename, fsync the folder.

A reader therefore sees either the previous complete checkpoint or the new complete
one, never a torn file, whatever moment the writer is killed at. A writer killed
mid-write leaves its temporary (`.<name>.<pid>.<random>.tmp`) behind; the next successful
write of the same path removes those of writers that are no longer running.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_VERSION = 1

FileWriter = Callable[[Path], None]
"""Writes a whole file at the path it is given (a temporary, renamed into place once complete)."""


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (corrupt, other run or stage, other version)."""


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Delete the temporaries of killed writers of `path` (their pid is not running; a
    temporary without a pid in its name counts as stale). Returns what was removed."""
    removed = []
    for candidate in path.parent.glob(f".{path.name}.*.tmp"):
        middle = candidate.name[len(path.name) + 2:-len(".tmp")]  # "<pid>.<random>"
        pid_text = middle.split(".", 1)[0]
        if pid_text.isdigit() and (int(pid_text) == os.getpid() or _pid_running(int(pid_text))):
            continue  # a live writer (ours or a concurrent one) may still rename it
        candidate.unlink(missing_ok=True)
        removed.append(candidate)
    return removed


def write_temporary(path: Path, content: bytes | FileWriter, *, fault: Callable[[], None] | None = None) -> Path:
    """`content` (bytes, or a writer that writes the file itself) in a fsynced temporary next to
    `path`, for the caller to rename onto it. A write that fails (a full disk: OSError ENOSPC)
    removes its temporary and raises. `fault` is for tests only: called once the content is
    written, it stands in for a write call that raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        if isinstance(content, bytes):
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
        else:
            os.close(fd)
            content(tmp)
        if fault is not None:
            fault()
        fsync_path(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def publish_temporary(tmp: Path, path: Path, *, before: Callable[[], None] = lambda: None) -> None:
    """Rename the complete temporary `tmp` onto `path` (after `before`, e.g. rotating the file
    it replaces) and make the rename durable; the temporary is removed if that fails."""
    try:
        before()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    remove_stale_temporaries(path)


def fsync_path(path: Path) -> None:
    """Make what was written to `path` durable: a file's bytes (whoever wrote them, through
    whatever handle), or the renames in a folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, fault: Callable[[], None] | None = None) -> None:
    publish_temporary(write_temporary(path, data, fault=fault), path)


def checkpoint_bytes(state: dict[str, Any]) -> bytes:
    """state: tensors, lists of tensors, numbers, strings and dicts of those."""
    buffer = io.BytesIO()
    torch.save({"version": CHECKPOINT_VERSION, **state}, buffer)
    return buffer.getvalue()


class _UnbufferedFile(io.RawIOBase):
    """A file torch.save writes each record of straight to the disk (no copy in between; the
    GIL is let go for each write call while the bytes move), keeping the OSError of a failed
    write: torch reports it as a RuntimeError without its errno (a full disk must still count
    as ENOSPC)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):
                written += self._file.write(view[written:]) or 0
        except OSError as exc:
            self.error = exc
            raise
        return written

    def close(self) -> None:
        self._file.close()
        super().close()


def checkpoint_writer(state: dict[str, Any]) -> FileWriter:
    """What checkpoint_bytes holds, written by torch.save straight into the file: no copy of
    the whole state in memory first (a BytesIO held one, and took the bytes through Python
    with the GIL held, piece by piece)."""

    def write(tmp: Path) -> None:
        with _UnbufferedFile(tmp) as handle:
            try:
                torch.save({"version": CHECKPOINT_VERSION, **state}, handle)
            except RuntimeError:
                if handle.error is not None:
                    raise handle.error from None
                raise

    return write


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    publish_temporary(write_temporary(path, checkpoint_writer(state)), path)


def checkpoint_from_bytes(data: bytes, *, origin: str, run_id: str, stage: int) -> dict[str, Any]:
    """The state in `data` (read from `origin`, for messages); CheckpointError when it cannot
    be read or belongs to another run, stage or format version."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise CheckpointError(f"checkpoint {origin} cannot be read: {exc}") from exc
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint {origin} has version {state.get('version')}, expected {CHECKPOINT_VERSION}")
    if state.get("run_id") != run_id or state.get("stage") != stage:
        raise CheckpointError(f"checkpoint {origin} is for run {state.get('run_id')!r} stage {state.get('stage')}, "
                              f"not run {run_id!r} stage {stage}")
    return state


def load_checkpoint(path: Path, *, run_id: str, stage: int) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None if there is none. Raises CheckpointError when it
    exists but belongs to another run or stage, or cannot be read."""
    if not path.exists():
        return None
    return checkpoint_from_bytes(path.read_bytes(), origin=str(path), run_id=run_id, stage=stage)

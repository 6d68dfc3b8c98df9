"""A full disk under the worker's checkpoint folder, for tests and chaos runs only.

Asked for through an environment variable of the worker process (never configuration,
hence not NOLOCO_*, like workers/faults/data_path.py): CHAOS_CHECKPOINT_DISK_FULL_AFTER=K
lets the worker's first K checkpoint writes succeed, then every later one fails inside the
real write call with OSError(ENOSPC), after its temporary file was created, as a disk that
filled up would. Nothing in the library reads the variable.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass

DISK_FULL_AFTER_ENV = "CHAOS_CHECKPOINT_DISK_FULL_AFTER"


@dataclass
class DiskFullAfter:
    """Called by the write once the data is in its temporary: raises ENOSPC from the
    (writes_ok + 1)-th write on."""

    writes_ok: int
    attempts: int = 0

    def __post_init__(self) -> None:
        if self.writes_ok < 0:
            raise ValueError(f"{DISK_FULL_AFTER_ENV} must be >= 0, got {self.writes_ok}")

    def __call__(self) -> None:
        self.attempts += 1
        if self.attempts > self.writes_ok:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def disk_full_env(writes_ok: int) -> dict[str, str]:
    """The environment that asks a worker for a disk that fills after `writes_ok` checkpoints."""
    return {DISK_FULL_AFTER_ENV: str(writes_ok)}


def disk_full_from_env(environ: Mapping[str, str]) -> DiskFullAfter | None:
    """The fault the environment asks for, or None (the normal case)."""
    raw = environ.get(DISK_FULL_AFTER_ENV, "").strip()
    return DiskFullAfter(int(raw)) if raw else None

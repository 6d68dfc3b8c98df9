"""Files a user hands on: written atomically, with the mode any new file of the user's gets
(0o666 less the umask, 0644 under umask 022), not the 0600 of a private temporary."""

from __future__ import annotations

import os
from pathlib import Path

from noloco_rt.checkpoints.worker import publish_temporary, write_temporary


def umask() -> int:
    """The process umask, read without changing it where the system allows (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o077)  # elsewhere: set and restore (briefly stricter, never looser)
    os.umask(current)
    return current


def make_shared(path: Path) -> None:
    """Give `path` the mode open() gives a new file (0o666 less the umask): a temporary from
    mkstemp is 0600, right for a worker's checkpoint but not for a file a user hands on."""
    os.chmod(path, 0o666 & ~umask())


def write_shared_file(path: Path, data: bytes) -> None:
    """atomic_write_bytes, with the file's mode that of any new file of the user's (make_shared)."""
    tmp = write_temporary(path, data)
    try:
        make_shared(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    publish_temporary(tmp, path)

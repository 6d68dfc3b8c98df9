"""Where durable run state lives: a local folder (a PersistentVolumeClaim's mount) or an
fsspec URL (file://, s3://, gs://, ... with the matching fsspec package installed).

Writes are atomic for readers: a folder gets temp + fsync + rename (noloco_rt.checkpoints.worker);
an object store's single PUT is atomic by nature. Readers of several files still need an
order (stage checkpoints write their manifest last, noloco_rt.store.stage_checkpoints).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from noloco_rt.checkpoints.worker import atomic_write_bytes
from noloco_rt.config.redaction import redact_url


class StoreError(RuntimeError):
    """The store cannot be opened or used (unknown scheme, missing fsspec package, I/O)."""


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


class RunStore:
    """Paths relative to the store's root, with '/' separators."""

    def __init__(self, url: str) -> None:
        if not url:
            raise StoreError("no store configured (store.url is empty)")
        self.url = url
        self.shown = redact_url(url)
        """The URL for messages and logs: a password in it is ***."""
        self._local = Path(url.removeprefix("file://")) if _is_local(url) else None
        self._fs: Any = None
        self._root = ""
        if self._local is None:
            try:
                import fsspec

                self._fs, self._root = fsspec.core.url_to_fs(url)
            except (ImportError, ValueError) as exc:  # unknown protocol, or its package missing
                raise StoreError(f"store.url {self.shown!r} cannot be opened: {exc}") from exc

    def __repr__(self) -> str:
        return f"RunStore({self.shown!r})"

    def _remote(self, rel: str) -> str:
        return str(PurePosixPath(self._root) / rel)

    def write(self, rel: str, data: bytes) -> None:
        if self._local is not None:
            atomic_write_bytes(self._local / rel, data)
        else:
            self._fs.pipe_file(self._remote(rel), data)

    def read(self, rel: str) -> bytes:
        """The file's bytes; FileNotFoundError if it is not there."""
        if self._local is not None:
            return (self._local / rel).read_bytes()
        return bytes(self._fs.cat_file(self._remote(rel)))

    def list(self, rel_dir: str) -> list[str]:
        """Names (not paths) of the files directly in `rel_dir`; [] if it does not exist.
        Temporaries of a folder's atomic writes (leading dot) are not listed."""
        if self._local is not None:
            folder = self._local / rel_dir
            if not folder.is_dir():
                return []
            return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        try:
            entries = self._fs.ls(self._remote(rel_dir), detail=False)
        except FileNotFoundError:
            return []
        return sorted(PurePosixPath(str(e)).name for e in entries)

    def remove(self, rel: str) -> None:
        """Delete a file; one already gone is fine (a concurrent pruner)."""
        try:
            if self._local is not None:
                (self._local / rel).unlink(missing_ok=True)
            else:
                self._fs.rm_file(self._remote(rel))
        except FileNotFoundError:
            pass

"""prepared.json: the tokenizer, dtype and shard lists of a prepared directory.

Only json and pathlib here: the config loader reads manifests and must stay light.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noloco_rt.config.errors import ConfigError

if TYPE_CHECKING:
    from noloco_rt.config import Config

MANIFEST_NAME = "prepared.json"
MANIFEST_FORMAT = "noloco-rt-prepared"
MANIFEST_VERSION = 1
UINT16_VOCAB = 1 << 16
UINT32_VOCAB = 1 << 32


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest file dtype that holds every id below vocab_size."""
    if vocab_size <= UINT16_VOCAB:
        return "uint16"
    if vocab_size <= UINT32_VOCAB:
        return "uint32"
    raise ConfigError("tokenizer vocab_size", vocab_size, f"must be at most {UINT32_VOCAB} (uint32 ids)")


@dataclass(frozen=True)
class Manifest:
    """A read prepared.json; shard paths are absolute (resolved against its directory)."""

    directory: Path
    tokenizer: Path
    vocab_size: int
    token_dtype: str
    eos_id: int
    train: list[Path]
    val: list[Path]
    raw: dict[str, Any]


def write_manifest(directory: Path, content: dict[str, Any]) -> None:
    atomic_write_text(directory / MANIFEST_NAME, json.dumps(content, indent=2, sort_keys=True) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    """Temp file + fsync + rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def is_prepared_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def read_manifest(directory: str | Path) -> Manifest:
    directory = Path(directory)
    where = str(directory / MANIFEST_NAME)
    try:
        raw = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
        if raw.get("format") != MANIFEST_FORMAT or raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest of version {MANIFEST_VERSION}")
        return Manifest(directory=directory, tokenizer=directory / raw["tokenizer"],
                        vocab_size=int(raw["vocab_size"]), token_dtype=str(raw["token_dtype"]),
                        eos_id=int(raw["eos_id"]),
                        train=[directory / s["file"] for s in raw["shards"]["train"]],
                        val=[directory / s["file"] for s in raw["shards"]["val"]], raw=raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("data.paths", where, f"unreadable prepared manifest: {exc}") from None


def find_prepared_dir(paths: list[str]) -> Path | None:
    """The prepared directory data.paths names, if any; it must then be the only path."""
    prepared = [Path(os.path.expanduser(p)) for p in paths if is_prepared_dir(os.path.expanduser(p))]
    if not prepared:
        return None
    if len(paths) != 1:
        raise ConfigError("data.paths", paths, "a prepared directory must be the only path")
    return prepared[0]


def run_tokenizer_path(cfg: Config) -> Path | None:
    """The tokenizer.json a run's ids belong to: data.tokenizer, else its prepared directory's;
    None for byte-level runs (source stdlib or files) and token files with no tokenizer named."""
    if cfg.data.source != "tokens":
        return None
    if cfg.data.tokenizer:
        return Path(os.path.expanduser(cfg.data.tokenizer))
    directory = find_prepared_dir(cfg.data.paths)
    return read_manifest(directory).tokenizer if directory is not None else None

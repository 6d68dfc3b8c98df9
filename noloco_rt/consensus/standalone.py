"""What makes a consensus file of a run on token ids stand alone: the run's tokenizer.json and
end-of-document id travel in its metadata, so `sample` decodes and `export` writes a complete
Hugging Face folder on another machine, with no copy of the run's data folder.

Written from the run's own config (the user's: trusted to name local files); read back as data
(text and a count), never as paths to follow.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from noloco_rt.config import Config
from noloco_rt.config.prepared_manifest import find_prepared_dir, read_manifest, run_tokenizer_path
from noloco_rt.counts import count_in_text

TOKENIZER_KEY = "tokenizer_json"
EOS_KEY = "eos_token_id"
MAX_TOKENIZER_BYTES = 64 << 20
"""A tokenizer.json larger than this is not embedded (a 32k BPE is about 2 MB)."""


def run_eos_id(cfg: Config) -> int | None:
    """The end-of-document token a run's shards put after each document (its prepared
    manifest's); None for byte-level runs and token files without a manifest."""
    if cfg.data.source != "tokens" or not cfg.data.paths:
        return None
    directory = find_prepared_dir(cfg.data.paths)
    return read_manifest(directory).eos_id if directory is not None else None


def standalone_metadata(cfg: Config) -> dict[str, str]:
    """The metadata entries that carry the run's tokenizer and end-of-document id, from the
    run's own config; {} for a byte-level run or one whose files are not here."""
    if cfg.model.factory:
        return {}
    entries: dict[str, str] = {}
    path = run_tokenizer_path(cfg)
    candidate = (path / "tokenizer.json" if path.is_dir() else path) if path is not None else None
    if candidate is not None and candidate.is_file() and candidate.stat().st_size <= MAX_TOKENIZER_BYTES:
        entries[TOKENIZER_KEY] = candidate.read_text(encoding="utf-8")
    eos = run_eos_id(cfg)
    if eos is not None:
        entries[EOS_KEY] = str(eos)
    return entries


def embedded_tokenizer(metadata: Mapping[str, str]) -> str | None:
    """The tokenizer.json text a consensus carries, if any."""
    text = metadata.get(TOKENIZER_KEY)
    return text if isinstance(text, str) and text else None


def embedded_eos_id(metadata: Mapping[str, str]) -> int | None:
    """The end-of-document id a consensus carries, if it is a count."""
    return count_in_text(metadata.get(EOS_KEY), max_digits=12)


@contextmanager
def carried_tokenizer_file(metadata: Mapping[str, str]) -> Iterator[Path | None]:
    """The tokenizer.json the file carries, as a file while the block runs (None: it carries none)."""
    text = embedded_tokenizer(metadata)
    if text is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="noloco-tokenizer-") as scratch:
        path = Path(scratch) / "tokenizer.json"
        path.write_text(text, encoding="utf-8")
        yield path

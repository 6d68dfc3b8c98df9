"""Inputs and their documents, and which split each document goes to.

A text file is cut into documents at blank lines once a document reaches DOC_BYTES
(so one big file still splits into train and validation); a JSONL file gives one
document per non-blank line, its `field`; a Parquet or Arrow file (and a
`datasets.save_to_disk` folder, its Arrow files) one per row, its `field` column
(noloco_rt/prepare/tables.py). Every document carries where it ends (the byte offset
just past it; a table's row), so a rerun can start where an interrupted one stopped.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from noloco_rt.config.errors import ConfigError
from noloco_rt.prepare.tables import (
    TABLE_SUFFIXES,
    TableError,
    check_table,
    dataset_files,
    table_rows,
)

DOC_BYTES = 64 * 1024
MAX_DOC_BYTES = 4 * DOC_BYTES  # a text with no blank line is still cut, at a line end
JSONL_SUFFIXES = (".jsonl",)
SNIFF_BYTES = 64 * 1024  # what check_readable reads of each input before anything is written


class InputError(ConfigError):
    """Bad input (no match, bad JSONL line, not UTF-8): one line, exit 2."""

    def __init__(self, message: str) -> None:
        # no field to name, unlike a config value: the message is the whole story
        ValueError.__init__(self, message)
        self.field_name, self.value, self.allowed = "prepare", None, message


@dataclass(frozen=True)
class Source:
    key: str  # the path as matched: the split hashes it, the manifest lists it
    path: Path
    kind: str  # "text", "jsonl", "parquet" or "arrow"
    size: int

    @property
    def split_key(self) -> str:
        """What the train/validation split hashes with each document's index: the path, less
        the suffix of a one-document-per-record format, so the same records as JSONL, Parquet
        or Arrow are split alike."""
        return self.key if self.kind == "text" else self.key.removesuffix(self.path.suffix)


@dataclass(frozen=True)
class Document:
    text: str
    index: int  # within its source
    end: int  # byte offset just past it (a table: its rows' share of the file's bytes, for progress)
    line: int  # lines (a table: rows) of the source read up to its end; where a table resumes


@dataclass(frozen=True)
class Position:
    """Where reading a source resumes: byte offset, documents and lines before it."""

    offset: int = 0
    index: int = 0
    line: int = 0


def expand_inputs(patterns: list[str]) -> list[Source]:
    """Files, globs and `datasets.save_to_disk` folders (their Arrow files) -> sources,
    sorted by path, each file once."""
    found: dict[str, Path] = {}
    for pattern in patterns:
        matches = [Path(m) for m in sorted(glob.glob(os.path.expanduser(pattern), recursive=True))]
        files = [m for m in matches if m.is_file()]
        for folder in (m for m in matches if m.is_dir()):
            try:
                files += dataset_files(folder) or []
            except TableError as exc:
                raise InputError(str(exc)) from None
        if not files:
            raise InputError(f"input {pattern!r} matches no file")
        found.update((m.as_posix(), m) for m in files)
    return [Source(key=key, path=path, kind=_kind(path), size=path.stat().st_size) for key, path in sorted(found.items())]


def _kind(path: Path) -> str:
    if path.suffix in JSONL_SUFFIXES:
        return "jsonl"
    return TABLE_SUFFIXES.get(path.suffix, "text")


def check_readable(source: Source, field: str = "text") -> None:
    """Refuse, before anything is written, an input that holds no document (an empty file, or
    one of blank space only, would give a prepared directory of 0 tokens) or that is not text:
    a NUL byte or bytes that are not UTF-8 in its first SNIFF_BYTES (an archive, an image, a
    checkpoint); a table without a text column `field` or without rows. A text file that
    goes bad further on is found while it is read."""
    if source.kind in TABLE_SUFFIXES.values():
        try:
            check_table(source.path, source.kind, field)
        except TableError as exc:
            raise InputError(str(exc)) from None
        return
    if source.size == 0:
        raise InputError(f"{source.key} is empty (0 bytes): it holds no document; leave it out of the inputs")
    with open(source.path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    whole = len(head) == source.size
    if whole and not head.strip():
        raise InputError(f"{source.key} holds only blank space: no document; leave it out of the inputs")
    nul = head.find(b"\0")
    if nul >= 0:
        raise InputError(f"{source.key} is not a text file (a NUL byte at offset {nul}): prepare reads UTF-8 "
                         "text and JSONL; leave binary files out of the inputs")
    try:  # not final unless whole: the sniff may end inside a multi-byte character
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError as exc:
        raise InputError(f"{source.key} is not UTF-8 text (byte {head[exc.start]:#04x} at offset {exc.start}): "
                         "prepare reads UTF-8 text and JSONL; convert it (iconv -t UTF-8) or leave it out") from None


def is_validation(source_key: str, index: int, val_percent: float) -> bool:
    """Deterministic split by document: crc32 of (source, index) in hundredths of a percent."""
    return zlib.crc32(f"{source_key}#{index}".encode()) % 10_000 < val_percent * 100


def _decode(raw: bytes, source: Source, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source.key}: the text before line {line} is not UTF-8") from None


def _text_documents(handle: BinaryIO, source: Source, at: Position) -> Iterator[Document]:
    parts: list[bytes] = []
    size, offset, index, line_no = 0, at.offset, at.index, at.line
    for line in handle:
        parts.append(line)
        size, offset, line_no = size + len(line), offset + len(line), line_no + 1
        if (size >= DOC_BYTES and not line.strip()) or size >= MAX_DOC_BYTES:
            yield Document(_decode(b"".join(parts), source, line_no), index, offset, line_no)
            index, parts, size = index + 1, [], 0
    if parts:
        yield Document(_decode(b"".join(parts), source, line_no), index, offset, line_no)


def _jsonl_text(line: bytes, source: Source, line_no: int, field: str) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        raise InputError(f"{source.key}:{line_no}: not a JSON line") from None
    text = record.get(field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise InputError(f"{source.key}:{line_no}: no string field {field!r} (see --text-field)")
    return text


def _jsonl_documents(handle: BinaryIO, source: Source, field: str, at: Position) -> Iterator[Document]:
    offset, index, line_no = at.offset, at.index, at.line
    for line in handle:
        offset, line_no = offset + len(line), line_no + 1
        if line.strip():
            yield Document(_jsonl_text(line, source, line_no, field), index, offset, line_no)
            index += 1


def _table_documents(source: Source, field: str, at: Position) -> Iterator[Document]:
    """One document per row with text (a null or blank cell is none, as a blank JSONL line),
    from row at.line on."""
    index = at.index
    try:
        rows = check_table(source.path, source.kind, field)
        for row, text in table_rows(source.path, source.kind, field, at.line):
            if text and text.strip():
                yield Document(text, index, source.size * (row + 1) // rows, row + 1)
                index += 1
    except TableError as exc:
        raise InputError(str(exc)) from None


def documents(source: Source, *, field: str, at: Position | None = None) -> Iterator[Document]:
    """The documents of `source` from position `at` (the start when None)."""
    at = at or Position()
    if source.kind in TABLE_SUFFIXES.values():
        yield from _table_documents(source, field, at)
        return
    with open(source.path, "rb") as handle:
        handle.seek(at.offset)
        if source.kind == "text":
            yield from _text_documents(handle, source, at)
        else:
            yield from _jsonl_documents(handle, source, field, at)

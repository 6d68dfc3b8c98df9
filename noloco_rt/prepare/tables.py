"""Parquet files and Arrow files (a `datasets.save_to_disk` folder's) as documents: one row of
the text column per document, read a record batch at a time so a corpus larger than memory
streams through. A resumed read starts at a row (Parquet: at its row group, then skips within
it; Arrow: skips record batches of a memory-mapped file, which reads nothing it skips).

pyarrow (the `data` extra) reads both: it is what `datasets` itself stores with, and alone it
is about a sixth of `datasets`' install (no pandas, aiohttp, dill, multiprocess, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}
BATCH_ROWS = 1024
DATASET_STATE = "state.json"
DATASET_DICT = "dataset_dict.json"


class TableError(ValueError):
    """A table input that cannot be read as documents: one line."""


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401 (the submodules used below)
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise TableError("Parquet and Arrow inputs need pyarrow: pip install 'noloco-rt[data]'") from None
    return pyarrow


def dataset_files(folder: Path) -> list[Path] | None:
    """The Arrow files of a `datasets.save_to_disk` folder in their order (a DatasetDict's
    train split), or None when `folder` is not one."""
    if (folder / DATASET_DICT).is_file():
        splits = _json(folder / DATASET_DICT).get("splits") or []
        if "train" not in splits:
            raise TableError(f"{folder} is a DatasetDict without a train split (splits: {', '.join(map(str, splits))}): "
                             f"name the split's folder, e.g. {folder / str(splits[0]) if splits else folder}")
        return dataset_files(folder / "train")
    if not (folder / DATASET_STATE).is_file():
        return None
    entries = _json(folder / DATASET_STATE).get("_data_files") or []
    files = [folder / entry["filename"] for entry in entries if isinstance(entry, dict) and "filename" in entry]
    if not files:
        raise TableError(f"{folder / DATASET_STATE} lists no data files")
    return files


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TableError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise TableError(f"{path}: not a JSON object")
    return value


def _arrow_reader(path: Path) -> Any:
    """An Arrow IPC reader of either layout (`datasets` writes the stream one)."""
    pa = _pyarrow()
    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)


def _schema_and_rows(path: Path, kind: str) -> tuple[Any, int]:
    pa = _pyarrow()
    try:
        if kind == "parquet":
            meta = pa.parquet.ParquetFile(str(path))
            return meta.schema_arrow, meta.metadata.num_rows
        reader = _arrow_reader(path)
        if hasattr(reader, "num_record_batches"):
            return reader.schema, sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        return reader.schema, sum(batch.num_rows for batch in reader)
    except (pa.ArrowException, OSError) as exc:
        raise TableError(f"{path}: not a readable {kind} file ({str(exc).splitlines()[0]})") from None


def check_table(path: Path, kind: str, field: str) -> int:
    """The row count, after refusing a table without a string column `field` or without rows."""
    pa = _pyarrow()
    schema, rows = _schema_and_rows(path, kind)
    if field not in schema.names:
        raise TableError(f"{path}: no column {field!r} (columns: {', '.join(schema.names)}): name the text "
                         f"column with --text-field")
    column = schema.field(field).type
    if not (pa.types.is_string(column) or pa.types.is_large_string(column)):
        raise TableError(f"{path}: column {field!r} holds {column}, not text: name the text column with --text-field")
    if rows == 0:
        raise TableError(f"{path} has no rows: it holds no document; leave it out of the inputs")
    return rows


def table_rows(path: Path, kind: str, field: str, start: int) -> Iterator[tuple[int, str | None]]:
    """(row, text) from row `start` on; text None for a null cell."""
    pa = _pyarrow()
    try:
        batches = _parquet_batches(path, field, start) if kind == "parquet" else _arrow_batches(path, start)
        for first, batch in batches:
            values = batch.column(batch.schema.get_field_index(field)).to_pylist()
            for offset in range(max(0, start - first), len(values)):
                yield first + offset, values[offset]
    except pa.ArrowException as exc:
        raise TableError(f"{path}: unreadable at row {start} or after ({str(exc).splitlines()[0]})") from None


def _parquet_batches(path: Path, field: str, start: int) -> Iterator[tuple[int, Any]]:
    """(first row, batch) from the row group holding `start` on, the text column only."""
    # pre_buffer off: pyarrow would otherwise read every remaining row group ahead into memory
    table = _pyarrow().parquet.ParquetFile(str(path), pre_buffer=False)
    row, group = 0, 0
    while group < table.num_row_groups and row + table.metadata.row_group(group).num_rows <= start:
        row += table.metadata.row_group(group).num_rows
        group += 1
    groups = list(range(group, table.num_row_groups))
    if not groups:
        return
    for batch in table.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[field]):
        yield row, batch
        row += batch.num_rows


def _arrow_batches(path: Path, start: int) -> Iterator[tuple[int, Any]]:
    """(first row, batch) of the batches that reach `start` or beyond; the file is memory-
    mapped, so a skipped batch is never read."""
    reader = _arrow_reader(path)
    batches = ((reader.get_batch(i) for i in range(reader.num_record_batches))
               if hasattr(reader, "num_record_batches") else iter(reader))
    row = 0
    for batch in batches:
        if row + batch.num_rows > start:
            yield row, batch
        row += batch.num_rows

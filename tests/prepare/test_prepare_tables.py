"""`noloco-rt prepare` on Parquet files, Arrow files and `datasets.save_to_disk` folders: the
same documents as the JSONL of the same texts, streamed a record batch at a time, resumable
mid-table, and one-line refusals. The tables are written here with pyarrow, laid out as
`datasets` writes them (an Arrow stream per file, state.json naming them in order)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from noloco_rt.prepare.documents import Position, expand_inputs
from noloco_rt.prepare.documents import documents as read_documents
from noloco_rt.prepare.tokenizer import train_bpe
from tests.support.prepare_inputs import file_tree, paragraph, run_main

pa = pytest.importorskip("pyarrow", reason="pyarrow is the data extra: pip install -e '.[dev]'")
import pyarrow.parquet as pq  # noqa: E402

ROWS = 300


@pytest.fixture(scope="module")
def texts() -> list[str | None]:
    rng = random.Random(3)
    rows: list[str | None] = [paragraph(rng) for _ in range(ROWS)]
    rows[10], rows[20] = None, "  "  # a null cell and a blank one: no document
    return rows


def _table(texts: list[str | None]):
    return pa.table({"id": list(range(len(texts))), "body": texts})


def _write_stream(path: Path, table, rows_per_batch: int) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            writer.write_batch(batch)


def _save_to_disk(folder: Path, texts: list[str | None], files: int = 2) -> None:
    folder.mkdir(parents=True)
    share = len(texts) // files
    names = []
    for index in range(files):
        name = f"data-{index:05d}-of-{files:05d}.arrow"
        part = texts[index * share:(index + 1) * share if index < files - 1 else len(texts)]
        _write_stream(folder / name, _table(part), rows_per_batch=37)
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_fingerprint": "x", "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"body": {"dtype": "string"}}}))


@pytest.fixture(scope="module")
def tables(tmp_path_factory, texts) -> Path:
    root = tmp_path_factory.mktemp("tables")
    pq.write_table(_table(texts), root / "corpus.parquet", row_group_size=64)  # 5 row groups
    _write_stream(root / "corpus.arrow", _table(texts), rows_per_batch=50)
    _save_to_disk(root / "saved", texts)
    # One tokenizer for every run: a BPE trained by each would learn from its own train split.
    train_bpe((t for t in texts if t), 300).save(str(root / "tokenizer.json"))
    # The same records as JSONL, beside them under the same names (the split hashes the path).
    _write_jsonl(root / "corpus.jsonl", texts)
    share = len(texts) // 2
    _write_jsonl(root / "saved" / "data-00000-of-00002.jsonl", texts[:share])
    _write_jsonl(root / "saved" / "data-00001-of-00002.jsonl", texts[share:])
    return root


def _write_jsonl(path: Path, texts: list[str | None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"body": text}) + "\n" if text and text.strip() else "\n")


def _prepare(capsys, inputs: list[Path], out: Path, tokenizer: Path) -> dict:
    code, _, err = run_main(capsys, "prepare", *map(str, inputs), "--out", str(out), "--tokenizer", str(tokenizer),
                            "--shard-tokens", "2000", "--text-field", "body")
    assert code == 0, err
    return json.loads((out / "prepared.json").read_text())


@pytest.mark.parametrize(("name", "same_as"), [("corpus.parquet", "corpus.jsonl"), ("corpus.arrow", "corpus.jsonl"),
                                               ("saved", "saved/data-*.jsonl")])
def test_tables_give_the_shards_of_the_same_records_as_jsonl(tables, tmp_path, capsys, name, same_as):
    """Shards identical byte for byte: the same documents, split alike (a record's split
    hashes its file's path less the suffix, and its index among the documents)."""
    want = _prepare(capsys, [tables / same_as], tmp_path / "jsonl", tables / "tokenizer.json")
    got = _prepare(capsys, [tables / name], tmp_path / "table", tables / "tokenizer.json")
    assert sum(got["documents"].values()) == ROWS - 2
    assert got["documents"]["val"] > 0 and got["documents"]["train"] > 0
    assert got["documents"] == want["documents"] and got["shards"] == want["shards"]
    shard_files = [s["file"] for split in got["shards"].values() for s in split]
    assert {f: (tmp_path / "table" / f).read_bytes() for f in shard_files} == \
        {f: (tmp_path / "jsonl" / f).read_bytes() for f in shard_files}
    kinds = {source["kind"] for source in got["sources"]}
    assert kinds == ({"parquet"} if name.endswith(".parquet") else {"arrow"})
    if name == "saved":
        assert [Path(s["path"]).name for s in got["sources"]] == ["data-00000-of-00002.arrow",
                                                                   "data-00001-of-00002.arrow"]


@pytest.mark.parametrize("name", ["corpus.parquet", "corpus.arrow"])
def test_reading_resumes_at_a_row_inside_a_row_group_or_batch(tables, texts, name):
    source = expand_inputs([str(tables / name)])[0]
    whole = list(read_documents(source, field="body"))
    assert [d.line for d in whole] == [row + 1 for row, t in enumerate(texts) if t and t.strip()]
    assert [d.text for d in whole] == [t for t in texts if t and t.strip()]
    assert [d.index for d in whole] == list(range(ROWS - 2))
    assert whole[-1].end == source.size and all(a.end <= b.end for a, b in zip(whole, whole[1:], strict=False))
    for done in (0, 1, 20, 63, 64, 65, 149, 297):  # documents taken before the interruption
        at = Position(offset=whole[done - 1].end, index=done, line=whole[done - 1].line) if done else Position()
        resumed = list(read_documents(source, field="body", at=at))
        assert resumed == whole[done:], done


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_table_larger_than_the_read_buffer_streams_in_bounded_memory(tmp_path, suffix):
    """pyarrow's memory pool never holds more than a few record batches of a 24 MB column
    (Arrow files are memory-mapped: the pool holds nothing of them)."""
    text = "x" * 2000
    rows = 12_000
    table = pa.table({"text": [text] * rows})
    if suffix == "parquet":
        pq.write_table(table, tmp_path / "big.parquet", row_group_size=1000, use_dictionary=False,
                       compression="none")
    else:
        _write_stream(tmp_path / "big.arrow", table, rows_per_batch=1000)
    del table
    source = expand_inputs([str(tmp_path / f"big.{suffix}")])[0]
    column_bytes, before = len(text) * rows, pa.total_allocated_bytes()
    peak, count = 0, 0
    for _ in read_documents(source, field="text"):
        count += 1
        if count % 500 == 0:
            peak = max(peak, pa.total_allocated_bytes() - before)
    assert count == rows
    assert peak < column_bytes / 4, (peak, column_bytes)


def test_a_killed_table_run_resumes_to_identical_bytes(tables, tmp_path, capsys):
    args = ["prepare", str(tables / "corpus.parquet"), "--train-bpe", "300", "--shard-tokens", "2000",
            "--text-field", "body"]
    whole = tmp_path / "whole"
    assert run_main(capsys, *args, "--out", str(whole))[0] == 0
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-m", "noloco_rt.cli", *args, "--out", str(out),
                             "--kill-after-shards", "2"], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    progress = json.loads((out / "prepare-progress.json").read_text())
    assert 0 < progress["position"]["line"] < ROWS, progress["position"]  # stopped inside the table
    assert run_main(capsys, *args, "--out", str(out))[0] == 0
    assert file_tree(out) == file_tree(whole)


def test_unreadable_tables_are_refused_in_one_line(tables, tmp_path, capsys):
    pq.write_table(pa.table({"n": [1, 2]}), tmp_path / "numbers.parquet")
    pq.write_table(pa.table({"body": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "dict").mkdir()
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    cases = [
        ([tables / "corpus.parquet", "--text-field", "text"], "no column 'text' (columns: id, body)"),
        ([tmp_path / "numbers.parquet", "--text-field", "n"], "column 'n' holds int64, not text"),
        ([tmp_path / "empty.parquet", "--text-field", "body"], "has no rows"),
        ([tmp_path / "fake.parquet", "--text-field", "body"], "not a readable parquet file"),
        ([tmp_path / "dict", "--text-field", "body"], "a DatasetDict without a train split (splits: test)"),
    ]
    for arguments, message in cases:
        code, _, err = run_main(capsys, "prepare", *map(str, arguments), "--out", str(tmp_path / "out"),
                                "--train-bpe", "300")
        assert code == 2 and message in err and err.count("\n") == 1, (arguments, err)
        assert not (tmp_path / "out").exists()

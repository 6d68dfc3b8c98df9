from __future__ import annotations

import numpy as np
import pytest

from noloco_rt.config import DataConfig
from noloco_rt.data import (
    DataCursor,
    DataError,
    ShardedBatches,
    decode,
    encode,
    is_validation_path,
    load_corpus,
    stdlib_files,
    validation_batches,
)


def test_byte_tokenizer_round_trip():
    text = "def f(x):\n    return x * 2  # ünïcode ✓"
    tokens = encode(text)
    assert all(0 <= t < 256 for t in tokens)
    assert decode(tokens) == text


def test_stdlib_corpus_excludes_tests_and_splits_deterministically():
    files = stdlib_files()
    keys = [key for key, _ in files]
    assert len(keys) > 100
    assert "os.py" in keys
    assert not any(part in ("test", "tests", "site-packages", "idle_test") for k in keys for part in k.split("/"))
    val = {k for k in keys if is_validation_path(k, 5.0)}
    assert 0 < len(val) < len(keys) * 0.15
    assert val == {k for k in keys if is_validation_path(k, 5.0)}  # same answer every time


def test_stdlib_corpus_loads(tmp_path):
    corpus = load_corpus(DataConfig())
    assert corpus.train.dtype == np.uint8 and len(corpus.train) > 1_000_000
    assert len(corpus.val) > 10_000
    assert b"def " in corpus.train[:100_000].tobytes()


def test_text_files_and_globs(tmp_path):
    for i in range(40):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i}\n" * 50)
    corpus = load_corpus(DataConfig(source="files", paths=[str(tmp_path / "*.txt")], val_percent=20))
    assert len(corpus.train) > 0 and len(corpus.val) > 0
    assert b"document number" in corpus.train.tobytes()
    with pytest.raises(DataError, match="matches no file"):
        load_corpus(DataConfig(source="files", paths=[str(tmp_path / "*.md")]))


def test_single_file_holds_out_its_tail(tmp_path):
    path = tmp_path / "one.txt"
    path.write_bytes(bytes(range(256)) * 40)
    corpus = load_corpus(DataConfig(source="files", paths=[str(path)], val_percent=10))
    total = 256 * 40 + 2  # plus the document separator
    assert len(corpus.train) + len(corpus.val) == total
    assert len(corpus.val) == total - int(total * 0.9)


def test_pretokenized_memmap_files(tmp_path):
    tokens = np.arange(10_000, dtype=np.uint16) % 1000
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    corpus = load_corpus(DataConfig(source="tokens", paths=[str(path)], token_dtype="uint16"), vocab_size=1000)
    assert np.array_equal(np.concatenate([corpus.train, corpus.val]), tokens)
    with pytest.raises(DataError, match="vocab_size"):
        load_corpus(DataConfig(source="tokens", paths=[str(path)], token_dtype="uint16"), vocab_size=256)
    wide = np.arange(5000, dtype=np.uint32) + 70_000
    wide_path = tmp_path / "wide.bin"
    wide.tofile(wide_path)
    corpus = load_corpus(DataConfig(source="tokens", paths=[str(wide_path)], token_dtype="uint32"),
                         vocab_size=100_000)
    assert int(corpus.train.max()) < 100_000 and int(corpus.train.min()) == 70_000


def _batches(shard: int, shards: int, count: int, cursor: DataCursor | None = None, tokens=None):
    tokens = tokens if tokens is not None else np.arange(20_000, dtype=np.int64) % 251
    stream = ShardedBatches(tokens, seq_len=16, batch_size=4, shard=shard, num_shards=shards, seed=3, cursor=cursor)
    return stream, [stream.next_batch() for _ in range(count)]


def test_shards_are_disjoint_and_targets_are_shifted_inputs():
    tokens = np.arange(20_000, dtype=np.int64)  # distinct values: a window is identified by its first token
    firsts = []
    for shard in range(3):
        _, batches = _batches(shard, 3, 5, tokens=tokens)
        for inputs, targets in batches:
            assert inputs.shape == (4, 16) and targets.shape == (4, 16)
            assert (targets[:, :-1] == inputs[:, 1:]).all()
            firsts.extend(int(x) for x in inputs[:, 0])
    assert len(firsts) == len(set(firsts))


def test_cursor_resumes_exactly_across_epochs():
    stream, _ = _batches(1, 2, 300)  # far enough to cross an epoch boundary
    assert stream.cursor.epoch >= 1
    saved = DataCursor.from_state_dict(stream.cursor.state_dict())
    expected = [stream.next_batch() for _ in range(5)]
    _, resumed = _batches(1, 2, 5, cursor=saved)
    for (a_in, a_t), (b_in, b_t) in zip(expected, resumed, strict=True):
        assert (a_in == b_in).all() and (a_t == b_t).all()


def test_too_little_data_is_a_clear_error():
    with pytest.raises(DataError, match="too few"):
        ShardedBatches(np.zeros(100, dtype=np.uint8), seq_len=16, batch_size=8, shard=0, num_shards=2, seed=0)


def test_validation_batches_are_fixed():
    tokens = np.arange(5_000, dtype=np.int64) % 256
    a = validation_batches(tokens, seq_len=16, batch_size=4, count=3)
    b = validation_batches(tokens, seq_len=16, batch_size=4, count=3)
    assert len(a) == 3 and all((x[0] == y[0]).all() for x, y in zip(a, b, strict=True))

"""A whole `prepare` run: tokenizer, documents -> shards with checkpoints, then the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noloco_rt.config.prepared_manifest import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    atomic_write_text,
    dtype_for_vocab,
    write_manifest,
)
from noloco_rt.prepare import tokenizer as tok
from noloco_rt.prepare.changes import describe_change
from noloco_rt.prepare.documents import (
    Document,
    InputError,
    Position,
    Source,
    check_readable,
    documents,
    expand_inputs,
    is_validation,
)
from noloco_rt.prepare.packer import ShardPacker
from noloco_rt.prepare.state import PROGRESS_NAME, SPLITS, PrepareState, load_state, save_state

TOKENIZER_NAME = "tokenizer.json"
ENCODE_BATCH = 64  # documents per encode_batch call (tokenizers encodes a batch in parallel)
Progress = Callable[[int, int, str], None]  # (bytes done, bytes in all, what is happening)


@dataclass(frozen=True)
class PrepareOptions:
    inputs: list[str]
    out: Path
    tokenizer: Path | None = None
    train_bpe: int | None = None
    jsonl_field: str = "text"
    val_percent: float = 5.0
    shard_tokens: int = 1 << 26
    eos_token: str | None = None
    force: bool = False
    kill_after_shards: int | None = None
    """Test hook: SIGKILL this process once that many shards are recorded (an honest crash)."""


def fingerprint(options: PrepareOptions, sources: list[Source]) -> dict[str, Any]:
    """Everything the output depends on; a rerun with another fingerprint is a different job."""
    digest = None
    if options.tokenizer is not None:
        try:
            digest = hashlib.sha256(options.tokenizer.read_bytes()).hexdigest()
        except OSError as exc:
            raise InputError(f"cannot read tokenizer {options.tokenizer}: {exc.strerror}") from None
    return {"inputs": [[s.key, s.kind, s.size] for s in sources], "jsonl_field": options.jsonl_field,
            "tokenizer_sha256": digest, "train_bpe": options.train_bpe, "val_percent": options.val_percent,
            "shard_tokens": options.shard_tokens, "eos_token": options.eos_token}


def _our_files(out: Path) -> Iterator[Path]:
    """What prepare writes in OUT (and --force removes); other files there are left alone."""
    fixed = (MANIFEST_NAME, PROGRESS_NAME, TOKENIZER_NAME)
    for path in out.iterdir():
        name = path.name
        if name in fixed or (name.endswith((".bin", ".tmp")) and name.startswith(("train-", "val-", "pending-", *fixed))):
            yield path


def start_state(options: PrepareOptions, arguments: dict[str, Any]) -> PrepareState | None:
    """The state to continue from, a fresh one, or None when OUT already holds this job's result."""
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    if options.force:
        for path in _our_files(out):
            path.unlink()
    manifest = out / MANIFEST_NAME
    if manifest.is_file() and not (out / PROGRESS_NAME).is_file():
        try:
            previous = json.loads(manifest.read_text(encoding="utf-8")).get("arguments")
        except (OSError, ValueError, AttributeError):
            previous = None
        if previous == arguments:
            return None
        changed = describe_change(previous if isinstance(previous, dict) else {}, arguments)
        raise InputError(f"{out} holds data prepared with other arguments ({changed}); use --force to replace it")
    state = load_state(out)
    if state is None:
        return PrepareState(arguments=arguments)
    if state.arguments != arguments:
        raise InputError(f"{out} holds an interrupted prepare with other arguments "
                         f"({describe_change(state.arguments, arguments)}); rerun that command to finish it, "
                         "or use --force to start over")
    return state


def _train_documents(sources: list[Source], options: PrepareOptions, progress: Progress) -> Iterator[str]:
    """The training documents a BPE learns from, reporting how far the reading is."""
    total, before = sum(s.size for s in sources), 0
    what = f"training a byte-level BPE of {options.train_bpe} tokens"
    for source in sources:
        for doc in documents(source, field=options.jsonl_field):
            if doc.index % ENCODE_BATCH == 0:
                progress(before + doc.end, total, f"{what}: reading {source.key}")
            if not is_validation(source.split_key, doc.index, options.val_percent):
                yield doc.text
        before += source.size
    progress(total, total, f"{what}: merging")


def ready_tokenizer(options: PrepareOptions, sources: list[Source], state: PrepareState, progress: Progress):
    """Load, or train, the tokenizer and keep it as OUT/tokenizer.json (once: a rerun reuses it)."""
    path = options.out / TOKENIZER_NAME
    if not state.tokenizer_ready:
        if options.tokenizer is not None:
            tok.load_tokenizer(options.tokenizer)  # a bad file fails here, before anything is written
            text = options.tokenizer.read_text(encoding="utf-8")  # copied as is: export ships it
        else:
            text = tok.train_bpe(_train_documents(sources, options, progress), options.train_bpe).to_str(pretty=True)
        atomic_write_text(path, text)
        state.tokenizer_ready = True
        save_state(options.out, state)
    return tok.load_tokenizer(path)


class _Run:
    """One pass over the inputs from where the state stands, checkpointing after each shard."""

    def __init__(self, options: PrepareOptions, sources: list[Source], state: PrepareState, tokenizer,
                 progress: Progress) -> None:
        self.options, self.sources, self.state, self.tokenizer = options, sources, state, tokenizer
        self.progress = progress
        self.vocab_size = tok.vocab_size(tokenizer)
        self.dtype = dtype_for_vocab(self.vocab_size)
        self.eos_name, self.eos_id = tok.eos_token(tokenizer, options.eos_token)
        self.packer = ShardPacker(options.out, state, dtype=self.dtype, shard_tokens=options.shard_tokens)
        self.total = sum(s.size for s in sources)
        self.started, self.tokens = time.monotonic(), 0
        """This invocation's start and the tokens it encoded: its rate, a resumed run's own."""

    def _done_bytes(self) -> int:
        return sum(s.size for s in self.sources[:self.state.source]) + self.state.position.offset

    def checkpoint(self) -> None:
        stale = self.packer.save_pending()
        save_state(self.options.out, self.state)
        for path in stale:  # only now: the saved state no longer names them
            path.unlink(missing_ok=True)
        shards = sum(len(v) for v in self.state.shards.values())
        if self.options.kill_after_shards is not None and shards >= self.options.kill_after_shards:
            os.kill(os.getpid(), signal.SIGKILL)

    def _batches(self, source: Source) -> Iterator[list[Document]]:
        batch: list[Document] = []
        for doc in documents(source, field=self.options.jsonl_field, at=self.state.position):
            batch.append(doc)
            if len(batch) == ENCODE_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    def read_source(self, source: Source) -> None:
        for batch in self._batches(source):
            encoded = self.tokenizer.encode_batch([d.text for d in batch], add_special_tokens=False)
            self.tokens += sum(len(encoding.ids) for encoding in encoded)
            for doc, encoding in zip(batch, encoded, strict=True):
                split = "val" if is_validation(source.split_key, doc.index, self.options.val_percent) else "train"
                self.state.documents[split] += 1
                self.state.position = Position(offset=doc.end, index=doc.index + 1, line=doc.line)
                if self.packer.add(split, encoding.ids, self.eos_id):
                    self.checkpoint()
            rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
            self.progress(self._done_bytes(), self.total, f"{source.key}, {rate:,.0f} tokens/s")
        self.state.source_documents.append(self.state.position.index)
        self.state.source += 1
        self.state.position = Position()

    def run(self) -> dict[str, Any]:
        done = sum(self.state.documents.values())
        if done or self.state.source:
            shards = sum(len(v) for v in self.state.shards.values())
            self.progress(self._done_bytes(), self.total, f"resumed an interrupted prepare: {done} documents "
                                                          f"and {shards} shards were already written")
        for source in self.sources[self.state.source:]:
            self.read_source(source)
        self.packer.finish()
        self.checkpoint()
        return self.manifest()

    def manifest(self) -> dict[str, Any]:
        state = self.state
        return {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "tokenizer": TOKENIZER_NAME,
            "vocab_size": self.vocab_size, "token_dtype": self.dtype,
            "eos_id": self.eos_id, "eos_token": self.eos_name, "document_separator": "eos_id after every document",
            "val_percent": self.options.val_percent, "shards": state.shards,
            "tokens": {s: sum(x["tokens"] for x in state.shards[s]) for s in SPLITS},
            "documents": state.documents,
            "sources": [{"path": s.key, "kind": s.kind, "bytes": s.size, "documents": n}
                        for s, n in zip(self.sources, state.source_documents, strict=True)],
            "arguments": state.arguments,
        }


def _missing_top(out: Path) -> Path | None:
    """The outermost folder of OUT that does not exist yet (mkdir will make it), or None."""
    if out.exists():
        return None
    top = out
    while not top.parent.exists():
        top = top.parent
    return top


def _take_back(out: Path, made: Path | None) -> None:
    """Remove what a fresh run wrote: the folders it made, else its files in an existing OUT."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    elif out.is_dir():
        for path in _our_files(out):
            path.unlink(missing_ok=True)


def run_prepare(options: PrepareOptions, progress: Progress) -> dict[str, Any] | None:
    """Prepare OUT; returns the manifest written, or None when OUT already held this very result."""
    if (options.tokenizer is None) == (options.train_bpe is None):
        raise InputError("give exactly one of --tokenizer FILE and --train-bpe VOCAB")
    if options.train_bpe is not None and options.train_bpe < tok.MIN_BPE_VOCAB:
        raise InputError(f"--train-bpe {options.train_bpe}: the vocabulary needs at least "
                         f"{tok.MIN_BPE_VOCAB} tokens (256 bytes and the end-of-document token)")
    sources = expand_inputs(options.inputs)
    for source in sources:
        check_readable(source, options.jsonl_field)
    arguments = fingerprint(options, sources)
    made = _missing_top(options.out)
    resuming = (options.out / PROGRESS_NAME).is_file() and not options.force
    state = start_state(options, arguments)  # its refusals come before it writes anything
    if state is None:
        return None
    try:
        tokenizer = ready_tokenizer(options, sources, state, progress)
        manifest = _Run(options, sources, state, tokenizer, progress).run()
    except InputError:
        # A bad input found mid-way (a tokenizer that will not load, a line that is not UTF-8
        # or not JSON): a fresh run leaves nothing behind. A resumed run keeps its progress
        # (its earlier shards are named by it), as does any other failure: a kill, a full disk.
        if not resuming:
            _take_back(options.out, made)
        raise
    write_manifest(options.out, manifest)
    (options.out / PROGRESS_NAME).unlink()
    for path in _our_files(options.out):  # leftovers of a killed run: unfinished temp files
        if path.name.endswith(".tmp") or path.name.startswith("pending-"):
            path.unlink()
    return manifest


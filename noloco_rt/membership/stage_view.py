"""One stage's members as a reader keeps them: read whole once, then only what changed.

A refresh is one pipelined round trip of three cheap commands (the change log past our
cursor, the log's first entry, the oldest heartbeats), plus one HMGET of the members that
changed when any did. Its cost grows with the changes of this stage only, never with the
rest of the run. A reader whose cursor fell off the log's start (or whose Redis came back
empty) reads the stage whole once. Members come back sorted by id: the exchange's matched
groups partition exactly that list (docs/architecture.md §4).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from noloco_rt.membership.layout import TableKeys
from noloco_rt.membership.records import MemberRecord

LOG_PAGE = 1_000
"""Log entries read per round trip; a reader further behind than a few pages reads whole."""
MAX_LOG_PAGES = 4


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id "<ms>-<seq>" as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def needs_full_read(cursor: str | None, first_entry: str | None) -> bool:
    """Whether the log can no longer bring a reader at `cursor` up to date: it never read the
    stage, its cursor was trimmed off the log's start, or the log is gone (Redis restarted
    empty) although the reader had applied entries from it."""
    if cursor is None:
        return True
    if first_entry is None:
        return cursor != EMPTY_CURSOR
    return entry_order(first_entry) > entry_order(cursor)


EMPTY_CURSOR = "0-0"
"""The cursor of a reader that read the stage whole while its log was empty."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def changed_ids(changes: list) -> list[str]:
    """The member ids named by change-log entries (each once, sorted)."""
    return sorted({_text(fields.get(b"id", fields.get("id", b""))) for _, fields in changes} - {""})


@dataclass
class ParsedRows:
    records: dict[str, MemberRecord] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    malformed: int = 0


def parse_rows(rows: Iterable[tuple[bytes | str, bytes | str | None]], stage: int) -> ParsedRows:
    """(id, JSON or None) pairs from the stage's members hash: records, ids that are gone,
    and a count of rows that are not a well-formed record of this stage (skipped)."""
    parsed = ParsedRows()
    for raw_id, raw in rows:
        worker_id = _text(raw_id)
        if raw is None:
            parsed.removed.add(worker_id)
            continue
        try:
            record = MemberRecord.from_json(raw)
        except ValueError:
            parsed.malformed += 1
            continue
        if record.worker_id != worker_id or record.stage != stage:
            parsed.malformed += 1
            continue
        parsed.records[worker_id] = record
    return parsed


@dataclass
class StageView:
    """What one reader knows of one stage; `refresh` does the I/O, the rest is bookkeeping."""

    keys: TableKeys
    stage: int
    records: dict[str, MemberRecord] = field(default_factory=dict)
    cursor: str | None = None
    full_reads: int = 0
    change_reads: int = 0
    malformed: int = 0

    def members(self) -> list[MemberRecord]:
        """Every member of the stage in the view (all states), sorted by id."""
        return [self.records[worker_id] for worker_id in sorted(self.records)]

    def refresh(self, client: redis.Redis, *, prune_before: float) -> list[str]:
        """Bring the view up to date; returns the ids whose last heartbeat is older than
        `prune_before` (candidates for pruning: the caller checks they are really dead).
        Redis errors propagate (the caller keeps the last view)."""
        for _ in range(MAX_LOG_PAGES):
            pipe = client.pipeline(transaction=False)
            self.queue_check(pipe, prune_before=prune_before)
            stale, more = self.take_check(client, pipe.execute())
            if not more:
                return stale
        self._read_whole(client)  # too far behind: cheaper to start over
        return []

    def queue_check(self, pipe: Any, *, prune_before: float) -> None:
        """The three commands of one check (no execute): the log past our cursor, the log's
        first entry, the oldest heartbeats. Batched by benchmarks/membership.py."""
        pipe.xrange(self.keys.log(self.stage), min=f"({self.cursor}" if self.cursor else "-", count=LOG_PAGE)
        pipe.xrange(self.keys.log(self.stage), count=1)
        pipe.zrangebyscore(self.keys.beats(self.stage), "-inf", prune_before, start=0, num=32)

    def take_check(self, client: redis.Redis, replies: list) -> tuple[list[str], bool]:
        """Apply the replies of queue_check (reading changed rows, or everything, as needed):
        (prune candidates, whether more of the log is waiting)."""
        changes, first, stale = replies
        candidates = [_text(s) for s in stale]
        first_entry = _text(first[0][0]) if first else None
        if needs_full_read(self.cursor, first_entry):
            self._read_whole(client)
            return candidates, False
        if changes:
            self._apply_changes(client, changes)
        return candidates, len(changes) >= LOG_PAGE

    def _apply_changes(self, client: redis.Redis, changes: list) -> None:
        changed = changed_ids(changes)
        values = client.hmget(self.keys.members(self.stage), changed) if changed else []
        self.apply_changed(changed, values, last_entry=_text(changes[-1][0]))

    def apply_changed(self, changed: list[str], values: list, *, last_entry: str) -> None:
        """Take the rows (HMGET of `changed`) and move the cursor to `last_entry`."""
        parsed = parse_rows(zip(changed, values, strict=True), self.stage)
        for worker_id in parsed.removed:
            self.records.pop(worker_id, None)
        self.records.update(parsed.records)
        self.malformed += parsed.malformed
        self.cursor = last_entry
        self.change_reads += 1

    def _read_whole(self, client: redis.Redis) -> None:
        # One transaction: the log's last entry and the hash agree, so no change falls between.
        pipe = client.pipeline(transaction=True)
        pipe.xrevrange(self.keys.log(self.stage), count=1)
        pipe.hgetall(self.keys.members(self.stage))
        last, rows = pipe.execute()
        parsed = parse_rows(rows.items(), self.stage)
        self.records = parsed.records
        self.malformed += parsed.malformed
        self.cursor = _text(last[0][0]) if last else EMPTY_CURSOR
        self.full_reads += 1

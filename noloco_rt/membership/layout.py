"""Where the membership table lives in Redis: every key of one run, in one place.

Per worker incarnation, a hash with a TTL of a few heartbeats (the source of truth for
liveness: Redis expires it on its own clock). Per stage, an index that makes reading that
stage cost what the stage holds and nothing more (docs/architecture.md §5):

    <prefix>:<run>:worker:<id>          hash, every field of the record, PEXPIRE ttl
    <prefix>:<run>:stage:<k>:members    hash  id -> the record as JSON, as last published
    <prefix>:<run>:stage:<k>:beats      zset  id -> heartbeat time (finds the dead to prune)
    <prefix>:<run>:stage:<k>:log        stream, one entry {id} per change of :members
    <prefix>:<run>:stages               set of the stages that ever had a member
    <prefix>:<run>:finished:<k>         "a worker of stage k finished" (workers/finish.py)
    <prefix>:<run>:stage:<k>:ready      zset  workers waiting for an outer-step partner (pairing.py)
    <prefix>:<run>:stage:<k>:paired     hash  waiter id -> the worker that took it (pairing.py)

A reader keeps a stage's view by reading the log past its cursor and fetching only the
members that changed; heartbeats touch the worker hash and the beats zset, never the log.
"""

from __future__ import annotations

from dataclasses import dataclass

LOG_MAX_ENTRIES = 10_000
"""Approximate length the change log of one stage is trimmed to; a reader whose cursor
fell off its start reads the stage whole once."""


@dataclass(frozen=True)
class TableKeys:
    prefix: str
    run_id: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{self.run_id}"

    def worker(self, worker_id: str) -> str:
        return f"{self.base}:worker:{worker_id}"

    def members(self, stage: int) -> str:
        return f"{self.base}:stage:{stage}:members"

    def beats(self, stage: int) -> str:
        return f"{self.base}:stage:{stage}:beats"

    def log(self, stage: int) -> str:
        return f"{self.base}:stage:{stage}:log"

    def stages(self) -> str:
        return f"{self.base}:stages"

    def finished(self, stage: int) -> str:
        return f"{self.base}:finished:{stage}"

    def run_finished(self) -> str:
        """String: run.steps of a run whose last stage finished (workers/run_finished.py)."""
        return f"{self.base}:run-finished"

    def ready(self, stage: int) -> str:
        return f"{self.base}:stage:{stage}:ready"

    def high_water(self) -> str:
        """Hash: stage -> the furthest outer step a worker of it reached (membership.high_water)."""
        return f"{self.base}:high-water"

    def durable(self) -> str:
        """Hash: stage -> the outer step of its newest checkpoint in the durable store."""
        return f"{self.base}:durable"

    def paired(self, stage: int) -> str:
        return f"{self.base}:stage:{stage}:paired"


def run_id_of_key(key: str | bytes, prefix: str) -> str | None:
    """The run a key of the table belongs to (`<prefix>:<run>:...`), None for any other key (pure)."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    parts = text.split(":")
    if len(parts) < 3 or parts[0] != prefix or not parts[1]:
        return None
    return parts[1]

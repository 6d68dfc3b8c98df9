"""Pairing by readiness (docs/architecture.md §4, "Drift"): a per-stage queue in Redis of workers that
reached an outer step and wait, a short window, for a partner.

Discovery of who is free now, not a collective: a worker at its outer step takes the
longest-waiting other worker of its stage, or enters the queue until a deadline on
Redis' clock. Each operation is one atomic script, so a waiter is taken by at most one
worker, and a waiter that gives up either leaves the queue untaken or learns who took
it: both sides of a pair always know each other, whatever the timing. Keys (layout.py):
the stage's `ready` zset of "<id>|<outer step>|<exchange addr>" -> deadline (ms), and its
`paired` hash of waiter id -> the taker's entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from noloco_rt.membership.layout import TableKeys

# Take the waiter with the earliest deadline that is not us, or wait until now + window.
_OFFER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, entry in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local id = string.match(entry, '^([^|]*)|')
  if id == ARGV[2] then
    redis.call('ZREM', KEYS[1], entry)
  else
    redis.call('ZREM', KEYS[1], entry)
    redis.call('HSET', KEYS[2], id, ARGV[1])
    return entry
  end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return false
"""

# Leave the queue: nil if nobody took us (we were still there, or expired untaken), else the taker.
_WITHDRAW = """
redis.call('ZREM', KEYS[1], ARGV[1])
local taker = redis.call('HGET', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
return taker
"""

_TAKEN = """
local taker = redis.call('HGET', KEYS[2], ARGV[1])
if taker then redis.call('HDEL', KEYS[2], ARGV[1]) end
return taker
"""


@dataclass(frozen=True)
class ReadyEntry:
    """A worker at an outer step, as the queue holds it."""

    worker_id: str
    outer_step: int
    exchange_addr: str

    def encode(self) -> str:
        return f"{self.worker_id}|{self.outer_step}|{self.exchange_addr}"

    @classmethod
    def decode(cls, raw: bytes | str) -> ReadyEntry:
        """Raises ValueError for anything that is not an entry."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        worker_id, step, addr = text.split("|", 2)
        if not worker_id or not addr:
            raise ValueError(f"malformed ready entry {text!r}")
        return cls(worker_id, int(step), addr)


class PairingQueue:
    """One stage's readiness queue; every call is one round trip (raises redis.RedisError)."""

    def __init__(self, client: redis.Redis, keys: TableKeys, stage: int) -> None:
        self.keys = [keys.ready(stage), keys.paired(stage)]
        self._offer = client.register_script(_OFFER)
        self._withdraw = client.register_script(_WITHDRAW)
        self._taken = client.register_script(_TAKEN)

    def offer(self, me: ReadyEntry, *, window_s: float) -> ReadyEntry | None:
        """The waiter we took, or None: then we wait in the queue for window_s."""
        taken = self._offer(keys=self.keys, args=[me.encode(), me.worker_id, max(1, int(window_s * 1000))])
        return ReadyEntry.decode(taken) if taken else None

    def taken_by(self, me: ReadyEntry) -> ReadyEntry | None:
        """Who took us while we wait, if anyone did (told once)."""
        taker = self._taken(keys=self.keys, args=[me.worker_id])
        return ReadyEntry.decode(taker) if taker else None

    def withdraw(self, me: ReadyEntry) -> ReadyEntry | None:
        """Stop waiting: None if nobody took us, else who did (we must pair with it)."""
        taker = self._withdraw(keys=self.keys, args=[me.encode(), me.worker_id])
        return ReadyEntry.decode(taker) if taker else None

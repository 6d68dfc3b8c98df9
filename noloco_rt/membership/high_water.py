"""A run's high-water mark per stage: the furthest outer step any of its workers reached,
and the outer step of its newest checkpoint in the durable store.

Discovery data, not a collective: workers raise it as they go (one atomic max per outer
step, never a wait), and a worker that finds no live peer of its stage reads it before it
seeds the stage from scratch. A stage whose run is past step 0 and whose replicas all died
must not restart from the seed while the other stages go on (its training would be lost
and the assembled model garbage), so such a worker refuses unless told to.
"""

from __future__ import annotations

from typing import Any

import redis

from noloco_rt.counts import count_in_text
from noloco_rt.membership.layout import TableKeys
from noloco_rt.membership.redis_access import REDIS_ERRORS

# HSET field to ARGV[2] only if that is above what the field holds: a max that concurrent
# writers cannot lower.
_RAISE = """
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > current then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end
return 0
"""


MALFORMED_MARK = -1
"""What `of` returns for a mark that is not a step count (something else wrote it): read as
"past step 0, how far unknown", so a worker refuses to seed the stage (exit 3) unless told to."""


def parse_mark(value: Any) -> int | None:
    """A mark as Redis returns it: a non-negative count, or None when it is not one (pure)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    return count_in_text(text)


class StageHighWater:
    def __init__(self, client: redis.Redis, keys: TableKeys) -> None:
        self.client = client
        self.key = keys.high_water()
        self.durable_key = keys.durable()
        self._raise = client.register_script(_RAISE)
        self._sent: dict[int, int] = {}

    def queue_raise(self, pipe: Any, stage: int, outer_step: int) -> None:
        """Add the raise to a pipeline (the heartbeat's), once per new outer step of ours."""
        if outer_step > self._sent.get(stage, 0):
            self._raise(keys=[self.key], args=[stage, outer_step], client=pipe)
            self._sent[stage] = outer_step

    def forget_sent(self) -> None:
        """After Redis lost its data (a restart), raise again what we had sent."""
        self._sent.clear()

    def record_durable(self, stage: int, outer_step: int) -> None:
        """The stage has a checkpoint of `outer_step` in the durable store (shown by status;
        the store itself is what a resuming worker reads, since Redis may lose this)."""
        try:
            self._raise(keys=[self.durable_key], args=[stage, outer_step])
        except REDIS_ERRORS:
            pass  # informational: the next write raises it again

    def durable_of(self, stage: int) -> int | None:
        """The outer step of the stage's newest durable checkpoint (0: none); None if Redis is unreachable."""
        return self._step(self.durable_key, stage)

    def by_stage(self) -> dict[int, tuple[int, int]]:
        """stage -> (furthest outer step reached, outer step of the newest durable checkpoint),
        for every stage with a mark; {} if Redis is unreachable."""
        try:
            reached, durable = (_as_ints(self.client.hgetall(key)) for key in (self.key, self.durable_key))
        except REDIS_ERRORS:
            return {}
        return {stage: (reached.get(stage, 0), durable.get(stage, 0)) for stage in sorted(reached | durable)}

    def of(self, stage: int) -> int | None:
        """The furthest outer step stage `stage` reached (0: none yet); None if Redis is
        unreachable; MALFORMED_MARK if the mark is not a count."""
        return self._step(self.key, stage)

    def _step(self, key: str, stage: int) -> int | None:
        try:
            value = self.client.hget(key, str(stage))
        except REDIS_ERRORS:
            return None
        if value is None:
            return 0
        mark = parse_mark(value)
        return MALFORMED_MARK if mark is None else mark


def _as_ints(raw: dict[Any, Any]) -> dict[int, int]:
    """The marks that are counts, by stage (others are left out: status shows what it can)."""
    pairs = ((parse_mark(key), parse_mark(value)) for key, value in raw.items())
    return {key: value for key, value in pairs if key is not None and value is not None}

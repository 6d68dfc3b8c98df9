"""Waiting for Redis at start-up: retry, say so every few seconds, give up with one line.

On Kubernetes Redis may come up after the workers, so an unreachable Redis at start is
waited for; a typo in the URL must not leave a worker silently alone forever, so the wait
is bounded. An outage later in the run is another matter: workers train on their cached
view (noloco_rt.membership.table) and never exit for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlparse

from noloco_rt.config.errors import ConfigError
from noloco_rt.logs import EventLog

WARN_EVERY_S = 5.0
RETRY_PAUSE_S = 0.5


class RedisUnreachable(ConfigError):
    """Nothing answered at the Redis URL within the start-up wait: one line, exit 2."""


def redis_address(url: str) -> str:
    """host:port (or the socket path) of a Redis URL, without credentials, for messages."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return parsed.path
    return f"{parsed.hostname or 'localhost'}:{parsed.port or 6379}"


def wait_for_redis(probe: Callable[[], bool], *, url: str, wait_s: float, log: EventLog,
                   warn_every_s: float = WARN_EVERY_S, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> float:
    """Call probe() until it returns True; returns the seconds waited. A warning naming the
    address and the time waited every warn_every_s; RedisUnreachable after wait_s."""
    start = clock()
    next_warning = start
    while not probe():
        waited = clock() - start
        if waited >= wait_s:
            raise RedisUnreachable(
                "network.redis_url", redis_address(url),
                f"nothing answered there for {waited:.0f} s (worker.redis_wait_s, --redis-wait): "
                "is Redis running, and is the URL right?")
        if clock() >= next_warning:
            log.warning("redis_waiting", address=redis_address(url), waited_s=round(waited, 1),
                        gives_up_after_s=wait_s, note="not registered anywhere yet: retrying")
            next_warning += warn_every_s
        sleep(min(RETRY_PAUSE_S, max(wait_s - waited, 0.0)))
    return clock() - start

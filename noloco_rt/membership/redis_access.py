"""Reaching Redis: URLs (redis://, rediss://, unix://), passwords kept out of logs, and a
startup check that tells a refused password or ACL apart from a server that is merely down."""

from __future__ import annotations

from urllib.parse import urlparse

import redis

from noloco_rt.config import ConfigError
from noloco_rt.config.toml_out import redact_url

# An AuthenticationError is a ConnectionError and NOPERM (an ACL change) a ResponseError: during a
# run both are handled like an outage (cached view, retries) but logged as access errors.
ACCESS_ERRORS = (redis.AuthenticationError, redis.exceptions.NoPermissionError)
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.NoPermissionError)


class RedisAccessError(ConfigError):
    """Redis refused our credentials or permissions: a configuration mistake, reported at startup."""


def connect(url: str, *, socket_timeout_s: float = 1.0) -> redis.Redis:
    """A client for redis://, rediss:// (TLS) or unix:// URLs, passwords included, with short timeouts
    so a dead Redis never stalls training for long."""
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis URL must start with redis://, rediss:// or unix://, got {url!r}")
    return redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
                                health_check_interval=0)


def check_access(client: redis.Redis, url: str, *, key_prefix: str = "noloco") -> bool:
    """At startup: raise RedisAccessError (one clear line, exit 2 from the CLI) when Redis refuses
    our password, user or key permissions; True if reachable, False if merely unreachable (the
    caller decides whether to wait for it, as workers do)."""
    try:
        client.ping()
        # ACL users may be limited to some keys (~noloco:*): probe the commands the table uses.
        probe = f"{key_prefix}:access-check"
        client.exists(probe)
        client.zcard(probe)
    except ACCESS_ERRORS as exc:
        raise RedisAccessError("network.redis_url", redact_url(url),
                               f"Redis refused access ({exc}); check the user and password in the URL "
                               f"and the user's ACL (it needs ~{key_prefix}:*)") from None
    except redis.ResponseError as exc:
        if "AUTH" in str(exc).upper():  # e.g. a password sent to a server that has none
            raise RedisAccessError("network.redis_url", redact_url(url), f"Redis refused AUTH ({exc})") from None
        raise
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    return True

"""Reaching Redis: URLs (redis://, rediss://, unix://), passwords kept out of logs, and a
startup check that tells a refused password or ACL apart from a server that is merely down."""

from __future__ import annotations

import socket
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
    except redis.exceptions.InvalidResponse as exc:
        raise NotRedisError("network.redis_url", redact_url(url), f"the server there does not speak Redis ({exc})") \
            from None
    except (redis.ConnectionError, redis.TimeoutError):
        answer = foreign_greeting(url)
        if answer is not None:
            raise NotRedisError("network.redis_url", redact_url(url),
                                f"the server there does not speak Redis (it answered {answer!r})") from None
        return False
    return True


class NotRedisError(ConfigError):
    """Something answers at the Redis URL, but not in Redis's protocol (an HTTP server, say):
    a wrong port, reported at once instead of waited for."""


# RESP replies start with one of these; anything else (b"HTTP/1.0 400", b"SSH-2.0") is not Redis.
RESP_FIRST_BYTES = b"+-:$*_#,(!=%~>|"


def foreign_greeting(url: str, *, timeout_s: float = 1.0) -> str | None:
    """The first bytes a plain-TCP server at `url` answers an inline PING with, when they are
    not a Redis reply; None when it is Redis, silent, refuses, or the URL is TLS or a socket path
    (redis-py alone cannot tell a closed connection from a foreign server)."""
    parsed = urlparse(url)
    if parsed.scheme != "redis":
        return None
    try:
        with socket.create_connection((parsed.hostname or "localhost", parsed.port or 6379), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            first = sock.recv(64)
    except (OSError, ValueError):
        return None
    if not first or first[:1] in RESP_FIRST_BYTES:
        return None
    return first.decode("ascii", "replace").splitlines()[0][:40]

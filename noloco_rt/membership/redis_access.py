"""Reaching Redis: URLs (redis://, rediss://, unix://), passwords kept out of logs, and a
startup check that tells a refused password or ACL apart from a server that is merely down."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

from noloco_rt.config import ConfigError, NetworkConfig
from noloco_rt.config.redaction import redact_url

# An AuthenticationError is a ConnectionError and NOPERM (an ACL change) a ResponseError: during a
# run both are handled like an outage (cached view, retries) but logged as access errors.
ACCESS_ERRORS = (redis.AuthenticationError, redis.exceptions.NoPermissionError)
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.NoPermissionError)


class RedisAccessError(ConfigError):
    """Redis refused our credentials or permissions: a configuration mistake, reported at startup."""


@dataclass(frozen=True)
class RedisTls:
    """The files of a rediss:// connection (network.redis_tls_*); empty: the system's CAs, no client certificate."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def of(cls, network: NetworkConfig) -> RedisTls:
        return cls(network.redis_tls_ca_file, network.redis_tls_cert_file, network.redis_tls_key_file)

    def client_arguments(self) -> dict[str, Any]:
        """redis-py's ssl_* arguments; raises ConfigError naming a file that cannot be read."""
        for name, path in (("ca_file", self.ca_file), ("cert_file", self.cert_file), ("key_file", self.key_file)):
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"network.redis_tls_{name}", path, "no readable file there")
        arguments: dict[str, Any] = {"ssl_cert_reqs": "required"}
        if self.ca_file:
            arguments["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            arguments.update(ssl_certfile=self.cert_file, ssl_keyfile=self.key_file)
        return arguments


def connect(url: str, *, socket_timeout_s: float = 1.0, tls: RedisTls | None = None,
            password: str | None = None) -> redis.Redis:
    """A client for redis://, rediss:// (TLS, verified against tls.ca_file or the system's CAs)
    or unix:// URLs, passwords included, with short timeouts so a dead Redis never stalls
    training for long. `password`: for a URL without one."""
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis URL must start with redis://, rediss:// or unix://, got {redact_url(url)!r}")
    extra = (tls or RedisTls()).client_arguments() if scheme == "rediss" else {}
    if password is not None and url_password(url) is None:
        extra["password"] = password
    return redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
                                health_check_interval=0, **extra)


def url_password(url: str) -> str | None:
    try:
        return urlparse(url).password
    except ValueError:
        return None


def password_from_file(path: str) -> str | None:
    """network.redis_password_file's first line; None when unset. Raises ConfigError naming the
    file (never its content) when it cannot be read or is empty."""
    if not path:
        return None
    try:
        first = Path(path).expanduser().read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("network.redis_password_file", path, f"cannot read it ({type(exc).__name__})") from None
    if not first or not first[0].strip():
        raise ConfigError("network.redis_password_file", path, "its first line is empty: no password there")
    return first[0].strip()


def connect_network(network: NetworkConfig, *, socket_timeout_s: float = 1.0, url: str | None = None) -> redis.Redis:
    """connect() with the run's URL (or `url`), TLS files and password file (read only for a
    URL without a password)."""
    url = url or network.redis_url
    password = password_from_file(network.redis_password_file) if url_password(url) is None else None
    return connect(url, socket_timeout_s=socket_timeout_s, tls=RedisTls.of(network), password=password)


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
                               f"Redis refused access ({exc}); check the user and password (in the URL "
                               f"or network.redis_password_file) "
                               f"and the user's ACL (it needs ~{key_prefix}:*)") from None
    except redis.ResponseError as exc:
        if "AUTH" in str(exc).upper():  # e.g. a password sent to a server that has none
            raise RedisAccessError("network.redis_url", redact_url(url), f"Redis refused AUTH ({exc})") from None
        raise
    except redis.exceptions.InvalidResponse as exc:
        raise NotRedisError("network.redis_url", redact_url(url), f"the server there does not speak Redis ({exc})") \
            from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        refused = _tls_failure(exc) or tls_refusal(client)
        if refused:  # a certificate no wait will fix
            raise RedisAccessError("network.redis_url", redact_url(url), f"the TLS handshake failed ({refused}); "
                                   "check network.redis_tls_ca_file, _cert_file and _key_file") from None
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
TLS_RECORD_TYPES = b"\x15\x16"  # an alert or a handshake: a TLS server answering plain text


def foreign_greeting(url: str, *, timeout_s: float = 1.0) -> str | None:
    """The first bytes a plain-TCP server at `url` answers an inline PING with, when they are
    not a Redis reply; None when it is Redis, silent, refuses, or the URL is TLS or a socket path
    (redis-py alone cannot tell a closed connection from a foreign server)."""
    parsed = urlparse(url)
    if parsed.scheme != "redis":
        return None
    address = (parsed.hostname or "localhost", parsed.port or 6379)
    try:
        sock = socket.create_connection(address, timeout=timeout_s)
    except (OSError, ValueError):
        return None  # nothing listens: down, not foreign
    with sock:
        try:
            sock.sendall(b"PING\r\n")
            first = sock.recv(64)
        except OSError:  # reset or silent: a TLS server does either to plain text
            first = b""
    if first[:1] in TLS_RECORD_TYPES or (not first and _speaks_tls(address, timeout_s)):
        return "in TLS: a TLS port wants a rediss:// URL"
    if not first or first[:1] in RESP_FIRST_BYTES:
        return None
    return first.decode("ascii", "replace").splitlines()[0][:40]


def _speaks_tls(address: tuple[str, int], timeout_s: float) -> bool:
    """Whether the server at `address` completes a TLS handshake (its certificate unchecked: only
    the protocol is asked about)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock, context.wrap_socket(sock):
            return True
    except (OSError, ValueError):
        return False


def _tls_failure(exc: BaseException) -> str | None:
    """An SSL error (a certificate refused either way, a server that does not speak TLS) behind
    redis-py's ConnectionError, as opposed to a server that is down."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and not isinstance(seen, (ssl.SSLZeroReturnError, ssl.SSLEOFError)):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return str(exc) if "SSL" in str(exc) and "EOF" not in str(exc) else None


def tls_refusal(client: redis.Redis, *, timeout_s: float = 2.0) -> str | None:
    """For a rediss:// client whose connection failed: the TLS alert the server sends after the
    handshake, if any. Under TLS 1.3 a server that requires a client certificate refuses it only
    after the handshake, when the first bytes arrive; redis-py may then see a bare reset."""
    kwargs = client.connection_pool.connection_kwargs
    if "ssl_cert_reqs" not in kwargs or client.connection_pool.connection_class.__name__ != "SSLConnection":
        return None
    context = ssl.create_default_context(cafile=kwargs.get("ssl_ca_certs"))
    if kwargs.get("ssl_certfile"):
        context.load_cert_chain(kwargs["ssl_certfile"], kwargs.get("ssl_keyfile"))
    host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            tls.recv(64)  # nothing sent: a refusal comes as an alert, with no reset racing it
    except ssl.SSLError as exc:
        return None if isinstance(exc, (ssl.SSLZeroReturnError, ssl.SSLEOFError)) else str(exc)
    except OSError:
        return None
    return None

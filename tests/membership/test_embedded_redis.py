"""EmbeddedRedis against the real redis-server binary: start, stop, restart, passwords.

The membership tests simulate Redis outages with stop/start on the same port, so this
file pins down what they rely on: the port survives a restart, the table does not
(no persistence), and a stopped server leaves no process behind.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from noloco_rt.membership.embedded_redis import (
    LISTEN_PORTS_FROM,
    EmbeddedRedis,
    ephemeral_ports_start,
    free_port,
    redis_server_binary,
)
from noloco_rt.membership.redis_access import connect


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One server for the tests that only read; tests that stop a server start their own."""
    with EmbeddedRedis() as running:
        yield running


def pid_alive(pid: int) -> bool:
    # stop() reaps its child, so a stopped server's pid no longer exists at all
    # (a zombie would still answer kill(pid, 0)).
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_binary_is_found():
    assert Path(redis_server_binary()).is_file()


def test_url_points_at_a_live_loopback_server(redis_server):
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = connect(redis_server.url)
    assert client.ping()
    assert client.config_get("save")["save"] == ""  # no RDB snapshots
    assert client.config_get("appendonly")["appendonly"] == "no"


def test_stop_reaps_the_process_and_refuses_connections():
    server = EmbeddedRedis().start()
    pid = server.process.pid
    assert pid_alive(pid)
    server.stop()
    assert server.process is None
    assert not pid_alive(pid)
    with pytest.raises(redis.ConnectionError):
        connect(server.url).ping()
    server.stop()  # idempotent


def test_restart_keeps_the_port_and_drops_the_data():
    with EmbeddedRedis() as server:
        client = connect(server.url)
        client.set("k", "v")
        port, pid = server.port, server.process.pid
        server.restart()
        assert server.port == port
        assert server.process.pid != pid and not pid_alive(pid)
        # The same client object reconnects by itself; the key is gone because nothing
        # is persisted: from the members' side a restart is an empty table.
        assert client.ping()
        assert client.get("k") is None


def test_outage_then_start_again_on_the_same_port():
    with EmbeddedRedis() as server:
        client = connect(server.url)
        server.stop()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        server.start()
        assert client.ping()


def test_password_is_required():
    with EmbeddedRedis(password="s3cret") as server:
        assert server.url == f"redis://:s3cret@127.0.0.1:{server.port}/0"
        assert connect(server.url).ping()
        # connect() rather than redis.Redis(): a bare client retries auth errors with
        # back-off for seconds; connect() is what the runtime uses and fails at once.
        with pytest.raises(redis.AuthenticationError):
            connect(f"redis://127.0.0.1:{server.port}/0").ping()
        with pytest.raises(redis.AuthenticationError):
            connect(f"redis://:nope@127.0.0.1:{server.port}/0").ping()


def test_start_failure_says_what_failed_and_shows_the_log():
    # A bound, non-listening socket holds the port: redis-server cannot bind and exits,
    # and PINGs meet a refused connection (fast) rather than a silent listener.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        port = squatter.getsockname()[1]
        server = EmbeddedRedis(port=port)
        with pytest.raises(RuntimeError) as failure:
            server.start(timeout_s=3.0)
        message = str(failure.value)
        assert f"127.0.0.1:{port}" in message
        assert "Address already in use" in message  # from the log tail
        assert server.process is None  # reaped


def test_context_manager_leaves_no_process_and_no_files():
    with EmbeddedRedis() as server:
        pid = server.process.pid
        log_path = server.log_path
        assert log_path.exists()
    assert not pid_alive(pid)
    assert not log_path.parent.exists()


def test_start_is_not_fooled_by_another_server_on_the_port(redis_server):
    # The second process cannot bind and exits, but PING on the port is answered by the
    # first server; start() must notice that the answer is not from its own process.
    impostor = EmbeddedRedis(port=redis_server.port)
    with pytest.raises(RuntimeError, match="exited with code"):
        impostor.start(timeout_s=3.0)
    assert impostor.process is None
    assert connect(redis_server.url).ping()


def test_start_twice_is_refused_and_stop_still_stops(redis_server):
    with EmbeddedRedis() as server:
        pid = server.process.pid
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
    assert not pid_alive(pid)


def test_start_honours_its_timeout():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()  # accepts, never answers: each PING meets a socket timeout
        server = EmbeddedRedis(port=squatter.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(RuntimeError):
            server.start(timeout_s=1.0)
        assert time.monotonic() - started < 2.5


def test_a_random_password_is_required_and_never_on_the_command_line():
    from noloco_rt.membership.embedded_redis import random_password

    password = random_password()
    assert len(password) >= 32 and password != random_password()
    with EmbeddedRedis(password=password) as server:
        assert connect(server.url).ping()
        for url in (f"redis://127.0.0.1:{server.port}/0", f"redis://:wrong@127.0.0.1:{server.port}/0"):
            with pytest.raises(redis.AuthenticationError):
                connect(url).ping()
        # Other local users see every process's arguments (ps): the password is not among them.
        assert password not in Path(f"/proc/{server.process.pid}/cmdline").read_text()
        assert connect(server.url).config_get("protected-mode")["protected-mode"] == "yes"
        # Nor in any file: it reached the server through its standard input.
        assert not [f for f in server.log_path.parent.rglob("*") if f.is_file() and password.encode() in f.read_bytes()]


def test_free_ports_come_from_below_the_range_that_outgoing_connections_take(tmp_path):
    """A port the kernel would give an outgoing connection can be taken between the pick and
    the server's bind: picks stay under that range, spread out, and are free to bind."""
    start = ephemeral_ports_start()
    picks = {free_port() for _ in range(20)}
    assert all(LISTEN_PORTS_FROM <= port < start for port in picks), (sorted(picks), start)
    assert len(picks) > 10  # at random, not one port handed to every caller
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", picks.pop()))
    # The range as the kernel gives it; where it cannot be read, Linux's default start.
    (tmp_path / "range").write_text("1024\t60999\n")
    assert ephemeral_ports_start(tmp_path / "range") == 1024
    assert ephemeral_ports_start(tmp_path / "missing") == 32768
    (tmp_path / "garbage").write_text("none")
    assert ephemeral_ports_start(tmp_path / "garbage") == 32768

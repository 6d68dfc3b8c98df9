"""Bytes before trust cost nothing: a stranger without the CURVE key who reaches a worker's
port, sends ZeroMQ's greeting and a frame declaring 4 GiB, then streams bytes into it, is
dropped at that declaration; the worker's memory does not grow with what it sends.

The worker's receiving sockets run in a process of their own (tests/preauth_server.py), with
the frame bounds a worker of the default config uses (noloco_rt/net/frame_limits.py); the
stranger speaks raw TCP on 127.0.0.1. Without a bound (the control) the process grew by what
was sent: 100 MiB for 100 MiB.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time

import pytest

from noloco_rt.config import load_config
from noloco_rt.net.frame_limits import data_frame_limit_bytes, exchange_frame_limit_bytes

SENT_MIB = 100
GROWTH_BOUND = 64 << 20


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _greeting() -> bytes:
    """ZMTP 3.0's greeting asking for CURVE: signature, version, mechanism, as-server, filler."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\x00") + b"\x00" * 32


def _stream_into_a_huge_frame(port: int) -> int:
    """Greet, declare a 4 GiB frame, stream SENT_MIB into it; the bytes accepted before the
    peer dropped us."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:
        stranger.sendall(_greeting())
        stranger.recv(64)
        try:
            stranger.sendall(bytes([0x06]) + struct.pack(">Q", 4 << 30))  # a long command frame
            chunk = b"\x00" * (1 << 20)
            for _ in range(SENT_MIB):
                stranger.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset or broken pipe: dropped
            pass
        time.sleep(0.5)  # what was sent has been read by then
    return sent


@pytest.fixture
def server_with(request):
    started: list[subprocess.Popen] = []

    def start(limit: str) -> tuple[int, list[int]]:
        process = subprocess.Popen([sys.executable, "-m", "tests.preauth_server", limit], stdout=subprocess.PIPE,
                                   text=True)
        started.append(process)
        return process.pid, [int(p) for p in process.stdout.readline().split()]

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=10)


def test_a_stranger_declaring_a_huge_frame_is_dropped_before_memory_grows(server_with):
    cfg = load_config(environ={})
    limits = {"data": data_frame_limit_bytes(cfg), "exchange": exchange_frame_limit_bytes(cfg)}
    assert limits["data"] < 4 << 20 and limits["exchange"] < 16 << 20  # the default config's bounds
    pid, ports = server_with(str(max(limits.values())))
    for port in ports:
        before = _rss(pid)
        sent = _stream_into_a_huge_frame(port)
        assert sent < GROWTH_BOUND, f"{sent >> 20} MiB accepted before the drop"
        assert _rss(pid) - before <= GROWTH_BOUND


def test_without_a_bound_the_data_socket_grows_with_what_a_stranger_sends(server_with):
    pid, (data_port, _) = server_with("none")
    before = _rss(pid)
    assert _stream_into_a_huge_frame(data_port) == SENT_MIB << 20
    assert _rss(pid) - before > GROWTH_BOUND  # the control: what the bound prevents

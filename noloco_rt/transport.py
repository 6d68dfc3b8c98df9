"""ZeroMQ transport: a data socket and an exchange socket per worker.

Data path: each worker binds one PULL socket and keeps one PUSH socket per peer it
sends to. PUSH sockets use IMMEDIATE (nothing is queued for a peer that is not
connected) and a high-water mark (a full queue pushes back on the sender), so a
send either hands the message to a live connection within its timeout or fails and
the caller routes elsewhere. Frames go out with copy=False.

Exchange path: a ROUTER socket served by a background thread answers requests with
a handler; a request is one DEALER round trip with a deadline.

Sockets are created from a zmq.Context passed in; bind and advertise addresses are
separate (bind 0.0.0.0, advertise the pod or public IP).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

Frames = Sequence[Any]  # bytes, memoryview or zmq.Frame


def bind_random_or_fixed(socket: zmq.Socket, host: str, port: int) -> int:
    """Bind to host:port (port 0 picks a free one); returns the port bound."""
    if port == 0:
        return socket.bind_to_random_port(f"tcp://{host}", min_port=20000, max_port=60000, max_tries=200)
    socket.bind(f"tcp://{host}:{port}")
    return port


class DataSocket:
    """Receives everything addressed to this worker; sends to peers by address."""

    def __init__(self, ctx: zmq.Context, *, bind_host: str, port: int, advertise_host: str,
                 high_water_mark: int = 64) -> None:
        self.ctx = ctx
        self.high_water_mark = high_water_mark
        self.inbound = ctx.socket(zmq.PULL)
        self.inbound.setsockopt(zmq.RCVHWM, high_water_mark)
        self.inbound.setsockopt(zmq.LINGER, 0)
        self.port = bind_random_or_fixed(self.inbound, bind_host, port)
        self.address = f"tcp://{advertise_host or bind_host}:{self.port}"
        self._outbound: dict[str, zmq.Socket] = {}

    def _socket_to(self, address: str) -> zmq.Socket:
        sock = self._outbound.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self.high_water_mark)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            sock.connect(address)
            self._outbound[address] = sock
        return sock

    def send(self, address: str, frames: Frames, *, timeout_s: float) -> bool:
        """Queue a multipart message to `address`; False if no live connection took it in time."""
        sock = self._socket_to(address)
        try:  # the common case: room in the queue, no poll syscall needed
            sock.send_multipart(list(frames), flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            pass
        if not sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return False
        try:
            sock.send_multipart(list(frames), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def receive(self, timeout_s: float) -> list[zmq.Frame] | None:
        try:  # a message is usually waiting under load: skip the poll syscall
            return self.inbound.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass
        if not self.inbound.poll(int(timeout_s * 1000), zmq.POLLIN):
            return None
        return self.inbound.recv_multipart(copy=False)

    def forget(self, address: str) -> None:
        """Drop the connection to a peer that failed (pending messages to it are discarded)."""
        sock = self._outbound.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def close(self) -> None:
        for address in list(self._outbound):
            self.forget(address)
        self.inbound.close(linger=0)


Handler = Callable[[list[zmq.Frame]], list[Any]]


class ExchangeServer:
    """Answers exchange requests from a background thread, so serving never blocks training.

    The handler gets the request frames and returns the reply frames; it must not raise
    for bad input (it should answer with an error message instead).
    """

    def __init__(self, ctx: zmq.Context, *, bind_host: str, port: int, advertise_host: str,
                 handler: Handler) -> None:
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 16)
        self.socket.setsockopt(zmq.SNDHWM, 16)
        self.port = bind_random_or_fixed(self.socket, bind_host, port)
        self.address = f"tcp://{advertise_host or bind_host}:{self.port}"
        self.handler = handler
        self.requests_served = 0
        self.handler_errors = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="exchange-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(100, zmq.POLLIN):
                continue
            frames = self.socket.recv_multipart(copy=False)
            if len(frames) < 2:
                continue
            identity, body = frames[0], frames[1:]
            try:
                reply = self.handler(body)
            except Exception as exc:  # last line of defence: the serving thread must outlive any request
                self.handler_errors += 1
                self.last_error = repr(exc)
                continue
            self.requests_served += 1  # before the send: the requester may look right after
            try:
                self.socket.send_multipart([identity, *reply], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # the requester is gone or saturated; it will time out and try another peer

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.socket.close(linger=0)


def request(ctx: zmq.Context, address: str, frames: Frames, *, timeout_s: float) -> list[zmq.Frame] | None:
    """One request/reply round trip to an ExchangeServer; None if no reply within timeout_s."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    try:
        sock.connect(address)
        deadline = time.monotonic() + timeout_s
        if not sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return None
        sock.send_multipart(list(frames), copy=False)
        remaining = max(0.0, deadline - time.monotonic())
        if not sock.poll(int(remaining * 1000), zmq.POLLIN):
            return None
        return sock.recv_multipart(copy=False)
    finally:
        sock.close(linger=0)

"""ZeroMQ transport: a data socket and an exchange socket per worker.

Data path: each worker binds one PULL socket and keeps one PUSH socket per peer it
sends to. PUSH sockets use IMMEDIATE (nothing is queued for a peer that is not
connected) and a high-water mark (a full queue pushes back on the sender): `offer` hands a
message to a live connection with room now or says no. The data link
(noloco_rt/net/data_link.py) drives these sockets from its own thread, waits for room up to
its send timeout and reports failures, so the caller routes elsewhere. Frames go out with
copy=False.

Exchange path: a ROUTER socket served by a background thread answers requests with
a handler; a request is one DEALER round trip with a deadline.

Sockets are created from a zmq.Context passed in; bind and advertise addresses are
separate (bind 0.0.0.0, advertise the pod or public IP).

CURVE (noloco_rt.net.curve explains the cluster key scheme): `enable_curve(ctx, keys)` attaches
the run's keys to a context and starts its ZAP handler, which admits only clients holding
the cluster key. Every socket made here from that context then gets the keys (servers:
the PULL and the ROUTER; clients: the PUSH and the DEALER), so callers that only pass a
context (workers/exchange.py) need no change; `curve=` overrides per socket. A server
socket refuses to be made with keys but no ZAP handler (it would admit any key pair).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from noloco_rt.logs import get_logger
from noloco_rt.net.curve import CurveKeys

Frames = Sequence[Any]  # bytes, memoryview or zmq.Frame


ZAP_DOMAIN = "noloco"


@dataclass
class _CurveGate:
    """ZAP credentials provider: admits the authorised client keys, counts the rest."""

    keys: CurveKeys
    authenticator: ThreadAuthenticator | None = None
    denied: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, domain: str, client_key: bytes) -> bool:
        if client_key in self.keys.authorized_clients:
            return True
        with self._lock:
            self.denied += 1
            denied = self.denied
        if denied == 1 or denied % 100 == 0:  # bounded logging: an attacker may retry forever
            get_logger().warning("curve_client_denied", client_key=client_key.decode(errors="replace"),
                                 denied_total=denied)
        return False


_GATES: weakref.WeakKeyDictionary[zmq.Context, _CurveGate] = weakref.WeakKeyDictionary()


def enable_curve(ctx: zmq.Context, keys: CurveKeys | None) -> None:
    """Attach the run's keys to `ctx` and start its ZAP handler; no-op for None (CURVE off).
    Call disable_curve(ctx) before ctx.term()."""
    if keys is None or ctx in _GATES:
        return
    gate = _CurveGate(keys)
    authenticator = ThreadAuthenticator(ctx)
    authenticator.start()
    authenticator.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=gate)
    gate.authenticator = authenticator
    _GATES[ctx] = gate


def disable_curve(ctx: zmq.Context) -> None:
    """Stop the ZAP handler of `ctx` (its socket would keep ctx.term() waiting)."""
    gate = _GATES.pop(ctx, None)
    if gate is not None and gate.authenticator is not None:
        gate.authenticator.stop()


def curve_keys(ctx: zmq.Context) -> CurveKeys | None:
    """The keys enabled on `ctx`, or None."""
    gate = _GATES.get(ctx)
    return gate.keys if gate is not None else None


def apply_curve(socket: zmq.Socket, keys: CurveKeys | None, *, server: bool) -> None:
    """Set the CURVE options on a socket before it binds or connects; no-op for None."""
    if keys is None:
        return
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public_key)
    if server:
        gate = _GATES.get(socket.context)
        if gate is None or gate.keys != keys:
            raise RuntimeError("a CURVE server socket needs enable_curve(ctx, keys) first: without a ZAP "
                               "handler any client key pair would be admitted")
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no handler answering: refuse, never admit
    else:
        socket.setsockopt(zmq.CURVE_SERVERKEY, keys.public_key)


class SendFaults(Protocol):
    """Faults injected into a data socket's outgoing messages, for fault testing (the chaos
    tooling supplies one; production sockets have none)."""

    def should_drop(self) -> bool:
        """True: lose this message (the sender is told it went; only its deadline will tell)."""
        ...

    def hold(self) -> None:
        """Delay this message before it is queued, as a slow link would."""
        ...


def bind_random_or_fixed(socket: zmq.Socket, host: str, port: int) -> int:
    """Bind to host:port (port 0 picks a free one); returns the port bound."""
    if port == 0:
        return socket.bind_to_random_port(f"tcp://{host}", min_port=20000, max_port=60000, max_tries=200)
    socket.bind(f"tcp://{host}:{port}")
    return port


def advertised_address(host: str, port: int) -> str:
    """The address peers connect to, as published in Redis: the bound port, or the public port
    a router forwards to it (network.advertise_*_port)."""
    return f"tcp://{host}:{port}"


HANDSHAKE_LIMIT_MS = 10_000
"""A connection that has not finished ZeroMQ's handshake (CURVE's included) this long after it
opened is closed: what a stranger sent into it is freed. An honest one takes a few round trips;
ZeroMQ's default is 30 s."""


def bound_strangers(sock: zmq.Socket, max_frame_bytes: int | None) -> None:
    """What a peer costs a receiving socket before it is trusted: no frame over `max_frame_bytes`
    (dropped at its declaration, before allocation; None: no bound, for tests and tools) and
    no handshake held open past HANDSHAKE_LIMIT_MS."""
    if max_frame_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_LIMIT_MS)


class DataSocket:
    """Receives everything addressed to this worker (`inbound`); sends to peers by address.
    Used by one thread: the data link's."""

    def __init__(self, ctx: zmq.Context, *, bind_host: str, port: int, advertise_host: str,
                 advertise_port: int = 0, high_water_mark: int = 64, curve: CurveKeys | None = None,
                 faults: SendFaults | None = None, max_frame_bytes: int | None = None) -> None:
        """`max_frame_bytes`: a peer whose frame declares more is dropped before anything is
        allocated (noloco_rt/net/frame_limits.py; None: no bound, for tests and tools)."""
        self.ctx = ctx
        self.faults = faults
        self.high_water_mark = high_water_mark
        self.curve = curve or curve_keys(ctx)
        self.inbound = ctx.socket(zmq.PULL)
        apply_curve(self.inbound, self.curve, server=True)
        bound_strangers(self.inbound, max_frame_bytes)
        self.inbound.setsockopt(zmq.RCVHWM, high_water_mark)
        self.inbound.setsockopt(zmq.LINGER, 0)
        self.port = bind_random_or_fixed(self.inbound, bind_host, port)
        self.address = advertised_address(advertise_host or bind_host, advertise_port or self.port)
        self._outbound: dict[str, zmq.Socket] = {}

    def _socket_to(self, address: str) -> zmq.Socket:
        sock = self._outbound.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            apply_curve(sock, self.curve, server=False)
            sock.setsockopt(zmq.SNDHWM, self.high_water_mark)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            sock.connect(address)
            self._outbound[address] = sock
        return sock

    def offer(self, address: str, frames: Frames) -> bool:
        """Queue a multipart message to `address` without waiting; False if no live connection
        has room for it now (poll `outbound(address)` for POLLOUT and offer again)."""
        if self.faults is not None:
            if self.faults.should_drop():
                return True  # lost on the way: the sender finds out only by its deadline
            self.faults.hold()
        try:
            self._socket_to(address).send_multipart(list(frames), flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def outbound(self, address: str) -> zmq.Socket:
        """The PUSH socket to `address` (made on first use), for polling."""
        return self._socket_to(address)

    def outbound_if_open(self, address: str) -> zmq.Socket | None:
        """The PUSH socket to `address` if there is one (never makes one)."""
        return self._outbound.get(address)

    def forget(self, address: str) -> None:
        """Drop the connection to a peer that failed (pending messages to it are discarded)."""
        sock = self._outbound.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def close(self, *, linger_ms: int = 0) -> None:
        """Close every socket; ZeroMQ goes on delivering what it has queued to live peers for
        up to `linger_ms` (the context's term() waits that long at most)."""
        for address, sock in list(self._outbound.items()):
            sock.close(linger=max(0, linger_ms))
            del self._outbound[address]
        self.inbound.close(linger=0)


Handler = Callable[[list[zmq.Frame]], list[Any]]

REPLY_FLUSH_S = 0.5
"""How long a stopping exchange server lets queued replies leave."""


class ExchangeServer:
    """Answers exchange requests from a background thread, so serving never blocks training.

    The handler gets the request frames and returns the reply frames; it must not raise
    for bad input (it should answer with an error message instead).
    """

    def __init__(self, ctx: zmq.Context, *, bind_host: str, port: int, advertise_host: str,
                 handler: Handler, advertise_port: int = 0, curve: CurveKeys | None = None,
                 max_frame_bytes: int | None = None) -> None:
        self.curve = curve or curve_keys(ctx)
        self.socket = ctx.socket(zmq.ROUTER)
        apply_curve(self.socket, self.curve, server=True)
        bound_strangers(self.socket, max_frame_bytes)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 16)
        self.socket.setsockopt(zmq.SNDHWM, 16)
        self.port = bind_random_or_fixed(self.socket, bind_host, port)
        self.address = advertised_address(advertise_host or bind_host, advertise_port or self.port)
        self.handler = handler
        self.requests_served = 0
        self.handler_errors = 0
        self.last_error = ""
        self._stop = threading.Event()
        # The thread sleeps until a request comes or stop() writes here: a timed poll would
        # wake it ten times a second, each time taking a core from the training thread.
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="exchange-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._stop_read, zmq.POLLIN)
        while not self._stop.is_set():
            if self.socket not in dict(poller.poll()):
                continue  # stop() wrote: the loop's test ends it
            frames = self.socket.recv_multipart(copy=False)
            if len(frames) < 2:
                continue
            identity, body = frames[0], frames[1:]
            try:
                reply = self.handler(body)
            except Exception as exc:  # last line of defence: the serving thread must outlive any request
                self._handler_failed(exc)
                continue
            self.requests_served += 1  # before the send: the requester may look right after
            try:
                self.socket.send_multipart([identity, *reply], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # the requester is gone or saturated; it will time out and try another peer

    def _handler_failed(self, exc: Exception) -> None:
        self.handler_errors += 1
        self.last_error = repr(exc)
        # Bounded: a peer that keeps sending the request that breaks the handler must not flood the log.
        if self.handler_errors == 1 or self.handler_errors % 100 == 0:
            get_logger().error("exchange_handler_failed", error=self.last_error,
                               handler_errors_total=self.handler_errors, exc_info=exc)

    def stop(self, timeout_s: float = 2.0, *, flush_s: float = REPLY_FLUSH_S) -> None:
        """Stop serving; replies already queued still leave for up to flush_s (an
        acknowledgement a partner decides on, lost at our exit, would leave it unsure)."""
        if not self._stop.is_set():
            self._stop.set()
            os.write(self._stop_write, b"\0")
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.socket.close(linger=int(flush_s * 1000))
        # Not while a handler that outlived timeout_s may still poll the pipe (a daemon: it dies with us).
        if not self._thread.is_alive() and self._stop_read >= 0:
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._stop_read = self._stop_write = -1


def request(ctx: zmq.Context, address: str, frames: Frames, *, timeout_s: float,
            curve: CurveKeys | None = None) -> list[zmq.Frame] | None:
    """One request/reply round trip to an ExchangeServer; None if no reply within timeout_s
    (a refused CURVE handshake looks the same: no connection, no reply)."""
    sock = ctx.socket(zmq.DEALER)
    apply_curve(sock, curve or curve_keys(ctx), server=False)
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

"""The data socket on a thread of its own, so that transfer overlaps compute (docs/architecture.md §3).

The training thread never waits on the network: `send` hands a message to ZeroMQ or queues
it, and returns; `receive` takes what the link thread has already received and decoded.
A message whose bytes are ready, to a peer with nothing queued ahead of it and room in its
connection, goes to ZeroMQ from the caller's thread at once: waking the link thread for it
cost the training thread the GIL for as long as the link thread's turn ran (a send took
0.4 ms of the training thread on 2 CPU cores, 0.2 ms at once: a tiny stage's microbatch
is 10 ms). Everything
else (a device copy to wait for, a full connection, order behind queued messages) is
queued for the link thread, woken through a pipe. The outbound sockets and the queues are
touched under one lock, never held across a poll; the poll watches only peers with
messages queued, which the caller's thread then leaves alone, so no socket is used by two
threads at once. The inbound socket is the link thread's alone.

A send is either handed to ZeroMQ within `send_timeout_s` or reported back as failed:
the failure is delivered by `receive`, on the training thread, as a `SendFailed` whose
`on_failure` the caller supplied. A peer that fails a send has its connection closed and
everything still waiting for it fails too (the caller blacklists it and routes elsewhere).
Messages to one peer keep their order. `close` stops taking sends, flushes what was
accepted within its deadline (ZeroMQ lingers on for the rest of it), and reports what
could not be sent, so nothing accepted is lost without a count.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from noloco_rt.logs import get_logger
from noloco_rt.net.transport import DataSocket, Frames

IDLE_POLL_S = 0.1
"""Longest the link thread sleeps with nothing to do (it wakes at once on a send)."""
RECEIVE_BATCH = 16
"""Messages received per turn before pending sends get their turn again."""


@dataclass
class _Send:
    address: str
    frames: Frames
    ready: Callable[[], None] | None
    """Waited for before the frames are read (a device-to-host copy finishing), on the link thread."""
    on_failure: Callable[[], None] | None
    deadline: float


@dataclass(frozen=True)
class SendFailed:
    """A send that no live connection took in time, or that the link could not send before it closed."""

    address: str
    on_failure: Callable[[], None] | None

    def handle(self) -> None:
        if self.on_failure is not None:
            self.on_failure()


@dataclass
class LinkStats:
    sent: int = 0
    """Messages handed to ZeroMQ."""
    sent_directly: int = 0
    """Of `sent`: handed over on the caller's thread, without the link thread's turn."""
    failed: int = 0
    """Sends reported back as failed (a dead or saturated peer, or the link closing)."""
    received: int = 0
    unsent_at_close: int = 0
    """Of `failed`: sends still waiting when the close deadline passed."""


def _identity(frames: list[zmq.Frame]) -> Any:
    return frames


class DataLink:
    """A DataSocket served by a background thread; `send`, `receive` and `close` are for one
    (the training) thread."""

    def __init__(self, socket: DataSocket, *, decode: Callable[[list[zmq.Frame]], Any] = _identity,
                 send_timeout_s: float = 1.0, inbox_limit: int | None = None) -> None:
        self.socket = socket
        self.decode = decode
        """Runs on the link thread on every message received; what it returns is what
        `receive` gives (it must not raise for bad input: return the rejection instead)."""
        self.send_timeout_s = send_timeout_s
        self.inbox_limit = inbox_limit or socket.high_water_mark
        self.stats = LinkStats()
        self._requests: collections.deque[_Send] = collections.deque()
        self._lock = threading.Lock()
        """Held while the outbound sockets, `_requests` or `_pending` are used; never across a poll."""
        self._direct = socket.faults is None
        """Sends from the caller's thread (off while faults are injected: a held send would stall training)."""
        self._pending: dict[str, collections.deque[_Send]] = {}
        self._events: queue.Queue[Any] = queue.Queue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._closing = threading.Event()
        self._sleeping = False
        """The link thread is (about to be) in its poll; only then does a send need to wake it."""
        self._poller = zmq.Poller()
        self._polled_out: set[str] = set()
        self._flush_deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name="data-link", daemon=True)

    @property
    def address(self) -> str:
        return self.socket.address

    @property
    def curve(self) -> Any:
        return self.socket.curve

    def start(self) -> DataLink:
        self._thread.start()
        return self

    # -- the training thread's side ---------------------------------------------------------

    def send(self, address: str, frames: Frames, *, ready: Callable[[], None] | None = None,
             on_failure: Callable[[], None] | None = None) -> None:
        """Hand a message to ZeroMQ or queue it, and return at once; a failure comes back
        through `receive`."""
        item = _Send(address, frames, ready, on_failure, time.monotonic() + self.send_timeout_s)
        if self._closing.is_set():
            self._fail([item])
            return
        if ready is None and self._direct and self._send_now(address, frames):
            return
        self._requests.append(item)
        if self._sleeping:  # a busy link thread takes it on its next turn: no system call per send
            self._wake()

    def _send_now(self, address: str, frames: Frames) -> bool:
        """On the caller's thread: the message to ZeroMQ if nothing is queued ahead of it (order
        per peer holds) and the peer's connection has room; False: queue it for the link thread."""
        with self._lock:
            if self._requests or address in self._pending or self._closing.is_set():
                return False
            try:
                if not self.socket.offer(address, frames):
                    return False
            except zmq.ZMQError:
                return False  # the link thread meets it again, and fails the peer as it does for any send
            self.stats.sent += 1
            self.stats.sent_directly += 1
            return True

    def receive(self, timeout_s: float) -> Any | None:
        """The next decoded message or SendFailed, waiting up to timeout_s; None if nothing came."""
        try:
            return self._events.get(timeout=timeout_s) if timeout_s > 0 else self._events.get_nowait()
        except queue.Empty:
            return None

    def close(self, flush_s: float = 2.0) -> LinkStats:
        """Stop taking sends; send what was accepted within flush_s (ZeroMQ lingers on for what
        is left of it); the rest is counted as unsent. The sockets are closed."""
        self._flush_deadline = time.monotonic() + flush_s
        self._closing.set()
        self._wake()
        if self._thread.ident is None:  # never started: nothing was sent
            self.socket.close()
        else:
            self._thread.join(flush_s + 2.0)
        if self._thread.is_alive():  # its sockets and pipe stay open: the thread may still use them
            get_logger().error("data_link_stuck", pending=self._pending_count())
            return self.stats
        os.close(self._wake_read)
        os.close(self._wake_write)
        return self.stats

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the thread has wake-ups waiting already) or closed

    # -- the link thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    self._take_requests()
                self._wait_for_copies()
                with self._lock:
                    self._send_pending()
                if self._closing.is_set() and (not self._pending_count() or time.monotonic() >= self._flush_deadline):
                    break
                self._wait()
                self._receive_some()
        except Exception as exc:  # noqa: BLE001 - a bug here must be loud, not a silent stall
            get_logger().error("data_link_failed", error=repr(exc), exc_info=exc)
        finally:
            self._shut()

    def _take_requests(self) -> None:
        while self._requests:
            item = self._requests.popleft()
            self._pending.setdefault(item.address, collections.deque()).append(item)

    def _wait_for_copies(self) -> None:
        """The copies of the messages next in line (outside the lock: one may take a while)."""
        for waiting in list(self._pending.values()):
            if waiting and (item := waiting[0]).ready is not None:
                item.ready()
                item.ready = None

    def _send_pending(self) -> None:
        """Hand each peer's waiting messages to ZeroMQ in order, while it has room, up to one
        whose copy is still to be waited for (the next turn waits for it, outside the lock)."""
        now = time.monotonic()
        for address in list(self._pending):
            waiting = self._pending[address]
            while waiting:
                item = waiting[0]
                if item.ready is not None:
                    break
                if not self.socket.offer(address, item.frames):
                    if now >= item.deadline:
                        self._fail_peer(address)
                    break
                waiting.popleft()
                self.stats.sent += 1
            if not waiting:
                self._pending.pop(address, None)

    def _fail_peer(self, address: str) -> None:
        """A peer that took nothing in time: its connection is closed, all it was owed fails."""
        self._fail(list(self._pending.pop(address, ())))
        if address in self._polled_out:
            self._poller.register(self.socket.outbound(address), 0)
            self._polled_out.discard(address)
        self.socket.forget(address)

    def _fail(self, items: list[_Send]) -> None:
        for item in items:
            self.stats.failed += 1
            self._events.put(SendFailed(item.address, item.on_failure))

    def _wait(self) -> None:
        """Until a message arrives (when the inbox has room), a waiting peer has room, a send is
        queued, or the nearest send deadline."""
        poller = self._poller
        poller.register(self._wake_read, zmq.POLLIN)
        room = self._events.qsize() < self.inbox_limit
        poller.register(self.socket.inbound, zmq.POLLIN if room and not self._closing.is_set() else 0)
        timeout_s = IDLE_POLL_S if room else 0.01  # a full inbox is re-checked soon
        with self._lock:  # registered: only peers with sends queued, which the caller's thread leaves alone
            self._poll_out_for(set(self._pending))
        for waiting in self._pending.values():
            timeout_s = min(timeout_s, max(0.0, waiting[0].deadline - time.monotonic()))
        if self._closing.is_set():
            timeout_s = min(timeout_s, max(0.0, self._flush_deadline - time.monotonic()))
        self._sleeping = True
        try:
            if self._requests:  # a send came in after this turn took them: no sleeping
                timeout_s = 0.0
            ready = dict(poller.poll(int(timeout_s * 1000)))
        finally:
            self._sleeping = False
        if self._wake_read in ready:
            try:
                while os.read(self._wake_read, 4096):
                    pass
            except BlockingIOError:
                pass

    def _poll_out_for(self, addresses: set[str]) -> None:
        """Poll exactly the peers with sends waiting for room."""
        for address in self._polled_out - addresses:
            if (sock := self.socket.outbound_if_open(address)) is not None:
                self._poller.register(sock, 0)
        for address in addresses - self._polled_out:
            self._poller.register(self.socket.outbound(address), zmq.POLLOUT)
        self._polled_out = set(addresses)

    def _receive_some(self) -> None:
        if self._closing.is_set():
            return
        for _ in range(RECEIVE_BATCH):
            if self._events.qsize() >= self.inbox_limit:
                return
            try:
                frames = self.socket.inbound.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.stats.received += 1
            try:
                self._events.put(self.decode(frames))
            except Exception as exc:  # noqa: BLE001 - decode must not raise; if it does, drop the message, keep serving
                get_logger().error("data_link_decode_failed", error=repr(exc))

    def _shut(self) -> None:
        """On the link thread: what could not be sent is counted; ZeroMQ keeps delivering what it
        took for the rest of the flush time."""
        with self._lock:
            self._shut_sockets()

    def _shut_sockets(self) -> None:
        self._take_requests()
        unsent = [item for waiting in self._pending.values() for item in waiting]
        self._pending.clear()
        self.stats.unsent_at_close += len(unsent)
        self._fail(unsent)
        linger_s = self._flush_deadline - time.monotonic() if self._closing.is_set() else 0.0
        self.socket.close(linger_ms=int(max(0.0, linger_s) * 1000))

    def _pending_count(self) -> int:
        return len(self._requests) + sum(len(waiting) for waiting in self._pending.values())

"""Our snapshot streamed to a partner chunk by chunk, while later chunks are still compressing.

A ChunkFeed holds one round's encoded chunks in order: encoder threads append to it, and
each partner's pusher sends chunk i as soon as it is there, without waiting for the
acknowledgement of chunk i-1 (at most WINDOW unacknowledged), so compressing, the wire and
the partner's decoding all work at once. A push succeeds once the partner acknowledged
every chunk (each validated and placed); it fails on a refused chunk, or when nothing moves
(no chunk to send, no room to send it, no acknowledgement) for `stall_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq

from noloco_rt.net.transport import apply_curve, curve_keys
from noloco_rt.outer.chunks import Piece
from noloco_rt.outer.snapshot import Snapshot

WINDOW = 8
"""Chunks in flight to one partner before we wait for an acknowledgement."""


@dataclass
class EncodedChunk:
    index: int
    pieces: list[Piece]
    snapshot: Snapshot


@dataclass
class ChunkFeed:
    """One round's chunks in order, appended by the encoder, read by every pusher."""

    total: int
    chunks: list[EncodedChunk] = field(default_factory=list)
    error: BaseException | None = None
    closed: bool = False
    closed_at: float | None = None
    """time.monotonic() when it closed."""
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def append(self, chunk: EncodedChunk) -> None:
        with self._cond:
            self.chunks.append(chunk)
            self._cond.notify_all()

    def close(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.closed, self.error, self.closed_at = True, error, time.monotonic()
            self._cond.notify_all()

    def get(self, index: int, timeout_s: float) -> EncodedChunk | None:
        """Chunk `index` once encoded; None if the feed failed or it is not there in time."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.chunks) > index or self.closed, timeout=timeout_s)
            return self.chunks[index] if len(self.chunks) > index else None

    def wait_closed(self, timeout_s: float) -> bool:
        """True once every chunk is encoded (or encoding failed)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.closed, timeout=timeout_s)

    def bytes(self) -> tuple[int, int]:
        """(wire, raw) bytes of the chunks encoded so far."""
        with self._cond:
            return (sum(c.snapshot.encoded.wire_bytes for c in self.chunks),
                    sum(c.snapshot.encoded.raw_bytes for c in self.chunks))


def encode_into(feed: ChunkFeed, encode: Callable[[list[Piece]], Snapshot], plan: list[list[Piece]],
                pool: ThreadPoolExecutor) -> None:
    """Compress the plan's chunks on the pool, appending each to the feed in order as soon as
    it and every earlier one are done. Never raises: a failure closes the feed with it."""
    try:
        for index, snapshot in enumerate(pool.map(encode, plan)):
            feed.append(EncodedChunk(index, plan[index], snapshot))
        feed.close()
    except Exception as exc:  # noqa: BLE001 - the pushers must learn it, not hang
        feed.close(exc)


def start_encoding(feed: ChunkFeed, encode: Callable[[list[Piece]], Snapshot], plan: list[list[Piece]],
                   pool: ThreadPoolExecutor) -> threading.Thread:
    thread = threading.Thread(target=encode_into, args=(feed, encode, plan, pool), name="outer-encode",
                              daemon=True)
    thread.start()
    return thread


class PushRefused(Exception):
    """The partner answered a chunk with something other than an acknowledgement."""


def push_stream(ctx: zmq.Context, address: str, feed: ChunkFeed, message: Callable[[EncodedChunk], list[Any]],
                is_ack: Callable[[list[zmq.Frame]], bool], *, stall_s: float) -> bool:
    """Stream every chunk of the feed to one partner; True once all were acknowledged, False
    on a stall of `stall_s` or a failed encoding. Raises PushRefused on a refused chunk."""
    sock = ctx.socket(zmq.DEALER)
    apply_curve(sock, curve_keys(ctx), server=False)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    try:
        sock.connect(address)
        sent = acked = 0
        while sent < feed.total:
            chunk = feed.get(sent, stall_s)
            if chunk is None:
                return False
            while sent - acked >= WINDOW:
                acked += _one_ack(sock, is_ack, stall_s)
            if not sock.poll(int(stall_s * 1000), zmq.POLLOUT):
                return False
            sock.send_multipart(message(chunk), copy=False)
            sent += 1
            while sock.poll(0, zmq.POLLIN):  # acknowledgements already here: keep the window open
                acked += _one_ack(sock, is_ack, 0.0)
        while acked < sent:
            acked += _one_ack(sock, is_ack, stall_s)
        return acked == feed.total
    except _Stalled:
        return False
    finally:
        sock.close(linger=0)


class _Stalled(Exception):
    pass


def _one_ack(sock: zmq.Socket, is_ack: Callable[[list[zmq.Frame]], bool], timeout_s: float) -> int:
    if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
        raise _Stalled
    if not is_ack(sock.recv_multipart(copy=False)):
        raise PushRefused
    return 1

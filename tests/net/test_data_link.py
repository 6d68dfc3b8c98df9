"""The data link (noloco_rt/net/data_link.py): sends and receives on a thread of its own,
real ZeroMQ sockets on 127.0.0.1, and a real process stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import zmq

from noloco_rt.net.data_link import DataLink, SendFailed
from noloco_rt.net.transport import DataSocket

DEAD = "tcp://127.0.0.1:1"  # nobody listens there: IMMEDIATE never queues for it


def _link(ctx: zmq.Context, **kwargs) -> DataLink:
    return DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host=""), **kwargs).start()


def _receive(link: DataLink, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = link.receive(0.05)
        if item is not None:
            return item
    raise AssertionError("nothing arrived in time")


def test_messages_arrive_in_order_decoded_on_the_link_thread():
    ctx = zmq.Context()
    decoded_on: set[str] = set()

    def decode(frames):
        decoded_on.add(threading.current_thread().name)
        return [f.bytes for f in frames]

    a, b = _link(ctx), _link(ctx, decode=decode)
    ready_on: list[str] = []
    try:
        for i in range(20):
            a.send(b.address, [b"h", str(i).encode()], ready=lambda: ready_on.append(threading.current_thread().name))
        assert [_receive(b)[1] for _ in range(20)] == [str(i).encode() for i in range(20)]
        assert decoded_on == {"data-link"} and set(ready_on) == {"data-link"} and len(ready_on) == 20
        assert b.receive(0.05) is None
    finally:
        assert a.close().sent == 20
        b.close()
        ctx.term()


def test_a_dead_peer_fails_later_on_the_callers_thread_and_does_not_hold_up_a_live_one():
    ctx = zmq.Context()
    a, b = _link(ctx, send_timeout_s=0.5), _link(ctx)
    failed: list[str] = []
    try:
        started = time.monotonic()
        a.send(DEAD, [b"lost"], on_failure=lambda: failed.append(threading.current_thread().name))
        a.send(b.address, [b"kept", memoryview(bytearray(b"x" * 1_000_000))])
        assert time.monotonic() - started < 0.25  # the caller never waits on the network
        kept = _receive(b)
        assert kept[0].bytes == b"kept" and len(kept[1].buffer) == 1_000_000
        assert time.monotonic() - started < 0.5  # before the dead peer's send even timed out
        item = _receive(a)
        assert isinstance(item, SendFailed) and item.address == DEAD and not failed
        item.handle()
        assert failed == [threading.current_thread().name]
    finally:
        stats = a.close()
        b.close()
        ctx.term()
    assert (stats.sent, stats.failed, stats.unsent_at_close) == (1, 1, 0)


def test_close_counts_what_it_could_not_send_and_refuses_later_sends():
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)  # connected but never read: the link's queue fills
    sink.setsockopt(zmq.RCVHWM, 1)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    link = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", high_water_mark=1),
                    send_timeout_s=30.0).start()
    payload = bytes(4 << 20)
    for _ in range(30):
        link.send(f"tcp://127.0.0.1:{port}", [payload])
    stats = link.close(flush_s=0.5)
    assert stats.unsent_at_close > 0 and stats.sent + stats.failed == 30
    assert stats.failed == stats.unsent_at_close
    failed_at_close = stats.failed
    refused: list[bool] = []
    link.send(f"tcp://127.0.0.1:{port}", [b"late"], on_failure=lambda: refused.append(True))
    item = link.receive(0)
    while item is not None and not refused:
        item.handle()
        item = link.receive(0)
    assert refused == [True] and link.stats.failed == failed_at_close + 1
    sink.close(linger=0)
    ctx.term()


_SENDER = """
import json, signal, sys
from dataclasses import asdict
import zmq
from noloco_rt.net.data_link import DataLink
from noloco_rt.net.transport import DataSocket

target, count = sys.argv[1], int(sys.argv[2])
# SIGTERM blocked in every thread (ZeroMQ's and the link's inherit the mask) and taken by
# the main thread alone: a handler would run only once the main thread's wait ended when
# the kernel gave the signal to another thread (60 s, while the sends hit their deadline).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
ctx = zmq.Context()
link = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", high_water_mark=2),
                send_timeout_s=60.0).start()
payload = bytes(1 << 20)
for i in range(count):
    link.send(target, [i.to_bytes(4, "big"), payload])
print("accepted", flush=True)
signal.sigtimedwait({signal.SIGTERM}, 60)
print(count - link.stats.sent, flush=True)  # still waiting at SIGTERM (the reader has not started)
stats = link.close(flush_s=30.0)
print(json.dumps(asdict(stats)), flush=True)
ctx.term()
"""


def test_sigterm_flushes_every_accepted_message_before_the_process_exits():
    count = 60
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)
    sink.setsockopt(zmq.RCVHWM, 2)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    child = subprocess.Popen([sys.executable, "-c", _SENDER, f"tcp://127.0.0.1:{port}", str(count)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "accepted"
        child.send_signal(signal.SIGTERM)  # nothing has been read yet: most messages still wait to be sent
        # Read the child's count of messages still waiting before draining anything: draining
        # first let a slow child's link send them all before it counted (0 on a loaded machine).
        waiting_at_sigterm = int(child.stdout.readline())
        received = []
        deadline = time.monotonic() + 60
        while len(received) < count and time.monotonic() < deadline:
            if sink.poll(100, zmq.POLLIN):
                received.append(int.from_bytes(sink.recv_multipart()[0], "big"))
        stats = json.loads(child.stdout.readline())
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
        sink.close(linger=0)
        ctx.term()
    assert waiting_at_sigterm > 0
    assert received == list(range(count))  # none lost, none reordered
    assert (stats["sent"], stats["failed"], stats["unsent_at_close"]) == (count, 0, 0)


def test_ready_sends_go_out_on_the_callers_thread_and_queue_in_order_behind_a_full_connection():
    """A message with nothing to wait for goes to ZeroMQ before `send` returns; once the peer's
    connection is full (the peer stopped reading), later ones queue for the link thread, and
    the peer still gets every one, in order. A message with a copy to wait for always queues."""
    ctx = zmq.Context()
    a, b = _link(ctx, send_timeout_s=30.0), _link(ctx, inbox_limit=2)
    payload = b"x" * 200_000
    count = 300  # 60 MB: more than the socket buffers and both high-water marks hold
    try:
        a.send(b.address, [b"hello"])  # queued while no connection is up, else at once (a race: both are right)
        assert _receive(b)[0].bytes == b"hello"
        direct = a.stats.sent_directly
        a.send(b.address, [b"0", payload])  # the connection is up and empty: at once
        assert a.stats.sent == 2 and a.stats.sent_directly == direct + 1
        for i in range(1, count):
            a.send(b.address, [str(i).encode(), payload])
        a.send(b.address, [str(count).encode(), payload], ready=lambda: None)
        received = [_receive(b)[0].bytes for _ in range(count + 1)]
        assert received == [str(i).encode() for i in range(count + 1)]
        assert 1 <= a.stats.sent_directly < count  # some went at once, the rest behind the full connection
    finally:
        stats = a.close()
        b.close()
        ctx.term()
    assert (stats.sent, stats.failed) == (count + 2, 0)

"""Round trips to workers' exchange sockets, all at once: a joiner's only measure of its links.

A joiner has sent no microbatch, so the data path's link times (noloco_rt/routing/locality.py)
know nothing yet when it picks the donor of its stage's state. It sends each worker a
PROBE on a fresh connection and times the PROBE_REPLY from the send, once the connection is
made (its set-up is not the link's round trip); the best of PROBE_ROUNDS counts. Workers that do
not answer within the timeout, or answer anything else, are left out: unmeasured.
"""

from __future__ import annotations

import time

import zmq

from noloco_rt.net.transport import apply_curve, curve_keys
from noloco_rt.net.wire import MessageKind, WireLimits, WireReject, decode_message
from noloco_rt.outer.snapshot import snapshot_message

PROBE_ROUNDS = 2
"""Probes per worker, one after another on its connection: the best is its link."""
PROBE_TIMEOUT_S = 1.0
"""How long a joiner probes for, all workers together: sites tens of ms apart answer well within it."""
PROBE_LIMITS = WireLimits(max_frame_bytes=1 << 16, max_message_bytes=1 << 16)
"""A reply carries a header only."""


def probe_links(ctx: zmq.Context, addresses: dict[str, str], *, run_id: str, sender: str, stage: int,
                timeout_s: float = PROBE_TIMEOUT_S, rounds: int = PROBE_ROUNDS) -> dict[str, float]:
    """worker id: its best round trip (seconds) of `rounds` probes, for the workers of
    `addresses` (id: exchange address) that answered within `timeout_s`."""
    frames = snapshot_message(MessageKind.PROBE, run_id=run_id, stage=stage, sender=sender)
    keys = curve_keys(ctx)
    sockets: dict[zmq.Socket, str] = {}
    sent_at: dict[str, float] = {}
    answers: dict[str, list[float]] = {}
    poller = zmq.Poller()
    try:
        for worker_id, address in addresses.items():
            sock = ctx.socket(zmq.DEALER)
            apply_curve(sock, keys, server=False)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # writable once connected: the send starts the clock
            sock.connect(address)
            sockets[sock] = worker_id
            poller.register(sock, zmq.POLLIN | zmq.POLLOUT)
        deadline = time.monotonic() + timeout_s
        while poller.sockets and (left := deadline - time.monotonic()) > 0:
            for sock, events in poller.poll(int(left * 1000) + 1):
                worker_id = sockets[sock]
                if events & zmq.POLLIN:
                    reply = sock.recv_multipart(copy=False)
                    if not _is_probe_reply(reply, run_id):
                        poller.unregister(sock)  # not an honest exchange server of this run
                        answers.pop(worker_id, None)
                        continue
                    answers.setdefault(worker_id, []).append(time.monotonic() - sent_at[worker_id])
                    if len(answers[worker_id]) >= rounds:
                        poller.unregister(sock)
                        continue
                elif worker_id in sent_at:  # writable again while our probe is out: wait for its reply
                    continue
                else:  # writable: the connection is made, the first probe goes now
                    poller.modify(sock, zmq.POLLIN)
                try:
                    sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                except zmq.Again:  # the connection went away since: what it answered stands
                    poller.unregister(sock)
                    continue
                sent_at[worker_id] = time.monotonic()
    finally:
        for sock in sockets:
            sock.close(linger=0)
    return {worker_id: min(times) for worker_id, times in answers.items()}


def _is_probe_reply(frames: list[zmq.Frame], run_id: str) -> bool:
    try:
        return MessageKind(decode_message(frames, expected_run_id=run_id, limits=PROBE_LIMITS).header.kind) \
            == MessageKind.PROBE_REPLY
    except (WireReject, ValueError):
        return False

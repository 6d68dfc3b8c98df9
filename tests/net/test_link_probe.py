"""A joiner's probes of exchange sockets (noloco_rt/net/link_probe.py), over loopback ZeroMQ
against two workers' real exchange parts (tests/support/exchange_pair.py)."""

from __future__ import annotations

import socket
import time

import zmq

from noloco_rt.net.link_probe import probe_links
from tests.support.exchange_pair import overlapped_pair


def _closed_port_address() -> str:
    """A loopback address nobody serves (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def test_every_live_exchange_server_answers_a_probe_whatever_its_stage_and_a_dead_one_is_left_out():
    with overlapped_pair() as (a, b), zmq.Context() as ctx:
        dead = _closed_port_address()
        started = time.monotonic()
        links = probe_links(ctx, {"a": a.server.address, "b": b.server.address, "dead": dead},
                            run_id="devices", sender="j" * 32, stage=5, timeout_s=1.0)
        took = time.monotonic() - started
    assert set(links) == {"a", "b"}, links  # a joiner of another stage is answered too
    assert all(0 < link < 0.5 for link in links.values()), links
    assert took < 1.5  # one timeout for all of them together, not one each


def test_a_probe_of_another_run_is_not_answered_with_a_probe_reply():
    with overlapped_pair() as (a, _), zmq.Context() as ctx:
        links = probe_links(ctx, {"a": a.server.address}, run_id="another-run", sender="j" * 32, stage=0,
                            timeout_s=0.5)
        rejected = a.step.service.rejected.counts()
    assert links == {}
    assert rejected.get("wrong_run", 0) >= 1, rejected

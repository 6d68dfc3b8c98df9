"""Real ZeroMQ sockets on 127.0.0.1 (the data socket is tested through its link: test_data_link.py)."""

from __future__ import annotations

import structlog
import zmq

from noloco_rt.net.transport import ExchangeServer, request
from tests.support.thread_switches import wakeups_while_idle
from tests.support.waiting import wait_until


def test_exchange_request_reply_and_timeout():
    ctx = zmq.Context()
    server = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="localhost",
                            handler=lambda frames: [b"reply", frames[0].bytes.upper()])
    server.start()
    try:
        assert server.address.startswith("tcp://localhost:")
        address = f"tcp://127.0.0.1:{server.port}"
        reply = request(ctx, address, [b"hello"], timeout_s=5.0)
        assert reply is not None and [f.bytes for f in reply] == [b"reply", b"HELLO"]
        assert server.requests_served == 1
        assert request(ctx, "tcp://127.0.0.1:1", [b"x"], timeout_s=0.2) is None
    finally:
        server.stop()
        ctx.term()


def test_a_failing_handler_is_counted_and_logged_boundedly_and_the_server_serves_on():
    ctx = zmq.Context()

    def handler(frames):
        if frames[0].bytes == b"boom":
            raise RuntimeError("handler bug")
        return [b"ok"]

    server = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="", handler=handler)
    server.start()
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):  # no reply for a failed request: the requester times out
                assert request(ctx, server.address, [b"boom"], timeout_s=0.3) is None
            reply = request(ctx, server.address, [b"fine"], timeout_s=5.0)
        assert reply is not None and [f.bytes for f in reply] == [b"ok"]
        assert server.handler_errors == 3 and "handler bug" in server.last_error
        failures = [e for e in logs if e["event"] == "exchange_handler_failed"]
        assert len(failures) == 1  # the first, then every 100th
        assert failures[0]["handler_errors_total"] == 1 and failures[0]["log_level"] == "error"
    finally:
        server.stop()
        ctx.term()


def test_an_idle_exchange_server_sleeps_until_a_request_or_stop():
    ctx = zmq.Context()
    server = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="", handler=lambda frames: [b"ok"])
    server.start()
    try:
        wait_until(lambda: server._thread.native_id is not None, 5.0, "the serving thread to start")
        # Each wakeup takes a core from a training thread; a 100 ms poll made 10 of these.
        assert wakeups_while_idle(server._thread.native_id) <= 2
        reply = request(ctx, server.address, [b"x"], timeout_s=5.0)  # a request still wakes it
        assert reply is not None and [f.bytes for f in reply] == [b"ok"]
        server.stop(timeout_s=2.0)  # asleep with no deadline: stop wakes it
        assert not server._thread.is_alive()
        server.stop()  # twice is harmless
    finally:
        server.stop()
        ctx.term()

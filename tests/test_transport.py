"""Real ZeroMQ sockets on 127.0.0.1."""

from __future__ import annotations

import zmq

from noloco_rt.transport import DataSocket, ExchangeServer, request


def test_data_round_trip_and_dead_peer_times_out():
    ctx = zmq.Context()
    a = DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="")
    b = DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="")
    try:
        payload = memoryview(bytearray(b"x" * 1_000_000))
        assert a.send(b.address, [b"header", payload], timeout_s=5.0)
        frames = b.receive(timeout_s=5.0)
        assert frames is not None and frames[0].bytes == b"header" and len(frames[1].buffer) == 1_000_000
        assert b.receive(timeout_s=0.05) is None
        # nobody listens on this port: IMMEDIATE makes the send fail instead of queueing forever
        dead = "tcp://127.0.0.1:1"
        assert not a.send(dead, [b"h"], timeout_s=0.2)
        a.forget(dead)
    finally:
        a.close()
        b.close()
        ctx.term()


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

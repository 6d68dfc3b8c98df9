"""Real ZeroMQ sockets on 127.0.0.1."""

from __future__ import annotations

import pytest
import zmq

from noloco_rt.net.transport import DataSocket, ExchangeServer, request


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


def test_data_faults_from_the_environment_drop_a_seeded_fraction():
    from noloco_rt.net.transport import DATA_DELAY_ENV, DATA_LOSS_ENV, DataFaults

    assert DataFaults.from_env({}) is None  # the normal case: no injection at all
    faults = DataFaults.from_env({DATA_LOSS_ENV: "0.25", DATA_DELAY_ENV: "0"}, seed=7)
    assert faults is not None and faults.delay_s == 0.0
    drops = sum(faults.should_drop() for _ in range(4000))
    assert 800 < drops < 1200 and faults.dropped == drops
    first, second = DataFaults(loss=0.25, seed=7), DataFaults(loss=0.25, seed=7)
    assert [first.should_drop() for _ in range(50)] == [second.should_drop() for _ in range(50)]  # seeded
    with pytest.raises(ValueError):
        DataFaults(loss=1.0)


def test_a_lost_message_is_reported_sent_and_never_arrives():
    import zmq

    from noloco_rt.net.transport import DataFaults, DataSocket

    ctx = zmq.Context()
    try:
        receiver = DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="")
        lossy = DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="",
                           faults=DataFaults(loss=0.5, seed=1))
        sent = [lossy.send(receiver.address, [f"m{i}".encode()], timeout_s=2.0) for i in range(40)]
        assert all(sent)  # the sender cannot tell: only its deadline will
        received = []
        while (frames := receiver.receive(1.0)) is not None:
            received.append(bytes(frames[0]))
        assert len(received) == 40 - lossy.faults.dropped and 0 < lossy.faults.dropped < 40
        receiver.close()
        lossy.close()
    finally:
        ctx.term()

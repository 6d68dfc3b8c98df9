"""A worker's two receiving sockets with CURVE on, in a process of their own, for
tests/net/test_preauth_frames.py: prints the data and exchange ports, then serves until killed.

    python -m tests.support.preauth_server MAX_FRAME_BYTES|none
"""

from __future__ import annotations

import sys
import time

import zmq

from noloco_rt.net.curve import CurveKeys
from noloco_rt.net.transport import DataSocket, ExchangeServer, enable_curve


def main() -> None:
    limit = None if sys.argv[1] == "none" else int(sys.argv[1])
    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    keys = CurveKeys(public_key=public, secret_key=secret)
    enable_curve(ctx, keys)
    data = DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", curve=keys, max_frame_bytes=limit)
    exchange = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="", curve=keys,
                              handler=lambda frames: [b"?"], max_frame_bytes=limit)
    exchange.start()
    print(data.port, exchange.port, flush=True)
    while True:  # the data socket is read, as a worker's link thread reads it
        if data.inbound.poll(100):
            data.inbound.recv_multipart()
        time.sleep(0)


if __name__ == "__main__":
    main()

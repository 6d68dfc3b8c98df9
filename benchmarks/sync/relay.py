"""A delaying TCP relay: the stand-in for netem, which this kernel lacks.

    python -m benchmarks.sync.relay --port 15001 --delay-s 0.025          # transparent
    python -m benchmarks.sync.relay --delay-s 0.025 --route 17000=10.77.0.2:17000 ...

Transparent: runs in the hub namespace behind an iptables REDIRECT and reads each
connection's original destination (SO_ORIGINAL_DST). Routed (no iptables needed): listens
on each --route port and connects to its fixed destination; the peers then advertise the
hub's address for those ports. Either way it forwards every chunk in both directions
`delay_s` after it arrived, in order: one-way propagation delay,
so a request/reply round trip gains 2·delay_s. What it does not emulate: the endpoints'
TCP sees a short RTT to the relay, so slow start and window growth run at LAN RTT instead
of the WAN RTT (the relay buffers in between); no loss, no jitter.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct

SO_ORIGINAL_DST = 80
CHUNK_BYTES = 1 << 20


def original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # struct sockaddr_in
    port, packed_ip = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed_ip), port


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(CHUNK_BYTES)
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await delivering
    except (ConnectionError, OSError):
        delivering.cancel()


async def _handle(delay_s: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  destination: tuple[str, int] | None = None) -> None:
    host, port = destination or original_destination(writer.get_extra_info("socket"))
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    for stream in (writer, up_writer):
        stream.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(_pump(reader, up_writer, delay_s), _pump(up_reader, writer, delay_s),
                         return_exceptions=True)
    for stream in (writer, up_writer):
        stream.close()


async def serve(port: int, delay_s: float) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(delay_s, r, w), "0.0.0.0", port,
                                        limit=CHUNK_BYTES, backlog=512)
    print(f"relay listening port={port} delay_s={delay_s}", flush=True)
    async with server:
        await server.serve_forever()


async def serve_routes(routes: dict[int, tuple[str, int]], delay_s: float) -> None:
    """Listen on every route's port (all addresses) and relay to its destination."""
    servers = [await asyncio.start_server(lambda r, w, dest=dest: _handle(delay_s, r, w, dest), "0.0.0.0", port,
                                          limit=CHUNK_BYTES, backlog=512) for port, dest in routes.items()]
    print(f"relay listening routes={len(servers)} delay_s={delay_s}", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def parse_route(text: str) -> tuple[int, tuple[str, int]]:
    """PORT=HOST:PORT"""
    port, _, destination = text.partition("=")
    host, _, dest_port = destination.rpartition(":")
    return int(port), (host, int(dest_port))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, help="transparent mode: the REDIRECT target port")
    parser.add_argument("--route", action="append", default=[], help="routed mode: PORT=HOST:PORT, repeated")
    parser.add_argument("--delay-s", type=float, required=True)
    args = parser.parse_args()
    if args.route:
        asyncio.run(serve_routes(dict(parse_route(r) for r in args.route), args.delay_s))
    elif args.port is not None:
        asyncio.run(serve(args.port, args.delay_s))
    else:
        parser.error("give --port (transparent) or --route (routed)")


if __name__ == "__main__":
    main()

"""Activation transfer between two worker processes against raw pyzmq PUSH/PULL, same run.

    python -m benchmarks.transfer [--sizes-mib 1,4,16,64] [--out benchmarks/results/transfer.md]

runtime: the worker's path, a wire-encoded forward message (header + activations + targets,
copy=False) queued on the sender's data link (noloco_rt/net/data_link.py, which sends on
its own thread) and, on the receiver, the data link's thread receiving, validating and
decoding it into tensors (messages.decode) and the main thread taking it.
raw: PUSH/PULL of the same frames with pyzmq, nothing decoded. Throughput is measured at
the receiver from the first to the last of N messages; the ratio is runtime / raw.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path

from benchmarks.table import emit, markdown_table
from noloco_rt.net import messages
from noloco_rt.net.data_link import DataLink
from noloco_rt.net.transport import DataSocket

RUN = "bench"


def _receiver(mode: str, port_queue, result_queue, count: int, done) -> None:
    import zmq

    ctx = zmq.Context()
    if mode == "runtime":
        link = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", high_water_mark=8),
                        decode=lambda frames: messages.decode(frames, run_id=RUN)).start()
        port_queue.put(link.address)
        receive = lambda: link.receive(30.0)  # noqa: E731
    else:
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 8)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        port_queue.put(f"tcp://127.0.0.1:{port}")
        receive = lambda: pull.recv_multipart(copy=False) if pull.poll(30000) else None  # noqa: E731
    first = None
    for index in range(count):
        frames = receive()
        if frames is None:
            raise RuntimeError(f"receiver timed out after {index} of {count} messages")
        if mode == "runtime":
            assert frames.tensors[0].numel() > 0  # decoded on the link's thread
        if index == 0:
            first = time.perf_counter()
    result_queue.put(time.perf_counter() - first)
    done.set()
    if mode == "runtime":
        link.close(flush_s=0)
    ctx.destroy(linger=0)


def _send(mode: str, address: str, size_mib: int, count: int, done) -> None:
    import torch
    import zmq

    ctx = zmq.Context()
    seq = 64
    dim = size_mib * (1 << 20) // 4 // (8 * seq)
    activations = torch.randn(8, seq, dim)
    targets = torch.zeros(8, seq, dtype=torch.int64)
    outgoing = messages.forward(RUN, "sender", 0, 0, "tcp://127.0.0.1:1", [activations], targets)
    if mode == "runtime":
        link = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", high_water_mark=8),
                        send_timeout_s=30.0).start()
        for _ in range(count):
            link.send(address, outgoing.parts())
        done.wait(120)
        if link.close(flush_s=5.0).failed:
            raise RuntimeError("a send timed out")
    else:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 8)
        push.connect(address)
        parts = outgoing.parts()
        for _ in range(count):
            push.send_multipart(parts, copy=False)
        push.close(linger=-1)
    ctx.term()


def measure(mode: str, size_mib: int, count: int) -> float:
    """MiB/s at the receiver."""
    ctx = multiprocessing.get_context("spawn")
    port_queue, result_queue = ctx.Queue(), ctx.Queue()
    done = ctx.Event()
    receiver = ctx.Process(target=_receiver, args=(mode, port_queue, result_queue, count, done))
    receiver.start()
    address = port_queue.get(timeout=60)
    sender = ctx.Process(target=_send, args=(mode, address, size_mib, count, done))
    sender.start()
    elapsed = result_queue.get(timeout=120)
    sender.join(30)
    receiver.join(30)
    return (count - 1) * size_mib / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default="1,4,16,64")
    parser.add_argument("--total-mib", type=int, default=1024, help="data sent per size and mode")
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side runs per row (median and range)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes_mib.split(",")):
        count = max(8, args.total_mib // size)
        runs = [(measure("raw", size, count), measure("runtime", size, count)) for _ in range(args.repeats)]
        ratios = [runtime / raw for raw, runtime in runs]
        rows.append([size, count, f"{statistics.median(r for r, _ in runs):.0f}",
                     f"{statistics.median(t for _, t in runs):.0f}",
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"])
    title = ("Activation transfer between two processes on 127.0.0.1, median (range) of "
             f"{args.repeats} side-by-side runs (`python -m benchmarks.transfer`)")
    emit(markdown_table(title, ["MiB per message", "messages", "raw pyzmq MiB/s", "runtime MiB/s",
                                "ratio (target >= 0.9)"], rows), args.out)


if __name__ == "__main__":
    main()

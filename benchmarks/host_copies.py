"""Host time the training thread spends starting its device -> host copies on CUDA, four
calls in a row: a whole state for a checkpoint (`state_to_host`, one reused pinned buffer)
and slow weights plus momentum for joiners (`weights_to_host`, pinned blocks from torch's
caching host allocator). The first calls pay for pinning host memory; later ones reuse it.
The state is five copies of 136 M float32 values (2.7 GB), as a 125m worker of 1 x 1 holds
(θ, φ, δ and the two Adam moments). CUDA only.

    PYTHONPATH=. python benchmarks/host_copies.py
"""

from __future__ import annotations

import sys
import time

import torch

from workers.background_writer import PINNED_STATE_LIMIT_BYTES, state_to_host
from workers.device import HostStaging, PinnedArena
from workers.outer.device_boundary import ExchangeBoundary

SIZES = [768 * 768] * 100 + [50257 * 768] * 2 + [768] * 50
"""One copy of the parameters: 136 M values in 152 tensors."""


def main() -> None:
    if not torch.cuda.is_available():
        print("host_copies: no CUDA device here; nothing was run", file=sys.stderr)
        raise SystemExit(2)
    cuda = torch.device("cuda")
    staging, arena = HostStaging(cuda), PinnedArena(PINNED_STATE_LIMIT_BYTES)
    fast, slow, momentum, first_moment, second_moment = ([torch.randn(n, device=cuda) for n in SIZES]
                                                         for _ in range(5))
    state = {"fast": fast, "slow": slow, "momentum": momentum,
             "inner": {"state": {i: {"m": m, "v": v}
                                 for i, (m, v) in enumerate(zip(first_moment, second_moment, strict=True))}}}
    boundary = ExchangeBoundary(staging)
    print(f"parameters per copy: {sum(SIZES) / 1e6:.1f} M")
    for call in range(1, 5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        copy = state_to_host(state, staging, arena)
        started_copy = time.perf_counter()
        copy.get()
        written = time.perf_counter()
        weights = boundary.weights_to_host(slow + momentum)
        started_weights = time.perf_counter()
        weights.ready()
        done = time.perf_counter()
        print(f"call {call}: state_to_host {started_copy - started:.3f} s (writer thread's get {written - started_copy:.3f} s); "
              f"weights_to_host {started_weights - written:.3f} s (ready {done - started_weights:.3f} s)")


if __name__ == "__main__":
    main()

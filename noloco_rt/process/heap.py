"""Python's cyclic garbage collector and the heap a process builds while it starts.

Importing torch (with torch._dynamo, which every torch.optim optimizer imports) and building a
worker leaves ~300,000 objects that live as long as the process. Left to the collector as it
is, they cost each process, on this project's 2-core machine (benchmarks/process_heap.py):
- a full collection of ~190 ms whenever one comes after start-up, holding the GIL, so that the
  training thread and every other thread of the process stall;
- ~1 s of repeated collections while the interpreter tears down at exit (1.2 s -> 0.2 s).
A test run starts more than a hundred workers. So a worker, once started, collects once and
freezes what is left (gc.freeze: out of every later collection, still freed by reference
counting), and every noloco-rt process freezes its heap before the interpreter tears down.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Once a process has started: collect what is garbage now (one full pass, so that nothing
    freed during start-up is kept for the process's life), then leave every survivor out of
    later collections."""
    gc.collect()
    gc.freeze()


def freeze_for_exit() -> None:
    """Before the interpreter tears down: its collections skip the whole heap. Objects are still
    freed by reference counting (files flushed and closed as modules are cleared); garbage in
    reference cycles is left for the OS to reclaim."""
    gc.freeze()

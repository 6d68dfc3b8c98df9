"""Python's cyclic garbage collector and the heap a process builds while it starts.

Importing torch (with torch._dynamo, which every torch.optim optimizer imports) and building a
worker leaves ~300,000 objects that live as long as the process. Left to the collector as it
is, they cost each process, on this project's 2-core machine:
- a full collection of 130-160 ms whenever one comes after start-up, holding the GIL, so that
  the training thread and every other thread of the process stall;
- ~0.7 s of repeated collections while the interpreter tears down at exit (0.85 s -> 0.18 s
  for a process that imported torch and torch._dynamo).
A test run starts more than a hundred workers. So a process freezes its heap (gc.freeze: left
out of every later collection, still freed by reference counting) once it has started, and
again before the interpreter tears down: the collector walks only what is newer.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Leave everything allocated so far out of later collections: call it once a process has
    started, and before it exits. Objects are still freed by reference counting (at exit, files
    are flushed and closed as modules are cleared); only garbage in reference cycles that exists
    now is left for the OS to reclaim."""
    gc.freeze()

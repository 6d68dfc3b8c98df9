"""Which outer methods a worker process can run: the ones that need no global collective."""

from __future__ import annotations

WORKER_METHODS = ("noloco", "local")


def worker_method_error(method: str) -> str | None:
    """Why workers cannot run `method`, or None when they can (diloco and ddp average over
    every replica at once; adam, plain Adam with no outer step, is a simulator baseline:
    all three exist only in the simulator)."""
    if method in WORKER_METHODS:
        return None
    if method == "adam":
        return (f"outer.method = 'adam' (no outer step) is a simulator baseline; workers run "
                f"{' or '.join(WORKER_METHODS)} (`noloco-rt simulate` runs it)")
    return (f"outer.method = {method!r} needs a global collective; workers run "
            f"{' or '.join(WORKER_METHODS)} (`noloco-rt simulate` runs the others)")

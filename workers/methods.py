"""Which outer configurations a worker process can run: methods that need no global
collective, and the blocking outer step (the overlapped one exists in the simulator only)."""

from __future__ import annotations

from noloco_rt.config.training import OuterConfig

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


def worker_outer_error(outer: OuterConfig) -> str | None:
    """Why workers cannot run this outer configuration, or None when they can."""
    if (why := worker_method_error(outer.method)) is not None:
        return why
    if outer.overlap:
        return ("outer.overlap = true (the provisional step and its correction) runs only in the "
                "simulator so far; workers take the blocking outer step (set outer.overlap = false)")
    if outer.pairing != "matched":
        return (f"outer.pairing = {outer.pairing!r} is a simulator ablation; workers exchange with their "
                "matched group (set outer.pairing = 'matched')")
    return None

"""Which outer configurations a worker process can run: methods that need no global
collective, blocking or overlapped."""

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
    resolved = outer.resolved()
    if outer.overlap and resolved.h < 2:
        return ("outer.overlap needs outer.h >= 2: a correction must land before the next outer step; set "
                "outer.overlap = false for an outer step every inner step")
    if outer.overlap and resolved.max_delay_steps >= resolved.h:
        return (f"outer.max_delay_steps ({resolved.max_delay_steps}) must be below outer.h ({resolved.h}): a "
                "correction must land before the next outer step")
    if outer.overlap_correction != "provisional":
        return (f"outer.overlap_correction = {outer.overlap_correction!r} is a simulator ablation; workers take "
                "the provisional step and correct it ('provisional')")
    if outer.pairing == "random-peer":
        return ("outer.pairing = 'random-peer' is a simulator ablation (the old runtime's pairing); workers "
                "pair by 'matched' groups or by 'ready'iness")
    return None

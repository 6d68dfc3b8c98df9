"""Data-path faults that `noloco-rt chaos` injects into its workers, as a bad network link would.

The chaos driver asks for them through two environment variables of the worker processes
it starts (never configuration, hence not NOLOCO_*); the worker's command reads them once
(data_faults_from_env) and hands the object to its data socket, which calls it before
every send (noloco_rt.net.transport.SendFaults). Nothing in the library reads them.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

DATA_LOSS_ENV = "CHAOS_DATA_LOSS"
DATA_DELAY_ENV = "CHAOS_DATA_DELAY_MS"


@dataclass
class DataFaults:
    """Injected data-path faults: each outgoing message is dropped with probability
    `loss` (the sender believes it went: its deadline and retry must recover) or held
    `delay_s` before it is queued (a slow link; it delays the sender's loop too)."""

    loss: float = 0.0
    delay_s: float = 0.0
    seed: int = 0
    dropped: int = 0
    delayed: int = 0
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0 or self.delay_s < 0.0:
            raise ValueError(f"data faults need 0 <= loss < 1 and delay >= 0, got {self.loss}, {self.delay_s}")
        self._rng = random.Random(self.seed)

    def should_drop(self) -> bool:
        if self.loss and self._rng.random() < self.loss:
            self.dropped += 1
            return True
        return False

    def hold(self) -> None:
        if self.delay_s:
            self.delayed += 1
            time.sleep(self.delay_s)  # the injected fault itself: a slow link


def data_faults_env(loss: float, delay_ms: float) -> dict[str, str]:
    """The environment that asks a worker for these faults; empty when there are none."""
    return {DATA_LOSS_ENV: str(loss), DATA_DELAY_ENV: str(delay_ms)} if loss or delay_ms else {}


def data_faults_from_env(environ: Mapping[str, str], *, name: str) -> DataFaults | None:
    """The faults the environment asks for, or None (the normal case). Seeded by the worker's
    name: each worker loses its own sequence of messages, the same one in every run."""
    loss = float(environ.get(DATA_LOSS_ENV, "0") or 0)
    delay_ms = float(environ.get(DATA_DELAY_ENV, "0") or 0)
    if not (loss or delay_ms):
        return None
    return DataFaults(loss=loss, delay_s=delay_ms / 1000.0, seed=zlib.crc32(name.encode()))

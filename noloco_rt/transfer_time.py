"""How long a transfer of a stage's state may take: timeouts from bytes and the slowest
link a run must tolerate (worker.min_bandwidth_mbit_s), never below the configured floors.

A fixed 10 s exchange timeout suits the tiny presets on loopback; a 1b stage's bootstrap
(slow weights and momentum, lossless: about 2.5 GB) needs minutes on a 200 Mbit/s link, and
a joiner whose pull is cut off at 10 s would restart forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MARGIN = 3.0
"""Slack over the bare transfer time (a link shared with the data path, retries)."""
EXCHANGE_BYTES_PER_PARAM = 4
"""An outer-step snapshot, bounded by the lossless codec (int8-zstd sends about a quarter)."""
BOOTSTRAP_BYTES_PER_PARAM = 8
"""A bootstrap: slow weights and momentum in float32."""


def transfer_s(payload_bytes: int, min_bandwidth_mbit_s: float) -> float:
    """Seconds `payload_bytes` take at the slowest tolerated rate, with the margin."""
    return MARGIN * payload_bytes * 8 / (min_bandwidth_mbit_s * 1e6)


@dataclass(frozen=True)
class StageTimeouts:
    exchange_s: float
    """An outer round's wait for its partners' pushes."""
    bootstrap_pull_s: float
    """One download of a stage's state from one donor."""
    bootstrap_s: float
    """A joiner's whole search for a donor (several pulls may fail)."""


def stage_timeouts(stage_params: int, worker: Any) -> StageTimeouts:
    """Timeouts of a stage of `stage_params` parameters under worker config `worker`."""
    bandwidth = worker.min_bandwidth_mbit_s
    exchange = max(worker.exchange_timeout_s, transfer_s(stage_params * EXCHANGE_BYTES_PER_PARAM, bandwidth))
    pull = max(worker.exchange_timeout_s, transfer_s(stage_params * BOOTSTRAP_BYTES_PER_PARAM, bandwidth))
    return StageTimeouts(exchange_s=exchange, bootstrap_pull_s=pull, bootstrap_s=max(worker.bootstrap_timeout_s, 2 * pull))

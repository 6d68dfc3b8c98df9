"""Prometheus metrics of one worker, on a registry of its own (served on its metrics port)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from noloco_rt.net.http_server import BoundedHTTPServer, send_body, serve_in_thread


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tokens = Counter("noloco_tokens", "Tokens processed (forward) by this worker", registry=r)
        self.tokens_per_s = Gauge("noloco_tokens_per_second", "Recent tokens per second", registry=r)
        self.forwarded = Counter("noloco_microbatches_forwarded", "Microbatches sent downstream", registry=r)
        self.backwarded = Counter("noloco_microbatches_backwarded", "Gradients applied", registry=r)
        self.retried = Counter("noloco_microbatches_retried", "Microbatches re-sent after a deadline", registry=r)
        self.dropped = Counter("noloco_microbatches_dropped", "Microbatches or replies dropped", ["reason"],
                               registry=r)
        self.rejected = Counter("noloco_messages_rejected", "Messages rejected by validation", ["reason"],
                                registry=r)
        self.inner_steps = Counter("noloco_inner_steps", "Inner optimizer steps", registry=r)
        self.outer_steps = Counter("noloco_outer_steps", "Outer steps by kind: matched, partial, local, dropped_late, failed",
                                   ["kind"], registry=r)
        self.outer_blocked_seconds = Counter("noloco_outer_blocked_seconds",
                                             "Seconds the training thread spent on outer steps: the step, its correction, its checkpoint copy", registry=r)
        self.correction_delay = Histogram("noloco_outer_correction_delay_steps",
                                          "Inner steps between an overlapped outer step and its correction",
                                          registry=r, buckets=(0, 1, 2, 3, 5, 8, 13, 21, 34))
        self.exchange_bytes_raw = Counter("noloco_exchange_bytes_raw", "Snapshot bytes as float32", registry=r)
        self.exchange_bytes_wire = Counter("noloco_exchange_bytes_wire", "Snapshot bytes on the wire", registry=r)
        self.exchange_latency = Histogram("noloco_exchange_latency_seconds", "Outer exchange round: push ours, collect theirs",
                                          registry=r, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.queue_depth = Gauge("noloco_queue_depth", "Forwards waiting or in flight at this worker", registry=r)
        self.live_peers = Gauge("noloco_live_peers", "ONLINE workers seen per stage", ["stage"], registry=r)
        self.loss = Gauge("noloco_train_loss", "Last training loss (last stage)", registry=r)
        self.checkpoint_failures = Counter("noloco_checkpoint_failures",
                                           "Checkpoint writes that failed (training went on), by errno name",
                                           ["kind"], registry=r)

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Start the HTTP endpoint (every path serves the metrics, as prometheus_client's
        does), bounded against slow clients; returns the port (a free one when port is 0)."""
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                send_body(self, generate_latest(registry), CONTENT_TYPE_LATEST)

            def log_message(self, *_: Any) -> None:  # a scrape is not worth a log line
                pass

        server = BoundedHTTPServer((host, port), Handler)
        serve_in_thread(server, "metrics-http")
        return int(server.server_address[1])


class RejectCounter:
    """Messages refused by validation, by reason: a tally for the summary line (thread-safe:
    the exchange server counts on its own thread) and the labelled Prometheus counter."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, reason: Any) -> None:
        key = getattr(reason, "value", str(reason))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
        self._metric.labels(reason=key).inc()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def merged_counts(*counters: RejectCounter) -> dict[str, int]:
    """Rejects of several counters together, reason by reason."""
    total: dict[str, int] = {}
    for counter in counters:
        for reason, count in counter.counts().items():
            total[reason] = total.get(reason, 0) + count
    return total

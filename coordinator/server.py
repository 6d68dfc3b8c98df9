"""The coordinator's metrics and its HTTP endpoint: the live page (/), /status (JSON) and
/metrics (Prometheus)."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from coordinator.page_routes import SECURITY_HEADERS, BadRequest, asset, page_json
from coordinator.run_page import RunPage
from noloco_rt.net.http_server import BoundedHTTPServer, send_body, serve_in_thread


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.members = Gauge("noloco_coordinator_members", "Live ONLINE workers per stage", ["stage"], registry=r)
        self.pulls = Counter("noloco_coordinator_pulls", "Snapshot pulls by result", ["result"], registry=r)
        self.rejected = Counter("noloco_coordinator_rejected", "Pulled snapshots rejected by validation",
                                ["reason"], registry=r)
        self.val_loss = Gauge("noloco_coordinator_val_loss", "Validation loss of the assembled model", registry=r)
        self.val_ppl = Gauge("noloco_coordinator_val_perplexity", "Validation perplexity", registry=r)
        self.eval_step = Gauge("noloco_coordinator_eval_step", "Inner step of the last evaluation", registry=r)
        self.spread = Gauge("noloco_coordinator_replica_spread", "Replica spread of slow weights (estimated from "
                            "the sampled replicas)", ["stage"], registry=r)
        self.spread_low = Gauge("noloco_coordinator_replica_spread_low", "Lower end of the spread's 95% interval",
                                ["stage"], registry=r)
        self.spread_high = Gauge("noloco_coordinator_replica_spread_high", "Upper end of the spread's 95% interval "
                                 "(+Inf: too few replicas sampled to bound it)", ["stage"], registry=r)
        self.spread_sampled = Gauge("noloco_coordinator_spread_replicas_sampled", "Replicas pulled for the last "
                                    "spread measurement", ["stage"], registry=r)
        self.consensus_writes = Counter("noloco_coordinator_consensus_writes", "Consensus checkpoints written",
                                        registry=r)
        self.cycle_failures = Counter("noloco_coordinator_cycle_failures", "Observation cycles that raised",
                                      registry=r)


class StatusServer:
    """A small threaded HTTP server; the handlers only read (status_json and the page are
    thread-safe): the live page at / (coordinator/page_routes.py), /status, /metrics."""

    def __init__(self, host: str, port: int, *, status_json: Callable[[], dict[str, Any]],
                 registry: CollectorRegistry, page: RunPage | None = None) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                try:
                    found = self._answer(self.path.split("?")[0])
                except BadRequest as exc:
                    self.send_error(400, str(exc))
                    return
                if found is None:
                    self.send_error(404, "try /, /status or /metrics")
                    return
                send_body(self, *found)

            def _answer(self, path: str) -> tuple[bytes, str] | None:
                if path == "/status":
                    return json.dumps(status_json(), default=str).encode(), "application/json"
                if path == "/metrics":
                    return generate_latest(registry), CONTENT_TYPE_LATEST
                if page is None:
                    return None
                found = asset(path)
                if found is not None:
                    return found
                data = page_json(page, self.path, status_json())
                return None if data is None else (data, "application/json")

            def end_headers(self) -> None:
                for name, value in SECURITY_HEADERS.items():
                    self.send_header(name, value)
                super().end_headers()

            def log_message(self, *_: Any) -> None:  # requests are not worth a log line each
                outer.requests += 1

        self.requests = 0
        self.httpd = BoundedHTTPServer((host, port), Handler)
        self.port = int(self.httpd.server_address[1])

    def start(self) -> None:
        serve_in_thread(self.httpd, "status-http")

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

"""Worker health counters that live on other objects, exported to Prometheus at scrape time.

Redis outages, malformed member records and the age of the member views (the membership
table and its refresher), inner steps skipped
for a non-finite gradient (the inner optimizer) and exchange requests whose handler
raised (the exchange server) are counted where they happen; this collector reads those
counts when /metrics is scraped, so the objects keep no reference to Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from noloco_rt.membership.table import Membership


class _SkipsNonFinite(Protocol):
    skipped_nonfinite: int


class _CountsHandlerErrors(Protocol):
    handler_errors: int


class _AgesViews(Protocol):
    def staleness_s(self) -> float: ...


class HealthCollector(Collector):
    def __init__(self, membership: Membership, inner_optimizer: _SkipsNonFinite,
                 exchange_server: _CountsHandlerErrors, views: _AgesViews | None = None) -> None:
        self.membership = membership
        self.views = views
        self.inner_optimizer = inner_optimizer
        self.exchange_server = exchange_server

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counts = (
            ("noloco_redis_outages", "Times Redis became unreachable (the cached member view was used)",
             self.membership.outages),
            ("noloco_membership_malformed_records", "Member records skipped because they were malformed",
             self.membership.malformed_records),
            ("noloco_inner_steps_skipped_nonfinite", "Inner steps skipped for a non-finite gradient",
             self.inner_optimizer.skipped_nonfinite),
            ("noloco_exchange_handler_errors", "Exchange requests whose handler raised (no reply sent)",
             self.exchange_server.handler_errors),
        )
        for name, documentation, value in counts:
            yield CounterMetricFamily(name, documentation, value=value)
        if self.views is not None:
            yield GaugeMetricFamily("noloco_member_view_staleness_seconds",
                                    "Age of the oldest member view the worker routes and exchanges on",
                                    value=self.views.staleness_s())


def register_health_collector(registry: CollectorRegistry, membership: Membership,
                              inner_optimizer: _SkipsNonFinite, exchange_server: _CountsHandlerErrors,
                              views: _AgesViews | None = None) -> None:
    """Export the health counters of these objects on `registry`."""
    registry.register(HealthCollector(membership, inner_optimizer, exchange_server, views))

"""The worker's health counters on /metrics: a real registry scraped, a real Membership on a
real redis-server, a real inner optimizer and exchange server."""

from __future__ import annotations

import torch
import zmq
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from noloco_rt.algo.optim import InnerOptimizer
from noloco_rt.config import OptimConfig
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from noloco_rt.net.transport import ExchangeServer, request
from workers.health_metrics import register_health_collector


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples}


def failing_handler(frames):
    raise RuntimeError("handler bug")


class ViewsAged:
    """A member-view refresher whose views are this old."""

    def __init__(self, age_s: float) -> None:
        self.age_s = age_s

    def staleness_s(self) -> float:
        return self.age_s


def test_health_counters_are_read_at_scrape_time():
    ctx = zmq.Context()
    server = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="", handler=failing_handler)
    server.start()
    param = torch.nn.Parameter(torch.ones(3))
    inner = InnerOptimizer([param], OptimConfig(), total_steps=10)
    registry = CollectorRegistry()
    try:
        with EmbeddedRedis() as redis_server:
            client = connect(redis_server.url)
            membership = Membership(client, run_id="r")
            register_health_collector(registry, membership, inner, server, views=ViewsAged(2.5))
            assert scrape(registry) == {"noloco_redis_outages_total": 0.0,
                                        "noloco_membership_malformed_records_total": 0.0,
                                        "noloco_inner_steps_skipped_nonfinite_total": 0.0,
                                        "noloco_exchange_handler_errors_total": 0.0,
                                        "noloco_member_view_staleness_seconds": 2.5}

            client.sadd("noloco:r:stages", 0)  # listed in stage 0's index, but not a record
            client.zadd("noloco:r:stage:0:beats", {"bad": 1.0})
            client.hset("noloco:r:worker:bad", mapping={"stage": "zero", "worker_id": "bad"})
            assert membership.live_members(stage=None) == []  # skipped, counted
            param.grad = torch.tensor([1.0, float("nan"), 0.0])
            inner.step()
            assert request(ctx, server.address, [b"x"], timeout_s=0.3) is None
            redis_server.stop()
            membership.live_members(stage=None)  # the outage: the cached view is used
            after = scrape(registry)
    finally:
        server.stop()
        ctx.term()
    assert after == {"noloco_redis_outages_total": 1.0, "noloco_membership_malformed_records_total": 1.0,
                     "noloco_inner_steps_skipped_nonfinite_total": 1.0, "noloco_exchange_handler_errors_total": 1.0,
                     "noloco_member_view_staleness_seconds": 2.5}

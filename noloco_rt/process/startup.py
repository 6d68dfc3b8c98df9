"""Process start-up, written once for every noloco-rt process (worker, coordinator, launch, up).

The order matters: the parent-death signal first (a supervised process must not outlive its
supervisor), then the checks that turn a configuration mistake into one clear line and exit 2
before anything starts (CURVE key files, Redis password and ACL), then logging, then the
ZeroMQ context with the run's keys. Kept apart from noloco_rt.process.lifetime, which the config
loader imports: this module needs the config, the membership table and the transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
import zmq

from noloco_rt.config import Config
from noloco_rt.logs import configure_logging, get_logger
from noloco_rt.membership.redis_access import check_access, connect_network
from noloco_rt.membership.redis_wait import wait_for_redis
from noloco_rt.net.curve import CurveKeys, load_curve_keys
from noloco_rt.net.transport import disable_curve, enable_curve
from noloco_rt.process.lifetime import set_parent_death_signal_from_env


@dataclass(frozen=True)
class Started:
    """What a started process holds: the run's CURVE keys (None: CURVE off), a Redis client
    (None when not asked for or no URL is configured) and a ZeroMQ context (None when not asked for)."""

    curve: CurveKeys | None
    redis_client: redis.Redis | None
    zmq_context: zmq.Context | None

    @property
    def client(self) -> redis.Redis:
        if self.redis_client is None:
            raise RuntimeError("no Redis client: started without network.redis_url or with redis=False")
        return self.redis_client

    @property
    def ctx(self) -> zmq.Context:
        if self.zmq_context is None:
            raise RuntimeError("no ZeroMQ context: started with zmq_context=False")
        return self.zmq_context


@contextmanager
def process_startup(cfg: Config, *, redis_check: bool = True, redis_wait: bool = False,
                    zmq_context: bool = True) -> Iterator[Started]:
    """Start a process of the run `cfg`; on exit, stop the context's ZAP handler and close it.

    Raises ConfigError (the CLI prints one line, exit 2) for a bad key file, and
    RedisAccessError for a wrong password or ACL. With redis_wait, an unreachable Redis is
    retried for worker.redis_wait_s (a warning every few seconds), then RedisUnreachable
    (one line, exit 2); without it, merely unreachable is no error. redis_check=False or no
    network.redis_url: no client, no check.
    """
    set_parent_death_signal_from_env()
    curve = load_curve_keys(cfg.network)
    configure_logging(cfg.run.log_format)
    client = None
    if redis_check and cfg.network.redis_url:
        url = cfg.network.redis_url
        client = connect_network(cfg.network)
        if not check_access(client, url) and redis_wait:
            wait_for_redis(lambda: check_access(client, url), url=url, wait_s=cfg.worker.redis_wait_s,
                           log=get_logger(role="startup"))
    ctx = zmq.Context() if zmq_context else None
    if ctx is not None:
        enable_curve(ctx, curve)  # every socket made from ctx gets the run's keys (noloco_rt.net.transport)
    try:
        yield Started(curve=curve, redis_client=client, zmq_context=ctx)
    finally:
        if ctx is not None:
            disable_curve(ctx)  # its ZAP socket would keep the context from closing
            ctx.destroy(linger=0)  # the process is leaving: unsent messages are not waited for

"""Peer addresses read from Redis or from a message are tcp://host:port, nothing else: a
Redis writer or a forged forward cannot make a worker connect to a local socket."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from noloco_rt.net import messages
from noloco_rt.net.addresses import peer_address_problem
from noloco_rt.net.wire import RejectReason, WireReject
from noloco_rt.net.wire_dtype import pack
from tests.support.command_env import settings_free_env


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:5555", "tcp://worker-3.noloco.svc.cluster.local:40001",
                                     "tcp://[::1]:5555", "tcp://node7:65535", "tcp://10.0.0.2:1"])
def test_advertised_addresses_are_accepted(address):
    assert peer_address_problem(address) is None


@pytest.mark.parametrize(("address", "why"), [
    ("ipc:///tmp/noloco.sock", "not tcp://"), ("inproc://exchange", "not tcp://"), ("tcp://host:0", "out of range"),
    ("tcp://host:70000", "out of range"), ("tcp://ho st:1", "not a host"), ("tcp://host:1/x", "not tcp://"),
    ("tcp://*:5555", "not a host"), ("tcp://eth0;x:5", "not a host"), ("tcp://[1::2::3]:5", "not an IPv6"),
    (5555, "not a string"), ("tcp://" + "a" * 300 + ":1", "characters"), ("", "not tcp://"),
])
def test_anything_else_is_refused_with_its_reason(address, why):
    problem = peer_address_problem(address)
    assert problem is not None and why in problem, problem


def test_a_member_with_a_forged_address_is_skipped_and_counted_not_connected_to():
    with EmbeddedRedis() as server:
        membership = Membership(connect(server.url), run_id="r")
        for worker_id, data_addr in (("a" * 32, "tcp://127.0.0.1:4000"), ("b" * 32, "tcp://127.0.0.1:4001")):
            assert membership.register(MemberRecord(worker_id, "r", 0, data_addr, "tcp://127.0.0.1:5000",
                                                    WorkerState.ONLINE))
        membership.client.hset(membership.key("b" * 32), "data_addr", "ipc:///tmp/x.sock")  # a Redis writer
        assert [m.worker_id for m in membership.live_members(stage=0)] == ["a" * 32]
        assert membership.malformed_records >= 1


def test_a_forward_with_a_forged_reply_address_is_rejected():
    activations = pack(torch.zeros(1, 2, 4), "float32")
    for reply_to, refused in (("tcp://127.0.0.1:4000", False), ("ipc:///tmp/x", True), ("", False)):
        parts = messages.forward("r", "s" * 32, 0, 7, reply_to, activations, torch.zeros(1, 2, dtype=torch.int64)).parts()
        if not refused:
            assert messages.decode(parts, run_id="r").reply_to == reply_to
            continue
        with pytest.raises(WireReject) as rejected:
            messages.decode(parts, run_id="r")
        assert rejected.value.reason is RejectReason.MALFORMED_HEADER and "reply_to" in str(rejected.value)


def test_a_worker_bound_beyond_loopback_without_curve_refuses_to_start_unless_trusted():
    from noloco_rt.config import load_config
    from noloco_rt.net.exposure import open_door

    def network(**fields):
        return load_config(environ={}, overrides=[{"network": fields}]).network

    assert open_door(network()) is None  # 127.0.0.1
    assert open_door(network(bind_host="::1")) is None
    why = open_door(network(bind_host="0.0.0.0"))
    assert why is not None and "poison the model" in why and "network.trusted_network" in why
    assert open_door(network(bind_host="0.0.0.0", trusted_network=True)) is None
    assert open_door(network(bind_host="10.0.0.2", curve_secret_key="x" * 40)) is None


def test_the_worker_command_says_so_in_one_line_exit_2():
    import subprocess
    import sys

    env = settings_free_env()
    result = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "worker", "--stage", "0", "--redis-url",
                             "redis://127.0.0.1:1/0", "--bind-host", "0.0.0.0"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 2, result.stderr
    assert "poison the model" in result.stderr and "Traceback" not in result.stderr

"""A worker behind a router that forwards public ports to it (NAT), with real processes: it
binds fixed ports, publishes the forwarded ones (network.advertise_data_port and
advertise_exchange_port), and its peers reach it through the forwarders alone
(tests/support/tcp_relay.py), for activations and for outer-step pushes."""

from __future__ import annotations

import pytest

from noloco_rt.config import ConfigError, load_config
from tests.support.in_process import run_cli_in_process
from tests.support.tcp_relay import TcpRelay
from workers.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def test_a_forwarded_port_needs_the_fixed_port_it_forwards_to():
    with pytest.raises(ConfigError, match="advertise_data_port.*needs a fixed data_port"):
        load_config(environ={}, overrides=[{"network": {"advertise_data_port": 41000}}])
    network = load_config(environ={}, overrides=[{"network": {"advertise_exchange_port": 41001,
                                                              "exchange_port": 6100}}]).network
    assert (network.advertise_exchange_port, network.exchange_port) == (41001, 6100)


@pytest.mark.slow
def test_a_worker_reached_only_through_forwarded_ports_trains_and_pairs(tmp_path):
    data, exchange = TcpRelay.to_a_free_port(), TcpRelay.to_a_free_port()
    cluster = LocalCluster(tmp_path)
    try:
        upstream = cluster.start_worker(0, "a0")
        behind = cluster.start_worker(1, "b0", **{
            "network.data_port": data.target_port, "network.advertise_data_port": data.port,
            "network.exchange_port": exchange.target_port, "network.advertise_exchange_port": exchange.port})
        direct = cluster.start_worker(1, "b1")
        cluster.wait_online(3)
        published = {m.name: m for m in cluster.members()}["b0"]
        assert (published.data_addr, published.exchange_addr) == (f"tcp://127.0.0.1:{data.port}",
                                                                    f"tcp://127.0.0.1:{exchange.port}")
        ids = {w.name: cluster.wait_event(w, "worker_started", timeout_s=60)["worker"]
               for w in (upstream, behind, direct)}
        # Training goes on until b1 has paired with b0, not for a fixed count of steps: b0 joins
        # by bootstrapping from b1, and a fast machine once trained 30 steps before it was in.
        cluster.wait_event(direct, "outer_step_done", timeout_s=180,
                           where=lambda e: e["kind"] == "matched" and ids["b0"][:8] in e["used"])
        assert set(cluster.stop_all([upstream, behind, direct]).values()) == {0}
        assert cluster.error_events() == []
    finally:
        cluster.close()
        data.close()
        exchange.close()
    # Activations reached b0 through its forwarded data port, and only there.
    assert upstream.events("worker_summary")[-1]["routed_to"].get(ids["b0"], 0) > 0
    assert data.bytes_in > 0
    # b1 pushed to b0 through its forwarded exchange port, and the pair's outer steps matched.
    matched_with_b0 = [e for e in direct.events("outer_step_done")
                       if e["kind"] == "matched" and ids["b0"][:8] in e["used"]]
    assert matched_with_b0 and exchange.bytes_in > 0 and exchange.bytes_out > 0, direct.events("outer_step_done")


@pytest.mark.parametrize("kind", ["data", "exchange"])
def test_launch_refuses_one_forwarded_port_for_several_workers(capsys, monkeypatch, kind):
    code, _, err = run_cli_in_process(capsys, monkeypatch, "launch", "--stage", "0", "--nproc", "2",
                                      "--redis-url", "redis://127.0.0.1:1/0", f"--{kind}-port-base", "6000",
                                      "--set", f"network.{kind}_port=6000", "--set", f"network.advertise_{kind}_port=41000")
    assert code == 2 and f"network.advertise_{kind}_port = 41000 would be one public port for all 2" in err, err

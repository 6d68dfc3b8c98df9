"""Two emulated sites (workers/faults/site_netns.py), the topology benchmarks.two_sites trains
in: a host reaches a host of its own site directly and one of the other site only through
that site's relay, which adds its delay each way; both sites reach a service in site a; the
link between the sites carries what crosses and nothing else.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.two_sites import MEASURED, Trial, link_bytes, run_trial, start_sites, start_worker
from noloco_rt.logs import read_json_lines
from noloco_rt.routing.locality import MIN_SAMPLES
from tests.support.waiting import wait_until
from workers.cluster.chaos_faults import Partitions
from workers.faults import netns, site_netns
from workers.faults.netns import LinkSpec

SITES = [0, 0, 1, 1]  # ranks 0 and 1 in site a, 2 and 3 in site b
PORT = 17031
"""Worker i serves on PORT + i; the service in site a on SERVICE_PORT."""
SERVICE_PORT = 17041
DELAY_S = 0.05
ECHO = ("import socket\ns = socket.create_server(('0.0.0.0', {port}))\nprint('up', flush=True)\n"
        "while True:\n    c, _ = s.accept()\n    c.sendall(c.recv(16))\n    c.close()\n")
ROUND_TRIP = ("import socket, time\nt = time.monotonic()\n"
              "c = socket.create_connection(('{host}', {port}), timeout=10)\nc.sendall(b'ping')\n"
              "assert c.recv(16) == b'ping'\nprint(time.monotonic() - t)\n")


@pytest.fixture
def sites():
    why_not = Partitions.unavailable()
    if why_not is not None:
        pytest.skip(reason=f"{why_not}: network namespaces need root and iproute2")
    netns.cleanup()
    procs: list[subprocess.Popen[str]] = []
    try:
        site_netns.create(SITES)
        site_netns.shape(LinkSpec(100, DELAY_S))
        for prefix, port in ((netns.exec_prefix(2), PORT + 2), (site_netns.router_prefix(0), SERVICE_PORT)):
            procs.append(subprocess.Popen([*prefix, sys.executable, "-c", ECHO.format(port=port)],
                                          stdout=subprocess.PIPE, text=True))
            assert procs[-1].stdout is not None and procs[-1].stdout.readline() == "up\n"
        procs += [subprocess.Popen(site_netns.relay_command(site, SITES, [[PORT + i] for i in range(len(SITES))], DELAY_S),
                                   stdout=subprocess.PIPE, text=True) for site in (0, 1)]
        for relay in procs[-2:]:
            assert relay.stdout is not None and relay.stdout.readline().startswith("relay listening")
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        netns.cleanup()


def _round_trip_s(prefix: list[str], host: str, port: int = PORT + 2) -> float:
    done = subprocess.run([*prefix, sys.executable, "-c", ROUND_TRIP.format(host=host, port=port)],
                          capture_output=True, text=True, timeout=30, check=True)
    return float(done.stdout)


@pytest.mark.slow  # real relays in namespaces of fixed names: one test at a time may hold them (tests/lanes.py)
def test_only_traffic_between_sites_crosses_the_relay_and_the_shaped_link(sites):
    before = _link_bytes()
    near = _round_trip_s(netns.exec_prefix(3), netns.worker_ip(2))
    assert _link_bytes() == before  # inside site b: the link between the sites saw nothing
    far = _round_trip_s(netns.exec_prefix(0), netns.worker_ip(2))
    # Connect, then request and reply: the relay holds each direction DELAY_S, so at least 2 · DELAY_S.
    assert far >= 2 * DELAY_S, (near, far)
    assert near < far
    assert _link_bytes() > before
    # Site b reaches the service in site a (replies come back to its far address).
    assert _round_trip_s(netns.exec_prefix(3), netns.SERVICE_IP, SERVICE_PORT) < far


def _link_bytes() -> int:
    return link_bytes()


def test_a_sites_relay_forwards_the_other_sites_ports_to_their_far_addresses():
    """The address plan itself: pure, no namespaces."""
    assert site_netns.far_address(3) == "10.79.3.2"
    command = site_netns.relay_command(0, SITES, [[7000, 7100]] * 4, 0.025)
    routes = [arg for arg in command if arg.startswith("--route=")]
    # Site a's relay forwards to site b's workers only, each port to the worker's far address.
    assert routes == ["--route=7000=10.79.2.2:7000", "--route=7100=10.79.2.2:7100",
                      "--route=7000=10.79.3.2:7000", "--route=7100=10.79.3.2:7100"]


@pytest.mark.slow
def test_without_site_names_workers_learn_which_next_stage_peer_is_far_and_keep_the_pipeline_home(tmp_path):
    """2 x 2 across the two sites, nobody naming one, routing.far_share 0: each stage-0 worker
    measures both stage-1 workers' links, judges the other site's far and sends it nothing more."""
    why_not = Partitions.unavailable()
    if why_not is not None:
        pytest.skip(reason=f"{why_not}: network namespaces need root and iproute2")
    trial = Trial(MEASURED, LinkSpec(100, DELAY_S / 2), seed=0, stages=2, replicas=2, preset="tiny", steps=30,
                  far_share=0.0)
    result = run_trial(trial, tmp_path)
    assert math.isfinite(result["val_loss"])
    logs = next(tmp_path.iterdir()) / "logs"
    ids = {path.stem: read_json_lines(path)[0][0]["worker"] for path in logs.glob("s*.log")}
    for replica in (0, 1):
        events, _ = read_json_lines(logs / f"s0-r{replica}.log")
        near, far = ids[f"s1-r{replica}"][:8], ids[f"s1-r{1 - replica}"][:8]  # replica r of each stage in site r
        judged = [e for e in events if e.get("event") == "far_peers"]
        assert judged and judged[-1]["far"] == [far], judged
        # 50 ms RTT across. A near link's best trip is a loopback round trip through both link
        # threads: under 5 ms on an idle machine, 11 ms seen with the suite's two lanes on 2 cores.
        links = judged[-1]["links_ms"]
        assert links[far] > 40 and links[near] < links[far] / 2, links
        summary = [e for e in events if e.get("event") == "worker_summary"][-1]
        routed = summary["routed_to"]
        # Judged after at least MIN_SAMPLES round trips to it (more on a loaded machine, where the
        # near peer's best trip takes longer to be half the far one's); after that, nothing
        # goes far but a re-send that finds no other worker untried.
        assert MIN_SAMPLES <= judged[-1]["sent_before"][far] <= routed[far] <= (
            judged[-1]["sent_before"][far] + summary["retried"]), (judged[-1], summary)
        assert routed[near] > 2 * routed[far], routed


def _events(log: Path, name: str) -> list[dict]:
    if not log.exists():
        return []
    return [e for e in read_json_lines(log)[0] if e.get("event") == name]


@pytest.mark.slow
def test_without_site_names_a_joiner_whose_stage_is_only_in_the_other_site_starts_from_the_seed(tmp_path):
    """s0-r0 and s1-r0 in site a and s1-r1 in site b train, their stage 0 at outer step 0; then
    s0-r1 joins in site b. Its probes find its only donor (s0-r0) far against s1-r1, a worker
    of its own site: it starts from the seed, as a named site's first worker does, and pulls
    no state across the slow link."""
    why_not = Partitions.unavailable()
    if why_not is not None:
        pytest.skip(reason=f"{why_not}: network namespaces need root and iproute2")
    trial = Trial(MEASURED, LinkSpec(100, DELAY_S / 2), seed=0, stages=2, replicas=2, preset="tiny", steps=100_000,
                  far_share=0.0)
    assert [trial.site_of(rank) for rank in range(4)] == [0, 1, 0, 1]  # stage-major: s0-r0 a, s0-r1 b, s1-r0 a, s1-r1 b
    no_outer_step = ["--set", "outer.h=100000"]  # the stage stays at outer step 0 while the joiner decides
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    try:
        start_sites(trial, procs)
        workers += [start_worker(trial, tmp_path, rank, no_outer_step) for rank in (0, 2, 3)]
        wait_until(lambda: _events(logs / "s0-r0.log", "train_progress"), 120, "s0-r0 training")
        workers.append(start_worker(trial, tmp_path, 1, no_outer_step))
        wait_until(lambda: _events(logs / "s0-r1.log", "member_online"), 120, "the joiner online")
        assert all(w.poll() is None for w in workers), "a worker exited early"
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc in procs:
            proc.kill()
            proc.wait()
        netns.cleanup()
    donor = _events(logs / "s0-r0.log", "worker_started")[0]["worker"][:8]
    joiner = logs / "s0-r1.log"
    links = _events(joiner, "donor_links")
    assert links and links[0]["far"] == [donor], links
    assert links[0]["donors_ms"][donor] > 40 > 5 > links[0]["nearest_ms"], links  # 50 ms RTT across
    assert [e["measured"] for e in _events(joiner, "first_in_site")] == [True]
    assert not _events(joiner, "bootstrapped")  # no state pulled across
    assert _events(joiner, "first_of_stage")

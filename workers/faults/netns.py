"""Emulated networks: one network namespace per worker, a routing hub, tbf per direction, and
partitions (blackhole routes) between chosen hosts.

    ns nls-i (10.77.i.2) --veth nls-vi / nls-hi-- hub nls-hub (10.77.i.1) --...-- ns nls-j

Each worker's veth is rate-limited with tbf on both ends (its uplink inside its namespace,
its downlink on the hub side), so a worker has a full-duplex access link of `rate`, as on a
WAN. The hub also holds SERVICE_IP on its loopback, for a server every worker reaches
through its link (Redis in the partition tests), so that cutting a worker off from it cuts
nothing else. A partition is a pair of blackhole rules in the hub: packets between the two
sides vanish, as on a real split network (connections hang, nothing is refused), and
deleting the rule heals it. The kernel has no netem, so delay comes from relay.py, which runs in the hub: with
`delay_s > 0` every TCP connection that crosses the hub is redirected (iptables REDIRECT)
into it, or, where the peers can be told to advertise the hub's address (benchmarks/wan),
the relay listens there and forwards to fixed destinations, with no iptables. Everything
here shells out to `ip`, `tc` and, for the redirect, `iptables` (root only).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

PREFIX = "nls"
HUB = f"{PREFIX}-hub"
RELAY_PORT = 15001
SERVICE_IP = "10.77.255.1"


def run_command(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def ns_name(rank: int) -> str:
    return f"{PREFIX}-{rank}"


def worker_ip(rank: int) -> str:
    return f"10.77.{rank}.2"


def hub_ip(rank: int) -> str:
    """The hub's address on worker `rank`'s link (a routed relay listens there)."""
    return f"10.77.{rank}.1"


def worker_ifname(rank: int) -> str:
    return f"{PREFIX}-v{rank}"


def cleanup() -> None:
    """Remove every namespace this module may have made (leftovers of a killed run included)."""
    listed = run_command("ip", "netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if name.startswith(f"{PREFIX}-"):
            run_command("ip", "netns", "del", name, check=False)  # deleting a namespace deletes its veth ends


@dataclass(frozen=True)
class LinkSpec:
    rate_mbit: int
    delay_s: float  # one way, added by the relay; the RTT is twice this

    @property
    def label(self) -> str:
        rate = f"{self.rate_mbit // 1000} Gbit/s" if self.rate_mbit >= 1000 else f"{self.rate_mbit} Mbit/s"
        return f"{rate}, RTT {round(2000 * self.delay_s)} ms"


def tbf_args(rate_mbit: int) -> list[str]:
    # burst = 10 ms at line rate (a small burst at 1 Gbit/s would throttle below the rate);
    # latency bounds the queue so it drops instead of bloating without limit.
    burst_kb = max(32, rate_mbit * 1000 // 8 // 100)
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", f"{burst_kb}kb", "latency", "200ms"]


def create(workers: int) -> None:
    """Namespaces, veths, addresses and routes for `workers` workers (no shaping yet)."""
    run_command("ip", "netns", "add", HUB)
    run_command("ip", "netns", "exec", HUB, "ip", "link", "set", "lo", "up")
    run_command("ip", "netns", "exec", HUB, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    run_command("ip", "netns", "exec", HUB, "ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    for rank in range(workers):
        ns, inner, outer = ns_name(rank), worker_ifname(rank), f"{PREFIX}-h{rank}"
        run_command("ip", "netns", "add", ns)
        run_command("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", HUB)
        run_command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        run_command("ip", "netns", "exec", ns, "ip", "addr", "add", f"{worker_ip(rank)}/24", "dev", inner)
        run_command("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        run_command("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", f"10.77.{rank}.1")
        run_command("ip", "netns", "exec", HUB, "ip", "addr", "add", f"10.77.{rank}.1/24", "dev", outer)
        run_command("ip", "netns", "exec", HUB, "ip", "link", "set", outer, "up")


def shape(workers: int, link: LinkSpec, *, redirect: bool = True) -> None:
    """(Re)apply tbf on both ends of every worker's link and, if delayed and `redirect`, the
    transparent relay's redirect (a caller with a routed relay passes redirect=False)."""
    for rank in range(workers):
        run_command("ip", "netns", "exec", ns_name(rank), "tc", "qdisc", "replace", "dev", worker_ifname(rank), "root",
             *tbf_args(link.rate_mbit))
        run_command("ip", "netns", "exec", HUB, "tc", "qdisc", "replace", "dev", f"{PREFIX}-h{rank}", "root",
             *tbf_args(link.rate_mbit))
    if link.delay_s <= 0 or not redirect:
        if shutil.which("iptables"):
            run_command("ip", "netns", "exec", HUB, "iptables", "-t", "nat", "-F", "PREROUTING")
        return
    if not shutil.which("iptables"):
        raise SystemExit("benchmarks.sync: a link with delay needs iptables (apt install iptables); "
                         "links without delay (--quick) do not")
    run_command("ip", "netns", "exec", HUB, "iptables", "-t", "nat", "-F", "PREROUTING")
    if link.delay_s > 0:
        # Only worker-to-worker TCP; the relay's own outgoing connections are not PREROUTING.
        run_command("ip", "netns", "exec", HUB, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp",
             "-d", "10.77.0.0/16", "-j", "REDIRECT", "--to-ports", str(RELAY_PORT))


def exec_prefix(rank: int) -> list[str]:
    return ["ip", "netns", "exec", ns_name(rank)]


def hub_prefix() -> list[str]:
    return ["ip", "netns", "exec", HUB]


def existing() -> list[str]:
    """Namespaces of this module's prefix that exist now (another run's, or a killed one's)."""
    listed = run_command("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split(" ")[0] for line in listed if line.startswith(f"{PREFIX}-")]


def cut(a_ip: str, b_ip: str) -> None:
    """Packets between a and b (both ways) vanish in the hub: connections hang, as across a real
    split, rather than fail at once (a route in the sender's own namespace would fail them)."""
    for src, dst in ((a_ip, b_ip), (b_ip, a_ip)):
        run_command("ip", "netns", "exec", HUB, "ip", "rule", "add", "from", src, "to", dst, "blackhole")


def heal(a_ip: str, b_ip: str) -> None:
    for src, dst in ((a_ip, b_ip), (b_ip, a_ip)):
        run_command("ip", "netns", "exec", HUB, "ip", "rule", "del", "from", src, "to", dst, "blackhole", check=False)


def cuts() -> list[tuple[str, str]]:
    """(from, to) of every cut in effect, one pair per direction."""
    rules = run_command("ip", "netns", "exec", HUB, "ip", "rule", "show").stdout
    found = []
    for line in rules.splitlines():
        words = line.split()
        if "blackhole" in words and "from" in words and "to" in words:
            found.append((words[words.index("from") + 1], words[words.index("to") + 1]))
    return found

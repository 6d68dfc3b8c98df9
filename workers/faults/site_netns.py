"""Two emulated sites: fast links inside each, one shaped and delayed link between them.

    site a: ns nls-i (10.77.i.2) --veth-- router nls-ra ==== shaped veth ==== router nls-rb --veth-- ns nls-j
                                          (10.76.0.1)      (tbf both ends)     (10.76.0.2)

Every worker sits in its own namespace (netns.ns_name) behind an unshaped veth to its site's
router, so traffic inside a site is as fast as the host. The two routers are joined by one
veth with tbf of `rate` on both ends: every byte between the sites shares that link, as
between two real data centres. The kernel has no netem, so the delay comes from relay.py in
routed mode, and only across sites: worker i advertises 10.77.i.2, which its own router
routes to it directly, while the other site's router holds 10.77.i.2 on its loopback, where
a relay listens on i's ports and forwards after `delay_s` to i's second address 10.79.i.2
over the shaped link. A worker therefore binds 0.0.0.0 (both of its addresses), and speaks
from its far address beyond its own link, so that replies find it from either site. Redis (or
any service) listens on SERVICE_IP in site a's router; site b reaches it across the link,
undelayed. Root only; shells out to `ip` and `tc` (workers/faults/netns.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from workers.faults.netns import (
    PREFIX,
    SERVICE_IP,
    LinkSpec,
    ns_name,
    run_command,
    tbf_args,
    worker_ifname,
    worker_ip,
)

ROUTERS = (f"{PREFIX}-ra", f"{PREFIX}-rb")
_LINK_IPS = ("10.76.0.1", "10.76.0.2")
_LINK_IFNAMES = (f"{PREFIX}-xa", f"{PREFIX}-xb")

__all__ = ["ROUTERS", "SERVICE_IP", "create", "far_address", "relay_command", "router_prefix", "shape"]


def far_address(rank: int) -> str:
    """Worker `rank`'s second address: where the other site's relay delivers to it."""
    return f"10.79.{rank}.2"


def router_prefix(site: int) -> list[str]:
    return ["ip", "netns", "exec", ROUTERS[site]]


def _in(ns: str, *args: str) -> None:
    run_command("ip", "netns", "exec", ns, *args)


def create(sites: Sequence[int]) -> None:
    """Namespaces for len(sites) workers, worker i in site sites[i] (0 or 1), both routers and
    the link between them (unshaped until `shape`). Call netns.cleanup() first."""
    for router in ROUTERS:
        run_command("ip", "netns", "add", router)
        _in(router, "ip", "link", "set", "lo", "up")
        _in(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # IPv4 only: a new link's IPv6 neighbour solicitations (86-byte frames) would cross the
        # shaped link uninvited and count as traffic between the sites.
        for scope in ("all", "default"):
            run_command("ip", "netns", "exec", router, "sysctl", "-qw", f"net.ipv6.conf.{scope}.disable_ipv6=1",
                        check=False)
    run_command("ip", "link", "add", _LINK_IFNAMES[0], "netns", ROUTERS[0], "type", "veth",
         "peer", "name", _LINK_IFNAMES[1], "netns", ROUTERS[1])
    for site in (0, 1):
        _in(ROUTERS[site], "ip", "addr", "add", f"{_LINK_IPS[site]}/30", "dev", _LINK_IFNAMES[site])
        _in(ROUTERS[site], "ip", "link", "set", _LINK_IFNAMES[site], "up")
    _in(ROUTERS[0], "ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    _in(ROUTERS[1], "ip", "route", "add", f"{SERVICE_IP}/32", "via", _LINK_IPS[0])
    for rank, site in enumerate(sites):
        _add_worker(rank, site)


def _add_worker(rank: int, site: int) -> None:
    ns, inner, outer = ns_name(rank), worker_ifname(rank), f"{PREFIX}-h{rank}"
    router, other = ROUTERS[site], ROUTERS[1 - site]
    run_command("ip", "netns", "add", ns)
    run_command("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", router)
    _in(ns, "ip", "link", "set", "lo", "up")
    _in(ns, "ip", "addr", "add", f"{worker_ip(rank)}/24", "dev", inner)
    _in(ns, "ip", "addr", "add", f"{far_address(rank)}/32", "dev", inner)
    _in(ns, "ip", "link", "set", inner, "up")
    # Leaving its own link a worker speaks from its far address, which both sites route to it
    # (10.77.i.2 is the relay's in the other site: replies there would stay in that router).
    _in(ns, "ip", "route", "add", "default", "via", f"10.77.{rank}.1", "src", far_address(rank))
    _in(router, "ip", "addr", "add", f"10.77.{rank}.1/24", "dev", outer)
    _in(router, "ip", "link", "set", outer, "up")
    _in(router, "ip", "route", "add", f"{far_address(rank)}/32", "dev", outer)
    # The other site: i's advertised address is local there (its relay), its far address is
    # across the link.
    _in(other, "ip", "addr", "add", f"{worker_ip(rank)}/32", "dev", "lo")
    _in(other, "ip", "route", "add", f"{far_address(rank)}/32", "via", _LINK_IPS[site])


def shape(link: LinkSpec | None) -> None:
    """tbf of link.rate_mbit on both ends of the link between the sites (None: unshaped)."""
    for site in (0, 1):
        if link is None:
            run_command("ip", "netns", "exec", ROUTERS[site], "tc", "qdisc", "del", "dev", _LINK_IFNAMES[site], "root",
                 check=False)
        else:
            _in(ROUTERS[site], "tc", "qdisc", "replace", "dev", _LINK_IFNAMES[site], "root",
                *tbf_args(link.rate_mbit))


def relay_command(site: int, sites: Sequence[int], ports: Sequence[Sequence[int]], delay_s: float) -> list[str]:
    """The relay of `site`'s router: for every worker of the other site, each of its ports
    (ports[rank]) forwarded to its far address after delay_s each way."""
    routes = [f"--route={port}={far_address(rank)}:{port}"
              for rank, worker_site in enumerate(sites) if worker_site != site for port in ports[rank]]
    return [*router_prefix(site), sys.executable, "-m", "benchmarks.sync.relay", "--delay-s", str(delay_s), *routes]

"""Which next-stage peers are far, from measured link round trips (pure: the caller measures).

A sender learns one hop's link from each microbatch: the time from its send of the forward
to the arrival of the gradient, less the time the receiver says it held the forward (from
the forward's arrival to its reply, in the gradient's header). What is left is the two
transfers: the link's round trip and the bytes' time on it, the same for peers of one
site and larger by the slow link's for another site's. No site needs naming (DESIGN §12).

A peer is far when even its best recent link round trip is both FAR_FACTOR times and
FAR_MARGIN_S more than the nearest peer's: the best of a window, because queueing and a
busy receiver only ever add time; both bounds, because peers of one site differ by a
fraction where messages are large and by noise where they are small. A peer measured fewer
than MIN_SAMPLES times counts as near, so it is sent to and measured (its first round trip
holds the connection's set-up). With routing.far_share 0 a peer judged far gets nothing
more and keeps its judgement; a share above 0 keeps measuring far peers.

A joiner has sent no microbatch yet: it probes its stage's donors and workers of every
stage over their exchange sockets (noloco_rt/net/link_probe.py) and orders its bootstrap
by the same rule (`donor_plan`), so that a state crosses a slow link only when no donor is
near, and a site's first worker of a stage at step 0 starts from the seed, as a named site's
does.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

FAR_FACTOR = 2.0
"""A far peer's best link round trip is at least this many times the nearest peer's."""
FAR_MARGIN_S = 0.010
"""... and at least this much longer: sites joined over the internet are tens of ms apart,
while a worker on a busy host answers within a few ms of its neighbours."""
MIN_SAMPLES = 4
"""Link round trips a peer needs before it is judged (until then it is near)."""
LINK_WINDOW = 16
"""Link round trips kept per peer: the best of them is the peer's link. A peer whose link
changed (a route, a move) shows it within this many microbatches."""


def link_round_trip(round_trip_s: float, held_s: float) -> float | None:
    """One hop's link round trip: the sender's round trip less what the receiver held; None
    when the receiver claims to have held it longer than the whole round trip (its interval
    lies inside ours, so that is a lie, or a stamp gone wrong: nothing to learn)."""
    if held_s < 0 or held_s > round_trip_s:
        return None
    return round_trip_s - held_s


def far_peers(best_links: dict[str, float]) -> set[str]:
    """The peers of `best_links` (peer: best link round trip, seconds) that are far."""
    if not best_links:
        return set()
    nearest = min(best_links.values())
    return {peer for peer, link in best_links.items()
            if link >= FAR_FACTOR * nearest and link - nearest >= FAR_MARGIN_S}


class LinkTimes:
    """The last LINK_WINDOW link round trips of each peer, and which peers are far now."""

    def __init__(self, *, window: int = LINK_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._links: dict[str, collections.deque[float]] = {}

    def observe(self, peer: str, link_s: float) -> None:
        if link_s < 0:
            raise ValueError(f"a link round trip cannot be negative, got {link_s}")
        self._links.setdefault(peer, collections.deque(maxlen=self.window)).append(link_s)

    def peers(self) -> list[str]:
        """Every peer measured at least once."""
        return list(self._links)

    def best(self, peer: str) -> float | None:
        """The peer's best recent link round trip, or None if measured fewer than MIN_SAMPLES times."""
        links = self._links.get(peer)
        return min(links) if links and len(links) >= min(MIN_SAMPLES, self.window) else None

    def far(self, peers: Iterable[str]) -> set[str]:
        """Which of `peers` are far, judged among those of them measured enough (the others: near)."""
        measured = {peer: best for peer in peers if (best := self.best(peer)) is not None}
        return far_peers(measured)


@dataclass(frozen=True)
class DonorPlan:
    """A joiner's donors as its probes found them: whom to ask first, and whether all are far."""

    order: list[str]
    """The donors nearest first; those that did not answer a probe after the near ones, far
    ones last (nearest first among them)."""
    far: set[str]
    """The donors judged far against every worker probed (any stage)."""

    @property
    def all_far(self) -> bool:
        """Every donor answered and is far: another site holds the whole stage."""
        return bool(self.order) and self.far == set(self.order)


def donor_plan(donors: list[str], links: dict[str, float]) -> DonorPlan:
    """The bootstrap's order of `donors` (live workers of the joiner's stage, in random order)
    from `links` (worker: probed round trip in seconds, for the donors and for workers of any
    stage: a joiner has no data-path measurements yet, and a worker of another stage in its own
    site is the reference that shows a whole stage elsewhere). Far by the routing's own rule
    (far_peers) against the nearest worker probed. A donor that did not answer keeps its place
    after the measured near ones: it may be near, it may be gone."""
    far = far_peers(links) & set(donors)
    measured_near = sorted((d for d in donors if d in links and d not in far), key=lambda d: links[d])
    unmeasured = [d for d in donors if d not in links]
    far_order = sorted(far, key=lambda d: links[d])
    return DonorPlan(order=measured_near + unmeasured + far_order, far=far)

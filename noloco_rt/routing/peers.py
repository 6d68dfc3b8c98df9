"""The worker's view of its peers: the refresher's last view of a stage, minus a local blacklist.

A peer that fails (send refused, deadline missed, bad reply) is blacklisted locally
with exponential backoff, even while Redis still lists it.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from noloco_rt.membership.records import MemberRecord
from noloco_rt.membership.refresher import ViewRefresher
from noloco_rt.routing.balanced import DealSlot, balanced_next_hop, goes_far
from noloco_rt.routing.locality import LinkTimes, link_round_trip
from noloco_rt.routing.next_hop import next_hop_costs, route_next_hop
from noloco_rt.routing.peer_load import PeerLoad


@dataclass
class _Penalty:
    until: float
    failures: int


class Blacklist:
    def __init__(self, *, base_s: float = 1.0, max_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.base_s = base_s
        self.max_s = max_s
        self.clock = clock
        self._penalties: dict[str, _Penalty] = {}

    def fail(self, worker_id: str) -> float:
        """Record a failure; returns how long the peer is now avoided."""
        penalty = self._penalties.get(worker_id)
        failures = penalty.failures + 1 if penalty else 1
        duration = min(self.max_s, self.base_s * 2 ** (failures - 1))
        self._penalties[worker_id] = _Penalty(self.clock() + duration, failures)
        return duration

    def succeed(self, worker_id: str) -> None:
        self._penalties.pop(worker_id, None)

    def blocked(self, worker_id: str) -> bool:
        penalty = self._penalties.get(worker_id)
        return penalty is not None and self.clock() < penalty.until


class PeerView:
    """ONLINE members per stage as the background refresher last read them: no I/O here, so
    the data path and the exchange may call it at every decision."""

    def __init__(self, views: ViewRefresher, *, own_id: str, rng: random.Random | None = None,
                 backoff_max_s: float = 60.0) -> None:
        self.views = views
        self.own_id = own_id
        self.rng = rng or random.Random()
        self.blacklist = Blacklist(max_s=backoff_max_s)
        self._local_load = PeerLoad()
        """What this worker observes of each peer (in flight, round trips): the routing signal."""
        self.links = LinkTimes()
        """Each next-stage peer's link round trips: which are far (routing/locality.py)."""
        self.far_ids: frozenset[str] = frozenset()
        """The peers the last measured deal judged far."""

    def members(self, stage: int) -> list[MemberRecord]:
        """ONLINE members of `stage` sorted by id, without us and without blacklisted peers."""
        return [r for r in self.views.view(stage)
                if r.worker_id != self.own_id and not self.blacklist.blocked(r.worker_id)]

    def sent_to(self, worker_id: str) -> None:
        """A microbatch went to this peer: it counts toward the peer's load until it returns."""
        self._local_load.sent(worker_id)

    def returned_from(self, worker_id: str, rtt_s: float | None = None) -> None:
        """A microbatch sent to this peer came back, or was given up on, after rtt_s seconds
        (both teach the peer's round-trip average; None: nothing to learn)."""
        self._local_load.returned(worker_id, rtt_s)

    def answered_late(self, worker_id: str, rtt_s: float) -> None:
        """A peer we had given up on (its load already released) answered after rtt_s: it
        is slow, not gone. Its round trip is learnt and its blacklisting lifted."""
        self._local_load.observe(worker_id, rtt_s)
        self.blacklist.succeed(worker_id)

    def link_measured(self, worker_id: str, round_trip_s: float, held_s: float) -> None:
        """A gradient came back `round_trip_s` after its forward left, and the peer says it held
        the forward `held_s` of that: the rest is the link's (a claim past the round trip is
        not learnt)."""
        link_s = link_round_trip(round_trip_s, held_s)
        if link_s is not None:
            self.links.observe(worker_id, link_s)

    def round_trip_s(self, worker_id: str) -> float | None:
        """The peer's round-trip average as routing sees it (None: unmeasured, or forgotten)."""
        return self._local_load.rtt_ema(worker_id)

    def local_load(self, worker_id: str) -> int:
        """Microbatches this worker has in flight at the peer."""
        return self._local_load.inflight(worker_id)

    def refresh_soon(self) -> None:
        """Someone we counted on is gone: ask the refresher for a new view (non-blocking)."""
        self.views.request()

    def refresh_now(self, stage: int) -> None:
        """Read `stage` again in this thread (start-up only: never the data path)."""
        self.views.refresh([stage])

    def choose_next_hop(self, stage: int, policy: str, exclude: set[str] | None = None) -> MemberRecord | None:
        """A live worker of `stage` by the load-aware `policy` (p2c, random), or None."""
        candidates = [r for r in self.members(stage) if not exclude or r.worker_id not in exclude]
        if not candidates:
            return None
        return self._by_id(candidates)[route_next_hop(self._costs(candidates), self.rng, policy)]

    def deal_next_hop(self, stage: int, slot: DealSlot, *, site: str = "", far_share: float = 0.5,
                      measured: bool = False) -> tuple[MemberRecord | None, bool]:
        """(the worker of `stage` the balanced deal gives `slot` to, passed_over): when the
        dealt worker is slow, the p2c choice with passed_over True; (None, False) if none is live.
        With our `site` named, the slot is dealt within it, or with probability `far_share`
        among the other sites' workers (routing/balanced.py); with no site but `measured`, the
        same with near and far judged from link round trips (routing/locality.py)."""
        candidates = self.members(stage)
        if not candidates:
            return None, False
        if measured and not site:
            self.far_ids = frozenset(self.links.far(r.worker_id for r in candidates))
        if site or measured:
            far = goes_far(slot, far_share)
            pool = [r for r in candidates if self._is_far(r, site) == far]
            if pool:
                candidates = pool
                if not far and site:  # our place among our site's senders
                    slot = dataclasses.replace(slot, sender_rank=self.rank(slot.stage, site=site))
        chosen, passed_over = balanced_next_hop(self._costs(candidates), slot, self.rng)
        return self._by_id(candidates)[chosen], passed_over

    def _is_far(self, member: MemberRecord, site: str) -> bool:
        """Of another site than our named one; without a name, judged far by its link."""
        return member.site != site if site else member.worker_id in self.far_ids

    def rank(self, stage: int, *, site: str | None = None) -> int:
        """Our index among `stage`'s live workers (of `site` only, when given) sorted by id, us
        included (where a sender's microbatches start in the deal)."""
        ids = {r.worker_id for r in self.views.view(stage) if site is None or r.site == site}
        return sorted({self.own_id, *ids}).index(self.own_id)

    def _costs(self, candidates: list[MemberRecord]) -> list[tuple[str, float]]:
        """Cost from what this worker observed itself; the advertised depth is only a hint."""
        load = self._local_load
        return next_hop_costs([(r.worker_id, load.rtt_ema(r.worker_id), load.inflight(r.worker_id), r.queue_depth)
                               for r in candidates])

    @staticmethod
    def _by_id(candidates: list[MemberRecord]) -> dict[str, MemberRecord]:
        return {r.worker_id: r for r in candidates}

    def random_peers(self, stage: int, *, site: str = "") -> list[MemberRecord]:
        """The live workers of `stage` in random order, those of our `site` (when named) first:
        a joiner's bootstrap then crosses a slow link between sites only if its own has no donor."""
        peers = self.members(stage)
        self.rng.shuffle(peers)
        return near_first(peers, site)


def near_first(members: list[MemberRecord], site: str) -> list[MemberRecord]:
    """`members` with those of `site` first, each part in its given order (no site: as given)."""
    if not site:
        return members
    return [m for m in members if m.site == site] + [m for m in members if m.site != site]

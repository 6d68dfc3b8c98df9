"""A joiner's download of its stage's state from a live peer (docs/architecture.md §5), before it turns ONLINE.

A joiner's bootstrap gets the structural checks only (noloco_rt.outer.snapshot): it has no
weights of its own yet to compare a donor's with.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import zmq

from noloco_rt.config import Config
from noloco_rt.membership.high_water import MALFORMED_MARK
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.table import Membership
from noloco_rt.net.link_probe import probe_links
from noloco_rt.outer.snapshot_client import BootstrapState, pull_bootstrap
from noloco_rt.routing.locality import FAR_MARGIN_S, donor_plan
from noloco_rt.routing.peers import PeerView
from workers.outer.service import SnapshotService

RETRY_PAUSE_S = 0.2
PROBE_DONORS = 16
"""Donors probed (the first of the random order; the rest stay unmeasured): a stage of
thousands costs a joiner no more sockets than a small one."""
PROBE_REFERENCES = 16
"""Workers of any stage probed beside the donors: enough to find one of our own site."""

REFERENCE_WAIT_S = 5.0
"""At outer step 0, how long a joiner whose probes found no worker within FAR_MARGIN_S
probes again for one of its own site to measure its donors against: workers started
together register within seconds, and a donor's state across a slow link takes longer (a
small preset's: 13 s at 10 Mbit/s)."""

LinkProbe = Callable[[list[MemberRecord]], dict[str, float]]
"""Given the donors, each probed worker's round trip in seconds (donors and references)."""


class NoDonorServed(RuntimeError):
    """Members of our stage are listed, but none served a valid bootstrap in time: gone since,
    overloaded, or records of workers that do not exist (a Redis writer can add those)."""


class StageProgressLost(RuntimeError):
    """No live peer of our stage, and the run's stage is past step 0: seeding it again would
    silently throw its training away while the other stages go on."""


def check_may_seed(stage: int, high_water: int | None, *, allow_reseed: bool, store_url: str = "") -> None:
    """Raise StageProgressLost when the first worker of `stage` must not start from the seed
    (pure: the caller read the stage's high-water mark, None when Redis did not answer, and
    found no usable checkpoint of the stage in the durable store)."""
    if allow_reseed or not high_water:
        return
    where = (f"the durable store {store_url} has no usable checkpoint of it" if store_url
             else "the run has no durable store (store.url)")
    reached = ("its high-water mark in Redis is not a step count (something else wrote it), so the run may "
               "be past step 0 there" if high_water == MALFORMED_MARK else
               f"the run reached outer step {high_water} there")
    raise StageProgressLost(
        f"stage {stage} has no live worker and {where}, but {reached}: "
        f"starting it from the seed would throw that training away. Start a worker that has a checkpoint of "
        f"stage {stage} (same --name and checkpoint dir), or pass --allow-reseed to restart the stage from "
        f"scratch (a new run needs a new run.run_id)")


class MarkAsSeen:
    """The stage's high-water mark as the bootstrap last read it. A joiner that took the seed
    because its live peers were at outer step 0 keeps that decision when one of them finishes
    outer step 1 a moment later (it pulls us along at our first outer step): the check that
    no trained stage restarts from the seed (check_may_seed) reads what the decision read.
    A bootstrap that finds no member reads the mark then too, so that a read of an earlier
    try (peers at step 0 that left since) does not stand for it; with no read at all (no
    bootstrap ran) the check asks Redis afresh."""

    def __init__(self, read: Callable[[], int | None]) -> None:
        self.read = read
        self.seen: list[int | None] = []

    def __call__(self) -> int | None:
        self.seen.append(self.read())
        return self.seen[-1]

    def for_seed_check(self) -> int | None:
        return self.seen[-1] if self.seen else self.read()


def seeds_in_its_site(donor_sites: list[str], site: str, stage_high_water: Callable[[], int | None]) -> bool:
    """Whether a joiner starts from the seed rather than pull a donor's state from another site
    (pure): it names a site, no donor is in it, and the stage has finished no outer step (0;
    None is Redis not answering). A donor then holds the seed moved by fewer than h inner
    steps, not worth a wait across a slow link (a 125m state at 10 Mbit/s: minutes); the
    first outer step pulls the joiner along. The mark is read only when the rest holds: a
    joiner without a site asks Redis nothing more."""
    return bool(site) and site not in donor_sites and stage_high_water() == 0


def stage_at_seed(donor_outer_steps: list[int], stage_high_water: Callable[[], int | None]) -> bool:
    """Whether a joiner takes the seed although its stage has live peers (pure): every donor's
    record is at outer step 0, and so is the stage's mark (None, Redis not answering, is not 0).
    A donor's bootstrap then carries the seed's φ with δ = 0 (never its θ: a joiner starts its
    inner steps from φ), so the seed is the same state without the wait: a donor serves it
    only at a step boundary of its own training thread, and a worker's first step compiles
    (on a GPU, 10 s for 125m and a minute for 1b while the joiner trained nothing). A peer
    that finishes outer step 1 just as we read pulls us along at our first outer step."""
    return all(step == 0 for step in donor_outer_steps) and stage_high_water() == 0


def bootstrap_from_stage(ctx: zmq.Context, peers: PeerView, service: SnapshotService, *, timeout_s: float,
                         pull_timeout_s: float, leave_requested: threading.Event, site: str = "",
                         stage_high_water: Callable[[], int | None] = lambda: None,
                         probe: LinkProbe | None = None) -> tuple[str, BootstrapState] | None:
    """(donor id, its state) from the first live peer of our stage that serves a valid one,
    peers of our `site` tried first, or without a site and with `probe`, the nearest by
    measured link first (each pull bounded by `pull_timeout_s`); None if the stage has no
    other member, or while it is at outer step 0 (stage_at_seed; first_in_site says so when
    its donors are in other sites).
    Raises RuntimeError when no donor served one within `timeout_s` (or a leave was asked
    meanwhile)."""
    deadline = time.monotonic() + timeout_s
    references_by = time.monotonic() + REFERENCE_WAIT_S
    while time.monotonic() < deadline and not leave_requested.is_set():
        peers.refresh_now(service.stage)  # start-up: a fresh view, read in this thread
        donors = peers.random_peers(service.stage, site=site)
        if not donors:
            stage_high_water()  # read as of this decision: the seed check goes by it, not an earlier try's
            return None
        if seeds_in_its_site([d.site for d in donors], site, stage_high_water):
            service.log.info("first_in_site", site=site, donors_elsewhere=len(donors),
                             note="the stage has taken no outer step: the seed, not a state across sites")
            return None
        at_seed = stage_at_seed([d.outer_step for d in donors], stage_high_water)
        if not site and probe is not None:
            # At the seed nothing is worth waiting for: the links only say whether it is taken
            # as the first in its site (first_in_site) or beside near peers (stage_at_seed).
            verdict, donors = order_by_measured_links(donors, probe, service, stage_high_water,
                                                      may_wait=not at_seed and time.monotonic() < references_by)
            if verdict == "seed":
                return None
            if verdict == "wait":
                time.sleep(RETRY_PAUSE_S)
                continue
        if at_seed:
            service.log.info("stage_at_seed", donors=len(donors),
                             note="every live peer of the stage is at outer step 0: the seed is their φ")
            return None
        for donor in donors:
            state = pull_bootstrap(ctx, donor.worker_id, donor.exchange_addr, service.reader, stage=service.stage,
                                   sender=service.worker_id, timeout_s=pull_timeout_s,
                                   on_reject=service.count_reject, log=service.log)
            if state is not None:
                return donor.worker_id, state
            peers.blacklist.fail(donor.worker_id)
        time.sleep(RETRY_PAUSE_S)
    raise NoDonorServed(f"no peer of stage {service.stage} served a bootstrap within {timeout_s} s")


def order_by_measured_links(donors: list[MemberRecord], probe: LinkProbe, service: SnapshotService,
                            stage_high_water: Callable[[], int | None], *,
                            may_wait: bool = False) -> tuple[str, list[MemberRecord]]:
    """("ask", the donors nearest first by probed link); ("seed", []): every donor is far
    (another site holds the whole stage, judged against workers of any stage) and the stage
    is at outer step 0, so the seed, as a named site's first worker does (seeds_in_its_site);
    ("wait", []): at step 0 nobody answered within FAR_MARGIN_S and `may_wait`: nothing yet
    tells a donor in another site from one in ours, and workers starting together are still
    registering."""
    links = probe(donors)
    plan = donor_plan([d.worker_id for d in donors], links)
    # Nobody answered within FAR_MARGIN_S: nothing known to be in our site to judge the donors
    # against yet. (A donor within it can never be judged far, whatever answers later.)
    nobody_near = min(links.values(), default=0.0) >= FAR_MARGIN_S
    if may_wait and nobody_near and stage_high_water() == 0:
        return "wait", []
    nearest = min(links.values(), default=None)
    service.log.info("donor_links", donors_ms={d[:8]: round(links[d] * 1e3, 2) for d in plan.order if d in links},
                     far=sorted(d[:8] for d in plan.far), nearest_ms=None if nearest is None else round(nearest * 1e3, 2),
                     probed=len(links))
    if plan.all_far and stage_high_water() == 0:
        service.log.info("first_in_site", site="", donors_elsewhere=len(donors), measured=True,
                         note="every donor is far by measured link and the stage has taken no outer step: "
                              "the seed, not a state across sites")
        return "seed", []
    by_id = {d.worker_id: d for d in donors}
    return "ask", [by_id[d] for d in plan.order]


def link_probe(ctx: zmq.Context, membership: Membership, cfg: Config, *, worker_id: str, stage: int,
               rng: random.Random | None = None) -> LinkProbe | None:
    """The probe a joiner orders its donors by where routing.locality is auto and no
    worker.site is named (None otherwise: labels decide): up to PROBE_DONORS donors and
    PROBE_REFERENCES other workers of any stage, joining or online (their exchange sockets
    answer from start-up), timed over their exchange sockets (noloco_rt/net/link_probe.py)."""
    if cfg.routing.locality != "auto" or cfg.worker.site:
        return None
    run_id, stages = cfg.run.run_id, cfg.pipeline.stages
    chooser = rng or random.Random()
    live = {WorkerState.JOINING, WorkerState.ONLINE}

    def probe(donors: list[MemberRecord]) -> dict[str, float]:
        donor_ids = {d.worker_id for d in donors}
        others = [m for s in range(stages) for m in membership.stage_view(s, states=live)
                  if m.worker_id != worker_id and m.worker_id not in donor_ids]
        chooser.shuffle(others)
        targets = {d.worker_id: d.exchange_addr for d in donors[:PROBE_DONORS]}
        targets |= {m.worker_id: m.exchange_addr for m in others[:PROBE_REFERENCES]}
        return probe_links(ctx, targets, run_id=run_id, sender=worker_id, stage=stage)

    return probe

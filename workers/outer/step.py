"""The outer step (docs/architecture.md §1, §4) on the training thread: hand the round to the exchanger,
and either wait for it (blocking, the paper's semantics) or take the provisional local
step at once and correct it exactly at the first inner-step boundary after the partners'
states are in (overlap). A round not settled within outer.max_delay_steps is closed: its
partners drop their side with us, or, where a partner's push was already kept, both apply.

A step is taken when our clock reaches it, or earlier when a partner's push for it is
already here (noloco_rt/outer/schedule.py): a slower worker is pulled along, never waited for.

The training thread crosses the device boundary twice per outer step and never waits on
it: our contribution starts its copy to the host at the step, and the correction (computed
on the host by the exchanger) comes back to the device where it is applied."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.logs import EventLog
from noloco_rt.membership.records import MemberRecord
from noloco_rt.outer.delta_exchange import sends_whole_state
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState
from noloco_rt.outer.matching import matched_partners, view_digest
from noloco_rt.outer.schedule import outer_step_due, pull_target
from noloco_rt.routing.peers import PeerView
from workers.counters import Counters
from workers.metrics import WorkerMetrics
from workers.outer.exchanger import OuterExchanger, OuterRound, RoundResult
from workers.outer.partners import Partner
from workers.outer.service import SnapshotService

MIN_READY_WINDOW_S = 0.05


class StepTimer:
    """Seconds per inner step, a moving average over the boundaries it is told of."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.value = 0.0
        self._last: float | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if self._last is not None:
            elapsed = now - self._last
            self.value = elapsed if self.value == 0.0 else (1 - self.weight) * self.value + self.weight * elapsed
        self._last = now


@dataclass(frozen=True)
class DrawnGroup:
    """Our partners at an outer step as drawn from our view of the stage."""

    partners: list[MemberRecord]
    view: str
    """The view's digest (noloco_rt.outer.matching.view_digest): equal digests, equal partitions."""
    avoided: list[str]
    """Partners of the partition left out: recently unreachable (the blacklist)."""


@dataclass
class PendingRound:
    """An overlapped outer step whose correction has not been applied yet."""

    outer_step: int
    inner_step: int
    """Our inner step count when the provisional step was taken."""
    drawn: DrawnGroup
    """Our seeded group (by readiness: the fallback), its view and the partners it left out,
    for the log (the group's ids when no result came)."""
    closed: bool = False
    """Given up as late: partners' pushes for it are refused from then on."""
    committed: frozenset[str] = frozenset()
    """Partners whose pushes were kept before it closed: they may use ours, so the result is
    awaited and applied (a drop would be one-sided)."""


class OuterStep:
    """Every H inner steps: the outer step with our matched group (noloco), else alone."""

    def __init__(self, cfg: Config, *, exchanger: OuterExchanger, service: SnapshotService, replica: StageReplica,
                 peers: PeerView, counters: Counters, metrics: WorkerMetrics, log: EventLog) -> None:
        self.cfg = cfg
        self.settings = cfg.outer.resolved()
        self.coeffs = OuterCoefficients.from_config(self.settings)
        self.overlap = cfg.outer.overlap
        self.max_delay_steps = self.settings.max_delay_steps
        self.exchanger = exchanger
        self.replica = replica
        self.peers = peers
        self.service = service
        self.worker_id = service.worker_id
        self.stage = service.stage
        self.counters = counters
        self.metrics = metrics
        self.log = log
        self.pending: PendingRound | None = None
        self.by_readiness = cfg.outer.pairing == "ready" and self.settings.method == "noloco"
        self.pulls = self.settings.method == "noloco" and cfg.outer.pairing == "matched"
        """Seeded groups pair equal steps: a partner's push for our next step may pull us to it."""
        self.step_seconds = StepTimer()
        self.on_final: Callable[[], None] = lambda: None
        """Called once each outer step is final (settled, or local): the worker's checkpoint."""

    def due(self, clock_steps: int) -> bool:
        """Whether our clock has reached our next outer step (outer_step_due)."""
        return outer_step_due(clock_steps, self.counters.outer_steps, self.settings.h)

    def pulled_to(self) -> int | None:
        """The outer step a partner of ours for it has pushed its state for already, before
        our clock got there (our next one, or a later one when we are further behind): we
        take it now rather than keep that partner waiting (noloco_rt/outer/schedule.py)."""
        if not self.pulls:
            return None
        next_step = self.counters.outer_steps + 1
        pushed = self.service.inbox.latest_pushes(next_step)
        if not pushed:
            return None
        return pull_target(pushed, lambda step: [p.worker_id for p in self.partners(step)], next_step)

    def take(self, *, pulled_to: int | None = None) -> None:
        """The outer step: the local step at once; with overlap, its correction comes later
        (settle), else we wait for the partners here and correct at once (delay 0: exactly
        the paper's blocking step). `pulled_to`: the step a partner's push brought before
        our clock did (outer steps before it are skipped, not taken)."""
        started = time.monotonic()
        self.settle(final=True)  # a round still open now is later than any allowed delay
        outer_step = self.counters.outer_steps + 1
        if pulled_to is not None:  # stage 0's clock jumps; a later stage's is its data
            skipped = self.counters.pull_clock_to(pulled_to, h=self.settings.h, clock=self.stage == 0)
            self.log.info("outer_step_pulled", outer_step=pulled_to, skipped_steps=skipped,
                          skipped_outer_steps=pulled_to - outer_step)
            outer_step = pulled_to
        drawn = self.group(outer_step) if self.settings.method == "noloco" else DrawnGroup([], "", [])
        partners = drawn.partners
        own, sparse = self._local_step(outer_step)
        self.counters.outer_steps = outer_step
        if not partners:
            self._record(outer_step, None, delay=0, drawn=drawn)
        else:
            self.exchanger.begin(OuterRound(outer_step, self.service.boundary.contribution_to_host(own, sparse=sparse),
                                            [Partner.of(p, outer_step) for p in partners], self.coeffs,
                                            by_readiness=self.by_readiness, window_s=self.ready_window_s(),
                                            sparse=sparse))
            self.pending = PendingRound(outer_step, self.counters.inner_steps, drawn)
            if not self.overlap:
                self.settle(final=True, wait_s=self.round_wait_s)
        blocked = time.monotonic() - started
        self.counters.outer_blocked_s += blocked
        self.metrics.outer_blocked_seconds.inc(blocked)

    def _local_step(self, outer_step: int) -> tuple[PeerOuterState, bool]:
        """The provisional local step, taken now; (what we send, whether the round is sparse).
        With worker.delta_codec it steps with Δ plus what earlier rounds did not send, and a
        sparse round with what it sends (x̂, computed on the replica's device), with our φ for
        the partner's peer check (noloco_rt/outer/delta_exchange.py)."""
        worker = self.cfg.worker
        if not worker.delta_codec:
            return self.replica.provisional_outer_step(self.coeffs), False
        whole = self.whole_state(outer_step)
        slow = None if whole else [s.clone() for s in self.replica.slow]
        sent = self.replica.delta_outer_step(self.coeffs, delta_codec=worker.delta_codec, whole=whole,
                                             theta_only=self.coeffs.theta_shortcut,
                                             error_feedback=worker.error_feedback)
        return (sent, False) if whole else (PeerOuterState(slow=slow, outer_grad=sent.outer_grad), True)

    def whole_state(self, outer_step: int) -> bool:
        """Whether this step exchanges the whole state (else Δ alone, sparse: worker.delta_codec)."""
        worker = self.cfg.worker
        return sends_whole_state(outer_step, delta_codec=worker.delta_codec, theta_every=worker.theta_every)

    def ready_window_s(self) -> float:
        """How long to wait in the readiness queue: with overlap, the inner steps a correction
        may lag less one for the exchange itself (training goes on meanwhile); blocking, a
        couple of inner steps."""
        steps = max(0.5, self.max_delay_steps - 1) if self.overlap else 2
        return min(self.exchanger.collect_s, max(MIN_READY_WINDOW_S, steps * self.step_seconds.value))

    def after_inner_step(self) -> None:
        """Each inner-step boundary: time it, and apply a pending correction that is due (and
        what follows a final step: the checkpoint's copy; a joiner's copy when one was asked
        for), timed as blocked like the outer step."""
        self.step_seconds.tick()
        started = time.monotonic()
        self.settle()
        if self.pending is None:  # φ and δ are final: a joiner's copy, if one was asked for
            self.service.publish_bootstrap_if_wanted()
        blocked = time.monotonic() - started
        self.counters.outer_blocked_s += blocked
        self.metrics.outer_blocked_seconds.inc(blocked)

    @property
    def round_wait_s(self) -> float:
        """The longest a round can take: the collection window, the wait for our push's
        acknowledgement, asking a partner whose acknowledgement was lost, and room for
        compressing."""
        return 3 * self.exchanger.collect_s + 5.0

    def finish(self) -> None:
        """Training is over: waiting costs nothing now, so the last correction is not dropped;
        then the last round's partners learn what we decided (we will not answer questions)."""
        self.settle(final=True, wait_s=self.round_wait_s)
        self.service.publish_bootstrap()  # our final state, for whoever asks while we wind down
        self.exchanger.tell_last_round()

    def settle(self, *, final: bool = False, wait_s: float = 0.0) -> None:
        """At an inner-step boundary (nothing in flight): apply the pending correction once its
        partners' states are in. Past max_delay_steps (or `final`: the next outer step, the
        end) the round is closed: partners not heard from are refused, so they drop their
        side too, and with no partner's push kept it is dropped here. Symmetric either way:
        a result is always applied, since each state it used is a partner using ours. Waits
        only when told (blocking step, end of training) or to settle a closed round at `final`."""
        pending = self.pending
        if pending is None:
            return
        delay = self.counters.inner_steps - pending.inner_step
        late = final or delay > self.max_delay_steps
        result = self.exchanger.result(pending.outer_step, wait_s=wait_s)
        if result is None and late and not pending.closed:
            pending.closed = True
            pending.committed = frozenset(self.exchanger.give_up(pending.outer_step))
        if result is None and pending.committed:
            if not final:
                return  # a kept partner may use ours: its side is settled by our push's acknowledgement
            result = self.exchanger.result(pending.outer_step, wait_s=self.round_wait_s)
        if result is None and not late:
            return
        self.pending = None
        if result is not None and result.correction is not None:  # the host -> device crossing, then δ, φ, θ += c
            self.replica.correct_outer_step(self.service.boundary.to_device(result.correction,
                                                                            like=self.replica.slow))
            self.metrics.correction_delay.observe(delay)
        if result is None:  # closed with no partner kept (or, stuck past round_wait_s, kept ones: said so)
            if pending.committed:
                self.log.error("outer_round_unsettled", outer_step=pending.outer_step,
                               partners=sorted(p[:8] for p in pending.committed))
            self._record(pending.outer_step, None, delay=delay, dropped=True,
                         reason="one_sided" if pending.committed else None, drawn=pending.drawn)
            return
        given_up = pending.closed and not result.used and result.failed is None  # a failed round says so instead
        self._record(pending.outer_step, result, delay=delay, dropped=given_up, drawn=pending.drawn)

    def _record(self, outer_step: int, result: RoundResult | None, *, delay: int, dropped: bool = False,
                drawn: DrawnGroup, reason: str | None = None) -> None:
        used = [] if dropped or result is None else result.used
        group = result.partners if result is not None else [p.worker_id for p in drawn.partners]
        kind = "dropped_late" if dropped else outer_step_kind(len(group), len(used),
                                                             failed=result is not None and result.failed is not None)
        self.counters.count_outer_step(kind, reason or unmatched_reason(kind, group, result))
        self.metrics.outer_steps.labels(kind=kind).inc()
        fields: dict[str, Any] = {}
        if drawn.avoided:
            fields["avoided"] = [a[:8] for a in drawn.avoided]
        if result is not None:
            self.metrics.exchange_bytes_wire.inc(result.wire_bytes)
            self.metrics.exchange_bytes_raw.inc(result.raw_bytes)
            self.metrics.exchange_latency.observe(result.seconds)
            fields = {"exchange_s": round(result.seconds, 3), "pairing": result.pairing, "wire_bytes": result.wire_bytes,
                      "raw_bytes": result.raw_bytes, "missing": {k[:8]: v for k, v in result.missing.items()}}
            if result.phases:
                fields["phases_s"] = {k: round(v, 3) for k, v in result.phases.items()}
            if result.failed is not None:
                fields["failed"] = result.failed
            if used and result.correction_sums is not None:
                # Σ c and Σ |c|: over a matched group the c sum to 0 (the mean is kept)
                fields.update(correction_sum=result.correction_sums[0], correction_abs=result.correction_sums[1])
        self.log.info("outer_step_done", outer_step=outer_step, inner_step=self.counters.inner_steps, kind=kind, group=[p[:8] for p in group],
                      used=[u[:8] for u in used], view=drawn.view, delay=delay, overlap=self.overlap,
                      codec=self.cfg.worker.snapshot_codec if self.whole_state(outer_step) else self.cfg.worker.delta_codec,
                      **fields)
        # The step is final now (corrected, or local): what joiners download (our clock: where the
        # stage is), and what a checkpoint keeps.
        self.service.state_final(self.replica, self.counters.clock_steps, self.counters.outer_steps)
        self.on_final()

    def partners(self, outer_step: int) -> list[MemberRecord]:
        """Our group at `outer_step` in the partition of our stage's view (us included)."""
        return self.group(outer_step).partners

    def group(self, outer_step: int) -> DrawnGroup:
        """Our group at `outer_step`, with what the log needs to tell a partition's view lag
        from a fault: the view's digest and the partners left out."""
        view = {r.worker_id: r for r in self.peers.views.view(self.stage)}
        members = [*view, self.worker_id]
        ids = matched_partners(members, self.worker_id, seed=self.cfg.run.seed, stage=self.stage,
                               outer_step=outer_step, group_size=self.settings.group_size)
        # A partner we recently failed to reach (stopped, gone) is not waited for again: a local step.
        avoided = [i for i in ids if self.peers.blacklist.blocked(i)]
        return DrawnGroup([view[i] for i in ids if i not in avoided], view_digest(members), avoided)


def outer_step_kind(partners: int, used: int, *, failed: bool = False) -> str:
    """matched: every computed partner's state was used; partial: some; local: none (or
    alone); failed: the round raised (the step stayed local, and that is a bug to see)."""
    if failed:
        return "failed"
    if partners and used == partners:
        return "matched"
    return "partial" if used else "local"


def unmatched_reason(kind: str, group: list[str], result: RoundResult | None) -> str | None:
    """Why an outer step was not matched, in one word (None when it was): the exception type
    of a failed round, dropped_late, alone (no partner to pair with), else the most frequent
    reason a partner's state was not used (no_push, push_failed, too_far, cancelled)."""
    if kind == "matched":
        return None
    if kind == "failed" and result is not None and result.failed is not None:
        return f"failed:{result.failed}"
    if kind == "dropped_late":
        return "dropped_late"
    if not group:
        return "alone"
    reasons = list(result.missing.values()) if result is not None else []
    return max(set(reasons), key=reasons.count) if reasons else "unknown"

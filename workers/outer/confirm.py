"""Whether a partner kept our push: its acknowledgement, its own word, or its answer when asked.

A partner's state is used only when its push reached us and ours was acknowledged (so it
uses ours too). When our push stalled with no acknowledgement, the partner may still have
kept it (the acknowledgement lost on the way back), so the exchanger asks it, saying we
kept its push, and does as it decided (workers/outer/verdicts.py holds both sides' record).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import zmq

from noloco_rt.logs import EventLog
from noloco_rt.net.transport import request
from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.snapshot import SnapshotReader, SnapshotRejected
from workers.outer.partners import Partner
from workers.outer.service import SnapshotService
from workers.outer.verdicts import PairVerdicts, Verdict

TRY_S = 0.5
"""One question's wait for its answer; it is asked again until the window ends."""
RETRY_S = 0.1
"""Between an answer of "pending" (or none) and the next question."""


def acknowledged(verdicts: PairVerdicts, partner_id: str, step: int, push: Future[bool | None], *,
                 wait_s: float) -> bool | None:
    """Whether the partner, whose push is here (so it may use ours), kept ours for our step
    `step`: True once it acknowledged our push or told us so itself, False when it refused
    it, None when the push stalled with no word (ask). Ours left when theirs did; its own
    stall timeout bounds the wait, and so does wait_s."""
    deadline = time.monotonic() + wait_s
    while not push.done() and not verdicts.kept_ours(partner_id, step) and verdicts.told(partner_id, step) is None:
        if (remaining := deadline - time.monotonic()) <= 0:
            break
        verdicts.wait(min(remaining, 0.05))
    if (told := verdicts.told(partner_id, step)) is not None:
        return told  # it used ours (so it kept it), or declined it
    if verdicts.kept_ours(partner_id, step):
        return True
    if not push.done() or push.exception() is not None:
        return None
    return push.result()


def ask_partner(ctx: zmq.Context, service: SnapshotService, partner: Partner, step: int, *, window_s: float,
                log: EventLog) -> Verdict | None:
    """Ask an unsure partner, telling it we kept its push, whether it uses ours (its
    decision once made): USED (so must we), DECLINED or UNKNOWN, or None when no answer came
    within window_s. Its own question meanwhile is its acknowledgement of ours: USED."""
    verdicts = service.verdicts
    question = service.confirm_message(partner.outer_step)
    deadline = time.monotonic() + window_s
    verdict: Verdict | None = None
    while verdict is None and (remaining := deadline - time.monotonic()) > 0:
        if (told := verdicts.told(partner.worker_id, step)) is not None:  # it finished or left, and said
            verdict = Verdict.USED if told else Verdict.DECLINED
            break
        if verdicts.kept_ours(partner.worker_id, step):
            verdict = Verdict.USED
            break
        verdict = read_verdict(service.reader, request(ctx, partner.exchange_addr, question,
                                                       timeout_s=min(remaining, TRY_S)))
        if verdict is Verdict.PENDING or verdict is None:
            verdict = None
            verdicts.wait(min(max(0.0, deadline - time.monotonic()), RETRY_S))
    if verdict is None and verdicts.kept_ours(partner.worker_id, step):
        verdict = Verdict.USED
    if verdict is None:
        log.warning("outer_round_unconfirmed", peer=partner.worker_id[:8], outer_step=step, waited_s=window_s)
    else:
        log.info("outer_round_confirmed", peer=partner.worker_id[:8], outer_step=step, verdict=verdict.value)
    return verdict


def read_verdict(reader: SnapshotReader, reply: list[zmq.Frame] | None) -> Verdict | None:
    """A partner's answer to our question; None for no answer or a malformed one."""
    if reply is None:
        return None
    try:
        header = reader.message(reply).header
        if MessageKind(header.kind) != MessageKind.OUTER_VERDICT:
            return None
        return Verdict(header.extra.verdict)
    except (SnapshotRejected, ValueError):
        return None


def tell_partners(ctx: zmq.Context, service: SnapshotService, step: int, partners: list[Partner], *,
                  timeout_s: float, pool: Any) -> int:
    """Tell each partner of our round `step` what we decided on its push, unasked (we finish
    or leave, and will not be there to answer a question): best effort, all at once, within
    timeout_s. Returns how many partners took it."""
    def tell(partner: Partner) -> bool:
        used = service.verdicts.decision(partner.worker_id, step)
        if used is None:
            return False
        reply = request(ctx, partner.exchange_addr, service.verdict_message(partner.outer_step, used),
                        timeout_s=timeout_s)
        return reply is not None
    told = [pool.submit(tell, p) for p in partners]
    return sum(1 for f in told if _result_within(f, timeout_s + 0.5))


def _result_within(future: Future[bool], timeout_s: float) -> bool:
    try:
        return bool(future.result(timeout=timeout_s))
    except Exception:  # noqa: BLE001 - best effort: a partner gone is a partner not told
        return False

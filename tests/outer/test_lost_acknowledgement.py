"""A lost acknowledgement settles the same on both sides (workers/outer/verdicts.py).

A partner's state is used only when its push reached us and ours was acknowledged. When
an acknowledgement is lost after the push it acknowledges was kept (a partition or a
stopped process at that instant), the partner may use ours while we, unsure, would not:
one-sided, the replicas' mean moves. The unsure side asks, saying it kept the partner's
push, and does as the partner decided. Two workers' exchange parts over loopback ZeroMQ;
a wrapper around an exchange server's handler loses its replies as the network would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import zmq

from noloco_rt.net.wire import MessageKind, decode_message
from tests.support.exchange_pair import ExchangeParts, overlapped_pair
from tests.support.waiting import wait_until
from workers.outer.confirm import acknowledged
from workers.outer.verdicts import MAX_RECORDS, PairVerdicts, Verdict

COLLECT_S = 1.0
"""Each worker's collection window: a stalled push is given up after it."""


class _Lost(Exception):
    """Raised by a wrapped handler: the exchange server then sends no reply."""


def _kind(frames: list[Any]) -> MessageKind:
    return MessageKind(decode_message(frames, expected_run_id="devices").header.kind)


def _lose(worker: ExchangeParts, *, lost: Callable[[MessageKind, MessageKind], bool]) -> None:
    """The worker's exchange server handles every request, but loses the reply where
    lost(request kind, reply kind) says so; a request that is lost before handling is
    said by lost(request kind, ERROR)."""
    handle = worker.server.handler

    def handler(frames: list[zmq.Frame]) -> list[Any]:
        request = _kind(frames)
        if lost(request, MessageKind.ERROR):
            raise _Lost
        reply = handle(frames)
        if lost(request, _kind(reply)):
            raise _Lost
        return reply

    worker.server.handler = handler


def _done(worker: ExchangeParts) -> dict[str, Any]:
    (done,) = worker.log.events("outer_step_done")
    return done


def _events(worker: ExchangeParts, name: str) -> list[dict[str, Any]]:
    return worker.log.events(name)


def _both_step(a: ExchangeParts, b: ExchangeParts) -> None:
    a.step.take()
    b.step.take()
    a.step.finish()
    b.step.finish()


def test_an_acknowledgement_lost_after_the_push_was_kept_is_asked_for_and_both_use():
    """b keeps a's push but its acknowledgement never reaches a; b's push is acknowledged by a,
    so b uses a's state. a, unsure, asks b, learns b used it, and uses b's: both matched, the
    corrections cancel. (Before: a declined with push_failed, b applied: one-sided.)"""
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        _lose(b, lost=lambda request, reply: reply == MessageKind.SNAPSHOT_ACK)
        _both_step(a, b)
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
        assert [e["verdict"] for e in _events(a, "outer_round_confirmed")] == ["used"]
        sums = [_done(w)["correction_sum"] for w in (a, b)]
        assert abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums), sums


def test_when_both_acknowledgements_are_lost_each_question_acknowledges_the_other():
    """Both pushes kept, both acknowledgements lost: each side asks; each question says the
    asker kept the other's push, which is what the lost acknowledgement said. Both use."""
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        for worker in (a, b):
            _lose(worker, lost=lambda request, reply: reply == MessageKind.SNAPSHOT_ACK)
        _both_step(a, b)
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
            assert _events(worker, "outer_round_unconfirmed") == []
        sums = [_done(w)["correction_sum"] for w in (a, b)]
        assert abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums), sums


def test_a_push_that_never_arrived_is_declined_on_both_sides_after_asking():
    """a's push is lost before b's server sees it. a has b's push and, unsure, asks; b never
    got a's, declines it (no_push) and says so: neither applies a correction."""
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        _lose(b, lost=lambda request, reply: request == MessageKind.SNAPSHOT_PUSH and reply == MessageKind.ERROR)
        _both_step(a, b)
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"local": 1}, worker.log.lines
            assert "correction_sum" not in _done(worker)
        assert dict(b.counters.unmatched_reasons) == {"no_push": 1}
        assert dict(a.counters.unmatched_reasons) == {"push_failed": 1}
        assert [e["verdict"] for e in _events(a, "outer_round_confirmed")] == ["declined"]


def test_a_partner_that_never_answers_leaves_the_step_local_and_says_unconfirmed():
    """b keeps a's push, then neither acknowledges nor answers any question: a declines
    after its window and counts the step as unconfirmed (the one case asking cannot mend)."""
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        _lose(b, lost=lambda request, reply: reply in (MessageKind.SNAPSHOT_ACK, MessageKind.OUTER_VERDICT))
        _both_step(a, b)
        assert dict(a.counters.unmatched_reasons) == {"unconfirmed": 1}
        (unconfirmed,) = _events(a, "outer_round_unconfirmed")
        assert unconfirmed["waited_s"] == COLLECT_S


def test_a_partner_that_finishes_tells_its_decision_so_nobody_waits_to_ask():
    """b keeps a's push, its acknowledgement is lost, and it answers no question; but b
    finishes right after the round and tells a, unasked, that it used a's state. a takes that
    word at once (no question, no window spent) and uses b's: both matched."""
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        _lose(b, lost=lambda request, reply: reply in (MessageKind.SNAPSHOT_ACK, MessageKind.OUTER_VERDICT))
        a.step.take()
        b.step.take()
        b.step.finish()
        a.step.finish()
        for worker in (a, b):
            assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
        assert _events(a, "outer_round_unconfirmed") == [] and _events(a, "outer_round_confirmed") == []
        assert [e["told"] for e in _events(b, "outer_round_told")] == [1]
        assert _done(a)["exchange_s"] < 2 * COLLECT_S  # the push's stall, not a question's window too
        sums = [_done(w)["correction_sum"] for w in (a, b)]
        assert abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums), sums


def test_verdicts_answer_with_the_decision_once_made_and_take_a_question_as_an_acknowledgement():
    verdicts = PairVerdicts()
    assert verdicts.answer("a", 3) is Verdict.PENDING
    assert verdicts.kept_ours("a", 3) and not verdicts.kept_ours("a", 4)
    verdicts.decide("a", 3, True)
    verdicts.decide("b", 3, False)
    assert verdicts.answer("a", 3) is Verdict.USED and verdicts.answer("b", 3) is Verdict.DECLINED
    verdicts.round_over(3)
    assert verdicts.answer("c", 3) is Verdict.UNKNOWN  # a round over with no word on c: never ours
    assert not verdicts.kept_ours("a", 3)  # the acknowledgement served its round
    verdicts.round_over(20)
    assert verdicts.decision("a", 3) is None and verdicts.answer("a", 3) is Verdict.UNKNOWN
    verdicts.note_told("b", 21, True)
    assert verdicts.told("b", 21) is True and verdicts.told("b", 22) is None


def test_questions_from_made_up_senders_do_not_grow_the_record():
    verdicts = PairVerdicts()
    for i in range(10 * MAX_RECORDS):
        verdicts.answer(f"made-up-{i}", 5 + i % 7)
    assert sum(verdicts.kept_ours(f"made-up-{i}", 5 + i % 7) for i in range(10 * MAX_RECORDS)) == MAX_RECORDS


def test_a_settled_push_wakes_the_wait_for_its_acknowledgement():
    """The exchanger calls wake() when a push settles (exchanger._push_settled): a wait on
    the verdicts re-checks then, not at its next poll (most of a fast round's time)."""
    verdicts = PairVerdicts()
    woken = threading.Thread(target=verdicts.wait, args=(60.0,))
    woken.start()
    # wake() until the 60-s wait returns: only a notification ends it this soon.
    wait_until(lambda: (verdicts.wake(), not woken.is_alive())[1], 10.0, "the wait to be woken")
    # And the acknowledgement's wait returns with the settled push's answer.
    push: Future[bool | None] = Future()
    push.add_done_callback(lambda _f: verdicts.wake())
    push.set_result(True)
    assert acknowledged(verdicts, "b", 3, push, wait_s=60.0) is True

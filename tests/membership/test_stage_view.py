"""The per-stage index of the membership table: reads that cost one stage, kept up to date
from its change log, against a real redis-server on a free loopback port."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.refresher import ViewRefresher, auto_refresh_interval_s
from noloco_rt.membership.stage_view import EMPTY_CURSOR, needs_full_read, parse_rows
from noloco_rt.membership.table import Membership
from tests.support.waiting import wait_until


@pytest.fixture
def server():
    with EmbeddedRedis() as running:
        yield running


def record(worker_id: str, stage: int = 0, state: WorkerState = WorkerState.ONLINE) -> MemberRecord:
    return MemberRecord(worker_id=worker_id, run_id="r", stage=stage, data_addr=f"tcp://127.0.0.1:1{stage}",
                        exchange_addr="tcp://127.0.0.1:2", state=state)


def ids(records) -> list[str]:
    return [r.worker_id for r in records]


# -- pure parts ---------------------------------------------------------------------------------

def test_full_read_when_the_cursor_cannot_be_followed():
    assert needs_full_read(None, None)  # never read
    assert not needs_full_read(EMPTY_CURSOR, None)  # read while empty, still empty
    assert needs_full_read("5-0", None)  # the log vanished (Redis restarted empty)
    assert not needs_full_read("5-0", "5-0") and not needs_full_read("5-1", "4-9")
    assert needs_full_read("5-0", "5-1")  # our cursor was trimmed off the log's start
    assert needs_full_read("9-0", "10-0")  # numeric, not text, order


def test_parse_rows_skips_rows_that_are_not_records_of_the_stage():
    good, other_stage = record("a"), record("b", stage=1)
    parsed = parse_rows([("a", good.to_json()), ("b", other_stage.to_json()), ("c", "{"), ("d", None),
                         ("e", good.to_json())], stage=0)
    assert ids(parsed.records.values()) == ["a"] and parsed.removed == {"d"} and parsed.malformed == 3


def test_auto_refresh_interval_grows_with_the_fleet_within_bounds():
    assert auto_refresh_interval_s(4) == 0.5 and auto_refresh_interval_s(2_500) == 0.5
    assert auto_refresh_interval_s(10_000) == 2.0 and auto_refresh_interval_s(10**7) == 10.0


# -- the stage view against Redis ---------------------------------------------------------------

def test_view_follows_joins_state_changes_and_leaves_reading_only_changes(server):
    reader = Membership(connect(server.url), run_id="r")
    b = Membership(connect(server.url), run_id="r")
    b.register(record("b", state=WorkerState.JOINING))
    assert ids(reader.stage_view(0)) == [] and ids(reader.stage_view(0, states=None)) == ["b"]
    a = Membership(connect(server.url), run_id="r")
    a.register(record("a"))
    assert b.set_state(WorkerState.ONLINE)
    assert ids(reader.stage_view(0)) == ["a", "b"]  # sorted by id
    assert b.leave()
    assert ids(reader.stage_view(0)) == ["a"]
    full_reads, change_reads = reader.view_reads(0)
    assert full_reads == 1 and change_reads >= 2


def test_heartbeats_do_not_touch_the_view_but_a_queue_depth_hint_does_slowly(server):
    clock = [1000.0]
    a = Membership(connect(server.url), run_id="r", hint_interval_s=5.0, clock=lambda: clock[0])
    reader = Membership(connect(server.url), run_id="r", clock=lambda: clock[0])
    a.register(record("a"))
    reader.stage_view(0)
    for depth in (1, 2, 3):  # beats within the hint interval: the view keeps what was published
        clock[0] += 1.0
        a.heartbeat(queue_depth=depth)
    assert reader.stage_view(0)[0].queue_depth == 0
    assert reader.view_reads(0)[1] == 0
    clock[0] += 5.0
    a.heartbeat(queue_depth=7)
    assert reader.stage_view(0)[0].queue_depth == 7


def test_a_dead_member_is_pruned_from_its_stage_by_a_reader(server):
    client = connect(server.url)
    dead = Membership(client, run_id="r", heartbeat_interval_s=0.1, ttl_s=0.3)
    reader = Membership(connect(server.url), run_id="r", heartbeat_interval_s=0.1, ttl_s=0.3)
    dead.register(record("dead"))
    reader.register(record("alive"))
    assert ids(reader.stage_view(0)) == ["alive", "dead"]

    def dead_is_gone() -> bool:
        reader.heartbeat()
        return ids(reader.stage_view(0)) == ["alive"]

    wait_until(dead_is_gone, 5.0, "the dead member to be pruned")
    assert client.zscore(reader.keys.beats(0), "dead") is None
    assert client.hexists(reader.keys.members(0), "dead") == 0


def test_a_pruned_member_that_comes_back_is_seen_again(server):
    client = connect(server.url)
    a = Membership(client, run_id="r")
    reader = Membership(connect(server.url), run_id="r")
    a.register(record("a"))
    assert ids(reader.stage_view(0)) == ["a"]
    client.delete(a.key("a"))  # as if its TTL had lapsed during a long pause
    reader.live_members(stage=0)  # notices, prunes
    assert ids(reader.stage_view(0)) == []
    assert a.heartbeat()
    assert ids(reader.stage_view(0)) == ["a"]


def test_a_trimmed_log_or_an_emptied_redis_makes_the_reader_read_whole(server):
    client = connect(server.url)
    reader = Membership(connect(server.url), run_id="r")
    a = Membership(client, run_id="r")
    a.register(record("a"))
    assert ids(reader.stage_view(0)) == ["a"]
    Membership(client, run_id="r").register(record("b"))
    client.xtrim(reader.keys.log(0), maxlen=0)  # b's entry is gone before the reader saw it
    Membership(client, run_id="r").register(record("c"))
    assert ids(reader.stage_view(0)) == ["a", "b", "c"]
    assert reader.view_reads(0)[0] == 2
    server.stop()
    assert ids(reader.stage_view(0)) == ["a", "b", "c"]  # cached through the outage
    server.start()  # empty
    assert ids(reader.stage_view(0)) == []
    assert a.heartbeat()  # a re-registers
    assert ids(reader.stage_view(0)) == ["a"]


def test_refresher_serves_views_without_io_and_reports_their_age(server):
    a = Membership(connect(server.url), run_id="r")
    a.register(record("a"))
    views = ViewRefresher(Membership(connect(server.url), run_id="r"), {0, 1}, interval_s=0.1)
    views.start()
    try:
        assert ids(views.view(0)) == ["a"] and views.view(1) == [] and views.view(7) == []
        assert views.staleness_s() < 5.0
        Membership(connect(server.url), run_id="r").register(record("n", stage=1))
        wait_until(lambda: ids(views.view(1)) == ["n"], 5.0, "the refresher to see the joiner")
        server.stop()
        wait_until(lambda: views.staleness_s() > 0.5, 10.0, "the views to age during the outage")
        assert ids(views.view(1)) == ["n"]  # the last view, still served
    finally:
        views.stop()


# -- cost: a view read touches only the requested stage -----------------------------------------

def test_reading_one_stage_of_2000_members_touches_only_that_stage(server):
    client = connect(server.url)
    writer = Membership(client, run_id="r")
    for stage in range(4):
        pipe = client.pipeline(transaction=False)
        for i in range(500):
            member = replace(record(f"w{stage}-{i:04d}", stage=stage), heartbeat_time=time.time())
            writer.queue_heartbeat(pipe, member, publish=True)
        pipe.execute()
    reader = Membership(connect(server.url), run_id="r")
    touched: list[list[str]] = []
    done = threading.Event()

    def watch() -> None:
        with connect(server.url, socket_timeout_s=10.0).monitor() as monitor:
            for _ in range(10_000):  # bounded; the sentinels start and end it
                command = monitor.next_command()["command"]
                if command == "ECHO start-of-read":
                    ready.set()
                elif command == "ECHO end-of-read":
                    break
                elif ready.is_set():
                    touched.append(command.split())
        done.set()

    ready = threading.Event()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    wait_until(lambda: client.echo("start-of-read") and ready.is_set(), 5.0, "MONITOR to see our commands")
    client.config_resetstat()
    view = reader.stage_view(2)  # a first read: the whole stage
    again = reader.stage_view(2)  # then: the change log only
    client.echo("end-of-read")
    assert done.wait(10.0)
    stats = client.info("commandstats")
    assert len(view) == 500 and ids(view) == sorted(ids(view)) and again == view
    keyless = {"ECHO", "MULTI", "EXEC", "CONFIG", "HELLO", "CLIENT", "AUTH", "SELECT", "PING"}  # no key
    keys = [args[1].strip('"') for args in touched if args[0].strip('"').upper() not in keyless]
    assert keys and all(":stage:2:" in key for key in keys), [a for a in touched if ":stage:2:" not in " ".join(a)][:5]
    assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats
    assert stats["cmdstat_hgetall"]["calls"] == 1  # one hash of 500 rows, not 2,000 hashes

"""Membership against a real redis-server on a free loopback port."""

from __future__ import annotations

import shutil
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.heartbeat import HeartbeatThread
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership, table_settling_s
from tests.support.thread_switches import wakeups_while_idle
from tests.support.waiting import wait_until


@pytest.fixture
def server():
    with EmbeddedRedis() as running:
        yield running


def record(worker_id: str, stage: int = 0, state: WorkerState = WorkerState.JOINING, run: str = "r") -> MemberRecord:
    return MemberRecord(worker_id=worker_id, run_id=run, stage=stage, data_addr=f"tcp://127.0.0.1:1{stage}",
                        exchange_addr="tcp://127.0.0.1:2", state=state)


def test_register_states_and_stage_filter(server):
    a = Membership(connect(server.url), run_id="r")
    b = Membership(connect(server.url), run_id="r")
    assert a.register(record("a", stage=0))
    assert b.register(record("b", stage=1, state=WorkerState.ONLINE))
    assert [m.worker_id for m in a.live_members(stage=1)] == ["b"]
    assert a.live_members(stage=0) == []  # JOINING is not ONLINE
    assert a.set_state(WorkerState.ONLINE)
    assert [m.worker_id for m in b.live_members(stage=0)] == ["a"]
    assert {m.worker_id for m in b.live_members(stage=None, states=None)} == {"a", "b"}
    assert a.leave()
    assert [m.worker_id for m in b.live_members(stage=None, states=None)] == ["b"]


def test_a_workers_site_reaches_the_others_through_the_table(server):
    """worker.site is published with the record: what a sender's routing deals by."""
    a = Membership(connect(server.url), run_id="r")
    near = MemberRecord(worker_id="b", run_id="r", stage=1, data_addr="tcp://127.0.0.1:11",
                        exchange_addr="tcp://127.0.0.1:2", state=WorkerState.ONLINE, site="eu-west-1a")
    assert Membership(connect(server.url), run_id="r").register(near)
    assert [(m.worker_id, m.site) for m in a.live_members(stage=1)] == [("b", "eu-west-1a")]


def test_stage_finished_mark_is_per_run_and_cleared_by_a_joiner_of_that_stage(server):
    a = Membership(connect(server.url), run_id="r")
    assert not a.stage_finished(0)
    assert a.mark_stage_finished(0)
    assert a.stage_finished(0) and not a.stage_finished(1)
    assert not Membership(connect(server.url), run_id="other").stage_finished(0)
    b = Membership(connect(server.url), run_id="r")
    assert b.register(record("b", stage=1))
    assert a.stage_finished(0)  # a joiner of another stage leaves it
    assert b.register(record("c", stage=0))
    assert not a.stage_finished(0)  # stage 0 trains again


def test_runs_do_not_see_each_other(server):
    Membership(connect(server.url), run_id="r").register(record("a", state=WorkerState.ONLINE))
    assert Membership(connect(server.url), run_id="other").live_members(stage=0) == []


def test_ttl_expires_without_heartbeats(server):
    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=0.1, ttl_s=0.3)
    m.register(record("a", state=WorkerState.ONLINE))
    assert m.live_members(stage=0)
    wait_until(lambda: not m.live_members(stage=0), 3.0, "the record to expire")


def test_heartbeat_thread_keeps_record_alive_and_updates_fields(server):
    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=0.05, ttl_s=0.3)
    m.register(record("a", state=WorkerState.ONLINE))
    beat = HeartbeatThread(m, lambda: {"queue_depth": 5})
    beat.start()
    try:
        wait_until(lambda: beat.beats >= 10, 5.0, "ten heartbeats")  # well past the 0.3 s TTL
        members = m.live_members(stage=0)
        assert members and members[0].queue_depth == 5
    finally:
        beat.stop()


def test_outage_uses_cached_view_and_reregisters(server):
    m = Membership(connect(server.url), run_id="r")
    other = Membership(connect(server.url), run_id="r")
    m.register(record("a", state=WorkerState.ONLINE))
    other.register(record("b", stage=1, state=WorkerState.ONLINE))
    assert [r.worker_id for r in m.live_members(stage=1)] == ["b"]
    server.stop()
    assert [r.worker_id for r in m.live_members(stage=1)] == ["b"]  # cached
    assert m.redis_available is False and m.outages == 1
    assert m.heartbeat() is False  # absorbed, no exception
    server.start()  # same port, empty table
    wait_until(lambda: m.heartbeat(), 5.0, "a heartbeat to succeed")
    assert m.redis_available
    assert [r.worker_id for r in other.live_members(stage=0)] == ["a"]  # re-registered


def test_malformed_records_are_skipped_and_counted(server):
    client = connect(server.url)
    m = Membership(client, run_id="r")
    m.register(record("a", state=WorkerState.ONLINE))
    keys = m.keys
    client.zadd(keys.beats(0), {"bad": time.time()})  # listed, but its hash is not a record
    client.hset(m.key("bad"), mapping={"stage": "zero", "worker_id": "bad"})
    assert [r.worker_id for r in m.live_members(stage=0)] == ["a"]
    assert m.malformed_records == 1
    client.hset(keys.members(0), "junk", "{not json")  # and a row of the stage view that is not one
    client.xadd(keys.log(0), {"id": "junk"})
    assert [r.worker_id for r in m.stage_view(0)] == ["a"]
    assert m.malformed_records == 2


def test_password_is_required_when_configured():
    with EmbeddedRedis(password="s3cret") as secured:
        assert "s3cret@" in secured.url
        assert connect(secured.url).ping()
        # No retries: redis-py retries an AuthenticationError (a ConnectionError) with backoff, ~4 s.
        anonymous = redis.Redis(host="127.0.0.1", port=secured.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()


def test_embedded_redis_restart_keeps_port_and_leaves_no_process():
    server = EmbeddedRedis().start()
    port, pid = server.port, server.process.pid
    server.restart()
    assert server.port == port and server.process.pid != pid
    assert connect(server.url).ping()
    server.stop()
    with pytest.raises(redis.ConnectionError):
        connect(server.url).ping()


def test_bad_url():
    with pytest.raises(ValueError, match="redis://"):
        connect("http://localhost:6379")


def test_heartbeat_thread_leaves_at_once_when_asked(server):
    import threading

    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=5.0)
    m.register(record("a", state=WorkerState.ONLINE))
    leave = threading.Event()
    beat = HeartbeatThread(m, leave_event=leave)
    beat.start()
    try:
        leave.set()
        beat.wake()  # what the worker's SIGTERM handler does: the next beat is 5 s away
        wait_until(lambda: not m.live_members(stage=0), 1.0, "the record to be deleted")
    finally:
        beat.stop()


def test_heartbeat_thread_sleeps_until_its_next_beat(server):
    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=5.0)
    m.register(record("a", state=WorkerState.ONLINE))
    beat = HeartbeatThread(m)
    beat.start()
    try:
        wait_until(lambda: beat._thread.native_id is not None, 5.0, "the heartbeat thread to start")
        # Each wakeup takes a core from a training thread; a 20 ms tick made 50 of these.
        assert wakeups_while_idle(beat._thread.native_id) <= 2
        beat.stop(timeout_s=2.0)  # asleep for seconds more: stop wakes it
        assert not beat.running
        assert beat.beats == 0  # stopped before its first beat, and none after
    finally:
        beat.stop()


def test_redis_server_dies_with_a_killed_owner():
    import os
    import signal
    import subprocess
    import sys

    code = ("from noloco_rt.membership.embedded_redis import EmbeddedRedis; import time\n"
            "r = EmbeddedRedis().start(); print(r.process.pid, r.log_path.parent, flush=True); time.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid_text, server_dir = owner.stdout.readline().split()
    server_pid = int(pid_text)
    owner.send_signal(signal.SIGKILL)  # no atexit, no finalizer: only the kernel can clean up
    owner.wait(10)

    def gone() -> bool:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{server_pid}/stat") as stat:  # a zombie waiting for init counts as gone
            return stat.read().split()[2] == "Z"

    wait_until(gone, 5.0, "redis-server to exit with its owner")
    shutil.rmtree(server_dir, ignore_errors=True)  # the killed owner could not clean up


def test_heartbeat_thread_survives_redis_rejecting_writes(server):
    admin = connect(server.url)
    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=0.05, ttl_s=5.0)
    m.register(record("a", state=WorkerState.ONLINE))
    beat = HeartbeatThread(m)
    beat.start()
    try:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")  # every write now fails with OOM (a ResponseError)
        wait_until(lambda: beat.failures >= 2, 20.0, "heartbeats rejected by Redis")  # a deadline: logging a traceback is slow on a loaded box
        assert beat.running
        admin.config_set("maxmemory", "0")
        admin.delete(m.key("a"))
        wait_until(lambda: admin.exists(m.key("a")), 20.0, "the heartbeat to write the record again")
    finally:
        beat.stop()


def test_non_hash_key_in_the_table_is_skipped(server):
    client = connect(server.url)
    m = Membership(client, run_id="r")
    m.register(record("a", state=WorkerState.ONLINE))
    client.zadd(m.keys.beats(0), {"str": time.time()})
    client.set(m.key("str"), "not a hash")  # WRONGTYPE for HGETALL
    assert [r.worker_id for r in m.live_members(stage=0)] == ["a"]
    assert m.malformed_records == 1


def test_exclude_id(server):
    m = Membership(connect(server.url), run_id="r")
    m.register(record("a", state=WorkerState.ONLINE))
    Membership(connect(server.url), run_id="r").register(record("b", state=WorkerState.ONLINE))
    assert [r.worker_id for r in m.live_members(stage=0, exclude_id="a")] == ["b"]


def test_a_table_younger_than_a_record_ttl_is_still_settling(server):
    # A restarted Redis without persistence lists no one until members re-register (at their
    # next heartbeat): within a TTL of its start an empty stage does not mean no live peer.
    assert table_settling_s(0.0, 3.0) == 4.0 and table_settling_s(2.0, 3.0) == 2.0
    assert table_settling_s(4.0, 3.0) == 0.0 and table_settling_s(100.0, 3.0) == 0.0
    m = Membership(connect(server.url), run_id="r", heartbeat_interval_s=1.0)
    assert 0.0 < m.settling_s() <= 4.0  # the fixture's server started a moment ago
    m_no_ttl = Membership(connect(server.url), run_id="r", heartbeat_interval_s=1.0, ttl_s=0.0)
    wait_until(lambda: m_no_ttl.settling_s() == 0.0, 5.0, "a TTL-0 table to be settled after a second")
    server.stop()
    assert m.settling_s() == 0.0 and m.redis_available is False  # no answer: nothing to wait for

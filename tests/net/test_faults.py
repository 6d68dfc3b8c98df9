"""The data-path faults of `noloco-rt chaos`: asked for by environment, injected into a real
data socket behind its data link."""

from __future__ import annotations

import pytest
import zmq

from noloco_rt.net.data_link import DataLink
from noloco_rt.net.transport import DataSocket
from workers.faults.data_path import (
    DATA_DELAY_ENV,
    DATA_LOSS_ENV,
    DataFaults,
    data_faults_env,
    data_faults_from_env,
)


def test_data_faults_from_the_environment_drop_a_seeded_fraction():
    assert data_faults_from_env({}, name="s0-r0") is None  # the normal case: no injection at all
    assert data_faults_env(0.0, 0.0) == {}  # and the chaos driver asks for none
    faults = data_faults_from_env({DATA_LOSS_ENV: "0.25", DATA_DELAY_ENV: "0"}, name="s0-r0")
    assert faults is not None and faults.delay_s == 0.0
    drops = sum(faults.should_drop() for _ in range(4000))
    assert 800 < drops < 1200 and faults.dropped == drops
    first, second = DataFaults(loss=0.25, seed=7), DataFaults(loss=0.25, seed=7)
    assert [first.should_drop() for _ in range(50)] == [second.should_drop() for _ in range(50)]  # seeded
    with pytest.raises(ValueError):
        DataFaults(loss=1.0)


def test_the_driver_environment_reaches_the_worker_as_the_same_faults_seeded_by_name():
    env = data_faults_env(0.25, 40.0)
    faults = data_faults_from_env(env, name="s1-r2")
    assert faults is not None and faults.loss == 0.25 and faults.delay_s == pytest.approx(0.04)
    again = data_faults_from_env(env, name="s1-r2")
    other = data_faults_from_env(env, name="s0-r0")
    sequence = [faults.should_drop() for _ in range(64)]
    assert sequence == [again.should_drop() for _ in range(64)]  # a restarted worker loses the same messages
    assert sequence != [other.should_drop() for _ in range(64)]  # another worker loses others


def test_a_lost_message_is_reported_sent_and_never_arrives():
    ctx = zmq.Context()
    try:
        receiver = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="")).start()
        faults = DataFaults(loss=0.5, seed=1)
        lossy = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host="", faults=faults),
                         send_timeout_s=2.0).start()
        for i in range(40):
            lossy.send(receiver.address, [f"m{i}".encode()])
        received = []
        while (frames := receiver.receive(1.0)) is not None:
            received.append(bytes(frames[0]))
        assert len(received) == 40 - faults.dropped and 0 < faults.dropped < 40
        assert lossy.close().failed == 0  # the sender cannot tell: only its deadline will
        receiver.close()
    finally:
        ctx.term()


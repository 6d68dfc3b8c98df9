"""An unreachable Redis at start: retried with a warning naming host:port, registered once it
is up, and after worker.redis_wait_s one line and exit 2 (never silently alone forever)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from noloco_rt.membership.embedded_redis import EmbeddedRedis, free_port
from noloco_rt.membership.redis_wait import RedisUnreachable, redis_address, wait_for_redis
from tests.support.command_env import command_env
from tests.support.fake_clock import FakeClock
from workers.cluster.local_cluster import run_command, start_command


class Warnings:
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def warning(self, event: str, **fields) -> None:
        self.seen.append({"event": event, **fields})


def test_waits_until_the_probe_answers_warning_every_few_seconds():
    clock, log = FakeClock(), Warnings()
    answers = iter([False] * 25 + [True])  # 25 failed probes, 0.5 s apart: 12.5 s
    waited = wait_for_redis(lambda: next(answers), url="redis://:pw@redis.example:6380/0", wait_s=60, log=log,
                            clock=clock, sleep=clock.sleep)
    assert waited == pytest.approx(12.5)
    assert [w["waited_s"] for w in log.seen] == [0.0, 5.0, 10.0]
    assert {w["address"] for w in log.seen} == {"redis.example:6380"}  # no password in the warning


def test_gives_up_after_the_wait_with_one_line_naming_the_address():
    clock, log = FakeClock(), Warnings()
    with pytest.raises(RedisUnreachable) as error:
        wait_for_redis(lambda: False, url="redis://10.1.2.3/0", wait_s=7, log=log, clock=clock, sleep=clock.sleep)
    assert "10.1.2.3:6379" in str(error.value) and "--redis-wait" in str(error.value)
    assert "\n" not in str(error.value)
    assert clock.now == pytest.approx(7.0)
    assert redis_address("unix:///run/redis.sock") == "/run/redis.sock"


@pytest.mark.slow
def test_worker_with_nothing_at_the_url_exits_2_after_the_wait(tmp_path):
    port = free_port()
    code, output = run_command(["worker", "--stage", "0", "--redis-url", f"redis://127.0.0.1:{port}/0",
                                "--redis-wait", "1.5", "--set", "run.log_format=json"], command_env(), tmp_path / "worker.log",
                               timeout_s=120)
    assert code == 2, output
    lines = output.strip().splitlines()
    waiting = [json.loads(line) for line in lines if line.startswith("{") and "redis_waiting" in line]
    assert waiting and waiting[0]["address"] == f"127.0.0.1:{port}"
    assert lines[-1].startswith("Error:") and f"127.0.0.1:{port}" in lines[-1]
    assert "member_online" not in output and "Traceback" not in output


@pytest.mark.slow
def test_worker_started_before_redis_registers_once_it_is_up(tmp_path):
    port = free_port()
    log_path = tmp_path / "worker.log"
    worker = start_command(["worker", "--stage", "0", "--redis-url", f"redis://127.0.0.1:{port}/0",
                            "--redis-wait", "120", "--set", "run.log_format=json", "--set", f"paths.out_dir={tmp_path}"],
                           command_env(), log_path)
    try:
        def events() -> list[dict]:
            return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]

        deadline = time.monotonic() + 90
        while not any(e["event"] == "redis_waiting" for e in events()) and time.monotonic() < deadline:
            assert worker.poll() is None, log_path.read_text()
            time.sleep(0.1)
        assert not any(e["event"] == "member_online" for e in events())
        with EmbeddedRedis(port=port):
            while not any(e["event"] == "member_online" for e in events()) and time.monotonic() < deadline:
                assert worker.poll() is None, log_path.read_text()
                time.sleep(0.1)
            names = [e["event"] for e in events()]
            assert "member_online" in names
            assert names.index("redis_waiting") < names.index("worker_started") < names.index("member_online")
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

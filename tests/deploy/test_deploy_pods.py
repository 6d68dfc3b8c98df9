"""The commands the rendered pods run, run here: the alive-file probe judges a fresh, a stale
and a missing file, and Redis starts with its password from a file, never in its argv."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from noloco_rt.deploy import k8s_pods, k8s_profile, k8s_services
from noloco_rt.membership.embedded_redis import redis_server_binary


def _probe_exit(path: Path, stale_s: int) -> int:
    command = k8s_pods.alive_command(stale_s)
    assert command[0] == "python" and command[-2] == k8s_profile.ALIVE_FILE
    local = [sys.executable, *command[1:-2], str(path), command[-1]]
    return subprocess.run(local, capture_output=True, timeout=30).returncode


def test_the_alive_probe_fails_only_when_the_loop_stopped_touching(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    assert _probe_exit(alive, 120) == 1  # not touched yet: startup not over
    alive.touch()
    assert _probe_exit(alive, 120) == 0
    now = time.time()
    # Well inside the threshold: the probe itself may take seconds to start on a loaded machine
    # (119 s failed once under load, the probe running after the 120th second).
    os.utime(alive, (now - 100, now - 100))
    assert _probe_exit(alive, 120) == 0
    os.utime(alive, (now - 300, now - 300))  # five minutes without a touch: hung
    assert _probe_exit(alive, 120) == 1
    assert _probe_exit(alive, 400) == 0  # the threshold is the argument, not a constant


@pytest.fixture
def rendered_redis(tmp_path: Path):
    """The Redis container's command, run here: its conf in tmp_path, a Unix socket instead of
    a TCP port. Yields (process, socket path, conf path, password)."""
    (deployment, _) = k8s_services.redis()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    sh, flag, script, name, *args = container["command"]
    conf, socket_path, password = tmp_path / "redis.conf", tmp_path / "redis.sock", "0123abcd" * 6
    script = script.replace(k8s_services.REDIS_CONF, str(conf))
    env = {"PATH": f"{Path(redis_server_binary()).parent}:{os.environ['PATH']}", "REDIS_PASSWORD": password}
    process = subprocess.Popen([sh, flag, script, name, *args, "--port", "0", "--unixsocket", str(socket_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in process.stdout:  # its log says when it listens (no sleeping); EOF if it died
            if "ready to accept connections" in line.lower():
                break
        assert process.poll() is None, "redis-server exited"
        yield process, socket_path, conf, password
    finally:
        process.kill()
        process.wait(timeout=30)


def test_redis_reads_its_password_from_a_private_file_not_argv(rendered_redis) -> None:
    process, socket_path, conf, password = rendered_redis
    (deployment, _) = k8s_services.redis()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # No $(REDIS_PASSWORD): the kubelet would expand it into sh's argv. The shell reads
    # $REDIS_PASSWORD from its environment, and printf is a builtin (no process, no argv).
    assert not any("$(REDIS_PASSWORD)" in part for part in [*container["command"], *container.get("args", [])])
    argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()  # `exec`: this pid is redis-server
    assert "redis-server" in argv and password not in argv
    assert conf.stat().st_mode & 0o777 == 0o600
    assert redis.Redis(unix_socket_path=str(socket_path), password=password).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(unix_socket_path=str(socket_path), retry=Retry(NoBackoff(), 0)).ping()  # no ~4 s of retries

"""Authentication: CURVE on the ZeroMQ sockets, Redis passwords and ACL users, other runs.

Real sockets and processes on 127.0.0.1; every wait polls with a deadline.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import urllib.request

import pytest
import redis
import structlog
import torch
import zmq
import zmq.auth

from noloco_rt.cli import main
from noloco_rt.config import ConfigError, load_config
from noloco_rt.config.redaction import redact_url
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.records import WorkerState
from noloco_rt.net import messages
from noloco_rt.net.curve import CurveKeys, keys_from_dir, load_curve_keys, write_key_pair
from noloco_rt.net.data_link import DataLink
from noloco_rt.net.transport import (
    DataSocket,
    ExchangeServer,
    apply_curve,
    disable_curve,
    enable_curve,
    request,
)
from tests.support.command_env import command_env
from tests.support.paths import REPO
from tests.support.waiting import wait_until
from workers.cluster.local_cluster import LocalCluster, run_command

pytestmark = pytest.mark.timeout(120)



def _try_send(sock: zmq.Socket, frames: list) -> None:
    """Queue without blocking; zmq.Again (no pipe the handshake let through) is a refusal too."""
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass

def _keys() -> CurveKeys:
    public, secret = zmq.curve_keypair()
    return CurveKeys(public_key=public, secret_key=secret)


# -- keys: generation, loading, validation -----------------------------------------------


def test_keys_generate_writes_a_private_pair_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "keys"
    with pytest.raises(SystemExit) as exited:
        main(["keys", "generate", "--out", str(out)])
    assert exited.value.code == 0
    secret, public = out / "cluster.secret", out / "cluster.public"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(public.stat().st_mode) == 0o600
    printed = capsys.readouterr().out
    assert "curve_key_dir" in printed
    assert "kubectl -n noloco create secret generic noloco-curve" in printed  # docs/deploy.md's namespace
    keys = keys_from_dir(out)
    assert keys.public_key == public.read_text().strip().encode()
    before = secret.read_text()
    with pytest.raises(SystemExit) as exited:
        main(["keys", "generate", "--out", str(out)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--force" in err and err.count("\n") == 1
    assert secret.read_text() == before
    with pytest.raises(SystemExit) as exited:
        main(["keys", "generate", "--out", str(out), "--force"])
    assert exited.value.code == 0 and secret.read_text() != before


def test_the_keys_folder_the_docs_use_is_git_ignored():
    repo = REPO
    for path in ("keys/cluster.secret", "keys/cluster.public", "elsewhere/run.secret"):
        result = subprocess.run(["git", "check-ignore", "-q", path], cwd=repo, timeout=30)
        assert result.returncode == 0, f"{path} is not git-ignored"


def test_keys_load_from_values_env_and_certificates(tmp_path):
    keys = _keys()
    cfg = load_config(environ={"NOLOCO_NETWORK_CURVE_SECRET_KEY": keys.secret_key.decode()})
    assert load_curve_keys(cfg.network) == keys  # the public key is derived from the secret
    cfg = load_config(environ={"NOLOCO_NETWORK_CURVE_SECRET_KEY": keys.secret_key.decode(),
                               "NOLOCO_NETWORK_CURVE_PUBLIC_KEY": keys.public_key.decode()})
    assert load_curve_keys(cfg.network) == keys
    assert load_curve_keys(load_config(environ={}).network) is None
    zmq.auth.create_certificates(tmp_path, "node")  # zmq's own format (.key / .key_secret)
    public, secret = zmq.auth.load_certificate(tmp_path / "node.key_secret")
    assert keys_from_dir(tmp_path) == CurveKeys(public_key=public, secret_key=secret)
    assert keys.secret_key.decode() not in repr(keys)


def test_bad_keys_fail_with_a_message_naming_the_path_and_problem(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        keys_from_dir(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="exactly one secret key file.*found none"):
        keys_from_dir(empty)
    write_key_pair(tmp_path / "a", "cluster")
    (tmp_path / "a" / "cluster.secret").write_text("too-short\n")
    with pytest.raises(ConfigError, match=r"cluster\.secret.*40 z85 characters, got 9"):
        keys_from_dir(tmp_path / "a")
    (tmp_path / "a" / "cluster.secret").write_text("~" * 40)
    with pytest.raises(ConfigError, match=r"cluster\.secret.*not a z85-encoded"):
        keys_from_dir(tmp_path / "a")
    (tmp_path / "a" / "cluster.secret").write_text(_keys().secret_key.decode())  # not the .public's pair
    with pytest.raises(ConfigError, match=r"cluster\.public.*does not match the secret key"):
        keys_from_dir(tmp_path / "a")
    write_key_pair(tmp_path / "a", "other")
    with pytest.raises(ConfigError, match="exactly one secret key file.*cluster.secret, other.secret"):
        keys_from_dir(tmp_path / "a")
    secret = "x" * 39
    with pytest.raises(ConfigError, match="network.curve_secret_key") as error:
        load_config(environ={"NOLOCO_NETWORK_CURVE_SECRET_KEY": secret})
    assert secret not in str(error.value)  # never echo a secret
    with pytest.raises(ConfigError, match="not both"):
        load_config(overrides=[{"network": {"curve_key_dir": "k", "curve_secret_key": "y" * 40}}], environ={})
    assert redact_url("redis://noloco:pw@h:1/0") == "redis://noloco:***@h:1/0"


def test_worker_with_a_bad_key_file_exits_2_with_one_line(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "cluster.secret").write_text("nope")
    code, output = run_command(["worker", "--stage", "0", "--redis-url", "redis://127.0.0.1:1/0",
                                "--set", f"network.curve_key_dir={keys}"], _clean_env(), tmp_path / "worker.log",
                               timeout_s=60)
    assert code == 2, output
    assert output.strip().count("\n") == 0 and "cluster.secret" in output, output


# -- CURVE on the sockets -------------------------------------------------------------------


def _intruders(keys: CurveKeys) -> dict[str, CurveKeys | None]:
    stranger = _keys()
    return {"plain": None,  # no CURVE at all
            "own key pair": stranger,  # knows the server key but not the cluster secret
            "wrong server key": CurveKeys(public_key=stranger.public_key, secret_key=stranger.secret_key)}


def _client_socket(ctx: zmq.Context, kind: int, keys: CurveKeys | None, server_key: bytes) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public_key)
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    return sock


def test_curve_sockets_admit_the_cluster_key_only():
    keys = _keys()
    server_ctx, client_ctx, intruder_ctx = zmq.Context(), zmq.Context(), zmq.Context()
    enable_curve(server_ctx, keys)
    enable_curve(client_ctx, keys)
    data = DataLink(DataSocket(server_ctx, bind_host="127.0.0.1", port=0, advertise_host="")).start()
    server = ExchangeServer(server_ctx, bind_host="127.0.0.1", port=0, advertise_host="",
                            handler=lambda frames: [b"ok", *frames])
    server.start()
    sender = DataLink(DataSocket(client_ctx, bind_host="127.0.0.1", port=0, advertise_host=""),
                      send_timeout_s=5.0).start()
    opened: list[zmq.Socket] = []
    try:
        with structlog.testing.capture_logs() as seen:  # the ZAP handler logs each denial (bounded)
            for name, intruder in _intruders(keys).items():
                server_key = keys.public_key if name != "wrong server key" else intruder.public_key
                push = _client_socket(intruder_ctx, zmq.PUSH, intruder, server_key)
                dealer = _client_socket(intruder_ctx, zmq.DEALER, intruder, server_key)
                opened += [push, dealer]
                push.connect(data.address)
                dealer.connect(server.address)
                for index in range(20):  # queued on the intruder's side (or refused at once); never delivered
                    _try_send(push, [b"intruder", name.encode(), str(index).encode()])
                _try_send(dealer, [b"hello"])
                assert request(intruder_ctx, server.address, [b"hi"], timeout_s=0.5, curve=intruder) is None, name
            # The authorised client gets through on both sockets; nothing the intruders sent ever arrived.
            sender.send(data.address, [b"member"])
            assert [bytes(f) for f in data.receive(5)] == [b"member"]
            assert [bytes(f) for f in request(client_ctx, server.address, [b"x"], timeout_s=5)] == [b"ok", b"x"]
            assert data.receive(0.5) is None
            assert all(not d.poll(0) for d in opened if d.type == zmq.DEALER)
            assert server.requests_served == 1
            wait_until(lambda: any(e["event"] == "curve_client_denied" for e in list(seen)), timeout_s=5,
                  what="the ZAP handler to deny a key")
    finally:
        for sock in opened:
            sock.close(linger=0)
        server.stop()
        data.close()
        sender.close()
        for ctx in (server_ctx, client_ctx, intruder_ctx):
            disable_curve(ctx)
            ctx.term()


def test_a_curve_server_socket_needs_the_zap_handler():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        with pytest.raises(RuntimeError, match="enable_curve"):
            apply_curve(sock, _keys(), server=True)
    finally:
        sock.close(linger=0)
        ctx.term()


def _clean_env() -> dict[str, str]:
    return command_env(PYTHONUNBUFFERED="1")


def _metric(port: int, name: str) -> float:
    """One sample of a worker's /metrics (0 when absent)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _other_run_forward(index: int) -> list:
    """A well-formed forward message of another run (shapes of the tiny preset)."""
    message = messages.forward("another-run", "intruder", 0, index, "tcp://127.0.0.1:1",
                               [torch.zeros(8, 64, 64)], torch.zeros(8, 64, dtype=torch.long))
    return list(message.parts())


@pytest.mark.slow
def test_curve_cluster_trains_and_admits_only_key_holders(tmp_path):
    """3 workers with CURVE; intruders (plain, own key pair, wrong server key) send well-formed
    messages of another run to a worker's data and exchange sockets: none is even counted as a
    reject (they never get in), while the same messages from a key holder are counted as
    wrong_run; the worker keeps training and exchanging with its peers."""
    keys_dir = tmp_path / "keys"
    write_key_pair(keys_dir, "cluster")
    keys = keys_from_dir(keys_dir)
    cluster = LocalCluster(tmp_path, settings={"network.curve_key_dir": str(keys_dir)})
    ctx, intruder_ctx = zmq.Context(), zmq.Context()  # intruder_ctx: no keys attached
    enable_curve(ctx, keys)
    opened: list[zmq.Socket] = []
    member: DataLink | None = None
    try:
        workers = [cluster.start_worker(0, "a0"), cluster.start_worker(1, "b0"), cluster.start_worker(1, "b1")]
        cluster.wait_online(3)
        target = workers[1]
        cluster.wait_event(target, "peer_exchange_done", timeout_s=90)
        started = target.events("worker_started")[0]
        members = cluster.members({WorkerState.ONLINE})
        assert {m.public_key for m in members} == {keys.public_key.decode()}
        for name, intruder in _intruders(keys).items():
            server_key = keys.public_key if name != "wrong server key" else intruder.public_key
            push = _client_socket(intruder_ctx, zmq.PUSH, intruder, server_key)
            opened.append(push)
            push.connect(started["data_addr"])
            for index in range(10):
                _try_send(push, _other_run_forward(index))
            if name == "wrong server key":
                continue  # request() always names the key's own public key as server key
            assert request(intruder_ctx, started["exchange_addr"], _other_run_forward(0), timeout_s=1.0,
                           curve=intruder) is None, name
        # A key holder's messages of another run get in and are rejected as wrong_run.
        # (Closed only at the end, where it flushes what it was given.)
        member = DataLink(DataSocket(ctx, bind_host="127.0.0.1", port=0, advertise_host=""), send_timeout_s=5.0).start()
        for index in range(3):
            member.send(started["data_addr"], _other_run_forward(index))
        assert request(ctx, started["exchange_addr"], _other_run_forward(0), timeout_s=5) is not None
        port = target.events("metrics_serving")[0]["port"]
        cluster.wait_for(lambda: _metric(port, 'noloco_messages_rejected_total{reason="wrong_run"}') >= 4,
                         timeout_s=20, what="the worker to count the key holder's 4 messages")
        cluster.wait_event(target, "curve_client_denied", timeout_s=20)
        before = target.latest_inner_step()
        exchanges = len(target.events("peer_exchange_done"))
        cluster.wait_for(lambda: target.latest_inner_step() >= before + 10
                         and len(target.events("peer_exchange_done")) > exchanges,
                         timeout_s=60, what="training and exchanges to go on")
        assert cluster.stop(target) == 0
        rejected = target.events("worker_summary")[-1]["rejected"]
        assert rejected == {"wrong_run": 4}, rejected
    finally:
        if member is not None:
            assert member.close(flush_s=5.0).failed == 0
        for sock in opened:
            sock.close(linger=0)
        disable_curve(ctx)
        ctx.term()
        intruder_ctx.term()
        cluster.close()


# -- Redis with a password and an ACL user --------------------------------------------------


def _cli(*args: str, timeout_s: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noloco_rt.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, env={**_clean_env(), **(env or {})})


def _cli_in_process(capsys, monkeypatch, *args: str, env: dict[str, str] | None = None) \
        -> subprocess.CompletedProcess:
    """run_cli_in_process, shaped like a subprocess result for _one_line_error."""
    from tests.support.in_process import run_cli_in_process

    return subprocess.CompletedProcess(list(args), *run_cli_in_process(capsys, monkeypatch, *args, env=env))


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode in (1, 2), (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


class _Url:
    """Stands in for LocalCluster.redis: the URL workers get (the fixture owns the server)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


@pytest.fixture
def password_redis():
    server = EmbeddedRedis(password="s3cret").start()
    yield server
    server.stop()


def test_wrong_or_missing_redis_password_fails_at_startup_with_one_line(password_redis, capsys, monkeypatch):
    port = password_redis.port
    for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
        for command in (["worker", "--stage", "0"], ["status"]):
            line = _one_line_error(_cli_in_process(capsys, monkeypatch, *command,
                                                   env={"NOLOCO_NETWORK_REDIS_URL": url}))
            assert "Redis refused" in line and ":wrong@" not in line, line  # the password is never printed
    result = _cli_in_process(capsys, monkeypatch, "status", env={"NOLOCO_NETWORK_REDIS_URL": password_redis.url})
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr


def test_the_redis_password_from_a_file_and_a_warning_for_one_on_the_command_line(tmp_path, password_redis, capsys,
                                                                                  monkeypatch):
    bare = f"redis://127.0.0.1:{password_redis.port}/0"
    secret_file = tmp_path / "redis-password"
    secret_file.write_text("s3cret\n")
    result = _cli_in_process(capsys, monkeypatch, "status", "--redis-url", bare,
                             "--set", f"network.redis_password_file={secret_file}")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    secret_file.write_text("not-it\n")
    line = _one_line_error(_cli_in_process(capsys, monkeypatch, "status", "--redis-url", bare,
                                           "--set", f"network.redis_password_file={secret_file}"))
    assert "Redis refused" in line and "redis_password_file" in line and "not-it" not in line, line
    secret_file.write_text("\n")
    line = _one_line_error(_cli_in_process(capsys, monkeypatch, "status", "--redis-url", bare,
                                           "--set", f"network.redis_password_file={secret_file}"))
    assert "network.redis_password_file" in line and "first line is empty" in line, line
    # A password in the URL wins over the file (a run's children get the URL through their environment).
    result = _cli_in_process(capsys, monkeypatch, "status", "--set", f"network.redis_password_file={secret_file}",
                             env={"NOLOCO_NETWORK_REDIS_URL": password_redis.url})
    assert result.returncode == 0, result.stderr
    # On the command line it works, and says who else can read it.
    result = _cli_in_process(capsys, monkeypatch, "status", "--redis-url", password_redis.url)
    assert result.returncode == 0, result.stderr
    assert "Warning: the Redis password on the command line shows in `ps`" in result.stderr, result.stderr
    assert "s3cret" not in result.stderr


@pytest.mark.slow
def test_acl_user_trains_and_is_refused_outside_its_keys(tmp_path, password_redis):
    admin = redis.Redis.from_url(password_redis.url)
    admin.execute_command("ACL", "SETUSER", "noloco", "on", ">pw-noloco", "~noloco:*", "+@all", "-@dangerous")
    admin.execute_command("ACL", "SETUSER", "stranger", "on", ">pw-stranger", "~other:*", "+@all", "-@dangerous")
    port = password_redis.port
    line = _one_line_error(_cli("worker", "--stage", "0",
                                env={"NOLOCO_NETWORK_REDIS_URL": f"redis://stranger:pw-stranger@127.0.0.1:{port}/0"}))
    assert "ACL" in line and "pw-stranger" not in line, line

    url = f"redis://noloco:pw-noloco@127.0.0.1:{port}/0"
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.method": "local"})
    cluster.redis.stop()
    cluster.redis = _Url(url)  # the workers get the ACL user's URL
    try:
        worker = cluster.start_worker(0, "solo")
        cluster.wait_event(worker, "member_online", timeout_s=60)
        assert [m.name for m in cluster.members({WorkerState.ONLINE})] == ["solo"]
        cluster.wait_event(worker, "train_progress", timeout_s=60)
        # Credentials rotated mid-run: logged as an access error, training goes on, then recovers.
        admin.execute_command("ACL", "SETUSER", "noloco", "resetpass", ">rotated")
        admin.execute_command("CLIENT", "KILL", "USER", "noloco")
        cluster.wait_event(worker, "redis_access_denied", timeout_s=30)
        step = worker.latest_inner_step()
        cluster.wait_for(lambda: worker.latest_inner_step() >= step + 10, timeout_s=60,
                         what="training during the access error")
        admin.execute_command("ACL", "SETUSER", "noloco", "resetpass", ">pw-noloco")
        cluster.wait_event(worker, "redis_recovered", timeout_s=30)
        assert cluster.stop(worker) == 0
    finally:
        cluster.close()


@pytest.mark.slow
def test_up_secure_generates_keys_and_the_whole_run_uses_them(tmp_path, password_redis):
    import uuid

    from tests.support.up_runs import FAST, MARK_VARIABLE, finish, marked_processes

    mark, out = uuid.uuid4().hex, tmp_path / "run"
    args = [sys.executable, "-m", "noloco_rt.cli", "up", "--steps", "20", "--out", str(out), "--interval", "0.5",
            "--secure", "--redis-url", password_redis.url]
    for key, value in {**FAST, "pipeline.stages": 1}.items():
        args += ["--set", f"{key}={value}"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**_clean_env(), MARK_VARIABLE: mark})
    try:
        code, output = finish(process, timeout_s=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, output[-4000:]
    assert marked_processes(mark) == [], "a child of up survived it"
    assert stat.S_IMODE((out / "keys" / "cluster.secret").stat().st_mode) == 0o600
    public = (out / "keys" / "cluster.public").read_text().strip()
    for name in ("s0-r0", "s0-r1"):  # each worker started with the generated keys
        text = "".join(p.read_text() for p in (out / "logs").glob(f"{name}.*"))
        assert f'"public_key": "{public}"' in text, text[-2000:]
    # The coordinator pulled snapshots over CURVE: the consensus checkpoint exists.
    assert (out / "consensus.safetensors").exists(), output[-3000:]
    # Neither the CURVE secret nor the Redis password is in any file the run wrote (but the
    # key file itself) or in any line it printed.
    secret = (out / "keys" / "cluster.secret").read_text().strip()
    needles = [secret.encode(), b"s3cret"]
    holding = [str(f) for f in out.rglob("*") if f.is_file() and f != out / "keys" / "cluster.secret"
               and any(n in f.read_bytes() for n in needles)]
    assert holding == [] and secret not in output and "s3cret" not in output, holding

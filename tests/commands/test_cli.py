"""The CLI as a user runs it: real subprocesses, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.command_env import settings_free_env
from tests.support.in_process import run_cli_in_process

CLI = [sys.executable, "-m", "noloco_rt.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = settings_free_env(**(env or {}))
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full_env, timeout=timeout)


def test_help_lists_every_command_without_importing_them():
    code = ("import sys\nfrom noloco_rt.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "loaded = [m for m in ('torch', 'workers', 'coordinator', 'noloco_rt.simulation.simulator') if m in sys.modules]\n"
            "print('LOADED', loaded)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in ("config", "simulate"):
        assert command in result.stdout
    assert "LOADED []" in result.stdout


def test_config_show_reflects_file_environment_and_flags(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text('[outer]\nmethod = "diloco"\n[run]\nsteps = 11\n')
    code, out, err = run_cli_in_process(capsys, monkeypatch, "config", "show", "--config", str(path),
                                    "--set", "run.steps=12", env={"NOLOCO_OUTER_ALPHA": "0.2"})
    assert code == 0, err
    assert 'method = "diloco"' in out
    assert "alpha = 0.2" in out
    assert "steps = 12" in out


def test_a_foreign_noloco_variable_is_a_warning_and_a_misspelt_field_an_error(capsys, monkeypatch):
    code, out, err = run_cli_in_process(capsys, monkeypatch, "config", "show",
                                    env={"NOLOCO_CKPT_KILLS": "5", "NOLOCO_RUN_STEPS": "7"})
    assert code == 0, err
    assert "steps = 7" in out
    assert err.count("\n") == 1 and "Warning: ignoring NOLOCO_CKPT_KILLS" in err
    monkeypatch.delenv("NOLOCO_CKPT_KILLS")
    code, _, err = run_cli_in_process(capsys, monkeypatch, "config", "show", env={"NOLOCO_OUTER_ALHPA": "0.2"})
    assert code == 2 and "invalid outer.alhpa" in err and "unknown field" in err


def test_config_show_redacts_secrets_unless_asked(capsys, monkeypatch):
    import zmq

    secret = zmq.curve_keypair()[1].decode()
    env = {"NOLOCO_NETWORK_CURVE_SECRET_KEY": secret,
           "NOLOCO_NETWORK_REDIS_URL": "redis://noloco:hunter2pw@redis.example:6379/0"}
    code, shown, err = run_cli_in_process(capsys, monkeypatch, "config", "show", env=env)
    assert code == 0, err
    assert secret not in shown and "hunter2pw" not in shown
    assert "redis://noloco:***@redis.example:6379/0" in shown
    assert "curve_secret_key = (set, 40 characters: redacted" in shown
    code, revealed, err = run_cli_in_process(capsys, monkeypatch, "config", "show", "--show-secrets", env=env)
    assert code == 0, err
    assert f'curve_secret_key = "{secret}"' in revealed and "hunter2pw" in revealed


@pytest.mark.parametrize(("args", "env", "fragment"), [
    (["simulate", "--method", "sgd"], {}, "'sgd' is not one of"),
    (["simulate", "--stages", "0"], {}, "--stages"),
    (["simulate", "--preset", "huge"], {}, "invalid model.preset = 'huge'"),
    (["simulate", "--set", "outer.alpha=fast"], {}, "invalid outer.alpha = 'fast': must be a number"),
    (["simulate", "--set", "alpha"], {}, "SECTION.FIELD=VALUE"),
    (["simulate", "--config", "/nonexistent/x.toml"], {}, "file does not exist"),
    (["config", "show"], {"NOLOCO_OUTER_METHOD": "sgd"}, "invalid outer.method = 'sgd'"),
    (["simulate", "--set", "data.source=files", "--set", "data.paths=/nonexistent/*.txt"], {}, "matches no file"),
    (["frobnicate"], {}, "No such command"),
    (["config", "show", "--config", "NOT_UTF8"], {}, "is not UTF-8 text (TOML must be)"),
])
def test_bad_input_is_one_clear_line(capsys, monkeypatch, tmp_path, args, env, fragment):
    (tmp_path / "latin1.toml").write_bytes("[run]\nrun_id = \"caf\u00e9\"\n".encode("latin-1"))
    args = [str(tmp_path / "latin1.toml") if a == "NOT_UTF8" else a for a in args]
    code, out, err = run_cli_in_process(capsys, monkeypatch, *args, env=env)
    assert code == 2, (out, err)
    assert fragment in err


@pytest.mark.slow
def test_simulate_writes_run_directory(tmp_path):
    out = tmp_path / "run"
    result = run_cli("simulate", "--method", "noloco", "--stages", "2", "--replicas", "2", "--steps", "20",
                     "--eval-every", "10", "--out", str(out), "--set", "run.eval_batches=2",
                     "--set", "outer.h=10", "--set", "pipeline.max_inflight=1")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line)["event"] for line in result.stderr.splitlines() if line.startswith("{")]
    assert events[0] == "simulation_started" and events[-1] == "simulation_done"
    assert events.count("evaluation") == 2  # off a terminal: a JSON log line per evaluation
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 10, 20]
    assert (out / "config.toml").exists() and (out / "curves.png").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["worker", "--stage", "0"], "--redis-url"),
    (["worker", "--stage", "5", "--redis-url", "redis://127.0.0.1:1/0"], "not a stage of a 2-stage pipeline"),
    (["worker", "--stage", "0", "--redis-url", "redis://127.0.0.1:1/0", "--set", "outer.method=diloco"],
     "needs a global collective"),
    (["worker", "--stage", "0", "--redis-url", "http://x"], "invalid network.redis_url"),
    (["status"], "--redis-url"),
])
def test_worker_and_status_bad_input(capsys, monkeypatch, args, fragment):
    code, out, err = run_cli_in_process(capsys, monkeypatch, *args)
    assert code == 2, (out, err)
    assert fragment in err


def test_status_lists_members_and_fails_cleanly_without_redis():
    from noloco_rt.membership.embedded_redis import EmbeddedRedis
    from noloco_rt.membership.records import MemberRecord, WorkerState
    from noloco_rt.membership.redis_access import connect
    from noloco_rt.membership.table import Membership

    with EmbeddedRedis() as server:
        Membership(connect(server.url), run_id="default", heartbeat_interval_s=30).register(
            MemberRecord("abcdef0123", "default", 1, "tcp://10.0.0.7:5000", "tcp://10.0.0.7:5001",
                         WorkerState.ONLINE, outer_step=3, queue_depth=2, outer_matched=2, outer_failed=1,
                         checkpoint_failed=4))
        marks = Membership(connect(server.url), run_id="default").high_water
        marks.client.hset(marks.key, "1", "3")
        marks.record_durable(1, 2)
        # Piped at the default 80 columns: a plain table, nothing cut, one line per worker.
        result = run_cli("status", "--redis-url", server.url, env={"COLUMNS": "80"})
        assert result.returncode == 0, result.stderr
        [row] = [line for line in result.stdout.splitlines() if " ONLINE " in line]
        assert row.split()[:4] == ["1", "abcdef01", "-", "ONLINE"] and "tcp://10.0.0.7:5000" in row
        assert "…" not in result.stdout
        assert "(stage 1 reached outer step 3, durable 2)" in result.stdout.splitlines()[0]
        assert "finished" not in result.stdout.splitlines()[0]
        # Outer steps by kind: per stage under the title, per worker in the table.
        assert result.stdout.splitlines()[1] == ("outer steps stage 1: 2 of 3 matched, 0 partial, 0 local, "
                                                 "0 dropped_late, 1 failed")
        assert " 2/0/0/0/1 " in row
        header = next(line for line in result.stdout.splitlines() if line.startswith("stage"))
        assert row.split()[row.split().index("2/0/0/0/1") + 1] == "4" and "ckpt failed" in header
        marks_finished = Membership(connect(server.url), run_id="default")
        marks_finished.mark_run_finished(40)
        after = run_cli("status", "--redis-url", server.url, env={"COLUMNS": "80"})
        assert after.stdout.splitlines()[0].endswith("; finished (40 steps)"), after.stdout
        as_json = run_cli("status", "--json", "--redis-url", server.url)
        assert as_json.returncode == 0, as_json.stderr
        [member, run] = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert run == {"record": "run", "run_id": "default", "workers": 1, "stages": 1, "finished": True,
                       "finished_steps": 40, "outer_step_reached": {"1": 3}, "outer_step_durable": {"1": 2}}
        assert member["record"] == "worker"
        assert (member["worker_id"], member["state"], member["outer_step"], member["queue_depth"]) == (
            "abcdef0123", "ONLINE", 3, 2)
        assert member["loss"] is None and member["heartbeat_age_s"] >= 0
        assert {k: member[f"outer_{k}"] for k in ("matched", "partial", "local", "dropped_late", "failed")} == {
            "matched": 2, "partial": 0, "local": 0, "dropped_late": 0, "failed": 1}
        assert member["checkpoint_failed"] == 4
        # Asked for a run this Redis does not hold (README's steps pass no run id): the runs it
        # holds, instead of "0 workers"; as JSON too, so a script tells a wrong id from a finished run.
        Membership(connect(server.url), run_id="mine").mark_run_finished(7)
        wrong = run_cli("status", "--redis-url", server.url, "--set", "run.run_id=absent")
        assert wrong.returncode == 0, wrong.stderr
        assert wrong.stdout.splitlines()[0] == "run absent: nothing in this Redis. Runs here:", wrong.stdout
        assert "  default: 1 stage(s), 1 worker(s) listed, finished (40 steps), furthest outer step 3" in wrong.stdout
        assert "  mine: 0 stage(s), 0 worker(s) listed, finished (7 steps), furthest outer step 0" in wrong.stdout
        listed = run_cli("status", "--json", "--redis-url", server.url, "--set", "run.run_id=absent")
        runs = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["record"], r["run_id"], r["finished_steps"]) for r in runs] == [
            ("run", "default", 40), ("run", "mine", 7)]
        # A finished run with no worker left still prints its run line.
        done = run_cli("status", "--json", "--redis-url", server.url, "--set", "run.run_id=mine")
        assert [json.loads(line)["finished_steps"] for line in done.stdout.splitlines()] == [7]
        url = server.url
    result = run_cli("status", "--redis-url", url)
    assert result.returncode == 2 and "unreachable" in result.stderr and "Traceback" not in result.stderr


def test_status_watch_refreshes_the_table_until_interrupted(tmp_path):
    import signal
    import time

    from noloco_rt.membership.embedded_redis import EmbeddedRedis
    from noloco_rt.membership.records import MemberRecord, WorkerState
    from noloco_rt.membership.redis_access import connect
    from noloco_rt.membership.table import Membership

    def record(worker_id: str, name: str) -> MemberRecord:
        return MemberRecord(worker_id, "default", 0, "tcp://10.0.0.7:5000", "tcp://10.0.0.7:5001",
                            WorkerState.ONLINE, name=name, inner_step=7, loss=2.5)

    with EmbeddedRedis() as server:
        Membership(connect(server.url), run_id="default", heartbeat_interval_s=30).register(record("aaaa1111", "first"))
        out = tmp_path / "watch.txt"
        # PYTHONFAULTHANDLER: should it ever ignore Ctrl-C, SIGABRT makes it print where it is.
        env = settings_free_env(COLUMNS="250", PYTHONFAULTHANDLER="1")
        with out.open("w") as handle:
            # Ctrl-C as a terminal would deliver it: a suite started in the background (`&`
            # without job control) ignores SIGINT, and children inherit that.
            watcher = subprocess.Popen([*CLI, "status", "--redis-url", server.url, "--watch", "--interval", "0.2"],
                                       stdout=handle, stderr=subprocess.STDOUT, env=env,
                                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 60
            while "first" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "first" in out.read_text() and "second" not in out.read_text()
            # A worker that joins later shows up in a later refresh.
            Membership(connect(server.url), run_id="default", heartbeat_interval_s=30).register(
                record("bbbb2222", "second"))
            while "second" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "second" in out.read_text() and "2.500" in out.read_text()
            watcher.send_signal(signal.SIGINT)
            try:
                code = watcher.wait(20)
            except subprocess.TimeoutExpired:  # say where it was stuck
                watcher.send_signal(signal.SIGABRT)
                watcher.wait(10)
                raise AssertionError(f"status --watch ignored SIGINT for 20 s:\n{out.read_text()[-4000:]}") from None
            assert code == 130
        finally:
            if watcher.poll() is None:
                watcher.kill()


@pytest.mark.slow
def test_a_redis_url_at_a_server_that_is_not_redis_is_one_line_at_once(tmp_path):
    """An HTTP server where Redis should be (a wrong port): status, worker and coordinator say
    so in one line and exit 2 at once, instead of waiting for a Redis that will never answer."""
    import http.server
    import threading

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{server.server_address[1]}/0"
    try:
        for args in (["status"], ["worker", "--stage", "0"], ["coordinator", "--out", str(tmp_path)]):
            result = run_cli(*args, "--redis-url", url, timeout=60)
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
            assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr[-2000:])
            assert len(errors) == 1 and "does not speak Redis (it answered" in errors[0], errors
    finally:
        server.shutdown()
        server.server_close()

"""`noloco-rt up` end to end: real Redis, coordinator and workers, a real run directory."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from noloco_rt.config import load_config
from noloco_rt.curves.scalar_log import tag
from noloco_rt.logs import read_json_lines
from noloco_rt.membership.progress import OUTER_STEP_KINDS
from tests.support.command_env import settings_free_env
from tests.support.tensorboard_events import HAVE_TENSORBOARD, read_scalars
from tests.support.up_runs import FAST, finish, marked_processes, start_up, wait_until
from workers.cluster.local_cluster import error_events
from workers.cluster.run_dir import read_metrics
from workers.cluster.run_outcome import incarnation_logs, worker_summaries
from workers.cluster.up_run import next_commands

pytestmark = pytest.mark.timeout(300)











@pytest.mark.slow
def test_up_trains_exports_a_model_that_beats_the_untrained_one_and_leaves_nothing_running(tmp_path):
    from noloco_rt.membership.embedded_redis import free_port

    mark, out, status_port = uuid.uuid4().hex, tmp_path / "run", free_port()
    # CUDA graphs asked for on a machine without CUDA: every worker says it trains without them.
    process = start_up(out, steps=40, mark=mark, **{"coordinator.status_port": status_port, "model.cuda_graphs": "on"})
    try:
        code, output = finish(process, timeout_s=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, output[-4000:]
    assert marked_processes(mark) == [], "a child of up survived it"

    assert (out / "config.toml").exists()
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert {"s0-r0", "s0-r1", "s1-r0", "s1-r1", "coordinator"} <= {name.split(".")[0] for name in logs}, logs
    # coordinator.status_port is honoured under up (it used to be a random port).
    started = [json.loads(line) for name in logs if name.startswith("coordinator")
               for line in (out / "logs" / name).read_text().splitlines() if '"coordinator_started"' in line]
    assert started and started[0]["port"] == status_port, started
    assert f"127.0.0.1:{status_port}/status" in output
    assert error_events((out / "logs").glob("*.log")) == []  # fault-free
    # Each worker resolved its memory settings once at start (no budget on the CPU: the explicit 2, no checkpointing).
    plans = [json.loads(line) for name in logs if name.startswith("s")
             for line in (out / "logs" / name).read_text().splitlines() if '"memory_plan"' in line]
    assert len(plans) >= 4 and {(e["max_inflight"], e["activation_checkpointing"]) for e in plans} == {(2, False)}
    unused = [json.loads(line) for name in logs if name.startswith("s")
              for line in (out / "logs" / name).read_text().splitlines() if '"cuda_graphs_unused"' in line]
    assert len(unused) == len(plans) and {e["device"] for e in unused} == {"cpu"}, unused
    records = read_metrics(out / "metrics.jsonl")
    samples = [r for r in records if r["kind"] == "workers"]
    assert samples and {w["name"] for w in samples[-1]["workers"]} == {"s0-r0", "s0-r1", "s1-r0", "s1-r1"}
    assert any(w["loss"] is not None for s in samples for w in s["workers"])
    # The last sample is the run as it ended: every worker's final figures, from its summary line.
    last = samples[-1]
    assert last["extra"] == {"final": True}, last["extra"]
    stage0 = [w for w in last["workers"] if w["stage"] == 0]
    assert all(w["inner_step"] == 40 and w["state"] == "finished" for w in stage0), stage0
    assert all(w["checkpoint_failed"] == 0 for w in last["workers"]), last["workers"]  # summed from summaries
    outer = {w["name"]: {k: w[f"outer_{k}"] for k in OUTER_STEP_KINDS} for w in last["workers"]}
    # Every outer step of stage 0 is taken once, but any a pull jumped over (a worker 2+ behind)
    # and those before the state a late starter bootstrapped from a peer (under load one worker's
    # start can take longer than its partner's first outer steps).
    booted = {n: bootstrapped_at(out, n) for n in outer}
    jumped = {n: sum(s.get("skipped_outer_steps", 0) for s in worker_summaries(incarnation_logs(out / "logs", n)))
              + booted[n]["outer_step"] for n in outer}
    assert all(sum(k.values()) + jumped[n] == 8 and k["failed"] == 0
               for n, k in outer.items() if n.startswith("s0")), (outer, jumped)
    # Stage 1 follows its data's clock, not its own share of inner steps: never more outer steps than stage 0.
    assert all(sum(k.values()) <= 8 and k["failed"] == 0 for n, k in outer.items() if n.startswith("s1")), outer
    # up's closing line reports them per stage, in the same words.
    done = next(json.loads(line) for line in output.splitlines() if '"up_done"' in line)
    assert done["outer_steps"].startswith("stage 0: ") and "; stage 1: " in done["outer_steps"], done
    assert all(kind in done["outer_steps"] for kind in OUTER_STEP_KINDS), done
    final = [r for r in records if r["kind"] == "final"]
    assert len(final) == 1 and final[0]["step"] == 40 and final[0]["replicas_per_stage"] == [2, 2]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if HAVE_TENSORBOARD:  # on by default: OUT/tb/workers (written by up) and OUT/tb/coordinator
        assert_tensorboard_curves(out, final[0], {w["name"]: w["inner_step"] for w in last["workers"]},
                                  {n: b["inner_step"] for n, b in booted.items()})

    scored = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "eval", str(out / "consensus.safetensors"),
                             "--json"], capture_output=True, text=True, timeout=120)
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout)
    assert result["val_loss"] < result["untrained_val_loss"] - 0.5, result


@pytest.mark.slow
def test_a_live_run_shows_on_its_page_and_ctrl_c_shuts_everything_down_gracefully(tmp_path):
    """A 2 x 2 run: its coordinator's page, rendered by a real headless browser, shows both
    stages' workers and both curves; Ctrl-C then ends everything within the grace period."""
    from noloco_rt.membership.embedded_redis import free_port

    mark, out, port = uuid.uuid4().hex, tmp_path / "run", free_port()
    # Each worker a fresh interpreter (worker.forked_start = false), so that /proc shows its own
    # command line and environment, which the password check reads; forked, they hold neither.
    process = start_up(out, steps=100_000, mark=mark, **{"coordinator.status_port": port,
                                                         "worker.forked_start": "false"})
    try:
        def all_online():
            samples = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "workers"]
            return samples and all(w["state"] == "ONLINE" and w["inner_step"] > 0 for w in samples[-1]["workers"])

        wait_until(all_online, timeout_s=120, what="4 ONLINE workers training", process=process)
        assert len(marked_processes(mark)) >= 6  # redis, coordinator, 4 workers
        assert_embedded_redis_is_private(marked_processes(mark))
        check_live_page(f"http://127.0.0.1:{port}", process)
        process.send_signal(signal.SIGINT)
        started = time.monotonic()
        code, output = finish(process, timeout_s=FAST["worker.leave_grace_s"] + 30)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 130, output[-4000:]
    assert marked_processes(mark) == [], "a child of up survived Ctrl-C"
    # Every worker left gracefully (its record deleted, a last checkpoint written) ...
    for name in ("s0-r0", "s0-r1", "s1-r0", "s1-r1"):
        log_text = (out / "logs" / f"{name}.0.log").read_text()
        assert '"event": "leaving"' in log_text and '"reason": "leave"' in log_text, log_text[-2000:]
    # ... and what they learned was exported.
    assert (out / "consensus.safetensors").exists() and elapsed < FAST["worker.leave_grace_s"] + 30


def check_live_page(url: str, process: subprocess.Popen) -> None:
    """The page's data holds both stages and both curves; the browser draws them."""
    import urllib.request

    from tests.support.browser import ARTIFACTS, browser, render

    def data() -> dict:
        with urllib.request.urlopen(f"{url}/page/data", timeout=5) as reply:
            return json.loads(reply.read())

    def drawn() -> dict | None:
        page = data()
        ready = ([row["workers"] for row in page["stages"]] == [2, 2] and len(page["curves"]["val_loss"]) >= 2
                 and len(page["curves"]["spread"]) >= 1)
        return page if ready else None

    page = wait_until(drawn, timeout_s=90, what="the page's data: 2 stages of 2 and both curves", process=process)
    assert page["stages"][1]["loss"] is not None and page["stages"][0]["tokens_per_s"] > 0, page
    if browser() is None:
        print("SKIPPED the browser part: no chromium here (make test installs it where it can: root and apt)")
        return
    dom = render(f"{url}/", screenshot=ARTIFACTS / "live_page.png")
    print("live page screenshot:", ARTIFACTS / "live_page.png")
    assert 'data-loaded="yes"' in dom, dom[-3000:]
    assert dom.count('<tr data-stage="') == 2 and "2 ONLINE" in dom, dom[-3000:]
    points = [int(n) for n in re.findall(r'class="line" d="[^"]*" data-points="(\d+)"', dom)]
    assert len(points) == 2 and min(points) >= 1, points
    assert f"{page['workers']} workers in 2 stages" in dom


def assert_embedded_redis_is_private(pids: list[int]) -> None:
    """up's own Redis asks for a random password, which its processes get through their
    environment and no process shows on its command line."""
    import redis

    def read(pid: int, name: str) -> bytes:
        return (Path("/proc") / str(pid) / name).read_bytes()

    from urllib.parse import urlparse

    worker = next(pid for pid in pids if b"worker" in read(pid, "cmdline").split(b"\0"))
    variable = b"NOLOCO_NETWORK_REDIS_URL="
    url = urlparse(next(v for v in read(worker, "environ").split(b"\0") if v.startswith(variable))
                   [len(variable):].decode())
    assert url.password is not None and len(url.password) >= 32, url
    assert all(url.password.encode() not in read(pid, "cmdline") for pid in pids)
    assert redis.Redis(port=url.port, password=url.password, socket_timeout=5).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=url.port, socket_timeout=5).ping()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--stages", "9"], "at most 4 stages"),
    (["--set", "outer.method=ddp"], "needs a global collective"),
    (["--redis-url", "http://x"], "must start with redis://"),
    (["--replicas", "0"], "--replicas"),
    # As the container image sets it: refused once, not by every worker's restarts.
    (["--set", "network.bind_host=0.0.0.0"], "without CURVE keys"),
])
def test_up_bad_input_is_one_clear_line_and_starts_nothing(tmp_path, capsys, monkeypatch, args, fragment):
    from tests.support.in_process import run_cli_in_process

    code, _, err = run_cli_in_process(capsys, monkeypatch, "up", "--out", str(tmp_path / "run"), *args)
    assert code == 2 and fragment in err, err
    assert not (tmp_path / "run" / "logs").exists()


def test_up_refuses_a_run_directory_of_another_configuration(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.toml").write_text('[model]\npreset = "small"\n')
    result = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "up", "--out", str(out)],
                            capture_output=True, text=True, timeout=60,
                            env=settings_free_env())
    assert result.returncode == 2 and "another configuration" in result.stderr and "model.preset" in result.stderr


def test_the_coordinator_status_port_is_the_configured_one_unless_taken():
    import socket

    from noloco_rt.membership.embedded_redis import free_port
    from workers.cluster.up_run import status_port_for

    class Log:
        def __init__(self) -> None:
            self.warnings: list[dict] = []

        def warning(self, event: str, **fields: object) -> None:
            self.warnings.append({"event": event, **fields})

    log, wanted = Log(), free_port()
    assert status_port_for("127.0.0.1", wanted, log) == wanted and not log.warnings
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", wanted))
        holder.listen()
        other = status_port_for("127.0.0.1", wanted, log)
    assert other != wanted and log.warnings[0]["event"] == "status_port_taken" and log.warnings[0]["port"] == other
    assert status_port_for("127.0.0.1", 0, log) > 0


def bootstrapped_at(out: Path, name: str) -> dict[str, int]:
    """The steps worker `name` took from a peer when it started (0 and 0: it did not bootstrap)."""
    events = [e for path in incarnation_logs(out / "logs", name) for e in read_json_lines(path)[0]
              if e.get("event") == "bootstrapped"]
    return {"outer_step": events[0]["outer_step"], "inner_step": events[0]["inner_step"]} if events else {
        "outer_step": 0, "inner_step": 0}


def assert_tensorboard_curves(out: Path, final: dict, inner_steps: dict[str, int],
                              booted_at: dict[str, int]) -> None:
    # One event file per worker (OUT/tb/workers/<name>): their steps interleave in time. Tags
    # name the stage, so a stage's replicas are curves of one chart.
    for name in ("s0-r0", "s0-r1", "s1-r0", "s1-r1"):
        worker, chart = read_scalars(out / "tb" / "workers" / name), f"stage{name[1]}"
        for scalar in ("tokens_per_s", "lr", "exchange_wire_bytes"):
            points = worker.get(tag(scalar, chart), [])
            assert points and all(v >= 0 for _, v in points), (name, scalar, sorted(worker))
        if name.startswith("s1"):  # the last stage computes the loss, logged at step 1 and every 10th step
            steps = [step for step, _ in worker[tag("train_loss", chart)]]
            first = 1 if not booted_at[name] else (booted_at[name] // 10 + 1) * 10  # a late starter's first 10th
            assert steps == sorted(steps) and steps[0] == first and steps[-1] == max(1, inner_steps[name] // 10 * 10), \
                (steps, inner_steps[name], booted_at[name])
    consensus = read_scalars(out / "tb" / "workers")
    assert consensus[tag("consensus_val_loss")] == [(final["step"], pytest.approx(final["val_loss"], rel=1e-5))]
    # The coordinator's own file holds exactly what it logged: every evaluation, every spread measurement.
    coordinator = read_scalars(out / "tb" / "coordinator")
    events = [e for path in (out / "logs").glob("coordinator.*.log") for e in read_json_lines(path)[0]]
    evaluated = [e["val_loss"] for e in events if e.get("event") == "evaluated"]
    spreads = [e["spread"] for e in events if e.get("event") == "spread_measured"]
    assert evaluated or spreads, "the coordinator measured nothing in the whole run"
    assert [v for _, v in coordinator.get(tag("val_loss"), [])] == pytest.approx(evaluated, abs=1e-4)
    assert [v for _, v in coordinator.get(tag("spread", "all"), [])] == pytest.approx(spreads, rel=1e-5)


def test_the_closing_hint_names_the_code_and_data_a_consensus_file_does_not_pick():
    stdlib, tokens, own = (load_config(environ={}, overrides=[o]) for o in (
        {}, {"data": {"source": "tokens", "paths": ["/data/my prep"]}},
        {"model": {"factory": "pkg.models:staged_model"}}))
    assert next_commands(stdlib, Path("o/c.safetensors")) == \
        "noloco-rt eval o/c.safetensors; noloco-rt sample o/c.safetensors --prompt 'def '"
    assert "eval o/c.safetensors --data '/data/my prep';" in next_commands(tokens, Path("o/c.safetensors"))
    assert next_commands(own, Path("c")) == "noloco-rt eval c --model pkg.models:staged_model"

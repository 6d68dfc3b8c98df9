"""The local supervisor with real child processes, and `noloco-rt launch` with real workers.

No mocks and no sleeps as synchronisation: every wait polls a condition under a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.records import WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from tests.support.command_env import command_env
from tests.support.waiting import wait_until
from workers.cluster.local_cluster import read_events
from workers.supervise.elastic import ElasticProcess
from workers.supervise.launch import worker_specs
from workers.supervise.supervisor import ProcessSpec, RestartPolicy, Supervisor, SupervisorEvent

pytestmark = pytest.mark.timeout(180)

FAST = RestartPolicy(max_restarts=3, backoff_initial_s=0.05, backoff_max_s=0.1)
# Children loop for at most a minute: bounded even if a test fails to stop them.
SLEEPER = "import time\nfor _ in range(600):\n    time.sleep(0.1)\n"


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code))


def alive(pid: int) -> bool:
    """Running (a zombie counts as dead: it may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Polled:
    """A supervisor plus every event its polls returned."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.events: list[SupervisorEvent] = []

    def poll(self) -> None:
        self.events += self.supervisor.poll()

    def until(self, condition: Callable[[], Any], *, timeout_s: float = 20.0, what: str) -> Any:
        return wait_until(condition, timeout_s=timeout_s, what=what, on_poll=self.poll)

    def status(self, name: str):
        return next(s for s in self.supervisor.statuses() if s.name == name)

    def kinds(self, name: str) -> list[str]:
        return [e.kind for e in self.events if e.name == name]


@pytest.fixture
def supervise(tmp_path) -> Iterator[Callable[..., Polled]]:
    started: list[Supervisor] = []

    def make(*specs: ProcessSpec, policy: RestartPolicy = FAST, grace_s: float = 5.0) -> Polled:
        supervisor = Supervisor(specs, log_dir=tmp_path / "logs", policy=policy, grace_s=grace_s)
        started.append(supervisor)
        supervisor.start()
        return Polled(supervisor)

    yield make
    for supervisor in started:
        supervisor.stop(grace_s=2.0)


# -- RestartPolicy -----------------------------------------------------------------------

def test_delay_doubles_per_consecutive_failure_up_to_the_cap():
    policy = RestartPolicy(backoff_initial_s=1.0, backoff_max_s=30.0)
    assert [policy.delay_s(n) for n in range(0, 8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.delay_s(10_000) == 30.0  # no overflow however long the streak
    assert RestartPolicy(backoff_initial_s=0.25, backoff_max_s=0.25).delay_s(3) == 0.25
    assert RestartPolicy(backoff_initial_s=0.0, backoff_max_s=0.0).delay_s(5) == 0.0


@pytest.mark.parametrize("fields, message", [({"max_restarts": -1}, "max_restarts"),
                                             ({"backoff_initial_s": -1.0}, "backoff_initial_s"),
                                             ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff_max_s"),
                                             ({"healthy_after_s": -1.0}, "healthy_after_s")])
def test_policy_rejects_nonsense(fields, message):
    with pytest.raises(ValueError, match=message):
        RestartPolicy(**fields)


def test_specs_are_validated():
    with pytest.raises(ValueError, match="args is empty"):
        ProcessSpec("a", ())
    with pytest.raises(ValueError, match="names log files"):
        ProcessSpec("../a", ("true",))
    with pytest.raises(ValueError, match="repeated: a"):
        Supervisor([ProcessSpec("a", ("true",)), ProcessSpec("a", ("true",))], log_dir=Path("/tmp"),
                   policy=FAST, grace_s=1.0)


# -- Supervisor with tiny python children ------------------------------------------------

def test_exit_zero_is_finished_not_restarted_and_run_returns_0(tmp_path):
    code = """
        import os, sys
        print("out", os.environ["NOLOCO_SUPERVISED"], os.environ["NOLOCO_INCARNATION"], os.environ["LOCAL_RANK"])
        print("err line", file=sys.stderr)
    """
    supervisor = Supervisor([ProcessSpec("once", python(code), env={"LOCAL_RANK": "3"})],
                            log_dir=tmp_path / "logs", policy=FAST, grace_s=1.0)
    stop = threading.Event()
    safety = threading.Timer(30.0, stop.set)  # bounds run() should the child never be reaped
    safety.start()
    try:
        assert supervisor.run(stop, tick_s=0.02) == 0
    finally:
        safety.cancel()
    assert not stop.is_set()  # it returned because the child finished, not on the safety timer
    (status,) = supervisor.statuses()
    assert (status.state, status.restarts, status.returncode, status.incarnation) == ("finished", 0, 0, 0)
    assert supervisor.done()
    assert status.log_path == tmp_path / "logs" / "once.0.log"
    assert status.log_path.with_suffix(".out").read_text() == "out 1 0 3\n"
    assert status.log_path.read_text() == "err line\n"
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["once.0.log", "once.0.out"]


def test_failing_child_backs_off_then_gives_up_while_its_sibling_runs(supervise, tmp_path):
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=0.2, backoff_max_s=0.3)
    run = supervise(ProcessSpec("crash", python("print('crashing'); raise SystemExit(1)")),
                    ProcessSpec("steady", python(SLEEPER)), policy=policy)
    steady_pid = run.status("steady").pid
    run.until(lambda: run.status("crash").state == "failed", what="crash to give up")
    crash = [e for e in run.events if e.name == "crash"]
    assert [e.kind for e in crash] == ["started", "exited", "restarted", "exited", "restarted", "exited", "gave_up"]
    exits = [e for e in crash if e.kind == "exited"]
    assert [e.returncode for e in exits] == [1, 1, 1]
    assert [e.restart_in_s for e in exits] == [0.2, 0.3, None]  # doubled, capped, then no restart
    for exited, restarted in zip(exits, [e for e in crash if e.kind == "restarted"], strict=False):
        assert restarted.at_s - exited.at_s >= exited.restart_in_s  # the backoff was waited out
    status = run.status("crash")
    assert (status.restarts, status.incarnation, status.returncode, status.pid) == (2, 2, 1, crash[-1].pid)
    for incarnation in range(3):
        assert (tmp_path / "logs" / f"crash.{incarnation}.out").read_text() == "crashing\n"
    steady = run.status("steady")
    assert (steady.state, steady.pid, steady.restarts) == ("running", steady_pid, 0)
    assert alive(steady_pid) and not run.supervisor.done()
    assert run.kinds("steady") == ["started"]
    codes = run.supervisor.stop(grace_s=5.0)
    assert codes == {"crash": 1, "steady": -signal.SIGTERM}  # no handler: SIGTERM's default action
    assert run.status("steady").state == "stopped" and run.supervisor.done()


def test_run_returns_1_when_a_process_gave_up(tmp_path):
    supervisor = Supervisor([ProcessSpec("crash", python("raise SystemExit(7)")),
                             ProcessSpec("fine", python("pass"))],
                            log_dir=tmp_path, policy=RestartPolicy(max_restarts=0), grace_s=1.0)
    stop = threading.Event()
    safety = threading.Timer(30.0, stop.set)
    safety.start()
    try:
        assert supervisor.run(stop, tick_s=0.02) == 1
    finally:
        safety.cancel()
    assert {s.name: (s.state, s.returncode) for s in supervisor.statuses()} == {
        "crash": ("failed", 7), "fine": ("finished", 0)}


def test_no_restart_spec_fails_once(supervise):
    run = supervise(ProcessSpec("oneshot", python("raise SystemExit(2)"), restart=False))
    run.until(run.supervisor.done, what="oneshot to end")
    assert run.kinds("oneshot") == ["started", "exited"]  # neither a restart nor a "gave up"
    assert (run.status("oneshot").state, run.status("oneshot").returncode) == ("failed", 2)


def test_sigkilled_child_is_restarted_and_its_sibling_untouched(supervise, tmp_path):
    run = supervise(ProcessSpec("victim", python(SLEEPER)), ProcessSpec("neighbour", python(SLEEPER)))
    victim_pid, neighbour_pid = run.status("victim").pid, run.status("neighbour").pid
    os.kill(victim_pid, signal.SIGKILL)
    restarted = run.until(lambda: next((e for e in run.events if e.kind == "restarted"), None),
                          what="the victim's restart")
    assert restarted.name == "victim" and restarted.incarnation == 1 and restarted.pid != victim_pid
    exited = next(e for e in run.events if e.kind == "exited")
    assert (exited.name, exited.pid, exited.returncode) == ("victim", victim_pid, -signal.SIGKILL)
    assert alive(restarted.pid) and not alive(victim_pid)
    assert (run.status("victim").pid, run.status("victim").restarts, run.status("victim").state) == (
        restarted.pid, 1, "running")
    assert run.status("victim").log_path == tmp_path / "logs" / "victim.1.log"
    assert (tmp_path / "logs" / "victim.0.log").exists()
    neighbour = run.status("neighbour")
    assert (neighbour.pid, neighbour.restarts, neighbour.incarnation) == (neighbour_pid, 0, 0)
    assert alive(neighbour_pid) and run.kinds("neighbour") == ["started"]


def test_a_long_healthy_run_resets_the_backoff_but_not_the_restart_count(supervise):
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=0.05, backoff_max_s=1.0, healthy_after_s=0.3)
    run = supervise(ProcessSpec("slow-crash", python("import time; time.sleep(0.4); raise SystemExit(1)")),
                    ProcessSpec("fast-crash", python("raise SystemExit(1)")), policy=policy)
    run.until(run.supervisor.done, timeout_s=30, what="both to give up")
    delays = {name: [e.restart_in_s for e in run.events if e.name == name and e.kind == "exited"]
              for name in ("slow-crash", "fast-crash")}
    assert delays == {"slow-crash": [0.05, 0.05, None], "fast-crash": [0.05, 0.1, None]}
    assert [s.restarts for s in run.supervisor.statuses()] == [2, 2]


def test_a_missing_executable_is_a_failed_run(supervise, tmp_path):
    run = supervise(ProcessSpec("ghost", (str(tmp_path / "no-such-binary"),)),
                    policy=RestartPolicy(max_restarts=1, backoff_initial_s=0.05, backoff_max_s=0.05))
    run.until(run.supervisor.done, what="ghost to give up")
    assert run.kinds("ghost") == ["exited", "exited", "gave_up"]
    status = run.status("ghost")
    assert (status.state, status.restarts, status.returncode, status.pid) == ("failed", 1, None, None)


def test_the_owners_signal_handlers_survive_each_spawn(supervise):
    # torch's PContext.start() installs its own SIGTERM/SIGINT handlers; `launch` relies on its own.
    def mine(*_: object) -> None:
        pass

    previous = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        run = supervise(ProcessSpec("short", python("raise SystemExit(1)")))
        run.until(lambda: run.status("short").restarts >= 1, what="a restart")
        assert {sig: signal.getsignal(sig) for sig in previous} == dict.fromkeys(previous, mine)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_stop_is_graceful_first_then_sigkill_after_the_grace(supervise, tmp_path):
    marker = tmp_path / "left-gracefully"
    graceful = f"""
        import signal, sys, time
        def leave(*_):
            open({str(marker)!r}, "w").write("bye")
            sys.exit(0)
        signal.signal(signal.SIGTERM, leave)
        print("ready", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        for _ in range(600):
            time.sleep(0.1)
    """
    stubborn = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        for _ in range(600):
            time.sleep(0.1)
    """
    run = supervise(ProcessSpec("graceful", python(graceful)), ProcessSpec("stubborn", python(stubborn)))
    logs = tmp_path / "logs"
    pids = {name: run.status(name).pid for name in ("graceful", "stubborn")}
    for name in pids:  # the handlers are installed once "ready" is out
        run.until(lambda n=name: "ready" in (logs / f"{n}.0.out").read_text(), what=f"{name} ready")
    began = time.monotonic()
    codes = run.supervisor.stop(grace_s=1.0)
    took_s = time.monotonic() - began
    assert codes == {"graceful": 0, "stubborn": -signal.SIGKILL}
    assert marker.read_text() == "bye"
    assert took_s >= 1.0  # the stubborn one had its grace before the SIGKILL
    assert not any(alive(pid) for pid in pids.values())
    assert [s.state for s in run.supervisor.statuses()] == ["stopped", "stopped"]
    assert (logs / "graceful.0.log").read_text() == "to stderr\n"
    again = time.monotonic()
    assert run.supervisor.stop(grace_s=1.0) == codes and time.monotonic() - again < 0.5  # idempotent
    assert run.supervisor.poll() == []


def test_an_interrupted_stop_is_finished_by_the_next(supervise, tmp_path):
    # `noloco-rt up` turns a second Ctrl-C into KeyboardInterrupt in the middle of stop().
    marker = tmp_path / "left"
    graceful = f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (open({str(marker)!r}, "w").close(), sys.exit(0)))
        print("ready", flush=True)
        for _ in range(600):
            time.sleep(0.1)
    """
    stubborn = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" + SLEEPER
    run = supervise(ProcessSpec("graceful", python(graceful)), ProcessSpec("stubborn", python(stubborn)))
    for name in ("graceful", "stubborn"):
        run.until(lambda n=name: "ready" in (tmp_path / "logs" / f"{n}.0.out").read_text(), what=f"{name} ready")

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    def second_ctrl_c() -> None:  # once the graceful one has left, while stop() waits on the other
        wait_until(marker.exists, timeout_s=20, what="the graceful child to leave")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    poker = threading.Thread(target=second_ctrl_c)
    poker.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.supervisor.stop(grace_s=60.0)
    finally:
        poker.join(30)
        signal.signal(signal.SIGUSR1, previous)
    run.until(lambda: run.status("graceful").state == "stopped", what="graceful reaped as stopped")
    assert run.kinds("graceful") == ["started"]  # neither an exit to report nor a restart
    assert run.supervisor.stop(grace_s=0.0) == {"graceful": 0, "stubborn": -signal.SIGKILL}
    assert [s.state for s in run.supervisor.statuses()] == ["stopped", "stopped"]


def test_incarnations_continue_after_old_logs(supervise, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "job.4.log").write_text("an earlier supervisor's\n")
    run = supervise(ProcessSpec("job", python("print('new')")))
    run.until(run.supervisor.done, what="job to end")
    assert run.status("job").incarnation == 5
    assert (logs / "job.4.log").read_text() == "an earlier supervisor's\n"
    assert (logs / "job.5.out").read_text() == "new\n"


def test_children_die_when_the_supervisor_is_sigkilled(tmp_path):
    child = ("from noloco_rt.process.lifetime import set_parent_death_signal_from_env as arm\n"
             "import os\narm()\nprint('ready', os.getpid(), flush=True)\n" + SLEEPER)

    def started() -> int:
        line = wait_until(lambda: _first_line(tmp_path / "orphan.0.out"), timeout_s=30, what="the child to start")
        return int(line.split()[1])

    _sigkill_the_supervisor_of(f"ProcessSpec('orphan', (sys.executable, '-c', {child!r}))", tmp_path, started,
                               preloaded=False, death_s=10)


def _sigkill_the_supervisor_of(spec: str, log_dir: Path, started: Callable[[], int], *, preloaded: bool,
                               death_s: float) -> None:
    """Supervise the one process `spec` (Python making a ProcessSpec) in a process of its own;
    once `started()` has its child's pid (its parent-death signal armed), SIGKILL that
    supervisor: the child must die within death_s."""
    script = f"""
        import sys, threading
        from pathlib import Path
        from workers.supervise.supervisor import ProcessSpec, RestartPolicy, Supervisor
        Supervisor([{spec}], log_dir=Path({str(log_dir)!r}), policy=RestartPolicy(), grace_s=1.0,
                   preloaded={preloaded}).run(threading.Event())
    """
    supervisor = subprocess.Popen(python(script), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=command_env())
    child_pid = None
    try:
        child_pid = started()
        assert alive(child_pid)
        supervisor.kill()
        assert supervisor.wait(10) == -signal.SIGKILL
        wait_until(lambda: not alive(child_pid), timeout_s=death_s, what=f"child {child_pid} to die with its parent")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(10)
        if child_pid is not None and alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _first_line(path: Path) -> str | None:
    text = path.read_text() if path.exists() else ""
    return text.splitlines()[0] if text.endswith("\n") else None


# -- `noloco-rt` children forked from the preloaded server (worker.forked_start) ---------------

NOLOCO_RT = (sys.executable, "-m", "noloco_rt.cli")


def _exit_code(process: ElasticProcess, timeout_s: float = 60) -> int:
    return wait_until(lambda: (code := process.poll()) is not None and (code,), timeout_s=timeout_s,
                      what=f"pid {process.pid} to end")[0]


def test_a_forked_command_keeps_its_exit_code_its_log_files_and_a_name_ps_shows(tmp_path):
    def start(name: str, *args: str) -> ElasticProcess:
        process = ElasticProcess.start(name, (*NOLOCO_RT, *args), command_env(), stdout=tmp_path / f"{name}.out",
                                       stderr=tmp_path / f"{name}.log", preloaded=True)
        assert process is not None and process.forked
        return process

    assert _exit_code(start("show", "config", "show")) == 0
    assert "[outer]" in (tmp_path / "show.out").read_text()
    assert _exit_code(start("bad", "config", "show", "--set", "nope.x=1")) == 2
    assert "nope" in (tmp_path / "bad.log").read_text()
    # A long one: named for ps, its secret not in /proc's environment, stopped gracefully.
    secret_url = "redis://:planted-secret@127.0.0.1:1/0"
    waiting = ElasticProcess.start("waits", (*NOLOCO_RT, "worker", "--stage", "0", "--name", "w1"),
                                   command_env(NOLOCO_NETWORK_REDIS_URL=secret_url, NOLOCO_WORKER_REDIS_WAIT_S="120"),
                                   stdout=tmp_path / "waits.out", stderr=tmp_path / "waits.log", preloaded=True)
    try:
        wait_until(lambda: "redis_waiting" in _text(tmp_path / "waits.log"), timeout_s=60,
                   what="the worker to wait for its Redis")
        assert Path(f"/proc/{waiting.pid}/comm").read_text().strip() == "noloco-rt w1"
        assert b"planted-secret" not in Path(f"/proc/{waiting.pid}/environ").read_bytes()
        assert b"planted-secret" not in Path(f"/proc/{waiting.pid}/cmdline").read_bytes()
        started = time.monotonic()
        code = waiting.terminate(grace_s=20)
        # SIGTERM ends it (still waiting for Redis, it has no handler yet), not the SIGKILL after the grace.
        assert code == -signal.SIGTERM and time.monotonic() - started < 15, code
    finally:
        if alive(waiting.pid):
            os.kill(waiting.pid, signal.SIGKILL)


def test_a_forked_child_dies_when_the_supervisor_is_sigkilled(tmp_path):
    """Its parent is the fork server, which must end with the supervisor for the parent-death
    signal to reach the child (multiprocessing hands children the server's keep-alive pipe)."""
    name = f"o{os.getpid() % 10_000}"
    args = (*NOLOCO_RT, "worker", "--stage", "0", "--name", name, "--redis-url", "redis://127.0.0.1:1/0")

    def started() -> int:
        pid = wait_until(lambda: _pid_named(f"noloco-rt {name}"), timeout_s=60, what="the forked child")
        wait_until(lambda: "redis_waiting" in _text(tmp_path / "orphan.0.log"), timeout_s=60,
                   what="the child to arm its parent-death signal and wait for Redis")
        return pid

    _sigkill_the_supervisor_of(f"ProcessSpec('orphan', {args!r}, env={{'NOLOCO_WORKER_REDIS_WAIT_S': '120'}})",
                               tmp_path, started, preloaded=True, death_s=20)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _pid_named(comm: str) -> int | None:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == comm:
                return int(entry.name)
        except OSError:
            continue
    return None


# -- `noloco-rt launch` ---------------------------------------------------------------------

def test_worker_specs_one_worker_per_local_rank():
    specs = worker_specs(stage=1, nproc=2, prefix="node7-s1", redis_url="redis://:secret@db:6379/0", steps=50,
                         metrics_port_base=9100, config_path=None,
                         assignments=("outer.h=5", "network.redis_url=redis://other:1/0"))
    assert [s.name for s in specs] == ["node7-s1-r0", "node7-s1-r1"]
    common = (sys.executable, "-m", "noloco_rt.cli", "worker", "--stage", "1", "--set", "outer.h=5",
              "--steps", "50")
    assert specs[0].args == (*common, "--name", "node7-s1-r0", "--metrics-port", "9100")
    assert specs[1].args == (*common, "--name", "node7-s1-r1", "--metrics-port", "9101")
    # The URL (and its password) goes by environment, never on a command line `ps` shows.
    assert [dict(s.env) for s in specs] == [
        {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "NOLOCO_NETWORK_REDIS_URL": "redis://:secret@db:6379/0"}
        for rank in (0, 1)]  # LOCAL_WORLD_SIZE: the workers sharing this machine's GPUs, for their memory budget
    assert all(s.restart for s in specs)


def test_worker_specs_give_each_rank_its_fixed_ports_and_all_the_same_addresses():
    specs = worker_specs(stage=0, nproc=2, prefix="n-s0", redis_url="redis://db:6379/0", steps=None,
                         metrics_port_base=None, config_path=None, assignments=(), data_port_base=6000,
                         exchange_port_base=7000, hosts={"--bind-host": "0.0.0.0", "--advertise-host": "10.0.0.7",
                                                         "--model": None})
    for rank, spec in enumerate(specs):
        args = spec.args
        assert args[args.index("--bind-host") + 1] == "0.0.0.0" and args[args.index("--advertise-host") + 1] == "10.0.0.7"
        assert "--model" not in args
        assert f"network.data_port={6000 + rank}" in args and f"network.exchange_port={7000 + rank}" in args


@pytest.mark.parametrize(("args", "fragment"), [
    (["--stage", "0", "--nproc", "2", "--redis-url", "redis://127.0.0.1:1/0", "--data-port-base", "6000",
      "--exchange-port-base", "6001"], "its ports overlap those of --data-port-base"),
    (["--stage", "0", "--nproc", "3", "--redis-url", "redis://127.0.0.1:1/0", "--exchange-port-base", "65534"],
     "runs past port 65535"),
    (["--stage", "0", "--nproc", "2", "--redis-url", "redis://127.0.0.1:1/0", "--set", "network.data_port=6000"],
     "give --data-port-base instead"),
    (["--stage", "0", "--nproc", "0", "--redis-url", "redis://127.0.0.1:1/0"], "'--nproc': 0 is not in the range"),
    (["--stage", "2", "--nproc", "1", "--redis-url", "redis://127.0.0.1:1/0"], "not a stage of a 2-stage pipeline"),
    (["--stage", "0", "--nproc", "1"], "--redis-url (or network.redis_url) is required"),
    (["--stage", "0", "--nproc", "2", "--redis-url", "redis://127.0.0.1:1/0", "--metrics-port-base", "65535"],
     "runs past port 65535"),
    (["--stage", "0", "--nproc", "1", "--redis-url", "redis://127.0.0.1:1/0", "--set", "outer.method=ddp"],
     "needs a global collective"),
])
def test_launch_bad_input_is_one_clear_line(capsys, monkeypatch, args, fragment):
    from tests.support.in_process import run_cli_in_process

    code, _, err = run_cli_in_process(capsys, monkeypatch, "launch", *args)
    assert code == 2
    assert fragment in err



SETTINGS = {"pipeline.stages": 2, "outer.h": 5, "pipeline.max_inflight": 2, "worker.checkpoint_every": 1,
            "worker.heartbeat_interval_s": 0.25,
            "worker.deadline_floor_s": 1.0, "worker.deadline_ceiling_s": 5.0, "worker.exchange_timeout_s": 3.0,
            "worker.leave_grace_s": 10.0, "run.log_format": "json"}


class Launch:
    """One `noloco-rt launch` process; its own JSON log is read from a file."""

    def __init__(self, tmp_path: Path, redis_url: str, *, stage: int, nproc: int, prefix: str) -> None:
        self.log_dir = tmp_path / "logs"
        self.own_log = tmp_path / f"launch-{prefix}.err"
        args = [sys.executable, "-m", "noloco_rt.cli", "launch", "--stage", str(stage), "--nproc", str(nproc),
                "--redis-url", redis_url, "--name-prefix", prefix, "--set", f"paths.out_dir={tmp_path}"]
        for key, value in SETTINGS.items():
            args += ["--set", f"{key}={value}"]
        env = command_env(PYTHONUNBUFFERED="1")
        with self.own_log.open("w") as stderr:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr, env=env)

    def events(self, event: str) -> list[dict]:
        return read_events(self.own_log, event)

    def pids(self) -> dict[str, int]:
        """name -> pid of its latest incarnation."""
        found: dict[str, int] = {}
        for record in self.events("process_started") + self.events("process_restarted"):
            found[record["name"]] = record["pid"]
        return found

    def worker_events(self, name: str, incarnation: int, event: str | None = None) -> list[dict]:
        return read_events(self.log_dir / f"{name}.{incarnation}.log", event)

    def latest_inner_step(self, name: str, incarnation: int = 0) -> int:
        return max((e["inner_step"] for e in self.worker_events(name, incarnation) if "inner_step" in e), default=0)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.mark.slow
def test_launch_restarts_only_the_killed_worker_and_leaves_gracefully(tmp_path):
    with EmbeddedRedis() as redis_server:
        launches = [Launch(tmp_path, redis_server.url, stage=0, nproc=2, prefix="a"),
                    Launch(tmp_path, redis_server.url, stage=1, nproc=1, prefix="b")]
        first, last = launches
        membership = Membership(connect(redis_server.url), run_id="default")
        every_pid: set[int] = set()
        try:
            wait_until(lambda: len(membership.live_members(stage=None, states={WorkerState.ONLINE})) == 3,
                       timeout_s=60, what="3 ONLINE workers", interval_s=0.1)
            pids = {**first.pids(), **last.pids()}
            assert sorted(pids) == ["a-r0", "a-r1", "b-r0"]
            every_pid |= set(pids.values())
            # The victim trains and has checkpointed (outer step done) before it is killed.
            wait_until(lambda: first.worker_events("a-r0", 0, "checkpoint_written"), timeout_s=60,
                       what="a-r0's first checkpoint", interval_s=0.1)
            os.kill(pids["a-r0"], signal.SIGKILL)

            restarted = wait_until(lambda: first.events("process_restarted"), timeout_s=30,
                                   what="the supervisor to restart a-r0", interval_s=0.1)[0]
            assert (restarted["name"], restarted["incarnation"]) == ("a-r0", 1)
            every_pid.add(restarted["pid"])
            exited = first.events("process_exited")[0]
            assert (exited["name"], exited["returncode"]) == ("a-r0", -signal.SIGKILL)
            wait_until(lambda: first.worker_events("a-r0", 1, "member_online"), timeout_s=45,
                       what="the restarted a-r0 online", interval_s=0.1)
            joined = first.worker_events("a-r0", 1)
            assert any(e["event"] in ("resumed_checkpoint", "bootstrapped") for e in joined)
            # Its neighbours were never touched, and training goes on.
            assert {**first.pids(), **last.pids()} == {**pids, "a-r0": restarted["pid"]}
            assert alive(pids["a-r1"]) and alive(pids["b-r0"])
            assert [e["name"] for e in first.events("process_restarted") + last.events("process_restarted")] == [
                "a-r0"]
            before = {n: first.latest_inner_step(n) for n in ("a-r1",)} | {"b-r0": last.latest_inner_step("b-r0")}
            wait_until(lambda: first.latest_inner_step("a-r1") >= before["a-r1"] + 10
                       and last.latest_inner_step("b-r0") >= before["b-r0"] + 10,
                       timeout_s=60, what="training to go on", interval_s=0.1)

            for launch in launches:
                launch.process.send_signal(signal.SIGTERM)
            for launch in launches:  # leave_grace_s (10) + the margin (5), and then some
                assert launch.process.wait(30) == 0, launch.own_log.read_text()[-3000:]
            for launch in launches:
                stopped = {e["name"]: e["returncode"] for e in launch.events("process_stopped")}
                assert stopped and set(stopped.values()) == {0}, stopped  # every worker left gracefully
                assert launch.events("launch_done")[0]["signal"] == "SIGTERM"
            assert not [pid for pid in every_pid if alive(pid)]
            assert first.worker_events("a-r0", 1, "checkpoint_written")[-1]["reason"] == "leave"
        finally:
            for launch in launches:
                launch.close()
            for pid in every_pid:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_respawn_brings_a_finished_child_back_as_a_new_incarnation(supervise, tmp_path):
    run = supervise(ProcessSpec("spot", python("pass")), ProcessSpec("neighbour", python(SLEEPER)))
    run.until(lambda: run.status("spot").state == "finished", what="spot to finish")
    with pytest.raises(ValueError, match="running"):
        run.supervisor.respawn("neighbour")
    with pytest.raises(KeyError):
        run.supervisor.respawn("nobody")
    run.supervisor.respawn("spot")
    run.until(lambda: run.kinds("spot") == ["started", "exited", "restarted", "exited"],
              what="the respawned incarnation to start and finish")
    status = run.status("spot")
    assert (status.state, status.incarnation, status.restarts) == ("finished", 1, 1)
    assert (tmp_path / "logs" / "spot.1.log").exists()
    run.supervisor.stop(grace_s=2.0)
    with pytest.raises(RuntimeError, match="stopped"):
        run.supervisor.respawn("spot")

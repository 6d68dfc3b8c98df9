"""Every command, random flags and values (hypothesis), run in-process: the exit is 0, 1 (a named
invariant failed) or 2 (one `Error:` line), never a traceback.

Commands that do real work get flags last on the command line that keep it short and small
(simulate: two steps of two replicas of tiny; launch: one worker), and commands that talk to
Redis an address where nothing listens and no wait. `up` and `chaos` start whole clusters of
processes: for them only the command line is parsed (click's own checks and callbacks); the
configuration they would load is the one every other command loads, swept here through
`--set` and `--config`.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noloco_rt.cli import cli, main

PARSE_ONLY = {"up", "chaos"}
ALLOWED_EXITS = {0, 1, 2}
# Fields a user sets most often, plus a few whose values shape everything else.
SET_KEYS = ["outer.h", "outer.alpha", "outer.beta", "pipeline.stages", "pipeline.replicas", "model.preset",
            "model.vocab_size", "model.seq_len", "worker.snapshot_codec", "worker.delta_codec", "run.steps",
            "network.redis_url", "worker.min_bandwidth_mbit_s", "data.source", "data.paths", "run.seed",
            "inner.lr", "worker.memory_budget_gb", "nosuch.field", "outer", ""]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _leaf_commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    found: dict[str, click.Command] = {}

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), (*path, name))
        else:
            found[" ".join(path)] = command

    walk(cli, ())
    return found


COMMANDS = _leaf_commands()
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
NUMBERS = st.sampled_from(["0", "-1", "1", "2", "3", "1e-300", "1e300", "nan", "inf", "-inf", "0.5", "10**9",
                           "99999999999999999999", "007", " 4", "", "x"])


def _paths(root: Path) -> list[str]:
    """Files a user might point a path flag at: missing, a directory, binary, empty, TOML, text."""
    (root / "dir").mkdir(exist_ok=True)
    (root / "binary.bin").write_bytes(b"\xff\xfe\x00garbage\x80")
    (root / "empty.txt").write_bytes(b"")
    (root / "config.toml").write_text("[outer]\nh = 7\n[pipeline]\nstages = 2\n")
    (root / "bad.toml").write_text("[outer\nh = \n")
    (root / "words.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    return [str(root / n) for n in ("missing", "dir", "binary.bin", "empty.txt", "config.toml", "bad.toml",
                                    "words.txt", "new/out")]


PLAUSIBLE_INTS = st.sampled_from(["1", "2", "3", "4", "10"])
PLAUSIBLE_NUMBERS = st.sampled_from(["1", "2", "3", "4", "10", "0.5"])


def _value(param: click.Parameter, paths: list[str], hostile_ok: bool) -> st.SearchStrategy[str]:
    """Two draws in three plausible (so that a case gets past its first flag), one hostile; all
    plausible in a case that is not `hostile_ok`, so that half the cases reach the command's work."""
    plausible, hostile = _plausible_and_hostile(param, paths)
    return st.one_of(plausible, plausible, hostile) if hostile_ok else plausible


def _plausible_and_hostile(param: click.Parameter, paths: list[str]) -> tuple[st.SearchStrategy[str], ...]:
    kind = param.type
    if isinstance(kind, click.Choice):
        plausible, hostile = st.sampled_from([str(c) for c in kind.choices]), TEXT
    elif isinstance(kind, (click.Path, click.File)):
        fitting = ("config.toml",) if param.name == "config_path" else ("config.toml", "words.txt", "new/out")
        plausible = st.sampled_from([p for p in paths if p.endswith(fitting)])
        hostile = st.sampled_from(paths)
    elif isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        plausible = PLAUSIBLE_INTS if isinstance(kind, click.types.IntParamType) else PLAUSIBLE_NUMBERS
        hostile = st.one_of(NUMBERS, st.integers(-10, 10**6).map(str))
    elif param.name == "assignments":
        plausible = st.sampled_from(["outer.h=3", "run.steps=4", "pipeline.replicas=2", "model.preset=tiny"])
        hostile = st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(SET_KEYS),
                                      st.one_of(PLAUSIBLE_NUMBERS, NUMBERS, TEXT)), TEXT)
    elif param.name == "redis_url":
        plausible = st.just("redis://127.0.0.1:1/0")
        hostile = st.sampled_from(["http://x", "rediss://", "", "unix:///nope", "redis://:@:x"])
    else:
        plausible, hostile = st.sampled_from(["a", "tiny", "0", "hello"]), st.one_of(TEXT, NUMBERS, st.sampled_from(paths))
    return plausible, hostile


@st.composite
def command_lines(draw: Any, command: click.Command, paths: list[str]) -> list[str]:
    argv: list[str] = []
    hostile_ok = draw(st.booleans())
    for param in command.params:
        if not param.required and not draw(st.integers(0, 2)):  # a third of the optional flags left out
            continue
        if isinstance(param, click.Argument):
            argv.append(draw(_value(param, paths, hostile_ok)))
        elif param.is_flag:
            argv.append(param.opts[0])
        else:
            argv += [param.opts[-1], draw(_value(param, paths, hostile_ok))]
    if hostile_ok and not draw(st.integers(0, 5)):
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--nosuch", "-x", "--", "extra"])))
    return argv


def _quick_exit_flags(command: click.Command, port: int) -> list[str]:
    """Nothing listens at the Redis address and nobody waits for it; --max-restarts 0 for launch."""
    names = {p.name for p in command.params}
    flags: list[str] = []
    if "redis_url" in names:
        flags += ["--redis-url", f"redis://127.0.0.1:{port}/0"]
    if "redis_wait" in names or "redis_wait_s" in names:
        flags += ["--redis-wait", "0"]
    if "assignments" in names:
        flags += ["--set", "worker.redis_wait_s=0"]
    if "max_restarts" in names:
        flags += ["--max-restarts", "0"]
    return flags + SMALL_WORK.get(command.name or "", [])


SMALL_WORK = {"simulate": ["--steps", "2", "--eval-every", "1", "--replicas", "2", "--preset", "tiny",
                           "--set", "run.eval_batches=1"],
              "launch": ["--nproc", "1"]}
"""Flags that bound what a command that trains does (a random --replicas would ask for 10^6 models)."""


def run_case(name: str, argv: list[str], port: int) -> tuple[int | str, str]:
    """(exit code, or "parsed" for a command only parsed; what it printed to stderr)."""
    command = COMMANDS[name]
    words = name.split()
    if words[0] in PARSE_ONLY:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                command.make_context(name, list(argv))
        except click.exceptions.Exit as exc:
            return exc.exit_code, err.getvalue()
        except click.ClickException as exc:
            return exc.exit_code, exc.format_message()
        return "parsed", ""
    full = [*words, *argv, *_quick_exit_flags(command, port)]
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(full)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code, err.getvalue()
    return 0, err.getvalue()


pytestmark = pytest.mark.timeout(300)
CASES_PER_COMMAND = 16


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sweep")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_random_input_without_a_traceback(name, sweep_dir, monkeypatch):
    monkeypatch.chdir(sweep_dir)  # relative outputs (runs/, default --out) land here
    for key in [k for k in os.environ if k.startswith("NOLOCO_")]:
        monkeypatch.delenv(key)
    paths = _paths(sweep_dir)
    port = _closed_port()
    outcomes: Counter[str] = Counter()

    @settings(max_examples=CASES_PER_COMMAND, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(argv=command_lines(COMMANDS[name], paths))
    def check(argv: list[str]) -> None:
        code, err = run_case(name, argv, port)
        outcomes[str(code)] += 1
        assert code == "parsed" or code in ALLOWED_EXITS, (name, argv, code, err[-2000:])
        assert "Traceback" not in err, (name, argv, err[-2000:])
        if code == 2 and name.split()[0] not in PARSE_ONLY:
            assert any(line.startswith("Error:") for line in err.splitlines()), (name, argv, err[-2000:])

    check()
    print(f"noloco-rt {name}: {sum(outcomes.values())} command lines, exits {dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) >= CASES_PER_COMMAND // 2, outcomes

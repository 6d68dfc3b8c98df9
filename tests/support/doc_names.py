"""The checks that every code name, command, option and config key a page mentions exists (README, benchmarks/README.md)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from functools import cache
from pathlib import Path

import click

from noloco_rt.cli import COMMANDS, cli
from noloco_rt.config import SECTIONS
from tests.support.paths import REPO

README = REPO / "README.md"


MAX_README_BYTES = 25_000


PACKAGES = ("noloco_rt", "workers", "coordinator", "benchmarks", "tests", "examples")
"""Where code names are looked up."""


REPO_ROOTS = (*PACKAGES, "docs", "configs", "k8s", ".ci")
"""A path under one of these must exist; others (runs/up/, OUT/tb, keys/) are a run's output."""


FILE_SUFFIXES = {"bin", "json", "jsonl", "md", "png", "pt", "py", "safetensors", "secret", "public", "toml", "txt",
                 "yaml", "log", "out"}


@cache
def _commands() -> dict[tuple[str, ...], click.Command]:
    """Every command of the CLI by its path of names: () is the root, ("config", "show") a leaf."""
    found: dict[tuple[str, ...], click.Command] = {}

    def walk(path: tuple[str, ...], command: click.Command) -> None:
        found[path] = command
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                walk((*path, name), command.get_command(ctx, name))

    walk((), cli)
    return found


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help", "-h"}


@cache
def _identifiers() -> frozenset[str]:
    words: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name.endswith("readme_names.py"):  # these tests' stale examples are no evidence
                continue
            words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(errors="replace")))
    return frozenset(words)


def config_key_problem(key: str) -> str | None:
    section, _, name = key.partition(".")
    if section not in SECTIONS:
        return f"no config section [{section}]"
    if name not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
        return f"no config field {key}"
    return None


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _option_problems(line: str, words: list[str], options: set[str], owner: str) -> list[str]:
    """Each --option among words must be one of options; each `--set KEY=VALUE` a config key."""
    problems = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            name = word.split("=")[0]
            if name not in options:
                problems.append(f"{line!r}: {owner} has no option {name}")
            if name == "--set" and i + 1 < len(words) and "=" in words[i + 1]:
                if (why := config_key_problem(words[i + 1].split("=")[0])) is not None:
                    problems.append(f"{line!r}: {why}")
    return problems


def _command_problems(line: str) -> list[str]:
    """`noloco-rt CMD [SUB] --opt ...`: the command path and each option must exist."""
    words = _words(line)[1:]  # noloco-rt
    commands = _commands()
    path: tuple[str, ...] = ()
    while words and not words[0].startswith("-") and isinstance(commands[path], click.Group):
        if (*path, words[0]) not in commands:
            return [f"{line!r}: no command {' '.join(['noloco-rt', *path, words[0]])}"]
        path = (*path, words.pop(0))
    return _option_problems(line, words, _options(commands[path]), " ".join(["noloco-rt", *path]))


def _python_name_problem(dotted: str) -> str | None:
    """noloco_rt.outer.correction, workers.outer.step.OuterStep: a module, then names it defines."""
    parts = dotted.split(".")
    module = REPO / parts[0]
    rest = parts[1:]
    source = ""
    while rest:
        if (module / rest[0]).is_dir():
            module = module / rest.pop(0)
        elif (module / f"{rest[0]}.py").is_file():
            module = module / f"{rest.pop(0)}.py"
            source = module.read_text()
            break
        else:
            return f"no module {dotted}" if not source else None
    for name in rest:
        if not re.search(rf"^\s*(def|class)\s+{name}\b|^\s*{name}\s*[:=]", source, re.MULTILINE):
            return f"{module.relative_to(REPO)} defines no {name} ({dotted})"
    return None


def _identifier_problem(name: str) -> str | None:
    """A code name (snake_case, SCREAMING_CASE, CamelCase) must appear in the sources. Prometheus
    adds _total to a counter's name."""
    if name in _identifiers() or name.removesuffix("_total") in _identifiers():
        return None
    return f"{name} appears nowhere in {', '.join(PACKAGES)}"


def _looks_like_code(name: str) -> bool:
    return "_" in name.strip("_") or re.search(r"[a-z][A-Z]", name) is not None


def span_problems(span: str, other_options: frozenset[str] = frozenset()) -> list[str]:
    """What is wrong with one code span of the README (empty: fine, or not a name we check).
    A lone --option may be one of the CLI's or one of other_options."""
    text = " ".join(span.split()).removeprefix("$ ").removeprefix(".venv/bin/")
    first = text.split(" ")[0]
    if first == "noloco-rt":
        return _command_problems(text)
    if first in COMMANDS and " --" in text:  # `launch --metrics-port-base`
        return _command_problems(f"noloco-rt {text}")
    if first == "make" and len(text.split()) > 1:
        target = text.split()[1]
        if "=" not in target and not re.search(rf"^{re.escape(target)}:", (REPO / "Makefile").read_text(), re.M):
            return [f"{text!r}: the Makefile has no target {target}"]
        return []
    if text.startswith("--") and not text.startswith("--tensorboard needs"):
        known = set().union(*(_options(c) for c in _commands().values()), other_options)
        return _option_problems(text, _words(text), known, "no command")
    if re.fullmatch(r"NOLOCO_[A-Z0-9_]+(=\S*)?", text):
        variable = text.split("=")[0]
        for section, cls in SECTIONS.items():
            prefix = f"NOLOCO_{section.upper()}_"
            if variable.startswith(prefix):
                field = variable.removeprefix(prefix).lower()
                if field in {f.name for f in dataclasses.fields(cls)}:
                    return []
                return [f"{variable}: no config field {section}.{field}"]
        return [why] if (why := _identifier_problem(variable)) else []
    if match := re.fullmatch(r"([a-z_]+)\.([a-z_0-9]+)(?: ?=.*)?", text):
        section, name = match.groups()
        if section in SECTIONS and name not in FILE_SUFFIXES:
            return [why] if (why := config_key_problem(f"{section}.{name}")) else []
    if re.fullmatch(r"[\w.\-/]+", text) and "/" in text:
        if text.split("/")[0] in REPO_ROOTS and not (REPO / text).exists():
            return [f"no file {text}"]
        return []
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text) and text.split(".")[-1] not in FILE_SUFFIXES:
        if text.split(".")[0] in PACKAGES:
            return [why] if (why := _python_name_problem(text)) else []
        return [why for part in text.split(".") if _looks_like_code(part) and (why := _identifier_problem(part))]
    if re.fullmatch(r"[A-Za-z_]\w*", text) and _looks_like_code(text):
        return [why] if (why := _identifier_problem(text)) else []
    return []


def code_block_commands(text: str) -> list[str]:
    """Every command of a page's indented code blocks, its continuation lines (after a
    trailing backslash) joined into one."""
    lines = text.splitlines()
    commands = []
    for i, line in enumerate(lines):
        if line.startswith("    ") and line.strip() and not (i and lines[i - 1].rstrip().endswith("\\")):
            command = line.strip()
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            commands.append(command)
    return commands


def readme_names(page: Path = README) -> list[str]:
    """Code spans (which may wrap a line), and the noloco-rt command lines of its code blocks."""
    text = page.read_text()
    commands = (command.removeprefix("$ ").removeprefix(".venv/bin/") for command in code_block_commands(text))
    return re.findall(r"`([^`]+)`", text) + [command for command in commands if command.startswith("noloco-rt ")]


@cache
def program_text() -> str:
    return "\n".join(" ".join(path.read_text().split()) for package in ("noloco_rt", "workers", "coordinator")
                     for path in (REPO / package).rglob("*.py"))


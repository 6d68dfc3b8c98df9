"""benchmarks/README.md names only what exists, checked as README.md is (tests/docs/test_readme_names.py)
and, beyond that, every benchmark it runs: the module or script, each option given it (defined
in that benchmark's source or a benchmarks module it imports), the config keys of --set and
--variant, a recipe's file, a make target and the options a Makefile variable passes on. Its
links land, and it stays a reference of what is true now, under 40 KB."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from tests.support.doc_names import (
    REPO,
    code_block_commands,
    config_key_problem,
    readme_names,
    span_problems,
)
from tests.support.doc_pages import heading_anchors

PAGE = REPO / "benchmarks" / "README.md"
MAKEFILE = REPO / "Makefile"
MAX_PAGE_BYTES = 40_000
PYTHONS = {"python", "python3", ".venv/bin/python", "$(BIN)/python"}


# -- what exists ---------------------------------------------------------------------------------

def _module_file(dotted: str) -> Path | None:
    """benchmarks.sync.measure -> benchmarks/sync/measure.py; a package runs its __main__.py."""
    path = REPO.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _benchmark_options(script: Path) -> frozenset[str]:
    """The --options a benchmark defines: quoted in its source or in a benchmarks module it imports."""
    options = {"--help", "-h"}  # argparse's own
    todo, seen = [script], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        source = path.read_text()
        options |= set(re.findall(r"[\"'](--[a-z][\w-]*)[\"']", source))
        for package, names in re.findall(r"^\s*from (benchmarks(?:\.\w+)*) import \(?([\w, ]+)", source, re.M):
            found = _module_file(package)
            todo += [found] if found and found.name != "__init__.py" else []
            todo += [f for name in names.split(",") if (f := _module_file(f"{package}.{name.split()[0]}"))]
    return frozenset(options)


@cache
def _all_benchmark_options() -> frozenset[str]:
    return frozenset().union(*(_benchmark_options(path) for path in (REPO / "benchmarks").rglob("*.py")))


@cache
def _makefile() -> str:
    return MAKEFILE.read_text()


# -- one command ---------------------------------------------------------------------------------

def _value_problems(option: str, value: str) -> list[str]:
    """--set KEY=VALUE, --variant NAME:KEY=VALUE,..., --recipe NAME=FILE."""
    if option == "--set" and "=" in value:
        keys = [value.split("=")[0]]
    elif option == "--variant" and ":" in value:
        keys = [a.split("=")[0] for a in value.split(":", 1)[1].split(",") if "=" in a and "…" not in a]
    elif option == "--recipe" and "=" in value:
        path = value.split("=", 1)[1]
        return [f"--recipe {value}: no file {path}"] if path and not (REPO / path).is_file() else []
    else:
        return []
    return [why for key in keys if (why := config_key_problem(key))]


def _options_problems(words: list[str], defined: frozenset[str], owner: str) -> list[str]:
    problems = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            option = word.split("=")[0]
            if option not in defined:
                problems.append(f"{owner} has no option {option}")
            elif i + 1 < len(words):
                problems += _value_problems(option, words[i + 1])
    return problems


def benchmark_command_problems(line: str) -> list[str] | None:
    """What is wrong with a command line that runs a benchmark, a test or make (None: not one)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
        words.pop(0)  # sudo, PYTHONPATH=., OMP_NUM_THREADS=1
    if len(words) > 1 and words[0] == "make":
        return _make_problems(words[1:])
    if len(words) < 2 or words[0] not in PYTHONS:
        return None
    if words[1] == "-m" and len(words) > 2 and words[2] == "pytest":
        return [f"no file {w}" for w in words[3:] if w.startswith("tests/") and not (REPO / w).exists()]
    if words[1] == "-m" and len(words) > 2 and words[2].startswith("benchmarks."):
        script, rest = _module_file(words[2]), words[3:]
        name = words[2]
    elif words[1].startswith("benchmarks/") and words[1].endswith(".py"):
        script, rest, name = (REPO / words[1] if (REPO / words[1]).is_file() else None), words[2:], words[1]
    else:
        return None
    if script is None:
        return [f"{line!r}: no benchmark {name}"]
    return [f"{line!r}: {why}" for why in _options_problems(rest, _benchmark_options(script), name)]


def _make_problems(words: list[str]) -> list[str]:
    """make TARGET [VAR=VALUE ...]: the target exists; a variable's options are those of the
    benchmark its recipe passes them to (`-m benchmarks.gpu_check ... $(GPU_CHECK_ARGS)`)."""
    target, assignments = words[0], words[1:]
    if not re.search(rf"^{re.escape(target)}:", _makefile(), re.M):
        return [f"the Makefile has no target {target}"]
    problems = []
    for assignment in assignments:
        variable, _, value = assignment.partition("=")
        if f"$({variable})" not in _makefile():
            problems.append(f"the Makefile uses no variable {variable}")
            continue
        recipe = re.search(rf"-m (benchmarks\.[\w.]+)[^\n]*\$\({variable}\)", _makefile())
        if recipe and value.startswith("-"):
            script = _module_file(recipe.group(1))
            assert script is not None, recipe.group(1)
            problems += _options_problems(shlex.split(value), _benchmark_options(script), recipe.group(1))
    return problems


def page_problems(name: str) -> list[str]:
    """One code span or command line of the page."""
    text = " ".join(name.split())
    if (problems := benchmark_command_problems(text)) is not None:
        return problems
    if re.fullmatch(r"[A-Z][A-Z0-9_]*(=\S*)?", text) and f"$({text.split('=')[0]})" in _makefile():
        return []  # GPU_CHECK_ARGS: a Makefile variable
    if re.fullmatch(r"[\w./\-{},*]+", text) and ("*" in text or "{" in text) and text.startswith("benchmarks/"):
        stems = [text]
        while any("{" in s for s in stems):  # scaling_{4,16,32}x2.*
            s = next(s for s in stems if "{" in s)
            head, body, tail = re.match(r"(.*?)\{([^}]*)\}(.*)", s).groups()
            stems = [t for t in stems if t != s] + [head + part + tail for part in body.split(",")]
        return [f"nothing matches {stem}" for stem in stems if not list(REPO.glob(stem))]
    return span_problems(text, _all_benchmark_options())


def page_names() -> list[str]:
    """Code spans and noloco-rt commands (as README.md's), and every command of the page's code blocks."""
    return readme_names(PAGE) + code_block_commands(PAGE.read_text())


# -- the page ------------------------------------------------------------------------------------

def test_every_name_the_benchmarks_page_mentions_exists():
    names = page_names()
    assert len(names) > 60, "the page's code spans and commands were not found"
    problems = [problem for name in names for problem in page_problems(name)]
    assert not problems, "benchmarks/README.md names what does not exist:\n" + "\n".join(problems)


def test_every_benchmark_command_of_the_page_is_checked():
    """Each code-block line is a command this test understands, so none escapes the check."""
    unchecked = [c for c in code_block_commands(PAGE.read_text())
                 if benchmark_command_problems(c) is None and not c.startswith("noloco-rt ")]
    assert not unchecked, f"commands the check does not parse: {unchecked}"


def test_the_benchmarks_page_links_land():
    text = PAGE.read_text()
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
        path = PAGE.parent / target if target else PAGE
        assert path.exists(), f"benchmarks/README.md links to missing {target}"
        if anchor:
            assert anchor in heading_anchors(path.read_text()), f"benchmarks/README.md links to missing #{anchor}"


def test_the_benchmarks_page_is_a_reference_not_a_history():
    size = len(PAGE.read_bytes())
    assert size < MAX_PAGE_BYTES, (f"benchmarks/README.md is {size:,} bytes (limit {MAX_PAGE_BYTES:,}): keep each "
                                   f"section's current figures, command and date; git keeps the history")


@pytest.mark.parametrize("stale", [
    ".venv/bin/python -m benchmarks.no_such_bench --out OUT",
    "PYTHONPATH=. .venv/bin/python benchmarks/no_such_bench.py",
    ".venv/bin/python -m benchmarks.ablation --no-such-flag 1",
    ".venv/bin/python -m benchmarks.ablation --variant 'x:outer.no_such=1'",
    ".venv/bin/python -m benchmarks.convergence --set outer.no_such=1",
    ".venv/bin/python -m benchmarks.convergence --recipe x=configs/no_such.toml",
    "sudo .venv/bin/python -m benchmarks.sync.measure --no-such-flag",
    "make gpu-check GPU_CHECK_ARGS='--no-such-flag 1'",
    "make no-such-target",
    ".venv/bin/python -m pytest tests/test_no_such.py",
    "benchmarks/results/paper/no_such_{4,8}x2.*",
    "--no-such-option",
])
def test_the_check_catches_a_stale_benchmark_name(stale):
    assert page_problems(stale), f"{stale!r} passed the check"


@pytest.mark.parametrize("good", [
    ".venv/bin/python -m benchmarks.membership --out benchmarks/results/membership.md",
    "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.stage_extinction --seeds 0 1 2",
    ".venv/bin/python -m benchmarks.convergence --out OUT --steps 600 --recipe paper=configs/paper.toml",
    ".venv/bin/python -m benchmarks.ablation --out OUT --variant 'int8:worker.snapshot_codec=int8-zstd'",
    "make gpu-check GPU_PYTHON=python3 GPU_CHECK_ARGS='--presets small --shapes 2x2'",
    "benchmarks/results/paper/scaling_{4,16,32}x2.*", "--presets", "GPU_CHECK_ARGS",
])
def test_the_check_passes_a_benchmark_name_that_exists(good):
    assert not page_problems(good)

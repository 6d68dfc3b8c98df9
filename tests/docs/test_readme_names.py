"""The README names only what exists: every command and option (checked against the real
click tree), config key and NOLOCO_* variable (against the config's dataclasses), make
target, repository path, Python module or attribute, and code identifier (against the
sources) it mentions in a code span or a command line; and it stays a short guide."""

from __future__ import annotations

import re

import pytest

from tests.support.doc_names import (
    MAX_README_BYTES,
    README,
    program_text,
    readme_names,
    span_problems,
)

# -- what exists ---------------------------------------------------------------------------------









# -- one name ------------------------------------------------------------------------------------















# -- the README ----------------------------------------------------------------------------------





def test_every_name_the_readme_mentions_exists():
    names = readme_names()
    assert len(names) > 150, "the README's code spans were not found"
    problems = [problem for name in names for problem in span_problems(name)]
    assert not problems, "README.md names what does not exist:\n" + "\n".join(problems)




def test_the_troubleshooting_messages_are_the_programs_own():
    """Each message the Troubleshooting section quotes (a code span of three words or more in
    bold) shares at least four words in a row with the sources, so a reworded message does
    not leave a stale quote (event names are checked as code names above)."""
    text = README.read_text()
    section = text[text.index("## Troubleshooting"):text.index("\n## ", text.index("## Troubleshooting") + 1)]
    spans = [span for bold in re.findall(r"\*\*(.+?)\*\*", section, re.DOTALL)
             for span in re.findall(r"`([^`]+)`", bold)]
    messages = [" ".join(span.split()) for span in spans if len(span.split()) >= 3]
    assert len(messages) >= 8
    for message in messages:
        words = message.removeprefix("Error: ").split(" ")
        windows = {" ".join(words[i:i + 4]) for i in range(max(len(words) - 3, 1))}
        assert any(window in program_text() for window in windows), f"no source says {message!r}"


def test_the_readme_is_a_short_guide():
    size = len(README.read_bytes())
    assert size < MAX_README_BYTES, (f"README.md is {size:,} bytes (limit {MAX_README_BYTES:,}): move detail to "
                                     f"docs/ or benchmarks/README.md")


@pytest.mark.parametrize("stale", [
    "exchange_with_peer", "publish_contribution", "SERVER_WAIT_FOR_OWN_STEP_S",
    "workers.exchange.exchange_with_peer", "SnapshotService.publish_contribution",
    "noloco_rt.outer.correction.no_such_function", "noloco_rt/no_such_module.py",
    "noloco-rt worker --no-such-flag", "noloco-rt no-such-command", "noloco-rt config no-such",
    "launch --data-port-bass", "--no-such-option", "noloco-rt up --set outer.no_such=1",
    "outer.no_such", "outer.no_such = 1", "NOLOCO_OUTER_NO_SUCH", "make no-such-target",
])
def test_the_check_catches_a_stale_name(stale):
    assert span_problems(stale), f"{stale!r} passed the check"


@pytest.mark.parametrize("good", [
    "noloco-rt launch --stage 0 --nproc 8 --set network.bind_host=0.0.0.0", "launch --metrics-port-base", "launch --data-port-base",
    "noloco-rt config reference", "noloco-rt keys generate --out keys/", "--init-from",
    "worker.fault_slowdown", 'outer.pairing = "matched"', "NOLOCO_NETWORK_CURVE_KEY_DIR", "NOLOCO_OUTER_ALPHA=0.4",
    "noloco_rt.outer.correction", "workers.outer.step.OuterStep", "noloco_rt/outer/correction.py",
    "noloco_outer_steps_total", "outer_step_done", "LOCAL_RANK", "make up", "model.safetensors", "runs/up/",
])
def test_the_check_passes_a_name_that_exists(good):
    assert not span_problems(good)

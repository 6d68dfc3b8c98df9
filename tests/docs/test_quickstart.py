"""The Quickstart as a fresh machine meets it: exactly two commands, CI runs the second, and
the first (`make up`) trains a shape in which NoLoCo's replicas actually differ."""

from __future__ import annotations

import re
import shlex

from noloco_rt.config import load_config, parse_assignment
from noloco_rt.outer.matching import partition
from tests.support.paths import REPO


def _quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Quickstart"):]
    first_block = re.search(r"\n\n((?:    \S.*\n)+)", section).group(1)
    return [line.split("#")[0].strip() for line in first_block.splitlines()]


def test_the_quickstart_is_two_commands_and_ci_runs_the_tests():
    assert _quickstart_commands() == ["make up", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def _make_up_config():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^up: .*\n\trm -rf runs/up\n\t\$\(BIN\)/noloco-rt up --out runs/up \$\(UP_ARGS\)$",
                     makefile, re.MULTILINE), "make up no longer runs `noloco-rt up ... $(UP_ARGS)`"
    args = shlex.split(re.search(r"^UP_ARGS \?= (.*)$", makefile, re.MULTILINE).group(1))
    flags = {"--replicas": "pipeline.replicas", "--steps": "run.steps", "--stages": "pipeline.stages"}
    overrides = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        overrides.append(parse_assignment(value if flag == "--set" else f"{flags[flag]}={value}"))
    return load_config(environ={}, overrides=overrides)


def test_make_up_pairs_replicas_differently_at_every_outer_step():
    cfg = _make_up_config()
    members = [f"worker-{r}" for r in range(cfg.pipeline.replicas)]
    partitions = [partition(members, seed=cfg.run.seed, stage=0, outer_step=k, group_size=cfg.outer.group_size)
                  for k in range(cfg.run.steps // cfg.outer.resolved().h)]
    # Two or more groups: no step averages the whole stage (which would keep the spread at 0) ...
    assert all(len(groups) >= 2 for groups in partitions), partitions[0]
    # ... and the groups are redrawn, so information still spreads across the stage.
    assert len({tuple(map(tuple, groups)) for groups in partitions}) > 1
    assert len(partitions) >= 10, "too few outer steps for the spread to follow the learning rate"

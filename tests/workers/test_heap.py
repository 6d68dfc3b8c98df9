"""A process's start-up heap is left out of the cyclic collector (noloco_rt/process/heap.py):
once frozen, a full collection walks what is new, not the ~300,000 objects torch brings, and
every noloco-rt process freezes before the interpreter tears down."""

from __future__ import annotations

import gc
import subprocess
import sys
import tomllib
import weakref
from pathlib import Path

import pytest

from noloco_rt import cli
from noloco_rt.process.heap import settle_heap

REPO_ROOT = Path(__file__).resolve().parents[2]

CHILD_COUNTING_TRACKED_OBJECTS = """
import gc
import torch
from noloco_rt.process.heap import settle_heap

before = len(gc.get_objects())
settle_heap()
print(before, len(gc.get_objects()), gc.get_freeze_count())
"""


def test_after_settling_a_full_collection_walks_only_what_is_new():
    child = subprocess.run([sys.executable, "-c", CHILD_COUNTING_TRACKED_OBJECTS], capture_output=True,
                           text=True, timeout=120, check=True)
    before, after, frozen = (int(word) for word in child.stdout.split())
    assert before > 100_000, f"torch alone should bring far more tracked objects than {before}"
    assert frozen > before * 0.9, f"only {frozen} of {before} objects were frozen"
    assert after < before // 100, f"{after} of {before} objects are still walked by every full collection"


def test_settling_collects_start_up_garbage_before_freezing_what_is_left():
    class Node:
        pass

    gc.disable()  # only settle_heap's own collection may free the cycle
    try:
        node = Node()
        node.itself = node
        freed = weakref.ref(node)
        del node
        settle_heap()
        assert freed() is None, "a garbage cycle from start-up was frozen for the process's life"
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this is pytest's own process: give its heap back to the collector
        gc.enable()


@pytest.mark.parametrize("argv", [["--help"], ["eval"]], ids=["exit-0", "usage-error"])
def test_the_entry_point_freezes_the_heap_before_the_process_exits(monkeypatch, argv):
    frozen_before = gc.get_freeze_count()
    monkeypatch.setattr(sys, "argv", ["noloco-rt", *argv])
    try:
        with pytest.raises(SystemExit):
            cli.entry_point()
        assert gc.get_freeze_count() > frozen_before
    finally:
        gc.unfreeze()  # this is pytest's own process: give its heap back to the collector


def test_the_installed_script_and_python_dash_m_both_go_through_the_entry_point():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["noloco-rt"] == "noloco_rt.cli:entry_point"
    source = (REPO_ROOT / "noloco_rt" / "cli.py").read_text()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    entry_point()')

"""Shared test set-up: hypothesis without wall-clock deadlines (CI has 2 busy cores), local
clusters' workers forked from a preloaded process (workers/supervise/preloaded.py), and a
session check that no child process outlives the suite."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from workers.cluster.local_cluster import LocalCluster
from workers.supervise.preloaded import stop_server

settings.register_profile("noloco", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("noloco")


def _children() -> set[int]:
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as handle:
            return {int(pid) for pid in handle.read().split()}
    except OSError:
        return set()


@pytest.fixture(autouse=True, scope="session")
def no_leftover_children():
    before = _children()
    LocalCluster.forked_workers = True
    yield
    forked = stop_server()
    leftover = _children() - before
    assert not leftover and not forked, f"child processes outlived the test session: {sorted(leftover | set(forked))}"

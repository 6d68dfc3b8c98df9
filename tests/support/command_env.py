"""The environment a test gives a `noloco-rt` child process: this machine's, without any
NOLOCO_* setting of the developer's (the child must run the test's configuration), and one
torch thread (children share the machine's cores with the suite)."""

from __future__ import annotations

import os


def settings_free_env(**extra: str) -> dict[str, str]:
    """This machine's environment without the developer's NOLOCO_* settings, and `extra`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NOLOCO_")} | extra


def command_env(**extra: str) -> dict[str, str]:
    return settings_free_env(**{"OMP_NUM_THREADS": "1", **extra})

"""`noloco-rt COMMAND --help` imports no torch: help is read in a fraction of a second, and the
commands that need torch import it in their body."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from noloco_rt.cli import COMMANDS

PROBE = textwrap.dedent("""
    import sys
    from noloco_rt.cli import cli
    cli.main(args=[sys.argv[1], "--help"], prog_name="noloco-rt", standalone_mode=False)
    assert "torch" not in sys.modules, f"{sys.argv[1]} --help imported torch"
    print("no torch")
""")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_does_not_import_torch(command):
    result = subprocess.run([sys.executable, "-c", PROBE, command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"Usage: noloco-rt {command}" in result.stdout
    assert result.stdout.rstrip().endswith("no torch")


def test_the_up_command_still_knows_its_options():
    """The imports moved into its body: the command object itself is whole."""
    from workers.cluster.up import up

    names = {param.name for param in up.params}
    assert {"stages", "replicas", "steps", "out_dir", "redis_url", "init_from", "config_path"} <= names

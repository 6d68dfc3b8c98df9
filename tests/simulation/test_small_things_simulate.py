"""`noloco-rt simulate --help` names the routing the simulator really uses by default."""

from __future__ import annotations

from click.testing import CliRunner

from noloco_rt.cli import cli
from noloco_rt.config import SIMULATION_ROUTINGS, RoutingConfig, load_config


def test_help_names_the_default_simulator_routing_from_the_config():
    default = RoutingConfig().simulation
    assert load_config(environ={}).routing.simulation == default  # what a run without settings uses
    result = CliRunner().invoke(cli, ["simulate", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # click wraps lines
    assert f"routing.simulation says (default {default};" in text
    assert "random routing" not in text
    others = [name for name in SIMULATION_ROUTINGS if name != default]
    assert others and all(name.split("-")[0] in text for name in others)

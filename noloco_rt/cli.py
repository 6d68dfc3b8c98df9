"""The `noloco-rt` command line root.

Subcommands are registered by import path and loaded only when invoked, so
`noloco-rt --help` stays fast and the library never imports workers/ or
coordinator/ (their commands live there and register here by name).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import click

# name -> (module:attribute, one-line help). Listing help needs no import.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("noloco_rt.commands.config:config", "Show the effective configuration."),
    "simulate": ("noloco_rt.commands.simulate:simulate",
                 "Train R replicas × S stages in one process (the algorithm without the network)."),
    "worker": ("workers.cli:worker", "Run one stage worker (joins through Redis, trains with live peers)."),
    "launch": ("workers.supervise.launch:launch", "Supervise N local workers of one stage (bare metal)."),
    "status": ("noloco_rt.commands.status:status", "Print live workers per stage from the membership table."),
    "eval": ("noloco_rt.commands.eval:eval_command",
             "Validation loss of a consensus checkpoint vs. untrained."),
    "consensus": ("noloco_rt.commands.consensus:consensus",
                  "Average the workers' checkpoints of a run (gathered from its machines, or its store) into one model."),
    "sample": ("noloco_rt.commands.sample:sample", "Continue a prompt with a consensus checkpoint."),
    "export": ("noloco_rt.commands.export:export",
               "Write a consensus checkpoint as a Hugging Face Llama folder (config.json, model.safetensors)."),
    "coordinator": ("coordinator.cli:coordinator",
                    "Observe a run: evaluate, measure replica spread, export a consensus checkpoint."),
    "keys": ("noloco_rt.commands.keys:keys", "Generate the CURVE key pair that authenticates a run's sockets."),
    "up": ("workers.cluster.up:up", "Run a whole training on this machine: Redis, coordinator and S × R workers."),
    "chaos": ("workers.cluster.chaos:chaos", "Train a local cluster under injected faults and check the invariants."),
    "prepare": ("noloco_rt.commands.prepare:prepare",
                "Tokenize text files or JSONL into train/val token shards (resumable)."),
    "plan": ("noloco_rt.commands.plan:plan_command",
             "Memory of each stage's worker (weights, optimizer, activations in flight, peak); --fit-gb finds stages."),
    "k8s": ("noloco_rt.commands.k8s:k8s", "Render Kubernetes manifests for S stages × R replicas (docs/deploy.md)."),
}


class OneLineError(click.ClickException):
    """A user's mistake found by a command (a file, a path, a missing package): printed as one
    `Error:` line with exit code 2, like a bad flag, never a traceback or usage text."""

    exit_code = 2


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy_commands: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands:
            target, _ = self.lazy_commands[cmd_name]
            module_name, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{target} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.lazy_commands[name][1]) for name in sorted(self.lazy_commands)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="noloco-rt")
def cli() -> None:
    """noloco-rt: elastic NoLoCo training over slow, unreliable networks."""


def _user_errors() -> tuple[type[Exception], ...]:
    # Imported here so that `--help` does not pay for numpy/torch.
    from noloco_rt.config import ConfigError

    errors: list[type[Exception]] = [ConfigError]
    if "noloco_rt.data" in sys.modules:
        errors.append(sys.modules["noloco_rt.data"].DataError)
    return tuple(errors)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user mistakes print one line and exit 2, never a traceback."""
    try:
        cli.main(args=argv, prog_name="noloco-rt", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:  # only user errors are turned into messages; the rest re-raise
        if isinstance(exc, _user_errors()):
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)
        raise
    sys.exit(0)


def entry_point() -> None:
    """A process's entry (the noloco-rt script, python -m noloco_rt.cli): main(), with the heap
    frozen before the interpreter tears down (noloco_rt.process.heap: ~1 s of a core less at
    every exit). Tests call main() in their own process instead."""
    from noloco_rt.process.heap import freeze_for_exit

    try:
        main()
    finally:
        freeze_for_exit()


def config_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--config FILE and --set SECTION.FIELD=VALUE, shared by every command that reads the config."""
    func = click.option("--set", "assignments", multiple=True, metavar="SECTION.FIELD=VALUE",
                        help="Override one config field (repeatable), e.g. --set outer.alpha=0.4.")(func)
    func = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                        help="TOML config file (then NOLOCO_* variables, then flags).")(func)
    return func


if __name__ == "__main__":
    entry_point()

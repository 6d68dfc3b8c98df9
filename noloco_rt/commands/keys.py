"""`noloco-rt keys generate`: the run's CURVE key pair (noloco_rt.net.curve explains the scheme)."""

from __future__ import annotations

from pathlib import Path

import click

from noloco_rt.cli import OneLineError


@click.group()
def keys() -> None:
    """CURVE keys that authenticate the ZeroMQ sockets of a run."""


def usage_text(public_path: Path, secret_path: Path, name: str) -> str:
    folder = public_path.parent.resolve()
    return "\n".join([
        f"wrote {public_path} and {secret_path} (both 0600). Every process of the run needs both: "
        "whoever holds the secret is a trusted member of the run.",
        "",
        "Config file (worker, launch, up, coordinator):",
        "  [network]",
        f'  curve_key_dir = "{folder}"',
        "or the environment (one of):",
        f"  export NOLOCO_NETWORK_CURVE_KEY_DIR={folder}",
        f'  export NOLOCO_NETWORK_CURVE_SECRET_KEY="$(cat {secret_path.resolve()})"',
        "or flags: --set network.curve_key_dir=" + str(folder),
        "Kubernetes (mount the Secret and set NOLOCO_NETWORK_CURVE_KEY_DIR to the mount path):",
        f"  kubectl -n noloco create secret generic noloco-curve --from-file={name}.secret={secret_path.resolve()} "
        f"--from-file={name}.public={public_path.resolve()}",
    ])


@keys.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Folder for <name>.public and <name>.secret (created if missing).")
@click.option("--name", default="cluster", show_default=True, help="File name stem of the pair.")
@click.option("--force", is_flag=True, help="Replace an existing pair of that name.")
def generate(out_dir: str, name: str, force: bool) -> None:
    """Write a fresh key pair for a run; refuses to overwrite without --force."""
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise click.BadParameter("letters, digits, '-', '_' and '.' only", param_hint="--name")
    from noloco_rt.net.curve import write_key_pair

    try:
        public_path, secret_path = write_key_pair(Path(out_dir), name, force=force)
    except FileExistsError as exc:
        raise OneLineError(str(exc)) from None
    click.echo(usage_text(public_path, secret_path, name))

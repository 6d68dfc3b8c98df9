"""docs/deploy.md's walk from image to model: every step says whether it is tested, the tested
ones run here as written (prepare, render, keys, export), and what the untested kubectl lines
name (objects, labels, paths, the scaling patch) exists in what render writes."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from noloco_rt.config import load_config
from noloco_rt.deploy import k8s_render
from tests.support.in_process import run_cli_in_process
from tests.support.k8s_rules import job_api_errors
from tests.support.paths import REPO

ROOT = REPO
DOC = ROOT / "docs" / "deploy.md"
REGISTRY = "registry.example.com/me"
TESTED, NOT_RUN = "(tested", "(not run by the tests"


def _section(title: str) -> list[str]:
    lines = DOC.read_text().splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "### "))), len(lines))
    return lines[start + 1:end]


def walkthrough() -> list[tuple[str, list[str]]]:
    """(the step's prose, its command lines) for each code block of the walkthrough."""
    blocks: list[tuple[str, list[str]]] = []
    prose: list[str] = []
    code: list[str] = []
    for line in [*_section("### From image to model"), ""]:
        if line.startswith("    "):
            code.append(line.strip())
        elif code and not line.strip():
            blocks.append((" ".join(prose), code))
            prose, code = [], []
        elif line.strip():
            prose.append(line)
    return blocks


def _lines(marker: str) -> list[str]:
    return [line for prose, code in walkthrough() if marker in prose for line in code]


def test_every_step_says_whether_the_tests_run_it() -> None:
    blocks = walkthrough()
    assert len(blocks) >= 10
    for prose, code in blocks:
        assert (TESTED in prose) != (NOT_RUN in prose), f"say '{TESTED})' or '{NOT_RUN}: ...)' before {code}"
    tested = {shlex.split(line)[1] for line in _lines(TESTED) if line.startswith("noloco-rt")}
    assert tested == {"prepare", "k8s", "keys", "export"}


def _run(line: str, capsys, monkeypatch) -> None:
    """One line of a tested block, as a user would type it in the current folder."""
    words = shlex.split(line.replace("REGISTRY", REGISTRY))
    if words[0] == "cp":
        shutil.copy(words[1], words[2])
        return
    assert words[0] == "noloco-rt", f"a tested step runs {words[0]!r}, which this test cannot"
    code, _, err = run_cli_in_process(capsys, monkeypatch, *words[1:])
    assert code in (0, None), f"{line}: exit {code}: {err}"


def _corpus(folder: Path) -> None:
    folder.mkdir()
    words = "the stage replica pipeline trains outer inner step worker spot node model data".split()
    for i in range(4):
        text = "\n".join(" ".join(words[(i + j + k) % len(words)] for k in range(12)) for j in range(200))
        (folder / f"part{i}.txt").write_text(text)


def _docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    return docs


def test_the_tested_steps_run_as_written(tmp_path: Path, capsys, monkeypatch) -> None:
    from tests.support.weights import random_consensus

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus")
    # The run's consensus as the coordinator writes it, of a tiny model with the walk's config.
    random_consensus(tmp_path / "consensus.safetensors", model={"preset": "tiny", "vocab_size": 32000},
                     data={"source": "tokens", "paths": ["/data/prepared"]})
    for line in _lines(TESTED):
        _run(line, capsys, monkeypatch)
    assert json.loads((tmp_path / "prepared" / "prepared.json").read_text())["vocab_size"] <= 32000
    run = _docs(tmp_path / "run.yaml")
    (cm,) = [d for d in run if d["kind"] == "ConfigMap"]
    cfg = load_config(environ={}, overrides=[tomllib.loads(cm["data"]["config.toml"])])
    assert cfg.model.vocab_size == 32000 and cfg.data.paths == ["/data/prepared"]
    images = {c["image"] for d in run if d["kind"] in ("Job", "Deployment")
              for c in d["spec"]["template"]["spec"]["containers"] if c["name"] != "redis"}
    assert images == {f"{REGISTRY}/noloco-rt:0.1.0-cuda"}
    (pod,) = _docs(tmp_path / "transfer.yaml")
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]}
    mounted = {m["mountPath"]: claims[m["name"]] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    run_claims = {d["metadata"]["name"] for d in run if d["kind"] == "PersistentVolumeClaim"}
    assert set(mounted.values()) == run_claims and mounted[cfg.store.url] == "noloco-store"
    assert {p.name for p in (tmp_path / "keys").iterdir()} == {"cluster.secret", "cluster.public"}
    assert {p.name for p in (tmp_path / "model-hf").iterdir()} >= {"config.json", "model.safetensors",
                                                                   "tokenizer.json"}


def _kubectl_lines() -> list[str]:
    return [line for line in _lines(NOT_RUN) if line.startswith("kubectl")]


def test_what_the_untested_steps_name_exists_in_the_render() -> None:
    """Selectors, names and paths in the kubectl lines match the rendered objects."""
    run = k8s_render.render("spot-gpu", image=f"{REGISTRY}/noloco-rt:0.1.0-cuda", vocab_size=32000)
    (pod,) = k8s_render.render_transfer_pod("spot-gpu")
    cfg = load_config(environ={}, overrides=[tomllib.loads(run[0]["data"]["config.toml"])])
    names = {d["metadata"]["name"] for d in [*run, pod]}
    text = "\n".join(_kubectl_lines())
    for selector in re.findall(r"-l (\S+)", text):
        key, value = selector.split("=")
        assert [d for d in [*run, pod] if d["metadata"]["labels"].get(key) == value], selector
    (storage,) = re.findall(r"apply -f run\.yaml -l (\S+)", text)
    key, value = storage.split("=")
    selected = {d["kind"] for d in run if d["metadata"]["labels"].get(key) == value}
    assert selected == {"PersistentVolumeClaim"}  # only the volumes, before the data is on them
    assert f"{pod['metadata']['name']}:{cfg.data.paths[0]}" in text  # the upload lands where data.paths points
    assert f"{pod['metadata']['name']}:{cfg.store.url}/{cfg.run.run_id}/consensus.safetensors" in text
    for name in re.findall(r"(?:pod/|pvc |job |secret generic )([a-z0-9-]+)", text):
        assert name in names | {"noloco-curve", "noloco-redis"}, name
    (deleted,) = re.findall(r"delete pvc (.+)", text)
    assert sorted(deleted.split()) == sorted(d["metadata"]["name"] for d in run if d["kind"] == "PersistentVolumeClaim")


def test_the_scaling_patch_keeps_a_job_elastic() -> None:
    (line,) = [line for line in _section("### Workers are Indexed Jobs") if "kubectl" in line and "patch" in line]
    words = shlex.split(line)
    patch = json.loads(words[words.index("-p") + 1])
    run = k8s_render.render("spot-gpu")
    (job,) = [d for d in run if d["kind"] == "Job" and d["metadata"]["name"] == words[words.index("job") + 1]]
    job["spec"].update(patch["spec"])  # a merge patch of two top-level spec fields
    assert job_api_errors(job) == [] and job["spec"]["completions"] == 6


@pytest.mark.parametrize("overlay", ["base", "spot-gpu", "cpu-dev"])
def test_the_sizing_table_is_the_renderers(overlay: str) -> None:
    rows = [line for line in _section("### Disk, probes and their arithmetic") if line.startswith(f"| {overlay} (")]
    (row,) = rows
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    run = k8s_render.render(overlay)
    (job, *_) = [d for d in run if d["kind"] == "Job"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    (store,) = [d for d in run if d["metadata"]["name"] == "noloco-store"]
    assert cells[3] == c["resources"]["requests"]["ephemeral-storage"]
    assert cells[4] == f"{c['startupProbe']['failureThreshold'] * c['startupProbe']['periodSeconds']} s"
    assert cells[5] == f"{c['livenessProbe']['exec']['command'][-1]} s"
    assert cells[6] == store["spec"]["resources"]["requests"]["storage"]

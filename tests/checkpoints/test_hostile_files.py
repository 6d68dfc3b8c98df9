"""Files handed to a user are data: a consensus whose embedded config was edited to name code
never runs that code, whatever command opens it (docs/architecture.md, "Threat model").

The file is a real consensus of a preset, its metadata rewritten as an attacker with write
access to the store (where the coordinator publishes it) would; the named script, if it ran,
would leave a marker file.
"""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from noloco_rt.cli import cli
from noloco_rt.config import config_to_toml, load_config
from noloco_rt.consensus.file import (
    OwnModelNotNamed,
    load_consensus,
    save_consensus,
    stage_parameter_shapes,
)


def preset_consensus(path) -> None:
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "hostile"}, "pipeline": {"stages": 1}}])
    generator = torch.Generator().manual_seed(0)
    save_consensus(path, cfg, [[torch.randn(shape, generator=generator) for _, shape in stage_parameter_shapes(cfg, 0)]],
                   metadata={"step": "1"})


def plant_factory(path, script) -> None:
    """Rewrite the file's embedded config to name `script` as the model's code."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    cfg = load_config(environ={}, overrides=[tomllib.loads(metadata["config"])])
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory=f"{script}:staged_model"))
    metadata["config"] = config_to_toml(cfg)
    save_file(tensors, str(path), metadata=metadata)


@pytest.fixture
def planted(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "evil.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef staged_model(cfg):\n    raise SystemExit(9)\n")
    path = tmp_path / "consensus.safetensors"
    preset_consensus(path)
    plant_factory(path, script)
    return path, marker


def test_a_consensus_naming_code_is_refused_by_load_consensus_without_running_it(planted):
    path, marker = planted
    with pytest.raises(OwnModelNotNamed, match="never chooses code to run"):
        load_consensus(path)
    assert not marker.exists(), "the file's factory ran"


@pytest.mark.parametrize("command", [["eval"], ["sample", "--prompt", "x"], ["export", "OUT"]])
def test_no_command_runs_the_code_a_consensus_names(planted, command, tmp_path):
    path, marker = planted
    args = [command[0], str(path), *(str(tmp_path / "hf") if a == "OUT" else a for a in command[1:])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "holds your own model" in result.output and "evil.py" in result.output
    assert not marker.exists(), "the file's factory ran"


def rewrite_data(path, **data) -> None:
    """Rewrite the file's embedded config's data section (an attacker naming local files)."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    cfg = load_config(environ={}, overrides=[tomllib.loads(metadata["config"])])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data))
    metadata["config"] = config_to_toml(cfg)
    save_file(tensors, str(path), metadata=metadata)


@pytest.fixture
def secret(tmp_path):
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- planted secret\n")
    key.chmod(0o600)
    return key


def test_export_never_copies_a_tokenizer_the_file_names(tmp_path, secret):
    path = tmp_path / "consensus.safetensors"
    preset_consensus(path)
    rewrite_data(path, source="tokens", paths=[str(secret.parent)], tokenizer=str(secret))
    out = tmp_path / "hf"
    result = CliRunner().invoke(cli, ["export", str(path), str(out)])
    assert result.exit_code == 0, result.output
    assert "never picks local files to copy" in result.output
    assert not (out / "tokenizer.json").exists()
    assert not any(b"planted secret" in f.read_bytes() for f in out.rglob("*") if f.is_file())


def test_eval_and_sample_ask_for_the_files_a_consensus_names(tmp_path, secret):
    path = tmp_path / "consensus.safetensors"
    preset_consensus(path)
    rewrite_data(path, source="files", paths=[str(secret)])
    refused = CliRunner().invoke(cli, ["eval", str(path)])
    assert refused.exit_code == 2 and "--data PATH" in refused.output and "id_ed25519" in refused.output, refused.output

    rewrite_data(path, source="tokens", paths=[str(secret.parent)], tokenizer=str(secret))
    refused = CliRunner().invoke(cli, ["sample", str(path), "--prompt", "x"])
    assert refused.exit_code == 2 and "--tokenizer FILE" in refused.output, refused.output


# -- the durable store: read like a wire message ---------------------------------------------


def _stored(tmp_path):
    from noloco_rt.store.backend import RunStore
    from noloco_rt.store.stage_checkpoints import StageCheckpoints

    store = RunStore(str(tmp_path / "store"))
    checkpoints = StageCheckpoints(store, "run", keep=1)
    state = {"slow": [torch.ones(3)], "counters": {"inner_steps": 10, "outer_steps": 2}}
    info = checkpoints.save(0, state, outer_step=2, inner_step=10, writer="a" * 32)
    return store, checkpoints, info


def _plant_manifest(store, name, **fields) -> None:
    import json

    store.write(f"run/stage-0/{name}", json.dumps({"version": 1, **fields}).encode())


@pytest.mark.parametrize(("change", "reason"), [
    ({"data_file": "../../../victim.txt"}, "data_file"),
    ({"outer_step": "9"}, "outer_step = '9'"),
    ({"size": -1}, "size = -1"),
    ({"sha256": "zz"}, "sha256"),
    ({"writer": "../x"}, "writer"),
], ids=["path-traversal", "string-step", "negative-size", "bad-sha", "writer-path"])
def test_a_forged_store_manifest_is_passed_over_with_its_reason_and_steers_nothing(tmp_path, change, reason):
    store, checkpoints, info = _stored(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the store's")
    # Older than the honest checkpoint: the next save's prune would remove the files it names.
    fields = {"run_id": "run", "stage": 0, "outer_step": 1, "inner_step": 5, "sha256": info.sha256,
              "size": info.size, "writer": "bbbbbbbb", "data_file": "step-00000001-bbbbbbbb.pt", **change}
    _plant_manifest(store, "step-00000001-bbbbbbbb.json", **fields)
    loaded, problems = checkpoints.latest(0)
    assert loaded is not None and loaded.info == info  # the honest checkpoint, no crash
    assert any(reason in p for p in problems), problems
    newer = checkpoints.save(0, {"slow": [torch.ones(3)]}, outer_step=3, inner_step=15, writer="a" * 32)  # prunes
    assert victim.read_text() == "not the store's"
    assert checkpoints.latest(0)[0].info == newer


def test_a_manifest_naming_another_checkpoint_cannot_make_prune_delete_it(tmp_path):
    store, checkpoints, info = _stored(tmp_path)
    # Contents of the honest checkpoint's manifest under another name: pruning by contents
    # would remove the honest files.
    fields = {"run_id": "run", "stage": 0, "outer_step": 0, "inner_step": 0, "sha256": info.sha256,
              "size": info.size, "writer": info.writer, "data_file": info.data_file}
    _plant_manifest(store, "step-00000001-cccccccc.json", **fields)
    _, problems = checkpoints.latest(0)
    assert any("contents are those of" in p or "data_file" in p for p in problems), problems
    checkpoints.prune(0)
    assert checkpoints.latest(0)[0].info == info


@pytest.mark.parametrize("content", [b"[1, 2]", b'{"name": "w", "cursor": {"epoch": -1, "position": 3}}',
                                     b'{"name": "w", "cursor": {"epoch": "x", "position": 3}}'])
def test_a_forged_data_cursor_is_ignored_not_a_crash(tmp_path, content):
    from noloco_rt.store.backend import RunStore
    from noloco_rt.store.cursors import DataCursors

    store = RunStore(str(tmp_path / "store"))
    cursors = DataCursors(store, "run")
    cursors.save("w", {"epoch": 1, "position": 5}, inner_step=3)
    assert cursors.load("w") is not None
    store.write("run/cursors/w.json", content)
    assert cursors.load("w") is None


# -- Hugging Face folders: an index names files of its folder only -------------------------------


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/outside.safetensors", "sub/model.safetensors",
                                   ".hidden.safetensors", "model.bin"])
def test_a_hugging_face_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    import json
    import shutil

    from noloco_rt.config.presets import PRESETS
    from noloco_rt.model.init_weights import InitWeightsError, open_source

    path = tmp_path / "consensus.safetensors"
    preset_consensus(path)
    folder = tmp_path / "hf"
    assert CliRunner().invoke(cli, ["export", str(path), str(folder)]).exit_code == 0
    shutil.move(folder / "model.safetensors", tmp_path / "outside.safetensors")  # beside the folder
    with safe_open(str(tmp_path / "outside.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))
    with pytest.raises(InitWeightsError, match="not a .safetensors file of this folder"):
        open_source(folder, PRESETS["tiny"])

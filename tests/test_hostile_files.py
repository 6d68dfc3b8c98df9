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
from noloco_rt.export import (
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

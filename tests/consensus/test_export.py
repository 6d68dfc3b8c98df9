"""The consensus file: exact round trip, refusals that name the problem, atomic publication,
and averaging real worker checkpoint files."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from noloco_rt.checkpoints.worker import save_checkpoint
from noloco_rt.config import config_to_toml, load_config
from noloco_rt.consensus.file import (
    CONSENSUS_FORMAT,
    ExportError,
    load_consensus,
    mean_over_replicas,
    save_consensus,
    stage_parameter_shapes,
)
from noloco_rt.consensus.scored import (
    consensus_of_checkpoints,
    read_worker_checkpoints,
    write_scored_consensus,
)
from noloco_rt.evaluation import validation_loss
from noloco_rt.model.llama import build_stage
from tests.support.weights import random_stages, worker_state


def make_config(run_id: str = "exp", stages: int = 2):
    return load_config(environ={}, overrides=[{"run": {"run_id": run_id, "seed": 5},
                                               "pipeline": {"stages": stages}}])




def test_stage_shapes_follow_build_stage_parameter_order():
    cfg = make_config()
    for stage in range(2):
        module = build_stage("tiny", vocab_size=256, stage=stage, num_stages=2, seed=0)
        assert stage_parameter_shapes(cfg, stage) == [(n, p.shape) for n, p in module.named_parameters()]


def test_round_trip_is_bit_exact_and_keeps_config_and_metadata(tmp_path):
    cfg = make_config()
    stages = random_stages(cfg, seed=1)
    path = tmp_path / "consensus.safetensors"
    save_consensus(path, cfg, stages, metadata={"step": "120", "replicas": "2,3"})

    loaded_cfg, model, metadata = load_consensus(path)
    assert loaded_cfg == cfg
    assert metadata["step"] == "120" and metadata["replicas"] == "2,3"
    assert metadata["format"] == CONSENSUS_FORMAT and "[pipeline]" in metadata["config"]
    state = dict(model.named_parameters())
    for stage, tensors in enumerate(stages):
        for (name, _), tensor in zip(stage_parameter_shapes(cfg, stage), tensors, strict=True):
            assert torch.equal(state[name].detach(), tensor), name
    assert len(state) == sum(len(t) for t in stages)
    assert [p.name for p in tmp_path.iterdir()] == ["consensus.safetensors"]  # no temporary left behind


def test_loaded_model_computes_what_the_stages_compute_in_sequence(tmp_path):
    cfg = make_config()
    stages = random_stages(cfg, seed=2)
    path = tmp_path / "c.safetensors"
    save_consensus(path, cfg, stages)
    _, model, _ = load_consensus(path)

    modules = []
    for stage, tensors in enumerate(stages):
        module = build_stage("tiny", vocab_size=256, stage=stage, num_stages=2, seed=0)
        with torch.no_grad():
            for param, tensor in zip(module.parameters(), tensors, strict=True):
                param.copy_(tensor)
        modules.append(module)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = tokens
        for module in modules:
            hidden = module(hidden)
        whole = model(tokens)
    assert whole.shape == (2, 16, 256)
    assert torch.equal(whole, hidden)  # same ops in the same order: bit-identical


def test_the_callers_environment_does_not_change_the_embedded_config(tmp_path, monkeypatch):
    cfg = make_config()
    path = tmp_path / "c.safetensors"
    save_consensus(path, cfg, random_stages(cfg, seed=3))
    monkeypatch.setenv("NOLOCO_PIPELINE_STAGES", "4")
    monkeypatch.setenv("NOLOCO_OUTER_ALPHA", "0.4")  # left to the method default (None) in the file
    loaded_cfg, _, _ = load_consensus(path)
    assert loaded_cfg == cfg and loaded_cfg.outer.alpha is None


# -- refusals ---------------------------------------------------------------------------


def _valid_file(tmp_path):
    cfg = make_config()
    path = tmp_path / "good.safetensors"
    save_consensus(path, cfg, random_stages(cfg, seed=4), metadata={"step": "1"})
    return path


def _rewrite(tmp_path, edit_tensors=None, edit_metadata=None):
    """A copy of a valid consensus file with its tensors or metadata changed."""
    good = _valid_file(tmp_path)
    from safetensors import safe_open

    with safe_open(str(good), framework="pt") as handle:
        metadata = dict(handle.metadata())
    tensors = load_file(good)
    if edit_tensors:
        edit_tensors(tensors)
    if edit_metadata:
        edit_metadata(metadata)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad, metadata=metadata)
    return bad


def _truncate(tmp_path):
    path = _valid_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return path


def _flip_a_byte_mid_tensor(tmp_path):
    path = _valid_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) - len(data) // 3] ^= 0x10  # in the tensor data, far from the header
    path.write_bytes(bytes(data))
    return path


def _nan_weight_with_a_matching_checksum(tmp_path):
    from noloco_rt.consensus.file import tensors_sha256

    def poison(tensors):
        tensors["layers.1.ffn.w2.weight"][3, 4] = float("nan")

    bad = _rewrite(tmp_path, edit_tensors=poison)
    tensors = load_file(bad)
    from safetensors import safe_open

    with safe_open(str(bad), framework="pt") as handle:
        metadata = dict(handle.metadata())
    metadata["sha256"] = tensors_sha256(tensors)  # a well-formed file that holds a NaN
    save_file(tensors, bad, metadata=metadata)
    return bad


def _garbage(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"this is not a safetensors file at all" * 10)
    return path


@pytest.mark.parametrize(("make_bad", "fragment"), [
    (lambda tmp: tmp / "absent.safetensors", "no such file"),
    (lambda tmp: tmp, "no such file"),  # a folder
    (_garbage, "not a readable safetensors file"),
    (_truncate, "not a readable safetensors file"),
    (lambda tmp: _rewrite(tmp, edit_metadata=lambda m: m.update(format="pt")), "format is 'pt'"),
    (lambda tmp: _rewrite(tmp, edit_metadata=lambda m: m.pop("config")), "metadata has no config"),
    (lambda tmp: _rewrite(tmp, edit_metadata=lambda m: m.pop("sha256")), "no checksum"),
    (_flip_a_byte_mid_tensor, "checksum mismatch: the file is damaged"),
    (_nan_weight_with_a_matching_checksum, "tensor layers.1.ffn.w2.weight holds NaN or infinite values"),
    (lambda tmp: _rewrite(tmp, edit_metadata=lambda m: m.update(config="[model]\npreset = 'huge'\n")),
     "embedded config is invalid: invalid model.preset = 'huge'"),
    (lambda tmp: _rewrite(tmp, edit_tensors=lambda t: t.update({"norm.weight": torch.ones(65)})),
     "tensor norm.weight has shape (65,), expected (64,)"),
    (lambda tmp: _rewrite(tmp, edit_tensors=lambda t: t.pop("layers.2.attn.wq.weight")),
     "missing tensors layers.2.attn.wq.weight"),
    (lambda tmp: _rewrite(tmp, edit_tensors=lambda t: t.update({"extra.bias": torch.zeros(3)})),
     "unexpected tensors extra.bias"),
    (lambda tmp: _rewrite(tmp, edit_tensors=lambda t: t.update({"norm.weight": torch.ones(64, dtype=torch.int32)})),
     "norm.weight has dtype torch.int32"),
])
def test_load_refuses_bad_files_naming_file_and_problem(tmp_path, make_bad, fragment):
    path = make_bad(tmp_path)
    with pytest.raises(ExportError) as info:
        load_consensus(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_save_refuses_wrong_stage_count_shapes_and_reserved_metadata(tmp_path):
    cfg = make_config()
    stages = random_stages(cfg, seed=5)
    path = tmp_path / "c.safetensors"
    with pytest.raises(ExportError, match="1 stages given, config has pipeline.stages = 2"):
        save_consensus(path, cfg, stages[:1])
    wrong = [stages[0], [*stages[1][:-1], torch.zeros(3, 3)]]
    with pytest.raises(ExportError, match=r"stage 1: head.weight has shape \(3, 3\), expected \(256, 64\)"):
        save_consensus(path, cfg, wrong)
    with pytest.raises(ExportError, match="stage 0: 3 tensors, expected"):
        save_consensus(path, cfg, [stages[0][:3], stages[1]])
    with pytest.raises(ExportError, match="metadata key 'config' is reserved"):
        save_consensus(path, cfg, stages, metadata={"config": "x"})
    assert not path.exists()


# -- atomic publication -------------------------------------------------------------------


def test_a_failed_save_keeps_the_previous_complete_file(tmp_path):
    cfg = make_config()
    path = tmp_path / "c.safetensors"
    first = random_stages(cfg, seed=6)
    save_consensus(path, cfg, first, metadata={"step": "1"})
    before = path.read_bytes()
    second = random_stages(cfg, seed=7)
    second[1][-1] = torch.zeros(1)  # fails validation after the first stage was already converted
    with pytest.raises(ExportError):
        save_consensus(path, cfg, second, metadata={"step": "2"})
    assert path.read_bytes() == before
    assert load_consensus(path)[2]["step"] == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_a_writer_killed_mid_write_leaves_the_previous_file_whole(tmp_path):
    """A real process dies inside the write (the file-size limit sends SIGXFSZ after 64 KiB of a
    ~1 MB file): the target still holds the previous complete consensus, and only the
    temporary file is torn."""
    cfg = make_config()
    path = tmp_path / "c.safetensors"
    save_consensus(path, cfg, random_stages(cfg, seed=8), metadata={"step": "1"})
    before = path.read_bytes()
    config_path = tmp_path / "run.toml"
    config_path.write_text(config_to_toml(cfg))
    limit = 64 * 1024
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from pathlib import Path
        from noloco_rt.config import load_config
        from noloco_rt.consensus.file import save_consensus, stage_parameter_shapes
        cfg = load_config({str(config_path)!r}, environ={{}})
        stages = [[torch.full(shape, 7.0) for _, shape in stage_parameter_shapes(cfg, s)] for s in range(2)]
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default; die like a killed writer
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        save_consensus(Path({str(path)!r}), cfg, stages, metadata={{"step": "2"}})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGXFSZ, result.stderr  # the fault really fired

    assert path.read_bytes() == before
    assert load_consensus(path)[2]["step"] == "1"
    torn = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(torn) == 1 and torn[0].stat().st_size == limit  # the write really was cut mid-way
    with pytest.raises(ExportError, match="not a readable safetensors file"):
        load_consensus(torn[0])


# -- averaging ----------------------------------------------------------------------------


def test_mean_over_replicas_exact_values_and_refusals():
    mean = mean_over_replicas([[torch.tensor([1.0, 2.0]), torch.tensor([[4.0]])],
                               [torch.tensor([3.0, 6.0]), torch.tensor([[0.0]])],
                               [torch.tensor([2.0, 1.0], dtype=torch.float64), torch.tensor([[2.0]])]])
    assert torch.equal(mean[0], torch.tensor([2.0, 3.0])) and torch.equal(mean[1], torch.tensor([[2.0]]))
    assert all(t.dtype == torch.float32 for t in mean)
    with pytest.raises(ExportError, match="no replicas"):
        mean_over_replicas([])
    with pytest.raises(ExportError, match=r"replica 1 tensor 0 has shape \(3,\), replica 0 has \(2,\)"):
        mean_over_replicas([[torch.zeros(2)], [torch.zeros(3)]])
    with pytest.raises(ExportError, match="replica 1 has 2 tensors, replica 0 has 1"):
        mean_over_replicas([[torch.zeros(2)], [torch.zeros(2), torch.zeros(2)]])




def test_consensus_from_real_checkpoint_files_skips_what_does_not_belong(tmp_path):
    cfg = make_config()
    replicas = [random_stages(cfg, seed=10 + r) for r in range(2)]  # replicas[r][stage]
    for r in range(2):
        for stage in range(2):
            save_checkpoint(tmp_path / f"s{stage}-r{r}.pt", worker_state(cfg, stage, replicas[r][stage]))
    save_checkpoint(tmp_path / "other-run.pt", worker_state(cfg, 0, random_stages(cfg, seed=99)[0], "other"))
    (tmp_path / "corrupt.pt").write_bytes(b"\x00not a torch file")
    save_checkpoint(tmp_path / "wrong-shapes.pt", worker_state(cfg, 1, [torch.zeros(2)]))
    (tmp_path / ".s0-r0.pt.abc.tmp").write_bytes(b"a torn temporary file")  # not a *.pt: never read

    out = tmp_path / "export" / "consensus.safetensors"
    scored = consensus_of_checkpoints(cfg, tmp_path, out, source="test")
    assert scored.replicas_per_stage == [2, 2] and scored.step == 10 and scored.path == out
    _, model, metadata = load_consensus(out)
    assert metadata["replicas_per_stage"] == "2,2" and metadata["step"] == "10" and metadata["source"] == "test"
    assert metadata["replicas_sampled"] == "2,2" and metadata["replicas_live"] == "2,2"  # every checkpoint: exact
    assert scored.estimate.low == scored.estimate.high == scored.spread
    params = {name: param.detach() for name, param in model.named_parameters()}
    for stage in range(2):
        expected = mean_over_replicas([replicas[0][stage], replicas[1][stage]])
        names = [name for name, _ in stage_parameter_shapes(cfg, stage)]
        assert all(torch.equal(params[name], tensor) for name, tensor in zip(names, expected, strict=True))
    assert torch.equal(params["head.weight"], expected[-1])
    # Scored as loaded back: the validation loss of the file's model, and the spread of the replicas averaged.
    assert scored.val_loss == pytest.approx(validation_loss(model, cfg))
    assert scored.val_ppl == pytest.approx(math.exp(scored.val_loss)) and scored.spread > 0.0
    assert scored.to_json()["consensus"] == str(out)

    skipped = {path.name: reason for path, reason in read_worker_checkpoints(tmp_path, cfg).skipped}
    assert set(skipped) == {"other-run.pt", "corrupt.pt", "wrong-shapes.pt"}
    assert "belongs to run 'other'" in skipped["other-run.pt"]
    assert "cannot be read" in skipped["corrupt.pt"]
    assert "stage 1 slow weights: 1 tensors, expected" in skipped["wrong-shapes.pt"]
    # The run's step is stage 0's clock: a replica a pull skipped ahead counts the steps it skipped.
    pulled = worker_state(cfg, 0, replicas[0][0])
    pulled["counters"].update(inner_steps=8, clock_steps=10)
    save_checkpoint(tmp_path / "s0-r0.pt", pulled)
    assert read_worker_checkpoints(tmp_path, cfg).inner_steps_by_stage[0] == [10, 10]


def test_consensus_needs_every_stage(tmp_path):
    cfg = make_config()
    save_checkpoint(tmp_path / "s0.pt", worker_state(cfg, 0, random_stages(cfg, seed=1)[0]))
    (tmp_path / "bad.pt").write_bytes(b"junk")
    with pytest.raises(ExportError, match=r"no usable checkpoint of run 'exp' for stage\(s\) 1 \(1 files skipped\)"):
        consensus_of_checkpoints(cfg, tmp_path, tmp_path / "c.safetensors", source="test")
    assert not (tmp_path / "c.safetensors").exists()
    with pytest.raises(ExportError, match="no such folder"):
        consensus_of_checkpoints(cfg, tmp_path / "absent", tmp_path / "c.safetensors", source="test")


def test_a_consensus_of_sampled_replicas_records_the_sample_and_estimates_the_spread(tmp_path):
    cfg = make_config()
    replicas = [random_stages(cfg, seed=20 + r) for r in range(3)]
    by_stage = [[replicas[r][stage] for r in range(3)] for stage in range(2)]
    by_stage[1] = by_stage[1][:1]  # stage 1: one replica of one
    out = tmp_path / "consensus.safetensors"
    scored = write_scored_consensus(out, cfg, by_stage, step=7, source="test", live_per_stage=[40, 1])
    _, _, metadata = load_consensus(out)
    assert (metadata["replicas_sampled"], metadata["replicas_live"]) == ("3,1", "40,1")
    assert metadata["replicas_per_stage"] == "3,1"  # the only key older readers know
    assert scored.replicas_per_stage == [3, 1] and scored.replicas_live == [40, 1]
    sampled, exact = scored.stage_estimates
    assert (sampled.sampled, sampled.population) == (3, 40) and sampled.low < sampled.spread < sampled.high
    assert exact.spread == exact.low == exact.high == 0.0
    assert scored.estimate.low < scored.spread < scored.estimate.high
    assert scored.to_json()["spread_low"] == scored.estimate.low and scored.to_json()["replicas_live"] == [40, 1]

    with pytest.raises(ExportError, match=r"\[3, 1\] replicas averaged per stage cannot be drawn from \[2, 1\] live"):
        write_scored_consensus(out, cfg, by_stage, step=7, source="test", live_per_stage=[2, 1])


def test_an_unbounded_spread_interval_is_null_in_json(tmp_path):
    cfg = make_config()
    by_stage = [[random_stages(cfg, seed=30 + r)[stage] for r in range(2)] for stage in range(2)]
    scored = write_scored_consensus(tmp_path / "c.safetensors", cfg, by_stage, step=1, source="test",
                                    live_per_stage=[9, 2])
    assert scored.estimate.high == math.inf and scored.to_json()["spread_high"] is None


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: scoring a consensus on the GPU is checked on GPU machines only")
def test_a_consensus_scored_on_the_gpu_has_the_loss_it_has_on_the_cpu(tmp_path):
    from noloco_rt.consensus.scored import scoring_device

    assert scoring_device() == "cuda"  # up and `noloco-rt consensus` score there after training
    cfg = make_config()
    by_stage = [[random_stages(cfg, seed=40 + r)[stage] for r in range(2)] for stage in range(2)]
    on_cpu = write_scored_consensus(tmp_path / "cpu.safetensors", cfg, by_stage, step=1, source="test")
    on_gpu = write_scored_consensus(tmp_path / "gpu.safetensors", cfg, by_stage, step=1, source="test", device="cuda")
    assert on_gpu.val_loss == pytest.approx(on_cpu.val_loss, rel=1e-4)
    assert on_gpu.spread == on_cpu.spread

"""The memory plan of an hf:PATH model: its stages measured on fake tensors, held against real
runs of the same stages (bytes to the byte, a replica's peak within 15 %), and used where a
preset's plan is (the worker's in-flight choice, `noloco-rt plan`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.memory_plan import hf_config, measured_peak
from noloco_rt.hf_model.memory import measured_stages
from noloco_rt.memory.fit import choose, plan_settings
from noloco_rt.memory.plan import plan
from noloco_rt.memory.tracker import TensorMemoryTracker
from noloco_rt.model.llama import lm_loss
from noloco_rt.model.staged import staged_model
from tests.support.hf_folders import VOCAB, write_folder
from tests.support.in_process import run_cli_in_process
from workers.device import memory_choice

pytest.importorskip("transformers", reason="transformers is a dev dependency: pip install -e '.[dev]'")

SEQ = 32


def real_microbatch(cfg, stage: int, sequences: int, precision: str) -> tuple[int, int]:
    """What the fake run measures, on real tensors: the bytes one microbatch keeps after its
    forward, and the peak of its first backward."""
    module = staged_model(cfg).build_stage(stage)
    last = stage == cfg.pipeline.stages - 1
    with TensorMemoryTracker() as tracker:
        inputs = (torch.randint(0, 256, (sequences, SEQ)) if stage == 0
                  else torch.randn(sequences, SEQ, 32, requires_grad=True))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            output = module(inputs)
        if last:  # the targets held beside, as the worker's batch holds them
            targets = torch.randint(0, 256, (sequences, SEQ))
            loss = lm_loss(output.float(), targets)
        kept = tracker.live_bytes
        tracker.reset_peak()
        (loss if last else output).backward(None if last else torch.randn(output.shape, dtype=output.dtype))
        return kept, tracker.peak_bytes


@pytest.mark.parametrize(("family", "precision"), [("llama", "bfloat16"), ("gpt2", "float32"),
                                                   ("mistral", "bfloat16")])
def test_a_stages_measured_bytes_equal_a_real_run_at_another_batch_size(tmp_path, family, precision) -> None:
    """Measured on fake tensors at the run's 3 sequences (and 4, for the slope), equal to the
    byte what real tensors keep and peak at; 5 sequences, extrapolated, too (mistral's window
    is shorter than the sequence: its sliding mask is real, and counted)."""
    folder = tmp_path / family
    write_folder(folder, family, weights=False)
    cfg = hf_config(str(folder), device=torch.device("cpu"), seq_len=SEQ, micro_batch=3, max_inflight=2,
                    precision=precision)
    stages = measured_stages(str(folder.resolve()), 2, SEQ, precision, 3)
    for stage in (0, 1):
        for sequences in (3, 5):
            kept, peak = real_microbatch(cfg, stage, sequences, precision)
            assert (stages[stage].activations(sequences), stages[stage].first_backward(sequences)) == (kept, peak), \
                (stage, sequences, kept, peak)
    assert sum(s.params for s in stages) == sum(p.numel() for p in write_folder(tmp_path / "ref", family).parameters())
    assert [s.layers for s in stages] == [2, 2] and stages[0].width == 32


@pytest.mark.parametrize(("family", "stage"), [("llama", 0), ("gpt2", 1)])
def test_planned_peak_of_an_hf_stage_is_within_15_percent_of_a_real_replicas(tmp_path, family, stage) -> None:
    """A real replica of the stage over an outer period (benchmarks/memory_plan.py): four
    microbatches held, their backwards, the optimizer step, the exchange's buffers (stage 0
    holds four microbatches, the last stage one with its loss; every family and stage at a
    larger size: benchmarks/README.md)."""
    write_folder(tmp_path / family, family)
    cfg = hf_config(str(tmp_path / family), device=torch.device("cpu"), seq_len=64, micro_batch=4, max_inflight=4)
    s = plan_settings(cfg, device_type="cpu", max_inflight=4, activation_checkpointing=False)
    planned, measured = plan(s)[stage].peak, measured_peak(s, stage, cfg=cfg)
    assert 0.85 <= planned / measured <= 1.15, (planned, measured)


def test_a_budget_chooses_fewer_microbatches_and_never_checkpointing(tmp_path) -> None:
    write_folder(tmp_path / "llama", "llama", weights=False)
    cfg = hf_config(str(tmp_path / "llama"), device=torch.device("cpu"), seq_len=64, micro_batch=8, max_inflight=0)
    auto = cfg
    assert auto.model.activation_checkpointing == "auto"
    peaks = {count: max(m.peak for m in plan(plan_settings(auto, device_type="cpu", max_inflight=count,
                                                           activation_checkpointing=False)))
             for count in (1, 2, 3, 4)}
    assert peaks[1] < peaks[2] < peaks[3] < peaks[4]
    choice = choose(auto, device_type="cpu", budget_bytes=(peaks[2] + peaks[3]) // 2)
    assert (choice.max_inflight, choice.activation_checkpointing, choice.fits) == (2, False, True)
    assert choose(auto, device_type="cpu", budget_bytes=peaks[1] // 2).max_inflight == 1
    unplanned = choose(auto, device_type="cpu", budget_bytes=None)  # no budget: nothing measured
    assert (unplanned.max_inflight, unplanned.peak_bytes) == (4, None)
    budget_gb = (peaks[2] + peaks[3]) / 2 / 1e9  # a worker given the budget chooses the same
    worker_choice = memory_choice(dataclasses.replace(cfg, worker=dataclasses.replace(
        cfg.worker, memory_budget_gb=budget_gb)), torch.device("cpu"))
    assert (worker_choice.max_inflight, worker_choice.activation_checkpointing) == (2, False)


@pytest.mark.slow
def test_plan_command_prints_a_measured_hf_model_and_refuses_code_of_your_own(tmp_path, capsys, monkeypatch) -> None:
    write_folder(tmp_path / "gpt2", "gpt2", weights=False)
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--model", f"hf:{tmp_path / 'gpt2'}",
                                        "--stages", "2", "--seq-len", "64", "--vocab-size", str(VOCAB),
                                        "--memory-gb", "0.05", "--device", "cpu")
    assert code == 0, err
    assert "Hugging Face model gpt2 (its stages measured on fake tensors), 2 stages" in out
    assert "fits in 0.05 GB: 4 in flight, checkpointing off" in out, out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:2] for row in rows] == [["0", "2"], ["1", "2"]]
    assert rows[0][8:10] == ["×", "4"] and rows[1][8:10] == ["×", "1"]
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--model", f"hf:{tmp_path / 'gpt2'}",
                                        "--fit-gb", "0.001", "--seq-len", "64", "--device", "cpu")
    assert code == 2 and "does not fit 0.001 GB a worker even on 4 stages" in err, err
    own = tmp_path / "own.py"
    own.write_text("def model(cfg):\n    raise AssertionError('never called')\n")
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--model", f"{own}:model")
    assert code == 2 and "own model model is code of your own: its memory cannot be planned" in err, err

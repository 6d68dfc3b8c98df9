"""benchmarks/gpu_check.py (`make gpu-check`): its arithmetic and its answer on a machine
without CUDA; the GPU run itself needs a GPU, which CI never has."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import flops_per_token, peak_tflops, worker_figures


def test_flops_per_token_is_six_per_parameter_plus_attention():
    # small: width 256, 6 layers, 3 per stage; a stage holds ~2.48 M parameters (vocabulary 256)
    flops = flops_per_token("small", stage=1, stages=2, seq_len=1024, vocab_size=256)
    attention = 12 * 3 * 1024 * 256
    assert flops - attention == pytest.approx(6 * 2_475_776)
    assert flops_per_token("small", stage=1, stages=2, seq_len=64, vocab_size=256) < flops


def test_known_gpus_have_a_peak_and_unknown_ones_do_not():
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("Some Future Accelerator") is None


def test_worker_rates_leave_out_start_up_and_keep_the_peak_memory(tmp_path):
    lines = [{"event": "worker_started", "stage": 0, "timestamp": "2026-11-24T10:00:00Z"}]
    lines += [{"event": "train_progress", "stage": 0, "inner_step": step, "gpu_peak_mib": 100.0 + step,
               "timestamp": f"2026-11-24T10:00:{seconds:02d}Z"}
              for step, seconds in ((1, 30), (10, 32), (20, 34), (30, 36))]
    (tmp_path / "s0-r0.log").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (tmp_path / "s1-r0.log").write_text(json.dumps(lines[1]) + "\n")  # too little progress: no row
    [row] = worker_figures(tmp_path, tokens_per_step=1000)
    # steps 10 -> 30 in 4 s (the 28 s of start-up before step 1 are left out)
    assert (row.name, row.stage, row.tokens_per_s, row.gpu_peak_mib) == ("s0-r0", 0, 5000.0, 130.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the no-GPU answer cannot be checked here")
def test_without_cuda_it_says_so_in_one_line_and_runs_nothing(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_check"])
    with pytest.raises(SystemExit) as done:
        gpu_check.main()  # in this process: torch is imported already
    assert str(done.value) == "gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was run"

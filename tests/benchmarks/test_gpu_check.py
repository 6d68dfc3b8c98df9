"""benchmarks/gpu_check.py (`make gpu-check`) and benchmarks/plain_loop.py: the gate over
synthetic worker events, the table, the plain loop on the CPU, and the answer on a machine
without CUDA. The GPU run itself needs a GPU, which CI never has."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from typing import Any

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import (
    Measured,
    flops_per_token,
    gate_failures,
    parse_modes,
    parse_shapes,
    peak_tflops,
    render_table,
    run_bounded,
    runtime_config,
    runtime_row,
    runtime_settings,
    worker_figures,
)
from benchmarks.plain_loop import compile_skip_reason, run_plain_loop


def stamp(second: float) -> str:
    return f"2026-11-24T10:{int(second) // 60:02d}:{second % 60:06.3f}Z"


def worker_events(*, stage: int, losses: tuple[float, ...] | None = (5.0, 4.5, 4.0),
                  kinds: tuple[str, ...] = ("matched", "matched"), blocked_s: float = 1.0) -> list[dict[str, Any]]:
    """A fault-free worker's log: progress at steps 1, 10 and 20 (at 30, 32 and 34 s), an outer
    step every 10 steps of the given kinds, and the summary; loss only on the last stage."""
    events: list[dict[str, Any]] = [{"event": "worker_started", "level": "info", "timestamp": stamp(0)}]
    for index, (step, second) in enumerate(((1, 30), (10, 32), (20, 34))):
        line = {"event": "train_progress", "level": "info", "stage": stage, "inner_step": step,
                "gpu_peak_mib": 100.0 + step, "timestamp": stamp(second)}
        events.append(line | ({"loss": losses[index]} if losses else {}))
    for outer, kind in enumerate(kinds, start=1):
        events.append({"event": "outer_step_done", "level": "info", "kind": kind, "outer_step": outer,
                       "timestamp": stamp(32 + 2 * outer), **({"exchange_s": 0.5 * outer, "wire_bytes": 2**20}
                                                               if kind == "matched" else {})})
    events.append({"event": "steps_done", "level": "info", "timestamp": stamp(34)})
    events.append({"event": "worker_summary", "level": "info", "outer_blocked_s": blocked_s, "timestamp": stamp(35)})
    return events


def two_by_two(**last_stage: Any) -> dict[str, list[dict[str, Any]]]:
    return {"s0-r0.0": worker_events(stage=0, losses=None), "s0-r1.0": worker_events(stage=0, losses=None),
            "s1-r0.0": worker_events(stage=1, **last_stage), "s1-r1.0": worker_events(stage=1)}


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


def test_worker_rates_leave_out_start_up_and_keep_the_peak_memory():
    events = {"s0-r0.0": worker_events(stage=0), "s1-r0.0": worker_events(stage=1)[:2]}  # the second: too little
    [row] = worker_figures(events, tokens_per_step=1000)
    # steps 10 -> 20 in 2 s (the 30 s of start-up before step 1 are left out)
    assert (row.name, row.stage, row.tokens_per_s, row.gpu_peak_mib) == ("s0-r0.0", 0, 5000.0, 120.0)


def test_a_run_whose_outer_steps_all_matched_passes_the_gate():
    assert gate_failures("125m 2x2", two_by_two(), replicas=2) == []


def test_unmatched_outer_steps_fail_the_gate_counted_by_kind():
    events = two_by_two(kinds=("local", "failed"))
    events["s1-r1.0"] = worker_events(stage=1, kinds=("matched", "local"))
    assert gate_failures("125m 2x2", events, replicas=2) == [
        "gpu-check: FAIL 125m 2x2: 3 of 8 outer steps not matched (local 2, failed 1)"]


def test_a_multi_replica_run_without_any_outer_step_fails_the_gate():
    events = {name: worker_events(stage=int(name[1]), kinds=()) for name in two_by_two()}
    assert gate_failures("small 2x2", events, replicas=2) == ["gpu-check: FAIL small 2x2: no outer step logged"]


def test_a_single_replica_run_is_not_held_to_matching():
    events = {"s0-r0.0": worker_events(stage=0, kinds=("local", "local"))}
    assert gate_failures("125m 1x1", events, replicas=1) == []


def test_error_level_events_fail_the_gate_with_their_names_and_counts():
    events = two_by_two()
    events["s0-r1.0"] += [{"event": "exchange_crashed", "level": "error", "timestamp": stamp(40)},
                          {"event": "exchange_crashed", "level": "error", "timestamp": stamp(41)},
                          {"event": "worker_died", "level": "critical", "timestamp": stamp(42)},
                          {"event": "microbatch_dropped", "level": "warning", "timestamp": stamp(43)}]
    assert gate_failures("small 2x2", events, replicas=2) == [
        "gpu-check: FAIL small 2x2: error-level events: exchange_crashed 2, worker_died 1"]


def test_a_loss_that_does_not_fall_fails_the_gate():
    events = two_by_two(losses=(5.0, 4.0, 5.0))
    assert gate_failures("1b 2x2", events, replicas=2) == ["gpu-check: FAIL 1b 2x2: loss did not fall on s1-r0.0: 5.0 -> 5.0"]


def test_a_failed_exit_and_missing_progress_fail_the_gate():
    events = two_by_two()
    events["s0-r1.0"] = worker_events(stage=0, losses=None)[:2]
    assert gate_failures("small 2x2", events, replicas=2, returncode=1) == [
        "gpu-check: FAIL small 2x2: exited with code 1",
        "gpu-check: FAIL small 2x2: too little progress on s0-r1.0 (1 train_progress lines, need 3)"]
    assert gate_failures("small 1x1", {}, replicas=1) == [
        "gpu-check: FAIL small 1x1: no worker log", "gpu-check: FAIL small 1x1: no worker logged a training loss twice"]


def test_a_run_row_sums_stage_zero_rates_and_averages_its_outer_steps():
    events = two_by_two()
    events["s1-r1.0"] = worker_events(stage=1, blocked_s=2.0)
    row = runtime_row("noloco-rt 2x2", events, tokens_per_step=1000, flops_of_stage={0: 1e9, 1: 2e9},
                      tflops=1.0)
    assert row.tokens_per_s == 10_000.0  # two stage-0 workers at 5,000 tokens/s each
    assert row.mfu == pytest.approx((2 * 5000 * 1e9 + 2 * 5000 * 2e9) / 1e12)
    assert (row.peak_mib, row.exchange_s, row.wire_bytes) == (120.0, 0.75, 2**20)
    # 1 s of the 6 s from step 1 (30 s) to the last outer step (36 s); 2 s on one stage-1 worker
    assert row.blocked_by_stage == pytest.approx({0: 1.0 / 6.0, 1: 1.5 / 6.0})
    assert row.blocked_share == pytest.approx(1.25 / 6.0)
    assert row.name == "noloco-rt 2x2"


def test_the_table_gives_each_run_as_a_ratio_to_the_plain_eager_loop():
    rows = [Measured("noloco-rt 2x2", 500.0, 0.1, 2048.0, exchange_s=0.25, wire_bytes=3 * 2**20, blocked_share=0.05,
                     blocked_by_stage={0: 0.02, 1: 0.08}),
            Measured("noloco-rt 1x1", 400.0, 0.1, 2048.0, blocked_share=0.01, blocked_by_stage={0: 0.01}),
            Measured("plain eager", 1000.0, 0.2, 4096.0), Measured("plain compiled", 2000.0, 0.4, 3072.0)]
    table = render_table("title", {"125m": rows}, ["1b: pipeline.max_inflight=1 until the scale issue lands"])
    assert "| preset | run | tokens/s | × plain eager | MFU |" in table
    assert "| 125m | noloco-rt 2x2 | 500 | 0.50× | 10.00 % | 2,048 | 0.250 | 3.00 | 5.0 % (2.0 / 8.0) |" in table
    assert "| 125m | noloco-rt 1x1 | 400 | 0.40× | 10.00 % | 2,048 | – | – | 1.0 % |" in table
    assert "| 125m | plain compiled | 2,000 | 2.00× | 40.00 % | 3,072 | – | – | – |" in table
    assert table.rstrip().endswith("1b: pipeline.max_inflight=1 until the scale issue lands")


def test_every_preset_runs_with_the_default_settings():
    # 1b ran with one microbatch in flight until workers sized it from the GPU's memory.
    args = argparse.Namespace(seq_len=1024, outer_h=10, set=[])
    assert runtime_settings("1b", args) == ["model.seq_len=1024", "outer.h=10"]
    for preset in ("small", "125m", "1b"):
        cfg = runtime_config(runtime_settings(preset, args))
        assert (cfg.pipeline.max_inflight, cfg.model.seq_len, cfg.outer.h) == (0, 1024, 10)
        assert cfg.pipeline.microbatches_per_step * cfg.data.batch_size == 32  # 32 x 1024 tokens per step


def test_a_run_past_its_time_is_ended_with_code_124_and_others_give_their_output():
    assert run_bounded([sys.executable, "-c", "print('done')"], 30.0, capture=True) == (0, "done\n")
    assert run_bounded([sys.executable, "-c", "import signal; signal.pause()"], 0.5, capture=True) == (124, "")
    assert run_bounded([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                       30.0) == (-signal.SIGTERM, "")


def test_the_plain_loop_trains_the_tiny_model_on_the_cpu():
    result = run_plain_loop("tiny", sequences=2, seq_len=16, vocab_size=256, steps=2, warmup_steps=1, device="cpu")
    assert (result.mode, result.tokens_per_step, result.peak_mib) == ("eager", 32, 0.0)
    assert result.tokens_per_s > 0
    assert math.isfinite(result.loss) and 4.0 < result.loss < 7.0  # ~ln 256 = 5.5 from random tokens


def test_compile_is_measured_on_cuda_only_and_says_why_not():
    assert compile_skip_reason(torch.device("cuda")) is None
    assert "CUDA only" in (compile_skip_reason(torch.device("cpu")) or "")


def test_without_cuda_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as done:
        gpu_check.main([])
    assert done.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was run\n"


def test_shapes_and_plain_modes_parse_and_bad_ones_are_refused():
    assert parse_shapes("2x2, 1X1") == ((2, 2), (1, 1)) and parse_shapes("4x2") == ((4, 2),)
    assert parse_modes("eager") == ("eager",) and parse_modes("none") == ()
    for bad in ("2x", "two", "0x2"):
        with pytest.raises(argparse.ArgumentTypeError, match="shapes"):
            parse_shapes(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="eager, compiled, cuda-graphs or none, not fast"):
        parse_modes("eager,fast")
    assert gpu_check.DEFAULT_MODES == ("eager", "compiled")  # CUDA graphs on request only


def test_settings_of_the_runs_follow_the_defaults_and_a_bad_one_is_refused_before_anything_runs(capsys):
    args = argparse.Namespace(seq_len=1024, outer_h=10, set=["model.cuda_graphs=on"])
    assert runtime_settings("125m", args)[-1] == "model.cuda_graphs=on"
    assert runtime_config(runtime_settings("125m", args)).model.cuda_graphs == "on"
    for bad, named in (("model.cuda_graphs=maybe", "model.cuda_graphs"), ("cuda_graphs", "SECTION.FIELD=VALUE")):
        with pytest.raises(SystemExit) as done:
            gpu_check.main(["--set", bad])
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert "--set: invalid" in err and named in err, err


def test_runs_in_a_folder_that_holds_an_earlier_run_are_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "small" / "2x2" / "checkpoints").mkdir(parents=True)
    (tmp_path / "small" / "1x1").mkdir(parents=True)  # empty: fine
    with pytest.raises(SystemExit) as done:
        gpu_check.main(["--presets", "small", "--runs", str(tmp_path)])
    assert done.value.code == 2
    assert f"{tmp_path / 'small' / '2x2'} holds an earlier run" in capsys.readouterr().err
    assert gpu_check.earlier_runs(tmp_path, ["small"], ((1, 1),)) == []

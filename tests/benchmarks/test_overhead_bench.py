"""benchmarks/overhead.py's pure parts (the schedule's ideal, medians and ranges, ratios run by
run, the runtime's rate from progress lines, the table) and benchmarks/plain_loop.py's gradient
accumulation. The benchmark itself runs processes for minutes: never here."""

from __future__ import annotations

import pytest
import torch

from benchmarks.overhead import (
    ACCUMULATED,
    IDEAL,
    IDEAL_SHARED,
    PLAIN,
    PLAIN_PIPELINE,
    PLAIN_PIPELINE_ZMQ,
    RUNTIME,
    RUNTIME_WARMUP_STEP,
    SHAPES,
    WINDOW,
    Row,
    Spread,
    format_spread,
    ideal_pipeline_tokens_per_s,
    paired_ratios,
    references_of,
    runtime_tokens_per_s,
    spread,
    table_rows,
    with_steps,
)
from benchmarks.plain_loop import (
    PlainLoopResult,
    PlainTrainer,
    random_batches,
    result_json,
    run_plain_loop,
)
from noloco_rt.config import OptimConfig
from noloco_rt.model.llama import build_stage


def test_the_ideal_is_b_over_b_plus_s_minus_one_of_the_slowest_stages_rate():
    # 4 microbatches through 2 stages: 5 slots of 10 ms per step, 4 x 256 tokens trained
    assert ideal_pipeline_tokens_per_s(microbatches=4, stages=2, tokens_per_microbatch=256,
                                       slowest_stage_s=0.01) == pytest.approx(4 * 256 / (5 * 0.01))
    # one stage has no bubble: the stage's own rate
    assert ideal_pipeline_tokens_per_s(microbatches=4, stages=1, tokens_per_microbatch=256,
                                       slowest_stage_s=0.01) == pytest.approx(25_600)
    with pytest.raises(ValueError):
        ideal_pipeline_tokens_per_s(microbatches=4, stages=2, tokens_per_microbatch=256, slowest_stage_s=0.0)


def test_spread_is_median_min_max_of_the_runs_that_gave_a_value():
    assert spread([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0)
    assert spread([4.0, None, 2.0]) == Spread(3.0, 2.0, 4.0)
    assert spread([None, None]) is None


def test_ratios_are_taken_run_by_run():
    assert paired_ratios([2.0, None, 6.0, 1.0], [1.0, 2.0, 3.0, None]) == [2.0, None, 2.0, None]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def test_a_spread_shows_its_range_only_when_the_runs_differ():
    assert format_spread(Spread(1.0, 0.9, 1.25), ".2f", "×") == "1.00× [0.90–1.25]"
    assert format_spread(Spread(16_203.4, 16_203.4, 16_203.4), ",.0f") == "16,203"
    assert format_spread(None, ".2f") == "failed"


def progress(step: int, second: float) -> dict[str, object]:
    return {"event": "train_progress", "inner_step": step, "timestamp": f"2026-11-28T04:05:{second:06.3f}Z"}


def test_the_runtimes_rate_leaves_out_start_up_and_warm_up():
    # step 1 after a long start-up, then 10 -> 30 in 2 s: 20 steps of 1,024 tokens
    records = [progress(1, 0.0), progress(10, 10.0), progress(20, 11.0), progress(30, 12.0),
               {"event": "steps_done", "inner_step": 30, "timestamp": "2026-11-28T04:06:00.000Z"}]
    assert runtime_tokens_per_s(records, tokens_per_step=1024) == pytest.approx(20 * 1024 / 2.0)
    assert runtime_tokens_per_s(records[:2], tokens_per_step=1024) is None  # nothing after warm-up


def test_a_slow_stretch_does_not_decide_the_runtimes_rate():
    """The median of the windows between progress lines: one window three times slower (load
    from outside) leaves the rate where the others put it."""
    records = [progress(10, 0.0), progress(20, 1.0), progress(30, 4.0), progress(40, 5.0), progress(50, 6.0)]
    assert runtime_tokens_per_s(records, tokens_per_step=1024) == pytest.approx(10 * 1024 / 1.0)


def test_the_table_divides_each_row_by_its_references_of_the_same_run():
    rows = [Row("launch", PLAIN, "plain", [100.0, 200.0], references_of(PLAIN, 1)),
            Row("launch", ACCUMULATED, "accumulated", [50.0, 200.0], references_of(ACCUMULATED, 1)),
            Row("launch", RUNTIME, "noloco-rt 1 x 1", [50.0, 100.0], references_of(RUNTIME, 1)),
            Row("pipeline", IDEAL, "ideal", [1000.0, 1000.0], references_of(IDEAL, 2)),
            Row("pipeline", IDEAL_SHARED, "ideal side by side", [900.0, 800.0], references_of(IDEAL_SHARED, 2)),
            Row("pipeline", PLAIN_PIPELINE, "plain pipeline", [900.0, 700.0], references_of(PLAIN_PIPELINE, 2)),
            Row("pipeline", PLAIN_PIPELINE_ZMQ, "over ZeroMQ", [640.0, 600.0], references_of(PLAIN_PIPELINE_ZMQ, 2)),
            Row("pipeline", RUNTIME, "noloco-rt 2 x 1", [800.0, None], references_of(RUNTIME, 2))]
    table = table_rows(rows)
    assert table[0] == ["launch", "plain", "150 [100–200]", "–", "–", "–", "–", "–", "–"]
    assert table[1][3:] == ["0.75× [0.50–1.00]", "–", "–", "–", "–", "–"]
    # runtime over one batch: 0.5 and 0.5; over the accumulating loop: 1.0 and 0.5
    assert table[2][3:] == ["0.50×", "0.75× [0.50–1.00]", "–", "–", "–", "–"]
    assert table[3][3:] == ["–", "–", "–", "–", "–", "–"]
    assert table[4][3:] == ["–", "–", "–", "–", "–", "–"]
    # the plain pipeline against both ideals: 0.9 and 0.7 of the first, 1.0 and 0.875 of the second
    assert table[5][3:] == ["–", "–", "0.80× [0.70–0.90]", "0.94× [0.88–1.00]", "–", "–"]
    # the ZeroMQ one against the same: 0.64 and 0.6, then 0.71 and 0.75
    assert table[6][3:] == ["–", "–", "0.62× [0.60–0.64]", "0.73× [0.71–0.75]", "–", "–"]
    # run 2 failed: run 1's ratios alone; 800 over the plain pipelines' 900 and 640
    assert table[7][2:] == ["800", "–", "–", "0.80×", "0.89×", "0.89×", "1.25×"]


def test_steps_apply_to_every_shape_and_keep_the_rest():
    shortened = with_steps(list(SHAPES.values()), 20)
    assert [s.steps for s in shortened] == [20] * len(SHAPES)
    assert [s.preset for s in shortened] == [s.preset for s in SHAPES.values()]
    assert SHAPES["launch"].tokens_per_step == 32 * 32 and SHAPES["compute"].tokens_per_step == 32 * 256


def test_the_pipeline_runs_on_both_the_launch_and_the_compute_shape():
    """The pipeline's cost per microbatch shows against short (tiny) and long (small) microbatches."""
    for name, single in (("pipeline", "launch"), ("pipeline-compute", "compute")):
        pipeline, alone = SHAPES[name], SHAPES[single]
        assert pipeline.stages == 2 and alone.stages == 1
        assert (pipeline.preset, pipeline.tokens_per_step) == (alone.preset, alone.tokens_per_step)
        assert pipeline.steps > RUNTIME_WARMUP_STEP + WINDOW  # two progress lines to rate from, at least


def trainer_after_one_step(microbatches: int, batch: torch.Tensor) -> tuple[PlainTrainer, list[torch.Tensor]]:
    """A tiny model's trainer after one step on `batch`, and the gradients that step used."""
    model = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=0)
    # warmup 0 and one step: lr is the peak lr at step 0; clipping on (the default 1.0)
    trainer = PlainTrainer(model, OptimConfig(lr=1e-2, warmup_steps=0), total_steps=10, compiled=False,
                           microbatches=microbatches)
    trainer.accumulate_gradients(batch)
    gradients = [p.grad.clone() for p in trainer.params]
    for p in trainer.params:
        p.grad = None
    trainer.step(batch)
    return trainer, gradients


def test_accumulating_microbatches_gives_the_gradient_and_the_step_of_one_batch():
    batch = random_batches(sequences=8, seq_len=16, vocab_size=256, device=torch.device("cpu"))[0]
    whole, whole_gradients = trainer_after_one_step(1, batch)
    pieces, piece_gradients = trainer_after_one_step(4, batch)
    # the gradient itself: Adam's first step is nearly lr x sign(gradient), blind to a wrong scale
    for one, accumulated in zip(whole_gradients, piece_gradients, strict=True):
        torch.testing.assert_close(accumulated, one, rtol=1e-4, atol=1e-7)
    # the weights after the step, to 1 % of the step (lr): where a gradient is ~0, Adam divides
    # float32 rounding noise by ~eps and moves a weight by up to ~1e-5 either way
    for one, accumulated in zip(whole.params, pieces.params, strict=True):
        torch.testing.assert_close(accumulated, one, rtol=0.0, atol=1e-4)
    assert any(not torch.equal(p, q) for p, q in zip(whole.params, build_stage(
        "tiny", vocab_size=256, stage=0, num_stages=1, seed=0).parameters(), strict=True))  # it did train


def test_the_cuda_graphs_loop_keeps_its_gradient_buffers_and_trains_as_the_eager_one():
    """--mode cuda-graphs: its gradients accumulate in buffers of its own (a CUDA graph's
    output is overwritten at the next replay), which stay the same memory, zeroed each step;
    the compile itself is torch's, measured on CUDA only."""
    batch = random_batches(sequences=8, seq_len=16, vocab_size=256, device=torch.device("cpu"))[0]
    trainers = [PlainTrainer(build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=0), OptimConfig(),
                             total_steps=10, compiled=False, microbatches=4, cuda_graphs=graphs)
                for graphs in (False, True)]
    buffers = [p.grad.data_ptr() for p in trainers[1].params]
    for _ in range(2):
        for trainer in trainers:
            trainer.step(batch)
    assert [p.grad.data_ptr() for p in trainers[1].params] == buffers
    assert all(not p.grad.any() for p in trainers[1].params) and all(p.grad is None for p in trainers[0].params)
    for plain, kept in zip(*(t.params for t in trainers), strict=True):
        torch.testing.assert_close(kept, plain, rtol=0, atol=0)


def test_microbatches_must_split_the_batch_evenly():
    model = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=0)
    trainer = PlainTrainer(model, OptimConfig(), total_steps=1, compiled=False, microbatches=3)
    with pytest.raises(ValueError):
        trainer.accumulate_gradients(torch.zeros(8, 17, dtype=torch.long))


def test_the_one_batch_json_line_is_unchanged():
    one = PlainLoopResult(mode="eager", tokens_per_step=1024, tokens_per_s=1.0, peak_mib=0.0, loss=2.0)
    assert "microbatches" not in result_json(one)
    assert '"microbatches": 4' in result_json(PlainLoopResult("eager", 1024, 1.0, 0.0, 2.0, microbatches=4))
    assert "window_tokens_per_s" not in result_json(one)


def test_the_plain_loop_rates_each_window_of_steps():
    result = run_plain_loop("tiny", sequences=2, seq_len=16, vocab_size=256, steps=7, warmup_steps=1, device="cpu",
                            window_steps=3)
    assert len(result.window_tokens_per_s) == 2  # the 7th step ends no window
    assert all(rate > 0 for rate in result.window_tokens_per_s)
    assert '"window_tokens_per_s"' in result_json(result)

"""benchmarks/plain_pipeline.py: the hand-written pipeline the overhead benchmark holds the
runtime's pipeline to must train what the plain loop trains (else its rate means nothing), and
rate its windows as the other references do. Real processes, a few steps of a tiny model."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.plain_loop import DISTINCT_BATCHES, PlainTrainer, random_batches
from benchmarks.plain_pipeline import PipelineShape, run_plain_pipeline, window_rates
from noloco_rt.config import OptimConfig
from noloco_rt.model.llama import build_model

NO_CLIP = OptimConfig(grad_clip=0.0)
"""Each stage clips its own gradients (as a worker does), the plain loop the whole model's: the
two agree only without clipping."""


def _shape(stages: int, **changes) -> PipelineShape:
    fields = dict(preset="tiny", stages=stages, microbatches=4, batch_size=2, seq_len=8, vocab_size=64, steps=4,
                  warmup_steps=1, device="cpu", threads=1, optim=NO_CLIP)
    return PipelineShape(**{**fields, **changes})


@pytest.mark.parametrize(("stages", "transport"), [(2, "pipe"), (3, "pipe"), (2, "zmq")])
def test_the_plain_pipeline_trains_exactly_what_the_plain_loop_trains_on_the_same_microbatches(stages, transport):
    # 3: a middle stage, which takes forwards and gradients as they come; zmq: the slots' bytes
    # over ZeroMQ sockets on 127.0.0.1, received by a thread of each stage
    result = run_plain_pipeline(_shape(stages), timeout_s=120, transport=transport)

    trainer = PlainTrainer(build_model("tiny", vocab_size=64, seed=0), NO_CLIP, total_steps=5, compiled=False,
                           microbatches=4)
    batches = random_batches(sequences=8, seq_len=8, vocab_size=64, device=torch.device("cpu"))
    expected = [float(trainer.step(batches[step % DISTINCT_BATCHES])) for step in range(5)]

    assert len(result.losses) == 5
    assert result.losses == pytest.approx(expected, abs=1e-5)
    assert result.losses[-1] < result.losses[0]  # it trained: AdamW moved the loss
    assert result.tokens_per_step == 4 * 2 * 8 and result.tokens_per_s > 0
    # each stage computes its 4 microbatches within a step, and the step is the rate's
    assert len(result.compute_s_per_microbatch) == stages
    assert all(0 < compute * 4 < result.step_s for compute in result.compute_s_per_microbatch)
    assert result.step_s == pytest.approx(result.tokens_per_step / result.tokens_per_s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_on_cuda_the_plain_pipeline_trains_what_the_plain_loop_trains_in_bfloat16():
    # both under bfloat16 autocast; the slots between the stages are host memory in float32
    result = run_plain_pipeline(_shape(2, device="cuda"), timeout_s=180)
    trainer = PlainTrainer(build_model("tiny", vocab_size=64, seed=0, device="cuda"), NO_CLIP, total_steps=5,
                           compiled=False, microbatches=4)
    batches = random_batches(sequences=8, seq_len=8, vocab_size=64, device=torch.device("cuda"))
    expected = [float(trainer.step(batches[step % DISTINCT_BATCHES])) for step in range(5)]
    assert result.losses == pytest.approx(expected, abs=2e-2)
    assert result.losses[-1] < result.losses[0]


def test_windows_start_after_warm_up_and_only_whole_windows_count():
    # steps end at t = 0, 1, ..., 9 s; the first 2 are warm-up, so timing starts at the 2nd end (t = 1)
    ends = [float(t) for t in range(10)]
    assert window_rates(ends, warmup_steps=2, window_steps=3, tokens_per_step=6) == [6.0, 6.0]  # 8 steps: 2 windows
    slow = [0.0, 1.0, 2.0, 3.0, *(t + 3.0 for t in range(4, 10))]  # step 4 took 4 s: the first window's
    assert window_rates(slow, warmup_steps=2, window_steps=3, tokens_per_step=6) == [3.0, 6.0]


def test_a_failing_stage_is_reported_and_the_waiting_stages_are_ended():
    # on the meta device stage 0's first output cannot be copied into its host slot; stage 1
    # would wait on its pipe for ever
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="stage 0 failed"):
        run_plain_pipeline(_shape(2, device="meta"), timeout_s=120)
    assert time.monotonic() - started < 60  # reported when it happens, not at the 120 s timeout


def test_bad_shapes_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="stages"):
        run_plain_pipeline(_shape(5))  # tiny has 4 layers
    with pytest.raises(ValueError, match="stages"):
        run_plain_pipeline(_shape(1))
    with pytest.raises(ValueError, match="zmq \\(2 stages\\), not zmq with 3 stages"):
        run_plain_pipeline(_shape(3), transport="zmq")
    with pytest.raises(ValueError, match="not carrier-pigeon"):
        run_plain_pipeline(_shape(2), transport="carrier-pigeon")
    with pytest.raises(ValueError, match="warmup_steps"):
        run_plain_pipeline(_shape(2, warmup_steps=0))

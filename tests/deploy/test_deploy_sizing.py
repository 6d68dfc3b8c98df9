"""The arithmetic behind the manifests' disk requests and probe thresholds
(noloco_rt/deploy/k8s_sizing.py), checked by hand and against the model itself."""

from __future__ import annotations

import math
import tomllib

import pytest

from noloco_rt.config import load_config
from noloco_rt.deploy import k8s_sizing as sizing
from noloco_rt.deploy.k8s_sizing import GIB
from noloco_rt.transfer_time import stage_timeouts

WORKER_1B = load_config(environ={}, overrides=[{"worker": {"min_bandwidth_mbit_s": 200, "exchange_timeout_s": 10,
                                                           "bootstrap_timeout_s": 60, "redis_wait_s": 300}}]).worker


def test_transfers_take_their_bytes_at_the_slowest_link_three_times_over() -> None:
    assert sizing.transfer_s(25e6, 200) == pytest.approx(3.0)  # 200 Mbit = 25 MB per second
    assert sizing.transfer_s(25e6, 100) == pytest.approx(6.0)
    # The worker's deadlines never drop below the configured floors, and grow past them for
    # large stages: one pull of 2.4 GB takes 288 s, and a joiner's search allows two.
    worker = WORKER_1B
    small = stage_timeouts(1000, worker)
    assert (small.exchange_s, small.bootstrap_pull_s, small.bootstrap_s) == (10, 10, 60)
    large = stage_timeouts(300_000_000, worker)
    assert large.bootstrap_pull_s == pytest.approx(288.0) and large.bootstrap_s == pytest.approx(576.0)
    assert large.exchange_s == pytest.approx(144.0)  # 1.2 GB


def test_disk_sizes_count_every_copy() -> None:
    assert sizing.checkpoint_bytes(1000) == 20_000  # five fp32 tensors per parameter
    # keep = 2: three checkpoints per stage at once (the newest being written), and the
    # consensus (4 B per parameter of the model) twice, all with 25 % headroom.
    assert sizing.store_bytes([1000, 3000], keep=2) == math.ceil((3 * 80_000 + 2 * 16_000) * 1.25)
    assert sizing.worker_ephemeral_bytes(1000) == 40_000 + GIB
    assert sizing.worker_ephemeral_bytes(1000, keep=3) == 80_000 + GIB  # worker.checkpoint_keep files and a temporary
    assert sizing.coordinator_ephemeral_bytes(1000) == 8_000 + GIB
    assert [sizing.gib_quantity(n) for n in (1, GIB, GIB + 1, 13 * GIB)] == ["1Gi", "1Gi", "2Gi", "13Gi"]


def test_probe_thresholds() -> None:
    # Startup: Redis wait + the worker's whole donor search (two pulls) + reading the stage's
    # checkpoint + slack.
    timeouts = stage_timeouts(300_000_000, WORKER_1B)
    budget = sizing.startup_budget_s(300_000_000, timeouts, mbit_s=200, redis_wait_s=300)
    assert budget == pytest.approx(300 + 576 + 720 + sizing.STARTUP_SLACK_S)  # 6 GB checkpoint: 720 s
    assert sizing.probe_failures(budget) == 178 and sizing.probe_failures(0.5) == 1
    assert sizing.probe_failures(641, period_s=10) == 65  # never less time than the budget
    # A hung loop: the file is older than twice the longest wait, at least two minutes.
    assert sizing.alive_stale_s(10) == sizing.ALIVE_STALE_FLOOR_S == 120
    assert sizing.alive_stale_s(148.2) == 297


def test_stage_parameter_counts_are_the_models_own() -> None:
    """Counted on torch's meta device; equal to a real stage's parameters."""
    from noloco_rt.model.llama import build_stage

    cfg = load_config(environ={}, overrides=[{"model": {"preset": "tiny", "vocab_size": 300},
                                              "pipeline": {"stages": 3}}])
    counts = sizing.stage_param_counts(cfg)
    real = [sum(p.numel() for p in build_stage("tiny", vocab_size=300, stage=s, num_stages=3, seed=0).parameters())
            for s in range(3)]
    assert counts == real and counts[0] > counts[1]  # stage 0 holds the embedding


@pytest.mark.parametrize("overlay", ["base", "spot-gpu", "cpu-dev"])
def test_the_manifests_carry_the_computed_sizes(overlay: str) -> None:
    from noloco_rt.deploy import k8s_render

    docs = k8s_render.render(overlay)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    expected = sizing.sizing_from_config(load_config(environ={}, overrides=[tomllib.loads(cm["data"]["config.toml"])]),
                                         gpu=overlay != "cpu-dev")
    (store,) = [d for d in docs if d["metadata"]["name"] == "noloco-store"]
    assert store["spec"]["resources"]["requests"]["storage"] == expected.store
    for job in (d for d in docs if d["kind"] == "Job"):
        (c,) = job["spec"]["template"]["spec"]["containers"]
        assert c["resources"]["requests"]["ephemeral-storage"] == expected.worker_ephemeral
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == expected.worker_memory
        assert c["startupProbe"]["failureThreshold"] == expected.startup_failures
        assert c["startupProbe"]["exec"]["command"][-1] == c["livenessProbe"]["exec"]["command"][-1] == str(
            expected.alive_stale_s)
    (coordinator,) = [d for d in docs if d["metadata"]["name"] == "noloco-coordinator" and d["kind"] == "Deployment"]
    requests = coordinator["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["ephemeral-storage"] == expected.coordinator_ephemeral


def test_a_1b_stage_gets_room_for_its_checkpoint_and_time_for_its_download() -> None:
    """The issue's numbers: a 1b stage checkpoint is about 6 GB, its bootstrap about 2.5 GB."""
    from noloco_rt.deploy import k8s_render

    cfg = load_config(environ={}, overrides=[tomllib.loads(k8s_render.config_toml(k8s_render.profile_for("spot-gpu")))])
    largest = max(sizing.stage_param_counts(cfg))
    assert 5.9e9 < sizing.checkpoint_bytes(largest) < 6.4e9
    pods = sizing.sizing_from_config(cfg, gpu=True)
    assert int(pods.worker_ephemeral.removesuffix("Gi")) * GIB >= 2 * sizing.checkpoint_bytes(largest)
    startup_s = pods.startup_failures * sizing.PROBE_PERIOD_S
    download_s = 2.5e9 * 8 / (cfg.worker.min_bandwidth_mbit_s * 1e6)
    assert startup_s > cfg.worker.redis_wait_s + 3 * download_s
    # ... and never less than the worker's own donor search, however many pulls it allows.
    assert startup_s > cfg.worker.redis_wait_s + stage_timeouts(largest, cfg.worker).bootstrap_s


def test_a_slower_link_gives_the_probes_more_time() -> None:
    from noloco_rt.deploy import k8s_render

    def worker(docs: list) -> dict:
        return next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]

    fast, slow = (worker(k8s_render.render("spot-gpu", min_bandwidth_mbit_s=rate)) for rate in (200, 50))
    assert slow["startupProbe"]["failureThreshold"] > fast["startupProbe"]["failureThreshold"]
    fast_stale, slow_stale = (int(c["livenessProbe"]["exec"]["command"][-1]) for c in (fast, slow))
    assert 4 * fast_stale - 4 <= slow_stale <= 4 * fast_stale  # a quarter of the rate: four times the wait


def test_worker_memory_is_the_plans_host_share_with_headroom_and_the_process() -> None:
    """A GPU worker's pod memory is the plan's host share (exchange and wire copies), a CPU
    worker's the plan's whole peak; 25 % headroom and the process on top."""
    from noloco_rt.memory.plan import plan
    from noloco_rt.memory.settings import PlanSettings

    gpu = plan(PlanSettings(preset="1b", stages=4, micro_batch=8, seq_len=64, vocab_size=256, precision="bfloat16",
                            activation_checkpointing=False, max_inflight=4, device="cuda"))
    cpu = plan(PlanSettings(preset="tiny", stages=2, micro_batch=8, seq_len=64, vocab_size=256, precision="float32",
                            activation_checkpointing=False, max_inflight=4, device="cpu"))
    assert sizing.worker_memory_bytes(gpu, gpu=True) == math.ceil(max(m.host for m in gpu) * 1.25) + 3 * GIB
    assert sizing.worker_memory_bytes(cpu, gpu=False) == math.ceil(max(m.peak for m in cpu) * 1.25) + GIB
    # a 1b stage's exchange keeps θ, its encoding, the partner's θ and φ, δ for joiners on the host: ~17 B a parameter
    assert max(m.host for m in gpu) > 17 * 308e6
    assert sizing.gib_quantity(sizing.worker_memory_bytes(gpu, gpu=True)) == "10Gi"

"""--tensorboard: real event files, read back with TensorBoard's own reader; a backend asked
for but not installed is refused in one line (exit 2)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from noloco_rt.cli import main
from noloco_rt.curves.scalar_log import TAGS, tag
from tests.support.tensorboard_events import HAVE_TENSORBOARD, HAVE_WANDB, read_scalars

needs_tensorboard = pytest.mark.skipif(not HAVE_TENSORBOARD, reason="tensorboard is not installed")




def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    return exited.value.code


@needs_tensorboard
def test_simulate_writes_every_curve_with_finite_values_at_increasing_steps(tmp_path):
    tb = tmp_path / "tb"
    code = run_cli("simulate", "--stages", "2", "--replicas", "2", "--steps", "6", "--eval-every", "2",
                   "--preset", "tiny", "--out", str(tmp_path / "run"), "--tensorboard", str(tb),
                   "--set", "run.eval_batches=2")
    assert code == 0
    scalars = read_scalars(tb)
    expected = {tag("val_loss"), tag("val_ppl"), tag("train_loss"), tag("lr"), tag("tokens_per_s"),
                tag("spread", "all"), tag("spread", "stage0"), tag("spread", "stage1")}
    assert expected <= scalars.keys(), sorted(scalars)
    assert [step for step, _ in scalars[tag("val_loss")]] == [0, 2, 4, 6]
    assert [step for step, _ in scalars[tag("train_loss")]] == [2, 4, 6]  # none before the first step
    for name in expected:
        steps = [step for step, _ in scalars[name]]
        assert steps == sorted(set(steps)), (name, steps)
        assert all(math.isfinite(value) for _, value in scalars[name]), name
    val = dict(scalars[tag("val_loss")])
    assert dict(scalars[tag("val_ppl")]) == pytest.approx({s: math.exp(v) for s, v in val.items()}, rel=1e-3)


def test_every_tag_has_one_heading_and_suffixes_make_one_curve_each():
    assert len(set(TAGS.values())) == len(TAGS)
    assert tag("train_loss", "s0-r1") == "train/loss/s0-r1"
    with pytest.raises(KeyError):
        tag("no such scalar")


def test_tensorboard_asked_for_but_not_installed_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    # None in sys.modules makes `import torch.utils.tensorboard` raise ImportError, as without the package.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    code = run_cli("simulate", "--steps", "2", "--preset", "tiny", "--out", str(tmp_path / "run"),
                   "--tensorboard", str(tmp_path / "tb"))
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "pip install tensorboard" in err, err
    assert not (tmp_path / "tb").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(HAVE_WANDB, reason="wandb is installed: the refusal cannot happen")
def test_wandb_asked_for_but_not_installed_is_one_line_and_exit_2(tmp_path, capsys):
    code = run_cli("simulate", "--steps", "2", "--preset", "tiny", "--out", str(tmp_path / "run"), "--wandb")
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "pip install wandb" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_coordinator_refuses_a_missing_tensorboard_before_connecting(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    code = run_cli("coordinator", "--redis-url", "redis://127.0.0.1:1", "--out", str(tmp_path / "run"),
                   "--tensorboard", str(tmp_path / "tb"))
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "pip install tensorboard" in err, err


@needs_tensorboard
def test_coordinator_writes_val_loss_ppl_spread_and_consensus_curves(tmp_path):
    import threading

    from noloco_rt.curves.scalar_log import open_scalar_log
    from tests.support.observer_stubs import observed_stages

    observer, _ = observed_stages(tmp_path, {0: 3, 1: 2}, sample=3, seed=0)
    observer.scalar_log = open_scalar_log(tmp_path / "tb")
    evaluated = observer.evaluate_once(threading.Event())
    measured = observer.spread_once(threading.Event())
    observer.scalar_log.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars[tag("val_loss")] == [(10, pytest.approx(evaluated.val_loss))]
    assert scalars[tag("val_ppl")] == [(10, pytest.approx(evaluated.val_ppl, rel=1e-5))]
    assert scalars[tag("spread", "all")] == [(10, pytest.approx(measured.spread))]
    assert [v for _, v in scalars[tag("spread", "stage0")] + scalars[tag("spread", "stage1")]] == pytest.approx(
        measured.spread_by_stage)
    assert scalars[tag("consensus_val_loss")] == [(10, pytest.approx(measured.consensus_val_loss))]


def test_up_refuses_an_explicit_tensorboard_without_the_package_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    code = run_cli("up", "--out", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb"))
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "pip install tensorboard" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


def test_up_default_tensorboard_without_the_package_is_a_warning_and_no_curves(tmp_path, monkeypatch):
    from workers.cluster.up import curves_settings

    warnings = []
    monkeypatch.setattr("workers.cluster.up.get_logger",
                        lambda **_: type("Log", (), {"warning": lambda self, *a, **k: warnings.append((a, k))})())
    if HAVE_TENSORBOARD:
        assert curves_settings(tmp_path, None, False, False).tensorboard == (tmp_path / "tb").resolve()
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    settings = curves_settings(tmp_path, None, False, False)
    assert settings.tensorboard is None and len(warnings) == 1
    assert "pip install tensorboard" in warnings[0][1]["reason"]
    assert curves_settings(tmp_path, None, True, False).tensorboard is None and len(warnings) == 1  # asked: quiet


class RecordingLog:
    def __init__(self) -> None:
        self.points: list[tuple[int, dict, str]] = []

    def scalars(self, step, values, *, suffix="", run=""):
        self.points.append((step, dict(values), f"{suffix}:{run}"))


def test_up_follows_new_worker_logs_and_every_incarnation_but_not_an_earlier_runs(tmp_path):
    import json

    from workers.cluster.run_curves import WorkerLogCurves

    def append(path: Path, *events: dict) -> None:
        with path.open("a") as handle:
            handle.writelines(json.dumps(e) + "\n" for e in events)

    progress = {"event": "train_progress", "inner_step": 10, "loss": 3.5, "tokens_per_s": 900.0, "lr": 1e-3}
    append(tmp_path / "s1-r0.0.log", progress)  # an earlier `up` on this run directory
    log = RecordingLog()
    curves = WorkerLogCurves(tmp_path, ["s0-r0", "s1-r0"], log)
    assert curves.poll() == 0
    append(tmp_path / "s1-r0.0.log", {**progress, "inner_step": 20}, {"event": "evaluated", "inner_step": 3})
    append(tmp_path / "s0-r0.1.log", {"event": "outer_step_done", "inner_step": 5, "wire_bytes": 100, "raw_bytes": 400},
           {"event": "outer_step_done", "inner_step": 10, "kind": "local"})  # a local step exchanged nothing
    with (tmp_path / "s0-r0.1.log").open("a") as handle:
        handle.write('{"event": "train_progress", "inner_st')  # being written: read next time
    assert curves.poll() == 2
    assert sorted(log.points, key=lambda p: p[2]) == [
        (5, {"exchange_wire_bytes": 100, "exchange_raw_bytes": 400}, "stage0:s0-r0"),
        (20, {"train_loss": 3.5, "tokens_per_s": 900.0, "lr": 1e-3}, "stage1:s1-r0")]
    with (tmp_path / "s0-r0.1.log").open("a") as handle:
        handle.write('ep": 6, "tokens_per_s": 5.0}\n')
    assert curves.poll() == 1 and log.points[-1] == (6, {"train_loss": None, "tokens_per_s": 5.0, "lr": None},
                                                     "stage0:s0-r0")


@needs_tensorboard
def test_the_replicas_of_a_stage_are_curves_of_one_chart(tmp_path):
    """Each worker writes its own event-file folder under one tag per stage: TensorBoard
    draws s0-r0 and s0-r1 on the chart train/loss/stage0, s1-r0 on train/loss/stage1."""
    import json

    from noloco_rt.curves.scalar_log import open_scalar_log
    from workers.cluster.run_curves import WorkerLogCurves, stage_heading

    assert (stage_heading("s0-r1"), stage_heading("s12-r3"), stage_heading("coordinator")) == \
        ("stage0", "stage12", "coordinator")
    logs, tb = tmp_path / "logs", tmp_path / "tb"
    logs.mkdir()
    log = open_scalar_log(tb, file_per_suffix=True)
    curves = WorkerLogCurves(logs, ["s0-r0", "s0-r1", "s1-r0"], log)
    for name, loss in (("s0-r0", 3.0), ("s0-r1", 3.5), ("s1-r0", 4.0)):
        (logs / f"{name}.0.log").write_text(json.dumps({"event": "train_progress", "inner_step": 10, "loss": loss}) + "\n")
    assert curves.poll() == 3
    curves.close()
    assert read_scalars(tb / "s0-r0")[tag("train_loss", "stage0")] == [(10, 3.0)]
    assert read_scalars(tb / "s0-r1")[tag("train_loss", "stage0")] == [(10, 3.5)]
    assert read_scalars(tb / "s1-r0")[tag("train_loss", "stage1")] == [(10, 4.0)]

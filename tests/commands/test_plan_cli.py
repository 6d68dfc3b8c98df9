"""`noloco-rt plan` as a user runs it: the table, --fit-gb, and one-line errors."""

from __future__ import annotations

import pytest

from tests.support.in_process import run_cli_in_process


def test_plan_prints_a_row_per_stage_with_the_chosen_settings(capsys, monkeypatch) -> None:
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--preset", "1b", "--stages", "2",
                                        "--micro-batch", "8", "--seq-len", "1024", "--memory-gb", "60")
    assert code == 0, err
    assert "preset 1b, 2 stages, 8 x 1024 tokens" in out and "bfloat16 compute" in out
    assert "fits in 60.00 GB: 4 in flight, checkpointing on" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("stage"))
    for column in ("weights", "grads", "inner opt", "outer φ δ", "activations", "exchange", "peak", "peak at"):
        assert column in header
    assert "outer step" in out  # checkpointed, the activations are small: θ's copies at the outer step set the peak
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "617.1M" in line]
    assert [row[0] for row in rows] == ["0", "1"]
    assert rows[0][8:10] == ["×", "4"] and rows[1][8:10] == ["×", "1"]  # the last stage holds one microbatch


def test_plan_says_what_fits_an_h100_and_an_h200(capsys, monkeypatch) -> None:
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--preset", "1b", "--stages", "2")
    assert code == 0, err
    h100, h200 = out.splitlines()[-2:]
    assert h100.startswith("H100 80 GB: fits, 4 in flight") and "of 83.8" in h100, h100
    assert h200.startswith("H200 141 GB: fits, 4 in flight") and "of 149.3" in h200, h200
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--preset", "7b", "--stages", "1")
    assert code == 0, err
    assert [line.split(":")[1].split(",")[0].strip() for line in out.splitlines()[-2:]] == ["does not fit"] * 2


def test_plan_takes_a_config_and_set_like_other_commands(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "small"\n[pipeline]\nstages = 3\n')
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--config", str(path), "--set",
                                        "pipeline.max_inflight=2", "--device", "cpu")
    assert code == 0, err
    assert "preset small, 3 stages" in out and "float32 compute" in out and "2 in flight" in out
    assert "MB (10^6 bytes)" in out


def test_fit_finds_the_fewest_stages_for_7b(capsys, monkeypatch) -> None:
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", "--preset", "7b", "--micro-batch", "8",
                                        "--seq-len", "1024", "--fit-gb", "80")
    assert code == 0, err
    assert out.startswith("fits 80 GB a worker on 3 stages")
    assert "4 in flight, checkpointing on" in out


@pytest.mark.parametrize(("args", "fragment"), [
    (["--preset", "7b", "--stages", "40"], "invalid pipeline.stages = 40: preset 7b has 32 layers"),
    (["--preset", "huge"], "'huge' is not one of"),
    (["--max-inflight", "-1"], "--max-inflight"),
    (["--preset", "7b", "--fit-gb", "1"], "does not fit 1 GB a worker even on 32 stages"),
    (["--memory-gb", "0"], "--memory-gb"),
    (["--set", "model.activation_checkpointing=sometimes"], "invalid model.activation_checkpointing"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, args, fragment) -> None:
    code, out, err = run_cli_in_process(capsys, monkeypatch, "plan", *args)
    assert code == 2, (out, err)
    assert fragment in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 3  # click's usage lines for a bad flag at most

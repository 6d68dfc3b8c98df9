"""Seeded simulator benchmarks (benchmarks.convergence, benchmarks.ablation): the statistics
with exact values, the variant and recipe parsers, and one short end-to-end run of each."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from benchmarks import ablation, convergence
from benchmarks.seed_report import along_run_table, fmt_range, ppl_band
from benchmarks.seed_stats import (
    SeedRange,
    pearson,
    ratio_along_run,
    ratios_per_seed,
    seed_range,
    spread_lr_pearson,
    summarise,
    thinned,
)
from benchmarks.seeded_bench import parse_seeds


def _run(ppls: list[float], spreads: list[float], lrs: list[float], wall_s: float = 10.0) -> dict:
    records = [{"step": 10 * i, "val_ppl": p, "spread": s, "lr": lr, "tokens": 100 * i}
               for i, (p, s, lr) in enumerate(zip(ppls, spreads, lrs, strict=True))]
    return {"records": records, "wall_s": wall_s, "outer": {"h": 5}}


def test_seed_range_mean_min_max_skips_nan():
    assert seed_range([1.0, 2.0, 6.0]) == SeedRange(3.0, 1.0, 6.0, 3)
    assert seed_range([float("nan"), 4.0]) == SeedRange(4.0, 4.0, 4.0, 1)
    empty = seed_range([float("nan")])
    assert empty.count == 0 and math.isnan(empty.mean)


def test_ratios_are_taken_seed_by_seed_on_shared_seeds():
    assert ratios_per_seed({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 2.0, 3: 5.0}) == {0: 2.0, 1: 1.5}


def test_pearson_known_values():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(pearson([1, 2, 3], [5, 5, 5]))
    assert math.isnan(pearson([1], [2]))


def test_spread_lr_pearson_skips_step_zero():
    # step 0 (spread 0, lr 0.9) would make this anti-correlated if it were counted
    run = _run([9.0, 5.0, 4.0, 3.0], [0.0, 3.0, 2.0, 1.0], [0.9, 0.3, 0.2, 0.1])
    assert spread_lr_pearson(run) == pytest.approx(1.0)


def test_summarise_rows_with_per_seed_ratios():
    runs = {
        "ddp": {0: _run([9, 2.0], [0, 0], [1, 1], 10.0), 1: _run([9, 4.0], [0, 0], [1, 1], 20.0)},
        "noloco": {0: _run([9, 3.0, 2.2], [0, 1, 2], [1, 2, 3]), 1: _run([9, 3.0, 4.8], [0, 2, 4], [1, 2, 3])},
    }
    ddp, noloco = summarise(runs, ["ddp", "diloco"])
    assert ddp.ratios["ddp"] == SeedRange(1.0, 1.0, 1.0, 2)
    assert ddp.ratios["diloco"] is None  # diloco did not run
    assert ddp.pearson.count == 0  # constant spread: no correlation
    assert ddp.wall_s_mean == 15.0
    assert noloco.seeds == (0, 1) and noloco.h == 5
    assert noloco.ppl == SeedRange(3.5, 2.2, 4.8, 2)
    ratio = noloco.ratios["ddp"]
    assert ratio is not None and (ratio.lo, ratio.hi) == pytest.approx((1.1, 1.2))
    assert ratio.mean == pytest.approx(1.15)
    assert noloco.final_spread_mean == 3.0
    assert noloco.pearson == SeedRange(1.0, 1.0, 1.0, 2)


def test_ratio_along_run_seed_by_seed_on_steps_every_seed_evaluated():
    ddp = {0: _run([9, 4.0, 2.0], [0, 0, 0], [1, 0.5, 0.1]), 1: _run([9, 5.0, 4.0], [0, 0, 0], [1, 0.5, 0.1])}
    noloco = {0: _run([9, 6.0, 2.2], [0, 1, 1], [1, 0.5, 0.1]), 1: _run([9, 6.0], [0, 1], [1, 0.5]),
              2: _run([9, 1.0, 1.0], [0, 1, 1], [1, 0.5, 0.1])}  # seed 2: no baseline, left out
    first, = ratio_along_run(noloco, ddp)  # step 20: seed 1 never got there; step 0 is untrained
    assert (first.step, first.lr) == (10, 0.5)
    assert first.baseline_ppl == SeedRange(4.5, 4.0, 5.0, 2)
    assert (first.ratio.lo, first.ratio.mean, first.ratio.hi) == pytest.approx((1.2, 1.35, 1.5))
    assert ratio_along_run(noloco, {}) == []


def test_thinned_keeps_the_last_point_and_at_most_n():
    points = list(range(1, 24))
    kept = thinned(points, 10)  # type: ignore[arg-type]  # any sequence thins alike
    assert len(kept) <= 10 and kept[-1] == 23 and kept == sorted(kept)
    assert thinned(points[:5], 10) == points[:5]


def test_along_run_table_each_label_over_each_earlier_baseline():
    ddp = {0: _run([9, 4.0, 2.0], [0, 0, 0], [1, 0.5, 0.1])}
    diloco = {0: _run([9, 8.0, 3.0], [0, 0, 0], [1, 0.5, 0.1])}
    noloco = {0: _run([9, 6.0, 2.4], [0, 1, 1], [1, 0.5, 0.1])}
    text = along_run_table("t", {"ddp": ddp, "diloco": diloco, "noloco": noloco}, ["ddp", "diloco"])
    header = next(line for line in text.splitlines() if line.startswith("| inner step"))
    assert header == "| inner step | lr | ddp ppl | diloco / ddp | noloco / ddp | noloco / diloco |"
    assert "| 20 | 1.0e-01 | 2.000 | 1.5000 | 1.2000 | 0.8000 |" in text
    assert along_run_table("t", {"noloco": noloco}, ["ddp"]) == ""  # no baseline ran


def test_ppl_band_and_range_format():
    runs = {0: _run([8.0, 4.0, 2.0], [0, 0, 0], [1, 1, 1]), 1: _run([8.0, 6.0], [0, 0], [1, 1])}
    assert ppl_band(runs) == ([0.0, 100.0], [8.0, 5.0], [8.0, 4.0], [8.0, 6.0])
    assert fmt_range(SeedRange(5.0, 4.0, 6.0, 2), 2) == "5.00 [4.00–6.00]"
    assert fmt_range(SeedRange(5.0, 5.0, 5.0, 1), 1) == "5.0"
    assert fmt_range(None, 2) == "n/a"


@pytest.mark.parametrize(("text", "name", "assignments"), [
    ("base:", "base", ()),
    ("h25:--set=outer.h=25", "h25", ("outer.h=25",)),
    ("h25:--set outer.h=25", "h25", ("outer.h=25",)),
    ("bf16:--set worker.snapshot_codec=bf16-shuffle-zstd,outer.h=25", "bf16",
     ("worker.snapshot_codec=bf16-shuffle-zstd", "outer.h=25")),
    ("lr: optim.lr=1e-3 , optim.lr_min=1e-4", "lr", ("optim.lr=1e-3", "optim.lr_min=1e-4")),
])
def test_parse_variant_good(text, name, assignments):
    assert ablation.parse_variant(text) == ablation.Variant(name, assignments)


@pytest.mark.parametrize(("text", "names"), [
    ("no-colon", "'no-colon'"),
    (":outer.h=25", "':outer.h=25'"),
    ("bad name:outer.h=5", "'bad name:outer.h=5'"),
    ("h:outer.h=25,", "'h'"),
    ("h:outerh=25", "'h'"),
    ("h:--set outer.h=25 --set outer.alpha=0.1", "'h'"),
])
def test_parse_variant_bad_names_the_variant(text, names):
    with pytest.raises(argparse.ArgumentTypeError, match=names):
        ablation.parse_variant(text)


def test_parse_seeds_and_recipe():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("0,0", "a", "", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_seeds(bad)
    assert convergence.parse_recipe("defaults=") == ("defaults", None)
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        convergence.parse_recipe("paper=no/such/file.toml")


def test_ablation_rejects_a_variant_whose_config_does_not_validate(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ablation.main(["--out", str(tmp_path), "--variant", "base:", "--variant", "broken:outer.h=zero"])
    assert "broken" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran


# small enough for two busy cores: short sequences, small batches, few evaluations
TINY = ["--steps", "8", "--eval-every", "4", "--eval-batches", "2", "--replicas", "2", "--warmup-steps", "2",
        "--seeds", "0,1", "--jobs", "2", "--set", "data.batch_size=2", "--set", "model.seq_len=16"]


def _assert_report(out, stem: str, labels: list[str], first: str) -> dict:
    assert (out / f"{stem}.png").stat().st_size > 0
    table = (out / f"{stem}.md").read_text()
    assert all(f"| {label} |" in table for label in labels)
    (group,) = json.loads((out / f"{stem}.json").read_text()).values()
    rows = {row["label"]: row for row in group["rows"]}
    assert list(rows) == labels
    for row in rows.values():
        assert row["seeds"] == [0, 1]
        assert all(math.isfinite(row["ppl"][k]) for k in ("mean", "lo", "hi"))
        assert row["ppl"]["lo"] <= row["ppl"]["mean"] <= row["ppl"]["hi"]
    assert rows[first]["ratios"][first]["mean"] == 1.0
    return rows


@pytest.mark.slow
def test_ablation_end_to_end(tmp_path, capsys):
    ablation.main([*TINY, "--out", str(tmp_path), "--variant", "base:", "--variant", "h4:--set outer.h=4"])
    rows = _assert_report(tmp_path, "ablation", ["base", "h4"], "base")
    assert rows["h4"]["h"] == 4
    assert math.isfinite(rows["h4"]["ratios"]["base"]["mean"])
    assert capsys.readouterr().out.count("seed") >= 4  # one progress line per finished run
    assert (tmp_path / "ablation_runs" / "defaults" / "h4" / "seed1" / "metrics.jsonl").is_file()
    # Run again with one more variant: finished runs are kept, only the new one trains.
    metrics = tmp_path / "ablation_runs" / "defaults" / "h4" / "seed1" / "metrics.jsonl"
    written = metrics.stat().st_mtime_ns
    ablation.main([*TINY, "--out", str(tmp_path), "--variant", "base:", "--variant", "h4:--set outer.h=4",
                   "--variant", "h2:--set outer.h=2"])
    out = capsys.readouterr().out
    assert out.count("(kept from an earlier run)") == 4 and out.count(" h2 seed ") == 2
    assert metrics.stat().st_mtime_ns == written
    again = _assert_report(tmp_path, "ablation", ["base", "h4", "h2"], "base")
    assert again["h4"]["ppl"] == rows["h4"]["ppl"]


@pytest.mark.slow
def test_convergence_end_to_end(tmp_path):
    convergence.main([*TINY, "--out", str(tmp_path), "--methods", "ddp,noloco", "--recipe", "defaults=",
                      "--set", "outer.h=4"])
    rows = _assert_report(tmp_path, "convergence", ["ddp", "noloco"], "ddp")
    assert rows["noloco"]["ratios"]["diloco"] is None  # no diloco in this run
    assert rows["ddp"]["final_spread_mean"] == 0.0
    table = (tmp_path / "convergence.md").read_text()
    assert "along the run" in table and "| inner step | lr | ddp ppl | noloco / ddp |" in table
    again = convergence.main(["--out", str(tmp_path), "--report-only"])
    assert "| inner step | lr | ddp ppl | noloco / ddp |" in again and "| noloco | 4 | 2 |" in again


def test_ablation_report_only_reprints_a_written_report_with_bytes(tmp_path, capsys):
    run = {"group": "g", "label": "x", "seed": 0, "wall_s": 1.0, "outer": {"h": 50},
           "records": [{"step": 10, "val_ppl": 5.0, "spread": 1e-3, "lr": 1e-3, "tokens": 100,
                        "exchange_raw_bytes": 3900, "exchange_wire_bytes": 1000}]}
    (tmp_path / "ablation.json").write_text(json.dumps({"g": {"rows": [], "runs": {"x": {"0": run}}}}))
    text = ablation.main(["--out", str(tmp_path), "--report-only"])
    assert "| x | 50 | 1 | 5.000 | 1.0000 |" in text and "3.9x" in text
    with pytest.raises(SystemExit):
        ablation.main(["--out", str(tmp_path / "missing"), "--report-only"])
    assert "does not exist" in capsys.readouterr().err

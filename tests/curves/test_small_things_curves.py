"""curves.png: a legend entry for the replicas' min–max band and for the outer steps, whose
lines fall where they belong. The figures are inspected as matplotlib objects, not pixels."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import LineCollection, PolyCollection

from noloco_rt.curves.png import (
    MAX_OUTER_MARKS,
    SPREAD_BAND_LABEL,
    curves_figure,
    distributed_run_figure,
    min_max_over,
    outer_steps_every,
    outer_steps_logged,
    plot_distributed_run,
    save_figure,
)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def outer_lines(ax) -> list[float]:
    """x of the outer-step lines drawn on `ax`."""
    found = [c for c in ax.collections if isinstance(c, LineCollection) and c.get_label().startswith("outer step")]
    assert len(found) == 1
    return [float(segment[0][0]) for segment in found[0].get_segments()]


def worker_record(rows: list[tuple[str, int, int, float | None]]) -> dict:
    return {"kind": "workers", "workers": [{"name": name, "inner_step": step, "outer_step": outer, "loss": loss}
                                           for name, step, outer, loss in rows]}


def up_records() -> list[dict]:
    """Two loss-computing replicas sampled at steps 10, 20, 30 (H = 10: one outer step per sample)."""
    return [
        worker_record([("s1-r0", 10, 1, 3.0), ("s1-r1", 10, 1, 3.4)]),
        worker_record([("s1-r0", 20, 2, 2.6), ("s1-r1", 20, 2, 2.2)]),
        worker_record([("s1-r0", 30, 3, 2.0), ("s1-r1", 30, 3, 2.1)]),
        {"kind": "spread", "step": 20, "spread": 0.01},
        {"kind": "final", "step": 30, "val_loss": 2.05, "spread": 0.02},
    ]


def test_pure_parts_exact_values():
    assert outer_steps_every(10, 35) == [10, 20, 30]
    assert outer_steps_every(0, 35) == []
    # Two outer steps first counted at step 40 after step 20: spread evenly over (20, 40].
    assert outer_steps_logged([[(10, 1), (20, 1), (40, 3)], [(10, 1), (40, 3)]]) == [10, 27.5, 40]
    steps, low, high = min_max_over({"a": {0: 1.0, 10: 3.0}, "b": {5: 4.0, 20: 0.0}, "c": {}})
    assert steps == [5, 10]  # step 0 and 20: one curve only
    assert low == [2.0, pytest.approx(4.0 - 4.0 / 3)] and high == [4.0, 3.0]  # b at 10: 4 − 4·5/15


def test_up_curves_have_a_band_and_outer_steps_in_their_legends(tmp_path):
    fig = distributed_run_figure(up_records(), lr=lambda s: 1e-3, total_steps=30, outer_every=10)
    loss_ax, spread_ax = fig.axes[:2]
    assert SPREAD_BAND_LABEL in legend_texts(loss_ax)
    band = [c for c in loss_ax.collections if isinstance(c, PolyCollection) and c.get_label() == SPREAD_BAND_LABEL]
    assert len(band) == 1
    xs, ys = band[0].get_paths()[0].vertices.T
    assert min(ys) == pytest.approx(2.0) and max(ys) == pytest.approx(3.4)  # the replicas' lowest and highest loss
    assert min(xs) == 10 and max(xs) == 30
    assert "outer step (every 10 inner steps)" in legend_texts(loss_ax)
    assert "replica spread (slow weights)" in legend_texts(spread_ax)
    assert "outer step (every 10 inner steps)" in legend_texts(spread_ax)
    assert outer_lines(loss_ax) == outer_lines(spread_ax) == [10, 20, 30]
    plot_distributed_run(up_records(), tmp_path / "curves.png", outer_every=10)
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_without_h_the_outer_steps_come_from_the_logged_counts():
    fig = distributed_run_figure(up_records())
    loss_ax, spread_ax = fig.axes[:2]
    assert "outer step (placed by the logged counts)" in legend_texts(loss_ax)
    assert outer_lines(spread_ax) == [10, 20, 30]


def test_a_long_run_thins_the_outer_lines_and_says_so():
    records = [worker_record([("w", 1000, 250, 1.0)])]
    fig = distributed_run_figure(records, total_steps=1000, outer_every=4)
    loss_ax = fig.axes[0]
    assert "outer step (every 4 inner steps), 1 in 3 drawn" in legend_texts(loss_ax)
    lines = outer_lines(loss_ax)
    assert len(lines) <= MAX_OUTER_MARKS and lines[:2] == [12, 24]


def test_simulate_curves_mark_outer_steps_beside_the_spread():
    records = [{"step": s, "val_loss": 5.0 - s / 100, "spread": s / 1000, "lr": 1e-3, "outer_steps": s // 25,
                "train_loss": None if s == 0 else 5.0 - s / 90} for s in (0, 50, 100)]
    fig = curves_figure(records, outer_every=25)
    loss_ax, spread_ax = fig.axes[:2]
    assert legend_texts(spread_ax) == ["replica spread", "outer step (every 25 inner steps)"]
    assert outer_lines(loss_ax) == [25, 50, 75, 100]
    logged = curves_figure(records)  # no H: two outer steps first counted at 50, two more at 100
    assert outer_lines(logged.axes[0]) == [25, 50, 75, 100]


def test_a_long_title_is_wrapped_to_the_figure_not_clipped(tmp_path):
    fig = plt.figure(figsize=(6, 4.5))
    save_figure(fig, tmp_path / "f.png", "Convergence, 2 stages x 4 replicas, preset tiny, 5000 inner steps, seeds 0,1,2")
    title = fig.get_suptitle()
    assert "\n" in title and max(len(line) for line in title.splitlines()) <= 54
    assert title.replace("\n", " ").endswith("seeds 0,1,2")
    assert (tmp_path / "f.png").stat().st_size > 0

"""The coordinator's live page without a run: what it aggregates (pure), what its routes
answer and refuse over real HTTP, and that it stays bounded. The page in a real browser on
a live run: tests/cluster/test_up.py::test_a_live_run_shows_on_its_page_and_ctrl_c_shuts_everything_down_gracefully."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from coordinator.page_data import changes, stage_summaries, stage_workers
from coordinator.page_routes import BadRequest, stage_asked
from coordinator.run_page import CURVE_POINTS, EVENTS, RunPage
from coordinator.server import StatusServer
from noloco_rt.membership.records import MemberRecord, WorkerState


def member(worker_id: str, name: str, stage: int, *, state: WorkerState = WorkerState.ONLINE, step: int = 10,
           loss: float | None = None, tokens: float = 100.0, failed: int = 0, heartbeat: float = 100.0,
           matched: int = 0) -> MemberRecord:
    return MemberRecord(worker_id=worker_id, run_id="r", stage=stage, data_addr="tcp://127.0.0.1:1",
                        exchange_addr="tcp://127.0.0.1:2", state=state, name=name, heartbeat_time=heartbeat,
                        inner_step=step, loss=loss, tokens_per_s=tokens, checkpoint_failed=failed,
                        outer_matched=matched)


MEMBERS = [member("a", "s0-r0", 0, step=10, matched=2), member("b", "s0-r1", 0, step=12, state=WorkerState.JOINING),
           member("c", "s1-r0", 1, loss=2.5, tokens=50.0, failed=1, matched=1),
           member("d", "s1-r1", 1, loss=3.5, tokens=float("nan"))]


def test_stage_rows_aggregate_what_a_thousand_workers_would_not_fit():
    rows = stage_summaries(MEMBERS, {"s1-r1": 2})
    assert rows[0] == {"stage": 0, "workers": 2, "states": {"JOINING": 1, "ONLINE": 1}, "step_min": 10, "step_max": 12,
                       "loss": None, "tokens_per_s": 200.0, "restarts": 0, "checkpoint_failed": 0,
                       "outer_steps": {"matched": 2, "partial": 0, "local": 0, "dropped_late": 0, "failed": 0}}
    assert (rows[1]["loss"], rows[1]["tokens_per_s"], rows[1]["restarts"], rows[1]["checkpoint_failed"]) == \
        (3.0, 50.0, 2, 1)  # the NaN rate is left out, not summed into NaN
    many = [member(f"w{i}", f"s0-r{i}", 0) for i in range(1000)]
    assert len(stage_summaries(many, {})) == 1
    detail = stage_workers(many, 0, {}, now=103.0, limit=200)
    assert len(detail["workers"]) == 200 and detail["more"] == 800
    assert detail["workers"][0]["name"] == "s0-r0" and detail["workers"][0]["heartbeat_age_s"] == 3.0
    assert [w["name"] for w in detail["workers"][:3]] == ["s0-r0", "s0-r1", "s0-r2"]  # not s0-r10 after s0-r1
    many[500] = member("w500", "s0-r500", 0, failed=2)
    many[700] = member("w700", "s0-r700", 0, state=WorkerState.JOINING)
    first = [w["name"] for w in stage_workers(many, 0, {"s0-r900": 1}, now=103.0, limit=200)["workers"][:4]]
    assert first == ["s0-r500", "s0-r700", "s0-r900", "s0-r0"]  # those that need a look come first


def test_changes_name_joins_departures_restarts_and_failed_checkpoints():
    before = {m.worker_id: m for m in MEMBERS}
    after = dict(before)
    del after["a"]  # vanished
    after["b"] = replace(before["b"], state=WorkerState.LEAVING)
    later = dict(after)
    del later["b"]  # left after saying LEAVING
    later["c"] = replace(before["c"], checkpoint_failed=3)
    del later["d"]
    later["e"] = member("e", "s1-r1", 1)  # d's name, a new id: restarted
    later["f"] = member("f", "s2-r0", 2)
    known = {m.name: m.worker_id for m in MEMBERS}
    assert changes(before, after, known) == [("vanished", "s0-r0", "s0-r0 (a) vanished (its record expired: killed "
                                                                   "or cut off)")]
    assert changes(after, later, known) == [
        ("checkpoint_failed", "s1-r0", "s1-r0 (c): 2 checkpoint write(s) failed (3 in all)"),
        ("restarted", "s1-r1", "s1-r1 (e) restarted (was d)"),
        ("joined", "s2-r0", "s2-r0 (f) joined stage 2"),
        ("left", "s0-r1", "s0-r1 (b) left")]


def test_the_page_state_counts_restarts_and_stays_bounded():
    page = RunPage("r")
    page.refresh(MEMBERS, now=1.0)
    assert page.data(now=2.0)["events"] == []  # the workers already there at the first reading
    page.refresh([*MEMBERS[:3], member("e", "s1-r1", 1)], now=3.0)
    data = page.data(now=4.0)
    assert data["stages"][1]["restarts"] == 1 and data["events"][0]["kind"] == "restarted"
    assert data["read_age_s"] == 1.0
    for step in range(CURVE_POINTS + 10):
        page.add_point("val_loss", step, 1.0)
        page.add_event("cycle_failed", "x", now=float(step))
    page.add_point("val_loss", CURVE_POINTS + 9, 0.5)  # a second value of one step replaces the first
    data = page.data(now=5.0)
    assert len(data["curves"]["val_loss"]) == CURVE_POINTS and data["curves"]["val_loss"][-1] == (CURVE_POINTS + 9, 0.5)
    assert len(data["events"]) == EVENTS and data["events"][0]["time"] == CURVE_POINTS + 9  # newest first
    page.refresh_failed(ConnectionError("down"), now=6.0)
    assert page.data(now=7.0)["page_errors"] == {"ConnectionError": 1}


@pytest.mark.parametrize("query", ["", "k=", "k=x", "k=-1", "k=1&k=2", "k=1&j=2", "j=1", "k=1000001", "k=1;2"])
def test_a_stage_query_other_than_one_index_is_refused(query):
    with pytest.raises(BadRequest):
        stage_asked(query)
    assert stage_asked("k=3") == 3


def test_the_routes_answer_the_page_and_refuse_the_rest_over_http():
    page = RunPage("r")
    page.refresh(MEMBERS, now=1.0)
    server = StatusServer("127.0.0.1", 0, status_json=lambda: {"final": None, "note": "hello"},
                          registry=CollectorRegistry(), page=page)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(f"{base}/", timeout=5) as reply:
            html = reply.read().decode()
            assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
            assert reply.headers["Content-Security-Policy"] == "default-src 'self'"
            assert reply.headers["X-Content-Type-Options"] == "nosniff"
        # Offline: nothing is loaded from elsewhere.
        assert 'src="page.js"' in html and "http://" not in html.replace("http://www.w3.org", "")
        for asset in ("page.js", "page.css"):
            with urllib.request.urlopen(f"{base}/{asset}", timeout=5) as reply:
                assert reply.status == 200 and b"http" not in reply.read().replace(b"http://www.w3.org/2000/svg", b"")
        with urllib.request.urlopen(f"{base}/page/data", timeout=5) as reply:
            data = json.loads(reply.read())
        assert data["workers"] == 4 and data["note"] == "hello" and len(data["stages"]) == 2
        with urllib.request.urlopen(f"{base}/page/stage?k=1", timeout=5) as reply:
            assert [w["name"] for w in json.loads(reply.read())["workers"]] == ["s1-r0", "s1-r1"]
        for path, code in (("/page/stage?k=x", 400), ("/page/data?x=1", 400), ("/../etc/passwd", 404),
                           ("/page.js.map", 404), ("/coordinator/page/index.html", 404)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert refused.value.code == code, path
        request = urllib.request.Request(f"{base}/page/data", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as posted:
            urllib.request.urlopen(request, timeout=5)
        assert posted.value.code == 501
    finally:
        server.stop()


def test_a_thousand_workers_stay_readable_in_a_real_browser():
    """1,000 workers in 4 stages: the page's data stays a few kilobytes (a row per stage), and
    a real browser draws 4 rows and, for the stage the address opens (#stage=2), its first
    200 workers and how many more there are."""
    from tests.support.browser import ARTIFACTS, browser, render

    page = RunPage("big")
    now = time.time()
    members = [member(f"w{i}", f"s{i % 4}-r{i // 4}", i % 4, step=100 + i % 7, loss=3.0 + (i % 10) / 10,
                      matched=i % 3, heartbeat=now - i % 5) for i in range(1000)]
    members[998] = member("w998", "s2-r249", 2, failed=1, heartbeat=now)  # the last by name, shown first
    page.refresh(members, now=now)
    for step in range(0, 5000, 10):
        page.add_point("val_loss", step, 5.0 - step / 2000)
        page.add_point("spread", step, 1e-3 + step * 1e-7)
    server = StatusServer("127.0.0.1", 0, status_json=lambda: {"final": None}, registry=CollectorRegistry(), page=page)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(f"{base}/page/data", timeout=5) as reply:
            body = reply.read()
        data = json.loads(body)
        assert data["workers"] == 1000 and [row["workers"] for row in data["stages"]] == [250] * 4
        points = len(data["curves"]["val_loss"]) + len(data["curves"]["spread"])
        assert len(body) - 40 * points < 8000, len(body)  # beside the curves' points: the 4 rows, not 1,000
        if browser() is None:
            print("SKIPPED the browser part: no chromium here (make test installs it where it can: root and apt)")
            return
        dom = render(f"{base}/#stage=2", screenshot=ARTIFACTS / "live_page_1000_workers.png")
    finally:
        server.stop()
    assert 'data-loaded="yes"' in dom and "1000 workers in 4 stages" in dom, dom[-3000:]
    assert dom.count('<tr data-stage="') == 4
    detail = dom[dom.index('id="workers"'):]
    detail = detail[:detail.index("</table>")]
    assert detail.count("<tr>") == 200 + 1 and "s0-r0" not in detail  # the header row too
    names = re.findall(r"<tr><td>(s\d-r\d+)</td>", detail)
    assert names[:3] == ["s2-r249", "s2-r0", "s2-r1"] and len(names) == 200, names[:5]
    assert "and 50 more" in dom


def test_the_coordinators_host_flag_chooses_where_its_port_listens(monkeypatch):
    """`coordinator --host` (what the Kubernetes manifests pass) sets coordinator.status_host,
    the page's interface; without it the port stays on loopback, whatever network.bind_host is."""
    from coordinator.cli import coordinator_config

    for name in [n for n in os.environ if n.startswith("NOLOCO_")]:
        monkeypatch.delenv(name)
    flags = {"redis_url": None, "status_port": None, "out_dir": None, "redis_wait": None}
    exposed = coordinator_config(None, (), host="0.0.0.0", **flags)
    assert exposed.coordinator.status_host == "0.0.0.0" and exposed.network.bind_host == "127.0.0.1"
    default = coordinator_config(None, ("network.bind_host=0.0.0.0",), host=None, **flags)
    assert default.coordinator.status_host == "127.0.0.1"

"""A live worker under fuzzing (real processes): every message rejected and counted by
reason, the exchange server answers each with an ERROR, the worker keeps training and
its memory stays bounded. NOLOCO_FUZZ_COUNT sets the count: 1,000 here sends all 17 reasons,
the rarest twice (seed 1); benchmarks/fuzz_live.py runs 10,000."""

from __future__ import annotations

import os

import pytest

from workers.cluster.fuzz_live import fuzz, start_target
from workers.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)

COUNT = int(os.environ.get("NOLOCO_FUZZ_COUNT", "1000"))
# 2 GiB zstd bombs, 2**40-byte declared frames and floods of senders must not show up in
# memory: growth well under one honest snapshot decode per message.
MAX_RSS_GROWTH_KB = 200 * 1024


@pytest.mark.slow
def test_live_worker_survives_fuzzing_and_counts_every_reject(tmp_path):
    cluster = LocalCluster(tmp_path)
    try:
        target = start_target(cluster)
        report = fuzz(cluster, target, count=COUNT, seed=1)
        assert target.process.poll() is None, target.log_text()[-3000:]
        # Every message was sent (none predicted valid more than 20 times in a row).
        assert report.sent_data + report.sent_exchange == COUNT
        assert report.missing_replies == 0 and report.error_replies == report.sent_exchange
        # Counted exactly as predicted, reason by reason (TCP on loopback loses nothing; the
        # wait above allows for messages still queued).
        assert report.counted == dict(report.sent), (report.counted, report.sent)
        assert {"codec", "non_finite", "wrong_run", "unknown_version", "frame_too_large", "malformed_chunk"} <= set(report.sent)
        growth_kb = report.rss_after_kb - report.rss_before_kb
        assert growth_kb < MAX_RSS_GROWTH_KB, (report.rss_before_kb, report.rss_after_kb)
        after = report.inner_after_fuzz
        assert after > report.inner_before  # trained during the fuzzing
        cluster.wait_for(lambda: target.latest_inner_step() >= after + 5, timeout_s=60,
                         what="training after the fuzzing")
        assert cluster.stop(target) == 0
    finally:
        cluster.close()

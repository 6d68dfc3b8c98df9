"""The live page's own reading of the members, every PAGE_REFRESH_S on a thread of its own
(with its own Membership, so the observer's cycles and the page never share one): the
page shows workers of every state, fresher than the observer's cycles read them."""

from __future__ import annotations

import threading
import time
from typing import Any

from coordinator.run_page import RunPage
from noloco_rt.logs import EventLog

PAGE_REFRESH_S = 2.0


def refresh_page_forever(page: RunPage, membership: Any, stop: threading.Event, log: EventLog) -> None:
    while not stop.is_set():
        try:
            members = membership.live_members(stage=None, states=None)
            page.refresh(members, now=time.time(), redis_available=membership.redis_available)
        except Exception as exc:  # noqa: BLE001 - counted and shown on the page; the loop goes on
            log.warning("page_refresh_failed", error=type(exc).__name__)
            page.refresh_failed(exc, now=time.time())
        stop.wait(PAGE_REFRESH_S)


def start_page_refresher(page: RunPage, membership: Any, stop: threading.Event, log: EventLog) -> threading.Thread:
    thread = threading.Thread(target=refresh_page_forever, args=(page, membership, stop, log),
                              name="page-refresh", daemon=True)
    thread.start()
    return thread

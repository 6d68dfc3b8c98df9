"""The live page's routes on the coordinator's HTTP port: the page and its two assets (read
from the package, so the page works offline), its data, and one stage's workers. Every
answer is a fixed file or JSON made by us; what a request may ask is checked here."""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from coordinator.run_page import RunPage

ASSETS = {"/": ("index.html", "text/html; charset=utf-8"),
          "/index.html": ("index.html", "text/html; charset=utf-8"),
          "/page.js": ("page.js", "text/javascript; charset=utf-8"),
          "/page.css": ("page.css", "text/css; charset=utf-8")}
MAX_STAGE = 100_000
SECURITY_HEADERS = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff",
                    "Cache-Control": "no-store"}


class BadRequest(ValueError):
    """A page request to refuse with 400: the message says why."""


def asset(path: str) -> tuple[bytes, str] | None:
    """The body and type of a page file, or None when `path` is none of them."""
    if path not in ASSETS:
        return None
    name, kind = ASSETS[path]
    return (resources.files("coordinator.page") / name).read_bytes(), kind


def page_json(page: RunPage, target: str, status: dict[str, Any]) -> bytes | None:
    """page/data or page/stage?k=N as JSON; None for another path; BadRequest for a bad query."""
    parts = urlsplit(target)
    now = time.time()
    if parts.path == "/page/data":
        if parts.query:
            raise BadRequest("page/data takes no query")
        return json.dumps(page.data(now=now, status=status), default=str).encode()
    if parts.path == "/page/stage":
        return json.dumps(page.stage(stage_asked(parts.query), now=now), default=str).encode()
    return None


def stage_asked(query: str) -> int:
    """k of `k=N`, a stage index; BadRequest for anything else."""
    try:
        fields = parse_qs(query, strict_parsing=True, max_num_fields=1)
    except ValueError:
        raise BadRequest("page/stage takes one field, k=STAGE") from None
    values = fields.get("k", [])
    if list(fields) != ["k"] or len(values) != 1 or not values[0].isdigit() or int(values[0]) > MAX_STAGE:
        raise BadRequest("page/stage takes one field, k=STAGE (a stage index)")
    return int(values[0])

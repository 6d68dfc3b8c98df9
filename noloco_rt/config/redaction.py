"""A URL as messages and logs show it: its password replaced (pure; no other config module)."""

from __future__ import annotations

from urllib.parse import urlparse, urlunparse


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***, for messages and logs."""
    parsed = urlparse(url)
    try:
        if parsed.password is None:
            return url
        user = parsed.username or ""
        host = parsed.hostname or ""
        port = f":{parsed.port}" if parsed.port else ""
    except ValueError:  # a malformed port: hide everything before the host
        return urlunparse(parsed._replace(netloc="***@" + parsed.netloc.rpartition("@")[2])) \
            if "@" in parsed.netloc else url
    return urlunparse(parsed._replace(netloc=f"{user}:***@{host}{port}"))

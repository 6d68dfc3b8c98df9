"""The durable store (store.url) checked before a process starts: one line, exit 2."""

from __future__ import annotations

from noloco_rt.cli import OneLineError
from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url


def check_store(cfg: Config) -> None:
    """Refuse a store that cannot be opened or listed (unknown scheme, missing fsspec
    package, unreadable folder), before the process registers anywhere."""
    if not cfg.store.url:
        return
    from noloco_rt.store.backend import RunStore, StoreError

    try:
        RunStore(cfg.store.url).list(cfg.run.run_id)
    except (OSError, StoreError) as exc:
        raise OneLineError(f"store.url {redact_url(cfg.store.url)!r} is not usable: {exc}") from None

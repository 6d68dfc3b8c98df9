"""A member of the table: one worker incarnation, where to reach it, its state and progress."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from noloco_rt.config.choices import SITE_PATTERN
from noloco_rt.membership.progress import WorkerProgress, progress_from_text, progress_to_text
from noloco_rt.net.addresses import peer_address_problem


class WorkerState(enum.StrEnum):
    JOINING = "JOINING"
    ONLINE = "ONLINE"
    LEAVING = "LEAVING"


@dataclass(frozen=True)
class MemberRecord(WorkerProgress):
    """One worker incarnation in the table: where to reach it, its state, and its progress
    (the WorkerProgress fields, keyword-only, after these)."""

    worker_id: str
    run_id: str
    stage: int
    data_addr: str
    exchange_addr: str
    state: WorkerState
    public_key: str = ""
    heartbeat_time: float = 0.0
    name: str = ""
    metrics_addr: str = ""
    site: str = ""
    """worker.site: where it runs; empty for none (routing keeps most microbatches in a site)."""

    def to_fields(self) -> dict[str, str]:
        return {"worker_id": self.worker_id, "run_id": self.run_id, "stage": str(self.stage),
                "data_addr": self.data_addr, "exchange_addr": self.exchange_addr, "state": self.state.value,
                "public_key": self.public_key, "heartbeat_time": repr(self.heartbeat_time),
                "name": self.name, "metrics_addr": self.metrics_addr, "site": self.site, **progress_to_text(self)}

    @classmethod
    def from_fields(cls, fields: dict[Any, Any]) -> MemberRecord:
        """Strict parse; raises ValueError on anything malformed."""
        text = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
                for k, v in fields.items()}
        for name in ("data_addr", "exchange_addr"):  # workers connect to these: tcp://host:port only
            if name in text and (problem := peer_address_problem(text[name])) is not None:
                raise ValueError(f"{name}: {problem}")
        if SITE_PATTERN.fullmatch(text.get("site", "")) is None:
            raise ValueError("site: not a site label")
        try:
            return cls(worker_id=text["worker_id"], run_id=text["run_id"], stage=int(text["stage"]),
                       data_addr=text["data_addr"], exchange_addr=text["exchange_addr"],
                       state=WorkerState(text["state"]), public_key=text.get("public_key", ""),
                       heartbeat_time=float(text["heartbeat_time"]),
                       name=text.get("name", ""), metrics_addr=text.get("metrics_addr", ""), site=text.get("site", ""),
                       **progress_from_text(text))
        except KeyError as exc:
            raise ValueError(f"missing field {exc}") from None

    def to_json(self) -> str:
        """The record as one string: a stage's view holds one per member (noloco_rt.membership.stage_view)."""
        return json.dumps(self.to_fields(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> MemberRecord:
        """Strict parse of to_json's output; raises ValueError on anything malformed."""
        try:
            fields = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"not a JSON object: {type(fields).__name__}")
        return cls.from_fields(fields)

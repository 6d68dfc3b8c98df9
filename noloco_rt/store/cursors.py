"""Each first-stage worker's data cursor in the durable store, by worker name.

A first-stage worker reads its own permutation of the corpus, fixed by its name
(workers/data_path/role.py). A pod that comes back under the same name (an Indexed Job's
index) without its local checkpoint continues that stream from here instead of from the
start. One small JSON file per name, replaced atomically.
"""

from __future__ import annotations

import json
import re
from typing import Any

from noloco_rt.data import DataCursor
from noloco_rt.store.backend import RunStore

_SAFE_NAME = re.compile(r"[^0-9A-Za-z_.-]")


class DataCursors:
    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def _path(self, name: str) -> str:
        return f"{self.run_id}/cursors/{_SAFE_NAME.sub('_', name)}.json"

    def save(self, name: str, cursor: dict[str, Any], *, inner_step: int) -> None:
        self.store.write(self._path(name), json.dumps({"name": name, "inner_step": inner_step,
                                                       "cursor": cursor}).encode())

    def load(self, name: str) -> DataCursor | None:
        """The cursor saved under `name`; None if there is none or it cannot be read."""
        try:
            fields = json.loads(self.store.read(self._path(name)))
            if fields.get("name") != name:
                return None  # two names that sanitise alike: not ours
            return DataCursor.from_state_dict(fields["cursor"])
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return None  # absent, or not what save() writes: start the stream afresh

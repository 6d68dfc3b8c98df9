"""Checksummed stage checkpoints in the durable store (docs/architecture.md §5).

Layout under the store's root:
    <run_id>/stage-<k>/step-<outer:08d>-<writer>.pt     the state (noloco_rt.checkpoints.worker format)
    <run_id>/stage-<k>/step-<outer:08d>-<writer>.json   its manifest, written after it
A manifest names its data file's SHA-256 and size, so a reader never trusts a file that is
torn, truncated or from a crashed writer: a checkpoint exists once its manifest does, and
is used only if the bytes match. Each writer's files carry its id, so two replicas that
both believe they are the stage's writer never overwrite each other.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from noloco_rt.checkpoints.worker import CheckpointError, checkpoint_bytes, checkpoint_from_bytes
from noloco_rt.counts import is_count
from noloco_rt.store.backend import RunStore

MANIFEST_VERSION = 1
_MANIFEST_NAME = re.compile(r"^step-(\d{8,})-([0-9a-zA-Z_-]+)\.json$")


@dataclass(frozen=True)
class StageCheckpointInfo:
    run_id: str
    stage: int
    outer_step: int
    inner_step: int
    sha256: str
    size: int
    writer: str
    data_file: str
    """Name of the .pt file next to the manifest."""

    def manifest_bytes(self) -> bytes:
        return json.dumps({"version": MANIFEST_VERSION, **asdict(self)}, sort_keys=True).encode()


def checkpoint_basename(outer_step: int, writer: str) -> str:
    return f"step-{outer_step:08d}-{writer[:8]}"


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WRITER = re.compile(r"^[0-9a-zA-Z_-]{1,8}$")
_INT_FIELDS = ("stage", "outer_step", "inner_step", "size")
_STR_FIELDS = ("run_id", "sha256", "writer", "data_file")


def parse_manifest(raw: bytes, *, run_id: str, stage: int, origin: str, name: str | None = None) -> StageCheckpointInfo:
    """The manifest in `raw` (file `name` in its folder, when given); CheckpointError when it is
    not one of this run and stage, or any field is off: the store is read like a wire message,
    since whoever can write it could otherwise steer a reader (a data_file with path parts made
    prune delete outside the store; a string outer_step crashed a resuming worker)."""
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict) or fields.pop("version", None) != MANIFEST_VERSION:
            raise ValueError("unknown manifest version")
        info = StageCheckpointInfo(**fields)
        manifest_problem(info, name)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"stage checkpoint manifest {origin} is not valid: {exc}") from exc
    if info.run_id != run_id or info.stage != stage:
        raise CheckpointError(f"stage checkpoint manifest {origin} is for run {info.run_id!r} stage {info.stage}")
    return info


def manifest_problem(info: StageCheckpointInfo, name: str | None) -> None:
    """Raise ValueError naming the first field of `info` that a writer of this code could not
    have written (pure): types, ranges, a SHA-256, a short writer id, and the data file's name
    and the manifest's own, both derived from (outer step, writer): no path, no other file."""
    for field in _INT_FIELDS:
        value = getattr(info, field)
        if not is_count(value):
            raise ValueError(f"{field} = {value!r} is not a non-negative integer")
    for field in _STR_FIELDS:
        if not isinstance(getattr(info, field), str):
            raise ValueError(f"{field} = {getattr(info, field)!r} is not a string")
    if not _SHA256.match(info.sha256):
        raise ValueError(f"sha256 = {info.sha256!r} is not a SHA-256 in hex")
    if not _WRITER.match(info.writer):
        raise ValueError(f"writer = {info.writer!r} is not a writer id")
    base = checkpoint_basename(info.outer_step, info.writer)
    if info.data_file != f"{base}.pt":
        raise ValueError(f"data_file = {info.data_file!r}, expected {base}.pt")
    if name is not None and name != f"{base}.json":
        raise ValueError(f"its contents are those of {base}.json")


def newest_first(infos: list[StageCheckpointInfo]) -> list[StageCheckpointInfo]:
    return sorted(infos, key=lambda i: (i.outer_step, i.inner_step, i.writer), reverse=True)


def beyond_keep(infos: list[StageCheckpointInfo], keep: int) -> list[StageCheckpointInfo]:
    """The checkpoints to delete so that those of the newest `keep` outer steps remain, every
    writer's (a stage's replicas all write their final state when they finish)."""
    kept_steps = sorted({info.outer_step for info in infos}, reverse=True)[:keep]
    return [info for info in newest_first(infos) if info.outer_step not in kept_steps]


def final_states(infos: list[StageCheckpointInfo]) -> list[StageCheckpointInfo]:
    """The checkpoints of the newest outer step, one per writer (pure): a finished stage's
    replicas' final states."""
    newest = newest_first(infos)
    return [info for info in newest if info.outer_step == newest[0].outer_step] if newest else []


@dataclass(frozen=True)
class LoadedStageCheckpoint:
    info: StageCheckpointInfo
    state: dict[str, Any]


class StageCheckpoints:
    """Stage checkpoints of one run in one store."""

    def __init__(self, store: RunStore, run_id: str, *, keep: int = 2) -> None:
        self.store = store
        self.run_id = run_id
        self.keep = keep

    def folder(self, stage: int) -> str:
        return f"{self.run_id}/stage-{stage}"

    def save(self, stage: int, state: dict[str, Any], *, outer_step: int, inner_step: int,
             writer: str) -> StageCheckpointInfo:
        """Write the state, then its manifest (what makes it visible), then prune old ones."""
        data = checkpoint_bytes({"run_id": self.run_id, "stage": stage, **state})
        base = checkpoint_basename(outer_step, writer)
        info = StageCheckpointInfo(run_id=self.run_id, stage=stage, outer_step=outer_step, inner_step=inner_step,
                                   sha256=hashlib.sha256(data).hexdigest(), size=len(data), writer=writer[:8],
                                   data_file=f"{base}.pt")
        folder = self.folder(stage)
        self.store.write(f"{folder}/{info.data_file}", data)
        self.store.write(f"{folder}/{base}.json", info.manifest_bytes())
        self.prune(stage)
        return info

    def manifests(self, stage: int) -> tuple[list[StageCheckpointInfo], list[str]]:
        """(the readable manifests of `stage`, newest first; why others were passed over)."""
        folder = self.folder(stage)
        infos, problems = [], []
        for name in self.store.list(folder):
            if not _MANIFEST_NAME.match(name):
                continue
            try:
                infos.append(parse_manifest(self.store.read(f"{folder}/{name}"), run_id=self.run_id, stage=stage,
                                            origin=f"{self.store.shown}/{folder}/{name}", name=name))
            except FileNotFoundError:
                continue  # pruned between listing and reading
            except CheckpointError as exc:
                problems.append(str(exc))
        return newest_first(infos), problems

    def newest_step(self, stage: int) -> int:
        """The outer step of the stage's newest manifest (0: none), without reading its data."""
        infos, _ = self.manifests(stage)
        return infos[0].outer_step if infos else 0

    def load(self, info: StageCheckpointInfo) -> dict[str, Any]:
        """The state `info` describes; CheckpointError when its bytes do not match the manifest."""
        origin = f"{self.store.shown}/{self.folder(info.stage)}/{info.data_file}"
        try:
            data = self.store.read(f"{self.folder(info.stage)}/{info.data_file}")
        except FileNotFoundError as exc:
            raise CheckpointError(f"stage checkpoint {origin} is missing") from exc
        if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
            raise CheckpointError(f"stage checkpoint {origin} fails its checksum ({len(data)} bytes, "
                                  f"manifest says {info.size})")
        return checkpoint_from_bytes(data, origin=origin, run_id=self.run_id, stage=info.stage)

    def latest(self, stage: int) -> tuple[LoadedStageCheckpoint | None, list[str]]:
        """The newest checkpoint of `stage` whose bytes check out (None: there is none), and
        why newer ones were passed over."""
        infos, problems = self.manifests(stage)
        for info in infos:
            try:
                return LoadedStageCheckpoint(info, self.load(info)), problems
            except CheckpointError as exc:
                problems.append(str(exc))
        return None, problems

    def newest_step_states(self, stage: int) -> tuple[list[LoadedStageCheckpoint], list[str]]:
        """Every checkpoint of the stage's newest outer step whose bytes check out (each
        writer's), and why others were passed over."""
        infos, problems = self.manifests(stage)
        loaded = []
        for info in final_states(infos):
            try:
                loaded.append(LoadedStageCheckpoint(info, self.load(info)))
            except CheckpointError as exc:
                problems.append(str(exc))
        return loaded, problems

    def prune(self, stage: int) -> None:
        infos, _ = self.manifests(stage)
        folder = self.folder(stage)
        for old in beyond_keep(infos, self.keep):
            self.store.remove(f"{folder}/{checkpoint_basename(old.outer_step, old.writer)}.json")  # invisible first
            self.store.remove(f"{folder}/{old.data_file}")

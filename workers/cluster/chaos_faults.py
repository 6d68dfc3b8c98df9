"""The faults of `noloco-rt chaos` that are not a signal to one process: a network partition
(workers in network namespaces, workers/faults/netns.py) and a full checkpoint disk (a tmpfs
filled to the last byte), and the one of them in effect. Both need root; the driver asks for
them only when their kind is requested, and `unavailable` says why not where they cannot be
made.
"""

from __future__ import annotations

import errno
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.faults import netns

FILL_CHUNK = 1 << 20
FILL_TAIL = 4096
"""After the 1 MiB pieces, a page at a time: no room is left for any write."""
DISK_FULL_UNSEEN_MAX_S = 60.0
"""How long past its hold a full disk stays full while no worker has tried to write to it yet."""


def split_groups(names_by_stage: Mapping[str, int], rng: random.Random) -> tuple[list[str], list[str]] | None:
    """Two sides, each with at least one worker of every stage (so both can train on), or None
    when some stage has a single worker."""
    stages: dict[int, list[str]] = {}
    for name, stage in sorted(names_by_stage.items()):
        stages.setdefault(stage, []).append(name)
    if any(len(members) < 2 for members in stages.values()):
        return None
    side_a: list[str] = []
    side_b: list[str] = []
    for members in stages.values():
        shuffled = members[:]
        rng.shuffle(shuffled)
        cut = rng.randint(1, len(shuffled) - 1)
        side_a += shuffled[:cut]
        side_b += shuffled[cut:]
    return sorted(side_a), sorted(side_b)


class Partitions:
    """Every worker in its own namespace (rank = index in sorted names), Redis in the hub."""

    def __init__(self, names_by_stage: Mapping[str, int]) -> None:
        self.names = dict(names_by_stage)
        self.rank = {name: index for index, name in enumerate(sorted(self.names))}
        self.active: list[tuple[str, str]] = []

    @staticmethod
    def unavailable() -> str | None:
        """Why partitions cannot be made here, or None."""
        if netns.existing():
            return f"network namespaces of another run exist ({', '.join(netns.existing())})"
        probe = subprocess.run(["ip", "netns", "add", f"{netns.PREFIX}-probe"], capture_output=True, text=True)
        subprocess.run(["ip", "netns", "del", f"{netns.PREFIX}-probe"], capture_output=True)
        return None if probe.returncode == 0 else f"cannot make network namespaces ({probe.stderr.strip()})"

    def create(self) -> None:
        netns.create(len(self.rank))

    def prefix(self, name: str) -> list[str]:
        return netns.exec_prefix(self.rank[name])

    def address(self, name: str) -> str:
        return netns.worker_ip(self.rank[name])

    def split(self, side_a: list[str], side_b: list[str], *, redis_with_a: bool) -> None:
        """Nothing crosses between the sides; the side without Redis cannot reach it either."""
        for a in side_a:
            for b in side_b:
                self._cut(self.address(a), self.address(b))
        for name in side_b if redis_with_a else side_a:
            self._cut(self.address(name), netns.SERVICE_IP)

    def _cut(self, x: str, y: str) -> None:
        netns.cut(x, y)
        self.active.append((x, y))

    def heal(self) -> None:
        for x, y in self.active:
            netns.heal(x, y)
        self.active = []

    def close(self) -> None:
        self.heal()
        netns.cleanup()


class FullDisk:
    """A tmpfs of `size_mb` over a folder (the run's checkpoints), filled by one file until the
    kernel says ENOSPC, then freed: real failed writes, not a simulated error."""

    def __init__(self, folder: Path, size_mb: int) -> None:
        self.folder = folder
        self.size_mb = size_mb
        self.filler = folder / ".chaos-fill"
        self.mounted = False

    @staticmethod
    def unavailable() -> str | None:
        probe = Path(tempfile.mkdtemp(prefix="noloco-tmpfs-probe-"))
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                return f"cannot mount a tmpfs ({done.stderr.strip() or 'mount failed'}; root needed)"
            subprocess.run(["umount", str(probe)], capture_output=True)
            return None
        finally:
            probe.rmdir()

    def mount(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.folder)], check=True,
                       capture_output=True)
        self.mounted = True

    def fill(self) -> int:
        """Bytes written before the kernel said ENOSPC, in 1 MiB pieces then page by page.
        Called again while the fault holds, it takes back room freed since: a write in flight
        when the disk filled completes and drops its oldest kept file, which left room for
        every later write (a chaos run once saw no write fail in a 2 s hold)."""
        written = 0
        with self.filler.open("ab", buffering=0) as handle:
            for size in (FILL_CHUNK, FILL_TAIL):
                chunk = b"\0" * size
                try:
                    while True:
                        written += handle.write(chunk) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount_keeping_files(self) -> None:
        """Copy what the workers left (their final checkpoints) off the tmpfs, unmount, put it back."""
        if not self.mounted:
            return
        self.free()
        keep = Path(tempfile.mkdtemp(prefix="noloco-chaos-ckpt-"))
        try:
            for entry in self.folder.iterdir():
                if entry.is_file():
                    shutil.copy2(entry, keep / entry.name)
            subprocess.run(["umount", str(self.folder)], check=True, capture_output=True)
            self.mounted = False
            for entry in keep.iterdir():
                shutil.move(entry, self.folder / entry.name)
        finally:
            shutil.rmtree(keep, ignore_errors=True)


class HeldClusterFault:
    """The partition or full disk in effect (at most one), undone once its hold is over."""

    def __init__(self, names_by_stage: Mapping[str, int], partitions: Partitions | None, disk: FullDisk | None,
                 seed: int) -> None:
        self.names = dict(names_by_stage)
        self.partitions = partitions
        self.disk = disk
        self.rng = random.Random(seed)
        self.until: float | None = None
        self.record: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.record is not None

    def split(self, hold_s: float, record: dict[str, Any], now: float) -> str | None:
        """Split the network (record gets the sides); the reason it cannot, or None."""
        assert self.partitions is not None and not self.active
        sides = split_groups(self.names, self.rng)
        if sides is None:
            return "a stage has a single worker: one side could not train"
        redis_with_a = self.rng.random() < 0.5
        self.partitions.split(*sides, redis_with_a=redis_with_a)
        record.update(sides=[list(side) for side in sides], redis_side=0 if redis_with_a else 1)
        self.until, self.record = now + hold_s, record
        return None

    def fill(self, hold_s: float, record: dict[str, Any], now: float) -> None:
        assert self.disk is not None and not self.active
        record["filled_bytes"] = self.disk.fill()
        self.until, self.record = now + hold_s, record

    def undo_due(self, now: float, *, write_failed: bool = True) -> None:
        """Undo the fault once its hold is over; until then keep a full disk full. A full disk
        no write has failed on yet (`write_failed`) stays full past its hold, up to
        DISK_FULL_UNSEEN_MAX_S: a loaded machine can go longer than a short hold between
        checkpoints, and a fault nobody met tests nothing (a CI run once freed it unmet)."""
        if self.until is None or self.record is None:
            return
        unmet_disk = self.record["kind"] == "disk_full" and not write_failed
        if now >= self.until + (DISK_FULL_UNSEEN_MAX_S if unmet_disk else 0.0):
            self.undo()
        elif self.record["kind"] == "disk_full":
            assert self.disk is not None
            self.record["refilled_bytes"] = self.record.get("refilled_bytes", 0) + self.disk.fill()

    def undo(self) -> None:
        """Heal the partition or free the disk; the record gets `resumed_wall`."""
        if self.record is None:
            return
        if self.record["kind"] == "partition":
            assert self.partitions is not None
            self.partitions.heal()
        else:
            assert self.disk is not None
            self.disk.free()
        self.record["resumed_wall"] = time.time()
        self.until, self.record = None, None

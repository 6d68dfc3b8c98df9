"""Where the outer exchange crosses between the worker's device and the host: two places only.

Only the replica (θ, φ, δ and the inner optimizer's state) lives on the worker's device.
Everything the exchange does in between (encoding, the inbox, peer checks, the
correction's arithmetic) works on host float32 tensors, on background threads:

    training thread, outer step k    device -> host   our step-k contribution (a device
                                                      clone, copied on a side stream into
                                                      pinned memory; the thread does not wait)
    exchanger thread                 host             waits for that copy, encodes, checks
                                                      partners, computes the correction c,
                                                      pins it
    training thread, inner boundary  host -> device   c, then δ += c; φ += c; θ += c

The pure functions refuse a mix of devices (noloco_rt.device_check), so a tensor that
slips past this boundary fails loudly at its first use instead of inside torch.
Snapshots for joiners take the same device -> host path, from the training thread after
each outer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import PartsKind, contribution_parts, contribution_state
from workers.device import HostCopy, HostStaging


@dataclass(frozen=True)
class HostContribution:
    """Our outer-step contribution on its way to the host."""

    copy: HostCopy
    parts_kind: PartsKind

    def state(self) -> PeerOuterState:
        """The contribution as host float32 tensors, once the copy is done (exchanger thread)."""
        if self.copy.ready is not None:
            self.copy.ready()
        return contribution_state([t.float() for t in self.copy.tensors], self.parts_kind)


class ExchangeBoundary:
    """The outer exchange's two device crossings, for one worker's device."""

    def __init__(self, staging: HostStaging) -> None:
        self.staging = staging

    @classmethod
    def on(cls, device: torch.device | str) -> ExchangeBoundary:
        return cls(HostStaging(torch.device(device)))

    @property
    def device(self) -> torch.device:
        return self.staging.device

    def contribution_to_host(self, state: PeerOuterState) -> HostContribution:
        """Training thread, at the outer step: start copying our contribution (fresh tensors
        nobody modifies: the provisional step's clones) to the host; never waits."""
        parts, kind = contribution_parts(state)
        return HostContribution(self.staging.to_host(parts), kind)

    def weights_to_host(self, tensors: Sequence[torch.Tensor]) -> HostCopy:
        """Training thread: start copying live replica tensors (changed in place later) to the
        host, through clones on the device so the copy never races the next update."""
        return self.staging.to_host([t.detach().clone() for t in tensors])

    def ready_for_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Background thread: host tensors made ready for a copy that does not block the
        training thread (pinned, on CUDA)."""
        return [self.staging.pinned(t) for t in tensors]

    def to_device(self, tensors: Sequence[torch.Tensor], like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Training thread, at an inner-step boundary: host tensors onto the replica's device,
        in the dtype of `like` (the replica's own tensors they will be added to)."""
        return self.staging.copy_to_device(list(tensors), list(like))

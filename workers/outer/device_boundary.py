"""Where the outer exchange crosses between the worker's device and the host: two places only.

Only the replica (θ, φ, δ and the inner optimizer's state) lives on the worker's device.
Everything the exchange does in between (encoding, the inbox, peer checks, the
correction's arithmetic) works on host float32 tensors, on background threads:

    training thread, outer step k    device -> host   our step-k contribution (a device
                                                      clone, copied on a side stream into
                                                      pinned memory; the thread does not wait;
                                                      on a GPU with a blockwise codec,
                                                      quantised there first: its codes too)
    exchanger thread                 host             waits for that copy, encodes, checks
                                                      partners, computes the correction c,
                                                      pins it
    training thread, inner boundary  host -> device   c, then δ += c; φ += c; θ += c

The pure functions refuse a mix of devices (noloco_rt.outer.device_check), so a tensor that
slips past this boundary fails loudly at its first use instead of inside torch.
Snapshots for joiners take the same device -> host path, from the training thread after
each outer step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from noloco_rt.outer.codecs import codec_named
from noloco_rt.outer.codecs.quantized import (
    BlockQuantizedCodec,
    QuantizedTensor,
    dequantize,
    quantize,
)
from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import PartsKind, contribution_parts, contribution_state
from workers.device import HostCopy, HostStaging

QUANTIZE_PIECE = 1 << 22
"""Elements quantised at once on the device (a multiple of BLOCK_SIZE): bounds the float64
temporaries of a large tensor (an embedding) to 64 MiB."""


def quantizes_on_device(device_type: str, codec: str, *, faults_on: bool) -> str | None:
    """The codec a worker quantises its contribution with on its device, or None (pure): a
    GPU, a blockwise quantised worker.snapshot_codec, and no test faults injected into what
    we send (those apply to host tensors)."""
    if device_type != "cuda" or faults_on or not isinstance(codec_named(codec), BlockQuantizedCodec):
        return None
    return codec


@dataclass(frozen=True)
class HostContribution:
    """Our outer-step contribution on its way to the host."""

    copy: HostCopy
    parts_kind: PartsKind
    quantized_with: str | None = None
    """The blockwise codec it was quantised with on the device, if it was: then `copy` holds
    the values as partners will decode them (x̂), then each part's scales, then its codes."""

    def state(self) -> PeerOuterState:
        """The contribution as host float32 tensors, once the copy is done (exchanger thread):
        quantised on the device, the values partners decode (what the correction averages)."""
        if self.copy.ready is not None:
            self.copy.ready()
        tensors = self.copy.tensors[:self._parts()]
        return contribution_state([t.float() for t in tensors], self.parts_kind)

    def quantized(self) -> list[QuantizedTensor] | None:
        """Each part's flat scales and codes when quantised on the device (after `state`)."""
        if self.quantized_with is None:
            return None
        n = self._parts()
        tensors = self.copy.tensors
        return [QuantizedTensor(s, c) for s, c in zip(tensors[n:2 * n], tensors[2 * n:], strict=True)]

    def _parts(self) -> int:
        return len(self.copy.tensors) // 3 if self.quantized_with is not None else len(self.copy.tensors)


class ExchangeBoundary:
    """The outer exchange's two device crossings, for one worker's device."""

    def __init__(self, staging: HostStaging, *, quantize_codec: str | None = None) -> None:
        self.staging = staging
        self.quantize_codec = quantize_codec
        """Quantise whole-state contributions on the device with this codec (quantizes_on_device)."""
        self._generator: torch.Generator | None = None

    @classmethod
    def on(cls, device: torch.device | str, *, quantize_codec: str | None = None) -> ExchangeBoundary:
        return cls(HostStaging(torch.device(device)), quantize_codec=quantize_codec)

    @property
    def device(self) -> torch.device:
        return self.staging.device

    def contribution_to_host(self, state: PeerOuterState, *, sparse: bool = False) -> HostContribution:
        """Training thread, at the outer step: start copying our contribution (fresh tensors
        nobody modifies: the provisional step's clones) to the host; never waits. With a
        quantize_codec (not in a `sparse` round: that has a codec of its own), quantise
        it here first, so the host packs codes instead of rounding 4-byte floats."""
        parts, kind = contribution_parts(state)
        if self.quantize_codec is None or sparse:
            return HostContribution(self.staging.to_host(parts), kind)
        family = codec_named(self.quantize_codec)
        assert isinstance(family, BlockQuantizedCodec)
        values, scales, codes = [], [], []
        for part in parts:
            flat = part.detach().reshape(-1).float()
            quantized = [quantize(flat[i:i + QUANTIZE_PIECE], family.max_code, self._rounding())
                         for i in range(0, flat.numel(), QUANTIZE_PIECE)]
            part_scales = torch.cat([q[0] for q in quantized]) if quantized else flat.new_empty(0)
            part_codes = torch.cat([q[1] for q in quantized]) if quantized else flat.new_empty(0, dtype=torch.int8)
            values.append(dequantize(part_scales, part_codes).reshape(part.shape))
            scales.append(part_scales)
            codes.append(part_codes)
        return HostContribution(self.staging.to_host(values + scales + codes), kind, self.quantize_codec)

    def _rounding(self) -> torch.Generator:
        """The stochastic rounding's generator on our device, seeded from os.urandom (not the
        global one: training's own random numbers stay as they were)."""
        if self._generator is None:
            self._generator = torch.Generator(self.device).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        return self._generator

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

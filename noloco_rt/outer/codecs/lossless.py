"""Codecs that keep every bit: raw, zstd, shuffle-zstd (and the byte-plane machinery the
bf16 family reuses).

zstd alone barely shrinks float32 weights (the low mantissa bytes look random); grouping
byte k of every element together (shuffle) exposes the repetitive sign and exponent bytes
to zstd. Shuffling is per tensor, so a plane never straddles two tensors of different
item sizes.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from noloco_rt.outer.codecs.base import Codec, TensorSpec, byte_view, planes, tensor_from_bytes


class ElementCodec(Codec):
    """Each element travels whole in a wire dtype (its own by default), bytes optionally
    shuffled into planes."""

    shuffled: ClassVar[bool] = False

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """What an element of `dtype` travels as."""
        return dtype

    def body_bytes(self, spec: TensorSpec) -> int:
        return spec.numel * self.wire_dtype(spec.torch_dtype).itemsize

    def encode(self, tensor: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
        wire = tensor.to(self.wire_dtype(tensor.dtype))
        data = byte_view(wire)  # (numel * itemsize,), a view, no copy
        return planes(data, wire.element_size(), shuffled=True) if self.shuffled else data

    def decode(self, chunk: np.ndarray, spec: TensorSpec) -> torch.Tensor:
        wire_dtype = self.wire_dtype(spec.torch_dtype)
        # One copy per tensor: unshuffling copies anyway, and the copy makes the tensor
        # writable and independent of the payload.
        data = planes(chunk, wire_dtype.itemsize, shuffled=False) if self.shuffled else chunk.copy()
        return tensor_from_bytes(data, wire_dtype, tuple(spec.shape)).to(spec.torch_dtype)


class RawCodec(ElementCodec):
    """The bytes as they are, no frame."""

    name = "raw"
    framed = False


class ZstdCodec(ElementCodec):
    """The bytes as they are in one zstd frame."""

    name = "zstd"


class ShuffleZstdCodec(ElementCodec):
    """Byte planes of each tensor, then one zstd frame."""

    name = "shuffle-zstd"
    shuffled = True

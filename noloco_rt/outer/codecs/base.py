"""The codec interface and the types every family shares (pure, no I/O).

A codec family turns one tensor into a chunk of bytes of a size it states in advance
from the tensor's spec alone (shape and dtype), and back. encode_tensors/decode_tensors
(noloco_rt.outer.codec) join the chunks of a snapshot into one body, compress it when the
family asks for it, and check every size against the specs before allocating anything:
that is why `body_bytes` must be exact.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from noloco_rt.net.wire import ALLOWED_DTYPES


class CodecError(ValueError):
    """A payload cannot be encoded or decoded: the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype name of one tensor as the caller gave it (before any lossy cast)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return ALLOWED_DTYPES[self.dtype]

    def validate(self) -> None:
        """Raise CodecError unless the dtype is allowed and every dimension is an int >= 0."""
        if not isinstance(self.dtype, str) or self.dtype not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {self.dtype!r} is not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        if not isinstance(self.shape, tuple | list) or not all(
            isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in self.shape
        ):
            raise CodecError(f"shape {self.shape!r} is not a sequence of non-negative ints")


@dataclass(frozen=True)
class EncodedTensors:
    """One compressed payload for a list of tensors, with what a receiver needs to check it."""

    codec: str
    specs: list[TensorSpec]
    payload: bytes
    raw_bytes: int
    """Size of the tensors as given (for float32 weights: their float32 size)."""
    wire_bytes: int
    """len(payload): what travels."""

    @property
    def ratio(self) -> float:
        """raw_bytes / wire_bytes (> 1 when the codec saved bytes)."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("inf")


class Codec(ABC):
    """One family of snapshot codecs: how one tensor becomes bytes and back."""

    name: ClassVar[str]
    framed: ClassVar[bool] = True
    """The chunks of all tensors go into one zstd frame (False: they travel as they are)."""
    lossless: ClassVar[bool] = True
    """decode(encode(t)) is bit-identical to t for every allowed tensor."""
    stochastic: ClassVar[bool] = False
    """encode draws from the generator it is given (stochastic rounding)."""

    @abstractmethod
    def body_bytes(self, spec: TensorSpec) -> int:
        """Exact size of the chunk of a tensor of this (validated) spec; 0 when it is empty."""

    @abstractmethod
    def encode(self, tensor: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
        """The chunk (uint8, body_bytes of the tensor's spec) of a contiguous CPU tensor of
        an allowed dtype with at least one element. May be a view of the tensor's memory."""

    @abstractmethod
    def decode(self, chunk: np.ndarray, spec: TensorSpec) -> torch.Tensor:
        """The tensor of `spec` (writable, owning its memory) from its chunk (read-only uint8 of
        exactly body_bytes(spec) > 0 bytes). Raises CodecError on what the encoding cannot hold."""


def byte_view(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor with at least one element, as a uint8 view."""
    return tensor.reshape(-1).view(torch.uint8).numpy()  # (numel * itemsize,)


def tensor_from_bytes(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing `data` (a writable uint8 array this tensor may own) as dtype and shape."""
    return torch.from_numpy(data).view(dtype).reshape(shape)


def planes(data: bytes | memoryview | np.ndarray, itemsize: int, *, shuffled: bool) -> np.ndarray:
    """Copy of data with its byte planes grouped (shuffled=True) or regrouped into elements."""
    array = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if itemsize < 1:
        raise CodecError(f"itemsize must be >= 1, got {itemsize}")
    if len(array) % itemsize:
        raise CodecError(f"{len(array)} bytes is not a whole number of {itemsize}-byte elements")
    if itemsize == 1:
        return array.copy()
    shape = (-1, itemsize) if shuffled else (itemsize, -1)
    # (n, itemsize) -> (itemsize, n) for shuffle, the reverse for unshuffle. Always a copy
    # (never a view of data, even where the transpose happens to be contiguous): the result
    # must be C-contiguous for zstd and writable for torch.
    return array.reshape(shape).T.copy(order="C").reshape(-1)

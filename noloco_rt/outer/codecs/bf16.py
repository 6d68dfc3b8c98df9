"""bf16-shuffle-zstd: floating tensors rounded to bfloat16 (half the bytes, lossy), integers
as they are; byte planes per tensor, then one zstd frame. Floats come back in their
original dtype, their values rounded through bfloat16 (round to nearest even)."""

from __future__ import annotations

import torch

from noloco_rt.outer.codecs.lossless import ElementCodec


class Bf16ShuffleZstdCodec(ElementCodec):
    name = "bf16-shuffle-zstd"
    shuffled = True
    lossless = False

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.bfloat16 if dtype.is_floating_point else dtype

"""Snapshot codec families behind one interface (codecs.base.Codec), looked up by name
(in the order of codec_names.CODECS, which the config validates against).

lossless: raw, zstd, shuffle-zstd; bf16: bf16-shuffle-zstd; quantized: int8-zstd,
int4-zstd and int2-zstd (blockwise scales, stochastic rounding); sparse: topk2-zstd and topk4-zstd (outer
gradients only). A new codec is a new class here.
"""

from __future__ import annotations

from noloco_rt.config.choices import CODECS
from noloco_rt.outer.codecs.base import Codec, CodecError
from noloco_rt.outer.codecs.bf16 import Bf16ShuffleZstdCodec
from noloco_rt.outer.codecs.lossless import RawCodec, ShuffleZstdCodec, ZstdCodec
from noloco_rt.outer.codecs.quantized import Int2ZstdCodec, Int4ZstdCodec, Int8ZstdCodec
from noloco_rt.outer.codecs.sparse import TopK2Codec, TopK4Codec

FAMILIES: dict[str, Codec] = {codec.name: codec for codec in (
    RawCodec(), ZstdCodec(), ShuffleZstdCodec(), Bf16ShuffleZstdCodec(), Int8ZstdCodec(), Int4ZstdCodec(), Int2ZstdCodec(),
    TopK2Codec(), TopK4Codec())}


def codec_named(name: str) -> Codec:
    """The codec called `name`; CodecError for an unknown one."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise CodecError(f"unknown codec {name!r}; known: {', '.join(CODECS)}")
    return FAMILIES[name]


def is_lossless(name: str) -> bool:
    """Whether `name` gives back every tensor bit for bit."""
    return codec_named(name).lossless

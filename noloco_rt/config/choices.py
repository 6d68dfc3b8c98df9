"""The snapshot codecs and the data path's wire dtypes by name, apart from their implementation,
and the form of a worker's site label (worker.site, checked again in every member record).

The config validates worker.snapshot_codec against this list, and the config is read by
every command; keeping the names here spares that path numpy, torch and zstandard.
"""

import re

SITE_PATTERN = re.compile(r"[A-Za-z0-9._-]{0,63}")
"""worker.site: empty, or a short label (fullmatch)."""

SNAPSHOT_CODECS = ("raw", "zstd", "shuffle-zstd", "bf16-shuffle-zstd", "int8-zstd", "int4-zstd", "int2-zstd")
"""Codecs of a whole state (θ, or φ and Δ): worker.snapshot_codec."""

DELTA_CODECS = ("topk2-zstd", "topk4-zstd")
"""Sparse codecs of an outer gradient Δ alone: worker.delta_codec (noloco_rt.outer.delta_exchange)."""

CODECS = SNAPSHOT_CODECS + DELTA_CODECS
"""Every codec a received snapshot may name."""

LOSSLESS_CODECS = ("raw", "zstd", "shuffle-zstd")
"""Those that give back exactly the bits sent: the only ones a joiner's bootstrap may use."""

WIRE_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
"""How activations and gradients may travel (pipeline.wire_dtype; noloco_rt.net.wire_dtype)."""
GRADIENT_WIRE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
"""How gradients may travel (pipeline.gradient_wire_dtype; auto follows wire_dtype)."""

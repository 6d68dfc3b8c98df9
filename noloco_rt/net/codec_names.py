"""The snapshot codecs by name, apart from their implementation.

The config validates worker.snapshot_codec against this list, and the config is read by
every command; keeping the names here spares that path numpy, torch and zstandard.
"""

CODECS = ("raw", "zstd", "shuffle-zstd", "bf16-shuffle-zstd", "int8-zstd", "int4-zstd")

LOSSLESS_CODECS = ("raw", "zstd", "shuffle-zstd")
"""Those that give back exactly the bits sent: the only ones a joiner's bootstrap may use."""

"""The largest frame each receiving socket of a worker takes (ZMQ_MAXMSGSIZE), from the run's
config (pure).

ZeroMQ drops a connection whose next frame declares more than this, before it allocates the
frame and before CURVE has authenticated anyone: a stranger who reaches a port cannot make a
worker reserve gigabytes by declaring a huge frame and trickling bytes into it. The bound is
the largest honest frame, with room to spare.
"""

from __future__ import annotations

from noloco_rt.config import Config
from noloco_rt.config.presets import PRESETS
from noloco_rt.outer.chunks import ALIGN
from noloco_rt.outer.codecs.sparse import CHUNK as SPARSE_CHUNK

SLACK_BYTES = 1 << 20
"""Headers, codec framing and compression's worst case on top of the payload."""
OWN_MODEL_DATA_FRAME_BYTES = 1 << 30
"""A model of your own: its activations' size is not known ahead, so the wire's own bound
(noloco_rt.net.messages.DATA_LIMITS) is the socket's too."""


def data_frame_limit_bytes(cfg: Config) -> int:
    """The data socket: an activation or gradient frame of one microbatch, (B, T, C) at 4
    bytes an element at most (the wire dtypes are 1 to 4), or a model of your own's bound."""
    if cfg.model.factory:
        return OWN_MODEL_DATA_FRAME_BYTES + SLACK_BYTES
    dim = PRESETS[cfg.model.preset].dim
    return cfg.data.batch_size * cfg.model.seq_len * dim * 4 + SLACK_BYTES


def exchange_frame_limit_bytes(cfg: Config) -> int:
    """The exchange socket: one chunk of a partner's push (worker.snapshot_chunk_mb of
    float32 elements, at least a sparse codec's chunk), twice over for any codec's overhead;
    requests and answers are a few hundred bytes."""
    chunk_elems = max(ALIGN, int(cfg.worker.snapshot_chunk_mb * (1 << 20)) // 4, SPARSE_CHUNK)
    return 2 * 4 * chunk_elems + SLACK_BYTES

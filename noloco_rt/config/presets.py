"""The model presets' shapes, apart from the model: the config validates a preset by name
and sizes a deployment by its shape without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    dim: int
    n_layers: int
    n_heads: int
    ffn_multiple: int = 32
    """SwiGLU hidden size is 8/3·dim rounded up to this multiple."""

    @property
    def ffn_dim(self) -> int:
        hidden = int(8 * self.dim / 3)
        return self.ffn_multiple * math.ceil(hidden / self.ffn_multiple)


PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(dim=64, n_layers=4, n_heads=4),  # ~0.23M parameters with a 256 vocabulary
    "small": ModelShape(dim=256, n_layers=6, n_heads=8),  # ~4.8M
    "125m": ModelShape(dim=768, n_layers=12, n_heads=12),
    "1b": ModelShape(dim=2048, n_layers=24, n_heads=32, ffn_multiple=256),
    "7b": ModelShape(dim=4096, n_layers=32, n_heads=32, ffn_multiple=256),
}

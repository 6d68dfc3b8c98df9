"""noloco-rt: elastic NoLoCo training over slow, unreliable networks."""

__version__ = "0.1.0"

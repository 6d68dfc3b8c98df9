"""Whether a worker's sockets would be open to anyone: bound beyond loopback without CURVE (pure)."""

from __future__ import annotations

from noloco_rt.config.runtime import NetworkConfig

LOOPBACK_NAMES = frozenset({"localhost", "::1"})


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_NAMES or host.startswith("127.")


def open_door(network: NetworkConfig) -> str | None:
    """The one-line refusal for a worker bound beyond loopback without CURVE keys and without
    network.trusted_network; None when it may start."""
    curve = bool(network.curve_key_dir or network.curve_secret_key)
    if curve or network.trusted_network or is_loopback(network.bind_host):
        return None
    return (f"network.bind_host = {network.bind_host!r} without CURVE keys: anyone who reaches these ports could "
            f"feed this worker microbatches and snapshots (poison the model) and download its weights. Give the "
            f"run keys (noloco-rt keys generate; network.curve_key_dir), or set network.trusted_network = true "
            f"on a network nobody else reaches")

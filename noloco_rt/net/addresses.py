"""Peer addresses as they arrive from Redis or in a message (pure).

A worker connects to the addresses other workers advertise: `tcp://HOST:PORT`, nothing
else. Anything else (`ipc://`, `inproc://`, a path, a space, a port out of range) is
refused where it is read, so whoever can write Redis or forge a reply address cannot make
a worker connect to a local socket or pass ZeroMQ a string it would misread.
"""

from __future__ import annotations

import ipaddress
import re

MAX_ADDRESS_LENGTH = 300
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_ADDRESS = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):(\d{1,5})$")


def peer_address_problem(text: object) -> str | None:
    """Why `text` is not a peer address (tcp://HOST:PORT, HOST a DNS name, an IPv4 address or
    a bracketed IPv6 one, PORT 1-65535), or None when it is one."""
    if not isinstance(text, str):
        return f"{type(text).__name__}, not a string"
    if len(text) > MAX_ADDRESS_LENGTH:
        return f"{len(text)} characters"
    match = _ADDRESS.match(text)
    if match is None:
        return f"{text[:60]!r} is not tcp://HOST:PORT"
    host, port = match.group(1), int(match.group(2))
    if not 1 <= port <= 65535:
        return f"port {port} is out of range"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host!r} is not an IPv6 address"
    elif not _HOSTNAME.match(host):
        return f"{host[:60]!r} is not a host name or address"
    return None

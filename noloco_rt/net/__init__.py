"""Bytes and sockets: wire format, data-path messages, the data link, transport, CURVE."""

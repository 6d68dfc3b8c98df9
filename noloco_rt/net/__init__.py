"""Bytes and sockets: wire format, codecs, snapshots, data-path messages, transport, CURVE."""

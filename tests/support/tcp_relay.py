"""A TCP port forwarder on loopback, as a router's NAT rule: connections to `port` are relayed
byte for byte to `target_port`. Counts the bytes each way, so a test sees traffic went through."""

from __future__ import annotations

import socket
import threading

from noloco_rt.membership.embedded_redis import free_port


class TcpRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.bytes_in = 0
        """From the connecting side to the target."""
        self.bytes_out = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @classmethod
    def to_a_free_port(cls) -> TcpRelay:
        """A relay to a port nobody binds yet: the worker binds it (network.*_port) later."""
        return cls(free_port())

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()  # the target is not up yet: ZeroMQ reconnects
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, inbound: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                with self._lock:
                    if inbound:
                        self.bytes_in += len(data)
                    else:
                        self.bytes_out += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

"""A small threaded HTTP server that a slow or silent client cannot hold open: the status and
metrics endpoints of workers and the coordinator, which anyone who reaches the port may call.

Each connection gets TIMEOUT_S of silence at most before it is closed, and at most
MAX_CONNECTIONS are served at once; a connection beyond that is closed at once and counted.
Before, 300 half-sent requests held 300 threads 20 s later.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    """The listen backlog: a burst is accepted, then held to MAX_CONNECTIONS here."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 timeout_s: float = TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(address, handler)
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self.active = 0
        """Connections being served now."""
        self.served = 0
        """Connections served so far (each in a thread of its own)."""
        self.turned_away = 0
        """Connections closed at once: MAX_CONNECTIONS were being served."""

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.turned_away += 1
            self.shutdown_request(request)
            return
        request.settimeout(self.timeout_s)  # a read or write that waits longer ends the connection
        with self._lock:
            self.active += 1
            self.served += 1
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: give the slot back here
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is not an error worth a traceback; a bug is."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def _release(self) -> None:
        with self._lock:
            self.active -= 1
        self._slots.release()


def send_body(handler: BaseHTTPRequestHandler, body: bytes, content_type: str) -> None:
    """A 200 answer carrying `body` (the status and metrics handlers' one reply)."""
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def serve_in_thread(server: BoundedHTTPServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread


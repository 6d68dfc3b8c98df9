"""The status and metrics endpoints cost a slow client little: a connection silent for the
timeout is closed, at most MAX_CONNECTIONS are served at once and the rest are closed at
once, and a normal request is answered meanwhile. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import urllib.request
from http.server import BaseHTTPRequestHandler

from noloco_rt.net.http_server import TIMEOUT_S, BoundedHTTPServer, serve_in_thread
from tests.support.waiting import wait_until
from workers.metrics import WorkerMetrics


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *_: object) -> None:
        pass


def test_half_sent_requests_are_closed_after_the_timeout_and_extra_ones_turned_away():
    server = BoundedHTTPServer(("127.0.0.1", 0), _Hello, timeout_s=2.0, max_connections=4)
    serve_in_thread(server, "probe-http")
    port = server.server_address[1]
    slow = []
    try:
        for _ in range(12):  # each stalled mid-header
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            slow.append(client)
        wait_until(lambda: server.served + server.turned_away == 12, 5.0)
        assert server.served == 4 and server.turned_away == 8  # held to 4, the rest closed at once
        wait_until(lambda: server.active == 0, 10.0)  # each closed after 2 s of silence
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
            assert reply.read() == b"hello"
    finally:
        for client in slow:
            client.close()
        server.shutdown()
        server.server_close()


def test_the_coordinators_status_endpoint_is_a_bounded_server():
    from coordinator.server import StatusServer

    status = StatusServer("127.0.0.1", 0, status_json=lambda: {"ok": True}, registry=WorkerMetrics().registry)
    status.start()
    try:
        assert isinstance(status.httpd, BoundedHTTPServer) and status.httpd.timeout_s == TIMEOUT_S
        with urllib.request.urlopen(f"http://127.0.0.1:{status.port}/status", timeout=5) as reply:
            assert reply.read() == b'{"ok": true}'
    finally:
        status.stop()


def test_a_workers_metrics_endpoint_serves_its_registry():
    metrics = WorkerMetrics()
    metrics.tokens.inc(5)
    port = metrics.serve(0, host="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert b"noloco_tokens_total 5.0" in reply.read()

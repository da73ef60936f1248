"""The `/metrics` HTTP server: prometheus_client's WSGI app, served by a bounded number of threads.

prometheus_client's own `start_http_server` starts a thread per connection, which lives as long
as the connection stays open: 3,000 idle connections to a rank's port made 3,002 threads in the
trainer. Here one thread waits on every connection at once (`selectors`) and hands a connection
to one of `WORKERS` threads only once its request has arrived; a connection that sends nothing
for `IDLE_S` is closed, as is the oldest waiting one when more than `MAX_WAITING` wait, and a
request that trickles in holds its worker at most `REQUEST_S`. So the trainer runs at most
`WORKERS + 1` threads for `/metrics`, and a scrape is served while idle connections pile up.
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

WORKERS = 2  # threads answering requests (a scrape takes milliseconds)
MAX_WAITING = 256  # connections waiting for their request; past it the oldest is closed
IDLE_S = 10.0  # a connection that sends no request in this long is closed
REQUEST_S = 10.0  # the longest a worker waits on a request that has started to arrive


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr; a request that stalls times out (`REQUEST_S`)."""

    timeout = REQUEST_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedWSGIServer(WSGIServer):
    """A WSGI server whose threads are bounded (see the module doc); `serve_forever` in one thread,
    `shutdown()` from another, as with the standard library's servers."""

    request_queue_size = 128  # connections the kernel holds until accepted (socketserver's 5 drops SYNs in a burst)

    def __init__(self, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="hp_otel-metrics")  # threads made on demand
        self._waiting: collections.OrderedDict[socket.socket, tuple[Any, float]] = collections.OrderedDict()
        self._wake_r, self._wake_w = os.pipe()  # before binding: a port that fails closes them (server_close)
        self._stopping = False
        self._serving = False
        self._stopped = threading.Event()
        super().__init__(address, _QuietHandler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ, "listen")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            try:
                while not self._stopping:
                    for key, _ in selector.select(timeout=1.0):
                        if key.data == "listen":
                            self._accept(selector)
                        elif key.data == "request":
                            selector.unregister(key.fileobj)
                            connection = key.fileobj
                            address, _ = self._waiting.pop(connection)  # type: ignore[call-overload]
                            self._pool.submit(self._answer, connection, address)
                    self._close_idle(selector, time.monotonic())
            finally:
                for connection in list(self._waiting):
                    self._close(connection)
                self._waiting.clear()
                self._stopped.set()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        """Every connection the kernel holds (the listening socket does not block)."""
        for _ in range(self.request_queue_size):
            try:
                connection, address = self.socket.accept()
            except OSError:  # none left (EAGAIN), the client went away, or no descriptor left
                return
            connection.setblocking(True)
            self._wait_for_request(selector, connection, address)

    def _wait_for_request(self, selector: selectors.BaseSelector, connection: socket.socket, address: Any) -> None:
        if len(self._waiting) >= MAX_WAITING:
            oldest = next(iter(self._waiting))
            selector.unregister(oldest)
            del self._waiting[oldest]
            self._close(oldest)
        self._waiting[connection] = (address, time.monotonic() + IDLE_S)
        selector.register(connection, selectors.EVENT_READ, "request")

    def _close_idle(self, selector: selectors.BaseSelector, now: float) -> None:
        while self._waiting:
            connection, (_, deadline) = next(iter(self._waiting.items()))
            if deadline > now:  # in arrival order: the rest arrived later
                return
            selector.unregister(connection)
            del self._waiting[connection]
            self._close(connection)

    def _answer(self, connection: socket.socket, address: Any) -> None:
        try:
            self.finish_request(connection, address)
        except Exception:  # a client that went away mid-answer: nothing to tell anyone
            pass
        finally:
            self.shutdown_request(connection)

    @staticmethod
    def _close(connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            connection.close()

    def shutdown(self) -> None:
        """Stop `serve_forever` (from another thread) and wait for it and the workers."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._serving:
            self._stopped.wait(5.0)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def start_metrics_server(port: int, host: str) -> tuple[BoundedWSGIServer, threading.Thread]:
    """Serve prometheus_client's default registry (where the OTel PrometheusMetricReader puts the
    metrics) on `host:port` from a daemon thread, as `prometheus_client.start_http_server` does."""
    from prometheus_client import REGISTRY, make_wsgi_app

    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    server = BoundedWSGIServer((str(address[0]), int(address[1])), family)
    server.set_app(make_wsgi_app(REGISTRY))
    thread = threading.Thread(target=server.serve_forever, name="hp_otel-metrics-server", daemon=True)
    thread.start()
    return server, thread

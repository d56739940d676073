"""An HTTP proxy on 127.0.0.1 that answers every `every`-th request 503 instead of
forwarding it: put in front of a store's emulator, it shows that the store's client
retries (a store that does not retry fails the write or read)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class FlakyProxy:
    def __init__(self, upstream: str, every: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.every = every
        self.seen = 0
        self.failed: list[str] = []  # "METHOD path" of each request answered 503
        self.lock = threading.Lock()
        self.client = httpx.Client(timeout=30)

    def fail_this(self, what: str) -> bool:
        with self.lock:
            self.seen += 1
            if self.seen % self.every == 0:
                self.failed.append(what)
                return True
        return False


def _handler(proxy: FlakyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if proxy.fail_this(f"{self.command} {self.path.split('?')[0]}"):
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            # The upstream sees the proxy's host, so URLs it answers with (a resumable
            # upload's Location) point back through the proxy.
            headers["Host"] = self.headers.get("Host", "")
            r = proxy.client.request(self.command, proxy.upstream + self.path, content=body, headers=headers)
            data = r.content
            self.send_response(r.status_code)
            for k, v in r.headers.items():
                if k.lower() not in HOP and k.lower() != "content-encoding":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def flaky_proxy(upstream: str, every: int = 3) -> Iterator[tuple[str, FlakyProxy]]:
    proxy = FlakyProxy(upstream, every)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", proxy
    finally:
        server.shutdown()
        server.server_close()
        proxy.client.close()

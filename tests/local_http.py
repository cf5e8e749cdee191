"""A real HTTP server on 127.0.0.1 for one test: a handler class in a thread, on a free port.

    class FakeServer(LocalServer):
        def __init__(self):
            class Handler(BaseHTTPRequestHandler): ...
            super().__init__(Handler)          # self.url = "http://127.0.0.1:<port>/v1"
    server = FakeServer(); ...; server.close()
"""

import threading
from http.server import ThreadingHTTPServer


class LocalServer:
    """`handler` served on 127.0.0.1 (a free port) from a daemon thread until `close()`."""

    def __init__(self, handler, path: str = "/v1"):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

"""A real HTTP server on 127.0.0.1 for one test: a handler class in a thread, on a free port.

    class FakeServer(LocalServer):
        def __init__(self):
            class Handler(BaseHTTPRequestHandler): ...
            super().__init__(Handler)          # self.url = "http://127.0.0.1:<port>/v1"
    server = FakeServer(); ...; server.close()
"""

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def send_json(handler: BaseHTTPRequestHandler, status: int, payload) -> None:
    """Answer the handler's request with HTTP `status` and `payload` as a JSON body."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """Terminate a server process, killing it if it does not exit within `timeout` s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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

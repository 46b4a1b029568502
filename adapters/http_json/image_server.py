"""The loopback file server of ``image: url, serve: local``: the service under test fetches
each image from a URL the adapter serves, under an unguessable name that lives only for the
request that uses it.
"""

from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Seconds a connection to the image server may stay silent before it is closed.
IDLE_TIMEOUT_S = 10.0


class ImageServer:
    """A tiny HTTP file server on loopback (image: url, serve: local): each image is served
    under an unguessable name for the duration of its request, then forgotten."""

    def __init__(self, host: str, port: int, public_base: str, *,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        images: dict[str, tuple[bytes, str]] = {}
        self._images = images

        class Handler(BaseHTTPRequestHandler):
            # a client that connects and sends nothing (or drips) is dropped, not served by
            # a thread of its own for ever
            timeout = idle_timeout_s

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                entry = images.get(self.path.rsplit("/", 1)[-1])
                if entry is None:
                    self.send_error(404)
                    return
                data, mime = entry
                self.send_response(200)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        if isinstance(bound_host, bytes):
            bound_host = bound_host.decode()
        self.base = public_base or f"http://{bound_host}:{bound_port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="http-json-image-server", daemon=True)
        self._thread.start()

    def put(self, data: bytes, mime: str) -> tuple[str, str]:
        name = secrets.token_urlsafe(18) + (".png" if mime == "image/png" else ".jpg")
        self._images[name] = (data, mime)
        return name, f"{self.base}/images/{name}"

    def remove(self, name: str) -> None:
        self._images.pop(name, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

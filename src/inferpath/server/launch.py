"""Running the app under uvicorn: in the foreground (``inferpath serve``) or in a
background thread (tests, benchmarks).

``ServerThread`` binds its socket before uvicorn starts, so port 0 gives a free port with
no race, and ``start()`` returns only once the lifespan (engine start) has completed.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class ServerThread:
    """uvicorn serving ``app`` from a daemon thread on ``host:port`` (0 = a free port).

    Use as a context manager, or ``start()`` / ``stop()``. ``url`` is the base URL
    (``http://127.0.0.1:PORT``) once started.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    def start(self, timeout: float = 120.0) -> "ServerThread":
        """Start serving; raise if the server has not started within ``timeout`` seconds."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited during startup"
                                   + (f": {self._error!r}" if self._error else ""))
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server on port {self.port} did not start in {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit (it runs the lifespan shutdown) and wait for the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5.0)
        self._socket.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, before anything slow happens (a server that loads
    its model first would find the port taken only minutes later). OSError naming the
    address when it is taken or not ours to bind."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {exc.strerror or exc}; is another server "
                      "running there? choose another --port") from None
    return sock


def serve_forever(app: Any, sock: socket.socket, log_level: str = "info") -> None:
    """Serve ``app`` on the bound ``sock`` in the foreground until interrupted (Ctrl-C)."""
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=30)
    uvicorn.Server(config).run(sockets=[sock])

"""`gpuflame serve`'s server run on a thread of the test, on loopback, and stopped after it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from gpuflame.serve.app import Server


@contextmanager
def serving(srv: Server) -> Iterator[Server]:
    """*srv* answering on its own thread for the block; shut down and closed at its end."""
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)

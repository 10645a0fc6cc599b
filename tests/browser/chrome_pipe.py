"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

Chromium reads commands from its file descriptor 3 and writes replies and
events to descriptor 4, as NUL-terminated JSON. That needs no websocket
library, no chromedriver and no TCP port, only the ``chromium`` binary.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")

# Flags that keep a headless Chromium from talking to anything on its own.
QUIET_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--mute-audio",
)


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    pass


class Chrome:
    """One headless Chromium with one page attached (flattened session)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        self.profile_dir = tempfile.mkdtemp(prefix="gpuflame-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def map_fds() -> None:  # runs in the child: its fd 3 reads, fd 4 writes
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = [
            binary,
            *QUIET_FLAGS,
            f"--user-data-dir={self.profile_dir}",
            f"--window-size={width},{height}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(  # noqa: S603 - a fixed local binary
            args,
            pass_fds=(3, 4),
            preexec_fn=map_fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.session = self._attach_page()

    # -- protocol ----------------------------------------------------------

    def _read_loop(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._lock.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                with self._lock:
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                    self._lock.notify_all()

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = "page", timeout: float = 30.0
    ) -> dict[str, Any]:
        """Send a command and wait for its result; *session* ``None`` means the browser."""
        with self._lock:
            self._next_id += 1
            mid = self._next_id
        message: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session == "page":
            message["sessionId"] = self.session
        elif session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._lock:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise CdpError(f"no reply to {method}")
                self._lock.wait(min(left, 0.5))
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def _attach_page(self) -> str:
        deadline = time.monotonic() + 20
        while True:
            targets = self.send("Target.getTargets", session=None)["targetInfos"]
            pages = [t for t in targets if t["type"] == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pages:
            raise CdpError("chromium opened no page")
        result = self.send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True}, session=None)
        return result["sessionId"]

    # -- page helpers ------------------------------------------------------

    def evaluate(self, expression: str, timeout: float = 30.0, session: str = "page") -> Any:
        """The value of a JavaScript expression in the page, or in an attached frame's *session* (promises awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=session,
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise CdpError(f"page threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0, session: str = "page") -> Any:
        """Poll until *expression* is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression, session=session)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def click(self, x: float, y: float, modifiers: int = 0, button: str = "left") -> None:
        """A mouse click; *modifiers* as CDP's bit field (8 = shift)."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": button, "clickCount": 1, "modifiers": modifiers},
            )

    def hover(self, x: float, y: float) -> None:
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", {"text": text})

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def events_named(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("method") == method]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=None, timeout=5)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile_dir, ignore_errors=True)

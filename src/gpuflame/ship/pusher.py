"""Pushing on a background thread, so a slow or absent Pyroscope never slows the workload.

The workload's threads only :meth:`Pusher.submit` (append to a bounded deque
under a lock: microseconds). One daemon thread prepares and sends. When the
server is slow or down, the queue keeps only the newest profiles (the oldest
are dropped and counted), retries back off exponentially with jitter and
honour ``Retry-After``, and memory stays bounded by the queue's size.
:meth:`Pusher.close` flushes what it can within its timeout and says once on
stderr what was sent, dropped and failed.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpuflame.defaults import PUSH_FLUSH_S
from gpuflame.ship.pyroscope import PushError

Send = Callable[[Any], None]
Prepare = Callable[[Any], Any]


class Pusher:
    """A bounded queue of profiles and the thread that sends them."""

    def __init__(
        self,
        send: Send,
        *,
        prepare: Prepare | None = None,
        queue_size: int = 4,
        attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        name: str = "pyroscope",
    ) -> None:
        self._send = send
        self._prepare = prepare
        self._queue: deque[Any] = deque()
        self._size = max(1, queue_size)
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._closing = False
        self._thread: threading.Thread | None = None
        self._busy = False
        self.sent = self.dropped = self.failed = 0
        self.last_error = ""
        self._said_failure = False
        self._reported = False

    # -- the workload's side --------------------------------------------------

    def submit(self, item: Any) -> None:
        """Queue *item* for sending; drops the oldest queued one when full. Never waits on the network."""
        with self._cond:
            if self._closing:
                self.dropped += 1
                return
            self._queue.append(item)
            if len(self._queue) > self._size:
                self._queue.popleft()
                self.dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"gpuflame-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = PUSH_FLUSH_S) -> None:
        """Send what is queued within *timeout* seconds, then report the counts once."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            # what the thread could not get to in time is lost: count it, once
            self.dropped += len(self._queue) + (1 if self._busy else 0)
            self._queue.clear()
            self._busy = False
        self.report()

    def report(self) -> None:
        """One line on stderr with the counts (once)."""
        if self._reported:
            return
        self._reported = True
        line = f"gpuflame: {self._name}: sent {self.sent}, dropped {self.dropped}, failed {self.failed}"
        if (self.dropped or self.failed) and self.last_error:
            line += f" (last error: {self.last_error})"
        _say(line)

    # -- the thread's side ----------------------------------------------------

    def _run(self) -> None:
        streak = 0
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._busy = True
            streak = self._deliver(item, streak)
            with self._cond:
                self._busy = False

    def _deliver(self, item: Any, streak: int) -> int:
        """Prepare once, send with retries; returns the failure streak that paces the next sends."""
        try:
            payload = self._prepare(item) if self._prepare is not None else item
        except Exception as exc:  # noqa: BLE001 - a bug here must not kill the thread
            self._failed(f"could not prepare the profile ({type(exc).__name__}: {exc})")
            return streak
        for attempt in range(self._attempts):
            try:
                self._send(payload)
            except PushError as exc:
                streak += 1
                retry = exc.retryable and attempt + 1 < self._attempts and not self._closing
                if not retry:
                    self._failed(str(exc))
                    return streak
                self._note(str(exc))
                if not self._sleep(self._delay(streak, exc.retry_after)):
                    self._failed(str(exc))
                    return streak
                continue
            except Exception as exc:  # noqa: BLE001
                self._failed(f"{type(exc).__name__}: {exc}")
                return streak
            with self._cond:
                self.sent += 1
            return 0
        return streak

    def _delay(self, streak: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; the server's Retry-After when it asks for longer."""
        base = min(self._max_backoff, self._backoff * (2 ** min(streak - 1, 16)))
        delay = base * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self._max_backoff))
        return delay

    def _sleep(self, seconds: float) -> bool:
        """Wait before a retry; False when close() was called meanwhile (no retry then)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closing, timeout=seconds)
            return not self._closing

    def _note(self, message: str) -> None:
        self.last_error = message
        if not self._said_failure:
            self._said_failure = True
            _say(f"gpuflame: {self._name}: push failed ({message}); retrying in the background")

    def _failed(self, message: str) -> None:
        with self._cond:
            self.failed += 1
        self._note(message)
        self.last_error = message


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not matter
        pass

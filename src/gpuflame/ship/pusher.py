"""Pushing on a background thread, so a slow or absent Pyroscope never slows the workload.

The workload's threads only :meth:`Pusher.submit` (append to a bounded deque
under a lock: microseconds). One daemon thread prepares and sends. When the
server is slow or down, the queue keeps only the newest profiles (the oldest
are dropped and counted), retries back off exponentially with jitter and
honour ``Retry-After``, and memory stays bounded by the queue's size.
:meth:`Pusher.close` flushes what it can within its timeout and says once on
stderr what was sent, dropped and failed, and why: each drop is counted under
its reason (the queue was full while a push waited or failed, the flush at
exit ran out), each failure under its kind (no answer in time, HTTP 401,
connection refused, an answer that is not HTTP: ``PushError.kind``). The
first failure of each kind is said when it happens, once.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from gpuflame.defaults import PUSH_FLUSH_S
from gpuflame.printable import printable
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
        self.last_error = self.last_kind = ""
        self.drops: Counter[str] = Counter()  # why profiles were dropped -> how many
        self.errors: Counter[str] = Counter()  # PushError.kind -> how many attempts failed so
        self._failing = False  # the last attempt failed (a full queue is then the failures' doing)
        self._reported = False

    # -- the workload's side --------------------------------------------------

    def submit(self, item: Any) -> None:
        """Queue *item* for sending; drops the oldest queued one when full. Never waits on the network."""
        with self._cond:
            if self._closing:
                self._drop("submitted after the pusher closed")
                return
            self._queue.append(item)
            if len(self._queue) > self._size:
                self._queue.popleft()
                self._drop(self._full_reason())
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
            unsent = len(self._queue) + (1 if self._busy else 0)
            if unsent:
                self._drop(f"still unsent when the {timeout:g} s flush at exit ran out", unsent)
            self._queue.clear()
            self._busy = False
        self.report()

    def report(self) -> None:
        """One line on stderr (once): the counts, why profiles were dropped, what kinds of failure happened."""
        if self._reported:
            return
        self._reported = True
        reasons = ", ".join(f"{n} {why}" for why, n in self.drops.items())
        dropped = f"dropped {self.dropped}" + (f" ({reasons})" if reasons else "")
        line = f"gpuflame: {self._name}: sent {self.sent}, {dropped}, failed {self.failed}"
        if self.errors:
            line += "; failed attempts: " + ", ".join(f"{kind} ({n})" for kind, n in self.errors.items())
            line += f"; last error: {self.last_error}"
        _say(line)

    def _drop(self, why: str, count: int = 1) -> None:
        """Count *count* profiles lost for *why* (the caller holds the lock)."""
        self.dropped += count
        self.drops[why] += count

    def _full_reason(self) -> str:
        """Why the queue overflowed: pushes failing and retried, or one push still waiting for an answer."""
        if self._failing:
            return f"because the queue ({self._size}) was full while pushes failed ({self.last_kind})"
        return f"because the queue ({self._size}) was full while a push waited for Pyroscope's answer"

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
            self._failed(
                PushError(
                    f"could not prepare the profile ({type(exc).__name__}: {exc})", kind="could not prepare the profile"
                )
            )
            return streak
        for attempt in range(self._attempts):
            try:
                self._send(payload)
            except PushError as exc:
                streak += 1
                retry = exc.retryable and attempt + 1 < self._attempts and not self._closing
                if not retry:
                    self._failed(exc)
                    return streak
                self._note(exc, retrying=True)
                if not self._sleep(self._delay(streak, exc.retry_after)):
                    self._failed(exc, counted=True)
                    return streak
                continue
            except Exception as exc:  # noqa: BLE001
                self._failed(PushError(f"{type(exc).__name__}: {exc}", kind=type(exc).__name__))
                return streak
            with self._cond:
                self.sent += 1
                self._failing = False
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

    def _note(self, exc: PushError, retrying: bool = False) -> None:
        """Count a failed attempt by its kind; the first of each kind is said at once."""
        with self._cond:
            first = exc.kind not in self.errors
            self.errors[exc.kind] += 1
            self.last_error, self.last_kind, self._failing = str(exc), exc.kind, True
        if first:
            then = "retrying in the background" if retrying else "this profile is not sent"
            _say(f"gpuflame: {self._name}: push failed ({exc}); {then}")

    def _failed(self, exc: PushError, counted: bool = False) -> None:
        """A profile given up on; *counted*: its last attempt was already noted."""
        with self._cond:
            self.failed += 1
        if not counted:
            self._note(exc)


def _say(line: str) -> None:
    try:
        sys.stderr.write(printable(line) + "\n")  # it may quote a server's answer
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not matter
        pass

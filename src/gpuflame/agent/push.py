"""The agent's snapshots to Pyroscope: one series per container, through the existing pusher.

The webhook's pods push with ``service_name`` = their workload and
``namespace``/``pod``/``container``/``node`` from the Downward API. The agent
sees many pods at once, so it splits each snapshot by those sample labels and
pushes each part with them as series labels: the same series, whichever way
a pod was profiled. Each part goes through its own
:class:`~gpuflame.ship.window.IntervalWindow` (per-interval values, as the
in-process pushers send).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from gpuflame.model import Profile
from gpuflame.ship.pusher import Pusher
from gpuflame.ship.pyroscope import Credentials, PyroscopeClient, workload_name
from gpuflame.ship.window import IntervalWindow

PLACEMENT = ("namespace", "pod", "container", "node")
QUEUE = 256  # series x intervals waiting to be sent; the oldest are dropped (and counted) beyond
FINAL_PUSH_S = 5.0  # at stop: the most seconds spent sending the last snapshot and what is still queued


def series_of(profile: Profile, service: str) -> dict[tuple[tuple[str, str], ...], Profile]:
    """Series labels (service_name and placement) -> the samples that carry them."""
    groups: dict[tuple[tuple[str, str], ...], list] = {}
    for s in profile.samples:
        labels = {k: v for k in PLACEMENT if (v := s.label(k))}
        name = service or (workload_name(labels["pod"]) if labels.get("pod") else s.label("comm") or "gpuflame-agent")
        key = tuple(sorted({"service_name": name, **labels}.items()))
        groups.setdefault(key, []).append(s)
    return {key: profile.derive(samples) for key, samples in groups.items()}


class AgentPush:
    """Pushers for every URL; windows per series."""

    def __init__(
        self,
        urls: list[str],
        *,
        service: str = "",
        tenant: str = "",
        ca: str = "",
        credentials: Credentials | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.service = service
        self.pushers = []
        for url in urls:
            client = PyroscopeClient(
                url,
                credentials=credentials or Credentials(),
                tenant=tenant or None,
                ca_file=ca or None,
                timeout=timeout,
            )
            self.pushers.append(Pusher(partial(_send, client), queue_size=QUEUE, name=f"pyroscope {url}"))
        self._windows: dict[tuple[tuple[str, str], ...], IntervalWindow] = {}

    def submit(self, snapshot: Profile) -> None:
        """Queue one interval's profile per series (never waits on the network)."""
        for key, part in series_of(snapshot, self.service).items():
            window = self._windows.setdefault(key, IntervalWindow())
            interval = window.next(part)
            labels: Mapping[str, str] = dict(key)
            for pusher in self.pushers:
                pusher.submit((labels, interval))

    def close(self, timeout: float = FINAL_PUSH_S) -> None:
        """Send what is queued, every URL within one *timeout* in all (the pushers send side by side): the
        agent's stop fits the DaemonSet's grace period however many URLs it pushes to."""
        end = time.monotonic() + timeout
        for pusher in self.pushers:
            pusher.close(max(0.0, end - time.monotonic()))


def _send(client: PyroscopeClient, item: tuple[Mapping[str, str], Any]) -> None:
    """One queued (labels, profile) to one Pyroscope."""
    labels, profile = item
    client.push(profile, labels)

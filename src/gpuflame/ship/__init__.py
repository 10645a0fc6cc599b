"""Shipping profiles out: Pyroscope (Connect push API), continuously or once."""

from gpuflame.ship.pusher import Pusher
from gpuflame.ship.pyroscope import Credentials, PushError, PyroscopeClient, base_labels, service_name

__all__ = ["Credentials", "PushError", "Pusher", "PyroscopeClient", "base_labels", "service_name"]

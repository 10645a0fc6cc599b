"""Argument types and option groups more than one command takes, and the serve loop of the serving commands.

One owner each: ``gpuflame run`` and ``gpuflame agent`` push to Pyroscope
with the same options and read durations the same way; ``serve`` and
``webhook`` take a port and stop at Ctrl-C the same way. The options of the
analysis commands (filters, ``--type``) are in :mod:`gpuflame.cli.common`, which
imports the readers and numpy: ``gpuflame run`` must not pay for them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuflame.units import interval_seconds, parse_duration

if TYPE_CHECKING:
    from socketserver import BaseServer  # what serve and webhook run; only its type here

SECRETS = (
    "secrets only from the environment or files: GPUFLAME_PYROSCOPE_TOKEN, GPUFLAME_PYROSCOPE_PASSWORD "
    "(or their *_FILE variants)"
)


def duration(text: str) -> float:
    """A duration (``15s``, ``500ms``, ``2m``) in seconds, 0 included."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"an interval cannot be negative: {text!r} (examples: 15s, 500ms, 2m)")
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def interval(text: str) -> float:
    """``--interval``: 0 (only at exit) or within the bounds ``defaults.py`` sets and says why."""
    try:
        return interval_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def push_interval(text: str) -> float:
    """The agent's ``--interval``: how often it pushes, within the same bounds as every interval (never 0)."""
    try:
        return interval_seconds(text, allow_off=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    """A duration of more than 0 (how long to run, how often to push)."""
    value = duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range (0-65535): {port}")
    return port


def add_pyroscope_options(
    parser: argparse.ArgumentParser, about: str, service_default: str, repeatable: bool = False
) -> argparse._ArgumentGroup:
    """``--pyroscope`` and how to reach it (TLS, tenant, credentials); the group, for a command's own additions."""
    group = parser.add_argument_group("continuous profiling into Pyroscope", f"{about}{SECRETS}")
    if repeatable:
        group.add_argument(
            "--pyroscope",
            action="append",
            default=[],
            metavar="URL",
            help="push to this Pyroscope every interval (repeatable)",
        )
    else:
        group.add_argument(
            "--pyroscope", metavar="URL", help="push each process's profile to this Pyroscope every interval"
        )
    group.add_argument("--service-name", metavar="NAME", help=f"service_name label (default: {service_default})")
    group.add_argument("--tenant", metavar="ID", help="X-Scope-OrgID header (default: $GPUFLAME_TENANT)")
    group.add_argument("--pyroscope-ca", metavar="FILE", help="CA certificate file to verify Pyroscope's TLS with")
    group.add_argument("--pyroscope-user", metavar="USER", help="basic auth user (password or token: environment)")
    group.add_argument("--pyroscope-token-file", metavar="FILE", help="file holding the bearer token")
    group.add_argument("--pyroscope-password-file", metavar="FILE", help="file holding the basic auth password")
    return group


def serve_until_interrupted(server: BaseServer, command: str) -> int:
    """Serve until Ctrl-C, then say so; the socket is closed however serving ends."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print(f"gpuflame {command}: stopped", flush=True)
    finally:
        server.server_close()
    return 0


def add_force_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output file that gpuflame did not write (never an input, never a folder)",
    )

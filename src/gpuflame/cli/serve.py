"""``gpuflame serve``: a local web page over the run store (or any folder of profiles)."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from gpuflame.cli.options import port_number, serve_until_interrupted
from gpuflame.errors import GpuflameError
from gpuflame.launch.store import store_root
from gpuflame.serve.app import Server, is_loopback, make_server

HELP = "browse your runs in a local web page: open one, diff two"

DESCRIPTION = """\
Start a small web server over a folder of profiles: by default the store that
`gpuflame run` writes into, else any folder of *.pb.gz, folded stacks or
PyTorch snapshots. The page lists the runs, newest first, with their start
time, command, exit code, peak bytes and processes, and the plain profile
files with size and time; open one in the interactive viewer, download it,
or pick two and diff them.

It listens on 127.0.0.1 only, unless --host says otherwise (profiles contain
source paths and function names: think before sharing them), serves only
files inside the folder, and never changes a file. Ctrl-C stops it.

Only its owner gets an answer: each start makes a new random token, printed
in the URL (open that URL; the page then keeps a cookie, so its links work),
and a request without it gets a 401 and nothing else. Other accounts on this
machine reach 127.0.0.1 too; the token is what keeps them out. --no-token
turns this off: only behind a reverse proxy that authenticates its users.

Whatever it listens on, it answers only requests addressed to this machine
(localhost, its host name, its addresses; the Host header), so a web page
cannot reach it by making its own name resolve here (DNS rebinding). Behind a
reverse proxy, name the proxy's host with --allow-host."""

EPILOG = """\
examples:
  gpuflame serve                         the run store, on http://127.0.0.1:8080/?token=...
  gpuflame serve ./profiles --open       a folder of profile files, in the browser
  gpuflame serve --port 0                any free port (printed at start)
  gpuflame serve --host 0.0.0.0 --allow-host profiles.example.com --no-token
                                         behind a reverse proxy that authenticates"""

DEFAULT_PORT = 8080


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", nargs="?", help=f"folder to serve (default: the store, {store_root()})")
    parser.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port to listen on (default {DEFAULT_PORT}; 0 = any free port)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name, e.g. a reverse proxy's (repeatable)",
    )
    parser.add_argument("--open", action="store_true", help="open the page (with its token) in the default browser")
    parser.add_argument(
        "--no-token",
        action="store_true",
        help="answer requests without the start-up token: anyone who can connect reads every profile "
        "(only behind a reverse proxy that authenticates its users)",
    )


def run(args: argparse.Namespace) -> int:
    root = args.dir if args.dir is not None else _default_store()
    server = make_server(root, args.host, args.port, tuple(args.allow_host), need_token=not args.no_token)
    _announce(server, args.host)
    if args.open:
        webbrowser.open(server.url)
    return serve_until_interrupted(server, "serve")


def _default_store() -> str:
    """The store, or a line that says how to fill it: a new user has no runs yet."""
    root = store_root()
    if not root.is_dir():
        raise GpuflameError(f"{root}: no runs yet (gpuflame run script.py records one there; or give a DIR)")
    return str(root)


def _announce(server: Server, host: str) -> None:
    """Where to look and who can connect: printed before the first request can arrive."""
    where = f"{host}:{server.port}"
    if is_loopback(host):
        print(f"gpuflame serve: {server.root} on {server.url} (listening on {where}: this machine only)")
    else:
        print(f"gpuflame serve: {server.root} on {server.url} (listening on {where})")
        sys.stderr.write(
            f"gpuflame serve: warning: {host} is reachable from other machines, and profiles contain "
            "source paths and function names\n"
        )
    if server.token is None:
        sys.stderr.write(
            "gpuflame serve: warning: --no-token: anyone who can connect reads these profiles "
            "(meant for behind a proxy that authenticates)\n"
        )
    print("gpuflame serve: press Ctrl-C to stop", flush=True)

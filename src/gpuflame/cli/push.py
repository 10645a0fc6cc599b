"""``gpuflame push``: upload one profile file to Pyroscope."""

from __future__ import annotations

import argparse
import json
import sys

from gpuflame.formats import load
from gpuflame.printable import printable
from gpuflame.ship.pyroscope import Credentials, PyroscopeClient, base_labels, push_request, service_name

HELP = "upload a profile file to Pyroscope once"

DESCRIPTION = """\
Send one profile (any format gpuflame reads) to Pyroscope's push API, as
__name__=gpu_memory with Grafana's Kubernetes labels. Secrets come only from
the environment or files: GPUFLAME_PYROSCOPE_TOKEN (bearer), or
--user with GPUFLAME_PYROSCOPE_PASSWORD (basic auth), or their *_FILE variants."""

EPILOG = """\
examples:
  gpuflame push run.pb.gz --url http://localhost:4040
  gpuflame push run.pb.gz --url https://profiles.example.com --service-name trainer --tenant team-a"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the profile to upload")
    parser.add_argument("--url", required=True, help="Pyroscope's base URL (http://pyroscope:4040)")
    parser.add_argument(
        "--service-name",
        metavar="NAME",
        help="service_name label (default: $GPUFLAME_SERVICE_NAME, the pod's workload, the file name)",
    )
    parser.add_argument("--tenant", metavar="ID", help="X-Scope-OrgID header")
    parser.add_argument("--ca", metavar="FILE", help="CA certificate file to verify TLS with")
    parser.add_argument("--user", metavar="USER", help="basic auth user")
    parser.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    parser.add_argument("--password-file", metavar="FILE", help="file holding the basic auth password")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="give up after (default 30)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    profile = load(args.file)
    credentials = Credentials.from_env(
        user=args.user or "", token_file=args.token_file or "", password_file=args.password_file or ""
    )
    client = PyroscopeClient(
        args.url, credentials=credentials, tenant=args.tenant, ca_file=args.ca, timeout=args.timeout
    )
    labels = base_labels(service_name(args.service_name or "", script=args.file))
    body = push_request(profile, labels)
    client.post(body)  # PushError is a GpuflameError: one line, exit 2
    if args.json:
        sys.stdout.write(json.dumps({"url": client.url, "labels": labels, "bytes": len(body)}) + "\n")
    else:
        said = f"gpuflame: pushed {args.file} to {client.url} as service_name={labels['service_name']}"
        sys.stderr.write(printable(said) + "\n")
    return 0

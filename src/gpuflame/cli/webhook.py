"""``gpuflame webhook``: the Kubernetes mutating admission webhook that injects gpuflame."""

from __future__ import annotations

import argparse
import os

from gpuflame.boundary.backends import AUTO, BACKENDS
from gpuflame.cli.options import port_number, serve_until_interrupted
from gpuflame.defaults import PUSH_INTERVAL_S
from gpuflame.webhook.admission import DEFAULT_IMAGE, DEFAULT_SECRET, Config
from gpuflame.webhook.server import make_server

HELP = "Kubernetes admission webhook: profile pods labelled gpuflame.io/inject"

DESCRIPTION = f"""\
Serve a mutating admission webhook over HTTPS (POST /mutate, GET /healthz).
Every pod labelled gpuflame.io/inject: "true" gets an init container that
copies gpuflame into an emptyDir, and its containers get PYTHONPATH (the
bootstrap first, their own value kept), the profiler's settings and the
Pyroscope URL and token from a Secret (by reference: the webhook never reads
it). Pods without the label are left as they are. No pod is ever refused: a
wrong setting annotation is ignored (its default used), a pod that cannot be
profiled as asked is admitted as it is, and the reason is a warning to the
client and the pod's annotation gpuflame.io/ignored or gpuflame.io/skipped.

Label (the MutatingWebhookConfiguration's objectSelector; an annotation of the
same name is read too, for a configuration without one):
  gpuflame.io/inject: "true"          turn profiling on
Annotations:
  gpuflame.io/interval: 30s           push every 30s (default {PUSH_INTERVAL_S:g}s, 100ms to 24h)
  gpuflame.io/backend: {AUTO}           {" | ".join(BACKENDS)}
  gpuflame.io/service-name: NAME      service_name label (default: the workload's name)
  gpuflame.io/container: a,b          only these containers (default: all)

The Secret (--pyroscope-secret, in the pod's namespace) has keys url, token
and optionally tenant; pods start without it, unprofiled into Pyroscope."""

EPILOG = """\
example:
  gpuflame webhook --tls-cert /tls/tls.crt --tls-key /tls/tls.key --image ghcr.io/you/gpuflame:0.1.0"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", required=True, metavar="FILE", help="server certificate (PEM)")
    parser.add_argument("--tls-key", required=True, metavar="FILE", help="its private key (PEM)")
    parser.add_argument("--port", type=port_number, default=8443, metavar="N", help="port (default 8443)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"init container image (default {DEFAULT_IMAGE})")
    parser.add_argument(
        "--pyroscope-secret",
        default=DEFAULT_SECRET,
        metavar="NAME",
        help=f"Secret with keys url, token, tenant (default {DEFAULT_SECRET})",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        metavar="NAME",
        help="the namespace the webhook runs in, whose pods it never changes whatever its "
        "configuration's selectors say (default $POD_NAMESPACE)",
    )
    parser.add_argument("--quiet", action="store_true", help="no line per request")


def run(args: argparse.Namespace) -> int:
    config = Config(image=args.image, pyroscope_secret=args.pyroscope_secret, namespace=args.namespace)
    server = make_server(args.host, args.port, args.tls_cert, args.tls_key, config, quiet=args.quiet)
    print(f"gpuflame webhook: https://{args.host}:{server.port}/mutate (init image {config.image})", flush=True)
    return serve_until_interrupted(server, "webhook")

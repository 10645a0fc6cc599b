"""Push profiles to Pyroscope through its Connect API (``/push.v1.PusherService/Push``).

What Pyroscope does with a push decides how it is built:

- Each pprof sample type becomes its own profile type, named
  ``<__name__>:<sample type>:<unit>:<period type>:<period unit>``. So one pprof
  holding all six memory types, with period type ``space/bytes``, makes Grafana
  list ``gpu_memory:inuse_space:bytes:space:bytes``, ``...peak_space...`` and
  ``...alloc_space...`` (plus the ``*_objects`` counts).
- Labels on pprof *samples* are turned into series labels by the distributor.
  Our samples carry ``pid`` and ``device``; a stray high-cardinality label
  would multiply series. So sample labels are removed from the pushed pprof,
  and the few that matter (``pid``, ``rank``, ``gpu``, ``category``) become series labels, one series
  per distinct combination, only while each has few values.
- ``__delta__=false``: the values are already per interval (Pyroscope
  computes deltas itself only for ``__name__=memory``; this says so anyway).

The request is a ``push.v1.PushRequest`` written with gpuflame's own protobuf
wire helpers. Secrets come from environment variables or files, are sent only
in headers, and never appear in messages, reprs or profiles.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import sys
import threading
import uuid
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gpuflame.boundary.settings import env_name
from gpuflame.defaults import PUSH_TIMEOUT_S
from gpuflame.errors import GpuflameError
from gpuflame.files import open_regular
from gpuflame.formats.pprof import encode
from gpuflame.formats.protobuf_encode import field_bytes, field_string
from gpuflame.model import Profile, Sample, SampleType
from gpuflame.printable import printable

PUSH_PATH = "/push.v1.PusherService/Push"
PROFILE_NAME = "gpu_memory"
PERIOD_TYPE = SampleType("space", "bytes")
# a token or password file (a Kubernetes secret is a few hundred bytes) and a CA bundle (the system's ~200 KB)
MAX_SECRET_BYTES = 64 << 10
MAX_TIMEOUT_S = 86_400  # a push's timeout: a day
MAX_CA_BYTES = 16 << 20
MAX_LABEL_VALUES = 16  # above this a sample label is not made a series label
# sample label -> series label; gpu is the device (cuda:0), gpu_model its name (NVIDIA H200)
# category: the few values of model/categories.py (fewer than MAX_LABEL_VALUES), so Grafana can split a service
# by the kind of memory;
# phase: the program's few phases (model/phases.py), kept only while MAX_LABEL_VALUES bounds them;
# rank, local_rank, world_size: a distributed job's process (boundary/ranks.py), one value per pushing process
SERIES_SAMPLE_LABELS = {
    "pid": "pid",
    "rank": "rank",
    "local_rank": "local_rank",
    "world_size": "world_size",
    "device": "gpu",
    "gpu_model": "gpu_model",
    "category": "category",
    "phase": "phase",
}
DOWNWARD_API = {"namespace": "POD_NAMESPACE", "pod": "POD_NAME", "container": "CONTAINER_NAME", "node": "NODE_NAME"}
ENV = "GPUFLAME_PYROSCOPE_"
EXCERPT = 200  # characters of a server's answer quoted in a message (escaped)

# What went wrong, in a few plain words: the pusher says each kind once and counts them.
TIMEOUT = "no answer in time"
REFUSED = "connection refused"
CLOSED = "connection closed by the server"
GARBAGE = "an answer that is not HTTP"
UNREACHABLE = "server unreachable"
TLS = "TLS failure"


class PushError(GpuflameError):
    """A push that did not reach Pyroscope; says whether retrying can help, and what kind of failure it was."""

    def __init__(self, message: str, retryable: bool = True, retry_after: float | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.kind = kind or message


# -- credentials ------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """Who we are to Pyroscope. Secrets are kept out of repr on purpose."""

    user: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)

    def headers(self) -> dict[str, str]:
        """Basic auth when a user is given (Grafana Cloud: user + token), else bearer."""
        if self.user:
            secret = self.password or self.token
            return {"Authorization": "Basic " + b64encode(f"{self.user}:{secret}".encode()).decode()}
        if self.token:
            return {"Authorization": "Bearer " + self.token}
        return {}

    def secrets(self) -> list[str]:
        return [s for s in (self.password, self.token) if s]

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        user: str = "",
        token_file: str = "",
        password_file: str = "",
    ) -> Credentials:
        """``GPUFLAME_PYROSCOPE_{USER,TOKEN,PASSWORD}`` or their ``*_FILE`` variants."""
        env = os.environ if env is None else env
        return cls(
            user=user or env.get(ENV + "USER", ""),
            password=_secret(env, "PASSWORD", password_file),
            token=_secret(env, "TOKEN", token_file),
        )


def _secret(env: Mapping[str, str], name: str, path: str) -> str:
    """A secret from its variable, else from its file (Kubernetes mounts secrets as files)."""
    if env.get(ENV + name):
        return env[ENV + name].strip()
    path = path or env.get(ENV + name + "_FILE", "")
    if not path:
        return ""
    what = f"Pyroscope {name.lower()} file"
    try:
        return _small_file(path, what, MAX_SECRET_BYTES).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise GpuflameError(f"the {what} {path} is not UTF-8 text") from None


def _small_file(path: str, what: str, limit: int) -> bytes:
    """A secret's or a CA's file, at most *limit* bytes: a regular file only (a FIFO or /dev/zero never ends)."""
    try:
        with open_regular(path, what) as f:
            data = f.read(limit + 1)
    except GpuflameError as exc:
        raise GpuflameError(f"cannot read the {what}: {exc}") from None
    except OSError as exc:
        raise GpuflameError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise GpuflameError(f"the {what} {path} is larger than {limit:,} bytes; not read")
    return data


# -- labels -----------------------------------------------------------------------

# Kubernetes name hashes use this alphabet (no vowels, no 0/1/3).
_HASH = "[bcdfghjklmnpqrstvwxz2456789]"
_WORKLOAD_SUFFIXES = (
    re.compile(rf"-{_HASH}{{6,10}}-{_HASH}{{5}}$"),  # Deployment: <name>-<replicaset hash>-<pod hash>
    re.compile(rf"-{_HASH}{{5}}$"),  # DaemonSet, Job: <name>-<pod hash>
    re.compile(r"-\d+$"),  # StatefulSet: <name>-<ordinal>
)


def workload_name(pod: str) -> str:
    """The workload a pod belongs to, from its name: ``trainer-7d9f8b6c4-x2k9q`` -> ``trainer``."""
    for pattern in _WORKLOAD_SUFFIXES:
        stripped = pattern.sub("", pod)
        if stripped != pod and stripped:
            return stripped
    return pod


def service_name(option: str = "", env: Mapping[str, str] | None = None, script: str | None = None) -> str:
    """The option, else ``GPUFLAME_SERVICE_NAME``, else the pod's workload, else the script's name."""
    env = os.environ if env is None else env
    if option:
        return option
    if env.get(env_name("service_name")):
        return env[env_name("service_name")]
    pod = env.get("POD_NAME") or (env.get("HOSTNAME", "") if env.get("KUBERNETES_SERVICE_HOST") else "")
    if pod:
        return workload_name(pod)
    return script_name(script)


def script_name(script: str | None = None) -> str:
    """``train`` for ``python train.py``, the module for ``python -m pkg.mod``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if script is None and spec is not None and getattr(spec, "name", "") not in ("", "__main__"):
        return spec.name.removesuffix(".__main__")
    path = script if script is not None else (sys.argv[0] if sys.argv and sys.argv[0] else "python")
    name = Path(path).name
    for suffix in (".pb.gz", ".pb", ".py"):
        name = name.removesuffix(suffix)
    return name or "python"


def base_labels(name: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Series labels every push carries: service and Kubernetes placement (Downward API)."""
    env = os.environ if env is None else env
    labels = {"service_name": name}
    for label, variable in DOWNWARD_API.items():
        if env.get(variable):
            labels[label] = env[variable]
    return labels


# -- the request ------------------------------------------------------------------


def split_series(profile: Profile, labels: Mapping[str, str]) -> list[tuple[dict[str, str], Profile]]:
    """One (series labels, label-free profile) per combination of the few-valued sample labels."""
    kept = [k for k in SERIES_SAMPLE_LABELS if 0 < len(profile.label_values(k)) <= MAX_LABEL_VALUES]
    groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for s in profile.samples:
        key = tuple((SERIES_SAMPLE_LABELS[k], v) for k in kept if (v := s.label(k)) is not None)
        groups.setdefault(key, []).append(Sample(s.stack, s.values))
    if not groups:
        groups[()] = []
    out = []
    for key, samples in groups.items():
        series = {"__name__": PROFILE_NAME, "__delta__": "false", **labels, **dict(key)}
        part = profile.derive(samples).compact()
        part.timeline = part.history = None  # a viewer's aid, not something Pyroscope reads
        out.append((series, part))
    return out


def push_request(profile: Profile, labels: Mapping[str, str]) -> bytes:
    """A ``push.v1.PushRequest`` body: one RawProfileSeries per series, one gzip pprof each."""
    series = []
    for series_labels, part in split_series(profile, labels):
        pairs = b"".join(
            field_bytes(1, field_string(1, k) + field_string(2, v)) for k, v in sorted(series_labels.items())
        )
        sample = field_bytes(1, encode(part, PERIOD_TYPE)) + field_string(2, str(uuid.uuid4()))
        series.append(field_bytes(1, pairs + field_bytes(2, sample)))
    return b"".join(series)


# -- the client -------------------------------------------------------------------


class PyroscopeClient:
    """One Pyroscope server; :meth:`push` is one HTTP POST."""

    def __init__(
        self,
        url: str,
        *,
        credentials: Credentials | None = None,
        tenant: str | None = None,
        ca_file: str | None = None,
        timeout: float = PUSH_TIMEOUT_S,
    ) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port  # 'http://h:99999' and 'http://[::1' are ValueError
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise GpuflameError(f"not a Pyroscope URL: {_shown_url(url)!r} (example: http://pyroscope:4040)")
        if not 0 < timeout <= MAX_TIMEOUT_S:  # NaN too; 1e999 s overflowed the socket's time_t
            raise GpuflameError(f"the push timeout is more than 0 and at most {MAX_TIMEOUT_S:,} s, got {timeout:g}")
        self.credentials = credentials or Credentials()
        if parts.username and not self.credentials.user:
            self.credentials = Credentials(parts.username, parts.password or "", self.credentials.token)
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.https else 80)
        self.path = parts.path.rstrip("/") + PUSH_PATH
        self.url = redact_url(url)
        self.tenant = tenant
        self.timeout = timeout
        self._ssl = _ssl_context(ca_file) if self.https else None

    def headers(self) -> dict[str, str]:
        out = {
            "Content-Type": "application/proto",
            "Connect-Protocol-Version": "1",
            "User-Agent": "gpuflame",
            **self.credentials.headers(),
        }
        if self.tenant:
            out["X-Scope-OrgID"] = self.tenant
        return out

    def push(self, profile: Profile, labels: Mapping[str, str]) -> None:
        """Send *profile* with series *labels*; raises :class:`PushError` unless Pyroscope took it."""
        self.post(push_request(profile, labels))

    def post(self, body: bytes) -> None:
        """One POST: connecting, then sending and the whole answer, each within the timeout.

        The socket's timeout bounds each read, not the answer: a server that
        trickles a byte a second would hold the push for ever, so a watchdog
        closes the connection when the time is up.
        """
        conn = self._connection()
        expired = threading.Event()
        watchdog = threading.Timer(self.timeout, _abort, (conn, expired))
        watchdog.daemon = True
        try:
            conn.connect()
            watchdog.start()
            conn.request("POST", self.path, body=body, headers=self.headers())
            response = conn.getresponse()
            status = response.status
            reply = response.read(4096)
            retry_after = response.getheader("Retry-After")
            content_type = response.getheader("Content-Type", "")
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise self._failure(exc, expired.is_set()) from None
        finally:
            watchdog.cancel()
            conn.close()
        if expired.is_set():  # what was read before the cut (a status line cut short) is no answer
            raise self._failure(TimeoutError(), expired=True)
        if 200 <= status < 300:
            return
        raise self._refused(status, reply, content_type, retry_after)

    def _failure(self, exc: BaseException, expired: bool) -> PushError:
        """A plain message for a push that got no usable answer; server bytes are quoted escaped and bounded."""
        if expired or isinstance(exc, TimeoutError):
            return PushError(f"Pyroscope at {self.url} did not answer within {self.timeout:g}s", kind=TIMEOUT)
        if isinstance(exc, ssl.SSLError):
            return PushError(f"TLS with Pyroscope at {self.url} failed: {exc.reason or exc}", retryable=False, kind=TLS)
        kind, detail = _describe(exc)
        if kind == GARBAGE:
            return PushError(f"Pyroscope at {self.url} sent {GARBAGE}: {self._excerpt(detail)}", kind=GARBAGE)
        return PushError(f"cannot reach Pyroscope at {self.url}: {self._excerpt(detail)}", kind=kind)

    def _connection(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _refused(self, status: int, reply: bytes, content_type: str, retry_after: str | None) -> PushError:
        """A plain message for a non-2xx answer; Connect errors carry {"code", "message"} JSON."""
        detail = ""
        if "json" in content_type:
            try:
                body = json.loads(reply)
                detail = ": ".join(str(body[k]) for k in ("code", "message") if body.get(k))
            except (ValueError, TypeError, AttributeError):
                detail = ""
        if not detail:
            detail = reply.decode("utf-8", "replace").strip().splitlines()[0] if reply.strip() else ""
        detail = self._excerpt(detail)
        hint = {401: " (check the token or user/password)", 403: " (check the tenant and permissions)"}.get(status, "")
        message = f"Pyroscope at {self.url} answered HTTP {status}{hint}" + (f": {detail}" if detail else "")
        retryable = status in (408, 429) or status >= 500
        return PushError(message, retryable=retryable, retry_after=_seconds(retry_after), kind=f"HTTP {status}")

    def _clean(self, text: str) -> str:
        """Whatever comes back from the network must not echo a secret into our logs."""
        for secret in self.credentials.secrets():
            text = text.replace(secret, "***")
        return text

    def _excerpt(self, text: str) -> str:
        """A server's words as a message may quote them: no secret, no control character, at most EXCERPT long."""
        return printable(self._clean(text), limit=EXCERPT)


def _abort(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The watchdog's end of a push: a blocked read returns at once, and the push says it timed out."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _describe(exc: BaseException) -> tuple[str, str]:
    """(kind, detail) of a failed exchange; the detail of a garbage answer is the server's own bytes."""
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED, REFUSED
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError):
        return CLOSED, "the server closed the connection"
    if isinstance(exc, http.client.HTTPException):  # a bad status line, a header line too long, a short body
        return GARBAGE, str(exc) or type(exc).__name__
    return UNREACHABLE, getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _seconds(retry_after: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare for APIs and is ignored)."""
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:
        return None


def _ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """Verification always on; a CA file adds a private CA."""
    if not ca_file:
        return ssl.create_default_context()
    pem = _small_file(ca_file, "CA file", MAX_CA_BYTES)
    try:
        if not pem.strip():
            raise ValueError("the file is empty")
        return ssl.create_default_context(cadata=pem.decode("ascii"))  # PEM text (as cafile= read it)
    except UnicodeDecodeError:
        raise GpuflameError(f"cannot use the CA file {ca_file}: not PEM text") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise GpuflameError(f"cannot use the CA file {ca_file}: {getattr(exc, 'strerror', None) or exc}") from None


def _shown_url(url: str) -> str:
    """The URL for a message without its user:password, also where urlsplit cannot read it (then: what follows '@')."""
    try:
        return redact_url(url)
    except ValueError:
        return url.rsplit("@", 1)[-1]


def redact_url(url: str) -> str:
    """The URL without any user:password part, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()

"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's logic, with no I/O.

A pod annotated ``gpuflame.io/inject: "true"`` gets, as one JSON Patch:

- an ``emptyDir`` volume ``gpuflame``;
- an init container that runs ``gpuflame-payload-install /gpuflame`` (copies
  gpuflame and its bootstrap into the volume);
- in each selected container: the volume mounted at ``/gpuflame``,
  ``PYTHONPATH`` with the bootstrap and the library in front (the existing
  value kept), the profiler's ``GPUFLAME_*`` settings from annotations, the
  Downward API variables the Pyroscope labels use, and the Pyroscope URL and
  token as ``secretKeyRef`` (the webhook never sees the secret's values).

This is the pattern of the OpenTelemetry Operator's Python
auto-instrumentation. Everything here is a pure function so that the tests
(and a reader) can check it without a server.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuflame import defaults
from gpuflame.capture.backends import BACKENDS
from gpuflame.capture.settings import Settings, env_name
from gpuflame.launch.contract import HOME_ENV
from gpuflame.units import parse_duration

PREFIX = "gpuflame.io/"
INJECT = PREFIX + "inject"
INTERVAL = PREFIX + "interval"
BACKEND = PREFIX + "backend"
SERVICE_NAME = PREFIX + "service-name"
CONTAINER = PREFIX + "container"
INJECTED = PREFIX + "injected"  # set by us: a second admission of the same pod changes nothing
KNOWN = (INJECT, INTERVAL, BACKEND, SERVICE_NAME, CONTAINER, INJECTED)

MOUNT = "/gpuflame"
VOLUME = "gpuflame"
INIT_NAME = "gpuflame-payload"
BOOTSTRAP = MOUNT + "/bootstrap"
LIB = MOUNT + "/lib"
SESSIONS = MOUNT + "/sessions"
DEFAULT_IMAGE = "ghcr.io/gpuflame/gpuflame:0.1.0"
DEFAULT_SECRET = "gpuflame-pyroscope"
NONROOT_UID = 65532

# Secret key -> variable; all optional so a pod starts without the Secret.
SECRET_KEYS = (
    ("url", env_name("pyroscope_url")), ("token", "GPUFLAME_PYROSCOPE_TOKEN"), ("tenant", env_name("tenant")),
)
FIELD_REFS = (("POD_NAMESPACE", "metadata.namespace"), ("POD_NAME", "metadata.name"), ("NODE_NAME", "spec.nodeName"))

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")


class BadRequest(ValueError):
    """The body is not an AdmissionReview we can answer: HTTP 400, not a denial."""


class BadAnnotation(ValueError):
    """An annotation the user got wrong: the pod is denied with this message."""


@dataclass(frozen=True)
class Config:
    """What the webhook was started with (``gpuflame webhook`` options)."""

    image: str = DEFAULT_IMAGE
    pyroscope_secret: str = DEFAULT_SECRET


@dataclass(frozen=True)
class Request:
    """The profiler's settings for one pod, read from its annotations."""

    interval: float = defaults.PUSH_INTERVAL_S
    backend: str = defaults.BACKEND
    service_name: str = ""
    containers: tuple[str, ...] = field(default_factory=tuple)  # empty = every container


# -- annotations ------------------------------------------------------------------


def wants_injection(annotations: Mapping[str, str]) -> bool:
    """``gpuflame.io/inject`` is on; a value that is neither on nor off is an error, not a silent no."""
    value = str(annotations.get(INJECT, "")).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadAnnotation(f'{INJECT}: {annotations[INJECT]!r} is not "true" or "false"')


def parse_interval(text: str) -> float:
    """The interval annotation in seconds; a bad one is the user's to fix, not a crash."""
    try:
        return parse_duration(text)
    except ValueError:
        raise BadAnnotation(f"{INTERVAL}: {text!r} is not a duration (examples: 30s, 500ms, 2m)") from None


def parse_request(annotations: Mapping[str, str]) -> Request:
    """The settings annotations, checked; raises BadAnnotation with a message for the user."""
    interval = parse_interval(annotations[INTERVAL]) if INTERVAL in annotations else defaults.PUSH_INTERVAL_S
    backend = annotations.get(BACKEND, defaults.BACKEND).strip()
    if backend not in BACKENDS:
        raise BadAnnotation(f"{BACKEND}: {backend!r} is not one of {', '.join(BACKENDS)}")
    service = annotations.get(SERVICE_NAME, "")
    if SERVICE_NAME in annotations and not service.strip():
        raise BadAnnotation(f"{SERVICE_NAME}: empty (leave it out to use the pod's workload name)")
    containers = tuple(c.strip() for c in annotations.get(CONTAINER, "").split(",") if c.strip())
    if CONTAINER in annotations and not containers:
        raise BadAnnotation(f"{CONTAINER}: empty (leave it out to profile every container)")
    return Request(interval=interval, backend=backend, service_name=service.strip(), containers=containers)


def selected(pod: Mapping[str, Any], request: Request) -> list[int]:
    """Indexes of the containers to profile; naming one the pod lacks is an error."""
    names = [str(c.get("name", "")) for c in pod.get("spec", {}).get("containers", [])]
    if not request.containers:
        return list(range(len(names)))
    missing = [c for c in request.containers if c not in names]
    if missing:
        raise BadAnnotation(f"{CONTAINER}: no container named {', '.join(missing)} (the pod has {', '.join(names)})")
    return [i for i, name in enumerate(names) if name in request.containers]


# -- the patch --------------------------------------------------------------------


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON Pointer: ``~`` and ``/`` in a key escaped (annotation keys have ``/``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def add_items(obj: Mapping[str, Any], base: tuple[str | int, ...], key: str, items: list[Any]) -> list[dict]:
    """Append to the list ``obj[key]``, creating it when the pod has none yet."""
    if not items:
        return []
    if not obj.get(key):
        return [{"op": "add", "path": pointer(*base, key), "value": items}]
    return [{"op": "add", "path": pointer(*base, key, "-"), "value": item} for item in items]


def init_container(config: Config) -> dict[str, Any]:
    """Copies the payload into the volume; non-root, nothing to escalate, read-only root."""
    return {
        "name": INIT_NAME,
        "image": config.image,
        "command": ["gpuflame-payload-install", MOUNT],
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }


def pythonpath_patch(container: Mapping[str, Any], base: tuple[str | int, ...]) -> list[dict]:
    """PYTHONPATH with the bootstrap and library first, the container's own value kept.

    A literal ``value`` is combined in place. A ``valueFrom`` cannot be read
    here, so a second PYTHONPATH follows it as ``...:$(PYTHONPATH)``: the
    kubelet expands a reference to a variable defined earlier in the list.
    A PYTHONPATH from the image's ENV or from ``envFrom`` is not visible to
    the webhook and is replaced (set it in ``env`` to keep it).
    """
    ours = f"{BOOTSTRAP}:{LIB}"
    env = list(container.get("env") or [])
    for i, var in reversed(list(enumerate(env))):
        if var.get("name") != "PYTHONPATH":
            continue
        if "valueFrom" in var:
            return add_items(container, base, "env", [{"name": "PYTHONPATH", "value": f"{ours}:$(PYTHONPATH)"}])
        old = str(var.get("value", ""))
        value = f"{ours}:{old}" if old else ours
        return [{"op": "replace", "path": pointer(*base, "env", i, "value"), "value": value}]
    return add_items(container, base, "env", [{"name": "PYTHONPATH", "value": ours}])


def profiler_env(container: Mapping[str, Any], request: Request, config: Config) -> list[dict[str, Any]]:
    """The variables gpuflame's bootstrap and Pyroscope pusher read (besides PYTHONPATH)."""
    name = str(container.get("name", ""))
    env: list[dict[str, Any]] = [
        {"name": HOME_ENV, "value": LIB},
        # the torch backend's compiled hook: the image's home may be read-only, the volume is not
        {"name": "GPUFLAME_CACHE_DIR", "value": f"{MOUNT}/cache"},
    ]
    env += [{"name": var, "value": value} for var, value in settings_env(name, request).items()]
    env += [{"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} for var, path in FIELD_REFS]
    env.append({"name": "CONTAINER_NAME", "value": name})
    env += [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": config.pyroscope_secret, "key": key, "optional": True}}}
        for key, var in SECRET_KEYS
    ]
    return env


def settings_env(container_name: str, request: Request) -> dict[str, str]:
    """The profiler's settings for one container, as ``gpuflame run`` passes them (``Settings.to_env``)."""
    settings = Settings(enabled=True, session_dir=f"{SESSIONS}/{container_name}", backend=request.backend,
                        interval=request.interval, service_name=request.service_name)
    names = ("enabled", "session_dir", "backend", "interval", *["service_name"] * bool(request.service_name))
    return settings.to_env(*names)


def container_patch(pod: Mapping[str, Any], index: int, request: Request, config: Config) -> list[dict]:
    """Env and volume mount for one container. PYTHONPATH first: it may rewrite an index in env."""
    container = pod["spec"]["containers"][index]
    base: tuple[str | int, ...] = ("spec", "containers", index)
    ops = pythonpath_patch(container, base)
    env_exists = bool(container.get("env")) or any(op["path"] == pointer(*base, "env") for op in ops)
    ops += add_items({"env": [None] if env_exists else []}, base, "env", profiler_env(container, request, config))
    ops += add_items(container, base, "volumeMounts", [{"name": VOLUME, "mountPath": MOUNT, "readOnly": False}])
    return ops


def patch_for(pod: Mapping[str, Any], request: Request, config: Config) -> list[dict]:
    """The whole JSON Patch for one pod."""
    spec = pod.get("spec", {})
    ops = add_items(spec, ("spec",), "volumes", [{"name": VOLUME, "emptyDir": {}}])
    ops += add_items(spec, ("spec",), "initContainers", [init_container(config)])
    for index in selected(pod, request):
        ops += container_patch(pod, index, request, config)
    # the pod carries gpuflame.io/inject, so its annotations exist: add a key to them
    ops.append({"op": "add", "path": pointer("metadata", "annotations", INJECTED), "value": "true"})
    return ops


def already_injected(pod: Mapping[str, Any]) -> bool:
    """A reinvoked webhook (or a pod created from an injected spec) must not inject twice."""
    spec = pod.get("spec", {})
    return any(v.get("name") == VOLUME for v in spec.get("volumes") or []) or any(
        c.get("name") == INIT_NAME for c in spec.get("initContainers") or []
    )


# -- AdmissionReview ----------------------------------------------------------------


def review(body: Any, config: Config | None = None) -> dict[str, Any]:
    """The AdmissionReview response for one request; BadRequest when the body is not one."""
    config = config or Config()
    uid, pod = _read(body)
    if pod is None:
        return _response(uid)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        if not wants_injection(annotations) or already_injected(pod):
            return _response(uid)
        ops = patch_for(pod, parse_request(annotations), config)
    except BadAnnotation as exc:
        return _response(uid, allowed=False, message=f"gpuflame: {exc}")
    return _response(uid, patch=ops)


def _read(body: Any) -> tuple[str, dict[str, Any] | None]:
    """(uid, pod) from an AdmissionReview v1; pod is None for anything that is not a Pod."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise BadRequest("not an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadRequest("AdmissionReview without request.uid")
    kind = request.get("kind") or {}
    obj = request.get("object")
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or request.get("operation", "CREATE") != "CREATE":
        return request["uid"], None
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        raise BadRequest("Pod request without object.spec")
    if not isinstance(obj["spec"].get("containers"), list):
        raise BadRequest("Pod without spec.containers")
    return request["uid"], obj


def _response(uid: str, allowed: bool = True, message: str = "", patch: list[dict] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if message:
        response["status"] = {"code": 400 if not allowed else 200, "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

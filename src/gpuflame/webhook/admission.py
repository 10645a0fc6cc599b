"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's logic, with no I/O.

A pod labelled ``gpuflame.io/inject: "true"`` (the MutatingWebhookConfiguration's
objectSelector sends only those; an annotation of the same name is still read
where an older configuration sends every pod) gets, as one JSON Patch
(``patch.py``):

- an ``emptyDir`` volume;
- an init container that runs ``gpuflame-payload-install`` (copies gpuflame
  and its bootstrap into the volume);
- in each selected container: the volume mounted at ``/gpuflame``,
  ``PYTHONPATH`` with the bootstrap and the library in front (the existing
  value kept), the profiler's ``GPUFLAME_*`` settings from annotations, the
  Downward API variables the Pyroscope labels use, and the Pyroscope URL and
  token as ``secretKeyRef`` (the webhook never sees the secret's values).

The webhook never refuses a pod: a setting annotation it cannot use is
ignored (its default is used), a pod it cannot profile is admitted as it is,
and either way the reason goes back as an admission warning (what ``kubectl``
prints) and as the pod's annotation ``gpuflame.io/ignored`` or
``gpuflame.io/skipped`` (what a controller-made pod keeps, since a
Deployment's warnings reach no person). A patch that would break one of the
API server's rules (``api_rules.py``: annotations past 256 KiB, a name or
path used twice) is not sent: the pod is admitted unprofiled, and where even
the ``skipped`` annotation would not fit, the warning alone says why.

This is the pattern of the OpenTelemetry Operator's Python
auto-instrumentation. Everything here is a pure function so that the tests
(and a reader) can check it without a server.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpuflame import defaults
from gpuflame.boundary.backends import BACKENDS
from gpuflame.units import interval_seconds
from gpuflame.webhook.api_rules import refusal
from gpuflame.webhook.patch import (
    DEFAULT_IMAGE,
    DEFAULT_SECRET,
    INIT_NAME,
    INSTALL,
    MOUNT,
    VOLUME,
    Config,
    Request,
    add_members,
    patch_for,
    pointer,
    settings_env,
)

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_SECRET",
    "INIT_NAME",
    "MOUNT",
    "VOLUME",
    "BadRequest",
    "Config",
    "Request",
    "Skip",
    "parse_request",
    "pointer",
    "review",
    "settings_env",
]

PREFIX = "gpuflame.io/"
INJECT = PREFIX + "inject"
INTERVAL = PREFIX + "interval"
BACKEND = PREFIX + "backend"
SERVICE_NAME = PREFIX + "service-name"
CONTAINER = PREFIX + "container"
INJECTED = PREFIX + "injected"  # set by us: a second admission of the same pod changes nothing
IGNORED = PREFIX + "ignored"  # set by us: the setting annotations we could not use, and why
SKIPPED = PREFIX + "skipped"  # set by us: why an opted-in pod was not profiled
KNOWN = (INJECT, INTERVAL, BACKEND, SERVICE_NAME, CONTAINER, INJECTED, IGNORED, SKIPPED)

MAX_VALUE = 253  # characters of an annotation value we read (a DNS name's most); longer is no setting
MAX_NOTE = 256  # the API server may cut a longer warning
SHOWN = 64  # characters of a user's value quoted in a note

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")
T = TypeVar("T")


class BadRequest(ValueError):
    """The body is not an AdmissionReview we can answer: HTTP 400, not a denial."""


class Skip(ValueError):
    """The pod opted in but is admitted unprofiled, for this reason."""


# -- annotations ------------------------------------------------------------------


def wants_injection(meta: Mapping[str, Any]) -> bool:
    """The ``gpuflame.io/inject`` label (else the annotation) is on; a value neither on nor off is a Skip."""
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    source, value = ("label", labels[INJECT]) if INJECT in labels else ("annotation", annotations.get(INJECT, ""))
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise Skip(f'{INJECT} {source}: {ascii(str(value)[:SHOWN])} is not "true" or "false"')


def pod_interval(text: str) -> float:
    """The interval annotation: a pod pushes every interval, so 0 ("only at exit") is no choice here."""
    return interval_seconds(text, allow_off=False)


def pod_backend(text: str) -> str:
    if text.strip() not in BACKENDS:
        raise ValueError(f"{text.strip()!r} is not one of {', '.join(BACKENDS)}")
    return text.strip()


def pod_service_name(text: str) -> str:
    if not text.strip():
        raise ValueError("empty (leave it out to use the pod's workload name)")
    return text.strip()


def _setting(annotations: Mapping[str, Any], key: str, parse: Callable[[str], T], default: T, notes: list[str]) -> T:
    """One setting annotation, or *default* with a note saying why the annotation was ignored."""
    if key not in annotations:
        return default
    text = str(annotations[key])
    try:
        if len(text) > MAX_VALUE:
            raise ValueError(f"{len(text)} characters, more than any setting")
        return parse(text)
    except ValueError as exc:
        notes.append(f"{key}: {_clip(str(exc), MAX_NOTE // 2)}; ignored")
        return default


def parse_request(annotations: Mapping[str, Any]) -> tuple[Request, list[str]]:
    """The settings annotations, and a note for each one ignored (never an error: the pod must start)."""
    notes: list[str] = []
    interval = _setting(annotations, INTERVAL, pod_interval, defaults.PUSH_INTERVAL_S, notes)
    backend = _setting(annotations, BACKEND, pod_backend, defaults.BACKEND, notes)
    service = _setting(annotations, SERVICE_NAME, pod_service_name, "", notes)
    containers = tuple(c.strip() for c in str(annotations.get(CONTAINER, "")).split(",") if c.strip())
    if CONTAINER in annotations and not containers:
        notes.append(f"{CONTAINER}: empty; ignored, every container is profiled")
    return Request(interval=interval, backend=backend, service_name=service, containers=containers), notes


def selected(spec: Mapping[str, Any], request: Request) -> list[int]:
    """Indexes of the containers to profile; naming one the pod lacks skips the pod (profiling others is not
    what was asked)."""
    names = [str(c.get("name", "")) for c in spec.get("containers") or []]
    if not request.containers:
        return list(range(len(names)))
    missing = [ascii(c[:SHOWN]) for c in request.containers if c not in names]
    if missing:
        raise Skip(f"{CONTAINER}: no container named {', '.join(missing)} (the pod has {', '.join(names)})")
    return [i for i, name in enumerate(names) if name in request.containers]


def already_injected(pod: Mapping[str, Any]) -> bool:
    """A reinvoked webhook, or a pod made from an injected pod's spec, must not be injected twice."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    inits = pod.get("spec", {}).get("initContainers") or []
    return INJECTED in annotations or any((c.get("command") or [None])[0] == INSTALL for c in inits)


def profile(pod: Mapping[str, Any], config: Config) -> tuple[list[dict], list[str]]:
    """(the patch, the notes) for an opted-in pod; Skip when it cannot be profiled."""
    spec = pod["spec"]
    if str((spec.get("os") or {}).get("name", "linux")).lower() == "windows":
        raise Skip("a Windows pod: gpuflame's payload is for Linux")
    request, notes = parse_request((pod.get("metadata") or {}).get("annotations") or {})
    ops = patch_for(pod, selected(spec, request), request, config)
    marks = {INJECTED: "true", **({IGNORED: _clip("; ".join(notes))} if notes else {})}
    return ops + add_members(pod["metadata"].get("annotations"), ("metadata", "annotations"), marks), notes


# -- AdmissionReview ----------------------------------------------------------------


def review(body: Any, config: Config | None = None) -> dict[str, Any]:
    """The AdmissionReview response for one request (always allowed); BadRequest when the body is not one."""
    config = config or Config()
    uid, pod = _read(body)
    if pod is None or _namespace(body, pod) in {config.namespace} - {""}:
        return _response(uid)
    meta = pod["metadata"]
    try:
        if not wants_injection(meta) or already_injected(pod):
            return _response(uid)
        ops, notes = profile(pod, config)
        invalid = refusal(pod, ops)
        if invalid:
            raise Skip(f"profiling would make the pod invalid: {invalid}")
    except Skip as exc:
        reason = _clip(str(exc))
        ops, notes = add_members(meta.get("annotations"), ("metadata", "annotations"), {SKIPPED: reason}), [reason]
        if refusal(pod, ops):  # no room even for the reason: the pod unchanged, the warning alone says it
            ops = []
    except (AttributeError, TypeError, KeyError, IndexError):
        raise BadRequest("a Pod whose fields are not of the Pod schema") from None
    return _response(uid, patch=ops, warnings=[_clip(f"gpuflame: {note}") for note in notes])


def _clip(text: str, most: int = MAX_NOTE) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _namespace(body: dict[str, Any], pod: dict[str, Any]) -> str:
    """The pod's namespace: the request's (set by the API server), else the pod's own."""
    return str(body["request"].get("namespace") or pod["metadata"].get("namespace") or "")


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
    if not isinstance(obj.setdefault("metadata", {}), dict):
        raise BadRequest("Pod whose metadata is not an object")
    return request["uid"], obj


def _response(uid: str, patch: list[dict] | None = None, warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = warnings
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

"""The API server's rules a patch of ours could break, checked on the patched pod before the patch is sent.

The API server applies a mutating webhook's patch and then validates the
pod; a pod the patch made invalid is refused, whatever the webhook's
``failurePolicy`` says. ``patch.py`` picks free names and paths so that this
does not happen, but a pod can leave no room at all (annotations a few
bytes under their limit), so :func:`refusal` replays the patch on a copy
and checks the rules here (those of ``pkg/apis/core/validation`` that an
added volume, init container, mount, variable or annotation can break).
A patch that breaks one is not sent: the pod is admitted as it is, with the
reason (``admission.review``). Only rules the patch newly breaks count: a
pod that was invalid before is the API server's to refuse.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

# metadata.annotations: keys and values together, in bytes (apimachinery's TotalAnnotationSizeLimitB)
ANNOTATIONS_MAX_BYTES = 256 * 1024
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def refusal(pod: Mapping[str, Any], ops: list[dict]) -> str | None:
    """Why the API server would refuse *pod* once *ops* (``add`` operations) are applied, where it would not
    refuse it as it is; None when the patch keeps it valid."""
    if not ops:
        return None
    try:
        patched = apply_adds(pod, ops)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return f"the patch does not apply to this pod ({type(exc).__name__})"
    before = set(broken(pod))
    new = [e for e in broken(patched) if e not in before]
    return "; ".join(new) if new else None


def apply_adds(doc: Mapping[str, Any], ops: list[dict]) -> dict[str, Any]:
    """A copy of *doc* with RFC 6902 ``add`` operations applied (the only kind the webhook sends)."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in ops:
        if op["op"] != "add":
            raise ValueError(f"not an add: {op['op']}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            target[last] = copy.deepcopy(op["value"])
    return out


def broken(pod: Mapping[str, Any]) -> list[str]:
    """The rules *pod* breaks, one line each."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    errors = []
    size = annotations_bytes(meta.get("annotations") or {})
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(f"its annotations would be {size} bytes, over Kubernetes' {ANNOTATIONS_MAX_BYTES}")
    errors += _repeated("volume name", [str(v.get("name")) for v in spec.get("volumes") or []])
    containers = [c for key in CONTAINER_LISTS for c in spec.get(key) or []]
    errors += _repeated("container name", [str(c.get("name")) for c in containers])
    for c in containers:
        errors += _paths(c)
    return errors


def annotations_bytes(annotations: Mapping[str, Any]) -> int:
    """Their size as the API server counts it: the UTF-8 bytes of every key and value."""
    return sum(
        len(str(k).encode(errors="replace")) + len(str(v).encode(errors="replace")) for k, v in annotations.items()
    )


def _paths(container: Mapping[str, Any]) -> list[str]:
    """A container's mount paths are unique, and none is also one of its device paths."""
    name = ascii(str(container.get("name")))
    mounts = [str(m.get("mountPath")) for m in container.get("volumeMounts") or []]
    devices = {str(d.get("devicePath")) for d in container.get("volumeDevices") or []}
    errors = _repeated(f"mount path in container {name}", mounts)
    errors += [f"container {name} would mount at {ascii(p)}, its device path" for p in sorted(set(mounts) & devices)]
    return errors


def _repeated(what: str, names: Iterable[str]) -> list[str]:
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    return [f"{what} {ascii(n)} would be used twice" for n in twice]

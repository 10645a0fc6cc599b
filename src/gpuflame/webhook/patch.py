"""The JSON Patch that injects gpuflame into one pod: only ``add`` operations, valid for any pod the API accepts.

The API server applies the patch and validates the result; a patch that does
not apply, or a result that breaks a rule, refuses the pod even with
``failurePolicy: Ignore``. So the patch

- never ``replace``s or ``remove``s: it appends to lists (creating them
  when absent) and ``add``s a member, which RFC 6902 defines whether or not
  the member exists (a ``PYTHONPATH`` with an empty or absent ``value``);
- picks names and a mount path no one in the pod uses: the volume
  (``gpuflame``, else ``gpuflame-2`` ...), the init container (unique among
  containers, init and ephemeral containers), the mount path (``/gpuflame``,
  else ``/gpuflame-2`` ... when a profiled container already mounts
  something, or has a block device (``volumeDevices``), there or below).
  A free path rather than skipping: every path
  the pod is given derives from the one mount, so a clash costs nothing,
  while skipping would leave a pod that asked for profiling without it;
- never changes a variable the container defines: its own ``GPUFLAME_*``,
  ``POD_NAME`` ... win (the kubelet uses the last of two definitions, so
  appending ours would override them); ``PYTHONPATH`` is combined, not
  replaced;
- is replayed on a copy of the pod and checked against the API server's
  rules before it is sent (``api_rules.py``): a pod it would still make
  invalid (annotations a few bytes under their 256 KiB limit) is admitted
  as it is, with the reason (``admission.review``);
- gives the init container what Pod Security "restricted" requires and CPU
  and memory requests equal to its limits, so that a quota requiring
  limits admits it and a Guaranteed pod stays Guaranteed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuflame import defaults
from gpuflame.boundary.contract import HOME_ENV
from gpuflame.boundary.settings import Settings, env_name
from gpuflame.version import __version__

MOUNT = "/gpuflame"
VOLUME = "gpuflame"
INIT_NAME = "gpuflame-payload"
INSTALL = "gpuflame-payload-install"
DEFAULT_IMAGE = f"ghcr.io/gpuflame/gpuflame:{__version__}"
DEFAULT_SECRET = "gpuflame-pyroscope"
NONROOT_UID = 65532
# requests == limits: a quota that requires limits admits the pod, a Guaranteed pod stays Guaranteed.
# The install measured 0.8 s of CPU and 20 MB resident (copy and precompile, 3.4 MB written): about 3 s at 250m.
INIT_RESOURCES = {"cpu": "250m", "memory": "128Mi"}

# Secret key -> variable; all optional so a pod starts without the Secret.
SECRET_KEYS = (
    ("url", env_name("pyroscope_url")),
    ("token", "GPUFLAME_PYROSCOPE_TOKEN"),
    ("tenant", env_name("tenant")),
)
FIELD_REFS = (("POD_NAMESPACE", "metadata.namespace"), ("POD_NAME", "metadata.name"), ("NODE_NAME", "spec.nodeName"))


@dataclass(frozen=True)
class Config:
    """What the webhook was started with (``gpuflame webhook`` options)."""

    image: str = DEFAULT_IMAGE
    pyroscope_secret: str = DEFAULT_SECRET
    namespace: str = ""  # the webhook's own: its pods must start while it is down, whatever the selectors say


@dataclass(frozen=True)
class Request:
    """The profiler's settings for one pod, read from its annotations."""

    interval: float = defaults.PUSH_INTERVAL_S
    backend: str = defaults.BACKEND
    service_name: str = ""
    containers: tuple[str, ...] = field(default_factory=tuple)  # empty = every container


@dataclass(frozen=True)
class Layout:
    """The names and the mount path this pod gets: the defaults unless the pod uses them already."""

    volume: str = VOLUME
    init_name: str = INIT_NAME
    mount: str = MOUNT

    @property
    def pythonpath(self) -> str:
        return f"{self.mount}/bootstrap:{self.mount}/lib"


# -- JSON Pointer and list appends ---------------------------------------------------


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON Pointer: ``~`` and ``/`` in a key escaped (annotation keys have ``/``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def add_items(obj: Mapping[str, Any], base: tuple[str | int, ...], key: str, items: list[Any]) -> list[dict]:
    """Append to the list ``obj[key]``, creating it when the pod has none (or an empty one) yet."""
    if not items:
        return []
    if not obj.get(key):
        return [{"op": "add", "path": pointer(*base, key), "value": items}]
    return [{"op": "add", "path": pointer(*base, key, "-"), "value": item} for item in items]


def add_members(obj: Mapping[str, Any] | None, base: tuple[str | int, ...], members: dict[str, str]) -> list[dict]:
    """Set keys of the map at *base* (annotations), creating the map when the object has none."""
    if not obj:
        return [{"op": "add", "path": pointer(*base), "value": members}]
    return [{"op": "add", "path": pointer(*base, key), "value": value} for key, value in members.items()]


# -- names and paths no one uses -------------------------------------------------------


def free_name(wanted: str, taken: set[str]) -> str:
    """*wanted*, else ``wanted-2``, ``wanted-3`` ...: still a DNS label (ours are short)."""
    name, n = wanted, 1
    while name in taken:
        n += 1
        name = f"{wanted}-{n}"
    return name


def _mount_taken(path: str, mounts: list[str]) -> bool:
    """A mount or device at *path* or below it would clash with ours or hide our files."""
    return any(m == path or m.startswith(path + "/") for m in mounts)


def layout_for(spec: Mapping[str, Any], profiled: list[Mapping[str, Any]]) -> Layout:
    """The volume name, init container name and mount path this pod leaves free."""
    volumes = {str(v.get("name")) for v in spec.get("volumes") or []}
    names = {
        str(c.get("name"))
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(key) or []
    }
    mounts = [str(m.get("mountPath", "")).rstrip("/") for c in profiled for m in c.get("volumeMounts") or []]
    mounts += [str(d.get("devicePath", "")).rstrip("/") for c in profiled for d in c.get("volumeDevices") or []]
    mount, n = MOUNT, 1
    while _mount_taken(mount, mounts):
        n += 1
        mount = f"{MOUNT}-{n}"
    return Layout(volume=free_name(VOLUME, volumes), init_name=free_name(INIT_NAME, names), mount=mount)


# -- the parts -----------------------------------------------------------------------


def init_container(config: Config, layout: Layout) -> dict[str, Any]:
    """Copies the payload into the volume; passes Pod Security "restricted" on its own."""
    return {
        "name": layout.init_name,
        "image": config.image,
        "command": [INSTALL, layout.mount],
        "volumeMounts": [{"name": layout.volume, "mountPath": layout.mount}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)},
    }


def settings_env(container_name: str, request: Request, layout: Layout = Layout()) -> dict[str, str]:
    """The profiler's settings for one container, as ``gpuflame run`` passes them (``Settings.to_env``)."""
    settings = Settings(
        enabled=True,
        session_dir=f"{layout.mount}/sessions/{container_name}",
        backend=request.backend,
        interval=request.interval,
        service_name=request.service_name,
    )
    names = ("enabled", "session_dir", "backend", "interval", *["service_name"] * bool(request.service_name))
    return settings.to_env(*names)


def profiler_env(name: str, request: Request, config: Config, layout: Layout) -> list[dict[str, Any]]:
    """The variables gpuflame's bootstrap and Pyroscope pusher read (besides PYTHONPATH)."""
    env: list[dict[str, Any]] = [
        {"name": HOME_ENV, "value": f"{layout.mount}/lib"},
        # the torch backend's compiled hook: the image's home may be read-only, the volume is not
        {"name": "GPUFLAME_CACHE_DIR", "value": f"{layout.mount}/cache"},
    ]
    env += [{"name": var, "value": value} for var, value in settings_env(name, request, layout).items()]
    env += [{"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} for var, path in FIELD_REFS]
    env.append({"name": "CONTAINER_NAME", "value": name})
    env += [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": config.pyroscope_secret, "key": key, "optional": True}}}
        for key, var in SECRET_KEYS
    ]
    return env


def pythonpath_ops(env: list[Mapping[str, Any]], base: tuple[str | int, ...], ours: str) -> tuple[list[dict], list]:
    """(ops on the container's own PYTHONPATH, entries to append): ours first, the container's value kept.

    The kubelet uses the last definition. A literal one (``value`` empty or
    absent included) gets ours in front through ``add``, which sets a member
    whether or not it exists. A ``valueFrom`` cannot be read here, so a
    second PYTHONPATH follows it as ``...:$(PYTHONPATH)``: the kubelet
    expands a reference to a variable defined earlier in the list. A
    PYTHONPATH from the image's ENV or from ``envFrom`` is not visible to
    the webhook and is replaced (set it in ``env`` to keep it).
    """
    found = [i for i, var in enumerate(env) if var.get("name") == "PYTHONPATH"]
    if not found:
        return [], [{"name": "PYTHONPATH", "value": ours}]
    last = env[found[-1]]
    if "valueFrom" in last:
        return [], [{"name": "PYTHONPATH", "value": f"{ours}:$(PYTHONPATH)"}]
    old = str(last.get("value") or "")
    value = f"{ours}:{old}" if old else ours
    return [{"op": "add", "path": pointer(*base, "env", found[-1], "value"), "value": value}], []


def container_patch(spec: Mapping[str, Any], index: int, request: Request, config: Config, layout: Layout) -> list:
    """Env and volume mount for one container; variables it defines itself are left to it."""
    container = spec["containers"][index]
    base: tuple[str | int, ...] = ("spec", "containers", index)
    env = list(container.get("env") or [])
    ops, appended = pythonpath_ops(env, base, layout.pythonpath)
    own = {var.get("name") for var in env}
    appended += [
        var for var in profiler_env(str(container.get("name", "")), request, config, layout) if var["name"] not in own
    ]
    ops += add_items(container, base, "env", appended)
    ops += add_items(
        container, base, "volumeMounts", [{"name": layout.volume, "mountPath": layout.mount, "readOnly": False}]
    )
    return ops


def patch_for(pod: Mapping[str, Any], profiled: list[int], request: Request, config: Config) -> list[dict]:
    """The JSON Patch for the pod's volume, init container and the *profiled* containers (indexes)."""
    spec = pod.get("spec", {})
    layout = layout_for(spec, [spec["containers"][i] for i in profiled])
    ops = add_items(spec, ("spec",), "volumes", [{"name": layout.volume, "emptyDir": {}}])
    ops += add_items(spec, ("spec",), "initContainers", [init_container(config, layout)])
    for index in profiled:
        ops += container_patch(spec, index, request, config, layout)
    return ops

"""What the API server checks of a pod beyond its schema, and Pod Security "restricted", written from their texts.

``kubernetes-validate`` checks a pod against the OpenAPI schema (field
names and types); the API server's validation adds rules the schema cannot
say (unique names, unique mount paths, mounts of volumes that exist), and
Pod Security Admission adds the profile's rules. Only the rules a webhook's
patch can break are here: enough to fail a patch that the API would refuse.
"""

from __future__ import annotations

import functools
from typing import Any

KUBERNETES_VERSION = "1.32.0"
ANNOTATIONS_MAX_BYTES = 256 * 1024  # metadata.annotations: total size of keys and values, in UTF-8 bytes (Go's len)
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in CONTAINER_LISTS for c in spec.get(key) or []]


def schema_errors(pod: dict[str, Any]) -> list[str]:
    """The pod against the Kubernetes 1.32 schema, strict (unknown fields are errors)."""
    import jsonschema
    import kubernetes_validate as kv

    try:
        if (pod.get("apiVersion"), pod.get("kind")) == ("v1", "Pod"):
            pod_validator().validate(pod)
        else:
            kv.validate(pod, KUBERNETES_VERSION, strict=True)
    except jsonschema.ValidationError as exc:  # kubernetes_validate's ValidationError is one
        return [f"{exc.message} at {list(exc.path)}"]
    return []


@functools.cache
def pod_validator() -> Any:
    """What ``kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)`` builds for a v1 Pod, built once.

    It reads and parses the pod's schema and the shared definitions at every call (about 20 ms;
    validating takes under 1 ms): the property test of the webhook's patch checks two pods per example.
    Built from the same files, with the same registry and validator class;
    test_patch.py's test_the_cached_pod_schema_says_what_kubernetes_validate_says compares the two.
    """
    import jsonschema
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    folder = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"
    schema = schema_contents(f"{folder}/pod-v1.json", KUBERNETES_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def api_errors(pod: dict[str, Any]) -> list[str]:
    """The API server's validation rules a patch can break (pkg/apis/core/validation's, in words)."""
    spec, errors = pod["spec"], []
    names = [c["name"] for c in all_containers(spec)]
    if len(names) != len(set(names)):
        errors.append(f"container names are not unique across all containers: {names}")
    volumes = [v["name"] for v in spec.get("volumes") or []]
    if len(volumes) != len(set(volumes)):
        errors.append(f"volume names are not unique: {volumes}")
    for c in all_containers(spec):
        paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
        if len(paths) != len(set(paths)):
            errors.append(f"{c['name']}: mountPath not unique: {paths}")
        devices = [d["devicePath"] for d in c.get("volumeDevices") or []]
        if len(devices) != len(set(devices)):
            errors.append(f"{c['name']}: devicePath not unique: {devices}")
        errors += [f"{c['name']}: {p} is both a mountPath and a devicePath" for p in set(paths) & set(devices)]
        errors += [
            f"{c['name']}: volume {d['name']!r} is both mounted and a device"
            for d in c.get("volumeDevices") or []
            if d["name"] in {m["name"] for m in c.get("volumeMounts") or []}
        ]
        errors += [
            f"{c['name']}: mounts a volume {m['name']!r} the pod lacks"
            for m in c.get("volumeMounts") or []
            if m["name"] not in volumes
        ]
        errors += [
            f"{c['name']}: env {v['name']} has both value and valueFrom"
            for v in c.get("env") or []
            if v.get("value") and "valueFrom" in v
        ]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in (pod["metadata"].get("annotations") or {}).items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(f"annotations of {size} bytes")
    return errors


def restricted_errors(spec: dict[str, Any]) -> list[str]:
    """Pod Security Standards, "restricted" profile (with "baseline"'s rules it includes), for a Linux pod.

    From the standard's tables: privileged and host namespaces off; no host
    ports; capabilities: drop ALL, add at most NET_BIND_SERVICE;
    allowPrivilegeEscalation false; runAsNonRoot true and runAsUser not 0
    (container setting, else the pod's); seccompProfile RuntimeDefault or
    Localhost (container, else pod); volumes of the allowed types only.
    """
    pod_sc = spec.get("securityContext") or {}
    errors = [f"spec.{f} is set" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    errors += [
        f"volume {v['name']} is not of an allowed type"
        for v in spec.get("volumes") or []
        if not set(v) - {"name"} <= RESTRICTED_VOLUMES
    ]
    for c in all_containers(spec):
        sc, where = c.get("securityContext") or {}, c["name"]
        caps = sc.get("capabilities") or {}
        if sc.get("privileged"):
            errors.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation is not false")
        if "ALL" not in (caps.get("drop") or []):
            errors.append(f"{where}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            errors.append(f"{where}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            errors.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            errors.append(f"{where}: runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            errors.append(f"{where}: seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
        errors += [f"{where}: hostPort {p['hostPort']}" for p in c.get("ports") or [] if p.get("hostPort")]
    return errors

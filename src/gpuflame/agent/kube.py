"""Kubernetes placement of a process: namespace, pod, container (and the node), from its cgroup.

The container id is in the process's cgroup path (systemd or cgroupfs
drivers, containerd, CRI-O, Docker). The container runtime keeps each
container's OCI ``config.json`` with the kubelet's annotations (namespace, pod
and container names): reading it needs only a read-only hostPath, no API
access and no cluster-wide RBAC. Where no runtime state is readable, the
namespace comes from the pod's service-account mount and the pod name from its
hostname (as the kubelet sets it); the container is then unknown.

Those two files belong to the container: they are read inside its root
(:mod:`gpuflame.agent.confined`: no link leads out, no FIFO blocks), a few
bytes at most, and used only if they read as a Kubernetes name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuflame.agent.confined import read_in_root
from gpuflame.agent.lru import LRU

_CONTAINER_ID = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

# where runtimes keep each container's OCI spec, under the host root
RUNTIME_SPECS = (
    "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
    "run/containers/storage/overlay-containers/{id}/userdata/config.json",
    "var/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
)
# annotation -> label, for containerd (CRI) and CRI-O
ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-namespace": "namespace",
    "io.kubernetes.cri.sandbox-name": "pod",
    "io.kubernetes.cri.container-name": "container",
    "io.kubernetes.pod.namespace": "namespace",
    "io.kubernetes.pod.name": "pod",
    "io.kubernetes.container.name": "container",
}
SERVICE_ACCOUNT_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
NAME_BYTES = 256  # a namespace or a hostname is at most 63 characters
SPEC_BYTES = 4 << 20  # a runtime's config.json
CONTAINERS_KEPT = 4096  # containers whose labels are remembered (the oldest forgotten first)
# a namespace, and the hostname the kubelet gives a pod (its name cut at 63): an RFC 1123 label
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def container_id(cgroup_text: str) -> tuple[str, str]:
    """(container id, pod uid) from ``/proc/PID/cgroup``; empty strings when not in a pod's container."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        last = path.rstrip("/").rsplit("/", 1)[-1]
        m = _CONTAINER_ID.search(last)
        if m:
            pod = _POD_UID.search(path)
            return m.group(1), pod.group(1).replace("_", "-") if pod else ""
    return "", ""


def _read(root: str, path: str, limit: int) -> str:
    """A regular file inside *root*, cut at *limit* bytes; empty where it cannot be read that way."""
    data = read_in_root(root, path, limit)
    return "" if data is None else data.decode("utf-8", errors="replace")


def _k8s_name(text: str) -> str:
    """*text* if it reads as a Kubernetes namespace or pod hostname, else empty."""
    text = text.strip()
    return text if _K8S_NAME.fullmatch(text) else ""


@dataclass
class Placement:
    """Labels per process: node always, the rest when the process runs in a pod."""

    host_root: str = "/"
    node: str = ""
    _cache: LRU[str, dict[str, str]] = field(default_factory=lambda: LRU(CONTAINERS_KEPT))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Placement:
        """``NODE_NAME`` (Downward API), ``GPUFLAME_HOST_ROOT`` where the host's /run is mounted."""
        env = os.environ if env is None else env
        return cls(env.get("GPUFLAME_HOST_ROOT", "/"), env.get("NODE_NAME", ""))

    def labels(self, pid: int) -> dict[str, str]:
        out = {"node": self.node} if self.node else {}
        cid, _uid = container_id(_read(f"/proc/{pid}", "cgroup", 1 << 16))
        if not cid:
            return out
        found = self._cache.get(cid)
        if found is None:
            found = self._cache[cid] = self.from_runtime(cid) or self.from_inside(pid)
        return {**out, **found}

    def from_runtime(self, cid: str) -> dict[str, str]:
        """The kubelet's annotations in the runtime's OCI spec of the container."""
        for pattern in RUNTIME_SPECS:
            text = _read(self.host_root, pattern.format(id=cid), SPEC_BYTES)
            if not text:
                continue
            try:
                annotations = json.loads(text).get("annotations") or {}
            except (ValueError, AttributeError):
                continue
            found = {label: str(annotations[key]) for key, label in ANNOTATIONS.items() if annotations.get(key)}
            if found:
                return found
        return {}

    @staticmethod
    def from_inside(pid: int) -> dict[str, str]:
        """Namespace from the service-account mount, pod from the hostname, as the process sees them."""
        root = f"/proc/{pid}/root"
        out = {}
        namespace = _k8s_name(_read(root, SERVICE_ACCOUNT_NAMESPACE, NAME_BYTES))
        if namespace:
            out["namespace"] = namespace
        pod = _k8s_name(_read(root, "etc/hostname", NAME_BYTES))
        if pod:
            out["pod"] = pod
        return out

"""Render deploy/kubernetes/ with kubectl's kustomize, offline, and validate against Kubernetes 1.32's schemas."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO as ROOT

yaml = pytest.importorskip("yaml")


K8S = ROOT / "deploy" / "kubernetes"


KUBECTL = shutil.which("kubectl")


KUBERNETES_VERSION = "1.32.0"


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (make tools installs it)")


def kustomize(path: Path) -> list[dict]:
    # A plain `kubectl kustomize`, as Argo CD and Flux run it: no --load-restrictor.
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert docs, f"{path} rendered nothing"
    return docs


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def validate(doc: dict) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    if (doc["apiVersion"], doc["kind"]) in CRDS:
        validate_cert_manager(doc)
        return
    try:
        kv.validate(doc, KUBERNETES_VERSION, strict=True)
    except kv.ValidationError as e:
        pytest.fail(f"{doc['kind']}/{doc['metadata'].get('name')}: {e.message} at {list(e.path)}")


CRDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


def validate_cert_manager(doc: dict) -> None:
    """Loose: the shape of the two cert-manager kinds we use."""
    assert doc["metadata"]["name"] and doc["metadata"].get("namespace") == "gpuflame-system"
    spec = doc["spec"]
    if doc["kind"] == "Issuer":
        assert set(spec) == {"selfSigned"}
    else:
        assert set(spec) <= {
            "secretName",
            "commonName",
            "dnsNames",
            "duration",
            "renewBefore",
            "privateKey",
            "usages",
            "issuerRef",
            "isCA",
            "subject",
        }
        assert spec["secretName"] and spec["issuerRef"]["kind"] in {"Issuer", "ClusterIssuer"}

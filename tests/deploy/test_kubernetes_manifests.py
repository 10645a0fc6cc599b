"""deploy/kubernetes/: every overlay and example renders with `kubectl kustomize`,
offline, and what it renders is valid Kubernetes 1.32 and least-privileged.

Schemas: the PyPI package kubernetes-validate (pinned in the test extras) carries
the OpenAPI schemas of Kubernetes releases; documents are checked in strict mode
(unknown fields are errors). cert-manager's Issuer and Certificate are CRDs that
it has no schema for: they are checked loosely here (apiVersion, kind, the fields
we rely on), not against cert-manager's CRD schema.

Skips when kubectl is absent (make tools installs it where it can), or, for the
self-signed overlay, when openssl is.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.kubernetes import (
    K8S,
    KUBECTL,
    ROOT,
    find,
    kustomize,
    needs_kubectl,
    validate,
    yaml,
)

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*", "escalate", "bind", "impersonate"}


@pytest.fixture(scope="module")
def self_signed_tree(tmp_path_factory) -> Path:
    """A copy of deploy/kubernetes with make-certs.sh run in it (the overlay needs its output)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    tree = tmp_path_factory.mktemp("k8s") / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("tls.*", "ca.crt", "cabundle-patch.yaml"))
    # the copy keeps deploy/grafana at the same relative place for the stack
    shutil.copytree(ROOT / "deploy" / "grafana", tree.parent / "grafana")
    subprocess.run(
        ["sh", str(tree / "overlays" / "self-signed" / "make-certs.sh")], check=True, capture_output=True, timeout=60
    )
    return tree


RENDERED = ["overlays/cert-manager", "overlays/stack", "base/webhook", "base/observability", "examples/vllm-aks"]


@needs_kubectl
def test_every_kustomization_renders_without_load_restrictor(self_signed_tree):
    """GitOps tools run a plain `kubectl kustomize`: no kustomization may read files outside its folder.

    Every kustomization under deploy/ is found (none can be forgotten in RENDERED); the
    self-signed overlay is rendered in the copy where make-certs.sh has made its files.
    """
    found = sorted(p.parent for p in (ROOT / "deploy").rglob("kustomization.yaml"))
    assert len(found) >= 7
    for folder in found:
        rel = folder.relative_to(K8S) if folder.is_relative_to(K8S) else None
        target = self_signed_tree / rel if rel == Path("overlays/self-signed") else folder
        assert kustomize(target), folder


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (make tools installs it)")
    return {name: kustomize(K8S / name) for name in RENDERED}


# -- rendering and schemas ------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("name", RENDERED)
def test_renders_and_matches_the_kubernetes_schemas(rendered, name):
    for doc in rendered[name]:
        validate(doc)


@needs_kubectl
def test_self_signed_overlay_renders_with_the_generated_certificate(self_signed_tree):
    docs = kustomize(self_signed_tree / "overlays" / "self-signed")
    for doc in docs:
        validate(doc)
    secret = find(docs, "Secret")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key"}
    hook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"]
    # the Deployment mounts the generated (hash-suffixed) Secret
    volumes = find(docs, "Deployment", "gpuflame-webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls"}.items() <= next(v for v in volumes if v["name"] == "tls").items()
    assert next(v for v in volumes if v["name"] == "tls")["secret"]["secretName"] == secret["metadata"]["name"]


def test_self_signed_certificates_are_not_committed():
    generated = K8S / "overlays" / "self-signed" / "generated"
    assert (generated / ".gitignore").read_text().splitlines()[-2:] == ["*", "!.gitignore"]


# -- the webhook: least privilege -----------------------------------------------


@needs_kubectl
def test_webhook_deployment_is_locked_down(rendered):
    dep = find(rendered["overlays/cert-manager"], "Deployment", "gpuflame-webhook")
    assert dep["metadata"]["namespace"] == "gpuflame-system"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc.get("privileged", False) is False
    assert c["resources"]["requests"] and c["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"]) == ("/healthz", "HTTPS")
        assert get["port"] in (8443, "https")
    assert {"name": "https", "containerPort": 8443, "protocol": "TCP"} in c["ports"]
    # the agreed command line
    argv = c["command"] + c["args"]
    assert argv[:2] == ["gpuflame", "webhook"]
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert opts["--tls-cert"] == "/tls/tls.crt" and opts["--tls-key"] == "/tls/tls.key"
    assert opts["--port"] == "8443" and opts["--pyroscope-secret"] == "gpuflame-pyroscope"
    assert opts["--image"]
    # --namespace's default: the webhook knows its own namespace, whose pods it never changes
    own = next(e for e in c["env"] if e["name"] == "POD_NAMESPACE")
    assert own["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}} and "--namespace" not in opts
    tls = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert tls["mountPath"] == "/tls" and tls["readOnly"] is True


@needs_kubectl
def test_webhook_service_maps_443_to_8443(rendered):
    svc = find(rendered["overlays/cert-manager"], "Service", "gpuflame-webhook")
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 443 and port["targetPort"] in (8443, "https")


@needs_kubectl
def test_webhook_configuration_never_blocks_pods(rendered):
    docs = rendered["overlays/cert-manager"]
    cfg = find(docs, "MutatingWebhookConfiguration")
    assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpuflame-system/gpuflame-webhook"
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["timeoutSeconds"] <= 10
    service = hook["clientConfig"]["service"]
    assert service == {"name": "gpuflame-webhook", "namespace": "gpuflame-system", "path": "/mutate", "port": 443}
    (rule,) = hook["rules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"] and rule["apiGroups"] == [""]
    excluded = next(
        e for e in hook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
    )
    assert excluded["operator"] == "NotIn" and "kube-system" in excluded["values"]
    assert "gpuflame-system" not in excluded["values"]  # its own namespace: by label (see below), not by name
    # the certificate covers the name the API server calls
    cert = find(docs, "Certificate")
    assert f"{service['name']}.{service['namespace']}.svc" in cert["spec"]["dnsNames"]
    dep = find(docs, "Deployment", "gpuflame-webhook")
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "tls")["secret"]["secretName"] == cert["spec"]["secretName"]


@needs_kubectl
def test_no_cluster_wide_write_permission(rendered):
    for name, docs in rendered.items():
        for doc in docs:
            if doc["kind"] in ("ClusterRole", "Role"):
                for rule in doc.get("rules", []):
                    assert not WRITE_VERBS & set(rule.get("verbs", [])), f"{name}: {doc['kind']} grants {rule}"
            assert doc["kind"] != "ClusterRoleBinding" or doc["roleRef"]["name"] == "view", name


@needs_kubectl
def test_central_pods_run_as_non_root(rendered):
    """gpuflame-system enforces Pod Security 'restricted'; every pod there must pass it."""
    docs = rendered["overlays/stack"]
    ns = find(docs, "Namespace", "gpuflame-system")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            for c in pod["containers"]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


# -- which pods call the webhook: selectors on labels ------------------------------


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A label selector as the API server evaluates it (matchLabels; In, NotIn, Exists, DoesNotExist)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels[key] in values):
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def namespace_labels(name: str, labels: dict[str, str] | None = None) -> dict[str, str]:
    """A namespace's labels as the API server keeps them: its name is one (kubernetes.io/metadata.name)."""
    return {**(labels or {}), "kubernetes.io/metadata.name": name}


def assert_own_namespace_excluded(docs: list[dict]) -> None:
    hook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    ns = find(docs, "Namespace")
    assert find(docs, "Deployment", "gpuflame-webhook")["metadata"]["namespace"] == ns["metadata"]["name"]
    assert hook["clientConfig"]["service"]["namespace"] == ns["metadata"]["name"]  # where the Service is
    assert not selects(hook["namespaceSelector"], namespace_labels(ns["metadata"]["name"], ns["metadata"]["labels"]))


@needs_kubectl
def test_the_api_server_calls_the_webhook_only_for_opted_in_pods_outside_excluded_namespaces(rendered):
    """objectSelector: a pod without the label costs no call; namespaceSelector: by labels, never our name."""
    docs = rendered["overlays/cert-manager"]
    hook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert_own_namespace_excluded(docs)
    namespaces = hook["namespaceSelector"]
    assert selects(namespaces, namespace_labels("ml"))
    assert not selects(namespaces, namespace_labels("ml", {"gpuflame.io/injection": "disabled"}))
    for control_plane in ("kube-system", "kube-public", "kube-node-lease"):
        assert not selects(namespaces, namespace_labels(control_plane))
    pods = hook["objectSelector"]
    assert selects(pods, {"gpuflame.io/inject": "true", "app": "x"})
    for labels in ({}, {"gpuflame.io/inject": "false"}, {"app": "x"}):
        assert not selects(pods, labels)


@needs_kubectl
def test_installed_in_another_namespace_the_webhook_still_skips_its_own(tmp_path: Path):
    """An overlay with its own `namespace:`: kustomize renames the Namespace, whose label keeps it excluded."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(K8S, tree)
    overlay = tree / "overlays" / "elsewhere"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: ml-tools\n"
        "resources:\n  - ../../base/webhook\n"
    )
    docs = kustomize(overlay)
    assert find(docs, "Namespace")["metadata"]["name"] == "ml-tools"
    assert_own_namespace_excluded(docs)


# -- the self-hosted stack ------------------------------------------------------


@needs_kubectl
def test_stack_provisions_grafana_from_deploy_grafana(rendered):
    docs = rendered["overlays/stack"]
    pyro = find(docs, "Service", "pyroscope")
    assert pyro["spec"]["ports"][0]["port"] == 4040
    assert find(docs, "StatefulSet", "pyroscope")["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "grafana/pyroscope:"
    )
    grafana = find(docs, "Deployment", "grafana")["spec"]["template"]["spec"]
    (c,) = grafana["containers"]
    assert c["image"].startswith("grafana/grafana:")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUFLAME_PYROSCOPE_URL"] == "http://pyroscope.gpuflame-system.svc.cluster.local:4040"
    # the ConfigMaps hold the files of deploy/grafana unchanged
    grafana_dir = ROOT / "deploy" / "grafana"
    expected = {
        "pyroscope.yaml": grafana_dir / "provisioning" / "datasources" / "pyroscope.yaml",
        "gpuflame.yaml": grafana_dir / "provisioning" / "dashboards" / "gpuflame.yaml",
        "gpuflame-gpu-memory.json": grafana_dir / "dashboards" / "gpuflame-gpu-memory.json",
    }
    data = {k: v for d in docs if d["kind"] == "ConfigMap" for k, v in d.get("data", {}).items()}
    for key, path in expected.items():
        assert data[key] == path.read_text(), key
    # mounted where the provisioning files say
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name", "") for v in grafana["volumes"]}
    by_map = {volumes[n].rsplit("-", 1)[0]: p for n, p in mounts.items() if volumes.get(n)}
    assert by_map["grafana-datasources"] == "/etc/grafana/provisioning/datasources"
    assert by_map["grafana-dashboard-providers"] == "/etc/grafana/provisioning/dashboards"
    provider = yaml.safe_load(expected["gpuflame.yaml"].read_text())["providers"][0]
    assert by_map["grafana-dashboards-gpuflame"] == provider["options"]["path"]


# -- the vLLM example -----------------------------------------------------------


@needs_kubectl
def test_vllm_example_targets_an_aks_gpu_pool_and_opts_in(rendered):
    docs = rendered["examples/vllm-aks"]
    pod_template = find(docs, "Deployment", "vllm")["spec"]["template"]
    ann = pod_template["metadata"]["annotations"]
    assert pod_template["metadata"]["labels"]["gpuflame.io/inject"] == "true"  # what the objectSelector sees
    assert ann["gpuflame.io/service-name"] == "vllm"
    hook = find(kustomize(K8S / "base" / "webhook"), "MutatingWebhookConfiguration")["webhooks"][0]
    assert selects(hook["objectSelector"], pod_template["metadata"]["labels"])
    spec = pod_template["spec"]
    assert spec["nodeSelector"] == {"kubernetes.azure.com/accelerator": "nvidia"}
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in spec["tolerations"]
    (c,) = spec["containers"]
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    secret = find(docs, "Secret", "gpuflame-pyroscope")
    assert set(secret["stringData"]) == {"url", "token", "tenant"}
    assert "FAKE" in secret["stringData"]["token"]
    # the Secret must be in the workload's namespace
    assert secret["metadata"]["namespace"] == find(docs, "Deployment", "vllm")["metadata"]["namespace"]

"""deploy/kubernetes/overlays/agent: the node agent's DaemonSet renders, is valid Kubernetes 1.32,
and asks for no more than the agent needs (hostPID and three capabilities, not privileged)."""

from __future__ import annotations

import pytest

from tests.helpers.kubernetes import K8S, find, kustomize, needs_kubectl, validate


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return kustomize(K8S / "overlays" / "agent")


@needs_kubectl
def test_agent_overlay_matches_the_kubernetes_schemas(docs):
    for doc in docs:
        validate(doc)
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "DaemonSet"}


@needs_kubectl
def test_agent_daemonset_least_privilege(docs):
    ds = find(docs, "DaemonSet", "gpuflame-agent")
    assert ds["metadata"]["namespace"] == "gpuflame-agent"
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "PERFMON", "SYS_PTRACE"]}
    for mount in c["volumeMounts"]:
        host = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in host or mount["readOnly"] is True, mount
    # no folder is ever made on the node: each host path must already be there
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            assert volume["hostPath"].get("type") in ("Directory", "File"), volume
    assert c["image"] == "ghcr.io/gpuflame/gpuflame-agent:0.1.0"
    argv = c["command"] + c["args"]
    assert argv[:2] == ["gpuflame", "agent"] and "--pyroscope" in argv
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GPUFLAME_PYROSCOPE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "gpuflame-pyroscope"
    # GPU nodes of AKS (as examples/vllm-aks) or of a GPU Operator cluster: either label schedules it
    assert "nodeSelector" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    wanted = [
        {"key": "kubernetes.azure.com/accelerator", "operator": "In", "values": ["nvidia"]},
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
    ]
    assert [t["matchExpressions"] for t in terms] == [[w] for w in wanted]  # terms are ORed
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod["tolerations"]


@needs_kubectl
def test_agent_liveness_reads_the_file_the_agent_touches(docs):
    """The probe runs the agent's own check on the very file its --alive-file names, in a writable volume."""
    from gpuflame.cli.main import build_parser

    c = find(docs, "DaemonSet", "gpuflame-agent")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    probe = c["livenessProbe"]["exec"]["command"]
    assert probe[:3] == ["python", "-m", "gpuflame.agent.alive"] and probe[3:] == [args.alive_file]
    store = next(m for m in c["volumeMounts"] if m["name"] == "store")
    assert args.alive_file.startswith(store["mountPath"] + "/")
    assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] >= 60


@needs_kubectl
def test_agent_requests_cover_what_it_was_measured_to_use(docs):
    """Idle it holds ~94 MiB resident plus 62.5 MiB of BPF maps charged to its cgroup (BENCHMARKS.md)."""
    c = find(docs, "DaemonSet", "gpuflame-agent")["spec"]["template"]["spec"]["containers"][0]
    mib = {"Mi": 1, "Gi": 1024}

    def size(text: str) -> int:
        return int(text[:-2]) * mib[text[-2:]]

    assert size(c["resources"]["requests"]["memory"]) >= 94 + 63
    assert size(c["resources"]["limits"]["memory"]) >= 2 * size(c["resources"]["requests"]["memory"])


@needs_kubectl
def test_agent_namespace_is_its_own(docs):
    ns = find(docs, "Namespace", "gpuflame-agent")
    # gpuflame-system enforces 'restricted', which hostPID breaks: the agent lives apart
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]


@needs_kubectl
def test_agent_args_are_the_cli_s(docs):
    """The DaemonSet's command line parses with gpuflame agent's own parser."""
    from gpuflame.cli.main import build_parser

    c = find(docs, "DaemonSet", "gpuflame-agent")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    assert args.command == "agent" and args.interval == 15.0 and args.pyroscope == ["$(GPUFLAME_PYROSCOPE_URL)"]


# What the agent's stop does besides the ring and the push: the probes off, the snapshot, the write and the exit,
# at most 3 s measured while a process flooding the driver shared the agent's CPU (BENCHMARKS.md); twice that.
REST_OF_THE_STOP_S = 6.0


@needs_kubectl
def test_agent_grace_period_covers_its_stop(docs):
    """SIGTERM (a node drain, a rollout) must leave the agent time to write its last profile and push it: the
    bounded read of the ring, the final push's bound and the rest of the stop, before the kubelet's SIGKILL."""
    from gpuflame.agent.agent import COUNT_AT_STOP_S, DRAIN_AT_STOP_S
    from gpuflame.agent.push import FINAL_PUSH_S

    pod = find(docs, "DaemonSet", "gpuflame-agent")["spec"]["template"]["spec"]
    stop = DRAIN_AT_STOP_S + COUNT_AT_STOP_S + FINAL_PUSH_S + REST_OF_THE_STOP_S
    assert pod["terminationGracePeriodSeconds"] >= stop

"""Kubernetes placement from cgroups and the runtime's container specs; pushes to Pyroscope per container."""

from __future__ import annotations

import json
import signal
import time

import pytest

from gpuflame.agent.kube import Placement, container_id
from gpuflame.agent.push import series_of
from gpuflame.model import Frame, Profile, memory_sample_types
from tests.agent.agent_expected import replay
from tests.agent.agent_helpers import agent_cli, booked, wait_for, watching

CID = "3f4e1c2b" * 8
UID = "5b7c0a52-9d1e-4c4f-8a0e-2f6d1b9c7e31"

CGROUPS = {
    # systemd driver, containerd (AKS, GKE)
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope\n": (CID, UID),
    # cgroupfs driver, cgroup v1 lines
    f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu:/kubepods/besteffort/pod{UID}/{CID}\n": (CID, UID),
    # CRI-O
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n": (CID, UID),
    # not in a container
    "0::/user.slice/user-0.slice/session-1.scope\n": ("", ""),
    "0::/init.scope\n": ("", ""),
}


@pytest.mark.parametrize(("text", "expected"), CGROUPS.items())
def test_container_id_from_cgroup(text, expected):
    assert container_id(text) == expected


@pytest.mark.parametrize(
    ("layout", "annotations"),
    [
        (
            "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
            {
                "io.kubernetes.cri.sandbox-namespace": "serving",
                "io.kubernetes.cri.sandbox-name": "vllm-7d9f8b6c4-x2k9q",
                "io.kubernetes.cri.container-name": "vllm",
            },
        ),
        (
            "run/containers/storage/overlay-containers/{id}/userdata/config.json",
            {
                "io.kubernetes.pod.namespace": "serving",
                "io.kubernetes.pod.name": "vllm-7d9f8b6c4-x2k9q",
                "io.kubernetes.container.name": "vllm",
            },
        ),
    ],
)
def test_placement_from_the_runtime_spec(tmp_path, layout, annotations):
    """The kubelet's annotations in the runtime's OCI spec (a file laid out as containerd / CRI-O keep it)."""
    spec = tmp_path / layout.format(id=CID)
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"ociVersion": "1.1.0", "annotations": annotations}))
    placement = Placement(str(tmp_path), "aks-gpu-0")
    assert placement.from_runtime(CID) == {"namespace": "serving", "pod": "vllm-7d9f8b6c4-x2k9q", "container": "vllm"}
    assert placement.from_runtime("0" * 64) == {}


def test_a_host_process_gets_only_the_node():
    """This test's own process runs in no pod's container."""
    import os

    placement = Placement.from_env({"NODE_NAME": "aks-gpu-0"})
    labels = placement.labels(os.getpid())
    if container_id(open("/proc/self/cgroup").read())[0]:
        pytest.skip("the tests run inside a container here")
    assert labels == {"node": "aks-gpu-0"}


def test_series_per_container():
    profile = Profile(sample_types=memory_sample_types())
    f = [Frame("forward", "m.py", 3)]
    pod = {"namespace": "serving", "pod": "vllm-7d9f8b6c4-x2k9q", "container": "vllm", "node": "n1"}
    profile.add(f, [1] * 6, {"pid": "10", "device": "cuda", "comm": "python3", **pod})
    profile.add(f, [2] * 6, {"pid": "11", "device": "cuda", "comm": "python3", **pod})
    profile.add(f, [4] * 6, {"pid": "12", "device": "cuda", "comm": "trainer", "node": "n1"})
    series = series_of(profile, "")
    keys = {dict(k)["service_name"]: dict(k) for k in series}
    assert keys["vllm"] == {"service_name": "vllm", **pod}
    assert keys["trainer"] == {"service_name": "trainer", "node": "n1"}
    assert series[tuple(sorted(keys["vllm"].items()))].totals()["alloc_space"] == 3


def test_agent_pushes_to_pyroscope_every_interval(start_target, bpf_object, push_pb2, profile_pb2, tmp_path):
    import threading

    from tests.helpers.pyroscope_server import Server, decode_push  # the loopback Pyroscope of the pusher's own tests

    server = Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = start_target("3.11")
        target.ready()
        proc = agent_cli(
            "--pid",
            str(target.pid),
            "--pyroscope",
            server.url,
            "--interval",
            "0.5s",
            "--service-name",
            "trainer",
            "-o",
            str(tmp_path / "agent.pb.gz"),  # a file: an output is never a device (it once replaced /dev/null)
        )
        watching(proc)
        target.run("basic")
        deadline = time.monotonic() + 20
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
    finally:
        server.shutdown()
        server.server_close()
    assert server.requests, stderr
    pushed = [decode_push(r["body"], push_pb2, profile_pb2) for r in server.requests]
    labels = {k: v for series in pushed for lab, _ in series for k, v in lab.items()}
    assert labels["service_name"] == "trainer" and labels["__name__"] == "gpu_memory"
    # allocated bytes summed over the interval pushes = what the target allocated
    alloc = 0
    for series in pushed:
        for _, pprof in series:
            index = [pprof.string_table[t.type] for t in pprof.sample_type].index("alloc_space")
            alloc += sum(s.value[index] for s in pprof.sample)
    assert alloc == sum(v[4] for v in replay(target.records).values())
    assert "sent" in stderr


def test_a_ranked_process_s_samples_carry_its_rank(start_target, agent_for):
    """A process torchrun (or srun, mpirun) started: the agent reads its rank from /proc/PID/environ."""
    target = start_target("3.11", prefix=("env", "RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4"))
    target.ready()
    agent = agent_for(target.pid)
    target.run("basic")
    assert wait_for(lambda: booked(agent, target.records))  # the reader books on its own thread
    profile = agent.snapshot()
    assert profile.samples
    assert {(s.label("rank"), s.label("local_rank"), s.label("world_size")) for s in profile.samples} == {
        ("3", "1", "4")
    }

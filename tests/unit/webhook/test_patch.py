"""The webhook's JSON Patch is valid for every pod the API accepts, and its init container for every namespace.

Pods are generated (hypothesis) within the Kubernetes 1.32 schema and the
API's own rules, sent through ``admission.review``, the patch is applied with
the ``jsonpatch`` package (not ours) and the result checked against the same
schema and rules (``pod_rules.py``), and against what the pod had: nothing of
the user's removed, replaced or overridden.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from gpuflame.webhook import admission, api_rules
from tests.helpers.pod_rules import (
    ANNOTATIONS_MAX_BYTES,
    all_containers,
    api_errors,
    restricted_errors,
    schema_errors,
)

jsonpatch = pytest.importorskip("jsonpatch")
pytest.importorskip("kubernetes_validate")
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

OPT_IN = {"gpuflame.io/inject": "true"}
BLOCK = "blockdev"  # a PersistentVolumeClaim volume a container may use as a raw device (volumeDevices)


def review(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[dict]]:
    """(response, patched pod, ops) for one pod, the patch applied by ``jsonpatch``."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": copy.deepcopy(pod),
        },
    }
    response = admission.review(body)["response"]
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return response, jsonpatch.apply_patch(copy.deepcopy(pod), ops), ops


def make_pod(containers: list[dict], labels: dict | None = None, annotations: dict | None = None, **spec: Any) -> dict:
    """Opted in by the label and (as before the label, and so that these tests run on the old code) the annotation."""
    meta: dict[str, Any] = {"name": "p", "namespace": "ml", "labels": dict(OPT_IN if labels is None else labels)}
    annotations = dict(OPT_IN) if annotations is None else annotations
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers, **spec}}


def last(env: list[dict], name: str) -> dict:
    """The definition the kubelet uses: the last of that name."""
    return [v for v in env if v["name"] == name][-1]


def test_the_cached_pod_schema_says_what_kubernetes_validate_says() -> None:
    """schema_errors validates v1 Pods with a validator built once (pod_rules.pod_validator): the same verdicts."""
    import kubernetes_validate as kv

    from tests.helpers.pod_rules import KUBERNETES_VERSION, pod_validator

    def theirs(pod: dict) -> list[str]:
        try:
            kv.validate(pod, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as exc:
            return [f"{exc.message} at {list(exc.path)}"]
        return []

    good = make_pod([{"name": "app", "image": "x", "env": [{"name": "A", "value": "1"}]}])
    unknown_field = make_pod([{"name": "app", "image": "x", "colour": "blue"}])
    wrong_type = make_pod([{"name": "app", "image": "x", "env": [{"name": "A", "value": 1}]}])
    no_name = make_pod([{"image": "x"}])
    assert schema_errors(good) == theirs(good) == []
    for bad in (unknown_field, wrong_type, no_name):
        assert schema_errors(bad) == theirs(bad) != [], bad
    assert pod_validator() is pod_validator()  # built once


# -- the cases of the issue ---------------------------------------------------------


@pytest.mark.parametrize("var", [{"name": "PYTHONPATH"}, {"name": "PYTHONPATH", "value": ""}])
def test_an_empty_pythonpath_gets_ours_without_a_replace_of_an_absent_field(var: dict) -> None:
    """The API server drops ``value: ""`` before the webhook sees it; a ``replace`` there was an invalid patch."""
    pod = make_pod([{"name": "app", "image": "x", "env": [{"name": "A", "value": "1"}, var]}])
    response, patched, ops = review(pod)
    assert {op["op"] for op in ops} == {"add"}
    env = patched["spec"]["containers"][0]["env"]
    assert last(env, "PYTHONPATH")["value"] == "/gpuflame/bootstrap:/gpuflame/lib"
    assert [v["name"] for v in env].count("PYTHONPATH") == 1 and env[0] == {"name": "A", "value": "1"}
    assert schema_errors(patched) == api_errors(patched) == []


def test_a_container_mounting_the_path_already_gets_a_free_one() -> None:
    containers = [
        {"name": "app", "image": "x", "volumeMounts": [{"name": "mine", "mountPath": "/gpuflame"}]},
        {"name": "side", "image": "y", "volumeMounts": [{"name": "mine", "mountPath": "/gpuflame-2/lib"}]},
    ]
    pod = make_pod(containers, volumes=[{"name": "mine", "emptyDir": {}}])
    _, patched, _ = review(pod)
    assert api_errors(patched) == [] and schema_errors(patched) == []
    spec = patched["spec"]
    (init,) = spec["initContainers"]
    assert init["command"] == ["gpuflame-payload-install", "/gpuflame-3"]
    for c in spec["containers"]:
        assert {"name": "gpuflame", "mountPath": "/gpuflame-3", "readOnly": False} in c["volumeMounts"]
        assert last(c["env"], "PYTHONPATH")["value"] == "/gpuflame-3/bootstrap:/gpuflame-3/lib"
        assert last(c["env"], "GPUFLAME_SESSION_DIR")["value"] == f"/gpuflame-3/sessions/{c['name']}"
    assert spec["containers"][0]["volumeMounts"][0] == {"name": "mine", "mountPath": "/gpuflame"}


def test_names_the_pod_uses_are_left_to_it() -> None:
    """A volume named gpuflame or a container named gpuflame-payload of the user's: ours take the next free name."""
    pod = make_pod(
        [{"name": "gpuflame-payload", "image": "x"}],
        volumes=[{"name": "gpuflame", "emptyDir": {}}],
        initContainers=[{"name": "gpuflame-payload-2", "image": "z"}],
    )
    response, patched, _ = review(pod)
    assert "gpuflame.io/skipped" not in patched["metadata"].get("annotations", {})
    assert api_errors(patched) == [] and schema_errors(patched) == []
    spec = patched["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["gpuflame", "gpuflame-2"]
    assert [c["name"] for c in spec["initContainers"]] == ["gpuflame-payload-2", "gpuflame-payload-3"]
    assert spec["initContainers"][1]["volumeMounts"] == [{"name": "gpuflame-2", "mountPath": "/gpuflame"}]


def test_variables_the_container_defines_are_never_overridden() -> None:
    env = [{"name": "POD_NAME", "value": "mine"}, {"name": "GPUFLAME_INTERVAL", "value": "60"}]
    _, patched, _ = review(make_pod([{"name": "app", "image": "x", "env": copy.deepcopy(env)}]))
    names = [v["name"] for v in patched["spec"]["containers"][0]["env"]]
    assert patched["spec"]["containers"][0]["env"][:2] == env
    assert names.count("POD_NAME") == 1 and names.count("GPUFLAME_INTERVAL") == 1 and "GPUFLAME_HOME" in names


def test_a_windows_pod_is_admitted_as_it_is_with_the_reason() -> None:
    pod = make_pod([{"name": "app", "image": "x"}], os={"name": "windows"})
    response, patched, ops = review(pod)
    assert response["allowed"] is True and response["warnings"] == [
        "gpuflame: a Windows pod: gpuflame's payload is for Linux"
    ]
    assert patched["spec"] == pod["spec"]
    assert patched["metadata"]["annotations"] == {
        **OPT_IN,
        "gpuflame.io/skipped": "a Windows pod: gpuflame's payload is for Linux",
    }


def test_only_the_label_opts_in_when_both_are_there_and_a_label_alone_is_enough() -> None:
    _, patched, _ = review(make_pod([{"name": "app", "image": "x"}], annotations={}))
    assert patched["metadata"]["annotations"] == {"gpuflame.io/injected": "true"}  # made: the pod had none
    response, _, ops = review(
        make_pod(
            [{"name": "app", "image": "x"}],
            labels={"gpuflame.io/inject": "false"},
            annotations={"gpuflame.io/inject": "true"},
        )
    )
    assert ops == [] and "warnings" not in response


# -- Pod Security "restricted" and quotas ----------------------------------------------


def restricted_pod() -> dict:
    """A workload that passes "restricted" by itself (pod-level runAsNonRoot and seccomp)."""
    sc = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return make_pod(
        [{"name": "app", "image": "x", "securityContext": sc}],
        securityContext={"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    )


def test_the_checker_finds_what_the_old_init_container_lacked() -> None:
    """Before: no seccompProfile; the checker must say so (it is the test of the fix below)."""
    spec = {
        "containers": [
            {
                "name": "c",
                "image": "x",
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ]
    }
    assert restricted_errors(spec) == ["c: seccompProfile is None, not RuntimeDefault or Localhost"]
    assert restricted_errors(restricted_pod()["spec"]) == []


@pytest.mark.parametrize("pod_level", [True, False])
def test_the_injected_pod_passes_pod_security_restricted(pod_level: bool) -> None:
    """With or without pod-level settings to lean on: the init container carries its own."""
    pod = restricted_pod()
    if not pod_level:
        sc = pod["spec"].pop("securityContext")
        pod["spec"]["containers"][0]["securityContext"].update(sc)
    _, patched, _ = review(pod)
    assert len(patched["spec"]["initContainers"]) == 1
    assert restricted_errors(patched["spec"]) == []


def test_the_init_container_has_cpu_and_memory_requests_equal_to_limits() -> None:
    """A quota or LimitRange requiring limits.cpu admits it; a Guaranteed pod stays Guaranteed."""
    _, patched, _ = review(make_pod([{"name": "app", "image": "x"}]))
    resources = patched["spec"]["initContainers"][0]["resources"]
    assert set(resources["limits"]) == set(resources["requests"]) == {"cpu", "memory"}
    assert resources["limits"] == resources["requests"]


# -- generated pods -------------------------------------------------------------------

DNS = st.from_regex(r"[a-z]([a-z0-9-]{0,5}[a-z0-9])?", fullmatch=True)
NAMES = st.one_of(st.sampled_from(["gpuflame", "gpuflame-payload", "gpuflame-2", "gpuflame-payload-2", "app"]), DNS)
PATHS = st.sampled_from(
    ["/gpuflame", "/gpuflame/", "/gpuflame/lib", "/gpuflame-2", "/gpuflame2", "/data", "/", "/gpuflame-3/x", "/cache"]
)
ENV_NAMES = st.sampled_from(
    [
        "PYTHONPATH",
        "POD_NAME",
        "GPUFLAME_INTERVAL",
        "GPUFLAME_HOME",
        "CONTAINER_NAME",
        "A",
        "HOME",
        "GPUFLAME_PYROSCOPE_URL",
    ]
)
VALUES = st.one_of(st.none(), st.just(""), st.sampled_from(["/app", "/a:/b", "$(A)", "x"]), st.text(max_size=8))
SETTING_VALUES = st.one_of(
    st.sampled_from(
        ["15s", "0", "1e-10", "inf", "100ms", "25h", "auto", "jax", "cobol", "", " ", "app", "app,nope", "-5s"]
    ),
    st.text(max_size=80),
)


@st.composite
def env_var(draw: Any) -> dict:
    name = draw(ENV_NAMES)
    if draw(st.booleans()) and draw(st.booleans()):
        return {"name": name, "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
    value = draw(VALUES)
    return {"name": name} if value is None else {"name": name, "value": value}


@st.composite
def container(draw: Any, name: str, volumes: list[str]) -> dict:
    c: dict[str, Any] = {"name": name, "image": "img"}
    env = draw(st.one_of(st.none(), st.lists(env_var(), max_size=5)))
    if env is not None:
        c["env"] = env
    if volumes and draw(st.booleans()):
        mounts = draw(st.lists(st.tuples(st.sampled_from(volumes), PATHS), max_size=3, unique_by=lambda m: m[1]))
        c["volumeMounts"] = [{"name": v, "mountPath": p} for v, p in mounts]
    elif draw(st.booleans()):
        c["volumeMounts"] = []
    if BLOCK in volumes and draw(st.booleans()):  # a raw block device (a PVC in block mode) at one of the paths
        c["volumeDevices"] = [{"name": BLOCK, "devicePath": draw(PATHS)}]
    return c


@st.composite
def pods(draw: Any) -> dict:
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    volumes = draw(st.lists(NAMES, max_size=3, unique=True)) + [BLOCK] * draw(st.booleans())
    split = draw(
        st.lists(
            st.sampled_from(["containers", "initContainers", "ephemeralContainers"]),
            min_size=len(names),
            max_size=len(names),
        )
    )
    split[0] = "containers"
    spec: dict[str, Any] = {}
    for name, where in zip(names, split, strict=True):
        spec.setdefault(where, []).append(draw(container(name, volumes)))
    if volumes or draw(st.booleans()):
        spec["volumes"] = [
            {"name": v, **({"persistentVolumeClaim": {"claimName": "c"}} if v == BLOCK else {"emptyDir": {}})}
            for v in volumes
        ]
    if draw(st.booleans()) and "initContainers" not in spec:
        spec["initContainers"] = []
    settings = draw(
        st.dictionaries(
            st.sampled_from(
                ["gpuflame.io/interval", "gpuflame.io/backend", "gpuflame.io/service-name", "gpuflame.io/container"]
            ),
            SETTING_VALUES,
            max_size=4,
        )
    )
    if "gpuflame.io/container" in settings and draw(st.booleans()):
        settings["gpuflame.io/container"] = spec["containers"][0]["name"]
    others = draw(st.dictionaries(st.sampled_from(["team", "a.b/c"]), DNS, max_size=2))
    label_in = draw(st.booleans())
    labels = {**others, **(OPT_IN if label_in else {})}
    annotations = {**others, **settings, **({} if label_in else OPT_IN)}
    if draw(st.booleans()) and draw(st.booleans()):  # the annotations within a few hundred bytes of their limit
        used = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        annotations["notes"] = "é" * ((ANNOTATIONS_MAX_BYTES - used - draw(st.integers(0, 400))) // 2)
    if draw(st.booleans()):
        spec["os"] = {"name": draw(st.sampled_from(["linux", "windows"]))}
    if draw(st.booleans()):  # a workload that passes Pod Security "restricted" on its own
        spec["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        for c in all_containers(spec):
            c["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return make_pod(spec.pop("containers"), labels=labels, annotations=annotations, **spec)


def assert_user_fields_kept(before: dict, after: dict) -> None:
    """Lists only grow at their end; maps only gain keys; a PYTHONPATH literal only gains a prefix."""
    for key in ("labels", "annotations"):
        assert (before["metadata"].get(key) or {}).items() <= (after["metadata"].get(key) or {}).items()
    for key in ("volumes", "initContainers"):
        old = before["spec"].get(key) or []
        assert after["spec"].get(key, [])[: len(old)] == old
    assert after["spec"].get("ephemeralContainers") == before["spec"].get("ephemeralContainers")
    for old, new in zip(before["spec"]["containers"], after["spec"]["containers"], strict=True):
        assert {k: v for k, v in old.items() if k not in ("env", "volumeMounts")} == {
            k: v for k, v in new.items() if k not in ("env", "volumeMounts")
        }
        assert new.get("volumeMounts", [])[: len(old.get("volumeMounts") or [])] == (old.get("volumeMounts") or [])
        old_env, new_env = old.get("env") or [], new.get("env") or []
        for i, var in enumerate(old_env):
            if new_env[i] != var:  # only the last literal PYTHONPATH, and only in front
                assert var["name"] == "PYTHONPATH" and i == max(
                    j for j, v in enumerate(old_env) if v["name"] == "PYTHONPATH"
                )
                assert new_env[i]["value"].endswith(var.get("value") or "")
        added = {v["name"] for v in new_env[len(old_env) :]} - {"PYTHONPATH"}
        assert not added & {v["name"] for v in old_env}, "a variable of the container's was overridden"


def assert_profiled(after: dict) -> None:
    """Every container given our mount sees the payload: the same path as the init container's, first on PYTHONPATH."""
    inits = after["spec"]["initContainers"]
    (init,) = [c for c in inits if (c.get("command") or [""])[0] == "gpuflame-payload-install"]
    (ours,) = init["volumeMounts"]
    for c in after["spec"]["containers"]:
        mounts = [m for m in c.get("volumeMounts") or [] if m["name"] == ours["name"]]
        if mounts:
            assert mounts == [{**ours, "readOnly": False}]
            path = last(c["env"], "PYTHONPATH")["value"]
            assert path.startswith(f"{ours['mountPath']}/bootstrap:{ours['mountPath']}/lib")
            assert not any(m["mountPath"].rstrip("/").startswith(ours["mountPath"] + "/") for m in c["volumeMounts"]), (
                "a user's mount hides our files"
            )


def spec_is_linux(pod: dict) -> bool:
    return (pod["spec"].get("os") or {}).get("name", "linux") == "linux"


@pytest.mark.slow
@hypothesis.settings(max_examples=150, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(pods())
def test_the_patch_of_any_valid_pod_applies_and_gives_a_valid_pod(pod: dict) -> None:
    hypothesis.assume(schema_errors(pod) == [] and api_errors(pod) == [])
    response, patched, ops = review(pod)
    assert response["allowed"] is True
    assert {op["op"] for op in ops} <= {"add"}
    assert api_rules.apply_adds(pod, ops) == patched  # the webhook's own replay of its patch, as jsonpatch's
    if any("would make the pod invalid" in w for w in response.get("warnings", [])):  # withheld: rightly?
        full, _ = admission.profile(copy.deepcopy(pod), admission.Config())
        assert api_errors(jsonpatch.apply_patch(copy.deepcopy(pod), full)), "a patch that kept the pod valid withheld"
    assert schema_errors(patched) == [], (ops, patched)
    assert api_errors(patched) == [], (ops, patched)
    assert_user_fields_kept(pod, patched)
    if spec_is_linux(pod) and restricted_errors(pod["spec"]) == []:
        assert restricted_errors(patched["spec"]) == []
    annotations = patched["metadata"]["annotations"]
    if not ops:  # no room even for the reason: admitted as it was, the warning alone says why
        assert patched == pod and len(response["warnings"]) == 1
    elif "gpuflame.io/skipped" in annotations:
        assert patched["spec"] == pod["spec"]
    else:
        assert annotations["gpuflame.io/injected"] == "true"
        assert_profiled(patched)
        assert len(all_containers(patched["spec"])) == len(all_containers(pod["spec"])) + 1
    for warning in response.get("warnings", []):
        assert len(warning) <= admission.MAX_NOTE and "\n" not in warning


def test_the_webhook_never_changes_a_pod_of_its_own_namespace() -> None:
    """Defence in depth behind the namespaceSelector: a relabelled namespace must not make its pods wait on it."""
    pod = make_pod([{"name": "app", "image": "x"}])
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "namespace": "tools", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod},
    }
    own = admission.review(body, admission.Config(namespace="tools"))["response"]
    assert own == {"uid": "u", "allowed": True}
    assert "patch" in admission.review(body, admission.Config(namespace="gpuflame-system"))["response"]

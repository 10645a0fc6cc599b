"""``gpuflame webhook`` over real TLS on loopback, with real AdmissionReview v1 bodies.

The JSON Patches it answers are applied with the ``jsonpatch`` package, an
implementation independent of ours, and the patched pod is checked.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import shutil
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflame.boundary.settings import Settings
from gpuflame.cli.main import main
from gpuflame.webhook import admission
from gpuflame.webhook.admission import Config
from gpuflame.webhook.patch import patch_for
from gpuflame.webhook.server import MAX_BODY, WebhookServer, make_server
from tests.helpers.pod_rules import ANNOTATIONS_MAX_BYTES, api_errors

# Every test here uses a fixture that starts a child process (a server, a kernel, openssl).
pytestmark = pytest.mark.subprocess

jsonpatch = pytest.importorskip("jsonpatch")

IMAGE = "registry.example/gpuflame:test"
SECRET = "team-pyroscope"


# -- a self-signed certificate and the server ---------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1: with ``cryptography`` if installed, else the openssl command."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    try:
        _with_cryptography(cert, key)
    except ImportError:
        if not shutil.which("openssl"):
            pytest.skip("neither the cryptography package nor openssl is available to make a certificate")
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    return cert, key


def _with_cryptography(cert_path: Path, key_path: Path) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tls: tuple[Path, Path]) -> Iterator[WebhookServer]:
    cert, key = tls
    srv = make_server("127.0.0.1", 0, str(cert), str(key), Config(image=IMAGE, pyroscope_secret=SECRET), quiet=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def call(server: WebhookServer, tls: tuple[Path, Path], method: str, path: str, body: bytes | None = None):
    """One HTTPS request that verifies the server's certificate, as the API server does."""
    context = ssl.create_default_context(cafile=str(tls[0]))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# -- pods and reviews --------------------------------------------------------------


def pod(annotations: dict[str, str] | None = None, containers: list[dict] | None = None, **spec: Any) -> dict:
    meta: dict[str, Any] = {"name": "trainer-7d9f8b6c4-x2k9q", "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": containers or [{"name": "main", "image": "vllm/vllm-openai:v0.9"}], **spec},
    }


def admission_review(obj: dict) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": obj,
        },
    }


def mutate(server: WebhookServer, tls: tuple[Path, Path], obj: dict) -> tuple[dict, dict]:
    """(response, patched pod) for one pod sent through the server."""
    request = admission_review(obj)
    status, raw = call(server, tls, "POST", "/mutate", json.dumps(request).encode())
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == request["request"]["uid"]
    if "patch" not in response:
        return response, obj
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return response, jsonpatch.apply_patch(copy.deepcopy(obj), ops)


def deep_pod_field(depth: int) -> bytes:
    """A review whose pod has a variable's value nested *depth* lists deep: JSON that parses (under the
    interpreter's recursion limit) but that nothing can copy or print."""
    review = admission_review(pod(on(), [{"name": "a", "image": "i", "env": [{"name": "X", "value": "DEEP"}]}]))
    return json.dumps(review).replace('"DEEP"', "[" * depth + "]" * depth).encode()


def env_of(container: dict) -> dict[str, dict]:
    """name -> the last definition (the one the kubelet uses)."""
    return {var["name"]: var for var in container.get("env", [])}


def on(**extra: str) -> dict[str, str]:
    return {"gpuflame.io/inject": "true", **extra}


# -- the tests ---------------------------------------------------------------------


def test_healthz(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    assert call(server, tls, "GET", "/healthz") == (200, b"ok\n")
    assert call(server, tls, "GET", "/nope")[0] == 404


def test_pod_without_annotation_is_allowed_untouched(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    for given in (None, {"team": "ml"}, {"gpuflame.io/inject": "false"}):
        response, patched = mutate(server, tls, pod(given))
        assert response["allowed"] is True
        assert "patch" not in response and "patchType" not in response


def test_bare_pod_gets_volume_init_container_env_and_mount(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    response, patched = mutate(
        server, tls, pod(on(**{"gpuflame.io/interval": "30s", "gpuflame.io/service-name": "vllm"}))
    )
    assert response["allowed"] is True
    spec = patched["spec"]
    assert spec["volumes"] == [{"name": "gpuflame", "emptyDir": {}}]
    [init] = spec["initContainers"]
    assert init["image"] == IMAGE
    assert init["command"] == ["gpuflame-payload-install", "/gpuflame"]
    assert init["volumeMounts"] == [{"name": "gpuflame", "mountPath": "/gpuflame"}]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    [main_c] = spec["containers"]
    assert {"name": "gpuflame", "mountPath": "/gpuflame", "readOnly": False} in main_c["volumeMounts"]
    env = env_of(main_c)
    assert env["PYTHONPATH"]["value"] == "/gpuflame/bootstrap:/gpuflame/lib"
    assert env["GPUFLAME_HOME"]["value"] == "/gpuflame/lib"
    assert env["GPUFLAME_SESSION_DIR"]["value"] == "/gpuflame/sessions/main"
    assert env["GPUFLAME_CACHE_DIR"]["value"] == "/gpuflame/cache"  # writable, unlike a read-only home
    assert env["GPUFLAME_BACKEND"]["value"] == "auto"
    assert env["GPUFLAME_INTERVAL"]["value"] == "30"
    assert env["GPUFLAME_SERVICE_NAME"]["value"] == "vllm"
    assert env["CONTAINER_NAME"]["value"] == "main"
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for var, key in (
        ("GPUFLAME_PYROSCOPE_URL", "url"),
        ("GPUFLAME_PYROSCOPE_TOKEN", "token"),
        ("GPUFLAME_TENANT", "tenant"),
    ):
        assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key, "optional": True}}}
    # the annotation key has a "/": its JSON Pointer must escape it for this to land in the right place
    assert patched["metadata"]["annotations"]["gpuflame.io/injected"] == "true"


def test_the_env_a_pod_gets_reads_back_as_the_settings_its_annotations_ask_for() -> None:
    """The webhook writes settings as ``Settings.to_env`` does; the bootstrap's ``from_env`` reads them back."""
    annotations = on(
        **{"gpuflame.io/interval": "2.5s", "gpuflame.io/backend": "jax", "gpuflame.io/service-name": "vllm"}
    )
    request, notes = admission.parse_request(annotations)
    assert notes == []
    ops = patch_for(pod(annotations), [0], request, Config())
    [main_c] = jsonpatch.apply_patch(pod(annotations), ops)["spec"]["containers"]
    plain = {var["name"]: var["value"] for var in main_c["env"] if "value" in var}
    expected = Settings(
        enabled=True, session_dir="/gpuflame/sessions/main", backend="jax", interval=2.5, service_name="vllm"
    )
    assert Settings.from_env(plain) == expected
    assert plain["GPUFLAME_INTERVAL"] == "2.5" and plain["GPUFLAME_ENABLED"] == "1"  # the switch, said
    defaults, _ = admission.parse_request(on())  # no setting annotations: the defaults, said explicitly
    assert Settings.from_env(admission.settings_env("app", defaults)) == Settings(
        enabled=True, session_dir="/gpuflame/sessions/app", interval=15.0
    )


def test_settings_to_env_names_only_real_settings() -> None:
    assert Settings(interval=30.0).to_env("interval") == {"GPUFLAME_INTERVAL": "30"}
    with pytest.raises(ValueError, match="not a setting: intervall"):
        Settings().to_env("intervall")


def test_existing_pythonpath_is_kept_after_ours(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    containers = [
        {
            "name": "app",
            "image": "x",
            "env": [{"name": "A", "value": "1"}, {"name": "PYTHONPATH", "value": "/app/src:/opt/lib"}],
        }
    ]
    _, patched = mutate(server, tls, pod(on(), containers))
    env = patched["spec"]["containers"][0]["env"]
    assert [v["name"] for v in env].count("PYTHONPATH") == 1
    assert env_of(patched["spec"]["containers"][0])["PYTHONPATH"]["value"] == (
        "/gpuflame/bootstrap:/gpuflame/lib:/app/src:/opt/lib"
    )
    assert env[0] == {"name": "A", "value": "1"}


def test_pythonpath_from_value_from_is_expanded_by_the_kubelet(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    ref = {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "pp"}}}
    _, patched = mutate(server, tls, pod(on(), [{"name": "app", "image": "x", "env": [ref]}]))
    env = patched["spec"]["containers"][0]["env"]
    first, second = [i for i, v in enumerate(env) if v["name"] == "PYTHONPATH"]
    assert env[first] == ref and first < second
    assert env[second]["value"] == "/gpuflame/bootstrap:/gpuflame/lib:$(PYTHONPATH)"


def test_several_containers_existing_arrays_are_appended(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    containers = [
        {
            "name": "server",
            "image": "x",
            "env": [{"name": "X", "value": "1"}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        },
        {"name": "sidecar", "image": "y"},
    ]
    obj = pod(
        on(),
        containers,
        initContainers=[{"name": "fetch-model", "image": "z"}],
        volumes=[{"name": "cache", "emptyDir": {}}],
    )
    _, patched = mutate(server, tls, obj)
    spec = patched["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-model", "gpuflame-payload"]
    assert [v["name"] for v in spec["volumes"]] == ["cache", "gpuflame"]
    server_c, sidecar = spec["containers"]
    assert [m["name"] for m in server_c["volumeMounts"]] == ["cache", "gpuflame"]
    assert server_c["env"][0] == {"name": "X", "value": "1"}
    for c in (server_c, sidecar):
        env = env_of(c)
        assert env["CONTAINER_NAME"]["value"] == c["name"]
        assert env["GPUFLAME_SESSION_DIR"]["value"] == f"/gpuflame/sessions/{c['name']}"


def test_container_annotation_selects(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    containers = [{"name": "server", "image": "x"}, {"name": "proxy", "image": "y"}]
    _, patched = mutate(
        server, tls, pod(on(**{"gpuflame.io/container": "server", "gpuflame.io/backend": "torch-cuda"}), containers)
    )
    server_c, proxy = patched["spec"]["containers"]
    assert env_of(server_c)["GPUFLAME_BACKEND"]["value"] == "torch-cuda"
    assert "env" not in proxy and "volumeMounts" not in proxy


@pytest.mark.parametrize(
    ("annotations", "words", "default"),
    [
        ({"gpuflame.io/interval": "fast"}, ["gpuflame.io/interval", "'fast'", "not a duration"], ("INTERVAL", "15")),
        ({"gpuflame.io/interval": "-5s"}, ["gpuflame.io/interval", "negative"], ("INTERVAL", "15")),
        (
            {"gpuflame.io/backend": "tensorflow"},
            ["gpuflame.io/backend", "'tensorflow'", "torch-cuda"],
            ("BACKEND", "auto"),
        ),
        ({"gpuflame.io/service-name": " "}, ["gpuflame.io/service-name", "empty"], ("SERVICE_NAME", None)),
    ],
)
def test_a_bad_setting_annotation_is_ignored_with_the_reason_and_the_pod_admitted(
    server: WebhookServer,
    tls: tuple[Path, Path],
    annotations: dict[str, str],
    words: list[str],
    default: tuple[str, str | None],
) -> None:
    """Never a refused pod: the default is used, the reason is a warning for kubectl and an annotation."""
    response, patched = mutate(server, tls, pod(on(**annotations)))
    assert response["allowed"] is True and "status" not in response
    (warning,) = response["warnings"]
    assert "\n" not in warning and warning.endswith("; ignored")
    for word in words:
        assert word in warning
    assert patched["metadata"]["annotations"]["gpuflame.io/ignored"] == warning.removeprefix("gpuflame: ")
    env = env_of(patched["spec"]["containers"][0])
    assert env.get(f"GPUFLAME_{default[0]}", {}).get("value") == default[1]


@pytest.mark.parametrize(
    ("annotations", "words"),
    [
        ({"gpuflame.io/inject": "maybe"}, ["gpuflame.io/inject annotation", "'maybe'"]),
        ({"gpuflame.io/inject": "true", "gpuflame.io/container": "nope"}, ["gpuflame.io/container", "nope", "main"]),
    ],
)
def test_a_pod_that_cannot_be_profiled_as_asked_is_admitted_unchanged_with_the_reason(
    server: WebhookServer, tls: tuple[Path, Path], annotations: dict[str, str], words: list[str]
) -> None:
    response, patched = mutate(server, tls, pod(annotations))
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    for word in words:
        assert word in warning
    assert patched["spec"] == pod(annotations)["spec"]
    assert patched["metadata"]["annotations"] == {
        **annotations,
        "gpuflame.io/skipped": warning.removeprefix("gpuflame: "),
    }


def test_second_admission_changes_nothing(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    _, patched = mutate(server, tls, pod(on()))
    response, again = mutate(server, tls, patched)
    assert response["allowed"] is True and "patch" not in response


def test_other_kinds_and_operations_are_allowed(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    body = admission_review(pod(on()))
    body["request"]["operation"] = "UPDATE"
    status, raw = call(server, tls, "POST", "/mutate", json.dumps(body).encode())
    assert status == 200 and json.loads(raw)["response"] == {"uid": body["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"kind": "AdmissionReview"}',
        b"\xff\xfe",
        json.dumps(
            {"kind": "AdmissionReview", "request": {"uid": "u", "kind": {"kind": "Pod"}, "object": {"spec": {}}}}
        ).encode(),
        json.dumps(
            {
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u",
                    "kind": {"kind": "Pod"},
                    "object": {
                        "metadata": {"annotations": {"gpuflame.io/inject": "true"}},
                        "spec": {"containers": [1]},
                    },
                },
            }
        ).encode(),
        json.dumps(
            {
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u",
                    "kind": {"kind": "Pod"},
                    "object": {
                        "metadata": {"annotations": {"gpuflame.io/inject": "true"}},
                        "spec": {"containers": [{"name": "a", "env": "PYTHONPATH"}]},
                    },
                },
            }
        ).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # parsed by recursion: the parser's guard, not a crash
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        deep_pod_field(900),
    ],
)
def test_malformed_body_is_400_and_the_server_keeps_serving(
    server: WebhookServer, tls: tuple[Path, Path], body: bytes
) -> None:
    status, raw = call(server, tls, "POST", "/mutate", body)
    assert status == 400
    assert raw.startswith(b"bad request:") and raw.count(b"\n") == 1
    assert call(server, tls, "GET", "/healthz")[0] == 200


def test_a_body_over_the_bound_is_400_before_it_is_read(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    """Only the headers are sent: the answer comes without waiting for (or reading) a body that large."""
    context = ssl.create_default_context(cafile=str(tls[0]))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.putrequest("POST", "/mutate")
        conn.putheader("Content-Length", str(MAX_BODY + 1))
        conn.endheaders()
        response = conn.getresponse()
        status, raw = response.status, response.read()
    finally:
        conn.close()
    assert status == 400 and raw == f"bad request: body of {MAX_BODY + 1} bytes (at most {MAX_BODY})\n".encode()


def near_the_annotation_limit(room: int) -> dict[str, str]:
    """Opted in, with annotations *room* bytes under Kubernetes' 256 KiB (keys and values, UTF-8)."""
    annotations = on()
    used = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) + len("notes")
    left = ANNOTATIONS_MAX_BYTES - used - room
    return {**annotations, "notes": "é" * (left // 2) + "x" * (left % 2)}  # é: two bytes, one character


@pytest.mark.parametrize("room", [0, 12, 23])  # gpuflame.io/injected: true takes 24
def test_a_patch_that_would_pass_the_annotation_limit_is_not_sent(
    server: WebhookServer, tls: tuple[Path, Path], room: int
) -> None:
    """Too little room for gpuflame.io/injected (and far too little for the skipped reason): admitted unchanged,
    the warning alone says why; the pod as sent passes the API server's rules, the patched one would not."""
    given = pod(near_the_annotation_limit(room))
    assert api_errors(given) == []
    response, patched = mutate(server, tls, given)
    assert response["allowed"] is True and "patch" not in response and patched == given
    (warning,) = response["warnings"]
    assert "would make the pod invalid" in warning and f"over Kubernetes' {ANNOTATIONS_MAX_BYTES}" in warning


def test_with_room_for_its_annotation_the_pod_is_profiled(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    given = pod(near_the_annotation_limit(len("gpuflame.io/injected") + len("true")))
    response, patched = mutate(server, tls, given)
    assert "warnings" not in response and patched["metadata"]["annotations"]["gpuflame.io/injected"] == "true"
    assert api_errors(patched) == []


def test_a_device_at_our_mount_path_gets_a_free_path(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    """A raw block device at /gpuflame (volumeDevices): the API refuses a mount at the same path."""
    device = {"name": "main", "image": "i", "volumeDevices": [{"name": "disk", "devicePath": "/gpuflame"}]}
    given = pod(on(), [device], volumes=[{"name": "disk", "persistentVolumeClaim": {"claimName": "data"}}])
    assert api_errors(given) == []
    response, patched = mutate(server, tls, given)
    (mount,) = patched["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == "/gpuflame-2" and "warnings" not in response
    assert api_errors(patched) == []


def test_plain_http_client_does_not_stop_the_server(server: WebhookServer, tls: tuple[Path, Path]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    assert call(server, tls, "GET", "/healthz")[0] == 200


def test_pointer_escapes_rfc6901() -> None:
    assert admission.pointer("metadata", "annotations", "a~b/c") == "/metadata/annotations/a~0b~1c"


def test_cli_reports_a_missing_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["webhook", "--tls-cert", str(tmp_path / "no.crt"), "--tls-key", str(tmp_path / "no.key"), "--port", "0"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no.crt" in err and err.count("\n") == 1


def _within_a_minute(call):  # type: ignore[no-untyped-def]
    """*call*'s result from a daemon thread: a read that blocks on a FIFO fails the test instead of hanging it."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(60)  # a guard for the test run: the fixed loader never opens the FIFO for a blocking read
    assert not thread.is_alive(), "still reading the FIFO"
    return out[0]


def test_a_certificate_that_is_a_fifo_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    fifo = tmp_path / "tls.crt"
    os.mkfifo(fifo)  # no writer: ssl's read of it blocked for ever
    argv = ["webhook", "--tls-cert", str(fifo), "--tls-key", str(fifo), "--port", "0"]
    assert _within_a_minute(lambda: main(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a device, a pipe or a socket" in err, err


def test_a_rotation_to_a_fifo_keeps_the_previous_certificate(
    tls: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import os

    from gpuflame.webhook.server import Certificates

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(tls[0], cert)
    shutil.copy(tls[1], key)
    certificates = Certificates(str(cert), str(key))
    before = certificates.context()
    cert.unlink()
    os.mkfifo(cert)  # every request asks for the context: one stuck load would hold them all
    assert _within_a_minute(certificates.context) is before
    assert "keeping the previous certificate" in capfd.readouterr().err


def test_the_cli_knows_its_own_namespace_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuflame.cli.main import build_parser

    monkeypatch.setenv("POD_NAMESPACE", "tools")
    assert build_parser().parse_args(["webhook", "--tls-cert", "c", "--tls-key", "k"]).namespace == "tools"


def test_the_server_logs_why_a_pod_was_skipped(tls: tuple[Path, Path], capfd: pytest.CaptureFixture[str]) -> None:
    """The operator's side of the warning the client gets: one line naming the pod."""
    cert, key = tls
    srv = make_server("127.0.0.1", 0, str(cert), str(key), Config(image=IMAGE), quiet=False)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        response, _ = mutate(srv, tls, pod(on(), os={"name": "windows"}))
    finally:
        srv.shutdown()
        srv.server_close()
    (warning,) = response["warnings"]
    lines = [line for line in capfd.readouterr().err.splitlines() if warning in line]
    assert len(lines) == 1 and "ml/trainer-7d9f8b6c4-x2k9q: gpuflame: a Windows pod" in lines[0]

"""Pushing to Pyroscope, checked by a real HTTP server on 127.0.0.1 and protoc's own decoder.

Every push the server receives is decoded with classes compiled from
tests/proto/push.proto (Pyroscope's PushRequest) and pprof's own profile.proto
(src/gpuflame/formats/pprof_proto), not with gpuflame's reader. Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpuflame.errors import GpuflameError
from gpuflame.formats import load
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.ship.pusher import Pusher
from gpuflame.ship.pyroscope import (
    EXCERPT,
    GARBAGE,
    REFUSED,
    TIMEOUT,
    Credentials,
    PushError,
    PyroscopeClient,
    base_labels,
    service_name,
    workload_name,
)
from gpuflame.ship.window import LOWER_BOUND_NOTE, IntervalWindow
from tests.helpers.escapes import RAW
from tests.helpers.paths import REPO
from tests.helpers.pyroscope_server import Server, decode_push
from tests.helpers.run_cli import gpuflame_run

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- decoding with the independent decoder -----------------------------------------


def type_ids(labels: dict[str, str], pprof: object) -> list[str]:
    """The profile type ids Pyroscope derives: name:type:unit:period type:period unit."""
    s = pprof.string_table
    period = f"{s[pprof.period_type.type]}:{s[pprof.period_type.unit]}"
    return [f"{labels['__name__']}:{s[st.type]}:{s[st.unit]}:{period}" for st in pprof.sample_type]


def totals(pprof: object) -> dict[str, int]:
    s = pprof.string_table
    names = [s[st.type] for st in pprof.sample_type]
    sums = dict.fromkeys(names, 0)
    for sample in pprof.sample:
        for n, v in zip(names, sample.value, strict=True):
            sums[n] += v
    return sums


def two_device_profile() -> Profile:
    p = Profile(sample_types=memory_sample_types())
    model = Frame("<module>", "/app/train.py", 1)
    mlp = Frame("LlamaMLP > forward", "/app/llama.py", 10)
    p.add([mlp, model], [100, 1, 80, 1, 300, 3], {"pid": 11, "device": "cuda:0", "address": "0x7f01"})
    p.add([model], [50, 1, 0, 0, 50, 1], {"pid": 11, "device": "cuda:1", "address": "0x7f02"})
    p.add([mlp, model], [7, 1, 7, 1, 7, 1], {"pid": 11, "device": "cuda:0", "address": "0x7f03"})
    return p


# -- the client ---------------------------------------------------------------------


def test_a_push_decodes_to_the_profile_sent(server: Server, push_pb2: ModuleType, profile_pb2: ModuleType) -> None:
    client = PyroscopeClient(server.url, credentials=Credentials(token=TOKEN), tenant="team-a")
    client.push(two_device_profile(), base_labels("trainer", env={"POD_NAMESPACE": "ml", "NODE_NAME": "n1"}))
    (request,) = server.requests
    assert request["path"] == "/push.v1.PusherService/Push"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["content-type"] == "application/proto"
    assert headers["connect-protocol-version"] == "1"
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["x-scope-orgid"] == "team-a"
    series = decode_push(request["body"], push_pb2, profile_pb2)
    by_gpu = {labels["gpu"]: (labels, pprof) for labels, pprof in series}
    assert set(by_gpu) == {"cuda:0", "cuda:1"}
    for labels, pprof in series:
        assert labels["__name__"] == "gpu_memory"
        assert labels["service_name"] == "trainer"
        assert labels["namespace"] == "ml" and labels["node"] == "n1"
        assert labels["pid"] == "11"
        assert "address" not in labels and "pod" not in labels
        assert all(not sample.label for sample in pprof.sample)  # no sample label becomes a series
        ids = type_ids(labels, pprof)
        for wanted in ("inuse_space", "peak_space", "alloc_space"):
            assert f"gpu_memory:{wanted}:bytes:space:bytes" in ids
    assert totals(by_gpu["cuda:0"][1]) == {
        "peak_space": 107,
        "peak_objects": 2,
        "inuse_space": 87,
        "inuse_objects": 2,
        "alloc_space": 307,
        "alloc_objects": 4,
    }
    assert totals(by_gpu["cuda:1"][1])["peak_space"] == 50
    names = set(by_gpu["cuda:0"][1].string_table)
    assert "LlamaMLP > forward" in names and "/app/llama.py" in names


def test_many_valued_labels_are_not_series_labels(server: Server, push_pb2, profile_pb2) -> None:
    p = Profile(sample_types=memory_sample_types())
    for pid in range(40):
        p.add([Frame("f", "/a.py", 1)], [1, 1, 1, 1, 1, 1], {"pid": pid, "device": "cuda:0"})
    PyroscopeClient(server.url).push(p, {"service_name": "x"})
    (series,) = decode_push(server.requests[0]["body"], push_pb2, profile_pb2)
    labels, pprof = series
    assert "pid" not in labels and labels["gpu"] == "cuda:0"
    assert totals(pprof)["inuse_space"] == 40


@pytest.mark.parametrize(
    ("mode", "retryable", "words"),
    [("500", True, "HTTP 500"), ("429", True, "HTTP 429"), ("401", False, "HTTP 401")],
)
def test_refusals_are_plain_errors_without_secrets(server: Server, mode: str, retryable: bool, words: str) -> None:
    server.mode = mode
    client = PyroscopeClient(server.url, credentials=Credentials(token=TOKEN))
    with pytest.raises(PushError) as info:
        client.push(two_device_profile(), {"service_name": "x"})
    assert words in str(info.value)
    assert TOKEN not in str(info.value)
    assert info.value.retryable is retryable
    if mode == "429":
        assert info.value.retry_after == 1.0


def test_basic_auth_from_a_password_file(server: Server, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(TOKEN + "\n")
    creds = Credentials.from_env({}, user="me", password_file=str(secret))
    assert TOKEN not in repr(creds)
    PyroscopeClient(server.url, credentials=creds).push(two_device_profile(), {"service_name": "x"})
    import base64

    auth = {k.lower(): v for k, v in server.requests[0]["headers"].items()}["authorization"]
    assert base64.b64decode(auth.split()[1]).decode() == f"me:{TOKEN}"


def test_network_failures_are_push_errors(server: Server) -> None:
    with pytest.raises(PushError, match="connection refused"):
        PyroscopeClient(f"http://127.0.0.1:{free_port()}").push(two_device_profile(), {"service_name": "x"})
    server.mode = "close"
    with pytest.raises(PushError, match="cannot reach"):
        PyroscopeClient(server.url).push(two_device_profile(), {"service_name": "x"})
    server.mode = "hang"
    with pytest.raises(PushError, match=r"did not answer within 0.3s") as hung:  # the client's own timeout ran out
        PyroscopeClient(server.url, timeout=0.3).push(two_device_profile(), {"service_name": "x"})
    assert hung.value.kind == TIMEOUT


def test_a_garbage_answer_is_named_and_quoted_escaped_and_short(server: Server) -> None:
    server.mode = "garbage"
    with pytest.raises(PushError) as info:
        PyroscopeClient(server.url).push(two_device_profile(), {"service_name": "x"})
    message = str(info.value)
    assert info.value.kind == GARBAGE and "sent an answer that is not HTTP" in message
    assert RAW.findall(message) == [] and "\\x1b[2J\\x1b]0;pwned\\x07NOT HTTP" in message
    quoted = message.split(f"{GARBAGE}: ", 1)[1]
    assert quoted.endswith("…") and len(quoted) < EXCERPT * 2  # 200 characters, a few of them escaped


def test_a_trickling_answer_times_out_as_a_whole(server: Server) -> None:
    """Each read gets its byte within the socket timeout: only a bound on the whole answer ends the push."""
    server.mode = "trickle"
    outcome: list[BaseException] = []

    def push() -> None:
        try:
            PyroscopeClient(server.url, timeout=0.5).push(two_device_profile(), {"service_name": "x"})
        except PushError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    thread.join(60)  # a guard for the test run, 120x the timeout: without the watchdog the push never ends
    assert not thread.is_alive(), "the push was still reading a trickling answer"
    assert len(outcome) == 1 and isinstance(outcome[0], PushError) and outcome[0].kind == TIMEOUT
    assert "did not answer within 0.5s" in str(outcome[0])


def test_https_verifies_certificates_by_default() -> None:
    client = PyroscopeClient("https://127.0.0.1:1")
    assert client._ssl is not None and client._ssl.verify_mode.name == "CERT_REQUIRED"
    with pytest.raises(Exception, match="CA file"):
        PyroscopeClient("https://127.0.0.1:1", ca_file="/nonexistent/ca.pem")


def _in_a_thread(call):  # type: ignore[no-untyped-def]
    """*call*'s exception, from a daemon thread: a reader that blocks on a FIFO fails the test instead of hanging it."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 (the test looks at it)
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)  # a guard for the test run: the fixed reader never opens the FIFO for a blocking read
    assert not thread.is_alive(), "still reading the FIFO"
    assert len(outcome) == 1
    return outcome[0]


@pytest.mark.parametrize("which", ["token", "password", "ca"])
@pytest.mark.parametrize(
    "content, words",
    [
        ("fifo", "is a device, a pipe or a socket"),
        ("folder", "is a directory"),
        (b"\xff\xfe\x00 not text", "UTF-8|not PEM text"),
        (b"x" * (17 << 20), "larger than"),
    ],
)
def test_a_secret_or_ca_file_that_is_not_a_small_text_file_is_one_error(
    tmp_path: Path, which: str, content: object, words: str
) -> None:
    path = tmp_path / which
    if content == "fifo":
        os.mkfifo(path)  # no writer: reading it would block forever
    elif content == "folder":
        path.mkdir()
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    if which == "ca":
        exc = _in_a_thread(lambda: PyroscopeClient("https://127.0.0.1:1", ca_file=str(path)))
    else:
        exc = _in_a_thread(lambda: Credentials.from_env({}, user="me", **{f"{which}_file": str(path)}))
    assert isinstance(exc, GpuflameError), repr(exc)
    assert re.search(words, str(exc)) and str(path) in str(exc) and "\n" not in str(exc)


def test_an_empty_ca_file_is_refused_and_a_pem_bundle_is_used(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    with pytest.raises(GpuflameError, match="the file is empty"):
        PyroscopeClient("https://127.0.0.1:1", ca_file=str(empty))
    bundle = ssl.get_default_verify_paths().openssl_cafile
    if not os.path.isfile(bundle):
        pytest.skip(f"no CA bundle at {bundle}")
    client = PyroscopeClient("https://127.0.0.1:1", ca_file=bundle)
    assert client._ssl is not None and client._ssl.cert_store_stats()["x509_ca"] > 0


@pytest.mark.parametrize(
    "url, timeout, words",
    [
        ("http://[::1", 30.0, "not a Pyroscope URL: 'http://\\[::1'"),  # urlsplit: ValueError, was exit 3
        ("http://me:secret@[::1", 30.0, "not a Pyroscope URL: '\\[::1'"),  # the password is not said
        ("http://pyroscope:99999", 30.0, "not a Pyroscope URL"),  # .port: ValueError
        ("http://pyroscope:4040", float("nan"), "more than 0 and at most 86,400 s, got nan"),
        ("http://pyroscope:4040", -1.0, "got -1"),
        ("http://pyroscope:4040", float("inf"), "got inf"),  # --timeout 1e999: OverflowError in the socket
    ],
)
def test_a_bad_url_or_timeout_is_one_error(url: str, timeout: float, words: str) -> None:
    with pytest.raises(GpuflameError, match=words) as caught:
        PyroscopeClient(url, timeout=timeout)
    assert "secret" not in str(caught.value)


def test_service_name_order_and_workload_names() -> None:
    assert workload_name("trainer-7d9f8b6c4-x2k9q") == "trainer"
    assert workload_name("node-agent-x2k9q") == "node-agent"
    assert workload_name("vllm-0") == "vllm"
    assert service_name("opt", {"GPUFLAME_SERVICE_NAME": "env"}) == "opt"
    assert service_name("", {"GPUFLAME_SERVICE_NAME": "env", "POD_NAME": "a-7d9f8b6c4-x2k9q"}) == "env"
    assert service_name("", {"POD_NAME": "a-7d9f8b6c4-x2k9q"}) == "a"
    assert service_name("", {"HOSTNAME": "laptop"}, script="/x/train.py") == "train"
    assert service_name("", {"HOSTNAME": "w-7d9f8b6c4-x2k9q", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "w"


# -- the interval window --------------------------------------------------------------


def snapshot(peak: int, inuse: int, alloc: int) -> Profile:
    p = Profile(sample_types=memory_sample_types())
    p.add([Frame("f", "/a.py", 1)], [peak, 1, inuse, 1, alloc, 1], {"pid": 1})
    return p


def test_the_window_pushes_interval_values() -> None:
    window = IntervalWindow()
    first = window.next(snapshot(100, 40, 500))
    assert first.totals()["alloc_space"] == 500 and first.totals()["peak_space"] == 100
    second = window.next(snapshot(100, 60, 650))  # no new peak: lower bound = larger in-use end
    assert second.totals()["alloc_space"] == 150
    assert second.totals()["inuse_space"] == 60
    assert second.totals()["peak_space"] == 60
    assert LOWER_BOUND_NOTE in second.comments
    third = window.next(snapshot(300, 10, 900))  # a new peak within the interval: exact
    assert third.totals()["peak_space"] == 300 and third.totals()["alloc_space"] == 250
    assert LOWER_BOUND_NOTE not in third.comments


# -- the pusher ----------------------------------------------------------------------


def test_submit_never_waits_and_the_queue_drops_the_oldest(server: Server, capsys) -> None:
    """No clock: the push is held on a gate the test opens only after every submit and the close returned,
    so a submit or a close that waited for the push could not return before it (the gate's own wait is a
    guard that turns such a bug into a failure, not a hang)."""
    gate, pushing = threading.Event(), []

    def push(profile: object) -> None:
        pushing.append(threading.current_thread())
        gate.wait(60)
        raise PushError("held by the test")

    pusher = Pusher(push, queue_size=2)
    for _ in range(20):
        pusher.submit(two_device_profile())
    pusher.close(timeout=0)  # the push in flight is still held: what it and the queue hold is unsent
    assert not gate.is_set() and threading.main_thread() not in pushing
    gate.set()
    assert pusher.dropped == 20 and pusher.sent == 0
    err = capsys.readouterr().err
    assert "dropped 20" in err and "Traceback" not in err


def test_retries_back_off_and_honour_retry_after(server: Server, capsys) -> None:
    server.mode = "429-once"
    client = PyroscopeClient(server.url)
    pusher = Pusher(lambda p: client.push(p, {"service_name": "x"}), backoff=0.01)
    started = time.monotonic()
    pusher.submit(two_device_profile())
    deadline = time.monotonic() + 5
    while pusher.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    pusher.close(1)
    assert pusher.sent == 1 and pusher.failed == 0
    assert elapsed >= 0.3  # Retry-After: 0.3 beat the 10 ms backoff
    assert len(server.requests) == 2
    assert "sent 1, dropped 0, failed 0" in capsys.readouterr().err


def test_a_refused_push_is_not_retried_and_is_counted(server: Server, capsys) -> None:
    server.mode = "401"
    client = PyroscopeClient(server.url, credentials=Credentials(token=TOKEN))
    pusher = Pusher(lambda p: client.push(p, {"service_name": "x"}), backoff=0.01)
    pusher.submit(two_device_profile())
    pusher.close(2)
    assert (pusher.sent, pusher.failed) == (0, 1)
    assert len(server.requests) == 1
    err = capsys.readouterr().err
    assert "failed 1" in err and "HTTP 401" in err and TOKEN not in err


def test_each_kind_of_failure_is_said_once_and_counted(server: Server, capsys) -> None:
    server.mode = "500"
    failing = PyroscopeClient(server.url)
    refused = PyroscopeClient(f"http://127.0.0.1:{free_port()}")
    pusher = Pusher(lambda client: client.push(two_device_profile(), {"service_name": "x"}), queue_size=8, attempts=1)
    for client in (failing, failing, refused, failing, refused):
        pusher.submit(client)
    pusher.close(60)  # a flush: the thread sends all five before close returns
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "push failed" in line]
    assert len(said) == 2, err  # one line per kind, not per failure
    assert "HTTP 500" in said[0] and REFUSED in said[1]
    summary = err.splitlines()[-1]
    assert "sent 0, dropped 0, failed 5" in summary
    assert "HTTP 500 (3)" in summary and f"{REFUSED} (2)" in summary and "last error:" in summary


def test_the_pusher_says_why_it_dropped(server: Server, capsys) -> None:
    """A Pyroscope that never answers: no error yet, and still the drops have a reason."""
    server.mode = "hang"
    client = PyroscopeClient(server.url, timeout=30)
    pusher = Pusher(lambda p: client.push(p, {"service_name": "x"}), queue_size=2)
    for _ in range(6):
        pusher.submit(two_device_profile())
    pusher.close(timeout=0.2)
    summary = capsys.readouterr().err.splitlines()[-1]
    assert "dropped 6 (" in summary
    assert "because the queue (2) was full while a push waited for Pyroscope's answer" in summary
    assert "still unsent when the 0.2 s flush at exit ran out" in summary


# -- gpuflame run --pyroscope and gpuflame push, end to end ------------------------------

SCRIPT = """
import sys, time, torch

class Model:
    def build(self):
        return torch.zeros(64 * 1024)  # 256 KiB

def main():
    keep = [Model().build() for _ in range(3)]
    time.sleep(float(sys.argv[1]))
    return keep

main()
sys.exit(3)
"""


def run_gpuflame(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """``gpuflame run --backend torch -o out.pb.gz ARGS`` and how long it took."""
    started = time.monotonic()
    done = gpuflame_run("--backend", "torch", "-o", str(tmp_path / "out.pb.gz"), *args, cwd=tmp_path, env=env)
    return done, time.monotonic() - started


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.subprocess
def test_run_pushes_every_interval_and_at_exit(
    server: Server, tmp_path: Path, script: Path, push_pb2: ModuleType, profile_pb2: ModuleType
) -> None:
    pytest.importorskip("torch")
    done, _ = run_gpuflame(tmp_path, "--pyroscope", server.url, "--interval", "200ms", str(script), "1.2")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert len(server.requests) >= 3, done.stderr  # a few intervals, then the final push
    pids = set()
    for request in server.requests:
        for labels, pprof in decode_push(request["body"], push_pb2, profile_pb2):
            assert labels["__name__"] == "gpu_memory"
            assert labels["service_name"] == "tiny_train"
            pids.add(labels["pid"])
            ids = type_ids(labels, pprof)
            assert "gpu_memory:inuse_space:bytes:space:bytes" in ids
            assert "gpu_memory:peak_space:bytes:space:bytes" in ids
            assert "gpu_memory:alloc_space:bytes:space:bytes" in ids
    assert len(pids) == 1
    pushes = [decode_push(r["body"], push_pb2, profile_pb2) for r in server.requests]
    held = [sum(totals(p)["inuse_space"] for _, p in push) for push in pushes]
    assert max(held) >= 3 * 256 * 1024  # while main() sleeps
    # allocations are counted once over all the intervals, not again at every push
    allocated = sum(totals(p)["alloc_space"] for push in pushes for _, p in push)
    assert 3 * 256 * 1024 <= allocated < 2 * 3 * 256 * 1024
    assert "sent" in done.stderr


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """The script under gpuflame run without pushing."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("baseline")
    (tmp / "tiny_train.py").write_text(SCRIPT)
    done, _ = run_gpuflame(tmp, "--interval", "200ms", str(tmp / "tiny_train.py"), "1")
    assert done.returncode == 3, done.stderr
    return done


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["down", "500", "429", "401", "hang", "close"])
def test_a_failing_pyroscope_never_changes_the_workload(
    server: Server, tmp_path: Path, script: Path, baseline: subprocess.CompletedProcess, mode: str
) -> None:
    server.mode = mode
    url = f"http://127.0.0.1:{free_port()}" if mode == "down" else server.url
    done, _ = run_gpuflame(
        tmp_path,
        "--pyroscope",
        url,
        "--interval",
        "200ms",
        str(script),
        "1",
        env={"GPUFLAME_PYROSCOPE_TOKEN": TOKEN},
    )
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    assert TOKEN not in done.stderr and TOKEN not in done.stdout
    assert "sent 0," in done.stderr and ("dropped" in done.stderr and "failed" in done.stderr)
    # the flush at exit is bounded by its deadline, not by the server (test_submit_never_waits_...)
    assert (tmp_path / "out.pb.gz").exists()  # the local profile is still written
    assert done.returncode == baseline.returncode  # the workload ends as it does without pushing


@pytest.mark.subprocess
def test_push_command_uploads_a_file(server: Server, tmp_path: Path, push_pb2, profile_pb2) -> None:
    from gpuflame.formats import save

    path = tmp_path / "run.pb.gz"
    save(two_device_profile(), path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "push", str(path), "--url", server.url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    series = decode_push(server.requests[0]["body"], push_pb2, profile_pb2)
    assert {labels["service_name"] for labels, _ in series} == {"run"}
    server.mode = "401"
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "push", str(path), "--url", server.url],
        capture_output=True,
        text=True,
        env={**env, "GPUFLAME_PYROSCOPE_TOKEN": TOKEN},
        timeout=60,
    )
    assert done.returncode == 2 and "HTTP 401" in done.stderr and TOKEN not in done.stderr
    server.mode = "garbage"
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "push", str(path), "--url", server.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and RAW.findall(done.stderr) == []
    assert "not HTTP: \\x1b[2J" in done.stderr and len(done.stderr) < 2 * EXCERPT + 200


@pytest.mark.subprocess
def test_the_demo_pushes_its_kv_cache_and_weights_by_name(
    server: Server, tmp_path: Path, push_pb2: ModuleType, profile_pb2: ModuleType
) -> None:
    """Issue 5's check: `gpuflame run --pyroscope` of the demo, decoded by an independent decoder."""
    pytest.importorskip("transformers")
    demo = REPO / "examples" / "demo.py"
    done, _ = run_gpuflame(
        tmp_path, "--pyroscope", server.url, "--service-name", "demo", str(demo), "--rounds", "1", "--new-tokens", "2"
    )
    assert done.returncode == 0, done.stderr
    names: set[str] = set()
    alloc = 0
    for request in server.requests:
        for labels, pprof in decode_push(request["body"], push_pb2, profile_pb2):
            assert labels["service_name"] == "demo" and labels["__name__"] == "gpu_memory"
            strings = pprof.string_table
            names.update(strings[f.name] for f in pprof.function)
            alloc += totals(pprof)["alloc_space"]
    assert {"LlamaMLP > __init__", "Linear > __init__", "StaticLayer > lazy_initialization"} <= names
    local = load(tmp_path / "out.pb.gz").totals()["alloc_space"]
    assert alloc == local  # every allocation pushed once, over all the intervals


def test_gpu_and_gpu_model_become_series_labels(server: Server, push_pb2, profile_pb2) -> None:
    """The torch-cuda backend labels samples with the device and its model name (no GPU here: set by hand)."""
    from gpuflame.capture.recorders.torch_cuda import label_gpu_models

    p = two_device_profile()
    label_gpu_models(p, {"cuda:0": "NVIDIA H200", "cuda:1": "NVIDIA H200"})
    PyroscopeClient(server.url).push(p, {"service_name": "t"})
    series = [labels for labels, _ in decode_push(server.requests[-1]["body"], push_pb2, profile_pb2)]
    assert {(s["gpu"], s["gpu_model"]) for s in series} == {("cuda:0", "NVIDIA H200"), ("cuda:1", "NVIDIA H200")}


def test_category_becomes_a_series_label(server: Server, push_pb2, profile_pb2) -> None:
    """Few values (model/categories.py): one series per category, the bytes of each kept whole."""
    p = Profile([("inuse_space", "bytes")])
    p.add([Frame("Linear > __init__", "/m.py", 1)], [300], {"pid": "7", "category": "parameter"})
    p.add([Frame("Adam > _init_group", "/a.py", 2)], [600], {"pid": "7", "category": "optimizer_state"})
    p.add([Frame("forward", "/m.py", 3)], [50], {"pid": "7", "category": "activation"})
    PyroscopeClient(server.url).push(p, {"service_name": "t"})
    pushed = decode_push(server.requests[-1]["body"], push_pb2, profile_pb2)
    by = {labels["category"]: totals(pprof)["inuse_space"] for labels, pprof in pushed}
    assert by == {"parameter": 300, "optimizer_state": 600, "activation": 50}
    assert all(labels["pid"] == "7" for labels, _ in pushed)


def test_phase_becomes_a_series_label(server: Server, push_pb2, profile_pb2) -> None:
    """The program's phases (model/phases.py): one series per phase, the bytes of each kept whole."""
    p = Profile([("inuse_space", "bytes")])
    p.add([Frame("load", "/m.py", 1)], [300], {"pid": "7", "phase": "load_model"})
    p.add([Frame("step", "/m.py", 2)], [600], {"pid": "7", "phase": "train"})
    PyroscopeClient(server.url).push(p, {"service_name": "t"})
    pushed = decode_push(server.requests[-1]["body"], push_pb2, profile_pb2)
    assert {labels["phase"]: totals(pprof)["inuse_space"] for labels, pprof in pushed} == {
        "load_model": 300,
        "train": 600,
    }


def test_bytes_that_change_category_between_pushes_are_pushed_once() -> None:
    """The object graph may name a block only at a later snapshot: its stack's bytes move between categories."""

    def snap(rows: dict[str, int]) -> Profile:
        p = Profile([("alloc_space", "bytes")])
        for category, alloc in rows.items():
            p.add([Frame("Linear > __init__", "/m.py", 1)], [alloc], {"pid": "7", "category": category})
        return p

    window = IntervalWindow()
    snapshots = [
        snap({"activation": 100}),
        snap({"parameter": 100}),  # the same 100 bytes, named a parameter now
        snap({"parameter": 100, "activation": 30}),
        snap({"parameter": 160, "activation": 10}),  # 40 more, and 20 of the activation's named parameters
    ]
    pushed: dict[str, int] = {}
    for s in snapshots:
        for sample in window.next(s).samples:
            category = sample.label("category") or ""
            pushed[category] = pushed.get(category, 0) + sample.values[0]
    assert sum(pushed.values()) == 170  # what the final snapshot says was allocated since the start
    assert pushed == {"activation": 130, "parameter": 40}


def test_every_category_can_become_a_series_label() -> None:
    """A sample label with more values than MAX_LABEL_VALUES is not made a series label: the vocabulary
    (ten categories since frozen_parameter and comm_buffer) must stay under it, or Grafana loses the split."""
    from gpuflame.model.categories import CATEGORIES
    from gpuflame.ship import pyroscope

    assert "category" in pyroscope.SERIES_SAMPLE_LABELS
    assert len(CATEGORIES) < pyroscope.MAX_LABEL_VALUES

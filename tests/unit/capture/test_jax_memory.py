"""The ``jax`` capture backend on JAX's CPU backend: live buffers in the AKS guide's names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from gpuflame.capture.recorders.jax_memory import JaxMemoryRecorder, take_profile  # noqa: E402
from gpuflame.model import Profile  # noqa: E402

PEAK, PEAK_N, INUSE, INUSE_N = range(4)


class Model:
    def make(self, n: int) -> Any:
        return jnp.ones((n, 256), dtype=jnp.float32)

    def make_nested(self) -> Any:
        def inner() -> Any:
            return jnp.zeros(1000, dtype=jnp.int32)

        return inner()


def at(profile: Profile, name: str, column: int) -> int:
    """Sum of *column* over samples with a frame named *name*."""
    return sum(s.values[column] for s in profile.samples if any(f.name == name for f in profile.stack_frames(s)))


@pytest.mark.slow
def test_arrays_made_in_a_method_land_on_class_and_method() -> None:
    rec = JaxMemoryRecorder()
    rec.start()
    x = Model().make(128)
    y = Model().make_nested()
    profile = rec.snapshot()
    rec.stop()
    assert rec.errors == []
    assert at(profile, "Model > make", INUSE) == x.nbytes == 128 * 256 * 4
    assert at(profile, "Model > make", INUSE_N) == 1
    assert at(profile, "Model > make_nested > inner", INUSE) == y.nbytes == 4000
    sample = next(s for s in profile.samples if any(f.name == "Model > make" for f in profile.stack_frames(s)))
    frames = profile.stack_frames(sample)
    make = next(f for f in frames if f.name == "Model > make")
    assert make.file == __file__ and make.line > 0
    labels = dict(sample.labels)
    assert labels["device"].startswith("cpu") and labels["pid"] == str(os.getpid())
    assert profile.default_type == "peak_space"
    assert [t.type for t in profile.sample_types] == [
        "peak_space",
        "peak_objects",
        "inuse_space",
        "inuse_objects",
    ]
    assert any("alloc" in c for c in profile.comments)


class Jitted:
    def first_and_second_calls(self) -> tuple[Any, Any]:
        step = jax.jit(lambda w: jnp.tanh(w * 2.0))
        w = jnp.ones((64, 64))  # 16 KiB
        return step(w), step(w)  # the first call dispatches in Python (jit's cache miss), the second in C++

    def scanned(self) -> Any:
        return jax.lax.scan(lambda c, _: (c + 1.0, c * 2.0), jnp.ones((32, 32)), None, length=4)


def test_a_jitted_call_is_the_users_line_and_an_api_is_named_by_itself_not_by_its_wrapper() -> None:
    """JAX wraps each public function in ``api_boundary``: ``lax.scan`` was named by that wrapper's frame."""
    first, second = Jitted().first_and_second_calls()
    carry, ys = Jitted().scanned()
    profile = take_profile()
    names = {f.name for s in profile.samples for f in profile.stack_frames(s)}
    assert not any("reraise_with_filtered_traceback" in n or "cache_miss" in n for n in names), names

    def leaf_bytes(caller: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in profile.samples:
            frames = profile.stack_frames(s)
            if any(f.name == caller for f in frames):
                out[frames[0].name] = out.get(frames[0].name, 0) + s.values[INUSE]
        return out

    # both calls of the jitted function: its result is the caller's own, the cached call's as the first's
    assert first.nbytes + second.nbytes == 2 * 64 * 64 * 4
    assert leaf_bytes("Jitted > first_and_second_calls") == {"Jitted > first_and_second_calls": 2 * 64 * 64 * 4}
    assert leaf_bytes("Jitted > scanned") == {"scan": carry.nbytes + ys.nbytes}


def test_framework_frames_are_pruned_unless_kept() -> None:
    x = Model().make(64)
    pruned = take_profile()
    kept = take_profile(keep_framework=True)

    def stack_of(profile: Profile) -> list[Any]:
        sample = next(s for s in profile.samples if any(f.name == "Model > make" for f in profile.stack_frames(s)))
        return profile.stack_frames(sample)

    def in_jax(f: Any) -> bool:
        return f"{os.sep}jax{os.sep}" in f.file or f"{os.sep}jaxlib{os.sep}" in f.file

    short, full = stack_of(pruned), stack_of(kept)
    assert sum(in_jax(f) for f in short) == 1  # the JAX function the user called
    assert in_jax(short[0]) and short[1].name == "Model > make"
    assert sum(in_jax(f) for f in full) > 3
    assert at(pruned, "Model > make", INUSE) == at(kept, "Model > make", INUSE) == x.nbytes


def test_peak_is_the_highest_sample_and_inuse_the_latest() -> None:
    rec = JaxMemoryRecorder()
    rec.start()
    big = Model().make(1024)
    big_bytes = big.nbytes
    rec.sample()
    del big
    small = Model().make(8)
    profile = rec.snapshot()
    rec.stop()
    assert at(profile, "Model > make", PEAK) == big_bytes
    assert at(profile, "Model > make", INUSE) == small.nbytes
    assert rec.samples_taken >= 3


def test_the_timeline_holds_each_sample_total_per_device() -> None:
    held = Model().make(4)  # so the device holds buffers at the first sample (JAX names only those)
    started = time.time_ns()
    rec = JaxMemoryRecorder()
    rec.start()
    big = Model().make(1024)
    rec.sample()
    del big
    small = Model().make(8)
    profile = rec.snapshot()
    rec.stop()
    assert rec.errors == [] and profile.timeline is not None
    ((labels, points),) = profile.timeline.series.items()
    assert dict(labels)["pid"] == str(os.getpid()) and dict(labels)["device"].startswith("cpu")
    assert len(points) == 3 and started <= points[0][0] < points[1][0] < points[2][0] <= time.time_ns()
    assert points[1][1] - points[0][1] == 1024 * 256 * 4  # the sample taken while `big` was alive
    assert points[1][1] == sum(s.values[PEAK] for s in profile.samples)  # the peak sample's total
    assert points[2][1] == sum(s.values[INUSE] for s in profile.samples) == points[0][1] + small.nbytes
    assert points[0][1] >= held.nbytes


def test_a_failing_profile_source_is_reported_once(capsys: pytest.CaptureFixture[str]) -> None:
    calls = [0]

    def broken() -> bytes:
        calls[0] += 1
        if calls[0] > 1:
            raise RuntimeError("injected fault")
        return jax.profiler.device_memory_profile()

    rec = JaxMemoryRecorder(source=broken)
    rec.start()
    x = Model().make(16)
    rec.sample()
    rec.sample()
    profile = rec.snapshot()
    rec.stop()
    assert float(x.sum()) == 16 * 256
    err = capsys.readouterr().err
    assert err.count("gpuflame:") == 1 and "injected fault" in err
    assert rec.degraded and calls[0] == 2
    assert isinstance(profile, Profile)


def test_missing_jax_profile_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    rec = JaxMemoryRecorder(source=lambda: b"not a profile")
    rec.start()
    rec.stop()
    assert len(rec.snapshot()) == 0
    assert "could not start recording" in capsys.readouterr().err


def test_phases_are_sampled_at_each_change() -> None:
    """JAX says which buffers live, never when they were made: each phase change takes a sample, the
    table holds each phase's largest sampled total (here every buffer lives to its phase's end: exact),
    and samples carry no phase label."""
    import gpuflame
    from gpuflame.capture.books import phases

    rec = JaxMemoryRecorder()
    base = sum(a.nbytes for a in jax.live_arrays())
    rec.start()
    try:
        with gpuflame.phase("load_model"):
            w = jnp.ones((256, 256), dtype=jnp.float32)
        with gpuflame.phase("serve"):
            k = jnp.zeros((128, 256), dtype=jnp.float32)
            del w
    finally:
        rec.stop()
        phases.switch(0)
    profile = rec.snapshot()
    rows = {r.phase: r for r in profile.phases}
    assert rec.errors == [] and list(rows) == ["<none>", "load_model", "serve"]
    assert rows["load_model"].inuse_end == base + 256 * 256 * 4
    assert rows["load_model"].peak == base + 256 * 256 * 4 and rows["load_model"].samples == 2
    assert rows["serve"].peak == base + 256 * 256 * 4  # its start: the weights still lived
    assert rows["serve"].inuse_end == base + k.nbytes
    assert all(s.label("phase") is None for s in profile.samples)


def test_a_jax_profile_says_it_has_no_history_for_any_moment() -> None:
    """JAX is sampled, not followed event by event: --at/--between say so in one line, never guess."""
    from gpuflame.errors import GpuflameError
    from gpuflame.model import moment

    rec = JaxMemoryRecorder()
    rec.start()
    kept = Model().make(16)
    profile = rec.snapshot()
    rec.stop()
    assert kept.nbytes == 16 * 256 * 4
    # pytest.raises below keeps this frame alive in a cycle until a collection: JAX would list the array
    # as live in a later test of this worker (the pytest plugin's JAX recording counted it in a torch test)
    del kept
    assert profile.timeline is not None and profile.history is None
    for verb, args in ((moment.at, (0.0,)), (moment.between, (0.0, 0.001))):
        with pytest.raises(GpuflameError, match="this profile has no event history") as caught:
            verb(profile, *args)
        assert "\n" not in str(caught.value)


def test_the_recorder_names_its_backend_jax_whatever_platform_it_reads() -> None:
    """Recording.backends lists each recorder's --backend name: the JAX platform asked for (None: JAX's default)
    once took its place, so the list said [None] (found by mypy)."""
    assert JaxMemoryRecorder().backend == "jax" and JaxMemoryRecorder(backend="cpu").backend == "jax"
    assert JaxMemoryRecorder(backend="cpu").platform == "cpu"


def test_a_netted_profile_says_it_is_netted_not_the_whole_process() -> None:
    """A cell or a test nets out what JAX held at its start (without_held): its note must not say the
    profile includes buffers made before start() (the %%gpuflame cell's report said so)."""
    from gpuflame.capture.recorders.jax_memory import NETTED, WHOLE_PROCESS, without_held

    kept = Model().make(64)
    before = take_profile()
    rec = JaxMemoryRecorder()
    rec.start()
    new = Model().make(256)
    profile = rec.snapshot()
    rec.stop()
    assert any(c.startswith(WHOLE_PROCESS) for c in profile.comments)
    netted = without_held(profile, before)
    assert not any(WHOLE_PROCESS in c for c in netted.comments)
    assert any(c.startswith(NETTED) for c in netted.comments)
    assert at(netted, "Model > make", INUSE) == new.nbytes  # the kept array is netted out, per stack
    del kept


TWO_DEVICES = """
import json, os
import jax, jax.numpy as jnp
from gpuflame.capture.recorders.jax_memory import JaxMemoryRecorder
MIB = 1 << 20
d0, d1 = jax.devices()
rec = JaxMemoryRecorder()
rec.start()
kept = jax.device_put(jnp.ones((MIB,), jnp.float32), d1)  # 4 MiB on cpu:1 throughout
a = jax.device_put(jnp.ones((8 * MIB,), jnp.float32), d0).block_until_ready()  # 32 MiB on cpu:0
rec.sample()
a.delete()
b = jax.device_put(jnp.ones((4 * MIB,), jnp.float32), d1).block_until_ready()  # 16 MiB on cpu:1
rec.sample()
b.delete()
rec.stop()
p = rec.snapshot()
peak = p.type_index("peak_space")
per = {}
for s in p.samples:
    per[s.label("device")] = per.get(s.label("device"), 0) + s.values[peak]
print(json.dumps({"peak": per, "joint": p.joint_device_peak()[1], "text": p.peak_description("peak_space")}))
"""


@pytest.mark.subprocess
def test_each_device_peak_is_its_own_highest_sample(tmp_path: Any) -> None:
    """cpu:0 held 32 MiB, then cpu:1 20 MiB while cpu:0 held none: each device's peak is its own.

    The peak columns were the sample with the highest total of all devices, so cpu:1 showed 4 MiB under
    "each at its own peak"; and the devices' joint peak read 52 MiB, cpu:1 summed before cpu:0 fell.
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env.pop("GPUFLAME_ENABLED", None)
    out = subprocess.run(
        [sys.executable, "-c", TWO_DEVICES], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(out.stdout.splitlines()[-1])
    mib = 1 << 20
    assert got["peak"] == {"cpu:0": 32 * mib, "cpu:1": 20 * mib}
    assert got["joint"] == 36 * mib  # cpu:0's 32 MiB with cpu:1's 4: the most they held together
    assert "cpu:0 32.0 MiB, cpu:1 20.0 MiB" in got["text"] and "together peaked at 36.0 MiB" in got["text"]


def test_a_recording_with_no_live_buffer_at_any_sample_says_its_peak_is_sampled() -> None:
    """JAX pool workers made and freed 8-16 MiB between samples: the report read 'peak_space 0 B live at the
    moment of the highest total' (an exact claim); it is the largest of a few samples, said so."""
    import gzip

    from gpuflame.formats import pprof
    from gpuflame.model.profile import SampleType

    nothing = Profile(sample_types=[SampleType("allocations", "count"), SampleType("space", "bytes")])
    rec = JaxMemoryRecorder(source=lambda: gzip.compress(pprof.encode(nothing)))
    rec.start()
    rec.sample()
    rec.stop()
    profile = rec.snapshot()
    assert profile.totals()["peak_space"] == 0
    said = profile.peak_description("peak_space")
    assert f"the largest total of {rec.samples_taken} samples of live buffers" in said and "may be higher" in said

"""The per-site row (capture/books/site_row.py): one definition the profile, the ledger and the C++ hook agree on."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.base import empty_profile  # noqa: E402
from gpuflame.capture.books import site_row  # noqa: E402
from gpuflame.capture.books.site_row import ALLOC, COUNT, INUSE, JOINT, PEAK  # noqa: E402
from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder  # noqa: E402
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402
from gpuflame.model.sample_types import JOINT_PEAK_OBJECTS, JOINT_PEAK_SPACE  # noqa: E402


def test_the_columns_are_the_profiles_sample_types_in_order() -> None:
    """A row goes into Profile.add as it is: its columns must be the sample types, in their order."""
    plain = [t.type for t in empty_profile().sample_types]
    names = plain + [JOINT_PEAK_SPACE.type, JOINT_PEAK_OBJECTS.type]
    assert (len(plain), len(names), len(site_row.empty())) == (site_row.WIDTH, site_row.JOINT_WIDTH, len(names))
    for measure, col in (("peak", PEAK), ("inuse", INUSE), ("alloc", ALLOC)):
        assert (names[col], names[col + COUNT]) == (f"{measure}_space", f"{measure}_objects")
    assert (names[JOINT], names[JOINT + COUNT]) == (JOINT_PEAK_SPACE.type, JOINT_PEAK_OBJECTS.type)
    row = list(range(site_row.JOINT_WIDTH))
    assert site_row.sample_values(row, joint=False) == row[: site_row.WIDTH]
    assert site_row.sample_values(row, joint=True) == row


def expected(nbytes: int, live: bool) -> list[int]:
    """The row of one allocation of *nbytes* that was live at the peak (and still is, when *live*), outside a run."""
    row = site_row.empty()
    row[PEAK], row[PEAK + COUNT] = nbytes, 1
    row[ALLOC], row[ALLOC + COUNT] = nbytes, 1
    if live:
        row[INUSE], row[INUSE + COUNT] = nbytes, 1
    return row


def two_tensors() -> Any:
    kept = torch.empty(1000)  # 4000 B, live to the end
    gone = torch.empty(500)  # 2000 B, live at the peak, freed since
    del gone
    return kept


def test_the_dispatch_ledger_writes_the_named_columns() -> None:
    rec = TorchTensorRecorder()
    rec.start()
    kept = two_tensors()
    rows = list(rec.ledger.rows().values())
    rec.stop()
    assert expected(4000, live=True) in rows and expected(2000, live=False) in rows
    assert kept.numel() == 1000


def test_the_cpp_hook_writes_the_named_columns() -> None:
    try:
        hook = load_cpu_hook()
    except NativeUnavailable as exc:  # no compiler on this machine
        pytest.skip(f"the CPU allocator hook cannot be built here: {exc}")
    rec = TorchAllocatorRecorder(hook)
    rec.start()
    kept = two_tensors()
    rows = [list(values) for _site, *values in hook.rows()]
    rec.stop()
    assert expected(4000, live=True) in rows and expected(2000, live=False) in rows
    assert kept.numel() == 1000

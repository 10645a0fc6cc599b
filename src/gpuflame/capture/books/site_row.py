"""The per-site row of the torch recorders: its columns, named once.

Both torch recorders keep one row of ints per site (a stack on a device,
and a phase when phases are marked)::

    [peak bytes, peak count, in-use bytes, in-use count, alloc bytes, alloc count,
     joint bytes, joint count]

Each measure is a (bytes, count) pair: its bytes at the index named here,
its count in the next column (``+ COUNT``). The order is the profile's
sample types' (model/sample_types.py), so a row goes into
``Profile.add`` as it is: all of it in a process of ``gpuflame run``, whose
last pair is what the process held at the run's joint peak
(capture/books/joint_peak.py), only the first ``WIDTH`` columns otherwise.

Written by the dispatch recorder's ledger (capture/recorders/dispatch/ledger.py)
and, in C++, by the CPU allocator hook (capture/recorders/allocator/native/cpu_hook.cpp,
``rows()`` returns ``(site, *row)``; it follows this order and names no
index); read by capture/books/categories.py, which moves columns between
categories, and by the recorders when they build a profile.
"""

from __future__ import annotations

PEAK, INUSE, ALLOC, JOINT = 0, 2, 4, 6  # a measure's bytes; its count is the next column
COUNT = 1  # from a measure's bytes to its count
WIDTH = 6  # the columns of a row outside a run: peak, in use, allocated
JOINT_WIDTH = 8  # with a run's joint-peak pair


def empty() -> list[int]:
    """A row of zeros, joint-peak pair included."""
    return [0] * JOINT_WIDTH


def sample_values(row: list[int], joint: bool) -> list[int]:
    """A row as a profile's sample values: the joint-peak pair only in a run's profile (*joint*)."""
    return row if joint else row[:WIDTH]

"""Errors that reach the user as one plain line on stderr.

Every failure the user can cause (a bad file, a wrong flag, an unwritable
output) is raised as a :class:`GpuflameError`; the CLI prints its message and
exits with code 2. Anything else is a bug in gpuflame.
"""

from __future__ import annotations


class GpuflameError(Exception):
    """A failure caused by input, not by a bug: shown as one line, exit 2."""


class ProfileFormatError(GpuflameError):
    """A file is not a profile gpuflame can read (corrupt, truncated, unknown)."""


class UnsafePickleError(ProfileFormatError):
    """A pickle asked to run code or build an object that is not plain data."""


class UnknownSampleTypeError(GpuflameError):
    """The user asked for a sample type the profile does not have."""

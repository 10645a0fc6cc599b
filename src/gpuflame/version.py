"""gpuflame's version: the one place it is written (pyproject reads it from here).

A module of its own at the lowest floor, so a writer that stamps its files with the
version (speedscope, the webhook's patch) does not import the package's front door,
which imports the recording API above them.
"""

__version__ = "0.1.0"

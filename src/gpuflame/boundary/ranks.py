"""Which rank of a distributed job a process is, from the environment its launcher set.

The one list of the launchers' variables: the profiled process reads its own
environment (``capture/session.py`` puts the labels on every sample), the
node agent reads ``/proc/PID/environ`` of the processes it watches, and both
label a process ``rank``, ``local_rank`` and ``world_size`` the same way.

Launchers and what they set (the first that names a rank wins, so that a
torchrun inside a SLURM allocation is named by torchrun's rank, not by the
SLURM task that started torchrun):

- torchrun, Accelerate (``accelerate launch``) and DeepSpeed (``deepspeed``):
  ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``;
- Lightning's own launcher (``Trainer(devices=N)`` on one node) sets
  ``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE`` but no ``RANK``: on node 0
  the rank is the local rank; on another node it is not known from the
  environment, and only ``local_rank`` and ``world_size`` are given;
- Open MPI (``mpirun``, DeepSpeed and Accelerate over MPI):
  ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_SIZE``;
- MPICH and Intel MPI: ``PMI_RANK``, ``MPI_LOCALRANKID``, ``PMI_SIZE``;
- SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``.

Standard library only: the profiled process imports this module. The
environment is the program's (or, for the agent, another user's) text: a
value that is not a small non-negative number is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

RANK, LOCAL_RANK, WORLD_SIZE = "rank", "local_rank", "world_size"
LABELS = (RANK, LOCAL_RANK, WORLD_SIZE)

# (rank, local rank, world size) variables of each launcher, in the order they are believed
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)
NODE_RANK = "NODE_RANK"  # Lightning's: with LOCAL_RANK and no RANK, node 0's rank is its local rank
VARIABLES = frozenset(name for source in SOURCES for name in source) | {NODE_RANK}
_MAX_DIGITS = 9  # a rank of a billion processes is not a rank


def rank_labels(env: Mapping[str, str]) -> dict[str, str]:
    """``{"rank": "1", "local_rank": "1", "world_size": "2"}`` from *env*; only what is known, {} for none."""
    for rank_var, local_var, size_var in SOURCES:
        rank = _number(env.get(rank_var))
        if rank is None:
            continue
        found = {RANK: rank, LOCAL_RANK: _number(env.get(local_var)), WORLD_SIZE: _number(env.get(size_var))}
        return {k: v for k, v in found.items() if v is not None}
    local = _number(env.get("LOCAL_RANK"))
    if local is None:
        return {}
    found = {LOCAL_RANK: local, WORLD_SIZE: _number(env.get("WORLD_SIZE"))}
    if _number(env.get(NODE_RANK)) in (None, "0"):
        found[RANK] = local
    return {k: v for k, v in found.items() if v is not None}


def _number(value: str | None) -> str | None:
    """*value* as a canonical non-negative number (``"01"`` -> ``"1"``); None when it is not one."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit() or len(value) > _MAX_DIGITS:
        return None
    return str(int(value))

"""The books every recorder keeps beside its rows.

- Phases: ``phases.py`` (the running phase, and who is told when it
  changes), ``auto_phases.py`` (phases marked in frameworks gpuflame
  knows), ``ledger_phases.py`` (the dispatch recorder's per-phase books),
  ``phase_table.py`` (books as the profile's phase table).
- Categories: ``categories.py`` (what kind of memory a block is, read from
  the object graph), its adapter per recorder is ``recorders/allocator/block_categories.py`` or
  ``recorders/dispatch/block_categories.py``.
- ``joint_peak.py``: the run's shared peak tables, seen from Python.
- ``site_row.py``: the per-site row of the torch recorders, its columns named once.
"""

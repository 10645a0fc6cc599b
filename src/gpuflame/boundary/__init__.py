"""The process boundary: what the launcher and a profiled process agree on, in one package both import.

Standard library only (and gpuflame's own stdlib-only foundation modules:
``defaults``, ``units``, ``files``, ``errors``), because the profiled process
imports it, and the webhook's payload carries no dependency.

- ``settings.py``: the profiler's settings and their environment form
  (``GPUFLAME_*``: ``Settings.to_env``, ``Settings.from_env``).
- ``contract.py``: the session folder's file names, a pid read back from
  them, the bootstrap folder and the child's environment, and why a child
  cannot be followed.
- ``roll_call.py``: the registering half of the run's roll call
  (``started-PID``); the launcher's half is ``launch/roll_call.py``.
- ``backends.py``: the backend names, the framework each waits for, the
  module that records each, and the "auto" rules.

Nothing is imported here: each side imports the module it needs.
"""

"""Launch: ``gpuflame run``'s side of the process boundary (the contract both sides keep is ``boundary/``).

- ``roll_call.py``: which processes started recording and which ended
  without their final profile (a process registers through
  ``boundary/roll_call.py``; the launcher watches).
- ``runner.py``: what ``gpuflame run`` does once its arguments are parsed:
  start the program with that environment, pass it our signals, wait for
  the processes that outlive it, then collect and say.
- ``collect.py``: merge the per-process files and account for every
  process that left nothing or only a partial snapshot.
- ``outcome.py``: what the run says at its end (stderr, ``--json``).
- ``recover.py``: ``gpuflame recover``: the merge and accounting of a run
  whose launcher was killed, from the files its processes left.
- ``store.py``: the local run store ``gpuflame serve`` lists.

Nothing is imported here, and the profiled process imports nothing of
this package (it must not pay for the launcher's modules).
"""

"""Launch: ``gpuflame run``'s side of the process boundary, and the contract both sides keep.

- ``contract.py``: what the launcher and a profiled process agree on: the
  session folder's file names (``proc-PID.pb.gz``, ``lost-PID.txt``,
  ``idle-PID.txt``, ``started-PID``, the peak tables), reading a pid back
  from them, the bootstrap folder and the child's environment. Standard
  library only: the profiled process imports it.
- ``roll_call.py``: which processes started recording and which ended
  without their final profile (a process registers; the launcher watches).
- ``runner.py``: what ``gpuflame run`` does once its arguments are parsed:
  start the program with that environment, pass it our signals, wait for
  the processes that outlive it, then collect and say.
- ``collect.py``: merge the per-process files and account for every
  process that left nothing or only a partial snapshot.
- ``outcome.py``: what the run says at its end (stderr, ``--json``).
- ``recover.py``: ``gpuflame recover``: the merge and accounting of a run
  whose launcher was killed, from the files its processes left.
- ``store.py``: the local run store ``gpuflame serve`` lists.

Nothing is imported here: ``capture/`` imports ``launch.contract`` and
``launch.roll_call`` inside the profiled process, which must not pay for
the launcher's modules.
"""

"""Capture: what runs inside the profiled process, in three wings (standard library only until a framework is there).

- The runtime, here: ``session.py`` (one profiled process, writing its
  profile whatever happens), ``base.py`` (the recorder template every
  recorder follows), ``exit_hooks.py`` and ``signal_watch.py`` (the exit
  paths, hooked once), ``autostart.py`` (starting from the environment),
  ``post_import.py`` (start a backend when its framework is imported),
  ``children.py`` (children that cannot be followed), ``code_frames.py``
  (naming recorded code objects), ``continuous.py`` (pushing each snapshot).
- ``recorders/``: one module or package per backend and hook.
- ``books/``: what the recorders keep beside their rows: phases,
  categories, the run's joint peak, the site row's columns.
"""

"""gpuflame's bootstrap: put on PYTHONPATH by ``gpuflame run`` (and the webhook).

Python imports ``sitecustomize`` at start-up, before the program's first
line, in every interpreter that inherits PYTHONPATH: console scripts,
subprocess children, multiprocessing workers. This one starts the profiler
from the environment, then runs the ``sitecustomize`` it shadows, if any.
It never stops the program: any failure is one line on stderr.
"""

import os
import sys


def _gpuflame_start() -> None:
    try:
        home = os.environ.get("GPUFLAME_HOME")  # boundary/contract.py:HOME_ENV (gpuflame is not importable yet)
        if home and home not in sys.path:
            sys.path.append(home)
        from gpuflame.capture.autostart import start_from_env

        start_from_env()
    except Exception as exc:  # noqa: BLE001 - the program must run regardless
        sys.stderr.write(f"gpuflame: profiler not started ({type(exc).__name__}: {exc}); the program runs unprofiled\n")


def _gpuflame_chain() -> None:
    """Run the sitecustomize that this file hides (Debian ships one, so may the user)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"gpuflame: the program's own sitecustomize failed: {type(exc).__name__}: {exc}\n")


_gpuflame_start()
_gpuflame_chain()

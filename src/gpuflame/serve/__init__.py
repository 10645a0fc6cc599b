"""``gpuflame serve``: a local web UI over a folder of profiles (the run store by default).

- :mod:`~gpuflame.serve.catalog` finds runs and profile files and turns a
  request's id into a path, refusing anything outside the folder;
- :mod:`~gpuflame.serve.pages` writes the index and the error pages;
- :mod:`~gpuflame.serve.app` is the HTTP server (stdlib only).
"""

from gpuflame.serve.app import make_server

__all__ = ["make_server"]

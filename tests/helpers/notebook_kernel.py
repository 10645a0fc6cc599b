"""Execute a notebook with a real IPython kernel running this test run's Python.

The kernel is started from a kernel spec written for the test (the venv's
``sys.executable -m ipykernel_launcher``), so it imports the gpuflame under
test, not whatever a ``python3`` kernel found on the machine would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

KERNEL = "gpuflame-test"


def kernel_spec(folder: Path) -> Path:
    """A Jupyter data folder holding one kernel spec: this interpreter's ipykernel."""
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    return folder


def execute(cells: list[str], folder: Path) -> nbformat.NotebookNode:
    """Run *cells* in a fresh kernel (in *folder*), going on past errors; the notebook as saved and read back."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(
        nb, kernel_name=KERNEL, timeout=120, allow_errors=True, resources={"metadata": {"path": str(folder)}}
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", str(kernel_spec(folder / "jupyter")))
        client.execute()
    nbformat.write(nb, folder / "run.ipynb")
    return nbformat.read(folder / "run.ipynb", as_version=4)

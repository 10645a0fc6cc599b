"""``%load_ext gpuflame`` and ``%%gpuflame`` in a real notebook run by a real IPython kernel.

One kernel (nbclient + ipykernel, this venv's Python) runs every cell; the
tests read the executed notebook as saved. The bytes are known: ``Cache >
grow`` allocates exactly what it is asked through PyTorch's CPU allocator.
"""

from __future__ import annotations

import html as html_module
import sys
from pathlib import Path

import pytest

import gpuflame
from gpuflame.formats import load
from tests.helpers.notebook_kernel import execute

# Every test here uses a fixture that starts a child process (a server, a kernel, openssl).
pytestmark = pytest.mark.subprocess

MiB = 1 << 20

CELLS = [
    "%load_ext gpuflame",
    """import sys, torch, gpuflame
class Cache:
    def grow(self, n):
        return torch.empty(n, dtype=torch.uint8)
print(sys.executable, gpuflame.__file__)""",
    # 2: output, a peak above what is kept, and the last expression's value
    """%%gpuflame
keep = Cache().grow(4 << 20)
tmp = Cache().grow(2 << 20)
del tmp
print("cell ran")
keep.numel()""",
    # 3: the profile as an object
    "(_gpuflame.totals()['peak_space'], _gpuflame.totals()['inuse_space'], gpuflame.last() is _gpuflame)",
    # 4: an exception inside the cell, with a saved profile
    """%%gpuflame -o cell.pb.gz --type inuse
leak = Cache().grow(1 << 20)
raise ValueError("boom in the cell")""",
    "print('after the error')",
    "%gpuflame_report -n 3",
    # 7: nothing allocated
    "%%gpuflame --backend torch\n2 + 2",
    # 8: profiling already on: the cell still runs, gpuflame says so in one line
    "gpuflame.start('outer.pb.gz', backend='torch')",
    "%%gpuflame\nprint('runs anyway')",
    "gpuflame.stop() is not None",
    # 11: a bad flag is a usage error, the cell does not run
    "%%gpuflame --type nope\nprint('must not run')",
    # 12: the trailing semicolon still hides the value
    "%%gpuflame\nCache().grow(1024).numel();",
    # 13: the report under the graph, the viewer page kept
    "%%gpuflame --report -o cell.html\nkept = Cache().grow(3 << 20)",
    # 14: an output that is a folder: refused before the cell runs, as gpuflame run -o refuses it
    "%%gpuflame -o ./\nprint('must not run either')",
    # 15: the user's own start/stop inside the cell: nested, each gets its own answer
    "%%gpuflame\ngpuflame.start('mine.pb.gz', backend='torch')\nmine = Cache().grow(4 << 20)\nprint(gpuflame.stop())",
    # 16: only the kernel's process is recorded: pool workers' tensors are not the cell's (docs/notebook.md)
    """%%gpuflame --backend torch
import multiprocessing as mp
def made(n):
    return Cache().grow(n).numel()
with mp.get_context("fork").Pool(2) as pool:
    print(pool.map(made, [1 << 20, 2 << 20]))""",
]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    folder = tmp_path_factory.mktemp("magic")
    nb = execute(CELLS, folder)
    return nb.cells, folder


def streams(cell, name: str) -> str:
    return "".join(o["text"] for o in cell.outputs if o.output_type == "stream" and o["name"] == name)


def displays(cell) -> list[dict]:
    return [o["data"] for o in cell.outputs if o.output_type == "display_data"]


def result(cell) -> str | None:
    values = [o["data"]["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    return values[0] if values else None


def test_the_kernel_runs_this_python_and_this_gpuflame(notebook) -> None:
    cells, _ = notebook
    executable, module = streams(cells[1], "stdout").split()
    assert executable == sys.executable
    assert Path(module).resolve() == Path(gpuflame.__file__).resolve()


def test_cell_output_value_and_inline_flame_graph(notebook) -> None:
    cells, _ = notebook
    cell = cells[2]
    assert streams(cell, "stdout") == "cell ran\n"
    assert result(cell) == str(4 * MiB)
    assert "error" not in [o.output_type for o in cell.outputs]
    [data] = displays(cell)
    line = data["text/plain"]
    assert line == (
        "gpuflame [torch]: peak 6.00 MiB, in use at the end 4.00 MiB, allocated 6.00 MiB, "
        "top: Cache > grow (6.00 MiB self at peak)"
    )
    html = data["text/html"]
    assert html.startswith('<iframe class="gpuflame-inline"') and 'sandbox="allow-scripts"' in html
    assert 'srcdoc="&lt;!doctype html&gt;' in html and "<script" not in html  # the page is only inside srcdoc
    assert html_module.escape(line) in html  # the caption under the frame


def test_the_profile_is_a_python_object(notebook) -> None:
    cells, _ = notebook
    assert result(cells[3]) == f"({6 * MiB}, {4 * MiB}, True)"


def test_an_exception_is_the_cells_own_after_the_graph(notebook) -> None:
    cells, folder = notebook
    cell = cells[4]
    kinds = [o.output_type for o in cell.outputs]
    assert kinds == ["display_data", "error"], kinds
    error = cell.outputs[1]
    assert (error["ename"], error["evalue"]) == ("ValueError", "boom in the cell")
    trace = "\n".join(error["traceback"])
    assert "raise ValueError" in trace and "magic.py" not in trace  # gpuflame's own frame is hidden
    assert "In[5]" in trace and "In[6]" not in trace  # the cell's lines carry its own number, not the next one
    line = displays(cell)[0]["text/plain"]
    assert "top: Cache > grow (1.00 MiB self at in use)" in line and "saved to cell.pb.gz" in line
    saved = load(folder / "cell.pb.gz")
    assert saved.totals()["inuse_space"] == MiB
    assert {f.name for f in saved.frames} == {"<module>", "Cache > grow"}  # the kernel's frames cut away
    # cells named as IPython's tracebacks name them (this cell ran 5th, Cache was defined by the 2nd)
    assert {(f.name, f.file, f.line) for f in saved.frames} == {("<module>", "In[5]", 1), ("Cache > grow", "In[2]", 4)}
    assert streams(cells[5], "stdout") == "after the error\n"  # the notebook goes on (allow_errors)


def test_report_of_the_last_profile(notebook) -> None:
    cells, _ = notebook
    text = streams(cells[6], "stdout")
    assert "gpuflame report last %%gpuflame cell" in text
    assert "Cache > grow" in text and "1.00 MiB" in text
    # a narrow table keeps its title on one line (it wrapped at the table's ~40 columns)
    assert "What allocates the most: widest leaf bars (by self)\n" in text
    assert "What is responsible: widest bars at the bottom, followed up to where they split\n" in text


def test_nothing_recorded_is_one_line(notebook) -> None:
    cells, _ = notebook
    cell = cells[7]
    assert result(cell) == "4" and not displays(cell)
    said = streams(cell, "stderr")
    assert said == "gpuflame: nothing was recorded: the torch backend saw no allocation in this cell\n"


def test_profiling_already_on_leaves_the_cell_alone(notebook) -> None:
    cells, _ = notebook
    cell = cells[9]
    assert streams(cell, "stdout") == "runs anyway\n" and not displays(cell)
    assert streams(cell, "stderr") == (
        "gpuflame: this process is already being profiled (gpuflame.start); the cell runs without %%gpuflame\n"
    )
    assert result(cells[10]) == "True"  # the user's own profile was not stopped by the magic


def test_bad_flag_is_a_usage_error_and_the_cell_does_not_run(notebook) -> None:
    cells, _ = notebook
    cell = cells[11]
    assert "must not run" not in streams(cell, "stdout")
    text = "".join(o.get("text", "") + "".join(o.get("traceback", [])) for o in cell.outputs)
    assert "UsageError" in text and "invalid choice: 'nope'" in text


def test_semicolon_hides_the_value(notebook) -> None:
    cells, _ = notebook
    assert result(cells[12]) is None and len(displays(cells[12])) == 1


def test_report_flag_and_html_output(notebook) -> None:
    cells, folder = notebook
    cell = cells[13]
    [data] = displays(cell)
    assert "saved to cell.html" in data["text/plain"]
    text = streams(cell, "stdout")
    assert "gpuflame report last %%gpuflame cell" in text and "Cache > grow" in text and "3.00 MiB" in text
    page = (folder / "cell.html").read_text()
    assert page.startswith("<!doctype html>") and 'id="gpuflame-data"' in page


def test_an_output_folder_is_refused_before_the_cell_runs(notebook) -> None:
    cells, _ = notebook
    cell = cells[14]
    assert "must not run either" not in streams(cell, "stdout")
    text = "".join(o.get("text", "") + "".join(o.get("traceback", [])) for o in cell.outputs)
    assert "UsageError" in text and "it is a folder" in text and "the cell did not run" in text


def test_a_users_own_stop_inside_the_cell_ends_only_the_users_recording(notebook) -> None:
    cells, folder = notebook
    cell = cells[15]
    assert "mine.pb.gz" in streams(cell, "stdout")
    [data] = displays(cell)
    assert "peak 4.00 MiB" in data["text/plain"], data["text/plain"]  # the cell's own answer, not "no allocation"
    assert gpuflame.load(folder / "mine.pb.gz").totals()["peak_space"] == 4 * MiB


def test_child_processes_of_a_cell_are_not_recorded(notebook) -> None:
    """As docs/notebook.md says: the workers made 3 MiB, the kernel none, and the cell says nothing was recorded."""
    cells, _ = notebook
    cell = cells[16]
    assert streams(cell, "stdout") == "[1048576, 2097152]\n" and not displays(cell)
    said = streams(cell, "stderr")
    assert said == "gpuflame: nothing was recorded: the torch backend saw no allocation in this cell\n"


def test_the_summary_says_whose_allocated_total_it_is_beside_jax() -> None:
    """JAX reports live buffers only: with torch and JAX in one cell, "allocated" is torch's alone."""
    from gpuflame.analysis.summary import summarize
    from gpuflame.notebook.inline import summary_line
    from tests.helpers.profiles import small_profile

    summary = summarize(small_profile("grow", 4 * MiB))
    assert "allocated (torch only) 4.00 MiB" in summary_line(summary, ["torch", "jax"])
    assert "allocated 4.00 MiB" in summary_line(summary, ["torch"])

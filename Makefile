# Everything a fresh machine needs: `make demo` (the main job), `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all venv tools demo test test-fast docs lint bench clean bpf test-loaded proto

all: test

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build (2.13.0); an unpinned torch pulls CUDA.
$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The system tools the tests use as peers and drivers (Go's pprof, g++, Chromium, kubectl,
# the agent's BPF toolchain, QEMU): installed where missing when run as root with apt-get,
# otherwise named with the tests that will skip. One script, which CI's .ci/run uses too.
tools:
	@sh .ci/install-tools

# The main job: profile the demo workload (a small Llama generating with a
# static KV cache, on the GPU if there is one, else the CPU), then show the
# report and the flame graph, and write flame-graph files.
demo: venv
	@mkdir -p out
	$(BIN)/gpuflame run -o out/demo.pb.gz examples/demo.py
	$(BIN)/gpuflame report out/demo.pb.gz --hide-trampolines
	$(BIN)/gpuflame flame out/demo.pb.gz --hide-trampolines
	$(BIN)/gpuflame view out/demo.pb.gz -o out/demo.html
	$(BIN)/gpuflame export out/demo.pb.gz --format speedscope -o out/demo.speedscope.json
	$(BIN)/gpuflame export out/demo.pb.gz --format folded -o out/demo.folded

# The suite starts thousands of Python processes and every pytest worker rewrites the test
# modules: where PYTHONDONTWRITEBYTECODE is set (it is on these machines) each of them compiled
# gpuflame's and the tests' modules afresh. Unset, their bytecode is written once, into the
# __pycache__ folders git ignores. (PYTHONPYCACHEPREFIX would hide the bytecode pip wrote for
# torch and the rest, and a fresh clone would compile them all again: slower, not faster.)
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

# Each test file runs whole on one worker (--dist loadfile): a file's module-scoped fixtures (a
# browser, a recorded run, a notebook kernel) are made once, not once per worker that gets one of
# its tests; 8% less CPU for the suite, and the workers still end within seconds of each other.
XDIST := -n auto --dist loadfile

# Half as many workers again as cores (pytest-xdist; tests/conftest.py says why): 8.5-10.5
# minutes on a 2-core machine (CONTRIBUTING.md). Tests that run at once never share a file or
# a port; the agent's tests tolerate another worker's processes (an agent watching every
# process sees them too).
test: venv tools
	$(PYTEST) -q $(XDIST)

# The unit tests that run in this process (no subprocess, browser, agent or
# GPU) and take under a second each: the lane to run while editing, in about a
# minute. tests/unit/conftest.py keeps it honest about subprocesses.
test-fast: venv
	$(PYTEST) -q $(XDIST) tests/unit -m "not subprocess and not slow"

# The whole suite three times in a row, each beside four busy loops: the proof that no
# test depends on the machine's speed (about 28 minutes a run on 2 cores). Stops at the
# first failing run.
test-loaded: venv tools
	for run in 1 2 3; do \
	  busy=""; for i in 1 2 3 4; do $(BIN)/python -c "while True: pass" & busy="$$busy $$!"; done; \
	  $(PYTEST) -q $(XDIST); rc=$$?; kill $$busy; \
	  [ $$rc -eq 0 ] || exit $$rc; echo "loaded run $$run of 3 passed"; \
	done

# The documentation site (docs/, mkdocs.yml) into site/, offline; --strict makes every
# warning an error: a broken link or anchor, a page left out of nav. The versions are
# pinned in pyproject's `docs` extra; torch and the test tools are not needed for it.
$(VENV)/.docs-installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

# First, what each documented command prints is run again into the pages
# (docs/hooks/command_outputs.py), so a page cannot show output the program no longer gives.
docs: $(VENV)/.docs-installed
	$(BIN)/python docs/hooks/command_outputs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The node agent's BPF object (CO-RE, built once; needs clang, bpftool, libbpf-dev
# and a kernel with BTF). Packages and images build it before the wheel; a
# source checkout builds it here, or the agent's tests build it when missing.
bpf: venv
	$(BIN)/python -m gpuflame.agent.build

# The pprof reader's classes, generated from formats/pprof_proto/*.proto by the pinned grpcio-tools and
# checked in (tests/unit/formats/test_pprof_proto.py checks they are what this writes)
proto:
	$(BIN)/python -m gpuflame.formats.pprof_proto.generate

# ruff and mypy are pinned in the test extra (pyproject.toml); mypy's settings are there too
lint: venv
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

bench: venv
	$(BIN)/pip install --quiet -e '.[test,bench]'
	npm ci --prefix bench/viewer --no-audit --no-fund || echo "npm ci --prefix bench/viewer failed: bench_viewer.py measures gpuflame without speedscope"
	$(BIN)/python bench/run_all.py

# The check to run the first time a GPU is at hand (docs/gpu-check.md): tests/gpu, torch-cuda's
# overhead, real snapshots, simulate beside the GPU, the agent on the real driver, in under 8
# minutes, at most 8 files in $(OUT) (default bench/out/gpu-check). No network and no venv needed
# there: the venv's Python when it exists, else $(PYTHON). `make gpu-check ARGS=--dry-run` anywhere.
GPU_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py $(if $(OUT),--out "$(OUT)") $(ARGS)

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache

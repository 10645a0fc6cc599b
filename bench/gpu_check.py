"""Check gpuflame on a real GPU in one command, under 8 minutes: ``make gpu-check`` runs this.

Writes at most 8 files into one folder (``--out``, default ``$OUT``, else
bench/out/gpu-check); each part runs in its own process with its own time
limit, and a part that cannot run says why in its file while the rest go on.
``--dry-run`` runs every part at tiny sizes (on a machine without CUDA the
parts that need it say "skipped: no CUDA"); tests/e2e/test_gpu_check.py runs
it. The parts, one module each, are in bench/gpu_check/ (its __init__ lists
them); docs/gpu-check.md says what each file holds.

    python bench/gpu_check.py --out "$OUT"
    python bench/gpu_check.py --dry-run --out /tmp/gpu-check
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package bench/gpu_check/ beside this file

from gpu_check.driver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""Where the test suite's files are, for every test module wherever it sits."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SRC = REPO / "src"
DATA = TESTS / "data"
FIXTURES = TESTS / "fixtures"

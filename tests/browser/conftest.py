"""Fixtures for tests that drive a real headless Chromium (skipped where there is none)."""

from __future__ import annotations

import sys
from pathlib import Path

# The profiles these tests open are shared with tests/test_view_cli.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

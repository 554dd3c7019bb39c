"""Helpers shared by the benchmark scripts: where the shared data is, and a best-of-N timer."""

from __future__ import annotations

import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("KANGENGINE_TEST_DATA", REPO.parent / "shared" / "data"))


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of ``repeats`` calls of ``fn()`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best

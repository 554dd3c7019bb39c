"""Helpers shared by the benchmark scripts: where the shared data is, a best-of-N timer, and BVH crops."""

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


def crop_bvh(src: Path, dst: Path, seconds: float, index: int) -> None:
    """Write ``dst``: the real BVH file ``src`` with ``seconds`` of its motion rows, starting at an offset that
    moves with ``index`` (so crops of one file differ); same header, ``Frames:`` fixed."""
    head, motion = src.read_text().split("MOTION", 1)
    lines = motion.strip("\n").split("\n")
    frame_time = float(lines[1].split(":")[1])
    n = max(int(seconds / frame_time), 2)
    rows = lines[2:]
    start = (index * n // 2) % max(len(rows) - n, 1)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(f"{head}MOTION\nFrames: {n}\n{lines[1]}\n" + "\n".join(rows[start : start + n]) + "\n")

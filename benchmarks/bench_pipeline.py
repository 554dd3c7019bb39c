"""Clips per minute through ``kangengine convert`` + ``kangengine validate`` on a folder of real clips, with
``--workers 1`` and ``--workers 2``, and the scaling ratio (measured in the same run).

The folder holds ``--clips`` crops (default 32) of real CMU BVH files (``../shared/data/bvh/cmu``: 02_01
walk, 01_01 hops, 131_01 walk, 002_03 run) of ``--seconds`` each, at different offsets, in three
sub-folders. Each configuration runs the real command (``python -m kangengine``) in a fresh output folder,
so process start, imports and worker spawn are counted; ``--threads 1`` per process. Wall time and the CPU
time of the command and its children (``resource.RUSAGE_CHILDREN``) are printed side by side: on a machine
whose cores are shared with other jobs, a ratio below 2 with CPU time near 2x wall time means the cores
were busy, not that the workers waited.

    python benchmarks/bench_pipeline.py [--clips 32] [--seconds 1.0] [--fps 30] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DATA

REPO = Path(__file__).resolve().parents[1]
SOURCES = (
    "02_01_cgspeed_walk.bvh",
    "01_01_cgspeed_hops_long.bvh",
    "131_01_3dsmax_walk_mixedorder.bvh",
    "002_03_iclone_cc_run.bvh",
)


def _crop(src: Path, dst: Path, seconds: float, index: int) -> None:
    head, motion = src.read_text().split("MOTION", 1)
    lines = motion.strip("\n").split("\n")
    frame_time = float(lines[1].split(":")[1])
    n = max(int(seconds / frame_time), 2)
    rows = lines[2:]
    start = (index * n // 2) % max(len(rows) - n, 1)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(f"{head}MOTION\nFrames: {n}\n{lines[1]}\n" + "\n".join(rows[start : start + n]) + "\n")


def _timed(args: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kangengine", *args, "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"kangengine {' '.join(args)} failed:\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each crop")
    parser.add_argument("--fps", type=float, default=30.0, help="convert resamples to this rate")
    parser.add_argument("--batch-size", type=int, default=8, help="validate: clips simulated together")
    args = parser.parse_args()
    model = str(REPO / "kangengine" / "data" / "humanoid_CMU.xml")
    work = Path(tempfile.mkdtemp(prefix="kangengine_bench_pipeline_"))
    src = work / "src"
    for i in range(args.clips):
        name = SOURCES[i % len(SOURCES)]
        _crop(DATA / "bvh" / "cmu" / name, src / f"part{i % 3}" / f"{Path(name).stem}_{i:03d}.bvh", args.seconds, i)
    print(f"{args.clips} clips of {args.seconds:g} s (real CMU BVH crops) in {src}")
    print("workers | stage    | wall s | cpu s (all processes) | clips/min (wall)")
    rates = {}
    for workers in (1, 2):
        conv, val = work / f"conv{workers}", work / f"val{workers}"
        common = ["--workers", str(workers), "--threads", "1"]
        cw, cc = _timed(
            ["convert", model, str(src), "--config", "cmu_bvh_to_cmu_humanoid", "--fps", str(args.fps)]
            + ["--out", str(conv), *common]
        )
        vw, vc = _timed(
            ["validate", model, str(conv), "--out", str(val), "--no-plots"]
            + ["--batch-size", str(args.batch_size), *common]
        )
        for stage, w, c in (("convert", cw, cc), ("validate", vw, vc), ("both", cw + vw, cc + vc)):
            print(f"{workers:7d} | {stage:8s} | {w:6.1f} | {c:21.1f} | {60 * args.clips / w:8.1f}")
        rates[workers] = 60 * args.clips / (cw + vw)
        identical = all(
            (work / "val1" / p.relative_to(val)).read_bytes() == p.read_bytes() for p in val.rglob("*.json")
        )
        if workers > 1:
            print(f"reports of --workers {workers} byte-identical to --workers 1: {identical}")
    print(f"scaling, convert + validate, --workers 2 / --workers 1: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()

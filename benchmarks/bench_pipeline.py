"""Clips per minute through ``kangengine convert`` + ``kangengine validate`` on a folder of real clips, with
``--workers 1``, ``--workers 2`` and ``--ray local --workers 2``, and the scaling ratios (measured in the same
run).

The folder holds ``--clips`` crops (default 32) of real CMU BVH files of ``--seconds`` each, at different
offsets, in three sub-folders: the two cgspeed files of ``../shared/data/bvh/cmu`` (02_01 walk, 01_01 hops),
the skeleton ``cmu_bvh_to_cmu_humanoid`` maps (the 3dsMax and iClone conversions there have other joint names
and would only be counted as failed clips). Every clip must convert and get a report, and the outputs of
each backend are compared byte for byte with ``--workers 1`` (the benchmark stops otherwise). Each
configuration runs the real command (``python -m kangengine``) in a fresh output folder, so process start,
imports and worker spawn are counted; ``--threads 1`` per process. Wall time and the CPU
time of the command and its children (``resource.RUSAGE_CHILDREN``) are printed side by side: on a machine
whose cores are shared with other jobs, a ratio below 2 with CPU time near 2x wall time means the cores
were busy, not that the workers waited. The Ray rows include starting and stopping a local Ray instance
(two CPUs, no dashboard) in each command, as a user running ``--ray local`` pays it; their CPU column
misses the Ray worker processes (started by Ray's raylet, not waited for by the command), so compare wall
times there; ``uptime``'s load
average is printed before and after, since other jobs on the machine change every row.

    python benchmarks/bench_pipeline.py [--clips 32] [--seconds 1.0] [--fps 30] [--batch-size 8] [--no-ray]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DATA, REPO, crop_bvh

SOURCES = ("02_01_cgspeed_walk.bvh", "01_01_cgspeed_hops_long.bvh")


def _timed(args: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kangengine", *args, "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"kangengine {' '.join(args)} failed:\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _identical(a: Path, b: Path, pattern: str) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob(pattern))
    return bool(files) and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def _check_complete(conv: Path, val: Path, clips: int) -> None:
    """Every clip converted and reported: a rate over failed clips would measure nothing."""
    npz, reports = list(conv.rglob("*.npz")), [p for p in val.rglob("*.json")]
    if len(npz) != clips or len(reports) != clips:
        raise SystemExit(f"{conv}: {len(npz)} converted and {len(reports)} reports for {clips} clips; expected all")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each crop")
    parser.add_argument("--fps", type=float, default=30.0, help="convert resamples to this rate")
    parser.add_argument("--batch-size", type=int, default=8, help="validate: clips simulated together")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray local rows")
    parser.add_argument(
        "--root-assist-hz",
        type=float,
        default=0.0,
        help="validate with root assistance (0: none, the default); clips the tracker follows to their end are "
        "simulated whole, so simulation rather than process start-up and imports dominates the time",
    )
    args = parser.parse_args()
    model = str(REPO / "kangengine" / "data" / "humanoid_CMU.xml")
    work = Path(tempfile.mkdtemp(prefix="kangengine_bench_pipeline_"))
    src = work / "src"
    for i in range(args.clips):
        name = SOURCES[i % len(SOURCES)]
        crop_bvh(DATA / "bvh" / "cmu" / name, src / f"part{i % 3}" / f"{Path(name).stem}_{i:03d}.bvh", args.seconds, i)
    print(f"{args.clips} clips of {args.seconds:g} s (real CMU BVH crops) in {src}")
    print(f"before: {_load()}")
    runs = {"workers 1": ["--workers", "1"], "workers 2": ["--workers", "2"]}
    if not args.no_ray:
        if importlib.util.find_spec("ray") is not None:
            runs["ray local 2"] = ["--ray", "local", "--workers", "2"]
        else:
            print("ray is not installed: the Ray rows are skipped (pip install 'kangengine[ray]')")
    print("backend     | stage    | wall s | cpu s (all processes) | clips/min (wall)")
    rates = {}
    for label, flags in runs.items():
        key = label.replace(" ", "_")
        conv, val = work / f"conv_{key}", work / f"val_{key}"
        common = [*flags, "--threads", "1"]
        cw, cc = _timed(
            ["convert", model, str(src), "--config", "cmu_bvh_to_cmu_humanoid", "--fps", str(args.fps)]
            + ["--out", str(conv), *common]
        )
        vw, vc = _timed(
            ["validate", model, str(conv), "--out", str(val), "--no-plots"]
            + ["--batch-size", str(args.batch_size), "--root-assist-hz", str(args.root_assist_hz), *common]
        )
        _check_complete(conv, val, args.clips)
        for stage, w, c in (("convert", cw, cc), ("validate", vw, vc), ("both", cw + vw, cc + vc)):
            print(f"{label:11s} | {stage:8s} | {w:6.1f} | {c:21.1f} | {60 * args.clips / w:8.1f}")
        rates[label] = 60 * args.clips / (cw + vw)
        if label != "workers 1":
            same = _identical(work / "conv_workers_1", conv, "*.npz") and _identical(
                work / "val_workers_1", val, "*.json"
            )
            print(f"{label}: converted clips and reports byte-identical to --workers 1: {same}")
            if not same:
                raise SystemExit(f"{label}: outputs differ from --workers 1 (in {work})")
    for label in rates:
        if label != "workers 1":
            print(f"scaling, convert + validate, {label} / workers 1: {rates[label] / rates['workers 1']:.2f}x")
    print(f"after: {_load()}")


if __name__ == "__main__":
    main()

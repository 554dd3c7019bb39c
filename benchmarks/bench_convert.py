"""Where ``convert`` spends its time: shares of reading the files, skeleton retargeting, mapping to joint
coordinates and writing, for ``convert_clips`` on a folder of real CMU BVH crops (in this process, one thread).

The folder holds ``--clips`` crops (default 32) of ``--seconds`` each of the real CMU files in
``../shared/data/bvh/cmu`` (the cgspeed walk and hops, cropped as ``bench_pipeline.py`` does). The run is
profiled with ``cProfile`` on CPU time; each stage's share is its cumulative time over the whole conversion
(``load_motion``, ``retarget_motion``, ``to_articulation_motion``, the ``.npz`` writes), and the retarget's hot
spots (``quat_multiply`` called from it, ``_lowest_points``, ``_project_hinges``, the ``level_feet`` option) are
listed on their own. A second, unprofiled run gives wall and CPU time (``time.process_time``) per clip, and the
unprofiled share of reading (``ke.io.load_bvh`` of the same files over that CPU time; cProfile's overhead
inflates the Python-heavy stages of the profiled shares). The peer of the read stage is ``bvhio.readAsBvh`` on
the same files, timed in the same run.

    python benchmarks/bench_convert.py [--clips 32] [--seconds 1.0] [--fps 30]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from _common import DATA, REPO, crop_bvh

# the cgspeed conversions: the joint names the configuration maps (the 3dsMax and iClone files name theirs
# differently and would fail the batch at the retarget step)
SOURCES = ("02_01_cgspeed_walk.bvh", "01_01_cgspeed_hops_long.bvh")
CONFIG = "cmu_bvh_to_cmu_humanoid"


def _stage_times(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative seconds of each stage's entry function (summed over the functions of one name)."""
    want = {
        "read (load_motion)": ("pipelines/load.py", "load_motion"),
        "skeleton retarget (retarget_motion)": ("retarget/skeleton.py", "retarget_motion"),
        "  of which quat_multiply": ("rotations.py", "quat_multiply"),
        "  of which _lowest_points": ("retarget/skeleton.py", "_lowest_points"),
        "  of which _project_hinges": ("retarget/skeleton.py", "_project_hinges"),
        "  of which _level_feet (level_feet option)": ("retarget/skeleton.py", "_level_feet"),
        "map (to_articulation_motion)": ("animation/mapper.py", "to_articulation_motion"),
        "write (.npz)": ("animation/motion.py", "save_articulation_motion_npz"),
        "convert_clips (total)": ("pipelines/convert.py", "convert_clips"),
    }
    out = dict.fromkeys(want, 0.0)
    retarget_callees = {}
    for (file, _line, func), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
        for label, (suffix, name) in want.items():
            if func == name and file.replace(os.sep, "/").endswith(suffix):
                if label == "  of which quat_multiply":  # only the calls made from the skeleton retarget
                    retarget_callees[func] = sum(
                        c[3] for k, c in callers.items() if k[0].replace(os.sep, "/").endswith("retarget/skeleton.py")
                    )
                    out[label] = retarget_callees[func]
                else:
                    out[label] += ct
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=1.0, help="length of each crop")
    ap.add_argument("--fps", type=float, default=30.0, help="convert resamples to this rate")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.simplefilter("ignore")
    import bvhio
    import torch

    import kangengine as ke
    from kangengine.pipelines.convert import ConvertOptions, convert_clips

    torch.set_num_threads(1)
    model = str(REPO / "kangengine" / "data" / "humanoid_CMU.xml")
    work = Path(tempfile.mkdtemp(prefix="kangengine_bench_convert_"))
    src = work / "src"
    for i in range(args.clips):
        name = SOURCES[i % len(SOURCES)]
        crop_bvh(DATA / "bvh" / "cmu" / name, src / f"part{i % 3}" / f"{Path(name).stem}_{i:03d}.bvh", args.seconds, i)
    files = sorted(src.rglob("*.bvh"))
    opts = ConvertOptions(config=CONFIG, fps=args.fps)
    print(f"{len(files)} clips of {args.seconds:g} s (real CMU BVH crops), config {CONFIG}, one thread")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")

    # warm-up: imports, model set-up, native parser and FK kernels (each process pays this once)
    convert_clips(files[:2], model, options=opts, out_dir=work / "warm")

    w0, c0 = time.perf_counter(), time.process_time()
    convert_clips(files, model, options=opts, out_dir=work / "plain")
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0

    prof = cProfile.Profile(time.process_time)  # CPU time: other jobs on a shared machine do not count
    prof.enable()
    convert_clips(files, model, options=opts, out_dir=work / "profiled")
    prof.disable()
    shares = _stage_times(pstats.Stats(prof))
    total = shares["convert_clips (total)"]

    c1 = time.process_time()
    for f in files:
        bvhio.readAsBvh(str(f))
    peer = time.process_time() - c1
    c2 = time.process_time()
    for f in files:
        ke.io.load_bvh(f)
    ours = time.process_time() - c2

    print(f"convert_clips: wall {wall:.2f} s, CPU {cpu:.2f} s ({1e3 * cpu / len(files):.1f} ms CPU per clip)")
    print("CPU time shares of the profiled run (cumulative CPU time of each stage function, cProfile):")
    for label, t in shares.items():
        if label != "convert_clips (total)":
            print(f"  {label:44s} {t:7.3f} s  {100 * t / total:5.1f} %")
    print(f"  {'convert_clips (total)':44s} {total:7.3f} s  100.0 %")
    print(
        f"read peer, same files: bvhio.readAsBvh {peer:.3f} s CPU, ke.io.load_bvh {ours:.3f} s CPU, "
        f"ratio {peer / max(ours, 1e-9):.1f}x"
    )
    # cProfile's per-call overhead inflates the Python-heavy stages: the unprofiled share of reading is the one
    # to hold against "convert time dominated by reading the files"
    print(
        f"unprofiled: reading the files (ke.io.load_bvh) {ours:.3f} s CPU of convert_clips' {cpu:.3f} s CPU "
        f"= {100 * ours / cpu:.1f} %"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Where ``convert`` spends its time: shares of reading the files, skeleton retargeting, mapping to joint
coordinates, writing and the batch's own bookkeeping, for ``convert_clips`` on a folder of real CMU BVH crops (in
this process, one thread).

The folder holds ``--clips`` crops (default 32) of ``--seconds`` each of the real CMU files in
``../shared/data/bvh/cmu`` (the cgspeed walk and hops, cropped as ``bench_pipeline.py`` does). Three views:

* **unprofiled**: ``convert_clips``' CPU time (``time.process_time``, best of ``--repeats``) beside its wall time,
  and the CPU time of each stage run on its own over the same files, the way ``convert`` runs it
  (``load_motion``, ``resample``, ``retarget_motion``, ``to_articulation_motion``,
  ``save_articulation_motion_npz``); what is left of ``convert_clips``' CPU time is its bookkeeping (file hashes,
  fingerprints, the manifest line and outcome of every clip, warnings) plus the stages running colder inside the
  batch;
* **in the batch** (the numbers to hold against "convert time dominated by reading the files"): the CPU time of
  each stage where ``convert_clips`` calls it (its entry function timed per
  call), and what is left: the batch's own bookkeeping. Inside a batch every stage runs colder than in a loop of
  its own over the same files (the other stages' code and data in between), so these are the shares of
  convert's CPU time;
* **profiled** (``cProfile`` on CPU time): each stage function's cumulative time, and the retarget's parts (its
  forward kinematics calls, the compiled passes: world map + hinges + local rotations, feet levelling, lowest
  points, rolling ground) and ``write_convert_summary``. cProfile's per-call overhead inflates the Python-heavy stages.

The peer of the read stage is ``bvhio.readAsBvh`` on the same files, timed in the same run.

    python benchmarks/bench_convert.py [--clips 32] [--seconds 1.0] [--fps 30] [--repeats 3]
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
        "  of which forward kinematics (from_local)": ("animation/kinematics/__init__.py", "from_local"),
        "  of which world map, hinges, local rotations": ("retarget/skeleton.py", "_local_rotations"),
        "  of which feet levelling (level_feet)": ("retarget/skeleton.py", "_level_feet_in_place"),
        "  of which lowest points (ground fix)": ("retarget/skeleton.py", "lowest"),
        "  of which rolling ground (ground fix)": ("retarget/skeleton.py", "_rolling_ground"),
        "map (to_articulation_motion)": ("animation/mapper.py", "to_articulation_motion"),
        "write (.npz)": ("animation/motion.py", "save_articulation_motion_npz"),
        "summary JSON (write_convert_summary)": ("pipelines/convert.py", "write_convert_summary"),
        "convert_clips (total)": ("pipelines/convert.py", "convert_clips"),
    }
    out = dict.fromkeys(want, 0.0)
    for (file, _line, func), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
        for label, (suffix, name) in want.items():
            if func == name and file.replace(os.sep, "/").endswith(suffix):
                if label == "  of which forward kinematics (from_local)":  # only the calls the retarget makes
                    out[label] += sum(
                        c[3] for k, c in callers.items() if k[0].replace(os.sep, "/").endswith("retarget/skeleton.py")
                    )
                else:
                    out[label] += ct
    return out


def _cpu(fn, repeats: int) -> float:
    """Smallest CPU time (s) of ``repeats`` calls of ``fn()``."""
    best = float("inf")
    for _ in range(repeats):
        c = time.process_time()
        fn()
        best = min(best, time.process_time() - c)
    return best


def _stages_unprofiled(files, model, config: str, fps: float, repeats: int, work: Path) -> dict[str, float]:
    """CPU seconds of each stage over ``files``, run on its own as ``convert`` runs it (best of ``repeats``)."""
    import kangengine as ke
    from kangengine.animation import save_articulation_motion_npz
    from kangengine.pipelines import load_motion
    from kangengine.retarget import retarget_motion

    desc = ke.asset.load(model)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    mapper = ke.animation.ArticulationMotionMapper(layout)
    clips = [load_motion(f) for f in files]
    resampled = [m.resample(fps) for m in clips]
    moved = [retarget_motion(m, config, desc).motion for m in resampled]
    mapped = [mapper.to_articulation_motion(m).motion for m in moved]
    (work / "stages").mkdir()
    return {
        "read (load_motion)": _cpu(lambda: [load_motion(f) for f in files], repeats),
        "resample": _cpu(lambda: [m.resample(fps) for m in clips], repeats),
        "skeleton retarget (retarget_motion)": _cpu(
            lambda: [retarget_motion(m, config, desc) for m in resampled], repeats
        ),
        "map (to_articulation_motion)": _cpu(lambda: [mapper.to_articulation_motion(m) for m in moved], repeats),
        "write (.npz)": _cpu(
            lambda: [
                save_articulation_motion_npz(work / "stages" / f"{i}.npz", m, layout=layout, durable=False)
                for i, m in enumerate(mapped)  # as convert writes them: no fsync (resume checks the CRCs)
            ],
            repeats,
        ),
    }


_STAGE_FUNCTIONS = (  # (label, module or class path, attribute): what convert calls, looked up at call time
    ("read (load_motion)", "kangengine.pipelines.load", "load_motion"),
    ("resample", "kangengine.animation.skeleton:SkeletonMotion", "resample"),
    ("skeleton retarget (retarget_motion)", "kangengine.retarget", "retarget_motion"),
    ("map (to_articulation_motion)", "kangengine.animation.mapper:ArticulationMotionMapper", "to_articulation_motion"),
    ("write (.npz)", "kangengine.animation", "save_articulation_motion_npz"),
)


def _stages_in_batch(files, model, opts, repeats: int, work: Path) -> tuple[float, dict[str, float]]:
    """``(CPU s of convert_clips, {stage: CPU s spent in it})`` of the run (of ``repeats``) with the least CPU
    time, each stage's entry function timed where convert calls it (a ``process_time`` pair per call, ~1 us).
    Inside a batch every stage runs colder than in a loop of its own (the others' code and data in between)."""
    import importlib

    from kangengine.pipelines.convert import convert_clips

    spent: dict[str, float] = {}
    originals = []
    for label, where, name in _STAGE_FUNCTIONS:
        mod, _, cls = where.partition(":")
        owner = importlib.import_module(mod)
        owner = getattr(owner, cls) if cls else owner
        fn = getattr(owner, name)
        originals.append((owner, name, fn))

        def timed(*a, _fn=fn, _label=label, **k):
            c = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - c

        setattr(owner, name, timed)
    best = (float("inf"), {})
    try:
        for k in range(repeats):
            spent.clear()
            c0 = time.process_time()
            convert_clips(files, model, options=opts, out_dir=work / f"in_batch{k}")
            cpu = time.process_time() - c0
            if cpu < best[0]:
                best = (cpu, dict(spent))
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=1.0, help="length of each crop")
    ap.add_argument("--fps", type=float, default=30.0, help="convert resamples to this rate")
    ap.add_argument("--repeats", type=int, default=3, help="unprofiled runs (the smallest CPU time counts)")
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

    wall, cpu = float("inf"), float("inf")
    for k in range(args.repeats):  # a fresh output folder each time: every clip converts
        w0, c0 = time.perf_counter(), time.process_time()
        convert_clips(files, model, options=opts, out_dir=work / f"plain{k}")
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    stages = _stages_unprofiled(files, model, CONFIG, args.fps, args.repeats, work)
    batch_cpu, in_batch = _stages_in_batch(files, model, opts, args.repeats, work)

    prof = cProfile.Profile(time.process_time)  # CPU time: other jobs on a shared machine do not count
    prof.enable()
    convert_clips(files, model, options=opts, out_dir=work / "profiled")
    prof.disable()
    shares = _stage_times(pstats.Stats(prof))
    total = shares["convert_clips (total)"]

    peer = _cpu(lambda: [bvhio.readAsBvh(str(f)) for f in files], 1)
    ours = _cpu(lambda: [ke.io.load_bvh(f) for f in files], args.repeats)

    n = len(files)
    print(
        f"convert_clips: wall {wall:.3f} s, CPU {cpu:.3f} s ({1e3 * cpu / n:.2f} ms CPU per clip, "
        f"best of {args.repeats})"
    )
    print("unprofiled CPU time of each stage, run on its own over the same files:")
    for label, t in stages.items():
        print(f"  {label:44s} {t:7.3f} s  {100 * t / cpu:5.1f} %  ({1e3 * t / n:.2f} ms per clip)")
    rest = cpu - sum(stages.values())
    print(f"  {'bookkeeping (the rest of convert_clips)':44s} {rest:7.3f} s  {100 * rest / cpu:5.1f} %")
    print(f"CPU time of each stage inside convert_clips (the run of {args.repeats} with the least CPU time):")
    for label, t in in_batch.items():
        print(f"  {label:44s} {t:7.3f} s  {100 * t / batch_cpu:5.1f} %  ({1e3 * t / n:.2f} ms per clip)")
    rest = batch_cpu - sum(in_batch.values())
    print(
        f"  {'bookkeeping (outside the stages)':44s} {rest:7.3f} s  {100 * rest / batch_cpu:5.1f} %  "
        f"({1e3 * rest / n:.2f} ms per clip; convert_clips {1e3 * batch_cpu / n:.2f} ms per clip)"
    )
    print("CPU time shares of the profiled run (cumulative CPU time of each stage function, cProfile):")
    for label, t in shares.items():
        if label != "convert_clips (total)":
            print(f"  {label:44s} {t:7.3f} s  {100 * t / total:5.1f} %")
    print(f"  {'convert_clips (total)':44s} {total:7.3f} s  100.0 %")
    print(
        f"read peer, same files: bvhio.readAsBvh {peer:.3f} s CPU, ke.io.load_bvh {ours:.3f} s CPU, "
        f"ratio {peer / max(ours, 1e-9):.1f}x"
    )
    print(
        f"reading the files (load_motion) is {100 * stages['read (load_motion)'] / cpu:.1f} % of convert_clips' CPU "
        f"time; the skeleton retarget {100 * stages['skeleton retarget (retarget_motion)'] / cpu:.1f} %, "
        f"{stages['skeleton retarget (retarget_motion)'] / stages['read (load_motion)']:.2f}x the read"
    )
    read = in_batch.get("read (load_motion)", 0.0)
    others = {k: v for k, v in in_batch.items() if k != "read (load_motion)"}
    others["bookkeeping"] = batch_cpu - sum(in_batch.values())
    top = max(others, key=others.get)
    print(
        f"inside the batch: the read is {100 * read / batch_cpu:.1f} % of convert_clips' CPU time; the largest other "
        f"part is {top} ({100 * others[top] / batch_cpu:.1f} %, {others[top] / max(read, 1e-12):.2f}x the read)"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Validation throughput on CPU: clip-seconds validated per wall-second by ``ke.pipelines.validate`` for 64
real-length clips on the CMU humanoid, and the share of the time spent simulating vs bookkeeping
(reference preparation and contact fit, metrics, reports, plots).

The clips are real CMU mocap (``../shared/data/bvh/cmu``: 02_01 walk, 01_01 hops), retargeted with
``cmu_bvh_to_cmu_humanoid`` and mapped once (not timed), then cropped into 64 clips of 3 to 12 s at
different offsets (and the whole walk), as a dataset of CMU-length clips. All 64 run as one batch (one
world per clip; a clip that falls stops there and its world is dropped or takes the next clip). The
baseline, measured in the same run, validates a few of the same clips one at a time (one world each), as
a per-clip loop would; the ratio compares clip-seconds per wall-second. Also printed: simulator steps
spent against the clips' full length in steps, the steps spent after a fall (0 with the default early stop),
and the share of ``ok``.

The sampling controller (``controller="sampling"``, docs/tracking.md) is measured apart, on a few clips without
root assistance (``--sampling-clips``, default 1: the whole walk; 2 adds a 3 s hops crop, which falls and is
searched again with its restarts: minutes; 0 skips it): world-steps
of its search per clip-second, wall and CPU seconds per clip-second, and the verdicts, against the PD tracker
on the same clips in the same run. The batched run above keeps ``sampling_fallback`` off unless ``--fallback``
(with ``--no-assist`` every fallen hops crop would be searched: hours on two cores).

    python benchmarks/bench_validate.py [--clips 64] [--baseline-clips 2] [--plots] [--threads 1] [--load N]
        [--sampling-clips 1] [--samples 256] [--suite-motors]

The CMU humanoid carries dm_control's tracking walker's effort limits (``kangengine.data.CMU_HUMANOID_TRACKING_EFFORT``)
unless ``--suite-motors``: the suite file's 20 N m ankles cannot give what a walk needs (docs/verdicts.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from _common import DATA

import kangengine as ke
from kangengine.data import CMU_HUMANOID_TRACKING_EFFORT, data_path

SETTINGS = ke.sim.TrackingSettings(root_assist_frequency_hz=1.0)  # docs/tracking.md: the walk's settings


def _mapped(desc, layout, name):
    bvh = ke.io.load_bvh(DATA / "bvh" / "cmu" / name)
    moved = ke.retarget.retarget_motion(bvh, "cmu_bvh_to_cmu_humanoid", desc).motion
    return ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved, clamp_to_limits=True).motion


def _dataset(walk, hops, count):
    """``count`` clips: the whole walk every eighth clip, else crops of the hops clip (22.9 s) of 3 to 12 s."""
    fps = hops.fps()
    lengths = (3.0, 4.5, 6.0, 8.0, 10.0, 12.0)
    clips = {}
    for i in range(count):
        if i % 8 == 0:
            clips[f"02_01_walk_{i:02d}"] = walk
            continue
        seconds = lengths[i % len(lengths)]
        n = int(seconds * fps)
        start = int((i * 1.37 * fps) % max(hops.num_frames - n, 1))
        clips[f"01_01_hops_{i:02d}_{start}"] = hops[start : start + n]
    return clips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=64)
    ap.add_argument("--baseline-clips", type=int, default=2)
    ap.add_argument("--plots", action="store_true", help="also write the PNG plots")
    ap.add_argument("--threads", type=int, default=1, help="TrackingSettings.threads (default 1)")
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes to run beside the benchmark")
    ap.add_argument("--no-early-stop", action="store_true", help="simulate fallen clips to their end")
    ap.add_argument("--controller", default="pd", choices=[c.value for c in ke.sim.tracking.Controller])
    ap.add_argument("--no-assist", action="store_true", help="no root assistance (the walk's settings use 1 Hz)")
    ap.add_argument("--fallback", action="store_true", help="sampling fallback on in the batched run")
    ap.add_argument("--sampling-clips", type=int, default=1, help="clips of the sampling measurement (0: none)")
    ap.add_argument("--samples", type=int, default=256, help="TrackingSettings.sampling_samples")
    ap.add_argument(
        "--suite-motors",
        action="store_true",
        help="the model file's own effort limits (default: dm_control's tracking walker's, the shipped table; the "
        "suite motors are too weak for a walk, so every clip is at least warn)",
    )
    args = ap.parse_args()
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        run(args)
    finally:
        for p in load:
            p.kill()
            p.wait()


def run(args) -> None:
    settings = dataclasses.replace(
        SETTINGS,
        threads=args.threads,
        early_stop=not args.no_early_stop,
        controller=args.controller,
        root_assist_frequency_hz=0.0 if args.no_assist else SETTINGS.root_assist_frequency_hz,
        sampling_fallback=args.fallback,
    )
    desc = ke.asset.MJCFLoader.load(DATA / "mjcf" / "dm_control" / "humanoid_CMU.xml")
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        efforts = None if args.suite_motors else ke.sim.read_effort_limits(data_path(CMU_HUMANOID_TRACKING_EFFORT))
        model = ke.sim.Model.from_desc(desc, layout, dtype=torch.float32, effort_limit=efforts)
    t0 = time.perf_counter()
    walk = _mapped(desc, layout, "02_01_cgspeed_walk.bvh")
    hops = _mapped(desc, layout, "01_01_cgspeed_hops_long.bvh")
    prep = time.perf_counter() - t0
    clips = _dataset(walk, hops, args.clips)
    seconds = sum(c.duration for c in clips.values())
    print(
        f"threads {settings.threads}, {args.load} busy processes, dt {settings.dt:.4g} s, {len(clips)} clips, "
        f"{seconds:.1f} clip-seconds "
        f"(longest {max(c.duration for c in clips.values()):.1f} s); retarget + map of the sources {prep:.1f} s"
    )

    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        res = ke.pipelines.validate(
            model, clips, out_dir=tmp, settings=settings, plots=args.plots, batch_size=len(clips)
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tm = res.timings
        book = wall - tm["simulation"]
        rate = seconds / wall
        print(
            f"batched:  {wall:.1f} s wall ({cpu:.1f} s CPU: {seconds / cpu:.2f} clip-s per CPU-s), "
            f"{rate:.2f} clip-s per wall-s; simulation {tm['simulation']:.1f} s "
            f"({tm['simulation'] / wall:.0%}), bookkeeping {book:.1f} s ({book / wall:.0%}: setup {tm['setup']:.1f}, "
            f"metrics {tm['metrics']:.1f}, reports {tm['reports']:.1f}, plots {tm['plots']:.1f})"
        )
        counts = res.counts()
        print(f"controller {settings.controller.value}, root assistance {settings.root_assist_frequency_hz:g} Hz")
        print(
            f"verdicts: {counts} ({counts['ok'] / max(len(res.reports), 1):.0%} ok), {wall / len(clips):.2f} s per clip"
        )
        ms = [r.metrics for r in res.reports]
        spent = sum(m["simulator_steps"] for m in ms)
        full = sum(m["steps"] - 1 for m in ms)
        fallen = [m for m in ms if m["fell_at_s"] is not None]
        after = sum(max(m["simulator_steps"] - round(m["fell_at_s"] / m["dt_s"]), 0) for m in fallen)
        print(
            f"simulator steps: {spent:,} of the clips' {full:,} ({spent / max(full, 1):.0%}); "
            f"{len(fallen)} clips fell, {after:,} steps simulated after their falls"
        )

        base_clips = dict(list(clips.items())[1 : 1 + args.baseline_clips])
        base_seconds = sum(c.duration for c in base_clips.values())
        t0 = time.perf_counter()
        ke.pipelines.validate(
            model, base_clips, out_dir=f"{tmp}/base", settings=settings, plots=args.plots, batch_size=1
        )
        base_wall = time.perf_counter() - t0
        base_rate = base_seconds / base_wall
        print(
            f"one clip at a time ({len(base_clips)} clips, {base_seconds:.1f} clip-s): {base_rate:.2f} clip-s per "
            f"wall-s"
        )
    print(f"ratio batched / one at a time: {rate / base_rate:.1f}x")
    if args.sampling_clips > 0:
        sampling(model, walk, hops, args)


def sampling(model, walk, hops, args) -> None:
    """The sampling controller against the PD tracker on the same clips, no root assistance, one at a time."""
    fps = hops.fps()
    clips = {"02_01_walk": walk, "01_01_hops_3s": hops[int(3 * fps) : int(6 * fps)]}
    clips = dict(list(clips.items())[: args.sampling_clips])
    base = ke.sim.TrackingSettings(threads=args.threads)
    for name, clip in clips.items():
        line = []
        for controller in ("pd", "sampling"):
            st = dataclasses.replace(base, controller=controller, sampling_samples=args.samples)
            t0, c0 = time.perf_counter(), time.process_time()
            res = ke.sim.track(model, [clip], settings=st)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            n = int(res.stop_step[0]) + 1
            err = float(res.body_error_mean[0, :n].mean())
            fell = int(res.fell_step[0])
            search = int(res.search_step_count[0]) if res.search_step_count is not None else 0
            line.append((controller, wall, cpu, err, fell, search))
        d = clip.duration
        print(f"sampling, {name} ({d:.2f} s, {args.samples} samples, no root assistance):")
        for controller, wall, cpu, err, fell, search in line:
            print(
                f"  {controller:8s} {wall / d:6.1f} wall-s and {cpu / d:6.1f} CPU-s per clip-second, "
                f"{search / d:8.0f} search world-steps per clip-second, mean body error {err:.3f} m, "
                + (f"fell at {fell * base.dt:.2f} s" if fell >= 0 else "did not fall")
            )
        print(f"  ratio sampling / pd CPU time: {line[1][2] / max(line[0][2], 1e-9):.0f}x")


if __name__ == "__main__":
    main()

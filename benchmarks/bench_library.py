"""MotionLibrary on one CPU thread: microseconds per ``sample`` + ``sample_kinematics`` for 4096 and 65536
environments over a library of >= 1M frames of the 24-body SMPL humanoid skeleton, against a plain
per-field advanced-indexing implementation (the way ProtoMotions' ``get_motion_state`` works: separate
gathers of every field at frame0 and frame1, lerp, and a quaternion slerp) measured in the same run; and
the load time of a 10k-clip library file.

    python benchmarks/bench_library.py [--frames 1048576] [--clips 1024] [--file-clips 10000]

The clips are synthetic (smooth random local rotations and a walking root on the real SMPL skeleton from
``mjcf/protomotions/smpl_humanoid.xml``): timing depends on sizes, not on what the motion looks like.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from _common import DATA, best_of

import kangengine as ke
from kangengine.animation import MotionLibrary, SkeletonMotion, SkeletonTree


def synthetic_clips(tree: SkeletonTree, clips: int, frames: int, seed: int = 0, share: int = 16):
    """``clips`` motions of ``frames`` frames at 30 fps: ``share`` distinct rotation patterns, each clip
    with its own root path (copies/variants, so building 1M frames stays quick)."""
    rng = np.random.default_rng(seed)
    nb = tree.num_nodes
    t = np.arange(frames) / 30.0
    patterns = []
    for _ in range(share):
        amp = rng.uniform(0.1, 0.6, size=(nb, 3))
        freq = rng.uniform(0.3, 2.0, size=(nb, 3))
        phase = rng.uniform(0, 2 * np.pi, size=(nb, 3))
        rv = amp * np.sin(2 * np.pi * freq * t[:, None, None] + phase)
        patterns.append(ke.rotations.quat_from_rotvec(rv).astype(np.float32))
    out = []
    for c in range(clips):
        speed = rng.uniform(0.5, 2.0)
        root = np.stack([speed * t, 0.1 * np.sin(t), 0.9 + 0.02 * np.sin(3 * t)], axis=1).astype(np.float32)
        out.append(
            SkeletonMotion(
                tree,
                root + rng.normal(size=3).astype(np.float32) * [1, 1, 0],
                patterns[c % share],
                30.0,
                skip_checks=True,
            )
        )
    return out


# -- the baseline: per-field advanced indexing, ProtoMotions get_motion_state style --------------------------


def baseline_slerp(q0, q1, t):
    """Quaternion slerp written the classic way (dot, sign flip, acos, sines, guards); WXYZ."""
    cos_half = (q0 * q1).sum(dim=-1, keepdim=True)
    q1 = torch.where(cos_half < 0, -q1, q1)
    cos_half = cos_half.abs()
    half = torch.acos(cos_half.clamp(max=1.0))
    sin_half = torch.sqrt(1.0 - cos_half * cos_half)
    ra = torch.sin((1 - t) * half) / sin_half
    rb = torch.sin(t * half) / sin_half
    q = ra * q0 + rb * q1
    q = torch.where(sin_half.abs() < 1e-3, 0.5 * q0 + 0.5 * q1, q)
    return torch.where(cos_half >= 1, q0, q)


class BaselineLibrary:
    """Separate frame-major tensors per field, gathered one by one."""

    def __init__(self, lib: MotionLibrary):
        b = lib.packed_buffers()
        self.gts = b.global_positions.contiguous()
        self.grs = b.global_rotations_wxyz.contiguous()
        self.lrs = b.local_rotations_wxyz.contiguous()
        self.gvs = b.global_linear_velocities.contiguous()
        self.gavs = b.global_angular_velocities.contiguous()
        self.length_starts = b.clip_frame_start.clone()
        self.num_frames = b.clip_frame_count.clone()
        self.lengths = b.clip_duration.float()
        self.dt = (1.0 / b.clip_fps).float()
        self.disp = b.clip_loop_displacement.float()

    def get_motion_state(self, motion_ids, motion_times):
        length = self.lengths[motion_ids]
        nf = self.num_frames[motion_ids]
        dt = self.dt[motion_ids]
        cycles = torch.floor(motion_times / length)
        t = motion_times - cycles * length
        phase = torch.clip(t / length, 0.0, 1.0)
        f0 = (phase * (nf - 1)).long()
        f1 = torch.min(f0 + 1, nf - 1)
        blend = torch.clip((t - f0 * dt) / dt, 0.0, 1.0)
        f0l = f0 + self.length_starts[motion_ids]
        f1l = f1 + self.length_starts[motion_ids]
        gt0, gt1 = self.gts[f0l], self.gts[f1l]
        gr0, gr1 = self.grs[f0l], self.grs[f1l]
        lr0, lr1 = self.lrs[f0l], self.lrs[f1l]
        gv0, gv1 = self.gvs[f0l], self.gvs[f1l]
        ga0, ga1 = self.gavs[f0l], self.gavs[f1l]
        b = blend[:, None]
        bb = b[:, :, None]
        offset = cycles[:, None] * self.disp[motion_ids]
        body_pos = (1.0 - bb) * gt0 + bb * gt1 + offset[:, None, :]
        body_rot = baseline_slerp(gr0, gr1, bb)
        local_rot = baseline_slerp(lr0, lr1, bb)
        body_vel = (1.0 - bb) * gv0 + bb * gv1
        body_ang = (1.0 - bb) * ga0 + bb * ga1
        return dict(
            root_pos=body_pos[:, 0],
            root_rot=body_rot[:, 0],
            local_rot=local_rot,
            root_vel=body_vel[:, 0],
            root_ang_vel=body_ang[:, 0],
            body_pos=body_pos,
            body_rot=body_rot,
            body_vel=body_vel,
            body_ang_vel=body_ang,
        )


def time_queries(lib: MotionLibrary, base: BaselineLibrary, n: int, gen, repeats: int) -> None:
    """Print best-of-``repeats`` times of ours (reused output rows, no checks; and with new rows and checks) and
    the baseline."""
    ids = lib.sample_motion_ids(n, generator=gen)
    times = lib.sample_times(ids, generator=gen) * 1.5  # a third of the queries loop
    times32 = times.float()
    out = lib.sample(ids, times)
    kout = lib.sample_kinematics(out)

    def ours():
        return lib.sample_kinematics(lib.sample(ids, times, check=False, out=out), out=kout)

    def ours_checked():
        return lib.sample_kinematics(lib.sample(ids, times))

    def baseline():
        return base.get_motion_state(ids, times32)

    ours(), baseline()
    t_ours = best_of(ours, repeats)
    t_checked = best_of(ours_checked, repeats)
    t_sample = best_of(lambda: lib.sample(ids, times, check=False, out=out), repeats)
    t_base = best_of(baseline, max(3, repeats // 4))
    diff = float((ours().body_positions - baseline()["body_pos"]).abs().max())
    print(
        f"  n = {n:6d}: sample + sample_kinematics {t_ours * 1e6:9.0f} us (with host checks and new buffers "
        f"{t_checked * 1e6:.0f} us; sample alone {t_sample * 1e6:.0f} us)"
    )
    print(
        f"             per-field gather baseline  {t_base * 1e6:9.0f} us   ratio {t_base / t_ours:5.1f}x   "
        f"max |body position difference| {diff:.1e} m (float32 time arithmetic in the baseline)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1 << 20, help="total library frames (>= 1M for the target)")
    ap.add_argument("--clips", type=int, default=1024)
    ap.add_argument("--file-clips", type=int, default=10_000)
    ap.add_argument("--file-frames", type=int, default=60, help="frames per clip of the 10k-clip file")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tree = SkeletonTree.from_articulation(ke.asset.MJCFLoader.load(DATA / "mjcf/protomotions/smpl_humanoid.xml"))
    per_clip = args.frames // args.clips
    t0 = time.perf_counter()
    clips = synthetic_clips(tree, args.clips, per_clip)
    lib = MotionLibrary(clips, precompute_kinematics=True)
    t_build = time.perf_counter() - t0
    del clips
    base = BaselineLibrary(lib)
    print(
        f"MotionLibrary: {lib.num_motions} clips, {lib.total_frames:,} frames, {lib.num_bodies} bodies, "
        f"float32, torch {torch.__version__}, 1 CPU thread ({os.cpu_count()} available); built in {t_build:.1f} s"
    )
    gen = torch.Generator().manual_seed(0)
    for n in (4096, 65536):
        time_queries(lib, base, n, gen, args.repeats if n <= 4096 else max(3, args.repeats // 4))
    del base, lib

    # library file: 10k clips
    fclips = synthetic_clips(tree, args.file_clips, args.file_frames, seed=1, share=4)
    t0 = time.perf_counter()
    flib = MotionLibrary(fclips, precompute_kinematics=True)
    t_register = time.perf_counter() - t0
    del fclips
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "library.safetensors")
        t0 = time.perf_counter()
        flib.save(path)
        t_save = time.perf_counter() - t0
        size = os.path.getsize(path)
        del flib
        t0 = time.perf_counter()
        loaded = MotionLibrary.load(path)
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded_copy = MotionLibrary.load(path, mmap=False)
        t_load_copy = time.perf_counter() - t0
        s = loaded.sample(loaded.sample_motion_ids(4096, generator=gen), 0.5)
        loaded.sample_kinematics(s)
        print(
            f"  library file, {loaded.num_motions:,} clips, {loaded.total_frames:,} frames, {size / 1e6:.0f} MB: "
            f"registration {t_register:.1f} s, save {t_save:.2f} s, load (mmap) {t_load * 1e3:.0f} ms, "
            f"load (read into memory) {t_load_copy * 1e3:.0f} ms"
        )
        del loaded, loaded_copy


if __name__ == "__main__":
    main()

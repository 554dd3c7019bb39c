"""MotionLibrary on one CPU thread: ``sample`` + ``sample_kinematics`` with exact slerp (the default) and with nlerp,
for 4096 and 65536 environments, against peers measured in the same run, each printed with its ratio (best of
N; CPU time ``time.process_time`` beside wall time):

* a minimal packed gather: the same packed rows gathered at frame0 and frame1 with advanced indexing and blended
  with one ``torch.lerp`` (no slerp, no renormalisation, fresh outputs): the floor of any gather-based library;
* a re-implementation of ProtoMotions' ``get_motion_state`` (per-field gathers at frame0 and frame1, lerp and
  the classic slerp), always;
* ProtoMotions' own ``MotionLib.get_motion_state`` (``--protomotions DIR``: a checkout of
  github.com/NVlabs/ProtoMotions; its packed fields are filled from our packed buffers, XYZW) and MimicKit's own
  ``MotionLib.calc_motion_frame`` + ``KinCharModel.forward_kinematics`` (``--mimickit DIR``: a checkout of
  github.com/xbpeng/MimicKit; the SMPL humanoid loaded by its MJCF character model). Neither is vendored: the
  code runs from the given directory (ProtoMotions needs ``easydict`` and ``pyyaml`` installed).

Then the load time of a 10k-clip library file.

    python benchmarks/bench_library.py [--clips 100] [--clip-frames 300] [--protomotions DIR] [--mimickit DIR]

The clips are synthetic (smooth random local rotations and a walking root on the real SMPL skeleton from
``mjcf/protomotions/smpl_humanoid.xml``): timing depends on sizes, not on what the motion looks like. The
issue's table uses 100 clips x 300 frames (the default); ``--clips 1024 --clip-frames 1024`` gives a 1M-frame
library.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import DATA

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


def cpu_and_wall(fn, repeats: int) -> tuple[float, float]:
    """Best CPU time (``time.process_time``) and best wall time (s) of ``repeats`` calls of ``fn()``."""
    cpu = wall = float("inf")
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - c), min(wall, time.perf_counter() - w)
    return cpu, wall


class MinimalGather:
    """The minimal packed gather: our two packed row tensors, rows at frame0 and frame1 by advanced indexing,
    one ``torch.lerp`` each (quaternions neither slerped nor renormalised), new outputs every call."""

    def __init__(self, lib: MotionLibrary):
        b = lib.packed_buffers()
        self.frames, self.kin, self.table = b.frames_packed, b.kinematics_packed, lib._clip_table

    def __call__(self, ids, times):
        clip = self.table[ids]
        fps, dur = clip[:, 0], clip[:, 1]
        cycles = torch.floor(times / clip[:, 2])
        pos = (times - cycles * dur) * fps
        f0 = torch.minimum(torch.floor(pos), clip[:, 4])
        w = (pos - f0).float()[:, None]
        g0 = (f0 + clip[:, 3]).long()
        g1 = (torch.minimum(f0 + 1, clip[:, 4]) + clip[:, 3]).long()
        return torch.lerp(self.frames[g0], self.frames[g1], w), torch.lerp(self.kin[g0], self.kin[g1], w)


def _xyzw(q):
    return q[..., [1, 2, 3, 0]].contiguous()


def protomotions_peer(checkout: Path, lib: MotionLibrary):
    """ProtoMotions' own MotionLib (from ``checkout``) holding our packed clips; returns ``fn(ids, times)``."""
    sys.path.insert(0, str(checkout))
    from protomotions.components.motion_lib import MotionLib

    b = lib.packed_buffers()
    pm = MotionLib.empty(device="cpu")
    pm.gts, pm.grs = b.global_positions.contiguous(), _xyzw(b.global_rotations_wxyz)
    pm.gvs, pm.gavs = b.global_linear_velocities.contiguous(), b.global_angular_velocities.contiguous()
    pm.lrs = _xyzw(b.local_rotations_wxyz)
    frames = lib.total_frames
    rotvec = ke.rotations.quat_to_rotvec(b.local_rotations_wxyz[:, 1:].double().numpy())
    pm.dps = torch.as_tensor(rotvec.reshape(frames, -1), dtype=torch.float32)
    pm.dvs = b.global_angular_velocities[:, 1:].reshape(frames, -1).contiguous()
    pm.length_starts, pm.motion_num_frames = b.clip_frame_start.clone(), b.clip_frame_count.clone()
    pm.motion_lengths, pm.motion_dt = b.clip_duration.float(), (1.0 / b.clip_fps).float()
    pm.motion_weights, pm.contacts = b.clip_weight.float(), None
    pm.get_motion_state_use_blend = True
    return lambda ids, times: pm.get_motion_state(ids, times)


def mimickit_peer(checkout: Path, lib: MotionLibrary, char_file: Path):
    """MimicKit's own MotionLib frame blend + its character model's FK (from ``checkout``) on our clips."""
    sys.path.insert(0, str(checkout / "mimickit"))
    import anim.mjcf_char_model as mjcf_char_model
    import anim.motion as mk_motion
    from anim.motion_lib import MotionLib

    char = mjcf_char_model.MJCFCharModel("cpu")
    char.load(str(char_file))
    b = lib.packed_buffers()
    mk = MotionLib.__new__(MotionLib)
    mk._device, mk._kin_char_model = "cpu", char
    mk._motion_num_frames, mk._motion_start_idx = b.clip_frame_count.clone(), b.clip_frame_start.clone()
    mk._motion_lengths = b.clip_duration.float()
    mk._motion_loop_modes = torch.full_like(b.clip_frame_count, mk_motion.LoopMode.WRAP.value)
    mk._motion_wrap_delta = b.clip_loop_displacement.float()
    mk._frame_root_pos = b.root_positions.contiguous()
    mk._frame_root_rot = _xyzw(b.root_rotations_wxyz)
    mk._frame_root_vel = b.root_linear_velocities.contiguous()
    mk._frame_root_ang_vel = b.root_angular_velocities.contiguous()
    mk._frame_joint_rot = _xyzw(b.local_rotations_wxyz[:, 1:])
    mk._frame_dof_vel = b.global_angular_velocities[:, 1:].reshape(lib.total_frames, -1).contiguous()

    def fn(ids, times):
        root_pos, root_rot, _, _, joint_rot, _ = mk.calc_motion_frame(ids, times)
        return char.forward_kinematics(root_pos, root_rot, joint_rot)

    return fn


def time_queries(libs: dict, peers: dict, n: int, gen, repeats: int) -> None:
    """Print best-of-``repeats`` CPU and wall times of ours (each interpolation; reused output rows, no checks) and
    of every peer, with the ratio peer / ours (exact slerp) of CPU times."""
    first = next(iter(libs.values()))
    ids = first.sample_motion_ids(n, generator=gen)
    times = first.sample_times(ids, generator=gen) * 1.5  # a third of the queries loop
    times32 = times.float()
    ours = {}
    for name, lib in libs.items():
        out = lib.sample(ids, times)
        kout = lib.sample_kinematics(out)

        def fn(lib=lib, out=out, kout=kout):
            return lib.sample_kinematics(lib.sample(ids, times, check=False, out=out), out=kout)

        fn()
        ours[name] = cpu_and_wall(fn, repeats)
        t_sample = cpu_and_wall(lambda lib=lib, out=out: lib.sample(ids, times, check=False, out=out), repeats)
        print(
            f"  n = {n:6d}: ours, {name:5s}: sample + sample_kinematics {ours[name][0] * 1e6:8.0f} us CPU "
            f"({ours[name][1] * 1e6:.0f} us wall; sample alone {t_sample[0] * 1e6:.0f} us CPU)"
        )
    ref = ours["slerp"][0]
    for name, fn in peers.items():
        tf = times32 if name != "minimal packed gather" else times
        fn(ids, tf)
        cpu, wall = cpu_and_wall(lambda fn=fn, tf=tf: fn(ids, tf), max(3, repeats // 4))
        print(
            f"             {name:42s} {cpu * 1e6:8.0f} us CPU ({wall * 1e6:.0f} us wall)   "
            f"ratio to ours (slerp) {cpu / ref:5.1f}x"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=100)
    ap.add_argument("--clip-frames", type=int, default=300, help="frames per clip")
    ap.add_argument("--envs", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--file-clips", type=int, default=10_000)
    ap.add_argument("--file-frames", type=int, default=60, help="frames per clip of the 10k-clip file")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--protomotions", type=Path, help="a ProtoMotions checkout: run its own MotionLib")
    ap.add_argument("--mimickit", type=Path, help="a MimicKit checkout: run its own MotionLib and FK")
    args = ap.parse_args()
    torch.set_num_threads(1)
    char_file = DATA / "mjcf/protomotions/smpl_humanoid.xml"
    tree = SkeletonTree.from_articulation(ke.asset.MJCFLoader.load(char_file))
    t0 = time.perf_counter()
    clips = synthetic_clips(tree, args.clips, args.clip_frames)
    libs = {k: MotionLibrary(clips, precompute_kinematics=True, interpolation=k) for k in ("slerp", "nlerp")}
    t_build = time.perf_counter() - t0
    del clips
    lib = libs["slerp"]
    peers = {
        "minimal packed gather": MinimalGather(lib),
        "ProtoMotions-style re-implementation": BaselineLibrary(lib).get_motion_state,
    }
    if args.protomotions is not None:
        peers["ProtoMotions MotionLib.get_motion_state"] = protomotions_peer(args.protomotions, lib)
    if args.mimickit is not None:
        peers["MimicKit calc_motion_frame + FK"] = mimickit_peer(args.mimickit, lib, char_file)
    print(
        f"MotionLibrary: {lib.num_motions} clips, {lib.total_frames:,} frames, {lib.num_bodies} bodies, "
        f"float32, torch {torch.__version__}, 1 CPU thread ({os.cpu_count()} available); built in {t_build:.1f} s"
    )
    gen = torch.Generator().manual_seed(0)
    for n in args.envs:
        time_queries(libs, peers, n, gen, args.repeats if n <= 4096 else max(3, args.repeats // 4))
    del peers, libs, lib

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

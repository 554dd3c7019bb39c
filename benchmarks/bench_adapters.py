"""Simulator adapters: vectorised packing against the per-frame loop a user would write with MuJoCo's
own quaternion functions, and pack_sample for 4096 environments (torch, CPU, 1 thread).

Run: python benchmarks/bench_adapters.py
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch
from _common import DATA, best_of

import kangengine as ke
from kangengine import rotations as R
from kangengine.adapters.mujoco import MuJoCoMotionAdapter
from kangengine.adapters.newton import NewtonMotionAdapter
from kangengine.adapters.physx import PhysXMotionAdapter
from kangengine.asset import JointType


def random_motion(layout, frames, rng):
    q = np.zeros((frames, layout.nq))
    for b in layout.blocks:
        o = b.q_offset
        if b.joint_type is JointType.FREE:
            q[:, o : o + 3] = rng.normal(size=(frames, 3))
            q[:, o + 3 : o + 7] = R.quat_normalize(rng.normal(size=(frames, 4)))
        elif b.joint_type is JointType.BALL:
            q[:, o : o + 4] = R.quat_normalize(rng.normal(size=(frames, 4)))
        elif b.q_dim == 1:
            q[:, o] = rng.uniform(-1, 1, size=frames)
    qd = rng.normal(size=(frames, layout.nv))
    return ke.animation.ArticulationMotion(q, qd, 30.0, layout.model_signature)


def mujoco_loop(motion):
    """Per frame: the root's world angular velocity into its local frame with mju_rotVecQuat."""
    qpos = motion.q.astype(np.float64).copy()
    qvel = motion.qd.astype(np.float64).copy()
    neg = np.zeros(4)
    out = np.zeros(3)
    for f in range(qpos.shape[0]):
        mujoco.mju_negQuat(neg, qpos[f, 3:7])
        mujoco.mju_rotVecQuat(out, qvel[f, 3:6], neg)
        qvel[f, 3:6] = out
    return qpos, qvel


def main():
    torch.set_num_threads(1)
    path = DATA / "mjcf" / "protomotions" / "smpl_humanoid.xml"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.MJCFLoader.load(path))
    motion = random_motion(layout, 20000, np.random.default_rng(0))
    mj = MuJoCoMotionAdapter(layout)
    t_vec = best_of(lambda: mj.pack(motion))
    t_loop = best_of(lambda: mujoco_loop(motion), repeats=1)
    frames = motion.num_frames
    print(
        f"MuJoCo pack, SMPL humanoid, {frames} frames: {frames / t_vec:,.0f} frames/s; per-frame mju loop "
        f"{frames / t_loop:,.0f} frames/s; ratio {t_loop / t_vec:.1f}x"
    )
    for name, adapter in (("Newton", NewtonMotionAdapter(layout)), ("PhysX", PhysXMotionAdapter(layout))):
        t = best_of(lambda a=adapter: a.pack(motion))
        print(f"{name} pack, SMPL humanoid: {frames / t:,.0f} frames/s")
    n = 4096
    for name, adapter in (
        ("MuJoCo", mj),
        ("Newton", NewtonMotionAdapter(layout)),
        ("PhysX", PhysXMotionAdapter(layout)),
    ):
        arrays = adapter.prepare_motion(motion)
        idx0 = torch.randint(0, frames - 1, (n,))
        f0 = {k: torch.as_tensor(v)[idx0] for k, v in arrays.items()}
        f1 = {k: torch.as_tensor(v)[idx0 + 1] for k, v in arrays.items()}
        blend = torch.rand(n)
        offset = torch.zeros(n, 3)
        t = best_of(lambda a=adapter, f0=f0, f1=f1, b=blend, o=offset: a.pack_sample(f0, f1, b, root_offset=o), 5)
        print(f"{name} pack_sample, {n} envs, 1 thread: {t * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

"""Simulator adapters: ``pack`` against the plain numpy a user would write for the same columns (a gather,
the quaternion reorder, the root-velocity change of frame) and against a per-frame loop with MuJoCo's own
quaternion functions; ``pack_sample`` for 4096 environments (torch, CPU, 1 thread).

Each line prints frames/s of both, measured in the same run, best of N, with CPU time (``process_time``)
beside wall time, and their ratio (adapter / peer; >= 1 means the adapter is at least as fast).

Run: python benchmarks/bench_adapters.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import time

import mujoco
import numpy as np
import torch
from _common import DATA

import kangengine as ke
from kangengine import rotations as R
from kangengine.adapters import _common as C
from kangengine.adapters.mujoco import MuJoCoMotionAdapter
from kangengine.adapters.newton import NewtonMotionAdapter
from kangengine.adapters.physx import PhysXMotionAdapter
from kangengine.asset import JointType


def timed(fn, repeats=7):
    """Best wall and best CPU seconds of ``repeats`` calls."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w)
        cpu = min(cpu, time.process_time() - c)
    return wall, cpu


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


def _rotate_inverse(quat, v):
    """Plain numpy ``R(quat)^T v`` for WXYZ ``quat [n, 4]``, ``v [n, 3]``."""
    u = -quat[:, 1:]
    t = 2.0 * np.cross(u, v)
    return v + quat[:, :1] * t + np.cross(u, t)


def numpy_mujoco(q, qd, q_index, qd_index):
    """The peer: gather MuJoCo's columns, the free root's world angular velocity into its local frame."""
    qpos = q[:, q_index]
    qvel = qd[:, qd_index]
    qvel[:, 3:6] = _rotate_inverse(qpos[:, 3:7], qvel[:, 3:6])
    return qpos, qvel


def numpy_newton(q, qd, q_index, qd_index, com):
    """The peer: gather Newton's columns (``q_index`` also puts the root quaternion in XYZW order), the root
    velocity to its COM."""
    jq = q[:, q_index]
    jqd = qd[:, qd_index]
    u = q[:, 4:7]
    t = 2.0 * np.cross(u, com)
    com_world = com + q[:, 3:4] * t + np.cross(u, t)
    jqd[:, :3] += np.cross(jqd[:, 3:6], com_world)
    return jq, jqd


def numpy_physx_hinges(q, qd, dof_q, dof_v, ref, com):
    """The peer for a model of single hinges: DOF columns gathered minus ref, the root quaternion to XYZW, the
    root velocity to its COM."""
    jp = q[:, dof_q] - ref
    jv = qd[:, dof_v]
    root_xyzw = q[:, [4, 5, 6, 3]]
    u = q[:, 4:7]
    t = 2.0 * np.cross(u, com)
    com_world = com + q[:, 3:4] * t + np.cross(u, t)
    v_com = qd[:, :3] + np.cross(qd[:, 3:6], com_world)
    return jp, jv, v_com, root_xyzw, q[:, :3], qd[:, 3:6]


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


def line(name, frames, ours, peer, peer_name):
    (w, c), (pw, pc) = ours, peer
    print(
        f"{name}: {frames / w:,.0f} frames/s (cpu {frames / c:,.0f}); {peer_name} {frames / pw:,.0f} frames/s "
        f"(cpu {frames / pc:,.0f}); ratio {pw / w:.2f}x wall, {pc / c:.2f}x cpu"
    )


def main():
    torch.set_num_threads(1)
    path = DATA / "mjcf" / "protomotions" / "smpl_humanoid.xml"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.MJCFLoader.load(path))
    motion = random_motion(layout, 20000, np.random.default_rng(0))
    frames = motion.num_frames
    q, qd = motion.q, motion.qd
    print(f"SMPL humanoid, {frames} frames, float32, nq {layout.nq}, nv {layout.nv}, one thread")

    mj = MuJoCoMotionAdapter(layout)
    cmap = C.column_map(layout, C.dfs_block_order(layout))
    ref = numpy_mujoco(q, qd, cmap.q_index, cmap.qd_index)
    buf = mj.pack(motion)
    assert np.allclose(buf.qpos, ref[0]) and np.allclose(buf.qvel, ref[1], atol=1e-5)
    ours = timed(lambda: mj.pack(motion))
    line("MuJoCo pack", frames, ours, timed(lambda: numpy_mujoco(q, qd, cmap.q_index, cmap.qd_index)), "numpy gather")
    line("MuJoCo pack", frames, ours, timed(lambda: mujoco_loop(motion), 1), "per-frame mju loop")

    nw = NewtonMotionAdapter(layout)
    ncmap = nw._map
    com = layout.body_coms[0].astype(np.float32)
    ref = numpy_newton(q, qd, ncmap.q_index, ncmap.qd_index, com)
    buf = nw.pack(motion)
    assert np.allclose(buf.joint_q, ref[0], atol=1e-6) and np.allclose(buf.joint_qd, ref[1], atol=1e-5)
    line(
        "Newton pack",
        frames,
        timed(lambda: nw.pack(motion)),
        timed(lambda: numpy_newton(q, qd, ncmap.q_index, ncmap.qd_index, com)),
        "numpy gather",
    )

    px = PhysXMotionAdapter(layout)
    w, c = timed(lambda: px.pack(motion), 3)
    print(f"PhysX pack (hinge triplets to rotation vectors): {frames / w:,.0f} frames/s (cpu {frames / c:,.0f})")

    # PhysX on the G1 (single hinges: the DOF state is a gather, so the numpy peer does the same work)
    g1 = ke.animation.ArticulationCoordinateLayout.from_data(
        data=ke.asset.MJCFLoader.load(DATA / "mjcf" / "unitree" / "g1_29dof.nomesh.xml")
    )
    gm = random_motion(g1, 20000, np.random.default_rng(1))
    pg = PhysXMotionAdapter(g1)
    dof_q = np.array([g1.block(n).q_offset for n in pg.dof_names])
    dof_v = np.array([g1.block(n).qd_offset for n in pg.dof_names])
    ref = np.array([g1.block(n).ref for n in pg.dof_names], dtype=np.float32)
    g1_com = g1.body_coms[0].astype(np.float32)
    peer = lambda: numpy_physx_hinges(gm.q, gm.qd, dof_q, dof_v, ref, g1_com)  # noqa: E731
    got, want = pg.pack(gm), peer()
    assert np.allclose(got.joint_positions, want[0]) and np.allclose(got.root_linear_velocities, want[2], atol=1e-5)
    line(
        f"PhysX pack, G1 ({gm.num_frames} frames)",
        gm.num_frames,
        timed(lambda: pg.pack(gm)),
        timed(peer),
        "numpy gather",
    )

    n = 4096
    for name, adapter in (("MuJoCo", mj), ("Newton", nw), ("PhysX", px)):
        arrays = adapter.prepare_motion(motion)
        idx0 = torch.randint(0, frames - 1, (n,))
        f0 = {k: torch.as_tensor(v)[idx0] for k, v in arrays.items()}
        f1 = {k: torch.as_tensor(v)[idx0 + 1] for k, v in arrays.items()}
        blend = torch.rand(n)
        offset = torch.zeros(n, 3)
        w, c = timed(lambda a=adapter, f0=f0, f1=f1, b=blend, o=offset: a.pack_sample(f0, f1, b, root_offset=o), 5)
        print(f"{name} pack_sample, {n} envs, 1 thread: {w * 1e3:.2f} ms (cpu {c * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()

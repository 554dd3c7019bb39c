"""Export an articulation motion (``kangengine convert``'s ``.npz``) to the files other tools train on.

:func:`export_motion` writes one file per call, atomically (temporary file, then rename). Every format is
written from the same two things: the motion's ``q [frames, nq]`` / ``qd [frames, nv]`` (MuJoCo ``qpos`` /
``qvel`` order through :class:`~kangengine.adapters.MuJoCoMotionAdapter`) and the bodies' world poses from
:func:`~kangengine.animation.forward_kinematics`, in the layout's body order (the loader's DFS order: MuJoCo's
body order for a model compiled from the same MJCF, world body left out).

Formats (:class:`ExportFormat`; units SI everywhere: m, rad, s, world frame Z up):

``bvh``
    The robot's skeleton (one joint per body, offsets from the rest pose) following the motion
    (:meth:`~kangengine.animation.ArticulationMotionMapper.to_skeleton_motion` then
    :func:`kangengine.io.save_bvh`): Y up, centimetres, ``ZYX`` Euler channels in degrees, ``Frame Time`` =
    1 / fps. Blender and bvhio read it; the joint positions equal forward kinematics (tests: < 1 mm).
``mjlab``
    The mjlab / BeyondMimic (whole_body_tracking) motion ``.npz`` as written by mjlab's
    ``src/mjlab/scripts/csv_to_npz.py`` and read by ``MotionLoader`` in
    ``src/mjlab/tasks/tracking/mdp/commands.py`` (github.com/mujocolab/mjlab): ``fps [1] float64``;
    ``joint_pos [frames, nq - 7]`` and ``joint_vel [frames, nv - 6]`` (MuJoCo ``qpos[7:]`` / ``qvel[6:]``: the
    robot's joints without the free root, rad, rad/s); ``body_pos_w [frames, bodies, 3]`` (m, world);
    ``body_quat_w [frames, bodies, 4]`` **WXYZ** (MuJoCo's order; mjlab writes it straight into ``qpos``);
    ``body_lin_vel_w`` / ``body_ang_vel_w [frames, bodies, 3]`` (m/s and rad/s, world frame, velocity of the
    body origin: mjlab's ``body_link_*_w``). Extra keys ``joint_names``, ``body_names`` (mjlab ignores them).
``gmr_csv``
    GMR's csv (``scripts/batch_gmr_pkl_to_csv.py`` in github.com/YanjieZe/GMR, the input of BeyondMimic's
    ``csv_to_npz.py``): no header, ``,``-separated, one row per frame: root position x y z (m, world), root
    quaternion **XYZW** (GMR's ``root_rot`` order; the readers reorder to WXYZ), then the joint positions in
    MuJoCo ``qpos[7:]`` order (rad). The frame rate is not stored: give it to the reader (``--input_fps``).
    Needs a free root and hinge/slide joints only.
``protomotions``
    A ProtoMotions ``.motion`` file (``MotionLib._load_motions`` in ``protomotions/components/motion_lib.py``,
    github.com/NVlabs/ProtoMotions: ``torch.load`` then ``RobotState.from_dict``): a ``torch.save`` of a dict
    of plain tensors only (loadable with ``torch.load(weights_only=True)``; no pickled classes):
    ``rigid_body_pos [frames, bodies, 3]`` (m, world), ``rigid_body_rot [frames, bodies, 4]`` **XYZW** (its
    common order), ``rigid_body_vel`` / ``rigid_body_ang_vel [frames, bodies, 3]`` (world, body origin),
    ``dof_pos [frames, dofs]`` (hinge angles; a ball joint as its exponential map, 3 values) and
    ``dof_vel [frames, dofs]`` (rad/s; ball joints: angular velocity in the parent frame), ``fps`` (float).
    Bodies and DOFs in the layout's order, which is ProtoMotions' common order for the same MJCF.

Body velocities are central differences of the forward kinematics over frames (one-sided at the ends):
linear ``(p[i+1] - p[i-1]) / 2dt``, angular ``log(q[i+1] q[i-1]^-1) / 2dt`` in world, as mjlab computes the
root's and as :class:`~kangengine.animation.MotionLibrary` does.
"""

from __future__ import annotations

import argparse
import enum
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._files import atomic_write
from ..errors import FormatError, KangEngineError, LayoutMismatch, MotionError

__all__ = [
    "ExportFormat",
    "ExportResult",
    "RobotMotion",
    "load_robot_motion",
    "export_motion",
    "body_velocities_world",
    "add_arguments",
    "run",
]


class ExportFormat(str, enum.Enum):
    """The formats of :func:`export_motion` (see the module docstring for each one's content)."""

    BVH = "bvh"
    MJLAB = "mjlab"
    GMR_CSV = "gmr_csv"
    PROTOMOTIONS = "protomotions"


#: file extension written for each format when ``out`` is a folder
EXTENSIONS = {
    ExportFormat.BVH: ".bvh",
    ExportFormat.MJLAB: ".npz",
    ExportFormat.GMR_CSV: ".csv",
    ExportFormat.PROTOMOTIONS: ".motion",
}


@dataclass(frozen=True)
class RobotMotion:
    """An articulation motion with the model it was made for.

    Attributes:
        desc: the :class:`~kangengine.asset.ArticulationDesc` of the model file.
        layout: its :class:`~kangengine.animation.ArticulationCoordinateLayout` (the one the motion matches).
        motion: the :class:`~kangengine.animation.ArticulationMotion` (``q [frames, nq]``,
            ``qd [frames, nv]`` float32).
        model_path: the model file.
    """

    desc: object
    layout: object
    motion: object
    model_path: str


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_motion` wrote.

    Attributes:
        path: the written file. format: its :class:`ExportFormat`.
        frames: frames written; fps: their rate (1/s). bodies: bodies written (``0`` for ``gmr_csv``).
    """

    path: str
    format: ExportFormat
    frames: int
    fps: float
    bodies: int


def load_robot_motion(motion, model, *, order: str = "DFS") -> RobotMotion:
    """The motion (an articulation ``.npz`` or an :class:`~kangengine.animation.ArticulationMotion`) and the
    model it was made for (MJCF / URDF / bot file), with the layout that matches it.

    The layout is built with a free root, or a fixed one when only that matches the motion's ``nq``/``nv``.

    Raises:
        FileMissingError, FormatError: unreadable files. LayoutMismatch: the motion fits neither layout of
            ``model`` (it was made for another model).
    """
    from ..animation import ArticulationCoordinateLayout, ArticulationMotion, load_articulation_motion_npz
    from ..asset import load

    model_path = os.fspath(model)
    desc = load(model_path, order=order)
    layouts = [ArticulationCoordinateLayout.from_data(data=desc, free_root=fr) for fr in (True, False)]
    if isinstance(motion, ArticulationMotion):
        for lay in layouts:
            if (motion.nq, motion.nv) == (lay.nq, lay.nv):
                motion.check_layout(lay, what="motion")
                return RobotMotion(desc, lay, motion, model_path)
        raise LayoutMismatch(
            f"motion has nq={motion.nq}, nv={motion.nv}; the model's layouts have nq/nv "
            f"{[(x.nq, x.nv) for x in layouts]}",
            path=model_path,
        )
    errors = []
    for lay in layouts:
        try:
            return RobotMotion(desc, lay, load_articulation_motion_npz(motion, lay), model_path)
        except LayoutMismatch as exc:
            errors.append(str(exc))
    raise LayoutMismatch(f"made for another model than {model_path}: {errors[0]}", path=motion)


def body_velocities_world(body_pos_world, body_quat_wxyz, fps: float):
    """World linear and angular velocities of bodies from their sampled poses.

    Args:
        body_pos_world: ``[frames, bodies, 3]`` float, m, world. body_quat_wxyz: ``[frames, bodies, 4]`` WXYZ.
        fps: frames per second.
    Returns:
        ``(lin_vel_world [frames, bodies, 3] m/s, ang_vel_world [frames, bodies, 3] rad/s)``, same dtype:
        central differences inside, one-sided at the first and last frame, zeros for one frame.
    """
    from .. import rotations as R

    p = np.asarray(body_pos_world)
    q = np.asarray(body_quat_wxyz)
    n = p.shape[0]
    lin = np.zeros_like(p)
    ang = np.zeros_like(p)
    if n < 2:
        return lin, ang
    dt = 1.0 / float(fps)
    lin[...] = np.gradient(p, dt, axis=0)
    nxt = np.concatenate([q[1:], q[-1:]], axis=0)
    prv = np.concatenate([q[:1], q[:-1]], axis=0)
    span = np.full((n, 1, 1), 2.0 * dt, dtype=p.dtype)
    span[0] = span[-1] = dt
    ang[...] = R.quat_to_rotvec(R.quat_multiply(nxt, R.quat_conjugate(prv))) / span
    return lin, ang


def _body_states(rm: RobotMotion):
    from .. import rotations as R
    from ..animation import forward_kinematics

    q = rm.motion.q.astype(np.float64)
    pos, quat = forward_kinematics(rm.layout, q)
    quat = R.quat_standardize(quat)  # w >= 0, then continuous along frames for the differences
    flip = np.sum(quat[1:] * quat[:-1], axis=-1) < 0
    sign = np.concatenate([np.ones((1, quat.shape[1])), np.cumprod(np.where(flip, -1.0, 1.0), axis=0)])
    quat = quat * sign[..., None]
    lin, ang = body_velocities_world(pos, quat, rm.motion.fps())
    return pos, quat, lin, ang


def _mujoco_state(rm: RobotMotion):
    from ..adapters.mujoco import MuJoCoMotionAdapter

    buf = MuJoCoMotionAdapter(rm.layout).pack(rm.motion)
    return np.asarray(buf.qpos, dtype=np.float64), np.asarray(buf.qvel, dtype=np.float64)


def _root_columns(rm: RobotMotion) -> tuple[int, int]:
    from ..asset.desc import JointType

    blocks = rm.layout.blocks
    free = bool(blocks) and blocks[0].joint_type is JointType.FREE
    return (7, 6) if free else (0, 0)


def _write_bvh(rm: RobotMotion, out: Path) -> int:
    from ..animation import ArticulationMotionMapper
    from ..io import save_bvh

    skel = ArticulationMotionMapper(rm.layout).to_skeleton_motion(rm.motion)
    save_bvh(out, skel, rotation_order="ZYX", up_axis="y", units="cm")
    return rm.layout.num_bodies


def _write_mjlab(rm: RobotMotion, out: Path) -> int:
    pos, quat, lin, ang = _body_states(rm)
    qpos, qvel = _mujoco_state(rm)
    cq, cv = _root_columns(rm)
    from ..adapters.mujoco import MuJoCoMotionAdapter

    joint_names = [n for n in MuJoCoMotionAdapter(rm.layout).joint_names][1 if cq else 0 :]
    arrays = {
        "fps": np.array([rm.motion.fps()], dtype=np.float64),
        "joint_pos": qpos[:, cq:].astype(np.float32),
        "joint_vel": qvel[:, cv:].astype(np.float32),
        "body_pos_w": pos.astype(np.float32),
        "body_quat_w": quat.astype(np.float32),
        "body_lin_vel_w": lin.astype(np.float32),
        "body_ang_vel_w": ang.astype(np.float32),
        "joint_names": np.array(joint_names, dtype=np.str_),
        "body_names": np.array(rm.layout.body_names, dtype=np.str_),
    }
    atomic_write(out, lambda f: np.savez(f, **arrays), suffix=".npz")
    return pos.shape[1]


def _write_gmr_csv(rm: RobotMotion, out: Path) -> int:
    from .. import rotations as R
    from ..asset.desc import JointType

    blocks = rm.layout.blocks
    if not blocks or blocks[0].joint_type is not JointType.FREE:
        raise MotionError("GMR's csv needs a free root (x y z, quaternion, joints)", item="format=gmr_csv")
    balls = [b.joint_name for b in blocks[1:] if b.joint_type is JointType.BALL]
    if balls:
        raise MotionError(
            f"GMR's csv holds one value per joint; ball joints {balls[:5]} do not fit", item="format=gmr_csv"
        )
    qpos, _ = _mujoco_state(rm)
    rows = np.concatenate([qpos[:, :3], R.quat_wxyz_to_xyzw(qpos[:, 3:7]), qpos[:, 7:]], axis=1)
    buf = io.StringIO()
    np.savetxt(buf, rows, delimiter=",", fmt="%.9g")
    data = buf.getvalue().encode()
    atomic_write(out, lambda f: f.write(data))
    return 0


def _dof_arrays(rm: RobotMotion):
    """ProtoMotions ``dof_pos`` / ``dof_vel``: every non-root joint, hinges as angles and ball joints as
    exponential maps, in the layout's order."""
    from .. import rotations as R
    from ..asset.desc import JointType

    q, qd = rm.motion.q, rm.motion.qd
    pos_cols, vel_cols = [], []
    for b in rm.layout.blocks:
        if b.joint_type is JointType.FREE:
            continue
        if b.joint_type is JointType.BALL:
            pos_cols.append(R.quat_to_rotvec(q[:, b.q_offset : b.q_offset + 4].astype(np.float64)))
        else:
            pos_cols.append(q[:, b.q_offset : b.q_offset + b.q_dim].astype(np.float64))
        vel_cols.append(qd[:, b.qd_offset : b.qd_offset + b.qd_dim].astype(np.float64))
    n = q.shape[0]
    dof_pos = np.concatenate(pos_cols, axis=1) if pos_cols else np.zeros((n, 0))
    dof_vel = np.concatenate(vel_cols, axis=1) if vel_cols else np.zeros((n, 0))
    return dof_pos, dof_vel


def _write_protomotions(rm: RobotMotion, out: Path) -> int:
    import torch

    from .. import rotations as R

    pos, quat, lin, ang = _body_states(rm)
    dof_pos, dof_vel = _dof_arrays(rm)

    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    data = {
        "rigid_body_pos": t(pos),
        "rigid_body_rot": t(R.quat_wxyz_to_xyzw(quat)),
        "rigid_body_vel": t(lin),
        "rigid_body_ang_vel": t(ang),
        "dof_pos": t(dof_pos),
        "dof_vel": t(dof_vel),
        "fps": float(rm.motion.fps()),
    }
    atomic_write(out, lambda f: torch.save(data, f), suffix=".motion")
    return pos.shape[1]


_WRITERS = {
    ExportFormat.BVH: _write_bvh,
    ExportFormat.MJLAB: _write_mjlab,
    ExportFormat.GMR_CSV: _write_gmr_csv,
    ExportFormat.PROTOMOTIONS: _write_protomotions,
}


def _format(value) -> ExportFormat:
    try:
        return ExportFormat(getattr(value, "value", value))
    except ValueError:
        names = ", ".join(f.value for f in ExportFormat)
        raise FormatError(f"unknown export format {value!r}; formats are: {names}", item="format") from None


def export_motion(motion_npz, model, out, *, format: ExportFormat | str, order: str = "DFS") -> ExportResult:
    """Write an articulation motion in another tool's format (atomically).

    Args:
        motion_npz: an articulation motion ``.npz`` (``kangengine convert``) or an
            :class:`~kangengine.animation.ArticulationMotion`.
        model: the model file it was made for (MJCF, URDF, bot).
        out: the output file, or an existing folder (the motion's stem plus the format's extension:
            :data:`EXTENSIONS`).
        format: :class:`ExportFormat` or its value (``"bvh"``, ``"mjlab"``, ``"gmr_csv"``, ``"protomotions"``).
        order: body order of the model (``"DFS"``, MuJoCo's, or ``"BFS"``).
    Returns:
        :class:`ExportResult`.
    Raises:
        FormatError: unknown format. LayoutMismatch: the motion was made for another model. MotionError: the
            format cannot hold this robot (``gmr_csv`` without a free root or with ball joints; ``bvh`` with
            slide joints).
    """
    fmt = _format(format)
    rm = load_robot_motion(motion_npz, model, order=order)
    out = Path(out)
    if out.is_dir():
        stem = Path(os.fspath(motion_npz)).stem if isinstance(motion_npz, (str, os.PathLike)) else "motion"
        out = out / f"{stem}{EXTENSIONS[fmt]}"
    bodies = _WRITERS[fmt](rm, out)
    return ExportResult(os.fspath(out), fmt, rm.motion.num_frames, rm.motion.fps(), bodies)


# -- command line (wired by kangengine.cli as `kangengine export`) -------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kangengine export`` arguments: ``MOTION MODEL --out FILE --format F [--order DFS|BFS]``."""
    parser.add_argument("motion", help="articulation motion .npz (from `kangengine convert`)")
    parser.add_argument("model", help="the model file the motion was made for (MJCF, URDF)")
    parser.add_argument("--out", required=True, help="output file, or a folder (stem + the format's extension)")
    parser.add_argument(
        "--format", required=True, choices=[f.value for f in ExportFormat], help="bvh, mjlab, gmr_csv, protomotions"
    )
    parser.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order of the model")


def run(args: argparse.Namespace) -> int:
    """Run ``kangengine export`` from parsed :func:`add_arguments`; prints the written file. Returns 0, or 1
    with a one-line message on a KangEngine error."""
    try:
        res = export_motion(args.motion, args.model, args.out, format=args.format, order=args.order)
    except KangEngineError as exc:
        print(f"kangengine export: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{res.format.value}: {res.path} ({res.frames} frames at {res.fps:g} fps)")
    return 0

"""MuJoCo adapter: canonical ``ArticulationMotion`` <-> MuJoCo ``qpos``/``qvel``.

Conventions (each checked against MuJoCo in ``tests/test_adapters_mujoco.py``):

============================  ===========================================  ==========================================
quantity                      canonical (KangEngine)                       MuJoCo
============================  ===========================================  ==========================================
quaternions                   WXYZ                                         WXYZ (same)
free root position            root body origin in world                    same
free root linear velocity     root body origin, world frame                same
free root angular velocity    world frame                                  body (local) frame
ball angular velocity         parent joint frame                           child body frame
hinge / slide                 MuJoCo ``qpos`` (``ref`` at the model pose)  same
DOF order                     the layout's body order (DFS or BFS)         XML pre-order (depth first)
============================  ===========================================  ==========================================

So ``qpos`` is the canonical ``q`` (permuted into MuJoCo's order for a BFS layout) and only the angular
velocities of free and ball joints change frame: ``w_local = R_joint^T w`` where ``R_joint`` is the joint's
rotation followed by any later rotating joints of the same body (MuJoCo's ball and free angular DOFs point
along the final body axes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rotations as R
from ..asset.desc import JointType
from ..errors import LayoutMismatch
from . import _common as C

__all__ = ["MuJoCoMotionAdapter", "MuJoCoBuffers", "MuJoCoModelMatch"]

_MJ_TYPE = {0: JointType.FREE, 1: JointType.BALL, 2: JointType.SLIDE, 3: JointType.HINGE}


@dataclass(frozen=True)
class MuJoCoBuffers:
    """MuJoCo-native state.

    Attributes:
        qpos: ``[frames, nq]`` (``pack``: numpy, float32 like the motion or float64 when given float64;
            ``pack_sample``: torch ``[n, nq]`` on the library's device): ``MjData.qpos`` rows.
        qvel: ``[frames, nv]``: ``MjData.qvel`` rows (free/ball angular velocities in the body frame).
    """

    qpos: object
    qvel: object


@dataclass(frozen=True)
class MuJoCoModelMatch:
    """What :meth:`MuJoCoMotionAdapter.validate_model` found (the model matched).

    Attributes:
        joint_names: the model's joints in its order (the layout's names; the free joint as in the layout).
        qpos_index: ``[nq] int64``: ``qpos[:, k] == q[:, qpos_index[k]]``.
        qvel_index: ``[nv] int64``: ``qvel[:, k]`` comes from ``qd[:, qvel_index[k]]``.
    """

    joint_names: tuple[str, ...]
    qpos_index: np.ndarray
    qvel_index: np.ndarray


class MuJoCoMotionAdapter:
    """Pack canonical motion into MuJoCo ``qpos``/``qvel`` and back.

    Args:
        layout: the :class:`~kangengine.animation.ArticulationCoordinateLayout` motions are made for.
        model: optional ``mujoco.MjModel``: when given, the joint order is taken from it (by joint name)
            and the model is checked with :meth:`validate_model`. Without it the order is the layout's
            depth-first pre-order, which is MuJoCo's order for a model compiled from the same MJCF.
    """

    def __init__(self, layout, *, model=None):
        self.layout = layout
        order = C.dfs_block_order(layout) if model is None else _order_from_model(layout, model)
        self._map = C.column_map(layout, order)
        self._rot_blocks = [i for i, b in enumerate(layout.blocks) if b.joint_type in C.ROTATING]
        self._quat_cols = C.quaternion_columns(
            layout, self._map, offset_in_block={JointType.FREE: 3, JointType.BALL: 0}
        )
        self._identity = (_is_arange(self._map.q_index), _is_arange(self._map.qd_index))
        # native qvel columns of each free/ball angular velocity, in the order of _quat_cols; the fast path
        # holds when no rotating block has later rotating joints on its body (their rotation would compose)
        w_cols = []
        fast = True
        for i in self._map.block_order:
            b = layout.blocks[i]
            if b.joint_type in C.ROTATING:
                off = b.qd_offset + (3 if b.joint_type is JointType.FREE else 0)
                w_cols.append([int(self._map.qd_inverse[off + k]) for k in range(3)])
                later = [x for x in layout.blocks[i + 1 :] if x.body_index == b.body_index]
                fast &= not any(x.joint_type in (JointType.HINGE, JointType.BALL) for x in later)
        self._w_native_cols = np.array(w_cols, dtype=np.int64).reshape(-1, 3)
        self._fast_rotation = fast
        root = layout.blocks[0] if layout.blocks and layout.blocks[0].joint_type is JointType.FREE else None
        self._root_pos_cols = (
            None
            if root is None
            else np.array([int(self._map.q_inverse[root.q_offset + k]) for k in range(3)], dtype=np.int64)
        )
        if model is not None:
            self.validate_model(model)

    # -- properties -----------------------------------------------------------------------------
    @property
    def joint_names(self) -> tuple[str, ...]:
        """Joint (block) names in MuJoCo order."""
        return tuple(self.layout.blocks[i].joint_name for i in self._map.block_order)

    @property
    def qpos_index(self) -> np.ndarray:
        """``[nq]``: ``qpos[:, k] == q[:, qpos_index[k]]``."""
        return self._map.q_index

    @property
    def qvel_index(self) -> np.ndarray:
        """``[nv]``: ``qvel[:, k]`` comes from ``qd[:, qvel_index[k]]`` (after the frame change)."""
        return self._map.qd_index

    # -- conversion -----------------------------------------------------------------------------
    def pack(self, motion) -> MuJoCoBuffers:
        """``ArticulationMotion`` -> :class:`MuJoCoBuffers` (``qpos [frames, nq]``, ``qvel [frames, nv]``).

        Raises :class:`~kangengine.errors.LayoutMismatch` when the motion was made for another layout.
        """
        C.require_layout_match(motion, self.layout)
        return self.pack_arrays(motion.q, motion.qd)

    def pack_arrays(self, q, qd) -> MuJoCoBuffers:
        """Like :meth:`pack` for raw canonical arrays ``q [frames, nq]``, ``qd [frames, nv]`` (float32 or
        float64; the result has the same dtype)."""
        q, qd = C.as_state_arrays(self.layout, q, qd)
        qpos = C.gather_columns(q, self._map.q_index, identity=self._identity[0])
        if self._fast_rotation:
            qvel = C.gather_columns(qd, self._map.qd_index, identity=self._identity[1])
            C.rotate_columns(qpos, self._quat_cols, qvel, self._w_native_cols, inverse=True)
            return MuJoCoBuffers(qpos=qpos, qvel=qvel)
        w_idx, quat = self._rotations(q)
        qd_mj = qd.copy()
        if w_idx.size:
            qd_mj[:, w_idx] = R.quat_rotate_inverse(quat, qd[:, w_idx])
        return MuJoCoBuffers(qpos=qpos, qvel=C.gather_columns(qd_mj, self._map.qd_index, identity=self._identity[1]))

    def unpack(self, qpos, qvel, *, fps: float, metadata=None):
        """MuJoCo ``qpos [frames, nq]``, ``qvel [frames, nv]`` -> ``ArticulationMotion`` at ``fps``."""
        from ..animation.motion import ArticulationMotion

        q, qd = self.unpack_arrays(qpos, qvel)
        return ArticulationMotion(
            q, qd, fps, self.layout.model_signature, joint_names=self.layout.joint_names, metadata=metadata
        )

    def unpack_arrays(self, qpos, qvel):
        """Canonical ``(q, qd)`` arrays (same dtype as the input) from MuJoCo ``qpos``/``qvel``."""
        qpos = np.asarray(qpos)
        qvel = np.asarray(qvel)
        dtype = C.float_dtype(qpos, qvel)
        qpos = np.atleast_2d(qpos).astype(dtype, copy=False)
        qvel = np.atleast_2d(qvel).astype(dtype, copy=False)
        C.check_2d("qpos", qpos, self.layout.nq, source=self.layout.source)
        C.check_2d("qvel", qvel, self.layout.nv, source=self.layout.source)
        q = np.ascontiguousarray(qpos[:, self._map.q_inverse])
        qd = np.ascontiguousarray(qvel[:, self._map.qd_inverse])
        w_idx, quat = self._rotations(q)
        if w_idx.size:
            qd[:, w_idx] = R.quat_rotate(quat, qd[:, w_idx])
        return q, qd

    def _rotations(self, q):
        """Canonical qd column indices ``[k, 3]`` of the free/ball angular velocities and the rotations
        ``[frames, k, 4]`` mapping MuJoCo's local axes to the canonical frame."""
        lay = self.layout
        idx, quats = [], []
        for i in self._rot_blocks:
            b = lay.blocks[i]
            off = 3 if b.joint_type is JointType.FREE else 0
            idx.append(range(b.qd_offset + off, b.qd_offset + off + 3))
            quats.append(_joint_and_after(lay, q, i))
        if not idx:
            return np.zeros((0, 3), dtype=np.int64), None
        return np.array([list(r) for r in idx], dtype=np.int64), np.stack(quats, axis=-2)

    # -- MotionLibrary protocol ------------------------------------------------------------------
    def prepare_motion(self, motion, *, skeleton_motion=None) -> dict:
        """``{"qpos": [frames, nq], "qvel": [frames, nv]}`` for one clip (see
        :class:`~kangengine.adapters.MotionAdapter`). A ``SkeletonMotion`` is mapped onto the layout first."""
        am = C.as_articulation_motion(self.layout, motion, skeleton_motion=skeleton_motion)
        buf = self.pack(am)
        return {"qpos": buf.qpos, "qvel": buf.qvel}

    def pack_sample(self, frames0: dict, frames1: dict, blend, *, root_offset=None) -> MuJoCoBuffers:
        """Blend gathered frames (torch ``[n, ...]``): positions lerp, quaternions slerp (shortest path),
        velocities lerp; ``root_offset [n, 3]`` is added to the free root position."""
        qpos = C.blend_frames(frames0["qpos"], frames1["qpos"], blend, self._quat_cols)
        qvel = C.blend_frames(frames0["qvel"], frames1["qvel"], blend)
        if root_offset is not None and self._root_pos_cols is not None:
            cols = C.torch_index(self._root_pos_cols, qpos)
            qpos[:, cols] = qpos[:, cols] + root_offset.to(qpos.dtype)
        return MuJoCoBuffers(qpos=qpos, qvel=qvel)

    # -- model check ------------------------------------------------------------------------------
    def validate_model(self, model, *, atol: float = 1e-5) -> MuJoCoModelMatch:
        """Check that ``model`` (``mujoco.MjModel``) has the layout's joints, in this adapter's order.

        Compares joint count, order, names, types, bodies, axes, anchors, ``ref`` (``qpos0``), ``qpos``/``qvel``
        addresses, and the bodies' names, parents and rest transforms. Raises
        :class:`~kangengine.errors.LayoutMismatch` listing every mismatch; returns a
        :class:`MuJoCoModelMatch` otherwise.
        """
        lay = self.layout
        problems: list[str] = []
        mj_bodies = _mj_body_names(model)
        # bodies ---------------------------------------------------------------------------------------
        if model.nbody - 1 != lay.num_bodies:
            problems.append(f"model has {model.nbody - 1} bodies (besides the world); the layout has {lay.num_bodies}")
        for bi, name in enumerate(lay.body_names):
            if name not in mj_bodies:
                problems.append(f"body {name!r} is missing from the model")
                continue
            mid = mj_bodies.index(name)
            parent = lay.parent_indices[bi]
            want_parent = "world" if parent < 0 else lay.body_names[parent]
            got_parent = "world" if model.body_parentid[mid] == 0 else mj_bodies[model.body_parentid[mid]]
            if want_parent != got_parent:
                problems.append(f"body {name!r}: parent is {got_parent!r} in the model, {want_parent!r} in the layout")
            free_root = parent < 0 and lay.free_root
            if not free_root and not np.allclose(model.body_pos[mid], lay.rest_positions[bi], atol=atol):
                problems.append(
                    f"body {name!r}: rest position {_fmt(model.body_pos[mid])} in the "
                    f"model, {_fmt(lay.rest_positions[bi])} in the layout"
                )
            if not free_root and not _same_rotation(model.body_quat[mid], lay.rest_rotations_wxyz[bi], atol):
                problems.append(
                    f"body {name!r}: rest rotation (wxyz) {_fmt(model.body_quat[mid])} "
                    f"in the model, {_fmt(lay.rest_rotations_wxyz[bi])} in the layout"
                )
        # joints ---------------------------------------------------------------------------------------
        blocks = [lay.blocks[i] for i in self._map.block_order if lay.blocks[i].joint_type is not JointType.FIXED]
        if model.nq != lay.nq or model.nv != lay.nv:
            problems.append(f"model has nq={model.nq}, nv={model.nv}; the layout has nq={lay.nq}, nv={lay.nv}")
        if model.njnt != len(blocks):
            problems.append(f"model has {model.njnt} joints; the layout has {len(blocks)}")
        mj_names = [_mj_joint_name(model, j, mj_bodies) for j in range(model.njnt)]
        qadr = 0
        vadr = 0
        for k, b in enumerate(blocks):
            want = b.joint_name
            j = _find_joint(model, b, mj_names, mj_bodies)
            if j is None:
                problems.append(
                    f"joint {want!r} ({b.joint_type.value} on body {b.body_name!r}) is missing from the model"
                )
            else:
                if j != k:
                    problems.append(
                        f"joint {want!r} is model joint {j}; this adapter packs it as joint {k} "
                        f"(order differs: pass model= to MuJoCoMotionAdapter to pack in the model's order)"
                    )
                _compare_joint(model, j, b, mj_bodies, qadr, vadr, atol, problems)
            qadr += b.q_dim
            vadr += b.qd_dim
        known = {b.joint_name for b in blocks}
        extra = [
            n
            for j, n in enumerate(mj_names)
            if n not in known and not (model.jnt_type[j] == 0 and any(b.joint_type is JointType.FREE for b in blocks))
        ]
        if extra:
            problems.append(f"model joints that the layout lacks: {', '.join(repr(n) for n in extra)}")
        if problems:
            raise LayoutMismatch(C.format_mismatches("MuJoCo model", problems), path=lay.source)
        return MuJoCoModelMatch(
            joint_names=self.joint_names, qpos_index=self._map.q_index, qvel_index=self._map.qd_index
        )


# -- helpers ---------------------------------------------------------------------------------------------


def _joint_rotation(block, q):
    """``[frames, 4]`` WXYZ rotation of one rotating block (hinge: about its axis by ``q - ref``)."""
    o = block.q_offset
    if block.joint_type is JointType.FREE:
        return q[:, o + 3 : o + 7]
    if block.joint_type is JointType.BALL:
        return q[:, o : o + 4]
    return R.quat_from_axis_angle(np.asarray(block.axis, dtype=q.dtype), q[:, o] - block.ref)


def _joint_and_after(layout, q, i):
    """Rotation of block ``i`` times the rotations of the later rotating joints of the same body."""
    b = layout.blocks[i]
    out = R.quat_normalize(_joint_rotation(b, q))
    for later in layout.blocks[i + 1 :]:
        if later.body_index != b.body_index:
            break
        if later.joint_type in (JointType.HINGE, JointType.BALL):
            out = R.quat_multiply(out, R.quat_normalize(_joint_rotation(later, q)))
    return out


def _is_arange(index) -> bool:
    return bool(np.array_equal(index, np.arange(index.size)))


def _fmt(v) -> list[float]:
    return [round(float(x), 6) + 0.0 for x in np.asarray(v).reshape(-1)]


def _same_rotation(a, b, atol) -> bool:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a / np.linalg.norm(a)
    b = b / np.linalg.norm(b)
    return bool(abs(abs(float(a @ b)) - 1.0) < atol)


def _mj_body_names(model) -> list[str]:
    """Body names as the MJCF loader gives them (``body{i}`` for unnamed ones; index 0 is the world)."""
    return ["world"] + [model.body(i).name or f"body{i}" for i in range(1, model.nbody)]


def _mj_joint_name(model, j, mj_bodies) -> str:
    name = model.joint(j).name
    if name:
        return name
    body = mj_bodies[model.jnt_bodyid[j]]
    k = [jj for jj in range(model.njnt) if model.jnt_bodyid[jj] == model.jnt_bodyid[j]].index(j)
    return f"{body}_joint{k}"  # the MJCF loader's name for an unnamed joint


def _find_joint(model, block, mj_names, mj_bodies):
    if block.joint_name in mj_names:
        return mj_names.index(block.joint_name)
    if block.joint_type is JointType.FREE:  # the layout may name a free root itself
        for j in range(model.njnt):
            if model.jnt_type[j] == 0 and mj_bodies[model.jnt_bodyid[j]] == block.body_name:
                return j
    return None


def _compare_joint(model, j, b, mj_bodies, qadr, vadr, atol, problems):
    name = b.joint_name
    jt = _MJ_TYPE.get(int(model.jnt_type[j]))
    if jt is not b.joint_type:
        problems.append(
            f"joint {name!r}: type {jt.value if jt else model.jnt_type[j]} in the model, "
            f"{b.joint_type.value} in the layout"
        )
        return
    body = mj_bodies[model.jnt_bodyid[j]]
    if body != b.body_name:
        problems.append(f"joint {name!r}: moves body {body!r} in the model, {b.body_name!r} in the layout")
    if b.axis is not None and not np.allclose(model.jnt_axis[j], b.axis, atol=atol):
        problems.append(f"joint {name!r}: axis {_fmt(model.jnt_axis[j])} in the model, {_fmt(b.axis)} in the layout")
    if jt is not JointType.FREE and not np.allclose(model.jnt_pos[j], b.anchor, atol=atol):
        problems.append(f"joint {name!r}: anchor {_fmt(model.jnt_pos[j])} in the model, {_fmt(b.anchor)} in the layout")
    if jt in (JointType.HINGE, JointType.SLIDE):
        ref = float(model.qpos0[model.jnt_qposadr[j]])
        if abs(ref - b.ref) > atol:
            problems.append(f"joint {name!r}: ref {ref:.6g} in the model, {b.ref:.6g} in the layout")
    if int(model.jnt_qposadr[j]) != qadr or int(model.jnt_dofadr[j]) != vadr:
        problems.append(
            f"joint {name!r}: qpos/qvel address {int(model.jnt_qposadr[j])}/{int(model.jnt_dofadr[j])} "
            f"in the model; this adapter packs it at {qadr}/{vadr}"
        )


def _order_from_model(layout, model) -> tuple[int, ...]:
    """Layout block indices in the model's joint order (fixed blocks, which have no columns, last)."""
    mj_bodies = _mj_body_names(model)
    mj_names = [_mj_joint_name(model, j, mj_bodies) for j in range(model.njnt)]
    placed: dict[int, int] = {}
    for i, b in enumerate(layout.blocks):
        if b.joint_type is JointType.FIXED:
            continue
        j = _find_joint(model, b, mj_names, mj_bodies)
        placed[i] = j if j is not None else model.njnt + i  # unknown joints go last; validate_model lists them
    order = sorted(placed, key=lambda i: placed[i])
    return tuple(order) + tuple(i for i, b in enumerate(layout.blocks) if b.joint_type is JointType.FIXED)

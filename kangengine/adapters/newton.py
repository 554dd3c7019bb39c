"""Newton adapter: canonical ``ArticulationMotion`` <-> Newton ``joint_q``/``joint_qd``.

Conventions of Newton 1.x (read from its ``eval_fk`` and MJCF importer, and checked against
``newton.eval_fk`` in ``tests/test_adapters_newton.py``):

============================  ===========================================  ==========================================
quantity                      canonical (KangEngine)                       Newton
============================  ===========================================  ==========================================
quaternions                   WXYZ                                         XYZW
free root position            root body origin in world                    same (child origin in the parent = world)
free root linear velocity     root body origin, world frame                root body COM, world frame
free root angular velocity    world frame                                  world frame
ball angular velocity         parent joint frame                           parent joint frame
hinge / slide                 MuJoCo ``qpos`` (``ref`` at the model pose)  ``qpos - ref`` (0 at the model pose)
DOF order                     the layout's body order                      builder order (MJCF pre-order); the
                                                                           joints of one body form ONE Newton
                                                                           joint (a D6 when mixed or several),
                                                                           linear DOFs first, then angular
============================  ===========================================  ==========================================

The free root's linear velocity moves from the body origin to the COM: ``v_com = v_origin + w x (R com)``,
with ``com`` the root body's centre of mass in its body frame (``layout.body_coms``, from the
``ArticulationDesc``). :meth:`NewtonMotionAdapter.validate_model` checks it against ``model.body_com``.

``newton`` is an optional dependency (``pip install -e ".[newton]"``); this module imports it only inside
:meth:`NewtonMotionAdapter.validate_model` and when a ``model=`` is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .. import rotations as R
from ..asset.desc import JointType
from ..errors import LayoutMismatch, ShapeError
from . import _common as C

__all__ = ["NewtonMotionAdapter", "NewtonBuffers", "NewtonModelMatch"]

# newton.JointType values (newton 1.x)
_NT_PRISMATIC, _NT_REVOLUTE, _NT_BALL, _NT_FIXED, _NT_FREE, _NT_D6 = 0, 1, 2, 3, 4, 6
_NT_NAMES = {0: "prismatic", 1: "revolute", 2: "ball", 3: "fixed", 4: "free", 5: "distance", 6: "d6", 7: "rod"}


@dataclass(frozen=True)
class NewtonBuffers:
    """Newton-native joint state.

    Attributes:
        joint_q: ``[frames, nq]`` (``pack``: numpy, float32 like the motion or float64 when given float64;
            ``pack_sample``: torch ``[n, nq]``): one articulation's slice of ``Model.joint_q`` per frame.
        joint_qd: ``[frames, nv]``: the matching ``joint_qd`` slice (free root: COM linear velocity, world
            angular velocity).
    """

    joint_q: object
    joint_qd: object


@dataclass(frozen=True)
class NewtonModelMatch:
    """What :meth:`NewtonMotionAdapter.validate_model` found (the model matched).

    Attributes:
        joint_labels: the articulation's Newton joint labels in order (one per body).
        joint_q_start, joint_qd_start: ``[joints]`` offsets of each Newton joint inside the articulation's
            ``joint_q``/``joint_qd`` slice (the grouped D6 offsets).
        q_index, qd_index: ``[nq]``/``[nv]`` canonical columns of each native column.
    """

    joint_labels: tuple[str, ...]
    joint_q_start: np.ndarray
    joint_qd_start: np.ndarray
    q_index: np.ndarray
    qd_index: np.ndarray


@dataclass(frozen=True)
class _Group:
    """The layout blocks of one body, as Newton groups them into one joint."""

    body_index: int
    body_name: str
    blocks: tuple[int, ...]  # layout block indices in Newton's DOF order (linear first)
    newton_type: int
    lin: int
    ang: int


class NewtonMotionAdapter:
    """Pack canonical motion into Newton ``joint_q``/``joint_qd`` and back.

    Args:
        layout: the :class:`~kangengine.animation.ArticulationCoordinateLayout` motions are made for.
        model: optional ``newton.Model``; when given it is checked with :meth:`validate_model` (its body
            order sets the joint order, and its ``body_com`` must agree with the layout's).
        articulation: which articulation of ``model`` to check (default 0).
    """

    def __init__(self, layout, *, model=None, articulation: int = 0):
        self.layout = layout
        body_order = list(C.dfs_body_order(layout))
        if model is not None:
            names = _articulation_body_names(model, articulation)
            pos = {n: i for i, n in enumerate(names)}
            body_order = sorted(body_order, key=lambda b: pos.get(layout.body_names[b], len(names) + b))
        self._groups = tuple(_group(layout, b) for b in body_order)
        order = tuple(i for g in self._groups for i in g.blocks)
        order += tuple(i for i, b in enumerate(layout.blocks) if i not in set(order))  # fixed blocks
        self._map = _xyzw_map(layout, C.column_map(layout, order))
        # per native q column: the ref subtracted (hinge, slide)
        shift = np.zeros(layout.nq)
        for i in order:
            b = layout.blocks[i]
            if b.joint_type in (JointType.HINGE, JointType.SLIDE):
                shift[self._map.q_inverse[b.q_offset]] = b.ref
        self._q_shift = shift
        self._q_shift_any = bool(np.any(shift))
        self._q_identity = bool(np.array_equal(self._map.q_index, np.arange(self._map.q_index.size)))
        self._qd_identity = bool(np.array_equal(self._map.qd_index, np.arange(self._map.qd_index.size)))
        self._free = layout.blocks[0] if layout.blocks and layout.blocks[0].joint_type is JointType.FREE else None
        if self._free is not None:
            if layout.body_coms is None:
                raise ShapeError(
                    "the layout carries no body COMs; build it with ArticulationCoordinateLayout."
                    "from_data(...) so the free root's COM velocity can be converted",
                    item="layout",
                )
            self._root_com = np.asarray(layout.body_coms[self._free.body_index], dtype=np.float64)
            self._root_lin_cols = self._map.qd_inverse[self._free.qd_offset : self._free.qd_offset + 3]
        self._quat_cols = C.quaternion_columns(
            layout, self._map, offset_in_block={JointType.FREE: 3, JointType.BALL: 0}
        )
        self._root_pos_cols = (
            None
            if self._free is None
            else np.array([int(self._map.q_inverse[self._free.q_offset + k]) for k in range(3)], dtype=np.int64)
        )
        if model is not None:
            self.validate_model(model, articulation=articulation)

    # -- properties -----------------------------------------------------------------------------
    @property
    def joint_q_index(self) -> np.ndarray:
        """``[nq]``: native ``joint_q[:, k]`` comes from canonical ``q[:, joint_q_index[k]]`` (quaternions
        reordered to XYZW, hinges and slides shifted by ``-ref``)."""
        return self._map.q_index

    @property
    def joint_qd_index(self) -> np.ndarray:
        """``[nv]``: native ``joint_qd[:, k]`` comes from canonical ``qd[:, joint_qd_index[k]]``."""
        return self._map.qd_index

    @property
    def body_order(self) -> tuple[str, ...]:
        """Bodies in Newton's joint order (one Newton joint per body)."""
        return tuple(g.body_name for g in self._groups)

    # -- conversion -----------------------------------------------------------------------------
    def pack(self, motion) -> NewtonBuffers:
        """``ArticulationMotion`` -> :class:`NewtonBuffers` (``joint_q [frames, nq]``, ``joint_qd [frames, nv]``)."""
        C.require_layout_match(motion, self.layout)
        return self.pack_arrays(motion.q, motion.qd)

    def pack_arrays(self, q, qd) -> NewtonBuffers:
        """Like :meth:`pack` for raw canonical arrays (float32 or float64; the result keeps the dtype)."""
        q, qd = C.as_state_arrays(self.layout, q, qd)
        jq = C.gather_columns(q, self._map.q_index, identity=self._q_identity)
        if self._q_shift_any:
            jq -= self._q_shift.astype(q.dtype)
        jqd = C.gather_columns(qd, self._map.qd_index, identity=self._qd_identity)
        if self._free is not None:
            o, v = self._free.q_offset, self._free.qd_offset
            w = qd[:, v + 3 : v + 6]
            com_world = R.quat_rotate(R.quat_normalize(q[:, o + 3 : o + 7]), self._root_com.astype(q.dtype))
            jqd[:, self._root_lin_cols] += np.cross(w, com_world)
        return NewtonBuffers(joint_q=jq, joint_qd=jqd)

    def unpack(self, joint_q, joint_qd, *, fps: float, metadata=None):
        """Newton ``joint_q [frames, nq]``, ``joint_qd [frames, nv]`` -> ``ArticulationMotion`` at ``fps``."""
        from ..animation.motion import ArticulationMotion

        q, qd = self.unpack_arrays(joint_q, joint_qd)
        return ArticulationMotion(
            q, qd, fps, self.layout.model_signature, joint_names=self.layout.joint_names, metadata=metadata
        )

    def unpack_arrays(self, joint_q, joint_qd):
        """Canonical ``(q, qd)`` (same dtype as the input) from Newton ``joint_q``/``joint_qd``."""
        jq = np.asarray(joint_q)
        jqd = np.asarray(joint_qd)
        dtype = C.float_dtype(jq, jqd)
        jq = np.atleast_2d(jq).astype(dtype, copy=False)
        jqd = np.atleast_2d(jqd).astype(dtype, copy=False)
        C.check_2d("joint_q", jq, self.layout.nq, source=self.layout.source)
        C.check_2d("joint_qd", jqd, self.layout.nv, source=self.layout.source)
        q = np.ascontiguousarray((jq + self._q_shift.astype(dtype))[:, self._map.q_inverse])
        qd = np.ascontiguousarray(jqd[:, self._map.qd_inverse])
        if self._free is not None:
            o, v = self._free.q_offset, self._free.qd_offset
            w = qd[:, v + 3 : v + 6]
            com_world = R.quat_rotate(R.quat_normalize(q[:, o + 3 : o + 7]), self._root_com.astype(dtype))
            qd[:, v : v + 3] = qd[:, v : v + 3] - np.cross(w, com_world)
        return q, qd

    # -- MotionLibrary protocol ------------------------------------------------------------------
    def prepare_motion(self, motion, *, skeleton_motion=None) -> dict:
        """``{"joint_q": [frames, nq], "joint_qd": [frames, nv]}`` for one clip (an ``ArticulationMotion``'s
        own ``q``/``qd`` are reused; a ``SkeletonMotion`` is mapped onto the layout first)."""
        am = C.as_articulation_motion(self.layout, motion, skeleton_motion=skeleton_motion)
        buf = self.pack(am)
        return {"joint_q": buf.joint_q, "joint_qd": buf.joint_qd}

    def pack_sample(self, frames0: dict, frames1: dict, blend, *, root_offset=None) -> NewtonBuffers:
        """Blend gathered frames (torch ``[n, ...]``): lerp, shortest-path slerp for the XYZW quaternions;
        ``root_offset [n, 3]`` is added to the free root position."""
        jq = C.blend_frames(frames0["joint_q"], frames1["joint_q"], blend, self._quat_cols)
        jqd = C.blend_frames(frames0["joint_qd"], frames1["joint_qd"], blend)
        if root_offset is not None and self._root_pos_cols is not None:
            cols = C.torch_index(self._root_pos_cols, jq)
            jq[:, cols] = jq[:, cols] + root_offset.to(jq.dtype)
        return NewtonBuffers(joint_q=jq, joint_qd=jqd)

    # -- model check ------------------------------------------------------------------------------
    def validate_model(self, model, *, articulation: int = 0, atol: float = 1e-4) -> NewtonModelMatch:
        """Check one articulation of a ``newton.Model`` against the layout and this adapter's packing.

        Compares, body by body in Newton's joint order: body names and order, joint type and
        ``joint_dof_dim`` (linear, angular), the grouped D6 offsets (``joint_q_start``/``joint_qd_start``
        against this adapter's columns), the authored axis order (Newton puts linear DOFs first: a slide
        authored after a hinge of the same body cannot be represented) and each axis, joint names, the joint
        anchor, the rest transform ``joint_X_p * joint_X_c^-1``, the frames of free and ball joints, and
        ``body_com`` (used for the free root's COM velocity). Raises
        :class:`~kangengine.errors.LayoutMismatch` listing every mismatch.
        """
        lay = self.layout
        get = _model_arrays(model)
        js, je = _articulation_range(model, get, articulation)
        body_names = _body_names(model)
        problems: list[str] = []
        n_joints = je - js
        if n_joints != len(self._groups):
            problems.append(
                f"articulation {articulation} has {n_joints} Newton joints; the layout has "
                f"{len(self._groups)} bodies (Newton has one joint per body)"
            )
        q0 = int(get["joint_q_start"][js]) if n_joints else 0
        v0 = int(get["joint_qd_start"][js]) if n_joints else 0
        by_body = {body_names[int(get["joint_child"][j])]: j for j in range(js, je)}
        labels, qs, vs = [], [], []
        qpos = vpos = 0
        for k, g in enumerate(self._groups):
            j = by_body.get(g.body_name)
            if j is None:
                problems.append(f"body {g.body_name!r} has no joint in Newton articulation {articulation}")
            else:
                if j - js != k:
                    problems.append(
                        f"body {g.body_name!r}: Newton joint {j - js}; this adapter packs it as joint "
                        f"{k} (pass model= to NewtonMotionAdapter to follow the model's order)"
                    )
                labels.append(model.joint_label[j])
                qs.append(int(get["joint_q_start"][j]) - q0)
                vs.append(int(get["joint_qd_start"][j]) - v0)
                self._compare_group(g, j, get, body_names, model.joint_label[j], qpos, vpos, q0, v0, atol, problems)
            qpos += sum(lay.blocks[i].q_dim for i in g.blocks)
            vpos += sum(lay.blocks[i].qd_dim for i in g.blocks)
        known = {g.body_name for g in self._groups}
        extra = [
            body_names[int(get["joint_child"][j])]
            for j in range(js, je)
            if body_names[int(get["joint_child"][j])] not in known
        ]
        if extra:
            problems.append(f"Newton bodies that the layout lacks: {', '.join(repr(n) for n in extra)}")
        if problems:
            raise LayoutMismatch(C.format_mismatches("Newton model", problems), path=lay.source)
        return NewtonModelMatch(
            joint_labels=tuple(labels),
            joint_q_start=np.array(qs),
            joint_qd_start=np.array(vs),
            q_index=self._map.q_index,
            qd_index=self._map.qd_index,
        )

    def _compare_group(self, g, j, get, body_names, label, qpos, vpos, q0, v0, atol, problems):
        lay = self.layout
        name = g.body_name
        jt = int(get["joint_type"][j])
        lin, ang = (int(x) for x in get["joint_dof_dim"][j])
        blocks = [lay.blocks[i] for i in g.blocks]
        want_type = _NT_NAMES[g.newton_type]
        if jt != g.newton_type and not (g.newton_type == _NT_D6 and jt in (_NT_REVOLUTE, _NT_PRISMATIC)):
            problems.append(
                f"body {name!r}: Newton joint type {_NT_NAMES.get(jt, jt)}; the layout needs {want_type} "
                f"(joints {', '.join(b.joint_name for b in blocks) or 'none'})"
            )
            return
        if (lin, ang) != (g.lin, g.ang) and jt not in (_NT_FREE, _NT_BALL):
            problems.append(
                f"body {name!r}: Newton joint has {lin} linear + {ang} angular DOFs; the layout has {g.lin} + {g.ang}"
            )
            return
        if int(get["joint_q_start"][j]) - q0 != qpos or int(get["joint_qd_start"][j]) - v0 != vpos:
            problems.append(
                f"body {name!r}: joint_q_start/joint_qd_start {int(get['joint_q_start'][j]) - q0}/"
                f"{int(get['joint_qd_start'][j]) - v0} in the articulation; this adapter packs the body "
                f"at {qpos}/{vpos}"
            )
        parent = int(get["joint_parent"][j])
        bi = g.body_index
        want_parent = "world" if lay.parent_indices[bi] < 0 else lay.body_names[lay.parent_indices[bi]]
        got_parent = "world" if parent < 0 else body_names[parent]
        if want_parent != got_parent:
            problems.append(f"body {name!r}: parent {got_parent!r} in Newton, {want_parent!r} in the layout")
        xp = np.asarray(get["joint_X_p"][j], dtype=np.float64)
        xc = np.asarray(get["joint_X_c"][j], dtype=np.float64)
        rot_c = R.quat_xyzw_to_wxyz(xc[3:7])
        if jt == _NT_FREE:
            if not (
                np.allclose(xp[:3], 0, atol=atol)
                and _is_identity(xp[3:7], atol)
                and np.allclose(xc[:3], 0, atol=atol)
                and _is_identity(xc[3:7], atol)
            ):
                problems.append(
                    f"body {name!r}: the free joint has non-identity joint_X_p/joint_X_c; joint_q would not "
                    "be the body origin in world"
                )
        else:
            if jt == _NT_BALL and not _is_identity(xc[3:7], atol):
                problems.append(
                    f"body {name!r}: ball joint_X_c has a rotation; the layout's ball quaternion is in the body frame"
                )
            # rest transform joint_X_p * joint_X_c^-1 == parent_from_body at the model pose
            rest_r = R.quat_multiply(R.quat_xyzw_to_wxyz(xp[3:7]), R.quat_conjugate(rot_c))
            rest_p = xp[:3] - R.quat_rotate(rest_r, xc[:3])
            if not np.allclose(rest_p, lay.rest_positions[bi], atol=atol):
                problems.append(
                    f"body {name!r}: rest position {_fmt(rest_p)} in Newton, {_fmt(lay.rest_positions[bi])} "
                    "in the layout"
                )
            if abs(abs(float(rest_r @ lay.rest_rotations_wxyz[bi])) - 1.0) > atol:
                problems.append(
                    f"body {name!r}: rest rotation {_fmt(rest_r)} in Newton, "
                    f"{_fmt(lay.rest_rotations_wxyz[bi])} in the layout"
                )
            for b in blocks:
                if not np.allclose(xc[:3], b.anchor, atol=atol):
                    problems.append(
                        f"joint {b.joint_name!r}: anchor {_fmt(xc[:3])} in Newton (one per Newton joint), "
                        f"{_fmt(b.anchor)} in the layout"
                    )
            # authored order: Newton applies all linear DOFs before the angular ones
            kinds = [b.joint_type for b in blocks]
            authored = [lay.blocks[i].joint_type for i in sorted(g.blocks)]
            if (
                JointType.SLIDE in authored
                and JointType.HINGE in authored
                and authored.index(JointType.HINGE) < max(i for i, t in enumerate(authored) if t is JointType.SLIDE)
            ):
                problems.append(
                    f"body {name!r}: a slide is authored after a hinge; Newton's D6 applies linear axes "
                    "first, so this motion cannot be represented"
                )
            if jt != _NT_BALL:
                qd_start = int(get["joint_qd_start"][j])
                axes = []
                for k, b in enumerate(blocks):
                    a_joint = np.asarray(get["joint_axis"][qd_start + k], dtype=np.float64)
                    a_body = R.quat_rotate(rot_c, a_joint)
                    axes.append(a_body)
                    if not np.allclose(a_body, b.axis, atol=atol):
                        problems.append(
                            f"joint {b.joint_name!r}: axis {_fmt(a_body)} (body frame) is Newton DOF {k} "
                            f"of body {name!r}; the layout's axis is {_fmt(b.axis)}"
                        )
                if ang == 2 and kinds.count(JointType.HINGE) == 2:
                    ha = [a for a, t in zip(axes, kinds) if t is JointType.HINGE]
                    if abs(float(ha[0] @ ha[1])) > atol:
                        problems.append(
                            f"body {name!r}: two non-orthogonal hinge axes; Newton's 2-axis D6 orthonormalises them"
                        )
                want_label = "_".join(b.joint_name for b in blocks)
                got = label.rsplit("/", 1)[-1]
                if blocks and got != want_label and got != "_".join(lay.blocks[i].joint_name for i in sorted(g.blocks)):
                    problems.append(
                        f"body {name!r}: Newton joint label {got!r}; the layout's joints are {want_label!r}"
                    )
        if jt == _NT_FREE or lay.body_coms is not None:
            com = np.asarray(get["body_com"][int(get["joint_child"][j])], dtype=np.float64)
            if lay.body_coms is not None and not np.allclose(com, lay.body_coms[bi], atol=atol):
                why = " (the free root's COM velocity uses the layout's)" if jt == _NT_FREE else ""
                problems.append(
                    f"body {name!r}: body_com {_fmt(com)} in Newton, {_fmt(lay.body_coms[bi])} in the layout{why}"
                )


# -- helpers ---------------------------------------------------------------------------------------------


def _fmt(v) -> list[float]:
    return [round(float(x), 6) + 0.0 for x in np.asarray(v).reshape(-1)]


def _is_identity(xyzw, atol) -> bool:
    return abs(abs(float(xyzw[3])) - 1.0) < atol


def _group(layout, body: int) -> _Group:
    idx = [i for i, b in enumerate(layout.blocks) if b.body_index == body and b.joint_type is not JointType.FIXED]
    types = [layout.blocks[i].joint_type for i in idx]
    name = layout.body_names[body]
    if not idx:
        return _Group(body, name, (), _NT_FIXED, 0, 0)
    if types[0] is JointType.FREE:
        return _Group(body, name, tuple(idx), _NT_FREE if len(idx) == 1 else -1, 3, 3)
    if JointType.BALL in types:
        return _Group(body, name, tuple(idx), _NT_BALL if len(idx) == 1 else -1, 0, 3)
    lin = [i for i in idx if layout.blocks[i].joint_type is JointType.SLIDE]
    ang = [i for i in idx if layout.blocks[i].joint_type is JointType.HINGE]
    if len(idx) == 1:
        nt = _NT_PRISMATIC if lin else _NT_REVOLUTE
    else:
        nt = _NT_D6
    return _Group(body, name, tuple(lin + ang), nt, len(lin), len(ang))


def _xyzw_map(layout, cmap: C.ColumnMap) -> C.ColumnMap:
    """Reorder each quaternion's 4 native columns from WXYZ to XYZW."""
    qi = np.array(cmap.q_index, copy=True)
    for i in cmap.block_order:
        b = layout.blocks[i]
        if b.joint_type in (JointType.FREE, JointType.BALL):
            start = b.q_offset + (3 if b.joint_type is JointType.FREE else 0)
            k = int(cmap.q_inverse[start])
            qi[k : k + 4] = R.quat_wxyz_to_xyzw(np.arange(start, start + 4))
    qinv = np.empty_like(qi)
    qinv[qi] = np.arange(qi.size)
    for a in (qi, qinv):
        a.setflags(write=False)
    return C.ColumnMap(cmap.block_order, qi, cmap.qd_index, qinv, cmap.qd_inverse)


def _body_names(model) -> list[str]:
    """Body names from Newton labels (last path part). Newton's MJCF importer names an unnamed body
    ``body_{k}`` (k: builder body index, from 0); the MJCF loader names it ``body{i}`` (MuJoCo body id, from
    1): translated so the two match for a model imported on its own."""
    out = []
    for lbl in model.body_label:
        name = lbl.rsplit("/", 1)[-1]
        m = re.fullmatch(r"body_(\d+)", name)
        out.append(f"body{int(m.group(1)) + 1}" if m else name)
    return out


def _model_arrays(model) -> dict:
    names = (
        "joint_type",
        "joint_parent",
        "joint_child",
        "joint_q_start",
        "joint_qd_start",
        "joint_dof_dim",
        "joint_axis",
        "joint_X_p",
        "joint_X_c",
        "body_com",
        "articulation_start",
    )
    out = {}
    for n in names:
        a = getattr(model, n, None)
        out[n] = None if a is None else (a.numpy() if hasattr(a, "numpy") else np.asarray(a))
    return out


def _articulation_range(model, get, articulation: int):
    starts = get["articulation_start"]
    if starts is None or len(starts) < 2:
        return 0, int(model.joint_count)
    n = len(starts) - 1
    if not 0 <= articulation < n:
        from ..errors import UnknownNameError

        raise UnknownNameError(f"articulation {articulation} does not exist; the model has {n}", item="articulation")
    return int(starts[articulation]), int(starts[articulation + 1])


def _articulation_body_names(model, articulation: int) -> list[str]:
    get = _model_arrays(model)
    js, je = _articulation_range(model, get, articulation)
    labels = _body_names(model)
    return [labels[int(get["joint_child"][j])] for j in range(js, je)]

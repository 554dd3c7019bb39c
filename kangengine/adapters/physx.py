"""PhysX adapter: canonical ``ArticulationMotion`` <-> PhysX articulation root state + DOF state.

PhysX reduced-coordinate articulations (PhysX 5, Isaac Lab, ``ovphysx`` tensor views) keep the root link's
state apart from the joint DOFs. Conventions (each checked against PhysX through ``ovphysx`` in
``tests/test_adapters_physx.py``):

=============================  =========================================  ==============================================
quantity                       canonical (KangEngine)                     PhysX
=============================  =========================================  ==============================================
quaternions                    WXYZ                                       XYZW
root position / rotation       root body origin in world                  root link actor frame (the same) in world
root linear velocity           root body origin, world frame              root link COM, world frame
root angular velocity          world frame                                world frame
revolute / prismatic DOF       MuJoCo ``qpos`` (``ref`` at model pose)    ``q - ref`` (0 at the authored pose)
spherical joint (ball)         quaternion; angular velocity in the        3 DOFs (twist, swing1, swing2): exponential
                               parent joint frame                         coordinates (rotation vector) of the joint
                                                                          rotation in the parent joint frame;
                                                                          velocities: the joint's angular velocity
                                                                          in child-frame components
three hinges on one body       three angles, applied in authored order    one D6 joint with the three rotations free:
                                                                          the same exponential coordinates and
                                                                          child-frame velocities, in the joint frame
                                                                          whose x, y, z axes are the three hinge axes
DOF order                      the layout's order                         PhysX's link order: breadth-first from the
                                                                          root; the children of a link by the type of
                                                                          their inbound joint (fixed, revolute,
                                                                          prismatic, spherical, D6), then by its prim
                                                                          path in byte order; the authoring order of
                                                                          the prims plays no part. The default: joint
                                                                          prims named as ``link_joint_names`` says
=============================  =========================================  ==============================================

Joint frames the conversion assumes (the way an MJCF/URDF body becomes a PhysX link): a revolute or
prismatic joint's axis is the joint frame's x axis; a spherical joint's child frame is the body frame at
the joint anchor; a three-hinge D6's joint frame has x = a0, y = a1, z = a0 x a1 for the hinge axes a0, a1,
a2 (orthonormal; a left-handed triplet such as the CMU humanoid's rz, ry, rx has z = -a2, so its third
angle changes sign). Bodies with two hinges have no PhysX joint: a PhysX spherical joint with a locked axis
moves by exponential coordinates restricted to its free axes (checked in ``ovphysx``), which two composed
hinge rotations leave as soon as both turn. They, non-orthogonal triplets, triplets with different anchors
and hinges mixed with slides raise :class:`~kangengine.errors.UnsupportedJointError`, with the reason for
each body, when the adapter is built.

``ovphysx`` is optional (``pip install -e ".[physx]"``); this module never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rotations as R
from ..asset.desc import JointType
from ..errors import LayoutMismatch, ShapeError, UnsupportedJointError
from . import _common as C

__all__ = ["PhysXMotionAdapter", "PhysXBuffers", "PhysXArticulationMatch"]


@dataclass(frozen=True)
class PhysXBuffers:
    """PhysX-native state (numpy from ``pack``, float32 like the motion or float64 when given float64;
    torch ``[n, ...]`` from ``pack_sample``).

    Attributes:
        root_positions: ``[frames, 3]`` m, root link origin in world.
        root_rotations_xyzw: ``[frames, 4]`` root link rotation (world_from_root), XYZW.
        root_linear_velocities: ``[frames, 3]`` m/s, velocity of the root link's COM in world.
        root_angular_velocities: ``[frames, 3]`` rad/s, world frame.
        joint_positions: ``[frames, dofs]`` in the articulation's DOF order (rad, m; spherical DOFs:
            exponential coordinates).
        joint_velocities: ``[frames, dofs]`` (rad/s, m/s; spherical DOFs: child-frame components).
    """

    root_positions: object
    root_rotations_xyzw: object
    root_linear_velocities: object
    root_angular_velocities: object
    joint_positions: object
    joint_velocities: object

    def root_pose(self):
        """``[frames, 7]`` ``(x, y, z, qx, qy, qz, qw)``: the layout of PhysX's root-pose tensor."""
        return _cat([self.root_positions, self.root_rotations_xyzw])

    def root_velocity(self):
        """``[frames, 6]`` ``(linear COM velocity, angular velocity)`` in world: PhysX's root-velocity tensor."""
        return _cat([self.root_linear_velocities, self.root_angular_velocities])


@dataclass(frozen=True)
class PhysXArticulationMatch:
    """What :meth:`PhysXMotionAdapter.validate_articulation` found (the articulation matched).

    Attributes:
        dof_names: the articulation's DOF names, in its order (= this adapter's columns).
        joint_of_dof: ``[dofs]`` the layout joint (block) name behind each DOF (a three-hinge D6: the
            hinge names joined by ``+``).
    """

    dof_names: tuple[str, ...]
    joint_of_dof: tuple[str, ...]


@dataclass(frozen=True)
class _Group:
    """The DOFs PhysX gives one body (one joint per link)."""

    kind: str  # "hinge", "slide", "ball", "hinge3"
    body_index: int
    body_name: str
    blocks: tuple[int, ...]
    names: tuple[str, ...]  # candidate PhysX joint names
    ndof: int


class PhysXMotionAdapter:
    """Pack canonical motion into PhysX root + DOF state and back.

    Args:
        layout: the :class:`~kangengine.animation.ArticulationCoordinateLayout` motions are made for.
        articulation: optional live articulation or view (anything with ``dof_names``, e.g. an ``ovphysx``
            tensor binding or an Isaac Lab articulation): its DOF order is used (by name), and it is
            checked with :meth:`validate_articulation`. Without it the order is PhysX's own for joint prims
            named as :attr:`link_joint_names` says (breadth-first links, the children of each link by the
            type of their inbound joint, then its name), whatever body order the layout was built in.
        dof_names: the articulation's DOF names in order, instead of ``articulation``.
    Raises:
        UnsupportedJointError: a body with two hinges, or hinges and slides together (no PhysX joint).
    """

    def __init__(self, layout, *, articulation=None, dof_names=None):
        self.layout = layout
        groups, unsupported = _groups(layout)
        if unsupported:
            raise UnsupportedJointError(
                "PhysX gives each link one joint; these bodies have joint sets with no PhysX equivalent here: "
                + "; ".join(unsupported),
                path=layout.source,
            )
        if articulation is not None and dof_names is None:
            dof_names = list(articulation.dof_names)
        if dof_names is not None:
            pos = {n: i for i, n in enumerate(dof_names)}
            key = {
                id(g): min((pos[n] for n in _dof_names_for(g, dof_names) if n in pos), default=len(pos) + k)
                for k, g in enumerate(groups)
            }
            groups = sorted(groups, key=lambda g: key[id(g)])
        self._groups = tuple(groups)
        self._start = np.cumsum([0] + [g.ndof for g in self._groups])[:-1].astype(np.int64)
        self.num_dofs = int(sum(g.ndof for g in self._groups))
        self._free = layout.blocks[0] if layout.blocks and layout.blocks[0].joint_type is JointType.FREE else None
        if self._free is not None and layout.body_coms is None:
            raise ShapeError(
                "the layout carries no body COMs; build it with ArticulationCoordinateLayout.from_data", item="layout"
            )
        root = self._free.body_index if self._free is not None else 0
        self._root_com = np.zeros(3) if layout.body_coms is None else np.asarray(layout.body_coms[root], np.float64)
        self._prepare_indices()
        if articulation is not None or dof_names is not None:
            self.validate_articulation(articulation if articulation is not None else _Names(dof_names))

    # -- index tables -------------------------------------------------------------------------------
    def _prepare_indices(self):
        lay = self.layout
        sc_dof, sc_q, sc_v, sc_ref = [], [], [], []
        ball_dof, ball_q, ball_v = [], [], []
        self._hinge3 = []
        for g, s in zip(self._groups, self._start):
            if g.kind in ("hinge", "slide"):
                b = lay.blocks[g.blocks[0]]
                sc_dof.append(s)
                sc_q.append(b.q_offset)
                sc_v.append(b.qd_offset)
                sc_ref.append(b.ref)
            elif g.kind == "ball":
                b = lay.blocks[g.blocks[0]]
                ball_dof.append(range(s, s + 3))
                ball_q.append(range(b.q_offset, b.q_offset + 4))
                ball_v.append(range(b.qd_offset, b.qd_offset + 3))
            else:
                bs = [lay.blocks[i] for i in g.blocks]
                axes = np.array([b.axis for b in bs], dtype=np.float64)  # rows a0, a1, a2 (body frame)
                # a left-handed triplet (CMU's rz, ry, rx) turns about z = a0 x a1 = -a2: angle -q2
                sign = np.array([1.0, 1.0, 1.0 if np.linalg.det(axes) > 0 else -1.0])
                self._hinge3.append(
                    {
                        "dof": np.arange(s, s + 3),
                        "q": np.array([b.q_offset for b in bs]),
                        "v": np.array([b.qd_offset for b in bs]),
                        "ref": np.array([b.ref for b in bs]),
                        "sign": sign,
                        "joint_frame_wxyz": R.quat_from_matrix(axes.T * sign),
                    }
                )  # body_from_joint: x, y, z = a0, a1, +-a2
        i64 = lambda x, shape: np.array(
            [list(r) for r in x] if x and not np.isscalar(x[0]) else x, dtype=np.int64
        ).reshape(shape)
        self._sc = (i64(sc_dof, -1), i64(sc_q, -1), i64(sc_v, -1), np.array(sc_ref, dtype=np.float64))
        self._sc_sorted = np.argsort(self._sc[0], kind="stable")  # scalar DOFs in column order
        self._sc_ref_any = bool(np.any(self._sc[3]))
        self._ball = (i64(ball_dof, (-1, 3)), i64(ball_q, (-1, 4)), i64(ball_v, (-1, 3)))
        # the three-hinge groups stacked, [groups, 3] each, so that pack/unpack convert them all at once
        self._h3 = {
            k: np.array([h[k] for h in self._hinge3], dtype=np.float64 if k in ("ref", "sign") else np.int64).reshape(
                -1, 3
            )
            for k in ("dof", "q", "v", "ref", "sign")
        }
        # exponential-coordinate DOF triples (ball and three-hinge groups), for pack_sample
        self._exp_cols = (
            np.concatenate([self._ball[0].reshape(-1, 3)] + [h["dof"][None] for h in self._hinge3])
            .astype(np.int64)
            .reshape(-1, 3)
        )

    # -- properties -------------------------------------------------------------------------------
    @property
    def dof_names(self) -> tuple[str, ...]:
        """The DOF names this adapter expects, in its column order (hinge/slide: the joint name; spherical:
        ``{joint}:0``, ``{joint}:1``, ``{joint}:2``; three-hinge D6: ``{body}:0``, ``{body}:1``, ``{body}:2``)."""
        out = []
        for g in self._groups:
            out += _default_dof_names(g)
        return tuple(out)

    @property
    def link_joint_names(self) -> dict[str, str]:
        """``{link name: inbound joint prim name}`` for every non-root link, as the default DOF order assumes
        them: the joint name for a revolute, prismatic or spherical joint, the body name for a three-hinge
        D6, and for a welded link its fixed joint's name (URDF) or else the body name. An importer that
        names them otherwise gives another order: pass ``articulation=`` to follow it."""
        names = _link_joint_names(self.layout, {g.body_index: g.names[0] for g in self._groups})
        parents = self.layout.parent_indices
        return {self.layout.body_names[b]: names[b] for b in range(len(parents)) if parents[b] >= 0}

    @property
    def link_order(self) -> tuple[str, ...]:
        """Bodies with DOFs, in this adapter's DOF order."""
        return tuple(g.body_name for g in self._groups)

    # -- conversion -------------------------------------------------------------------------------
    def pack(self, motion) -> PhysXBuffers:
        """``ArticulationMotion`` -> :class:`PhysXBuffers` (see its attributes for shapes and frames)."""
        C.require_layout_match(motion, self.layout)
        return self.pack_arrays(motion.q, motion.qd)

    def pack_arrays(self, q, qd) -> PhysXBuffers:
        """Like :meth:`pack` for raw canonical arrays ``q [frames, nq]``, ``qd [frames, nv]``."""
        q, qd = C.as_state_arrays(self.layout, q, qd)
        dt = q.dtype
        n = q.shape[0]
        rp, rr, rv, rw = self._root_pack(q, qd)
        d, iq, iv, ref = self._sc
        if d.size == self.num_dofs:  # scalar DOFs only (the G1): two gathers
            jp = np.take(q, iq[self._sc_sorted], axis=1)
            jv = np.take(qd, iv[self._sc_sorted], axis=1)
            if self._sc_ref_any:
                jp -= ref[self._sc_sorted].astype(dt)
        else:
            jp = np.empty((n, self.num_dofs), dtype=dt)
            jv = np.empty((n, self.num_dofs), dtype=dt)
            if d.size:
                jp[:, d] = np.take(q, iq, axis=1) - ref.astype(dt)
                jv[:, d] = np.take(qd, iv, axis=1)
        d, iq, iv = self._ball
        if d.size:
            quat = R.quat_normalize(q[:, iq])
            jp[:, d] = R.quat_to_rotvec(quat)
            jv[:, d] = R.quat_rotate_inverse(quat, qd[:, iv])
        if self._h3["dof"].size:
            self._pack_hinge3(q, qd, jp, jv)
        return PhysXBuffers(rp, rr, rv, rw, jp, jv)

    def _pack_hinge3(self, q, qd, jp, jv):
        """Every three-hinge group at once, component-wise on ``[frames, groups]`` arrays: the rotation
        ``Rx(a0) Ry(a1) Rz(a2)`` in the hinge-axes frame as a rotation vector, and the joint's angular
        velocity in child-frame components."""
        h = self._h3
        dt = q.dtype
        a = [
            (np.take(q, h["q"][:, k], axis=1) - h["ref"][:, k].astype(dt)) * h["sign"][:, k].astype(dt)
            for k in range(3)
        ]
        r = [np.take(qd, h["v"][:, k], axis=1) * h["sign"][:, k].astype(dt) for k in range(3)]
        c0, c1, c2 = (np.cos(0.5 * x) for x in a)
        s0, s1, s2 = (np.sin(0.5 * x) for x in a)
        c0c1, s0s1, s0c1, c0s1 = c0 * c1, s0 * s1, s0 * c1, c0 * s1
        w = c0c1 * c2 - s0s1 * s2  # q = qx(a0) qy(a1) qz(a2)
        x = s0c1 * c2 + c0s1 * s2
        y = c0s1 * c2 - s0c1 * s2
        z = s0s1 * c2 + c0c1 * s2
        # angular velocity in the parent joint frame: e_x r0 + Rx(a0) e_y r1 + Rx(a0) Ry(a1) e_z r2
        cos0, sin0, cos1, sin1 = np.cos(a[0]), np.sin(a[0]), np.cos(a[1]), np.sin(a[1])
        wx = r[0] + sin1 * r[2]
        wy = cos0 * r[1] - sin0 * cos1 * r[2]
        wz = sin0 * r[1] + cos0 * cos1 * r[2]
        # child-frame components: R(q)^T w, i.e. rotate by (w, -x, -y, -z)
        tx = 2.0 * (z * wy - y * wz)
        ty = 2.0 * (x * wz - z * wx)
        tz = 2.0 * (y * wx - x * wy)
        dof = h["dof"]
        jv[:, dof[:, 0]] = wx + w * tx - (y * tz - z * ty)
        jv[:, dof[:, 1]] = wy + w * ty - (z * tx - x * tz)
        jv[:, dof[:, 2]] = wz + w * tz - (x * ty - y * tx)
        # rotation vector, shortest (w >= 0)
        flip = np.where(w < 0, -1.0, 1.0).astype(dt)
        vn = np.sqrt(x * x + y * y + z * z)
        small = vn < 1e-7
        k = np.where(small, 2.0, 2.0 * np.arctan2(vn, np.abs(w)) / np.where(small, 1.0, vn)) * flip
        jp[:, dof[:, 0]] = k * x
        jp[:, dof[:, 1]] = k * y
        jp[:, dof[:, 2]] = k * z

    def _root_pack(self, q, qd):
        dt = q.dtype
        n = q.shape[0]
        if self._free is None:
            lay = self.layout
            rp = np.broadcast_to(lay.rest_positions[0].astype(dt), (n, 3)).copy()
            rr = np.broadcast_to(R.quat_wxyz_to_xyzw(lay.rest_rotations_wxyz[0]).astype(dt), (n, 4)).copy()
            return rp, rr, np.zeros((n, 3), dt), np.zeros((n, 3), dt)
        o, v = self._free.q_offset, self._free.qd_offset
        # component-wise on [frames] columns: normalise, reorder to XYZW, v_com = v + w x (R com)
        qw, qx, qy, qz = (q[:, o + 3 + k] for k in range(4))
        inv = 1.0 / np.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
        rr = np.empty((n, 4), dtype=dt)
        for k, comp in enumerate((qx, qy, qz, qw)):
            np.multiply(comp, inv, out=rr[:, k])
        qx, qy, qz, qw = rr[:, 0], rr[:, 1], rr[:, 2], rr[:, 3]
        cx, cy, cz = (float(c) for c in self._root_com)
        tx, ty, tz = 2.0 * (qy * cz - qz * cy), 2.0 * (qz * cx - qx * cz), 2.0 * (qx * cy - qy * cx)
        ex = cx + qw * tx + (qy * tz - qz * ty)
        ey = cy + qw * ty + (qz * tx - qx * tz)
        ez = cz + qw * tz + (qx * ty - qy * tx)
        wx, wy, wz = qd[:, v + 3], qd[:, v + 4], qd[:, v + 5]
        rv = np.empty((n, 3), dtype=dt)
        rv[:, 0] = qd[:, v] + (wy * ez - wz * ey)
        rv[:, 1] = qd[:, v + 1] + (wz * ex - wx * ez)
        rv[:, 2] = qd[:, v + 2] + (wx * ey - wy * ex)
        return np.ascontiguousarray(q[:, o : o + 3]), rr, rv, np.ascontiguousarray(qd[:, v + 3 : v + 6])

    def unpack(
        self,
        root_positions,
        root_rotations_xyzw,
        root_linear_velocities,
        root_angular_velocities,
        joint_positions,
        joint_velocities,
        *,
        fps: float,
        metadata=None,
    ):
        """PhysX root state ``[frames, 3/4/3/3]`` and DOF state ``[frames, dofs]`` (this adapter's DOF
        order) -> ``ArticulationMotion`` at ``fps``."""
        from ..animation.motion import ArticulationMotion

        q, qd = self.unpack_arrays(
            root_positions,
            root_rotations_xyzw,
            root_linear_velocities,
            root_angular_velocities,
            joint_positions,
            joint_velocities,
        )
        return ArticulationMotion(
            q, qd, fps, self.layout.model_signature, joint_names=self.layout.joint_names, metadata=metadata
        )

    def unpack_arrays(
        self,
        root_positions,
        root_rotations_xyzw,
        root_linear_velocities,
        root_angular_velocities,
        joint_positions,
        joint_velocities,
    ):
        """Canonical ``(q, qd)`` arrays from PhysX state (same dtype as the input)."""
        arrs = [
            np.asarray(a)
            for a in (
                root_positions,
                root_rotations_xyzw,
                root_linear_velocities,
                root_angular_velocities,
                joint_positions,
                joint_velocities,
            )
        ]
        dt = C.float_dtype(*arrs)
        rp, rr, rv, rw, jp, jv = [np.atleast_2d(a).astype(dt, copy=False) for a in arrs]
        src = self.layout.source
        for name, a, w in (
            ("root_positions", rp, 3),
            ("root_rotations_xyzw", rr, 4),
            ("root_linear_velocities", rv, 3),
            ("root_angular_velocities", rw, 3),
            ("joint_positions", jp, self.num_dofs),
            ("joint_velocities", jv, self.num_dofs),
        ):
            C.check_2d(name, a, w, source=src)
        n = jp.shape[0]
        lay = self.layout
        q = np.tile(lay.neutral(dtype=dt), (n, 1))
        qd = np.zeros((n, lay.nv), dtype=dt)
        if self._free is not None:
            o, v = self._free.q_offset, self._free.qd_offset
            quat = R.quat_normalize(R.quat_xyzw_to_wxyz(rr))
            q[:, o : o + 3] = rp
            q[:, o + 3 : o + 7] = quat
            qd[:, v + 3 : v + 6] = rw
            qd[:, v : v + 3] = rv - np.cross(rw, R.quat_rotate(quat, self._root_com.astype(dt)))
        d, iq, iv, ref = self._sc
        if d.size:
            q[:, iq] = jp[:, d] + ref.astype(dt)
            qd[:, iv] = jv[:, d]
        d, iq, iv = self._ball
        if d.size:
            quat = R.quat_from_rotvec(jp[:, d])
            q[:, iq] = quat
            qd[:, iv] = R.quat_rotate(quat, jv[:, d])
        h = self._h3
        if h["dof"].size:
            rot_joint = R.quat_from_rotvec(jp[:, h["dof"]])
            sign = h["sign"].astype(dt)
            angles = R.quat_to_euler(rot_joint, "xyz", extrinsic=False)
            q[:, h["q"].reshape(-1)] = (angles * sign + h["ref"].astype(dt)).reshape(n, -1)
            w_parent = R.quat_rotate(rot_joint, jv[:, h["dof"]])
            qd[:, h["v"].reshape(-1)] = (_w_to_euler_xyz_rates(angles, w_parent) * sign).reshape(n, -1)
        return q, qd

    # -- MotionLibrary protocol ------------------------------------------------------------------
    def prepare_motion(self, motion, *, skeleton_motion=None) -> dict:
        """Per-frame PhysX arrays for one clip: ``root_positions``, ``root_rotations_xyzw``,
        ``root_linear_velocities``, ``root_angular_velocities``, ``joint_positions``, ``joint_velocities``.
        A ``SkeletonMotion`` is mapped onto the layout first."""
        am = C.as_articulation_motion(self.layout, motion, skeleton_motion=skeleton_motion)
        buf = self.pack(am)
        return {k: getattr(buf, k) for k in _FIELDS}

    def pack_sample(self, frames0: dict, frames1: dict, blend, *, root_offset=None) -> PhysXBuffers:
        """Blend gathered frames (torch ``[n, ...]``): positions lerp, the root quaternion and every
        spherical DOF triple slerp (through quaternions, shortest path), velocities lerp;
        ``root_offset [n, 3]`` is added to the root position."""
        out = {}
        rp = C.blend_frames(frames0["root_positions"], frames1["root_positions"], blend)
        if root_offset is not None:
            rp = rp + root_offset.to(rp.dtype)
        out["root_positions"] = rp
        out["root_rotations_xyzw"] = C.blend_frames(
            frames0["root_rotations_xyzw"],
            frames1["root_rotations_xyzw"],
            blend,
            np.array([[0, 1, 2, 3]]),
        )
        for k in ("root_linear_velocities", "root_angular_velocities", "joint_velocities"):
            out[k] = C.blend_frames(frames0[k], frames1[k], blend)
        jp0, jp1 = frames0["joint_positions"], frames1["joint_positions"]
        jp = C.blend_frames(jp0, jp1, blend)
        if self._exp_cols.size:
            t = blend.to(jp.dtype).reshape(-1, 1)
            parts = C.slerp_rotvec_columns(jp0, jp1, t, self._exp_cols)
            for c in range(3):
                jp[:, C.torch_index(np.ascontiguousarray(self._exp_cols[:, c]), jp)] = parts[c]
        out["joint_positions"] = jp
        return PhysXBuffers(**out)

    # -- articulation check ------------------------------------------------------------------------
    def validate_articulation(self, articulation) -> PhysXArticulationMatch:
        """Check a live articulation or view against the layout and this adapter's DOF order.

        Reads ``articulation.dof_names`` (required) and, when present, ``body_names``/``link_names``,
        ``dof_count`` and ``is_fixed_base``; never assumes an order. Raises
        :class:`~kangengine.errors.LayoutMismatch` listing every mismatch (missing, extra or misplaced DOFs,
        DOF counts, links, fixed versus floating base).
        """
        names = [str(n) for n in articulation.dof_names]
        problems: list[str] = []
        if len(names) != self.num_dofs:
            problems.append(f"articulation has {len(names)} DOFs; the layout gives PhysX {self.num_dofs}")
        count = getattr(articulation, "dof_count", None)
        if isinstance(count, int | np.integer) and count != len(names):
            problems.append(f"articulation reports dof_count={count} but {len(names)} DOF names")
        pos = {n: i for i, n in enumerate(names)}
        used: set[str] = set()
        joint_of_dof = []
        for g, s in zip(self._groups, self._start):
            got = _dof_names_for(g, names)
            label = "+".join(self.layout.blocks[i].joint_name for i in g.blocks)
            joint_of_dof += [label] * g.ndof
            if not got:
                problems.append(
                    f"{g.kind} joint of body {g.body_name!r} ({label}): no DOF named "
                    f"{' or '.join(repr(x) for x in _default_dof_names(g)[:1])} in the articulation"
                )
                continue
            used.update(got)
            where = [pos[n] for n in got]
            if len(got) != g.ndof:
                problems.append(
                    f"body {g.body_name!r}: {len(got)} DOFs in the articulation ({', '.join(got)}); "
                    f"expected {g.ndof} ({g.kind})"
                )
            elif where != list(range(s, s + g.ndof)):
                problems.append(
                    f"body {g.body_name!r}: DOFs {', '.join(got)} are articulation columns {where}; this "
                    f"adapter packs them at {list(range(s, s + g.ndof))} (pass articulation= to follow "
                    "its order)"
                )
        extra = [n for n in names if n not in used]
        if extra:
            problems.append(f"articulation DOFs that the layout lacks: {', '.join(repr(n) for n in extra)}")
        links = getattr(articulation, "body_names", None) or getattr(articulation, "link_names", None)
        if links:
            links = [str(x).rsplit("/", 1)[-1] for x in links]
            missing = [b for b in self.layout.body_names if b not in links]
            unknown = [b for b in links if b not in self.layout.body_names]
            if missing:
                problems.append(f"links missing from the articulation: {', '.join(repr(b) for b in missing)}")
            if unknown:
                problems.append(f"articulation links that the layout lacks: {', '.join(repr(b) for b in unknown)}")
            if links and links[0] != self.layout.body_names[0]:
                problems.append(
                    f"articulation root link is {links[0]!r}; the layout's root is {self.layout.body_names[0]!r}"
                )
        fixed = getattr(articulation, "is_fixed_base", None)
        if isinstance(fixed, bool | np.bool_) and bool(fixed) == (self._free is not None):
            problems.append(
                f"articulation is {'fixed' if fixed else 'floating'}-base; the layout "
                f"{'has' if self._free is not None else 'has no'} free root"
            )
        if problems:
            raise LayoutMismatch(C.format_mismatches("PhysX articulation", problems), path=self.layout.source)
        return PhysXArticulationMatch(dof_names=tuple(names), joint_of_dof=tuple(joint_of_dof))


# -- helpers ---------------------------------------------------------------------------------------------

_FIELDS = (
    "root_positions",
    "root_rotations_xyzw",
    "root_linear_velocities",
    "root_angular_velocities",
    "joint_positions",
    "joint_velocities",
)


class _Names:
    def __init__(self, dof_names):
        self.dof_names = list(dof_names)


def _cat(parts):
    if type(parts[0]).__module__.startswith("torch"):
        import torch

        return torch.cat(parts, dim=-1)
    return np.concatenate(parts, axis=-1)


def _groups(layout):
    """One group per body with DOFs, in PhysX's link order (see :func:`_physx_link_order`)."""
    by_body: dict[int, list[int]] = {}
    for i, b in enumerate(layout.blocks):
        if b.joint_type not in (JointType.FIXED, JointType.FREE):
            by_body.setdefault(b.body_index, []).append(i)
    groups, unsupported = {}, []
    for body, idx in by_body.items():
        group, reason = _group(layout, body, idx)
        if group is None:
            unsupported.append(reason)
        else:
            groups[body] = group
    order = _physx_link_order(layout, groups)
    return [groups[b] for b in order if b in groups], unsupported


def _group(layout, body, idx):
    """The PhysX joint of one body's blocks, or ``(None, reason)`` when PhysX has none for them."""
    types = [layout.blocks[i].joint_type for i in idx]
    name = layout.body_names[body]
    jn = tuple(layout.blocks[i].joint_name for i in idx)
    if len(idx) == 1 and types[0] in (JointType.HINGE, JointType.SLIDE):
        return _Group(types[0].value, body, name, tuple(idx), jn, 1), None
    if len(idx) == 1 and types[0] is JointType.BALL:
        return _Group("ball", body, name, tuple(idx), jn, 3), None
    if len(idx) == 3 and all(t is JointType.HINGE for t in types):
        axes = np.array([layout.blocks[i].axis for i in idx], dtype=np.float64)
        anchors = np.array([layout.blocks[i].anchor for i in idx], dtype=np.float64)
        if not np.allclose(axes @ axes.T, np.eye(3), atol=1e-6):
            return None, (
                f"{name!r} (hinges {', '.join(jn)}: axes not orthogonal; a PhysX spherical joint turns about the "
                "three orthonormal axes of its joint frame)"
            )
        if not np.allclose(anchors, anchors[0], atol=1e-9):
            return None, f"{name!r} (hinges {', '.join(jn)}: different anchors; a PhysX joint has one anchor)"
        return _Group("hinge3", body, name, tuple(idx), (name, "_".join(jn), jn[0]), 3), None
    if all(t is JointType.HINGE for t in types) and len(idx) == 2:
        return None, (
            f"{name!r} (hinges {', '.join(jn)}: a PhysX spherical joint with a locked axis moves by exponential "
            "coordinates restricted to its free axes, exp(p0 a0 + p1 a1), while two MJCF hinges compose "
            "R(a0, q0) R(a1, q1), whose rotation vector leaves that plane (by about q0 q1 / 2 along a0 x a1) "
            "as soon as both hinges turn; no PhysX joint reproduces the pair)"
        )
    return None, (
        f"{name!r} ({', '.join(f'{n} {t.value}' for n, t in zip(jn, types))}: PhysX gives each link one joint, "
        "and no PhysX joint combines these)"
    )


def _link_joint_names(layout, dof_base: dict[int, str]) -> dict[int, str]:
    """The name of the PhysX joint prim each non-root link is assumed to have: the DOF base name for links
    with DOFs, the layout's fixed joint name (URDF) or else the body name for welded links."""
    out = {}
    for b in layout.blocks:
        if b.joint_type is JointType.FIXED:
            out.setdefault(b.body_index, b.joint_name)
    for b, name in enumerate(layout.body_names):
        out.setdefault(b, name)
    out.update(dof_base)
    return out


#: the order PhysX takes the children of a link in, by the type of their joint (fixed, revolute, prismatic,
#: spherical, then D6), each type sorted by joint prim path
_JOINT_TYPE_RANK = {"fixed": 0, "hinge": 1, "slide": 2, "ball": 3, "hinge3": 4}


def _physx_link_order(layout, groups: dict) -> tuple[int, ...]:
    """Body indices in the order PhysX numbers an articulation's links: breadth-first from the root; the
    children of each link by the type of their inbound joint (fixed, revolute, prismatic, spherical, D6),
    and within a type by the joint prim's path in byte order (with the joints of an articulation in one
    scope, or each under its parent link, that is their name). Observed with ``ovphysx`` on the AMP, SMPL and
    G1 humanoids and on renamed, re-scoped and reordered copies of them (``tests/test_adapters_physx.py``);
    the order the prims are authored in plays no part."""
    parents = layout.parent_indices
    names = _link_joint_names(layout, {b: g.names[0] for b, g in groups.items()})
    rank = {b: _JOINT_TYPE_RANK[groups[b].kind] if b in groups else 0 for b in range(len(parents))}
    children: list[list[int]] = [[] for _ in parents]
    roots = []
    for b, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(b)
    out: list[int] = []
    queue = list(roots)
    while queue:
        b = queue.pop(0)
        out.append(b)
        queue.extend(sorted(children[b], key=lambda c: (rank[c], names[c])))
    return tuple(out)


def _default_dof_names(g: _Group) -> list[str]:
    if g.ndof == 1:
        return [g.names[0]]
    return [f"{g.names[0]}:{k}" for k in range(g.ndof)]


def _dof_names_for(g: _Group, names) -> list[str]:
    """The articulation DOF names of group ``g`` (first candidate joint name that is present)."""
    have = set(names)
    for base in g.names:
        if g.ndof == 1 and base in have:
            return [base]
        cand = [f"{base}:{k}" for k in range(g.ndof)]
        if any(c in have for c in cand):
            return [c for c in cand if c in have]
    return []


def _euler_xyz_rates_to_w(angles, rates):
    """Angular velocity (parent joint frame) of ``R = Rx(a0) Ry(a1) Rz(a2)`` from the angle rates
    (``angles``, ``rates``: ``(..., 3)``)."""
    a0, a1 = angles[..., 0], angles[..., 1]
    c0, s0, c1, s1 = np.cos(a0), np.sin(a0), np.cos(a1), np.sin(a1)
    r0, r1, r2 = rates[..., 0], rates[..., 1], rates[..., 2]
    # columns: e_x, Rx(a0) e_y, Rx(a0) Ry(a1) e_z
    wx = r0 + s1 * r2
    wy = c0 * r1 - s0 * c1 * r2
    wz = s0 * r1 + c0 * c1 * r2
    return np.stack([wx, wy, wz], axis=-1)


def _w_to_euler_xyz_rates(angles, w):
    """Inverse of :func:`_euler_xyz_rates_to_w` (singular at the middle angle +-pi/2, gimbal lock)."""
    a0, a1 = angles[..., 0], angles[..., 1]
    c0, s0, c1, s1 = np.cos(a0), np.sin(a0), np.cos(a1), np.sin(a1)
    wx, wy, wz = w[..., 0], w[..., 1], w[..., 2]
    r2 = (-s0 * wy + c0 * wz) / c1
    r1 = c0 * wy + s0 * wz
    r0 = wx - s1 * r2
    return np.stack([r0, r1, r2], axis=-1)

"""`ArticulationCoordinateLayout`: how an articulation's generalized coordinates ``q`` and velocities
``qd`` are laid out, and the manifold maps between them.

Blocks (one per joint, in body order then joint order):

=========  =================================  =====  =======================================  =====
joint      ``q``                              dim    ``qd``                                   dim
=========  =================================  =====  =======================================  =====
FIXED      none                               0      none                                     0
HINGE      angle (rad)                        1      angular velocity (rad/s)                 1
SLIDE      position (m)                       1      linear velocity (m/s)                    1
BALL       quaternion (w, x, y, z)            4      angular velocity (x, y, z), parent frame 3
FREE       position (x, y, z) + quaternion    7      linear velocity of the root body origin  6
           (w, x, y, z), both in world               in world + angular velocity in world
=========  =================================  =====  =======================================  =====

Canonical tangent convention: rotations update by *left* multiplication, ``quat <- exp(w dt) * quat``,
with ``w`` in the parent frame (the world for the free root); translations add. ``integrate`` applies
that update and ``difference`` is its exact inverse. Hinge and slide values mean what MuJoCo's ``qpos``
means: the joint is at its modelled pose when its value equals the joint's ``ref``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..asset.desc import ArticulationDesc, JointType
from ..errors import ShapeError, UnknownNameError
from .kinematics import BodyKinematics, JointStep, TreePlan

__all__ = ["CoordinateBlock", "ArticulationCoordinateLayout", "forward_kinematics"]


@dataclass(frozen=True)
class CoordinateBlock:
    """One joint's slice of ``q`` and ``qd``.

    Attributes:
        joint_name: the joint's name (a free root added by the layout is named ``{root body}_free``).
        joint_type: :class:`~kangengine.asset.JointType`.
        body_index, body_name: the body the joint moves (index into ``layout.body_names``).
        q_offset, q_dim, qd_offset, qd_dim: slices ``q[..., q_offset:q_offset+q_dim]`` and
            ``qd[..., qd_offset:qd_offset+qd_dim]``.
        axis: unit axis in the body frame (hinge, slide), else ``None``.
        anchor: joint position in the body frame (m).
        limits: ``(lower, upper)`` when limited, else ``None`` (ball: ``(0, max_angle)``).
        ref: the value at the modelled pose (hinge, slide), else 0.
    """

    joint_name: str
    joint_type: JointType
    body_index: int
    body_name: str
    q_offset: int
    q_dim: int
    qd_offset: int
    qd_dim: int
    axis: tuple[float, float, float] | None
    anchor: tuple[float, float, float]
    limits: tuple[float, float] | None
    ref: float

    @property
    def q_slice(self) -> slice:
        return slice(self.q_offset, self.q_offset + self.q_dim)

    @property
    def qd_slice(self) -> slice:
        return slice(self.qd_offset, self.qd_offset + self.qd_dim)


def _num(x: float) -> str:
    return f"{float(x) + 0.0:.9g}"


@dataclass(frozen=True, eq=False)
class ArticulationCoordinateLayout:
    """Ordered coordinate blocks of an articulation plus the rest transforms forward kinematics needs.

    Build it with :meth:`from_data`. Attributes:
        blocks: tuple of :class:`CoordinateBlock`.
        body_names: bodies in the loader's order (parent first).
        parent_indices: ``[bodies]`` parent index, -1 for the root.
        rest_positions: ``[bodies, 3] float64`` m, translation of ``parent_from_body`` (root: in world).
        rest_rotations_wxyz: ``[bodies, 4] float64``, rotation of ``parent_from_body``.
        free_root: whether the root has a FREE block (always ``blocks[0]`` then).
        nq, nv: sizes of ``q`` and ``qd``.
        model_signature: 16 hex digits of SHA-256 over a canonical text of: body names, parent indices,
            rest positions and rotations, and for every block its joint name, type, body, offsets, axis,
            anchor, ref and limits (numbers at 9 significant digits). Equal signatures mean ``q`` means
            the same thing in both layouts.
        source: the file the description came from.
        body_coms: ``[bodies, 3] float64`` m, centre of mass of each body in its body frame (from the
            description; not part of ``model_signature``, since it does not change what ``q`` means). Used by
            adapters whose velocities refer to the COM (Newton, PhysX).
    """

    blocks: tuple[CoordinateBlock, ...]
    body_names: tuple[str, ...]
    parent_indices: tuple[int, ...]
    rest_positions: np.ndarray
    rest_rotations_wxyz: np.ndarray
    free_root: bool
    nq: int
    nv: int
    model_signature: str
    source: str | None = None
    body_coms: np.ndarray | None = None

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_data(cls, *, data: ArticulationDesc, free_root: bool = True) -> ArticulationCoordinateLayout:
        """Lay out the coordinates of ``data``.

        Args:
            data: the articulation (any loader, any order; the layout keeps its body order).
            free_root: ``True``: the root body gets a FREE block first (the file's free/floating joint
                when it has one, else one added and named ``{root}_free``). ``False``: the root stays
                at its modelled pose; a free joint in the file is dropped.
        """
        blocks: list[CoordinateBlock] = []
        qo = vo = 0

        def add(name, jt, b, axis, anchor, limits, ref):
            nonlocal qo, vo
            blocks.append(
                CoordinateBlock(
                    joint_name=name,
                    joint_type=jt,
                    body_index=b,
                    body_name=data.bodies[b].name,
                    q_offset=qo,
                    q_dim=jt.nq,
                    qd_offset=vo,
                    qd_dim=jt.nv,
                    axis=None if axis is None else tuple(float(a) for a in axis),
                    anchor=tuple(float(a) for a in anchor),
                    limits=limits,
                    ref=float(ref),
                )
            )
            qo += jt.nq
            vo += jt.nv

        root = 0
        root_joints = [data.joints[j] for j in data.bodies[root].joints]
        has_free = bool(root_joints) and root_joints[0].type is JointType.FREE
        if free_root:
            name = root_joints[0].name if has_free else f"{data.bodies[root].name}_free"
            if not has_free and name in data.joint_names:
                name = f"{name}_joint"
            add(name, JointType.FREE, root, None, (0.0, 0.0, 0.0), None, 0.0)
        for b, body in enumerate(data.bodies):
            for j in body.joints:
                jd = data.joints[j]
                if jd.type is JointType.FREE:
                    continue  # used above (free_root) or dropped
                scalar = jd.type in (JointType.HINGE, JointType.SLIDE)
                add(jd.name, jd.type, b, jd.axis if scalar else None, jd.anchor, jd.range, jd.ref if scalar else 0.0)
        rest_p = np.array([b.pos for b in data.bodies], dtype=np.float64)
        rest_r = np.array([b.quat_wxyz / np.linalg.norm(b.quat_wxyz) for b in data.bodies], dtype=np.float64)
        parents = tuple(int(b.parent) for b in data.bodies)
        names = tuple(b.name for b in data.bodies)
        sig = _signature(names, parents, rest_p, rest_r, blocks, free_root)
        coms = np.array([b.com for b in data.bodies], dtype=np.float64).reshape(-1, 3)
        for arr in (rest_p, rest_r, coms):
            arr.setflags(write=False)
        return cls(
            blocks=tuple(blocks),
            body_names=names,
            parent_indices=parents,
            rest_positions=rest_p,
            rest_rotations_wxyz=rest_r,
            free_root=free_root,
            nq=qo,
            nv=vo,
            model_signature=sig,
            source=data.source,
            body_coms=coms,
        )

    # -- names and limits ------------------------------------------------------------------------------
    @property
    def num_bodies(self) -> int:
        return len(self.body_names)

    @property
    def joint_names(self) -> tuple[str, ...]:
        return tuple(b.joint_name for b in self.blocks)

    @cached_property
    def dof_names(self) -> tuple[str, ...]:
        """``[nv]`` names: hinge/slide: the joint name; ball: ``{joint}_rx/_ry/_rz``; free:
        ``{joint}_tx/_ty/_tz/_rx/_ry/_rz``."""
        out = []
        for b in self.blocks:
            if b.joint_type is JointType.FREE:
                out += [f"{b.joint_name}_{s}" for s in ("tx", "ty", "tz", "rx", "ry", "rz")]
            elif b.joint_type is JointType.BALL:
                out += [f"{b.joint_name}_{s}" for s in ("rx", "ry", "rz")]
            elif b.qd_dim == 1:
                out.append(b.joint_name)
        return tuple(out)

    @cached_property
    def q_names(self) -> tuple[str, ...]:
        """``[nq]`` names: free: ``{joint}_x/_y/_z/_qw/_qx/_qy/_qz``; ball: ``{joint}_qw..qz``."""
        out = []
        for b in self.blocks:
            if b.joint_type is JointType.FREE:
                out += [f"{b.joint_name}_{s}" for s in ("x", "y", "z", "qw", "qx", "qy", "qz")]
            elif b.joint_type is JointType.BALL:
                out += [f"{b.joint_name}_{s}" for s in ("qw", "qx", "qy", "qz")]
            elif b.q_dim == 1:
                out.append(b.joint_name)
        return tuple(out)

    @cached_property
    def dof_lower(self) -> np.ndarray:
        """``[nv] float64``: lower limit of each hinge/slide DOF (-inf where unlimited or not scalar)."""
        return self._limit_array(0, -np.inf)

    @cached_property
    def dof_upper(self) -> np.ndarray:
        """``[nv] float64``: upper limit of each hinge/slide DOF (+inf where unlimited or not scalar)."""
        return self._limit_array(1, np.inf)

    def _limit_array(self, k: int, fill: float) -> np.ndarray:
        out = np.full(self.nv, fill)
        for b in self.blocks:
            if b.qd_dim == 1 and b.limits is not None:
                out[b.qd_offset] = b.limits[k]
        out.setflags(write=False)
        return out

    def block(self, joint_name: str) -> CoordinateBlock:
        """The block of ``joint_name``; :class:`UnknownNameError` listing the joints otherwise."""
        for b in self.blocks:
            if b.joint_name == joint_name:
                return b
        raise UnknownNameError(
            f"no joint {joint_name!r} in the layout; joints are: {', '.join(self.joint_names)}", path=self.source
        )

    def body_index(self, name: str) -> int:
        """Index of body ``name``; :class:`UnknownNameError` listing the bodies otherwise."""
        try:
            return self.body_names.index(name)
        except ValueError:
            raise UnknownNameError(
                f"no body {name!r}; bodies are: {', '.join(self.body_names)}", path=self.source
            ) from None

    def blocks_of_body(self, body: int) -> tuple[CoordinateBlock, ...]:
        return tuple(b for b in self.blocks if b.body_index == body)

    def neutral(self, dtype=np.float64) -> np.ndarray:
        """``[nq]`` q at the modelled pose: the root at its rest transform, hinges and slides at ``ref``,
        balls at identity."""
        q = np.zeros(self.nq, dtype=dtype)
        for b in self.blocks:
            if b.joint_type is JointType.FREE:
                q[b.q_offset : b.q_offset + 3] = self.rest_positions[b.body_index]
                q[b.q_offset + 3 : b.q_offset + 7] = self.rest_rotations_wxyz[b.body_index]
            elif b.joint_type is JointType.BALL:
                q[b.q_offset] = 1.0
            elif b.q_dim == 1:
                q[b.q_offset] = b.ref
        return q

    def _check(self, name, x, n):
        if x.shape[-1] != n:
            raise ShapeError(
                f"last dimension is {x.shape[-1]}; expected {n} for this layout", path=self.source, item=name
            )

    @cached_property
    def tangent_runs(self) -> tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]]:
        """``(runs, rotations)``: contiguous ``(q offset, qd offset, length)`` runs of the vector part
        (hinges, slides, free translations), and the ``(q offset, qd offset)`` of every quaternion (free
        rotation, balls). The maps below use plain slices: no index arrays, no host-device copies."""
        runs: list[list[int]] = []
        rots: list[tuple[int, int]] = []
        for b in self.blocks:
            if b.joint_type in (JointType.HINGE, JointType.SLIDE):
                r = [b.q_offset, b.qd_offset, 1]
            elif b.joint_type is JointType.FREE:
                r = [b.q_offset, b.qd_offset, 3]
                rots.append((b.q_offset + 3, b.qd_offset + 3))
            else:
                if b.joint_type is JointType.BALL:
                    rots.append((b.q_offset, b.qd_offset))
                continue
            last = runs[-1] if runs else None
            if last and last[0] + last[2] == r[0] and last[1] + last[2] == r[1]:
                last[2] += r[2]
            else:
                runs.append(r)
        return tuple(tuple(r) for r in runs), tuple(rots)

    def integrate(self, q, qd, dt=1.0):
        """Move ``q`` along ``qd`` for time ``dt`` on the configuration manifold.

        Args:
            q: ``[..., nq]`` float, numpy or torch (any device; no host-device transfer happens).
            qd: ``[..., nv]`` in the canonical tangent convention (see the module docstring).
            dt: seconds, a scalar or ``[...]``.
        Returns:
            ``[..., nq]``: scalars ``q + qd dt``; quaternions ``exp(w dt) * quat`` (normalised).
        """
        from .. import rotations as R

        self._check("q", q, self.nq)
        self._check("qd", qd, self.nv)
        dt = _as_dt(dt, q)
        dtv = dt[..., None] if getattr(dt, "ndim", 0) else dt
        runs, rots = self.tangent_runs
        out = _copy(q)
        for q0, v0, k in runs:
            out[..., q0 : q0 + k] = q[..., q0 : q0 + k] + qd[..., v0 : v0 + k] * dtv
        for q0, v0 in rots:
            w = qd[..., v0 : v0 + 3] * dtv
            out[..., q0 : q0 + 4] = R.quat_normalize(R.quat_multiply(R.quat_from_rotvec(w), q[..., q0 : q0 + 4]))
        return out

    def difference(self, q1, q0, dt=1.0):
        """The tangent ``qd`` with ``integrate(q0, qd, dt) == q1`` (exact inverse of :meth:`integrate`).

        Args:
            q1, q0: ``[..., nq]`` (any device; no host-device transfer happens). dt: seconds, scalar or
                ``[...]``.
        Returns:
            ``[..., nv]``: scalars ``(q1 - q0) / dt``; rotations ``log(q1 * q0^-1) / dt`` (shortest
            rotation, parent/world frame).
        """
        from .. import rotations as R

        self._check("q1", q1, self.nq)
        self._check("q0", q0, self.nq)
        dt = _as_dt(dt, q1)
        dtv = dt[..., None] if getattr(dt, "ndim", 0) else dt
        runs, rots = self.tangent_runs
        shape = tuple(np.broadcast_shapes(tuple(q1.shape[:-1]), tuple(q0.shape[:-1]))) + (self.nv,)
        out = _zeros(q1, shape)
        for a, v0, k in runs:
            out[..., v0 : v0 + k] = (q1[..., a : a + k] - q0[..., a : a + k]) / dtv
        for a, v0 in rots:
            rel = R.quat_multiply(
                R.quat_normalize(q1[..., a : a + 4]), R.quat_conjugate(R.quat_normalize(q0[..., a : a + 4]))
            )
            out[..., v0 : v0 + 3] = R.quat_to_rotvec(rel) / dtv
        return out

    def interpolate(self, q0, q1, t):
        """Geodesic interpolation ``integrate(q0, difference(q1, q0) * t)``: lerp for scalars and
        positions, slerp (shortest path) for quaternions.

        Args:
            q0, q1: ``[..., nq]``. t: scalar or ``[...]`` blend weight (0 gives ``q0``, 1 gives ``q1``).
        Returns:
            ``[..., nq]``.
        """
        return self.integrate(q0, self.difference(q1, q0), t)

    # -- kinematics ---------------------------------------------------------------------------------
    @cached_property
    def tree_plan(self) -> TreePlan:
        """The plan the shared forward kinematics runs (:mod:`kangengine.animation.kinematics`)."""
        steps: list[list[JointStep]] = [[] for _ in self.body_names]
        for b in self.blocks:
            if b.joint_type is JointType.FIXED:
                continue
            steps[b.body_index].append(
                JointStep(
                    kind=b.joint_type.value,
                    q_offset=b.q_offset,
                    axis=b.axis if b.axis is not None else (0.0, 0.0, 1.0),
                    anchor=b.anchor,
                    ref=b.ref,
                )
            )
        return TreePlan(
            parents=self.parent_indices,
            rest_positions=tuple(tuple(float(x) for x in r) for r in self.rest_positions),
            rest_rotations=tuple(tuple(float(x) for x in r) for r in self.rest_rotations_wxyz),
            steps=tuple(tuple(s) for s in steps),
        )

    @cached_property
    def kinematics(self) -> BodyKinematics:
        return BodyKinematics(self.tree_plan)

    def local_transforms(self, q):
        """``parent_from_body`` of every body at ``q``.

        Args:
            q: ``[..., nq]`` numpy or torch.
        Returns:
            ``(positions [..., bodies, 3], rotations_wxyz [..., bodies, 4])`` in the parent body frame (the
            world for the root).
        """
        self._check("q", q, self.nq)
        return self.kinematics.from_coordinates(q, local=True)


def forward_kinematics(layout: ArticulationCoordinateLayout, q):
    """World transforms of every body at ``q``.

    Args:
        layout: the coordinate layout.
        q: ``[..., nq]`` float32/float64, numpy array or torch tensor (any device).
    Returns:
        ``(body_positions [..., bodies, 3], body_rotations_wxyz [..., bodies, 4])``: ``world_from_body``
        origin positions (m) and rotations, bodies in ``layout.body_names`` order; same type, dtype and
        device as ``q``. Equal to MuJoCo's ``xpos``/``xquat`` after ``mj_kinematics`` (up to the sign of
        the quaternion).
    """
    layout._check("q", q, layout.nq)
    return layout.kinematics.from_coordinates(q)


def _signature(names, parents, rest_p, rest_r, blocks, free_root) -> str:
    doc = {
        "version": 1,
        "free_root": bool(free_root),
        "bodies": [
            [n, int(p), [_num(x) for x in rp], [_num(x) for x in rr]]
            for n, p, rp, rr in zip(names, parents, rest_p, rest_r)
        ],
        "blocks": [
            [
                b.joint_name,
                b.joint_type.value,
                b.body_index,
                b.q_offset,
                b.qd_offset,
                None if b.axis is None else [_num(x) for x in b.axis],
                [_num(x) for x in b.anchor],
                _num(b.ref),
                None if b.limits is None else [_num(x) for x in b.limits],
            ]
            for b in blocks
        ],
    }
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _as_dt(dt, like):
    if isinstance(dt, (int, float)):
        return float(dt)  # a Python scalar keeps the array's dtype and needs no device copy
    if _is_torch(like):
        import torch

        return torch.as_tensor(dt, dtype=like.dtype, device=like.device)
    return np.asarray(dt, dtype=like.dtype)


def _copy(x):
    return x.clone() if _is_torch(x) else np.array(x, copy=True)


def _zeros(like, shape):
    if _is_torch(like):
        import torch

        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return np.zeros(shape, dtype=like.dtype)

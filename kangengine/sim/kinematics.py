"""Velocity kinematics of a :class:`~kangengine.sim.Model`, batched over worlds.

Positions come from the foundation's forward kinematics (``layout.kinematics.joint_frames``: the one FK
implementation, which also reports every joint's world anchor and every DOF's world axis); this module
turns them into the motion of every DOF as a spatial vector and into link Jacobians and velocities.

Internally a DOF's motion is a 6-vector ``(angular, linear)`` in world axes, the linear part being the
velocity of the material point at the *reference point* (the root body origin at this instant) moving
with the DOF. Public results use the link origin instead (MuJoCo's ``mj_jacBody`` convention) and order
``(linear, angular)``.

Internal layout ("structure of arrays", worlds innermost, like the FK's columns): a vector quantity over
bodies (or DOFs, or contact points) and worlds is a tuple of its components, each a contiguous ``[n, W]``
tensor, so element-wise maths runs on contiguous memory, picking entities is a row copy, and sums over
the tree are matrix products ``[m, n] @ [n, W]``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ..errors import ShapeError
from .model import Model

__all__ = [
    "LinkVelocities",
    "link_jacobians",
    "link_velocities",
    "link_transforms",
    "Comps",
    "Frames",
    "compute_frames",
    "body_twists",
    "flat_batch",
    "cross",
    "rotate",
    "rows",
    "gather",
    "scatter_sum",
    "subtree_sums_",
    "dof_path_sums",
]

Comps = tuple  # tuple of [n, W] tensors


@dataclass(frozen=True, eq=False)
class Frames:
    """Positions and DOF motions of ``W`` worlds at one configuration (what dynamics and contact use).

    Attributes:
        origin: 3 x ``[1, W]`` m, world position of the reference point (root body origin).
        body_pos: 3 x ``[B, W]`` m, link origins in world.
        body_rot: 9 x ``[B, W]``, rotation matrices ``world_from_body`` (row-major).
        body_quat: ``[W, B, 4]`` WXYZ ``world_from_body``.
        motion: 6 x ``[nv, W]`` per DOF: (angular velocity, velocity of the point at ``origin``) for a unit
            DOF rate, world axes (views of ``motion_stack``).
        motion_stack: ``[nv, 6, W]`` the same, stacked.
        motion_rows: ``[W, nv, 6]`` the same, world-major (for the dense joint-space products; computed
            on first use).
    """

    origin: Comps
    body_pos: Comps
    body_rot: Comps
    body_quat: torch.Tensor
    motion: Comps
    motion_stack: torch.Tensor

    @cached_property
    def motion_rows(self) -> torch.Tensor:
        return self.motion_stack.permute(2, 0, 1).contiguous()


@dataclass(frozen=True, eq=False)
class LinkVelocities:
    """Link twists in world axes.

    Attributes:
        linear: ``[..., B, 3]`` m/s, velocity of each link origin.
        angular: ``[..., B, 3]`` rad/s, angular velocity.
    """

    linear: torch.Tensor
    angular: torch.Tensor


# -- component helpers ---------------------------------------------------------------------------------


def cross(a: Comps, b: Comps) -> Comps:
    ax, ay, az = a
    bx, by, bz = b
    return (ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx)


def _soa(x: torch.Tensor) -> Comps:
    """``[W, n, k]`` -> k x ``[n, W]`` contiguous."""
    return x.permute(2, 1, 0).contiguous().unbind(0)


def rows(c: Comps) -> torch.Tensor:
    """k x ``[n, W]`` -> ``[W, n, k]`` (a view of one stacked copy)."""
    return torch.stack(c, dim=-1).transpose(0, 1)


def _tree_product(c: Comps, mat: torch.Tensor) -> Comps:
    """``sum_j mat[i, j] x[j]`` for every component: k x ``[n, W]`` and ``mat [m, n]`` -> k x ``[m, W]``
    (one matrix product ``[m, n] @ [n, k W]``)."""
    x = torch.stack(c, dim=1)
    n, k, w = x.shape
    return (mat @ x.view(n, k * w)).view(-1, k, w).unbind(1)


def subtree_sums_(model: Model, x: torch.Tensor) -> torch.Tensor:
    """In place, ``x [B, k, W]``: every body's row becomes the sum over its subtree (leaves first, one
    indexed add per tree level). Returns ``x``."""
    for child, parent in reversed(model.step_cache.body_levels):
        x.index_add_(0, parent, x.index_select(0, child))
    return x


def _path_sums_(model: Model, x: torch.Tensor) -> torch.Tensor:
    """In place, ``x [B, k, W]``: every body's row becomes the sum over the path from the root to it
    (root first, one indexed add per tree level). Returns ``x``."""
    for child, parent in model.step_cache.body_levels:
        x.index_add_(0, child, x.index_select(0, parent))
    return x


def dof_path_sums(model: Model, x: torch.Tensor) -> torch.Tensor:
    """``[B, k, W]``: for every body, the sum of per-DOF rows ``x [nv, k, W]`` over the DOFs that move it
    (``dof_moves_body @ x``)."""
    out = x.new_zeros(model.num_bodies, x.shape[1], x.shape[2])
    return _path_sums_(model, out.index_add_(0, model.dof_body, x))


def gather(c: Comps, index: torch.Tensor) -> Comps:
    """Rows ``index`` of every component (one indexing op): k x ``[n, W]`` -> k x ``[len(index), W]``."""
    return torch.stack(c, dim=1).index_select(0, index).unbind(1)


def scatter_sum(c: Comps, index: torch.Tensor, size: int) -> Comps:
    """Sum rows of every component into ``size`` rows by ``index``: k x ``[n, W]`` -> k x ``[size, W]``."""
    x = torch.stack(c, dim=1)
    out = torch.zeros(size, x.shape[1], x.shape[2], dtype=x.dtype, device=x.device)
    return out.index_add_(0, index, x).unbind(1)


def flat_batch(model: Model, x, n: int, name: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``x [..., n]`` as ``[N, n]`` and its leading shape; :class:`ShapeError` naming ``name`` unless ``x`` is
    a tensor with last dimension ``n`` in the model's dtype and on its device."""
    if not isinstance(x, torch.Tensor):
        raise ShapeError(
            f"expected a torch tensor [..., {n}], got {type(x).__name__}", path=model.layout.source, item=name
        )
    if x.shape[-1:] != (n,):
        raise ShapeError(f"last dimension is {tuple(x.shape)[-1:]}; expected {n}", path=model.layout.source, item=name)
    if x.dtype != model.dtype or x.device != model.device:
        raise ShapeError(
            f"expected {model.dtype} on {model.device}, got {x.dtype} on {x.device}",
            path=model.layout.source,
            item=name,
        )
    return x.reshape(-1, n), tuple(x.shape[:-1])


def _quat_matrix(w, x, y, z) -> Comps:
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    return (
        1.0 - 2.0 * (yy + zz), 2.0 * (xy - wz), 2.0 * (xz + wy),
        2.0 * (xy + wz), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - wx),
        2.0 * (xz - wy), 2.0 * (yz + wx), 1.0 - 2.0 * (xx + yy),
    )  # fmt: skip


def rotate(rot: Comps, v) -> Comps:
    """``R v`` for rotation components ``rot`` and a vector ``v`` (components or per-entry constants)."""
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = rot
    vx, vy, vz = v
    return (r00 * vx + r01 * vy + r02 * vz, r10 * vx + r11 * vy + r12 * vz, r20 * vx + r21 * vy + r22 * vz)


_NATIVE_JOINT_FRAMES: dict = {}  # (joint-frames program, numpy dtype) -> native kernel or None (unavailable)


def _native_joint_frames(model: Model, q: torch.Tensor):
    """``(body_pos [W, B, 3], body_quat [W, B, 4], joint_pos [W, S, 3], dof_axes [W, nv, 3])`` from the
    foundation's joint-frames program compiled to machine code (:mod:`kangengine.animation.kinematics.native`,
    built once per machine and cached on disk), or ``None`` where that is not possible (not on the CPU,
    autograd, inside ``torch.compile``, no llvmlite). The program is the same one the Python replay runs,
    so the results agree to rounding; per-op overhead is gone (the replay is thousands of small ops)."""
    if q.device.type != "cpu" or q.requires_grad or torch.compiler.is_compiling():
        return None
    if os.environ.get("KANGENGINE_FK_BACKEND", "auto").strip().lower() == "numpy":  # the foundation's policy
        return None
    kin = model.layout.kinematics
    prog = kin._traced_joint_frames()
    key = (id(prog), q.dtype)
    if key not in _NATIVE_JOINT_FRAMES:
        kern = None
        try:
            from ..animation.kinematics import native

            if native.available():
                dt = np.float32 if q.dtype == torch.float32 else np.float64
                kern = native.compile_trace(prog.trace, ("qt",), dt)
        except Exception as exc:  # recorded once; the replay runs instead
            warnings.warn(
                f"kangengine.sim: native forward kinematics unavailable ({exc}); using the replay", stacklevel=3
            )
        _NATIVE_JOINT_FRAMES[key] = (prog, kern)  # prog kept alive so its id stays unique
    kern = _NATIVE_JOINT_FRAMES[key][1]
    if kern is None:
        return None
    from ..animation.kinematics import native
    from ..animation.kinematics.replay import array_namespace

    plan = kin.plan
    n, nb = q.shape[0], plan.num_bodies
    ns = sum(len(st) for st in plan.steps)
    outs = [q.new_empty(n, a, b) for a, b in ((nb, 3), (nb, 4), (ns, 3), (ns, 4), (model.nv, 3))]
    q = q.contiguous()

    def fallback(s, e):  # frames whose angles left the kernel's exact sin/cos range: the replay
        prog(q[s:e].T.contiguous(), array_namespace(q), *outs, s, e)

    native.run_kernel(kern, [q], outs, n, fallback, chunk=16384)
    return outs[0], outs[1], outs[2], outs[4]


def compute_frames(model: Model, q: torch.Tensor) -> Frames:
    """Forward kinematics plus the spatial motion of every DOF at ``q [W, nq]`` (no shape checks)."""
    native_out = _native_joint_frames(model, q)
    if native_out is None:
        jf = model.layout.kinematics.joint_frames(q)
        body_pos, body_quat, joint_pos, dof_axes = (
            jf.body_positions,
            jf.body_rotations_wxyz,
            jf.joint_positions,
            jf.dof_axes,
        )
    else:
        body_pos, body_quat, joint_pos, dof_axes = native_out
    bp = _soa(body_pos)
    origin = tuple(c[:1] for c in bp)
    rot = _quat_matrix(*_soa(body_quat))
    axes = _soa(dof_axes)
    anchor = gather(_soa(joint_pos), model.dof_step)
    ja = tuple(a - o for a, o in zip(anchor, origin))
    ang = tuple(c * model.step_cache.dof_is_angular_c for c in axes)
    lin = tuple(c * model.step_cache.dof_is_linear_c + x for c, x in zip(axes, cross(ja, ang)))
    motion_stack = torch.stack(ang + lin, dim=1)  # [nv, 6, W]
    return Frames(
        origin=origin,
        body_pos=bp,
        body_rot=rot,
        body_quat=body_quat,
        motion=motion_stack.unbind(1),
        motion_stack=motion_stack,
    )


def body_twists(model: Model, motion: Comps | torch.Tensor, qd_t: torch.Tensor) -> Comps:
    """6 x ``[B, W]`` spatial velocities (angular, velocity of the point at the reference origin) of every
    body for generalized velocities ``qd_t [nv, W]`` (DOF-major). ``motion``: the DOF motions as 6 x
    ``[nv, W]`` or stacked ``[nv, 6, W]`` (``Frames.motion_stack``, one product fewer)."""
    if isinstance(motion, torch.Tensor):
        return dof_path_sums(model, motion * qd_t[:, None, :]).unbind(1)
    return _tree_product(tuple(s * qd_t for s in motion), model.dof_moves_body)


def link_transforms(model: Model, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``world_from_link`` of every link: the foundation FK (``forward_kinematics``), for convenience.

    Args:
        q: ``[..., nq]`` in the model's dtype and device.
    Returns:
        ``(positions [..., B, 3] m, rotations_wxyz [..., B, 4])``.
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    p, r = model.layout.kinematics.from_coordinates(q2)
    return p.reshape(lead + p.shape[1:]), r.reshape(lead + r.shape[1:])


def link_jacobians(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Jacobians of every link, in world axes, about the link origin (MuJoCo's ``mj_jacBody``).

    ``J[..., b] @ qd`` is the twist of link ``b``: rows 0-2 the velocity of the link *origin* (not its
    centre of mass), rows 3-5 its angular velocity, both in world axes; columns follow the layout's DOFs
    in the canonical velocity convention.

    Args:
        q: ``[..., nq]`` float32/float64 on the model's device.
    Returns:
        ``[..., B, 6, nv]``.
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    fr = compute_frames(model, q2)
    s = fr.motion_rows  # [W, nv, 6]
    ang, lin = s[..., :3], s[..., 3:]
    r = (rows(fr.body_pos) - rows(fr.origin))[:, :, None, :]  # [W, B, 1, 3]
    lin_b = lin[:, None] + torch.linalg.cross(ang[:, None], r)  # [W, B, nv, 3]
    mask = model.dof_moves_body[None, :, :, None]  # [1, B, nv, 1]
    jac = (torch.cat([lin_b, ang[:, None].expand_as(lin_b)], dim=-1) * mask).transpose(-1, -2)
    return jac.reshape(lead + jac.shape[1:])


def link_velocities(model: Model, q: torch.Tensor, qd: torch.Tensor) -> LinkVelocities:
    """Twists of every link (``link_jacobians(q) @ qd`` without forming the Jacobians).

    Args:
        q: ``[..., nq]``; qd: ``[..., nv]`` (canonical convention), model dtype and device.
    Returns:
        :class:`LinkVelocities` with ``linear [..., B, 3]`` (velocity of each link origin, world) and
        ``angular [..., B, 3]`` (world).
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    tw = body_twists(model, fr.motion, qd2.t().contiguous())
    ang = tw[:3]
    r = tuple(p - o for p, o in zip(fr.body_pos, fr.origin))
    lin = tuple(v + c for v, c in zip(tw[3:], cross(ang, r)))
    b = model.num_bodies
    return LinkVelocities(linear=rows(lin).reshape(lead + (b, 3)), angular=rows(ang).reshape(lead + (b, 3)))

"""Velocity kinematics of a :class:`~kangengine.sim.Model`, batched over worlds.

Positions come from the foundation's forward kinematics (``layout.kinematics.joint_frames``: the one FK
implementation, which also reports every joint's world anchor and axis frame); this module turns them into
the motion of every DOF as a spatial vector and into link Jacobians and velocities.

Internally a DOF's motion is a 6-vector ``(angular, linear)`` in world axes, the linear part being the
velocity of the material point at the *reference point* (the root body origin at this instant) moving
with the DOF. Public results use the link origin instead (MuJoCo's ``mj_jacBody`` convention) and order
``(linear, angular)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import rotations as R
from ..errors import ShapeError
from .model import Model

__all__ = ["Frames", "LinkVelocities", "compute_frames", "link_jacobians", "link_velocities", "link_transforms"]


@dataclass(frozen=True, eq=False)
class Frames:
    """Positions and DOF motions of ``W`` worlds at one configuration (what dynamics and contact use).

    Attributes:
        origin: ``[W, 3]`` m, world position of the reference point (root body origin).
        body_pos: ``[W, B, 3]`` m, link origins in world.
        body_quat: ``[W, B, 4]`` WXYZ ``world_from_body``.
        body_rot: ``[W, B, 3, 3]`` rotation matrices of ``body_quat``.
        motion: ``[W, nv, 6]`` per DOF: (angular velocity, velocity of the point at ``origin``) for a unit
            DOF rate, world axes.
    """

    origin: torch.Tensor
    body_pos: torch.Tensor
    body_quat: torch.Tensor
    body_rot: torch.Tensor
    motion: torch.Tensor


@dataclass(frozen=True, eq=False)
class LinkVelocities:
    """Link twists in world axes.

    Attributes:
        linear: ``[..., B, 3]`` m/s, velocity of each link origin.
        angular: ``[..., B, 3]`` rad/s, angular velocity.
    """

    linear: torch.Tensor
    angular: torch.Tensor


def _flat(model: Model, x, n: int, name: str) -> tuple[torch.Tensor, tuple[int, ...]]:
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


def compute_frames(model: Model, q: torch.Tensor) -> Frames:
    """Forward kinematics plus the spatial motion of every DOF at ``q [W, nq]`` (no shape checks)."""
    jf = model.layout.kinematics.joint_frames(q)
    body_pos = jf.body_positions
    body_quat = jf.body_rotations_wxyz
    origin = body_pos[:, 0]
    axes = jf.dof_axes  # [W, nv, 3] world
    ja = jf.joint_positions[:, model.dof_step] - origin[:, None]  # [W, nv, 3]
    ang = axes * model.dof_is_angular[:, None]
    lin = axes * model.dof_is_linear[:, None] + torch.linalg.cross(ja, ang)
    return Frames(
        origin=origin,
        body_pos=body_pos,
        body_quat=body_quat,
        body_rot=R.quat_to_matrix(body_quat),
        motion=torch.cat([ang, lin], dim=-1),
    )


def body_twists(model: Model, motion: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """``[W, B, 6]`` spatial velocities (angular, velocity of the point at the reference origin) of every
    body for generalized velocities ``qd [W, nv]``."""
    return torch.matmul(model.dof_moves_body, motion * qd[..., None])


def link_transforms(model: Model, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``world_from_link`` of every link: the foundation FK (``forward_kinematics``), for convenience.

    Args:
        q: ``[..., nq]`` in the model's dtype and device.
    Returns:
        ``(positions [..., B, 3] m, rotations_wxyz [..., B, 4])``.
    """
    q2, lead = _flat(model, q, model.nq, "q")
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
    q2, lead = _flat(model, q, model.nq, "q")
    fr = compute_frames(model, q2)
    ang = fr.motion[..., :3]  # [W, nv, 3]
    lin = fr.motion[..., 3:]
    r = (fr.body_pos - fr.origin[:, None])[:, :, None, :]  # [W, B, 1, 3]
    lin_b = lin[:, None] + torch.linalg.cross(ang[:, None], r)  # [W, B, nv, 3]
    mask = model.dof_moves_body[None, :, :, None]  # [1, B, nv, 1]
    jac = torch.cat([lin_b, ang[:, None].expand_as(lin_b)], dim=-1) * mask  # [W, B, nv, 6]
    jac = jac.transpose(-1, -2)
    return jac.reshape(lead + jac.shape[1:])


def link_velocities(model: Model, q: torch.Tensor, qd: torch.Tensor) -> LinkVelocities:
    """Twists of every link (``link_jacobians(q) @ qd`` without forming the Jacobians).

    Args:
        q: ``[..., nq]``; qd: ``[..., nv]`` (canonical convention), model dtype and device.
    Returns:
        :class:`LinkVelocities` with ``linear [..., B, 3]`` (velocity of each link origin, world) and
        ``angular [..., B, 3]`` (world).
    """
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    tw = body_twists(model, fr.motion, qd2)
    ang, lin_o = tw[..., :3], tw[..., 3:]
    lin = lin_o + torch.linalg.cross(ang, fr.body_pos - fr.origin[:, None])
    return LinkVelocities(linear=lin.reshape(lead + lin.shape[1:]), angular=ang.reshape(lead + ang.shape[1:]))

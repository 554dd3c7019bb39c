"""Drives, loads and friction for the simulator: :class:`Control` (per-step inputs), the smoothed
Coulomb/Stribeck friction potential ``phi`` shared by joints and contacts, and the implicit PD drive.

Friction (reference: articulated-actor joint friction). For a DOF with velocity ``v``, viscous coefficient
``mu_v``, Coulomb force ``mu_c``, extra stiction ``mu_s``, fall-off velocity ``v_f`` and Stribeck velocity
``v_s``, with ``mu_0 = mu_c + mu_s`` and ``r = mu_c / mu_0``::

    phi(x) = x^2 / v_f (1 - x / (3 v_f))                                   x < v_f
           = 2 v_f / 3 + r (x - v_f) + (1 - r) v_s sqrt(pi)/2 erf((x - v_f) / v_s)    x >= v_f, v_s > 0
           = 2 v_f / 3 + r (x - v_f)                                       x >= v_f, v_s = 0
    R(v)   = 1/2 mu_v v^2 + mu_0 phi(|v|)          (dissipation potential)
    force  = -dR/dv = -(mu_v v + mu_0 phi'(|v|) sign(v))

A ball joint uses the norm of its angular velocity; a contact uses the norm of its slip velocity with
``mu_0`` = friction coefficient times normal force.

PD drive, treated implicitly: the drive force on a DOF at the end of a step is
``clamp(tau_ff + kp (q_target - q_next) + kd (qd_target - v), -effort_limit, effort_limit)`` with
``q_next = q (+) h v``, where the position error is the layout's tangent difference (rotations: rotation
vector, parent/world frame).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ShapeError
from .model import Model
from .pose import PoseTargets

__all__ = [
    "Control",
    "friction_phi",
    "friction_phi_derivative",
    "friction_force",
    "friction_potential",
    "friction_phi_fast",
    "friction_phi_derivative_over_x",
]


@dataclass(frozen=True, eq=False)
class Control:
    """Inputs of one step for ``W`` worlds; every field is optional.

    Attributes:
        q_target: ``[W, nq]`` PD position targets (layout coordinates). ``None``: no position drive.
        qd_target: ``[W, nv]`` PD velocity targets (zero when omitted).
        tau_feedforward: ``[W, nv]`` feed-forward drive force added before the effort clamp (e.g. inverse
            dynamics of a reference).
        tau_external: ``[W, nv]`` external generalized forces, not clamped (free root: world force at the
            root origin, world torque about it).
        drive_stiffness, drive_damping: ``[W, nv]`` or ``[nv]`` gains replacing the model's.
        pinned: ``[W, nv]`` bool: DOFs held as boundary conditions (their velocity is ``pinned_qd``).
        pinned_qd: ``[W, nv]`` prescribed velocity of pinned DOFs (zero when omitted: frozen in place).
        pose_targets: :class:`~kangengine.sim.pose.PoseTargets`, Cartesian link position and rotation
            targets held by implicit PD rows of the step (the pose controller; with ``q_target`` a hybrid).
    """

    q_target: torch.Tensor | None = None
    qd_target: torch.Tensor | None = None
    tau_feedforward: torch.Tensor | None = None
    tau_external: torch.Tensor | None = None
    drive_stiffness: torch.Tensor | None = None
    drive_damping: torch.Tensor | None = None
    pinned: torch.Tensor | None = None
    pinned_qd: torch.Tensor | None = None
    pose_targets: PoseTargets | None = None

    def check(self, model: Model, num_worlds: int) -> None:
        """Raise :class:`ShapeError` naming the field when a tensor has the wrong shape, dtype or device."""
        for name, n in (
            ("q_target", model.nq),
            ("qd_target", model.nv),
            ("tau_feedforward", model.nv),
            ("tau_external", model.nv),
            ("drive_stiffness", model.nv),
            ("drive_damping", model.nv),
            ("pinned", model.nv),
            ("pinned_qd", model.nv),
        ):
            x = getattr(self, name)
            if x is None:
                continue
            ok_shape = isinstance(x, torch.Tensor) and (
                tuple(x.shape) == (num_worlds, n) or (name.startswith("drive_") and tuple(x.shape) == (n,))
            )
            if not ok_shape:
                shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
                raise ShapeError(
                    f"expected a torch tensor [{num_worlds}, {n}], got {shape}",
                    path=model.layout.source,
                    item=f"control.{name}",
                )
            want = torch.bool if name == "pinned" else model.dtype
            if x.dtype != want or x.device != model.device:
                raise ShapeError(
                    f"expected {want} on {model.device}, got {x.dtype} on {x.device}",
                    path=model.layout.source,
                    item=f"control.{name}",
                )
        if self.pose_targets is not None:
            self.pose_targets.check(model, num_worlds)


# -- friction ------------------------------------------------------------------------------------------


def _is_zero(v) -> bool:
    return isinstance(v, (int, float)) and v == 0


def _safe(v_s):
    return torch.clamp(v_s, min=1e-30) if isinstance(v_s, torch.Tensor) else max(float(v_s), 1e-30)


def friction_phi(x, falloff_vel, ratio=1.0, stribeck_vel=0.0):
    """The smoothed dry-friction potential ``phi(x)`` for speeds ``x >= 0`` (see the module docstring).

    Args:
        x: speeds (tensor). falloff_vel, ratio (``r = mu_c / mu_0``), stribeck_vel: floats or tensors
            broadcasting with ``x``.
    """
    vf = falloff_vel
    lo = x * x / vf * (1.0 - x / (3.0 * vf))
    t = x - vf
    hi = 2.0 * vf / 3.0 + ratio * t
    if not _is_zero(stribeck_vel):
        hi = hi + (1.0 - ratio) * stribeck_vel * (math.sqrt(math.pi) / 2.0) * torch.erf(t / _safe(stribeck_vel))
    return torch.where(x < vf, lo, hi)


def friction_phi_derivative(x, falloff_vel, ratio=1.0, stribeck_vel=0.0):
    """``phi'(x)``: the dry-friction force magnitude per unit ``mu_0`` at speed ``x >= 0``."""
    vf = falloff_vel
    lo = 2.0 * x / vf - x * x / (vf * vf)
    if _is_zero(stribeck_vel):
        hi = ratio + torch.zeros_like(x)
    else:
        t = (x - vf) / _safe(stribeck_vel)
        hi = ratio + (1.0 - ratio) * torch.exp(-t * t)
    return torch.where(x < vf, lo, hi)


def friction_phi_derivative_over_x(x, falloff_vel, ratio=1.0, stribeck_vel=0.0):
    """``phi'(x) / x``, finite at 0 (``2 / v_f``): the curvature of the quadratic that majorizes
    ``phi(|v|)`` at the current speed (iteratively reweighted Newton step: never overshoots zero).

    Arguments as for :func:`friction_phi`; returns the shape of ``x`` broadcast with them.
    """
    vf = falloff_vel
    lo = (x / (-vf * vf)).add_(2.0 / vf)
    if _is_zero(stribeck_vel):
        hi = ratio / torch.clamp(x, min=1e-30)
    else:
        hi = friction_phi_derivative(x, falloff_vel, ratio, stribeck_vel) / torch.clamp(x, min=1e-30)
    return torch.where(x < vf, lo, hi)


def friction_phi_fast(x, falloff_vel, ratio=1.0, stribeck_vel=0.0):
    """:func:`friction_phi` with fewer operations (same formula, same arguments and shapes; equal up to
    round-off)."""
    if not _is_zero(stribeck_vel):
        return friction_phi(x, falloff_vel, ratio, stribeck_vel)
    vf = falloff_vel
    lo = (x * x).mul_((x / (-3.0 * vf * vf)).add_(1.0 / vf))  # x^2 / vf (1 - x / (3 vf))
    hi = (
        torch.addcmul((2.0 / 3.0 - ratio) * vf, ratio, x)
        if isinstance(ratio, torch.Tensor)
        else ratio * x + ((2.0 / 3.0 - ratio) * vf)
    )
    return torch.where(x < vf, lo, hi)


def friction_potential(v, *, coulomb, viscous=0.0, falloff_vel=1e-3, stiction_extra=0.0, stribeck_vel=0.0):
    """Joint friction dissipation potential ``R(v) = 1/2 viscous v^2 + mu_0 phi(|v|)`` (reference formula).

    Args:
        v: velocities (tensor, any shape). Other arguments: floats or broadcasting tensors (N, N s/m, m/s).
    """
    mu0 = coulomb + stiction_extra
    ratio = coulomb / mu0 if mu0 > 0 else 1.0
    dry = mu0 * friction_phi(v.abs(), falloff_vel, ratio, stribeck_vel) if mu0 > 0 else 0.0 * v
    return 0.5 * viscous * v * v + dry


def friction_force(v, *, coulomb, viscous=0.0, falloff_vel=1e-3, stiction_extra=0.0, stribeck_vel=0.0):
    """Joint friction force ``-dR/dv = -(viscous v + mu_0 phi'(|v|) sign(v))`` (see :func:`friction_potential`)."""
    mu0 = coulomb + stiction_extra
    ratio = coulomb / mu0 if mu0 > 0 else 1.0
    dry = mu0 * friction_phi_derivative(v.abs(), falloff_vel, ratio, stribeck_vel) * torch.sign(v)
    return -(viscous * v + dry)

"""Drive performance envelopes: speed-dependent effort limits and joint speed limits, inside the step.

A motor cannot give its full effort at any speed. Per DOF (the reference's drive performance envelope)::

    |effort| <= max_effort - velocity_resistance |qd|                    (torque falls with speed)
    |qd|     <= max_actuator_velocity - speed_effort_gradient |effort|   (speed falls with torque)
    |qd|     <= max_joint_velocity                                       (the joint itself, any cause)

The first two bound the drive's effort at speed ``s = |qd|`` by ``effort_bound(s) = max(0, min(max_effort -
velocity_resistance s, (max_actuator_velocity - s) / speed_effort_gradient))`` (with a zero gradient the
second bound is ``+inf`` below ``max_actuator_velocity`` and 0 above it). In the implicit step the PD
force ``clamp(a - b v, -bound, bound)`` takes the bound at each Newton iterate's end-of-step velocity ``v``
(a lagged limit, like the normal force under friction), so the effort reported for a step is bounded by the
envelope at the step's own final speed. The joint speed limit is a one-sided quadratic on ``v`` in the
incremental potential, ``1/2 mu (|v| - max_joint_velocity)_+^2`` with ``mu = joint_velocity_stiffness``
(kg m^2 or kg: the momentum it takes to exceed the limit by 1 rad/s or m/s), a barrier Newton sees with its
exact curvature.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError, UnknownNameError

__all__ = ["DriveEnvelope", "with_drive_envelope"]

_INF = math.inf
PerDofValue = float | Sequence[float] | np.ndarray | Mapping[str, float]


@dataclass(frozen=True, eq=False)
class DriveEnvelope:
    """Per-DOF envelope of the drives (``[nv, 1]`` columns in the model's dtype, broadcast over worlds).

    Attributes:
        max_effort: N m or N (``+inf``: no limit).
        velocity_resistance: N m s/rad or N s/m, effort lost per unit speed.
        max_actuator_velocity: rad/s or m/s (``+inf``: none).
        speed_effort_gradient: rad/(s N m) or m/(s N), speed lost per unit effort.
        max_joint_velocity: rad/s or m/s (``+inf``: none), whatever drives the joint.
        joint_velocity_stiffness: kg m^2 or kg, curvature of the joint speed barrier.
    """

    max_effort: torch.Tensor
    velocity_resistance: torch.Tensor
    max_actuator_velocity: torch.Tensor
    speed_effort_gradient: torch.Tensor
    max_joint_velocity: torch.Tensor
    joint_velocity_stiffness: torch.Tensor

    @property
    def has_speed_limit(self) -> bool:
        return bool(torch.isfinite(self.max_joint_velocity).any())

    def effort_bound(self, speed: torch.Tensor) -> torch.Tensor:
        """Largest drive effort ``[nv, W]`` (N m or N, >= 0) at speeds ``speed [nv, W]`` (``|qd|``)."""
        b1 = self.max_effort - self.velocity_resistance * speed
        g = self.speed_effort_gradient
        b2 = torch.where(
            g > 0,
            (self.max_actuator_velocity - speed) / torch.where(g > 0, g, 1.0),
            torch.where(speed < self.max_actuator_velocity, _INF, 0.0),
        )
        return torch.clamp(torch.minimum(b1, b2), min=0.0)

    def effort_bound_slope(self, speed: torch.Tensor) -> torch.Tensor:
        """``d effort_bound / d speed`` ``[nv, W]`` (<= 0; 0 where the bound is 0 or unlimited)."""
        b1 = self.max_effort - self.velocity_resistance * speed
        g = self.speed_effort_gradient
        b2 = torch.where(g > 0, (self.max_actuator_velocity - speed) / torch.where(g > 0, g, 1.0), _INF)
        slope = torch.where(b1 <= b2, -self.velocity_resistance, -1.0 / torch.where(g > 0, g, 1.0))
        return torch.where((torch.minimum(b1, b2) > 0) & torch.isfinite(torch.minimum(b1, b2)), slope, 0.0)

    def speed_terms(self, v: torch.Tensor):
        """Gradient and curvature ``[nv, W]`` of the joint speed barrier at velocities ``v [nv, W]``."""
        over = v - torch.clamp(v, -self.max_joint_velocity, self.max_joint_velocity)
        active = (v.abs() >= self.max_joint_velocity).to(v.dtype)  # on the limit too: Newton sees the wall
        return self.joint_velocity_stiffness * over, self.joint_velocity_stiffness * active

    def speed_step(self, v: torch.Tensor, dv: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """Step lengths ``[W]`` along ``dv [nv, W]`` from ``v``: at least up to where the first DOF inside its
        speed limit reaches it (the barrier is invisible to Newton until then, so the energy's line search
        alone would creep towards the wall), at most ``1``; ``alpha [W]`` elsewhere."""
        vmax = self.max_joint_velocity
        a, b = v.abs(), (v + dv).abs()
        crossing = (a < vmax) & (b > vmax)
        # |v + t dv| = vmax on the segment: the root of the side dv points to
        t = torch.where(dv > 0, (vmax - v) / torch.where(dv > 0, dv, 1.0), (-vmax - v) / torch.where(dv < 0, dv, -1.0))
        t = torch.where(crossing, t, 1.0).amin(0)
        return torch.where(crossing.any(0), torch.maximum(alpha, torch.clamp(t, max=1.0)), alpha)

    def speed_energy(self, v: torch.Tensor) -> torch.Tensor:
        """Energy of the joint speed barrier per DOF at ``v [..., nv, W]`` (same shape)."""
        over = v - torch.clamp(v, -self.max_joint_velocity, self.max_joint_velocity)
        return 0.5 * self.joint_velocity_stiffness * over * over


def _per_dof(model, value: PerDofValue, default: float, what: str) -> np.ndarray:
    nv = model.nv
    out = np.full(nv, default, dtype=np.float64)
    if value is None:
        return out
    if isinstance(value, Mapping):
        names = {n: [i] for i, n in enumerate(model.layout.dof_names)}
        for b in model.layout.blocks:
            names.setdefault(b.joint_name, list(range(b.qd_offset, b.qd_offset + b.qd_dim)))
        for k, x in value.items():
            if k not in names:
                joints = ", ".join(b.joint_name for b in model.layout.blocks)
                raise UnknownNameError(
                    f"{what}: no joint or DOF {k!r}; joints are: {joints}",
                    path=model.layout.source,
                    item=what,
                )
            out[names[k]] = float(x)
        return out
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        return np.full(nv, float(arr))
    if arr.shape != (nv,):
        raise ShapeError(f"{what}: expected a scalar or [{nv}] values, got shape {arr.shape}", item=what)
    return arr.copy()


def with_drive_envelope(
    model,
    *,
    max_effort: PerDofValue | None = None,
    velocity_resistance: PerDofValue = 0.0,
    max_actuator_velocity: PerDofValue = _INF,
    speed_effort_gradient: PerDofValue = 0.0,
    max_joint_velocity: PerDofValue = _INF,
    joint_velocity_stiffness: PerDofValue = 1e4,
):
    """``model`` with a :class:`DriveEnvelope` (a new :class:`~kangengine.sim.Model`; tensors are shared).

    Each argument is a scalar (every DOF), an ``[nv]`` array or a mapping from joint or DOF names to
    values (others keep the default). ``max_effort`` ``None`` keeps ``model.dof_effort_limit``; a
    mapping overrides it on the DOFs it names.

    Raises:
        ShapeError: an array has the wrong length, or a value is negative or NaN.
        UnknownNameError: a mapping names no joint or DOF.
    """
    base = model.dof_effort_limit.detach().cpu().double().numpy()
    eff = base.copy()
    if max_effort is not None:
        if isinstance(max_effort, Mapping):
            named = _per_dof(model, max_effort, np.nan, "max_effort")
            eff = np.where(np.isnan(named), base, named)
        else:
            eff = _per_dof(model, max_effort, _INF, "max_effort")
    vals = {
        "max_effort": eff,
        "velocity_resistance": _per_dof(model, velocity_resistance, 0.0, "velocity_resistance"),
        "max_actuator_velocity": _per_dof(model, max_actuator_velocity, _INF, "max_actuator_velocity"),
        "speed_effort_gradient": _per_dof(model, speed_effort_gradient, 0.0, "speed_effort_gradient"),
        "max_joint_velocity": _per_dof(model, max_joint_velocity, _INF, "max_joint_velocity"),
        "joint_velocity_stiffness": _per_dof(model, joint_velocity_stiffness, 1e4, "joint_velocity_stiffness"),
    }
    for k, a in vals.items():
        if np.any(np.isnan(a)) or np.any(a < 0):
            raise ShapeError(f"{k}: expected values >= 0, got {a.tolist()}", path=model.layout.source, item=k)
    col = lambda a: torch.as_tensor(a, dtype=model.dtype, device=model.device).reshape(-1, 1).contiguous()
    env = DriveEnvelope(**{k: col(a) for k, a in vals.items()})
    return dataclasses.replace(model, drive_envelope=env)

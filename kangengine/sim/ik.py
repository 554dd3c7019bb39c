"""Quasistatic inverse kinematics on the simulator's own machinery.

:func:`solve_ik` finds joint values that bring links to Cartesian targets (:class:`~kangengine.sim.pose.PoseTargets`)
by repeating one implicit step of the pose controller *from rest*, with gravity, drives and contacts off: each step
minimises ``1/2 v^T M v + sum_rows 1/2 k |e + h J v|^2 + joint-limit springs`` over ``v`` (a Levenberg-Marquardt
step whose damping is the mass matrix, so heavy proximal links move less than light distal ones) and moves
``q <- q (+) h v``, then clamps every hinge and slide into its range (a projected step), so the answer
always respects the joint ranges. The loop stops when every target is within tolerance or no longer
improves (by 1% of its tolerance over ``check_every`` steps); targets left out of reach are reported with
their remaining distance instead of being passed on as reached.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import rotations as R
from .control import Control
from .integrator import Simulator
from .kinematics import link_transforms
from .model import Model, State
from .pose import PoseTargets

__all__ = ["IKResult", "solve_ik"]


@dataclass(frozen=True, eq=False)
class IKResult:
    """What :func:`solve_ik` found for ``W`` worlds and ``T`` targeted links.

    Attributes:
        q: ``[W, nq]`` the joint values (layout coordinates).
        position_error: ``[W, T]`` m, remaining distance of each targeted point (0 where no position target).
        rotation_error: ``[W, T]`` rad, remaining rotation angle (0 where no rotation target).
        reached: ``[W, T]`` bool, both errors within the tolerances.
        iterations: quasistatic steps taken.
    """

    q: torch.Tensor
    position_error: torch.Tensor
    rotation_error: torch.Tensor
    reached: torch.Tensor
    iterations: int


def _errors(model: Model, targets: PoseTargets, q: torch.Tensor):
    pos, quat = link_transforms(model, q)  # [W, B, 3], [W, B, 4]
    w, t = q.shape[0], targets.link_index.numel()
    zero = torch.zeros(w, t, dtype=q.dtype, device=q.device)
    dpos, drot = zero, zero
    if targets.position_world is not None:
        pts = pos[:, targets.link_index] + R.quat_rotate(quat[:, targets.link_index], targets.point_local)
        dpos = torch.linalg.vector_norm(pts - targets.position_world, dim=-1)
    if targets.rotation_wxyz is not None:
        drot = R.quat_angle_between(quat[:, targets.link_index], targets.rotation_wxyz)
    return dpos, drot


def _within_limits(model: Model, q: torch.Tensor) -> torch.Tensor:
    """``q`` with every hinge/slide coordinate clamped into its range (a projected step)."""
    idx = model.dof_q_index[model.dof_is_scalar]
    lo, hi = model.dof_lower[model.dof_is_scalar], model.dof_upper[model.dof_is_scalar]
    out = q.clone()
    out[:, idx] = torch.maximum(torch.minimum(q[:, idx], hi), lo)
    return out


def solve_ik(
    model: Model,
    targets: PoseTargets,
    q_init: torch.Tensor | None = None,
    *,
    tolerance: float = 1e-3,
    rotation_tolerance: float = 1e-2,
    max_iterations: int = 200,
    step: float = 0.2,
    check_every: int = 10,
) -> IKResult:
    """Joint values that bring the targeted links to their targets.

    Args:
        model: the articulation (its gravity, drives and contacts are switched off here; limits stay).
        targets: :class:`PoseTargets` for ``W`` worlds; their stiffnesses weigh position against rotation
            (the defaults: 2000 N/m and 50 N m/rad, so 1 cm weighs like 0.063 rad).
        q_init: ``[W, nq]`` start (default: the neutral pose).
        tolerance: m, a position target counts as reached within this distance.
        rotation_tolerance: rad, likewise for a rotation target.
        max_iterations: most quasistatic steps.
        step: s, the step length ``h`` (larger: closer to a Gauss-Newton step).
        check_every: steps between convergence checks (each waits for the device).
    Returns:
        :class:`IKResult`; ``reached`` is False, with the remaining ``position_error``, for a target out of
        reach.
    """
    w = targets.position_world.shape[0] if targets.position_world is not None else targets.rotation_wxyz.shape[0]
    targets.check(model, w)
    quiet = dataclasses.replace(
        model,
        gravity=torch.zeros_like(model.gravity),
        drive_envelope=None,
        contact=dataclasses.replace(model.contact, enabled=False, self_collision=False),
    )
    sim = Simulator(quiet, dt=step, iterations=3, energy_correction=False)
    zero_gain = torch.zeros(quiet.nv, dtype=model.dtype, device=model.device)
    control = Control(pose_targets=targets, drive_stiffness=zero_gain, drive_damping=zero_gain)
    q = State.neutral(model, w).q if q_init is None else q_init.clone()
    prev = None
    it = 0
    while it < max_iterations:
        for _ in range(check_every):
            q = _within_limits(model, sim.step(State.from_q(quiet, q), control).state.q)
            it += 1
        dpos, drot = _errors(model, targets, q)
        score = dpos / tolerance + drot / rotation_tolerance  # [W, T], 1 at the tolerance
        reached = (dpos <= tolerance) & (drot <= rotation_tolerance)
        # a target still moves when its score fell by more than 1% of a tolerance since the last check
        moving = ~reached if prev is None else ~reached & (prev - score > 0.01)
        if not bool(moving.any()):
            break
        prev = score
    dpos, drot = _errors(model, targets, q)
    return IKResult(
        q=q,
        position_error=dpos,
        rotation_error=drot,
        reached=(dpos <= tolerance) & (drot <= rotation_tolerance),
        iterations=it,
    )

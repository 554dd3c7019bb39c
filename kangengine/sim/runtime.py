"""Runtime helpers of an articulation, named after the SuperDex articulated-actor runtime API, in our style.

| reference | here |
| --- | --- |
| ``GetArticulatedDofLimits`` | :func:`dof_limits` ``[nv, 2]`` |
| ``GetMass`` | :func:`total_mass` |
| ``GetRootTransform`` / ``SetRootTransform`` (teleport) | :func:`root_transform` / :func:`set_root_transform` |
| ``SetArticulatedPoseFromJoints`` | :func:`pose_from_joints` |
| ``SetArticulatedPoseFromLinks`` (IK-style) | :func:`pose_from_links` |
| ``AddArticulatedDeltaToPose`` / ``ComputeArticulatedPoseDelta`` | :func:`add_delta_to_pose` / :func:`pose_delta` |
| ``GetArticulatedJacobian`` (per link) | :func:`link_jacobian` |
| ``SetArticulatedJointFrictionParams`` | :func:`set_joint_friction` |
| ``SetArticulatedJointInertiaParams`` | :func:`set_joint_inertia` |

Poses are our states: ``q [W, nq]`` in the layout's coordinates (free root: position, WXYZ quaternion), ``qd
[W, nv]`` in the canonical tangent convention; deltas live in that tangent space, so ball and free joints
compose on the rotation manifold.
"""

from __future__ import annotations

import torch

from .. import rotations as R
from ..asset.desc import JointType
from ..errors import ShapeError
from .ik import solve_ik
from .integrator import Simulator
from .kinematics import link_jacobians, link_transforms
from .model import Model, State
from .pose import PoseTargets

__all__ = [
    "dof_limits",
    "total_mass",
    "root_transform",
    "set_root_transform",
    "pose_from_joints",
    "pose_from_links",
    "add_delta_to_pose",
    "pose_delta",
    "link_jacobian",
    "set_joint_friction",
    "set_joint_inertia",
]


def dof_limits(model: Model) -> torch.Tensor:
    """``[nv, 2]`` (lower, upper) per DOF, rad or m (``-inf``/``+inf`` where unlimited)."""
    return torch.stack([model.dof_lower, model.dof_upper], dim=-1)


def total_mass(model: Model) -> float:
    """Mass of all links, kg."""
    return float(model.body_mass.sum())


def root_transform(model: Model, state: State) -> tuple[torch.Tensor, torch.Tensor]:
    """``world_from_root`` of each world: ``(position [W, 3] m, rotation_wxyz [W, 4])``."""
    pos, quat = link_transforms(model, state.q)
    return pos[:, 0], quat[:, 0]


def set_root_transform(model: Model, state: State, position: torch.Tensor, rotation_wxyz: torch.Tensor) -> State:
    """Teleport: the state with the free root placed at ``position [W, 3]`` m, ``rotation_wxyz [W, 4]``,
    joint values and velocities kept (a new :class:`State` without an energy budget, so the jump is not
    undone by the energy correction).

    Raises:
        ShapeError: the model has no free root (a fixed base cannot move), or the shapes are wrong.
    """
    blk = model.layout.blocks[0] if model.layout.blocks else None
    if blk is None or blk.joint_type is not JointType.FREE:
        raise ShapeError(
            "the root is fixed to the world; only a free root can be teleported",
            path=model.layout.source,
            item="root",
        )
    w = state.q.shape[0]
    if tuple(position.shape) != (w, 3) or tuple(rotation_wxyz.shape) != (w, 4):
        raise ShapeError(
            f"expected position [{w}, 3] and rotation_wxyz [{w}, 4], got {tuple(position.shape)} and "
            f"{tuple(rotation_wxyz.shape)}",
            path=model.layout.source,
            item="root transform",
        )
    q = state.q.clone()
    q[:, blk.q_offset : blk.q_offset + 3] = position
    q[:, blk.q_offset + 3 : blk.q_offset + 7] = rotation_wxyz / torch.linalg.vector_norm(rotation_wxyz, dim=-1)[:, None]
    return State(q=q, qd=state.qd.clone(), frozen=state.frozen.clone())


def pose_from_joints(model: Model, q: torch.Tensor, qd: torch.Tensor | None = None) -> State:
    """The state at joint values ``q [W, nq]`` (velocities ``qd [W, nv]``, zero when omitted)."""
    return State.from_q(model, q, qd)


def pose_from_links(
    model: Model,
    position_world: torch.Tensor,
    rotation_wxyz: torch.Tensor,
    *,
    tolerance: float = 1e-6,
    q_init: torch.Tensor | None = None,
) -> tuple[State, torch.Tensor]:
    """The pose whose links best match ``world_from_link`` transforms (IK-style).

    Args:
        position_world: ``[W, B, 3]`` m, rotation_wxyz: ``[W, B, 4]``, one per link in body order.
        tolerance: m (and rad for the rotations) to call a link matched.
        q_init: ``[W, nq]`` start of the search (default: neutral).
    Returns:
        ``(state, residual [W, B])``: the pose and each link's remaining distance in m (0 for transforms that
        a pose of this articulation can produce, up to ``tolerance``).
    """
    links = model.body_names
    targets = PoseTargets.from_names(model, links, position_world=position_world, rotation_wxyz=rotation_wxyz)
    if q_init is None:
        q_init = _joints_from_links(model, position_world, rotation_wxyz)
    res = solve_ik(
        model, targets, q_init, tolerance=tolerance, rotation_tolerance=tolerance, max_iterations=400, step=0.5
    )
    return State.from_q(model, res.q), res.position_error


def _joints_from_links(model: Model, position_world: torch.Tensor, rotation_wxyz: torch.Tensor) -> torch.Tensor:
    """``[W, nq]``: the joint values read off the link transforms where a body has one joint (free root,
    hinge, slide, ball: exact for consistent transforms), neutral elsewhere (the IK refines those)."""
    layout = model.layout
    q = State.neutral(model, position_world.shape[0]).q.clone()
    lpos, lrot = layout.local_transforms(q)  # parent_from_body at the neutral pose
    parents = list(model.parents)
    per_body: dict[int, int] = {}
    for blk in layout.blocks:
        if blk.joint_type is not JointType.FIXED:
            per_body[blk.body_index] = per_body.get(blk.body_index, 0) + 1
    for blk in layout.blocks:
        b = blk.body_index
        if per_body.get(b) != 1:
            continue
        p = parents[b]
        if p < 0:
            rel_rot, rel_pos = rotation_wxyz[:, b], position_world[:, b]
        else:
            inv = R.quat_conjugate(rotation_wxyz[:, p])
            rel_rot = R.quat_multiply(inv, rotation_wxyz[:, b])
            rel_pos = R.quat_rotate(inv, position_world[:, b] - position_world[:, p])
        turn = R.quat_multiply(R.quat_conjugate(lrot[:, b]), rel_rot)  # the joint's motion from neutral (body)
        o = blk.q_offset
        if blk.joint_type is JointType.FREE and p < 0:
            q[:, o : o + 3], q[:, o + 3 : o + 7] = position_world[:, b], rotation_wxyz[:, b]
        elif blk.joint_type is JointType.HINGE:
            axis = torch.as_tensor(blk.axis, dtype=q.dtype, device=q.device)
            angle = 2.0 * torch.atan2((turn[:, 1:] * axis).sum(-1), turn[:, 0])
            q[:, o] = q[:, o] + R.wrap_angle(angle)
        elif blk.joint_type is JointType.BALL:
            q[:, o : o + 4] = R.quat_multiply(q[:, o : o + 4], turn)
        elif blk.joint_type is JointType.SLIDE:
            axis = R.quat_rotate(lrot[:, b], torch.as_tensor(blk.axis, dtype=q.dtype, device=q.device))
            q[:, o] = q[:, o] + ((rel_pos - lpos[:, b]) * axis).sum(-1)
    return q


def add_delta_to_pose(model: Model, q: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``q (+) delta``: ``q [..., nq]`` moved along the tangent ``delta [..., nv]`` on the manifold."""
    return model.layout.integrate(q, delta)


def pose_delta(model: Model, q_a: torch.Tensor, q_b: torch.Tensor) -> torch.Tensor:
    """``q_b (-) q_a``: the tangent ``[..., nv]`` with ``add_delta_to_pose(model, q_a, delta) == q_b``."""
    return model.layout.difference(q_b, q_a)


def link_jacobian(model: Model, q: torch.Tensor, link: str) -> torch.Tensor:
    """``[W, 6, nv]`` Jacobian of link ``link`` (rows 0-2: velocity of its origin, 3-5: angular velocity,
    world axes), as :func:`~kangengine.sim.link_jacobians`."""
    b = model.layout.body_index(link)
    return link_jacobians(model, q)[:, b]


def _rebuilt(sim: Simulator, model: Model) -> Simulator:
    """``sim`` re-set for ``model`` with its own settings (its per-step constants are derived anew)."""
    Simulator.__init__(
        sim,
        model,
        dt=sim.dt,
        iterations=sim.iterations,
        line_search=sim._line_search,
        check_inputs=sim.check_inputs,
        solver=sim.solver,
        divergence_speed=sim.divergence_speed,
        divergence_distance=sim.divergence_distance,
        energy_correction=sim.energy_correction,
    )
    return sim


def set_joint_friction(sim: Simulator, coulomb, *, stiction_extra: float = 0.0) -> Simulator:
    """Change the Coulomb joint friction (N m or N per DOF, scalar or ``[nv]``) between steps: the model is
    not rebuilt (its other tensors are shared), the simulator's step constants are derived anew. DOFs with
    friction get ``stiction_extra`` on top (as :class:`~kangengine.sim.JointFriction`), others none.
    Returns ``sim`` (changed in place; ``sim.model`` is the new model)."""
    return _rebuilt(sim, sim.model.with_joint_friction(coulomb, stiction_extra=stiction_extra))


def set_joint_inertia(sim: Simulator, armature) -> Simulator:
    """Change the joint inertia (armature, kg m^2 or kg per DOF, scalar or ``[nv]``) between steps, as
    :func:`set_joint_friction`. Returns ``sim``."""
    return _rebuilt(sim, sim.model.with_joint_inertia(armature))

"""Batched Torch articulation simulator: exact rigid-body dynamics, implicit integration by incremental-
potential minimisation, PD drives, limits, joint and contact friction, ground contact, cycle joints, tendons,
hard and compliant mimic joints, drive envelopes, Cartesian pose targets, IK and the runtime helpers."""

from . import runtime
from .constraints import ConstraintRows, constraint_rows
from .contact import ContactGeometry, contact_force_per_body
from .control import Control, friction_force, friction_phi, friction_phi_derivative, friction_potential
from .drives import DriveEnvelope, with_drive_envelope
from .dynamics import (
    bias_forces,
    forward_dynamics,
    inverse_dynamics,
    kinetic_energy,
    mass_matrix,
    momentum,
    potential_energy,
)
from .ik import IKResult, solve_ik
from .integrator import LinearSolver, Simulator, StepResult
from .kinematics import LinkVelocities, link_jacobians, link_transforms, link_velocities
from .model import ContactParams, JointFriction, Model, State, read_effort_limits
from .pose import PoseTargets
from .runtime import (
    add_delta_to_pose,
    dof_limits,
    link_jacobian,
    pose_delta,
    pose_from_joints,
    pose_from_links,
    root_transform,
    set_joint_friction,
    set_joint_inertia,
    set_root_transform,
    total_mass,
)
from .tracking import (
    FeedForward,
    TrackingReference,
    TrackingResult,
    TrackingSettings,
    drive_gains,
    prepare_reference,
    track,
)
from .verdict import Reason, Severity, ValidationThresholds, Verdict, summarize, verdict_of

__all__ = [
    "Model",
    "State",
    "read_effort_limits",
    "ContactParams",
    "JointFriction",
    "link_jacobians",
    "link_velocities",
    "link_transforms",
    "LinkVelocities",
    "mass_matrix",
    "bias_forces",
    "inverse_dynamics",
    "forward_dynamics",
    "kinetic_energy",
    "potential_energy",
    "momentum",
    "Simulator",
    "StepResult",
    "LinearSolver",
    "Control",
    "friction_phi",
    "friction_phi_derivative",
    "friction_force",
    "friction_potential",
    "ContactGeometry",
    "contact_force_per_body",
    "track",
    "prepare_reference",
    "drive_gains",
    "TrackingSettings",
    "TrackingReference",
    "TrackingResult",
    "FeedForward",
    "ValidationThresholds",
    "summarize",
    "verdict_of",
    "Reason",
    "Severity",
    "Verdict",
    "ConstraintRows",
    "constraint_rows",
    "DriveEnvelope",
    "with_drive_envelope",
    "PoseTargets",
    "IKResult",
    "solve_ik",
    "runtime",
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

"""Batched Torch articulation simulator: exact rigid-body dynamics, implicit integration by incremental-
potential minimisation, PD drives, limits, joint and contact friction, ground contact."""

from .contact import ContactGeometry, contact_force_per_body
from .control import Control, friction_force, friction_phi, friction_phi_derivative, friction_potential
from .dynamics import (
    bias_forces,
    forward_dynamics,
    inverse_dynamics,
    kinetic_energy,
    mass_matrix,
    momentum,
    potential_energy,
)
from .integrator import LinearSolver, Simulator, StepResult
from .kinematics import LinkVelocities, link_jacobians, link_transforms, link_velocities
from .model import ContactParams, JointFriction, Model, State
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
]

"""Retargeting: motion moved from one skeleton onto another.

:mod:`.skeleton`: skeleton-to-skeleton retargeting by T-pose (joint map, rotation offset, scale, ground fix),
with named configurations shipped in ``configs/`` (:func:`load_retarget_config`, :func:`list_retarget_configs`).

:mod:`.robot`: human -> robot retargeting, whole clips at once (one clip or a list of clips batched; Levenberg-
Marquardt IK in torch on CPU or CUDA, contact-correct feet, self-collision avoidance between capsule proxies of
the robot's collision geoms (:mod:`.self_collision`), per-clip metrics): :func:`retarget_to_robot`, configured by
:class:`RobotRetargetConfig` (:func:`load_robot_config`, :func:`list_robot_configs`).
"""

from .robot import RobotRetargetResult, retarget_to_robot
from .robot_config import (
    BodyCorrespondence,
    ContactOptions,
    FootSpec,
    HeadingAlignment,
    RobotRetargetConfig,
    SolverOptions,
    list_robot_configs,
    load_robot_config,
)
from .skeleton import (
    GroundFix,
    GroundReference,
    JointAdjustment,
    RetargetConfig,
    RetargetResult,
    TPoseSpec,
    list_retarget_configs,
    load_retarget_config,
    make_tpose,
    retarget_motion,
)

__all__ = [
    "GroundFix",
    "GroundReference",
    "JointAdjustment",
    "TPoseSpec",
    "RetargetConfig",
    "RetargetResult",
    "retarget_motion",
    "make_tpose",
    "load_retarget_config",
    "list_retarget_configs",
    "RobotRetargetConfig",
    "RobotRetargetResult",
    "BodyCorrespondence",
    "FootSpec",
    "ContactOptions",
    "SolverOptions",
    "HeadingAlignment",
    "retarget_to_robot",
    "load_robot_config",
    "list_robot_configs",
]

"""Retargeting: motion moved from one skeleton onto another.

:mod:`.skeleton`: skeleton-to-skeleton retargeting by T-pose (joint map, rotation offset, scale, ground fix),
with named configurations shipped in ``configs/`` (:func:`load_retarget_config`, :func:`list_retarget_configs`).
"""

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
]

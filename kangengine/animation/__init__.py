"""Skeletons, coordinate layouts, articulation motion and the shared forward kinematics."""

from .layout import ArticulationCoordinateLayout, CoordinateBlock, forward_kinematics
from .library import BodyState, Interpolation, MotionLibrary, MotionSample, PackedMotionBuffers
from .mapper import ArticulationMotionMapper, CoordinatesResult, MappingResult, SkeletonOffsetWarning
from .motion import ArticulationMotion, load_articulation_motion_npz, save_articulation_motion_npz
from .retarget import RetargetConfig, RetargetResult, list_retarget_configs, load_retarget_config, retarget_motion
from .skeleton import SkeletonMotion, SkeletonState, SkeletonTree

__all__ = [
    "ArticulationCoordinateLayout",
    "CoordinateBlock",
    "forward_kinematics",
    "ArticulationMotion",
    "save_articulation_motion_npz",
    "load_articulation_motion_npz",
    "SkeletonTree",
    "SkeletonState",
    "SkeletonMotion",
    "ArticulationMotionMapper",
    "MappingResult",
    "CoordinatesResult",
    "SkeletonOffsetWarning",
    "MotionLibrary",
    "MotionSample",
    "BodyState",
    "PackedMotionBuffers",
    "Interpolation",
    "retarget",
    "retarget_motion",
    "RetargetConfig",
    "RetargetResult",
    "load_retarget_config",
    "list_retarget_configs",
]

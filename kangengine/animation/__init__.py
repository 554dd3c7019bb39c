"""Skeletons, coordinate layouts, articulation motion and the shared forward kinematics.

``output_pool`` is the bounded pool of freed large output buffers the mapper's results come from
(:mod:`kangengine._buffers`: ``set_limit``, ``stats``, ``release``)."""

from .. import _buffers as output_pool
from .layout import ArticulationCoordinateLayout, CoordinateBlock, forward_kinematics
from .library import BodyState, Interpolation, MotionLibrary, MotionSample, PackedMotionBuffers
from .mapper import ArticulationMotionMapper, CoordinatesResult, MappingResult, SkeletonOffsetWarning
from .motion import ArticulationMotion, load_articulation_motion_npz, save_articulation_motion_npz
from .skeleton import SkeletonMotion, SkeletonState, SkeletonTree, motion_yup_from_zup, motion_zup_from_yup

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
    "motion_zup_from_yup",
    "motion_yup_from_zup",
    "ArticulationMotionMapper",
    "MappingResult",
    "CoordinatesResult",
    "SkeletonOffsetWarning",
    "MotionLibrary",
    "MotionSample",
    "BodyState",
    "PackedMotionBuffers",
    "Interpolation",
    "output_pool",
]

"""`MotionLibrary`: many clips packed frame-major in torch tensors, sampled for thousands of environments."""

from .core import (
    LIBRARY_FORMAT,
    LIBRARY_FORMAT_VERSION,
    BodyState,
    Interpolation,
    MixedSkeletonError,
    MotionLibrary,
    MotionSample,
    PackedMotionBuffers,
    UnknownMotionError,
    nlerp_max_error,
)

__all__ = [
    "MotionLibrary",
    "MotionSample",
    "BodyState",
    "PackedMotionBuffers",
    "Interpolation",
    "UnknownMotionError",
    "MixedSkeletonError",
    "nlerp_max_error",
    "LIBRARY_FORMAT",
    "LIBRARY_FORMAT_VERSION",
]

"""Motion files in and out: BVH (read + write) and FBX (read, through pyassimp + libassimp).

Every reader returns a :class:`~kangengine.animation.SkeletonMotion` in metres, Z up, X forward, WXYZ,
with the file's own frame rate. The Y-up -> Z-up conversion lives in :mod:`kangengine.conventions`; the
dispatcher over every format (these and the dataset arrays) is :func:`kangengine.pipelines.load_motion`.
"""

from __future__ import annotations

from .bvh import BVH_LENGTH_UNITS, BVHFrameCountWarning, load_bvh, save_bvh
from .fbx import fbx_take_names, load_fbx  # pyassimp itself is imported on the first read

__all__ = [
    "load_bvh",
    "save_bvh",
    "BVH_LENGTH_UNITS",
    "BVHFrameCountWarning",
    "load_fbx",
    "fbx_take_names",
]

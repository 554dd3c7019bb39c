"""Motion files in and out: BVH (read + write), FBX (read, through pyassimp + libassimp), and a dispatcher.

``ke.io.load_motion(path)`` picks the reader from the file's extension (see :data:`MOTION_LOADERS`);
every reader returns a :class:`~kangengine.animation.SkeletonMotion` in metres, Z up, X forward, WXYZ,
with the file's own frame rate. The Y-up -> Z-up conversion lives in :mod:`kangengine.io.axes`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import FileMissingError, FormatError
from . import axes
from .bvh import BVH_LENGTH_UNITS, BVHFrameCountWarning, load_bvh, save_bvh
from .fbx import fbx_take_names, load_fbx  # pyassimp itself is imported on the first read

__all__ = [
    "axes",
    "load_bvh",
    "save_bvh",
    "BVH_LENGTH_UNITS",
    "BVHFrameCountWarning",
    "load_fbx",
    "fbx_take_names",
    "load_motion",
    "MOTION_LOADERS",
]

#: Extension (lower case, with the dot) -> ``"module:function"`` of the reader ``load_motion`` calls.
#: The function takes ``(path, **kw)`` and returns a ``SkeletonMotion``.
MOTION_LOADERS: dict[str, str] = {
    ".bvh": "kangengine.io.bvh:load_bvh",
    ".fbx": "kangengine.io.fbx:load_fbx",
    ".npz": "kangengine.datasets.arrays:load_npz_motion",  # SkeletonMotion.save_npz files or AMASS clips
    ".npy": "kangengine.datasets.arrays:load_poselib_motion",  # poselib SkeletonMotion (restricted unpickler)
}


def _resolve(target: str):
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_motion(path: str | os.PathLike, **kw):
    """Read a motion file into a :class:`~kangengine.animation.SkeletonMotion`, by extension.

    ``.bvh`` -> :func:`load_bvh`, ``.fbx`` -> :func:`load_fbx`, ``.npz`` -> ``SkeletonMotion.load_npz`` for
    files written by ``SkeletonMotion.save_npz`` or :func:`kangengine.datasets.amass.load` for AMASS clips,
    ``.npy`` -> :func:`kangengine.datasets.arrays.load_poselib_motion` (poselib clips); other readers register
    in :data:`MOTION_LOADERS`.
    Keyword arguments go to the reader.

    Raises:
        FileMissingError: no such file.
        FormatError: an extension no reader handles (the message lists those that are handled), or
            whatever the reader raises for a bad file.
    """
    p = Path(path)
    if not p.is_file():
        raise FileMissingError("no such motion file", path=p)
    ext = p.suffix.lower()
    if ext not in MOTION_LOADERS:
        raise FormatError(
            f"no motion reader for {ext or 'files without extension'!r}; readers exist for "
            f"{', '.join(sorted(MOTION_LOADERS))}",
            path=p,
        )
    return _resolve(MOTION_LOADERS[ext])(p, **kw)

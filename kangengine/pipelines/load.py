"""One dispatcher for every motion format: ``load_motion(path)`` picks the reader from the file's extension.

Every reader returns a :class:`~kangengine.animation.SkeletonMotion` in metres, Z up, X forward, WXYZ, with
the file's own frame rate. The readers themselves live in their layers (``ke.io`` for BVH and FBX,
``ke.datasets`` for AMASS and poselib arrays); only this module knows all of them.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from .._files import npz_keys
from ..animation.skeleton import SkeletonMotion
from ..errors import FileMissingError, FormatError

__all__ = ["load_motion", "load_npz_motion", "MOTION_LOADERS"]

#: Extension (lower case, with the dot) -> ``"module:function"`` of the reader :func:`load_motion` calls.
#: The function takes ``(path, **kw)`` and returns a ``SkeletonMotion``.
MOTION_LOADERS: dict[str, str] = {
    ".bvh": "kangengine.io.bvh:load_bvh",
    ".fbx": "kangengine.io.fbx:load_fbx",
    ".npz": "kangengine.pipelines.load:load_npz_motion",  # SkeletonMotion.save_npz files or AMASS clips
    ".npy": "kangengine.datasets.arrays:load_poselib_motion",  # poselib SkeletonMotion (restricted unpickler)
}


def _resolve(target: str):
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_motion(path: str | os.PathLike, **kw) -> SkeletonMotion:
    """Read a motion file into a :class:`~kangengine.animation.SkeletonMotion`, by extension.

    ``.bvh`` -> :func:`kangengine.io.load_bvh`, ``.fbx`` -> :func:`kangengine.io.load_fbx`, ``.npz`` ->
    :func:`load_npz_motion` (``SkeletonMotion.save_npz`` files or AMASS clips), ``.npy`` ->
    :func:`kangengine.datasets.arrays.load_poselib_motion` (poselib clips); other readers register in
    :data:`MOTION_LOADERS`. Keyword arguments go to the reader.

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


def load_npz_motion(path: str | os.PathLike, **kw) -> SkeletonMotion:
    """Read a motion ``.npz`` of either kind, without pickle (:func:`load_motion` uses it for ``.npz``):
    a file written by ``SkeletonMotion.save_npz`` (key ``format``), or an AMASS / SMPL-family clip (key
    ``poses`` or ``root_orient``; keyword arguments go to :func:`kangengine.datasets.amass.load`).

    The kind is told from the zip directory alone; the reader then reads only the members it uses, with
    memory bounded by the file's size (:func:`kangengine._files.load_npz`).

    Raises:
        FileMissingError, FormatError: no such file; not an npz file; neither layout (the message lists the
            file's keys).
    """
    keys = set(npz_keys(path, kind="motion"))  # the zip directory only: no member is read here
    if "format" in keys:
        if kw:
            raise FormatError(f"options {sorted(kw)} apply to AMASS files only", path=path)
        return SkeletonMotion.load_npz(path)
    if "poses" in keys or "root_orient" in keys:
        from ..datasets import amass

        return amass.load(path, **kw)
    raise FormatError(
        f"neither a KangEngine motion (key 'format') nor an AMASS clip (key 'poses'); the file holds {sorted(keys)}",
        path=path,
    )

"""Errors raised by KangEngine.

Every error a user can trigger with bad input is a :class:`KangEngineError` subclass whose message
names the file (when there is one), the element or array at fault, and what was expected.
"""

from __future__ import annotations

import os

__all__ = [
    "KangEngineError",
    "FileMissingError",
    "FormatError",
    "UnsupportedJointError",
    "TopologyError",
    "DuplicateNameError",
    "NonFiniteError",
    "ShapeError",
    "LayoutMismatch",
    "LayoutSignatureWarning",
    "UnknownNameError",
    "MotionError",
    "MissingDependencyError",
    "UnknownMotionError",
    "MixedSkeletonError",
    "BVHFrameCountWarning",
    "UnitsWarning",
]


def _where(path: str | os.PathLike | None, item: str | None) -> str:
    parts = []
    if path is not None:
        parts.append(f"{os.fspath(path)}")
    if item:
        parts.append(item)
    return ": ".join(parts)


class KangEngineError(Exception):
    """Base class of every KangEngine error.

    Args:
        message: what went wrong and what was expected.
        path: the file at fault, if any (kept as ``self.path``).
        item: the element, key, line or array at fault (kept as ``self.item``).
    """

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, item: str | None = None):
        self.path = None if path is None else os.fspath(path)
        self.item = item
        where = _where(path, item)
        super().__init__(f"{where}: {message}" if where else message)


class FileMissingError(KangEngineError, FileNotFoundError):
    """A file that was named does not exist."""


class FormatError(KangEngineError, ValueError):
    """A file or array is malformed: bad XML, missing attribute, non-numeric value, wrong layout."""


class UnsupportedJointError(FormatError):
    """A joint type KangEngine cannot represent (e.g. URDF ``planar``)."""


class TopologyError(FormatError):
    """The kinematic structure is not a rooted tree (a cycle, several roots, a missing parent)."""


class DuplicateNameError(FormatError):
    """Two bodies or two joints share a name, or a name holds the reserved ``/``."""


class NonFiniteError(KangEngineError, ValueError):
    """An input array holds NaN or infinity."""


class ShapeError(KangEngineError, ValueError):
    """An input array has the wrong shape or dtype."""


class UnknownNameError(KangEngineError, KeyError):
    """A body, joint or clip name that does not exist; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return Exception.__str__(self)


class LayoutMismatch(KangEngineError, ValueError):
    """Data built for one coordinate layout was used with another (nq, nv or signature differ)."""


class MotionError(KangEngineError, ValueError):
    """A motion cannot be converted as asked (e.g. prismatic joints back to skeleton motion)."""


class MissingDependencyError(KangEngineError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class LayoutSignatureWarning(UserWarning):
    """Data was made for a layout with the same nq/nv but a different ``model_signature``."""


class UnknownMotionError(KangEngineError, IndexError):
    """A motion id that is not in a motion library (the message gives the valid range)."""


class MixedSkeletonError(MotionError):
    """Clips on different skeletons (node names, parents or rest translations differ)."""


class BVHFrameCountWarning(UserWarning):
    """The ``Frames:`` line of a BVH file disagrees with the number of motion rows (the rows are used)."""


class UnitsWarning(UserWarning):
    """A loaded skeleton has an implausible size for its declared units (e.g. a human 16 m tall)."""

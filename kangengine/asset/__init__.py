"""Articulation assets: :class:`ArticulationDesc` and the MJCF / URDF loaders."""

from .desc import (
    ArticulationDesc,
    BodyDesc,
    CycleJointDesc,
    GeomDesc,
    GeomType,
    JointDesc,
    JointType,
    MimicDesc,
    TendonDesc,
    reorder_bodies,
)
from .mjcf import MJCFLoader
from .urdf import URDFLoader

__all__ = [
    "ArticulationDesc",
    "BodyDesc",
    "JointDesc",
    "GeomDesc",
    "MimicDesc",
    "TendonDesc",
    "CycleJointDesc",
    "JointType",
    "GeomType",
    "MJCFLoader",
    "URDFLoader",
    "reorder_bodies",
    "load",
]


def load(path, order: str = "DFS", **kwargs) -> ArticulationDesc:
    """Load an articulation by file extension: ``.xml``/``.mjcf`` (MJCF) or ``.urdf`` (URDF)."""
    from pathlib import Path

    from ..errors import FormatError

    suffix = Path(path).suffix.lower()
    if suffix in (".xml", ".mjcf"):
        return MJCFLoader.load(path, order=order, **kwargs)
    if suffix == ".urdf":
        return URDFLoader.load(path, order=order, **kwargs)
    raise FormatError(f"unknown articulation file type {suffix!r}; expected .xml, .mjcf or .urdf", path=path)

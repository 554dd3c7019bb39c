"""Articulation assets: :class:`ArticulationDesc`, the MJCF / URDF loaders, ``.superdex_bot`` robot assets and
root selection."""

from .bot import (
    BotContactOverride,
    BotCycleJoint,
    BotFormatError,
    BotJointFriction,
    BotJointPrefab,
    BotJointType,
    BotLinkPrefab,
    BotMassProperties,
    BotMeshRef,
    BotPrefab,
    BotSensorPrefab,
    MassPropertiesError,
    TransformRT,
    load_bot,
    parse_bot,
    save_bot,
)
from .bot_archive import ArchiveError, default_bot_cache_dir, extract_bot_archive
from .bot_desc import (
    bot_from_desc,
    bot_from_urdf,
    bot_link_mass_properties,
    bot_link_transforms,
    bot_pose_joint_values,
    bot_to_desc,
)
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
from .mesh_inertia import MeshError, MeshMassProperties, load_triangle_mesh, mesh_mass_properties
from .mjcf import MJCFLoader
from .topology import AUTO_ROOT, GraphJoint, RootSelection, desc_graph, reroot, select_root
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
    # .superdex_bot
    "BotPrefab",
    "BotJointPrefab",
    "BotLinkPrefab",
    "BotJointType",
    "BotJointFriction",
    "BotMassProperties",
    "BotMeshRef",
    "BotSensorPrefab",
    "BotContactOverride",
    "BotCycleJoint",
    "TransformRT",
    "BotFormatError",
    "MassPropertiesError",
    "ArchiveError",
    "MeshError",
    "MeshMassProperties",
    "load_bot",
    "save_bot",
    "parse_bot",
    "bot_to_desc",
    "bot_from_desc",
    "bot_from_urdf",
    "bot_link_transforms",
    "bot_link_mass_properties",
    "bot_pose_joint_values",
    "extract_bot_archive",
    "default_bot_cache_dir",
    "load_triangle_mesh",
    "mesh_mass_properties",
    # root selection
    "AUTO_ROOT",
    "GraphJoint",
    "RootSelection",
    "select_root",
    "desc_graph",
    "reroot",
]


def load(path, order: str = "DFS", *, root: str | None = None, **kwargs) -> ArticulationDesc:
    """Load an articulation by file extension: ``.xml``/``.mjcf`` (MJCF), ``.urdf`` (URDF), ``.superdex_bot`` or
    ``.superdex_bot_archive`` (via :func:`load_bot` and :func:`bot_to_desc`).

    ``root``: ``None`` keeps the file's root; a body name re-roots the tree there, ``"auto"`` applies
    :func:`select_root`'s rule (see :func:`reroot`). A fixed-base model (MJCF: a root welded or jointed to the
    world; URDF: a ``world`` link; a bot: a non-Free world joint) keeps its world-attached root and refuses
    another with :class:`~kangengine.errors.TopologyError`.
    """
    from pathlib import Path

    from ..errors import FormatError

    name = Path(path).name.lower()
    suffix = Path(path).suffix.lower()
    if suffix in (".xml", ".mjcf"):
        return reroot(MJCFLoader.load(path, order=order, **kwargs), root, welded_root=True)
    if suffix == ".urdf":
        return URDFLoader.load(path, order=order, root=root, **kwargs)
    if name.endswith((".superdex_bot", ".superdex_bot_archive")):
        return reroot(bot_to_desc(load_bot(path, **kwargs), order=order), root)
    raise FormatError(
        f"unknown articulation file type {suffix!r}; expected .xml, .mjcf, .urdf, .superdex_bot or "
        ".superdex_bot_archive",
        path=path,
    )

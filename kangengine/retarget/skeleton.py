"""Skeleton-to-skeleton retargeting by T-pose (the poselib algorithm, vectorised).

A motion on a source skeleton (a BVH or FBX performer, an SMPL body) is moved onto a target skeleton
(a character's or a robot's own skeleton, ``SkeletonTree.from_articulation(desc)``) with:

* a **joint map** ``source joint -> target joint`` (a target joint takes its world rotation from one source
  joint; unmapped target joints keep their T-pose (rest) local rotation, unmapped source joints are unused);
* a **source T-pose** and a **target T-pose**: the same physical pose (a T-pose, say) on both skeletons.
  Each pose's world rotations absorb the difference in joint frame conventions between the skeletons;
* a **rotation offset** ``Q`` (WXYZ) that turns the source world into the target world (poselib's
  ``rotation_to_target_skeleton``: e.g. a source facing -Y onto a target facing +X);
* a **root-translation scale** (target size / source size, including any unit change);
* a **ground fix**: shift the motion vertically so that its lowest point (body origins, or the target's
  collision geoms) is at ``z = 0``, then add ``root_height_offset``.

For every frame and mapped pair ``(s, t)``, with ``G`` world rotations::

    G_target[t] = Q G_source[s] G_source_tpose[s]^-1 Q^-1 G_target_tpose[t]
    root_target = target_tpose_root + scale * Q (source_root - source_tpose_root)

``source_root`` is the world position of the source joint mapped to the target's root. The result is a
:class:`~kangengine.animation.SkeletonMotion` on the target tree; for an articulation target its local
rotations include every body's rest rotation, as :class:`~kangengine.animation.ArticulationMotionMapper`
expects.

Configurations are frozen dataclasses, loadable from JSON (:meth:`RetargetConfig.from_json`); named
configurations ship with KangEngine (:func:`load_retarget_config`, :func:`list_retarget_configs`).
"""

from __future__ import annotations

import enum
import json
import math
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .. import rotations as R
from .._files import read_json
from ..animation.skeleton import SkeletonMotion, SkeletonState, SkeletonTree
from ..errors import FileMissingError, FormatError, KangEngineError, MotionError, ShapeError, UnknownNameError

__all__ = [
    "GroundFix",
    "GroundReference",
    "JointAdjustment",
    "TPoseSpec",
    "RetargetConfig",
    "RetargetResult",
    "make_tpose",
    "load_retarget_config",
    "list_retarget_configs",
    "retarget_motion",
]

_CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class GroundFix(enum.Enum):
    """How the retargeted motion is put on the ground (``z = 0``) before ``root_height_offset``."""

    #: no vertical shift
    NONE = "none"
    #: the lowest point over the whole clip goes to ``z = 0`` (poselib's ``retarget_motion.py``)
    CLIP_MIN = "clip_min"
    #: the lowest point of the first frame goes to ``z = 0``
    FIRST_FRAME = "first_frame"
    #: each frame is shifted by the lowest point within ``ground_window_s`` around it (a running minimum,
    #: then a running mean over the same window): removes a slow drift of the floor height (a tilted or
    #: badly calibrated capture floor) while flights shorter than the window stay in the air
    ROLLING_MIN = "rolling_min"


class GroundReference(enum.Enum):
    """Which points the ground fix looks at."""

    #: body (joint) origins, as poselib does
    BODY_ORIGINS = "body_origins"
    #: the lowest points of the target's collision geoms (spheres, capsules, cylinders, boxes, ellipsoids)
    #: when the target is an articulation that has them; body origins otherwise
    COLLISION_GEOMS = "collision_geoms"


@dataclass(frozen=True, eq=False)
class JointAdjustment:
    """A rotation applied to one joint's rest local rotation to make a T-pose:
    ``local = exp(angle * axis) * rest_local`` (left multiplication: about ``axis`` in the parent's frame).

    Attributes:
        joint: node (body) name.
        axis: ``[3]`` rotation axis in the joint's parent frame (normalised on construction).
        angle_deg: rotation angle in degrees.
    """

    joint: str
    axis: np.ndarray
    angle_deg: float

    def __post_init__(self):
        a = np.asarray(self.axis, dtype=np.float64).reshape(-1)
        if a.shape != (3,) or not np.isfinite(a).all() or np.linalg.norm(a) < 1e-12:
            raise FormatError(f"axis {self.axis!r}; expected a non-zero 3-vector", item=f"adjust {self.joint}")
        a = a / np.linalg.norm(a)
        a.setflags(write=False)
        object.__setattr__(self, "axis", a)
        object.__setattr__(self, "angle_deg", float(self.angle_deg))

    @property
    def quat_wxyz(self) -> np.ndarray:
        return R.quat_from_axis_angle(self.axis, math.radians(self.angle_deg))

    def to_dict(self) -> dict:
        return {"joint": self.joint, "axis": [float(x) for x in self.axis], "angle_deg": self.angle_deg}


@dataclass(frozen=True, eq=False)
class TPoseSpec:
    """How to build a T-pose of a skeleton (see :func:`make_tpose`).

    Attributes:
        adjust: rotations applied, in order, to the rest pose's local rotations. The rest pose is: for an
            articulation, the neutral configuration (each body at its rest ``parent_from_body`` rotation);
            for a skeleton, identity local rotations (a BVH file's rest pose).
        global_rotation_wxyz: optional world rotations of named joints, set after ``adjust`` (parents
            before children; the other joints keep their local rotation). This is how a T-pose stored as a
            file (poselib ``cmu_tpose.npy``) travels inside a JSON configuration.
    """

    adjust: tuple[JointAdjustment, ...] = ()
    global_rotation_wxyz: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "adjust", tuple(self.adjust))
        g = {str(k): tuple(float(x) for x in v) for k, v in dict(self.global_rotation_wxyz).items()}
        for k, v in g.items():
            if len(v) != 4 or not all(math.isfinite(x) for x in v) or abs(math.sqrt(sum(x * x for x in v)) - 1) > 1e-3:
                raise FormatError(f"{v}; expected a unit WXYZ quaternion", item=f"global_rotation_wxyz.{k}")
        object.__setattr__(self, "global_rotation_wxyz", types.MappingProxyType(g))

    @classmethod
    def from_dict(cls, d: Mapping | None, *, item: str = "tpose") -> TPoseSpec:
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise FormatError(f"is {type(d).__name__}; expected an object", item=item)
        unknown = set(d) - {"from", "adjust", "global_rotation_wxyz"}
        if unknown:
            raise FormatError(f"unknown keys {sorted(unknown)}; expected from, adjust, global_rotation_wxyz", item=item)
        if d.get("from", "rest") != "rest":
            raise FormatError(f"from is {d['from']!r}; expected 'rest'", item=item)
        adj = []
        for i, a in enumerate(d.get("adjust", ())):
            try:
                adj.append(JointAdjustment(str(a["joint"]), a["axis"], float(a["angle_deg"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"adjust[{i}] is {a!r}; expected {{joint, axis, angle_deg}}", item=item) from exc
        return cls(adjust=tuple(adj), global_rotation_wxyz=d.get("global_rotation_wxyz", {}))

    def to_dict(self) -> dict:
        out: dict = {"from": "rest", "adjust": [a.to_dict() for a in self.adjust]}
        if self.global_rotation_wxyz:
            out["global_rotation_wxyz"] = {k: list(v) for k, v in self.global_rotation_wxyz.items()}
        return out


@dataclass(frozen=True, eq=False)
class RetargetConfig:
    """Everything that defines a retargeting from one skeleton family to another.

    Attributes:
        joint_mapping: ``{source joint: target joint}`` (read-only mapping). The target's root must be mapped.
            A key may list alternative source names separated by ``|`` (``"LeftHandIndex1|LFingers"``: the
            cgspeed BVH releases name the finger joint either way); the first one the source has is used.
        rotation_wxyz: ``[4]`` rotation ``Q`` from the source world to the target world (applied to the
            source motion and the source T-pose).
        scale: root-translation scale (target size / source size, in the source's length unit), or
            ``"auto"``: the ratio of the T-poses' root heights above their lowest mapped joint.
        root_height_offset: m added to the root height after the ground fix.
        ground_fix: see :class:`GroundFix`.
        ground_reference: see :class:`GroundReference`.
        source_tpose, target_tpose: :class:`TPoseSpec` of each side.
        trim_frames: optional ``(begin, end)`` source frames kept (``end`` exclusive; ``-1``: to the end),
            applied before the ground fix.
        project_hinges: for an articulation target, give every mapped body that turns on a single hinge
            (a knee, an elbow) under a parent that reaches every rotation (a ball, three perpendicular
            hinges, the free root) the hinge angle that keeps its child's world position, and turn the parent
            about the parent->body bone so the child lands where the source puts it (poselib's
            ``project_joints``, for any hinge axis). Body positions then survive the mapping to joint angles.
        ground_window_s: window (s) of ``GroundFix.ROLLING_MIN``.
        level_feet: ``((foot, toe), ...)`` target bodies (toe may be ``""``): for an articulation target with
            collision geoms, each foot gets the one constant pitch about its lateral axis that puts its
            sole level (heel geoms as low as toe geoms) in the frames where it stands, the T-pose difference a
            joint map cannot see (the CMU humanoid otherwise stands on its toe spheres, heels 2-4 cm up).
            The angles are recorded in ``metadata["retarget"]["feet_levelled_deg"]``; a foot without
            collision geoms (or a target without any) is left as it is and named, with why, in
            ``metadata["retarget"]["feet_not_levelled"]``.
        name: configuration name.
        description: what the configuration expects (source skeleton, target model).
        target_asset: the default target model file, if any: absolute, or relative to the folder of the
            configuration file (shipped configurations: ``kangengine/retarget/configs/``); see
            :meth:`target_model_path`.
        attribution: where the numbers came from (licenses of third-party configurations).
        config_dir: folder of the file the configuration was read from (``None``: built in Python); not
            written by :meth:`to_dict`.
    """

    joint_mapping: Mapping[str, str]
    rotation_wxyz: np.ndarray = field(default_factory=lambda: np.array([1.0, 0.0, 0.0, 0.0]))
    scale: float | str = 1.0
    root_height_offset: float = 0.0
    ground_fix: GroundFix = GroundFix.CLIP_MIN
    ground_reference: GroundReference = GroundReference.BODY_ORIGINS
    source_tpose: TPoseSpec = field(default_factory=TPoseSpec)
    target_tpose: TPoseSpec = field(default_factory=TPoseSpec)
    trim_frames: tuple[int, int] | None = None
    project_hinges: bool = True
    ground_window_s: float = 1.0
    level_feet: tuple[tuple[str, str], ...] = ()
    name: str = ""
    description: str = ""
    target_asset: str | None = None
    attribution: str = ""
    config_dir: str | None = None

    def __post_init__(self):
        jm = dict(self.joint_mapping)
        if not jm:
            raise FormatError("is empty; expected {source joint: target joint}", item="joint_mapping")
        targets = list(jm.values())
        dup = sorted({t for t in targets if targets.count(t) > 1})
        if dup:
            raise FormatError(f"target joints mapped from several source joints: {dup}", item="joint_mapping")
        object.__setattr__(self, "joint_mapping", types.MappingProxyType({str(k): str(v) for k, v in jm.items()}))
        q = np.asarray(self.rotation_wxyz, dtype=np.float64).reshape(-1)
        if q.shape != (4,) or not np.isfinite(q).all() or abs(np.linalg.norm(q) - 1.0) > 1e-3:
            raise FormatError(f"{self.rotation_wxyz!r}; expected a unit WXYZ quaternion", item="rotation_wxyz")
        q = q / np.linalg.norm(q)
        q.setflags(write=False)
        object.__setattr__(self, "rotation_wxyz", q)
        if isinstance(self.scale, str):
            if self.scale != "auto":
                raise FormatError(f"scale {self.scale!r}; expected a number > 0 or 'auto'", item="scale")
        elif not (math.isfinite(float(self.scale)) and float(self.scale) > 0):
            raise FormatError(f"scale {self.scale!r}; expected a number > 0 or 'auto'", item="scale")
        else:
            object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "root_height_offset", float(self.root_height_offset))
        if not (math.isfinite(float(self.ground_window_s)) and float(self.ground_window_s) > 0):
            raise FormatError(f"{self.ground_window_s!r}; expected seconds > 0", item="ground_window_s")
        object.__setattr__(self, "ground_window_s", float(self.ground_window_s))
        try:
            feet = tuple((str(f), str(t)) for f, t in self.level_feet)
        except (TypeError, ValueError):
            raise FormatError(
                f'{self.level_feet!r}; expected a list of [foot body, toe body or ""] pairs', item="level_feet"
            ) from None
        object.__setattr__(self, "level_feet", feet)
        object.__setattr__(self, "ground_fix", _enum(GroundFix, self.ground_fix, "ground_fix"))
        object.__setattr__(self, "ground_reference", _enum(GroundReference, self.ground_reference, "ground_reference"))
        if self.trim_frames is not None:
            t = tuple(int(x) for x in self.trim_frames)
            if len(t) != 2 or t[0] < 0 or (t[1] != -1 and t[1] <= t[0]):
                raise FormatError(f"{self.trim_frames!r}; expected (begin >= 0, end > begin or -1)", item="trim_frames")
            object.__setattr__(self, "trim_frames", t)

    # -- JSON ---------------------------------------------------------------------------------------------
    _KEYS = (
        "name",
        "description",
        "attribution",
        "target_asset",
        "joint_mapping",
        "rotation_wxyz",
        "scale",
        "root_height_offset",
        "ground_fix",
        "ground_reference",
        "source_tpose",
        "target_tpose",
        "trim_frames",
        "project_hinges",
        "ground_window_s",
        "level_feet",
        "poselib",
    )

    @classmethod
    def from_dict(cls, d: Mapping, *, path=None) -> RetargetConfig:
        """Build from the JSON object layout (see the shipped files in ``kangengine/retarget/configs/``)."""
        if not isinstance(d, Mapping):
            raise FormatError(f"holds {type(d).__name__}; expected a JSON object", path=path)
        unknown = sorted(set(d) - set(cls._KEYS))
        if unknown:
            raise FormatError(f"unknown keys {unknown}; expected some of {list(cls._KEYS)}", path=path)
        if "joint_mapping" not in d:
            raise FormatError("missing", path=path, item="joint_mapping")
        try:
            return cls(
                joint_mapping=d["joint_mapping"],
                rotation_wxyz=d.get("rotation_wxyz", (1.0, 0.0, 0.0, 0.0)),
                scale=d.get("scale", 1.0),
                root_height_offset=d.get("root_height_offset", 0.0),
                ground_fix=d.get("ground_fix", "clip_min"),
                ground_reference=d.get("ground_reference", "body_origins"),
                source_tpose=TPoseSpec.from_dict(d.get("source_tpose"), item="source_tpose"),
                target_tpose=TPoseSpec.from_dict(d.get("target_tpose"), item="target_tpose"),
                trim_frames=d.get("trim_frames"),
                project_hinges=bool(d.get("project_hinges", True)),
                ground_window_s=d.get("ground_window_s", 1.0),
                level_feet=d.get("level_feet", ()),
                name=str(d.get("name", "")),
                description=str(d.get("description", "")),
                target_asset=d.get("target_asset"),
                attribution=str(d.get("attribution", "")),
            )
        except KangEngineError as exc:
            if path is None or exc.path is not None:
                raise
            raise type(exc)(str(exc), path=path) from exc
        except (TypeError, ValueError) as exc:
            raise FormatError(f"bad value ({exc})", path=path) from exc

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> RetargetConfig:
        """Read a configuration file (the layout of :meth:`to_dict`)."""
        p = Path(path)
        d = read_json(p, kind="retarget configuration")
        return replace(cls.from_dict(d, path=p), config_dir=str(p.resolve().parent))

    def target_model_path(self) -> Path | None:
        """The default target model file (``target_asset`` resolved against ``config_dir``), or ``None``.

        Raises:
            FileMissingError: the configuration names a model file that does not exist.
        """
        if self.target_asset is None:
            return None
        p = Path(self.target_asset)
        if not p.is_absolute():
            p = Path(self.config_dir or _CONFIG_DIR) / p
        p = p.resolve()
        if not p.is_file():
            raise FileMissingError(f"the target model of configuration {self.name!r} does not exist", path=p)
        return p

    @classmethod
    def from_poselib_json(cls, path: str | os.PathLike, **overrides) -> RetargetConfig:
        """Read a poselib ``retarget_*.json`` (``joint_mapping``, ``rotation`` **XYZW**, ``scale``,
        ``root_height_offset``, ``trim_frame_beg``/``trim_frame_end``). Its T-pose files are not read: give
        T-poses to :func:`retarget` or in ``overrides`` (``source_tpose=TPoseSpec(...)``)."""
        p = Path(path)
        if not p.is_file():
            raise FileMissingError("no such poselib retarget configuration", path=p)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            xyzw = [float(x) for x in d["rotation"]]
            beg, end = int(d.get("trim_frame_beg", -1)), int(d.get("trim_frame_end", -1))
            kw = dict(
                joint_mapping=d["joint_mapping"],
                rotation_wxyz=R.quat_xyzw_to_wxyz(xyzw),
                scale=float(d["scale"]),
                root_height_offset=float(d.get("root_height_offset", 0.0)),
                name=p.stem,
                trim_frames=None if beg == -1 and end == -1 else (max(beg, 0), end),
            )
        except (KeyError, TypeError, ValueError, IndexError, json.JSONDecodeError) as exc:
            raise FormatError(
                f"not a poselib retarget configuration ({type(exc).__name__}: {exc}); expected "
                "joint_mapping, rotation (XYZW) and scale",
                path=p,
            ) from exc
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict:
        """The JSON object layout (round-trips through :meth:`from_dict`)."""
        return {
            "name": self.name,
            "description": self.description,
            "attribution": self.attribution,
            "target_asset": self.target_asset,
            "joint_mapping": dict(self.joint_mapping),
            "rotation_wxyz": [float(x) for x in self.rotation_wxyz],
            "scale": self.scale,
            "root_height_offset": self.root_height_offset,
            "ground_fix": self.ground_fix.value,
            "ground_reference": self.ground_reference.value,
            "source_tpose": self.source_tpose.to_dict(),
            "target_tpose": self.target_tpose.to_dict(),
            "trim_frames": None if self.trim_frames is None else list(self.trim_frames),
            "project_hinges": self.project_hinges,
            "ground_window_s": self.ground_window_s,
            "level_feet": [list(p) for p in self.level_feet],
        }

    def replace(self, **changes) -> RetargetConfig:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)


def _enum(cls, value, item):
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value))
    except ValueError:
        raise FormatError(f"{value!r}; expected one of {[e.value for e in cls]}", item=item) from None


def list_retarget_configs() -> tuple[str, ...]:
    """Names of the skeleton-to-skeleton configurations shipped with KangEngine (the folder also holds the
    robot configurations of :func:`kangengine.retarget.list_robot_configs`, which have no ``joint_mapping``)."""
    names = []
    for p in sorted(_CONFIG_DIR.glob("*.json")):
        try:
            if "joint_mapping" in json.loads(p.read_text(encoding="utf-8")):
                names.append(p.stem)
        except (OSError, ValueError):
            continue
    return tuple(names)


def load_retarget_config(name: str) -> RetargetConfig:
    """A shipped configuration by name (``"cmu_bvh_to_cmu_humanoid"``, ``"cmu_to_amp"``,
    ``"smpl_to_smpl_humanoid"``), or a configuration file path.

    Raises:
        UnknownNameError: no such shipped configuration (the message lists them).
    """
    p = Path(name)
    if p.suffix == ".json" and p.is_file():
        return RetargetConfig.from_json(p)
    f = _CONFIG_DIR / f"{name}.json"
    if not f.is_file():
        raise UnknownNameError(
            f"no shipped retarget configuration {name!r}; configurations are: {', '.join(list_retarget_configs())}"
        )
    return RetargetConfig.from_json(f)


# -- targets and T-poses ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Target:
    tree: SkeletonTree
    rest_local: np.ndarray  # [n, 4]
    rest_root: np.ndarray  # [3]
    desc: object | None  # ArticulationDesc when known (for geoms)
    art: _Articulation | None = None  # joints of an articulation target


def _as_target(target) -> _Target:
    from ..animation.layout import ArticulationCoordinateLayout
    from ..asset.desc import ArticulationDesc

    if isinstance(target, (str, os.PathLike)):
        from ..asset import load as load_asset

        target = load_asset(target)
    if isinstance(target, ArticulationDesc):
        tree = SkeletonTree.from_articulation(target)
        rest = np.array([b.quat_wxyz for b in target.bodies], dtype=np.float64)
        return _Target(tree, rest, tree.local_translation[0].copy(), target, _Articulation.from_desc(target))
    if isinstance(target, ArticulationCoordinateLayout):
        tree = SkeletonTree.from_articulation(target)
        rest = np.asarray(target.rest_rotations_wxyz, dtype=np.float64)
        return _Target(tree, rest, tree.local_translation[0].copy(), None, _Articulation.from_layout(target))
    if isinstance(target, SkeletonTree):
        return _Target(target, R.quat_identity(target.num_nodes), target.local_translation[0].copy(), None)
    if isinstance(target, SkeletonState):
        s = target.numpy()
        if s.batch_shape != ():
            raise ShapeError(f"a target SkeletonState of batch shape {s.batch_shape}; expected one pose", item="target")
        return _Target(
            s.tree, np.asarray(s.local_rotation, np.float64), np.asarray(s.root_translation, np.float64), None
        )
    raise ShapeError(
        f"target is {type(target).__name__}; expected an ArticulationDesc, a coordinate layout, a "
        "SkeletonTree, a SkeletonState (T-pose) or a model file path",
        item="target",
    )


def make_tpose(target, spec: TPoseSpec | None = None) -> SkeletonState:
    """A T-pose (one :class:`~kangengine.animation.SkeletonState`) of a skeleton or an articulation.

    Args:
        target: an ``ArticulationDesc`` / coordinate layout (rest pose = neutral configuration, each body at
            its rest rotation), a ``SkeletonTree`` (rest = identity local rotations, the root at its rest
            translation) or a ``SkeletonState`` (taken as the rest pose).
        spec: adjustments and explicit world rotations (:class:`TPoseSpec`).

    Returns:
        ``SkeletonState`` (float64) on the target's tree.
    """
    return _tpose_of(_as_target(target), spec or TPoseSpec())


def _tpose_of(t: _Target, spec: TPoseSpec) -> SkeletonState:
    local = t.rest_local.copy()
    tree = t.tree
    for a in spec.adjust:
        i = tree.index(a.joint)
        local[i] = R.quat_multiply(a.quat_wxyz, local[i])
    if spec.global_rotation_wxyz:
        given = {tree.index(k): np.asarray(v, dtype=np.float64) for k, v in spec.global_rotation_wxyz.items()}
        glob = np.empty_like(local)
        for i, p in enumerate(tree.parent_indices):
            if i in given:
                glob[i] = R.quat_normalize(given[i])
                local[i] = glob[i] if p < 0 else R.quat_multiply(R.quat_conjugate(glob[p]), glob[i])
            else:
                glob[i] = local[i] if p < 0 else R.quat_multiply(glob[p], local[i])
    return SkeletonState(tree, t.rest_root.copy(), R.quat_normalize(local))


# -- ground ---------------------------------------------------------------------------------------------


_GEOM_KINDS = ("sphere", "capsule", "cylinder", "box", "ellipsoid")


def _usable_geoms(desc) -> list:
    """The collision geoms of ``desc`` whose lowest point has a closed form (no meshes, planes)."""
    from ..asset.desc import GeomType

    kinds = tuple(GeomType(k) for k in _GEOM_KINDS)
    return [g for g in getattr(desc, "geoms", ()) if g.body >= 0 and g.collides and g.type in kinds]


def _geom_bottoms(geoms, pos, rot) -> np.ndarray:
    """``[T, G]`` lowest world z of each geom, given its body's world pose per geom: ``pos [T, G, 3]`` and
    ``rot [T, G, 4]`` WXYZ (float64).

    Only the third row of each body's world rotation is needed (``z`` of a rotated vector): one row per
    body and one ``[G, 3, 3]`` constant per geom, no quaternion product per geom and frame.
    """
    gpos = np.array([g.pos for g in geoms], dtype=np.float64)  # [G, 3] in the body frame
    gmat = R.quat_to_matrix(np.array([g.quat_wxyz for g in geoms], dtype=np.float64))  # [G, 3, 3]
    size = np.array([g.size for g in geoms], dtype=np.float64)  # [G, 3]
    w, x, y, z = (rot[..., k] for k in range(4))
    rb = np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=-1)  # [T, G, 3]
    centre_z = pos[..., 2] + (rb * gpos).sum(-1)
    rz = rb[..., 0:1] * gmat[:, 0] + rb[..., 1:2] * gmat[:, 1] + rb[..., 2:3] * gmat[:, 2]  # row 2 of world_from_geom
    kind = np.array([_GEOM_KINDS.index(g.type.value) for g in geoms])
    ext = np.empty_like(centre_z)
    for k in np.unique(kind):  # one vectorised formula per geom type present
        c = np.flatnonzero(kind == k)
        r, sz = rz[:, c], size[c]
        if k == 0:  # sphere
            ext[:, c] = sz[:, 0]
        elif k == 1:  # capsule: half-length along its z axis, plus the radius
            ext[:, c] = np.abs(r[..., 2]) * sz[:, 1] + sz[:, 0]
        elif k == 2:  # cylinder
            ext[:, c] = np.abs(r[..., 2]) * sz[:, 1] + sz[:, 0] * np.sqrt(np.clip(1 - r[..., 2] ** 2, 0, 1))
        elif k == 3:  # box: half-sizes
            ext[:, c] = (np.abs(r) * sz).sum(-1)
        else:  # ellipsoid
            ext[:, c] = np.sqrt(((r * sz) ** 2).sum(-1))
    return centre_z - ext


def _lowest_points(desc, body_pos, body_rot) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """``[frames]`` lowest world z over the collision geoms of ``desc`` and the origins of bodies that carry
    no usable collision geom (a foot without geometry still touches the ground at its origin), and the names
    of those bodies; None if the model has no usable geom at all."""
    geoms = _usable_geoms(desc)
    if not geoms:
        return None
    gb = np.array([g.body for g in geoms])
    body_pos = np.asarray(body_pos, dtype=np.float64)
    low = _geom_bottoms(geoms, body_pos[:, gb], np.asarray(body_rot, dtype=np.float64)[:, gb]).min(axis=1)
    bare = sorted(set(range(body_pos.shape[1])) - set(gb.tolist()))
    if bare:
        low = np.minimum(low, body_pos[:, bare, 2].min(axis=1))
    return low, tuple(desc.bodies[b].name for b in bare)


_STANCE_HEIGHT = 0.03  # m above the foot's lowest point over the clip
_STANCE_SPEED = 0.3  # m/s, horizontal speed of the foot body origin


def _sole_points(geoms) -> tuple[np.ndarray, np.ndarray]:
    """Points whose lowest world z describes where a geom can touch the ground: ``[P, 3]`` in the body
    frame and ``[P]`` radii (z of the contact = point z - radius): capsule end centres, sphere centres,
    box bottom corners (any orientation: all 8), other kinds their centre."""
    from ..asset.desc import GeomType

    pts, rad = [], []
    for g in geoms:
        c = np.asarray(g.pos, dtype=np.float64)
        m = R.quat_to_matrix(np.asarray(g.quat_wxyz, dtype=np.float64))
        sz = np.asarray(g.size, dtype=np.float64)
        if g.type is GeomType.CAPSULE:
            for sign in (-1.0, 1.0):
                pts.append(c + sign * sz[1] * m[:, 2])
                rad.append(sz[0])
        elif g.type is GeomType.BOX:
            for corner in np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T:
                pts.append(c + m @ (corner * sz))
                rad.append(0.0)
        else:
            pts.append(c)
            rad.append(sz[0] if g.type is GeomType.SPHERE else 0.0)
    return np.array(pts), np.array(rad)


@dataclass(frozen=True, eq=False)
class _FootPose:
    """A foot (body ``fi``) and its toe (body ``ti`` or None) over a clip, with their sole points."""

    pos: np.ndarray  # [T, n, 3] world body origins
    rot: np.ndarray  # [T, n, 4] WXYZ world_from_body
    local: np.ndarray  # [T, n, 4] WXYZ parent_from_body
    fi: int
    ti: int | None
    foot_points: np.ndarray  # [P, 3] in the foot frame
    toe_points: np.ndarray  # [Q, 3] in the toe frame
    toe_offset: np.ndarray | None  # [3] toe origin in the foot frame

    def sole(self, frames, axis=None, theta=0.0) -> np.ndarray:
        """``[F, P + Q, 3]`` world sole points at ``frames``, the foot pitched by ``theta`` about ``axis`` (foot
        frame; ``None``: as it is); ``theta [K]`` (an array) gives ``[K, F, P + Q, 3]``, one pitch per row."""
        gf = self.rot[frames, self.fi]
        origin = self.pos[frames, self.fi]
        if axis is not None:
            pitch = R.quat_from_axis_angle(axis, theta)
            if np.ndim(theta):  # [K] pitches at once: [K, F, ...]
                gf, pitch, origin = gf[None], pitch[:, None], np.broadcast_to(origin, (len(pitch),) + origin.shape)
            gf = R.quat_multiply(gf, pitch)
        out = [origin[..., None, :] + R.quat_rotate(gf[..., None, :], self.foot_points)]
        if len(self.toe_points):
            gt = R.quat_multiply(gf, self.local[frames, self.ti])
            pt = origin + R.quat_rotate(gf, self.toe_offset)
            out.append(pt[..., None, :] + R.quat_rotate(gt[..., None, :], self.toe_points))
        return np.concatenate(out, axis=-2)


def _bisection_points(lo: float, hi: float, depth: int) -> list[float]:
    """Every midpoint a ``depth``-step bisection of ``[lo, hi]`` can visit, computed as the bisection computes
    them (``0.5 * (lo + hi)`` down each branch): ``2**depth - 1`` points."""
    if depth == 0:
        return []
    mid = 0.5 * (lo + hi)
    return [mid] + _bisection_points(lo, mid, depth - 1) + _bisection_points(mid, hi, depth - 1)


def _bisect(f, lo: float, hi: float, f_lo: float, *, steps: int, per_call: int = 4) -> float:
    """The midpoint of the final bracket of ``steps`` bisection steps on ``f`` (``f(lo) = f_lo`` and ``f(hi)``
    of different signs), the same steps a one-point-at-a-time bisection takes: ``f`` is called on the
    ``2**per_call - 1`` points the next ``per_call`` steps can visit at once (``f([K]) -> [K]``), and the steps
    then walk them (one vectorised call replaces ``per_call`` sequential ones)."""
    done = 0
    while done < steps:
        k = min(per_call, steps - done)
        pts = _bisection_points(lo, hi, k)
        value = dict(zip(pts, np.asarray(f(np.array(pts)), dtype=np.float64).tolist()))
        for _ in range(k):
            mid = 0.5 * (lo + hi)
            f_mid = value[mid]
            if np.sign(f_mid) == np.sign(f_lo):
                lo, f_lo = mid, f_mid
            else:
                hi = mid
        done += k
    return 0.5 * (lo + hi)


class _TiltCurve:
    """The median rear-minus-front sole height over the stance frames ``S`` as a function of the foot's pitch
    ``theta`` about ``axis`` (foot frame), in closed form: a point ``v`` of the foot frame pitched by ``theta``
    is ``v cos + (a x v) sin + a (a.v)(1 - cos)`` (Rodrigues), so its world height is
    ``k0 + k1 cos(theta) + k2 sin(theta)`` with ``g`` the world up axis in the foot frame: ``k0 = oz + (g.a)(a.v)``,
    ``k1 = g.v - (g.a)(a.v)``, ``k2 = g.(a x v)`` (a toe point: ``v`` = toe offset + the toe's local rotation
    of the point). Per frame the difference of the rear and front points is one sinusoid ``[S, 3]``; a call
    costs one ``[K, S]`` evaluation and median instead of rotating every sole point at every pitch. Equal to
    ``median(_FootPose.sole(S, axis, theta)[..., 2] - radii)`` differences up to rounding (``~1e-15`` m) for
    unit quaternions; the rotations are normalised here (a float32 clip's are unit to ~1e-7 only, which moved
    the sole-point form's pitch by up to ~1e-7 rad)."""

    def __init__(self, pose: _FootPose, S, axis, rear: int, front: int, radii):
        a = np.asarray(axis, dtype=np.float64)
        g = R.quat_rotate_inverse(R.quat_normalize(pose.rot[S, pose.fi]), np.array([0.0, 0.0, 1.0]))  # [S, 3]
        ga = g @ a
        P = len(pose.foot_points)
        coef = []
        for i in (rear, front):
            if i < P:
                v = np.broadcast_to(pose.foot_points[i], g.shape)
            else:
                v = pose.toe_offset + R.quat_rotate(R.quat_normalize(pose.local[S, pose.ti]), pose.toe_points[i - P])
            av = v @ a
            k0 = pose.pos[S, pose.fi, 2] + ga * av - radii[i]
            k1 = np.einsum("sk,sk->s", g, v) - ga * av
            k2 = np.einsum("sk,sk->s", g, np.cross(a, v))
            coef.append(np.stack([k0, k1, k2]))
        self.k = coef[0] - coef[1]  # [3, S]

    def __call__(self, theta):
        """Median height difference (m) at ``theta`` (a float), or ``[K]`` for ``theta [K]`` (rad)."""
        t = np.asarray(theta, dtype=np.float64)
        k0, k1, k2 = self.k
        d = k0 + np.cos(t)[..., None] * k1 + np.sin(t)[..., None] * k2
        m = np.median(d, axis=-1)
        return float(m) if np.ndim(theta) == 0 else m


def _level_feet(desc, tree, root, local, fps, pairs) -> tuple[np.ndarray, dict, dict]:
    """``local [T, n, 4]`` with each foot's constant sole-levelling pitch applied (see
    ``RetargetConfig.level_feet``), ``{foot: degrees}``, and ``{foot: why}`` for the feet left as they were
    (no collision geom on the foot).

    In the frames where the foot stands (low and slow), the rearmost and the frontmost sole points (of the
    foot's and the toe's collision geoms, along the foot's walking direction) are brought to the same height
    by one pitch of the foot about its lateral axis, found by bisection on the median height difference.
    """
    motion = SkeletonMotion(tree, root, local, fps, skip_checks=True)
    pos = np.asarray(motion.global_translation, dtype=np.float64)
    rot = np.asarray(motion.global_rotation, dtype=np.float64)
    geoms = _usable_geoms(desc)
    local = local.copy()
    angles, skipped = {}, {}
    for foot, toe in pairs:
        _check_names([foot] + ([toe] if toe else []), tree, "target", None)
        fi = tree.index(foot)
        ti = tree.index(toe) if toe else None
        foot_p, foot_r = _sole_points([g for g in geoms if g.body == fi])
        toe_p, toe_r = _sole_points([g for g in geoms if ti is not None and g.body == ti])
        if len(foot_p) == 0:  # nothing to level: left as it is, and said so
            skipped[foot] = "the foot has no collision geom"
            continue
        toe_t = np.asarray(tree.local_translation[ti], dtype=np.float64) if ti is not None else None
        radii = np.concatenate([foot_r, toe_r])

        foot_pose = _FootPose(pos, rot, local, fi, ti, foot_p, toe_p, toe_t)
        every = np.arange(len(pos))
        every_pts = foot_pose.sole(every)
        z = every_pts[..., 2] - radii
        low = z.min(axis=1)
        speed = np.zeros(len(pos))
        if len(pos) > 1:
            v = np.linalg.norm(np.diff(pos[:, fi, :2], axis=0), axis=-1) * fps
            speed = np.maximum(np.r_[v, v[-1]], np.r_[v[0], v])
        S = np.flatnonzero((low < low.min() + _STANCE_HEIGHT) & (speed < _STANCE_SPEED))
        pts = every_pts[S]  # the stance frames' sole points (frames are computed independently)
        span = pts[..., :2] - pts[..., :2].mean(axis=1, keepdims=True)
        if len(S) < 3 or len(radii) < 2:
            angles[foot] = 0.0
            continue
        # walking direction of the sole: its longest horizontal extent (principal axis), front = toe side
        _, _, vt = np.linalg.svd(span.reshape(-1, 2), full_matrices=False)
        forward = np.array([vt[0, 0], vt[0, 1], 0.0])
        if len(toe_p) and np.mean((pos[S, ti, :2] - pos[S, fi, :2]) @ forward[:2]) < 0:
            forward = -forward
        along = np.einsum("fpk,k->fp", pts, forward)
        rear, front = int(np.argmin(along.mean(0))), int(np.argmax(along.mean(0)))
        axis = R.quat_rotate_inverse(rot[S, fi], np.cross([0.0, 0.0, 1.0], forward)).mean(axis=0)
        axis /= np.linalg.norm(axis)

        tilt = _TiltCurve(foot_pose, S, axis, rear, front, radii)
        lo, hi = -0.6, 0.6
        f_lo = tilt(lo)
        if np.sign(f_lo) == np.sign(tilt(hi)):  # no level pitch within +-34 degrees: leave the foot
            angles[foot] = 0.0
            continue
        theta = _bisect(tilt, lo, hi, f_lo, steps=40)  # to ~1e-12 rad
        local[:, fi] = R.quat_multiply(local[:, fi], R.quat_from_axis_angle(axis, theta))
        angles[foot] = float(np.degrees(theta))
    return local, angles, skipped


# -- articulation-aware steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Joint:
    type: object  # JointType
    axis: np.ndarray
    anchor: np.ndarray
    limits: tuple[float, float] | None
    ref: float


@dataclass(frozen=True, eq=False)
class _Articulation:
    """What the articulation-aware steps need, from an ``ArticulationDesc`` or a coordinate layout."""

    parents: np.ndarray
    pos: np.ndarray  # [n, 3] rest parent_from_body translations
    quat: np.ndarray  # [n, 4] rest parent_from_body rotations
    joints: tuple[tuple[_Joint, ...], ...]  # rotational and sliding joints per body (fixed ones dropped)

    @classmethod
    def from_desc(cls, desc) -> _Articulation:
        from ..asset.desc import JointType

        joints = []
        for body in desc.bodies:
            js = []
            for j in (desc.joints[i] for i in body.joints):
                if j.type is JointType.FIXED:
                    continue
                lim = (float(j.range[0]), float(j.range[1])) if j.limited else None
                js.append(_Joint(j.type, np.asarray(j.axis, float), np.asarray(j.anchor, float), lim, float(j.ref)))
            joints.append(tuple(js))
        return cls(
            np.array([b.parent for b in desc.bodies]),
            np.array([b.pos for b in desc.bodies]),
            np.array([b.quat_wxyz for b in desc.bodies]),
            tuple(joints),
        )

    @classmethod
    def from_layout(cls, layout) -> _Articulation:
        from ..asset.desc import JointType

        joints = [[] for _ in layout.body_names]
        for b in layout.blocks:
            if b.joint_type is JointType.FIXED:
                continue
            axis = np.zeros(3) if b.axis is None else np.asarray(b.axis, float)
            joints[b.body_index].append(
                _Joint(
                    b.joint_type,
                    axis,
                    np.asarray(b.anchor, float),
                    None if b.limits is None else tuple(b.limits),
                    float(b.ref),
                )
            )
        return cls(
            np.asarray(layout.parent_indices),
            np.asarray(layout.rest_positions, float),
            np.asarray(layout.rest_rotations_wxyz, float),
            tuple(tuple(j) for j in joints),
        )


def _at_origin(anchor) -> bool:
    """``np.allclose(anchor, 0)`` for a 3-vector, without its per-call cost."""
    return all(abs(float(x)) <= 1e-8 for x in anchor)


def _is_complete(art: _Articulation, b) -> bool:
    """Whether body ``b``'s joints reach every rotation (free, ball, or 3 hinges a1 _|_ a2 _|_ a3 at its origin)."""
    from ..asset.desc import JointType

    js = art.joints[b]
    if len(js) == 1 and js[0].type in (JointType.FREE, JointType.BALL):
        return True
    if len(js) == 3 and all(j.type is JointType.HINGE for j in js) and all(_at_origin(j.anchor) for j in js):
        a = [j.axis / np.linalg.norm(j.axis) for j in js]
        return abs(a[0] @ a[1]) < 1e-6 and abs(a[1] @ a[2]) < 1e-6
    return False


@dataclass(frozen=True, eq=False)
class _HingeStep:
    parent: int
    body: int
    child: int
    axis: np.ndarray  # [3] in the body frame
    lo: float  # limits relative to ref (rad)
    hi: float


def _hinge_plan(art: _Articulation, mapped: np.ndarray) -> list[_HingeStep]:
    from ..asset.desc import JointType

    bone = np.linalg.norm(np.asarray(art.pos, dtype=np.float64), axis=-1)  # [n] parent -> body lengths
    first_kid: dict[int, int] = {}  # body -> its first child with a bone of non-zero length
    for c, cp in enumerate(art.parents):
        if cp >= 0 and bone[c] > 1e-6:
            first_kid.setdefault(int(cp), c)
    steps, used_parents = [], set()
    for b, p in enumerate(art.parents):
        js = art.joints[b]
        if p < 0 or not (mapped[b] and mapped[p]) or p in used_parents:
            continue
        if len(js) != 1 or js[0].type is not JointType.HINGE or not _at_origin(js[0].anchor):
            continue
        if bone[b] < 1e-6 or b not in first_kid or not _is_complete(art, p):
            continue
        j = js[0]
        lo, hi = (j.limits[0] - j.ref, j.limits[1] - j.ref) if j.limits is not None else (-np.inf, np.inf)
        steps.append(_HingeStep(int(p), b, first_kid[b], j.axis / np.linalg.norm(j.axis), lo, hi))
        used_parents.add(int(p))
    return steps


def _project_hinges(G: np.ndarray, art: _Articulation, steps: Sequence[_HingeStep]) -> list[_HingeStep]:
    """In place on world rotations ``G [T, N, 4]``: every step of :func:`_hinge_plan` at once (see
    ``RetargetConfig.project_hinges``); returns the steps applied (those whose hinge can bend the child bone).

    The steps are independent: each writes its parent (a body whose joints reach every rotation) and its body
    (a single hinge), and no step's parent or body is another step's, so one batch over ``[T, steps]`` equals
    the steps one after another. Per step and frame: the hinge angle that puts the child bone where the motion
    has it (of the two that reach, the one inside the limits, then nearest the swing-twist answer), and the
    twist of the parent about the parent -> body bone that turns the bent child bone onto the wanted one."""
    rows = []
    for st in steps:  # per-step constants (Python floats, as the one-step formulas)
        rest = art.quat[st.body]
        u = art.pos[st.body] / np.linalg.norm(art.pos[st.body])  # parent -> body bone, parent frame
        d = art.pos[st.child]  # body -> child bone, body frame
        a = st.axis
        u_b = R.quat_rotate(R.quat_conjugate(rest), u)
        A = u_b @ (d - a * (a @ d))
        B = u_b @ np.cross(a, d)
        C = (u_b @ a) * (a @ d)
        rho = math.hypot(A, B)
        if rho >= 1e-9:
            rows.append((st, rest, u, d, a, u_b, C, rho, math.atan2(B, A)))
    if not rows:
        return []
    applied = [r[0] for r in rows]
    P = np.array([st.parent for st in applied])
    Bd = np.array([st.body for st in applied])
    rest, u, d, a, u_b = (np.array([r[k] for r in rows], dtype=np.float64) for k in range(1, 6))  # [S, 4|3]
    C, rho, base = (np.array([r[k] for r in rows], dtype=np.float64) for k in range(6, 9))  # [S]
    lo = np.array([st.lo for st in applied])[:, None]
    hi = np.array([st.hi for st in applied])[:, None]
    Gp, Gb = G[:, P], G[:, Bd]  # [T, S, 4]
    J = R.quat_multiply(R.quat_conjugate(rest), R.quat_multiply(R.quat_conjugate(Gp), Gb))  # joint rotations
    v_body = R.quat_rotate(J, d)  # where the child should be, in the rest-rotated body frame
    c = np.clip((np.einsum("tsk,sk->ts", v_body, u_b) - C) / rho, -1.0, 1.0)
    delta = np.arccos(c)
    th = np.stack([R.wrap_angle(base + delta), R.wrap_angle(base - delta)], axis=-1)  # [T, S, 2] both bends
    _, twist = R.quat_swing_twist(J, a)
    th0 = 2 * np.arctan2(np.einsum("tsk,sk->ts", twist[..., 1:], a), twist[..., 0])  # the plain swing-twist answer
    outside = np.maximum(lo - th, 0) + np.maximum(th - hi, 0)
    cost = outside * 1e3 + np.abs(R.wrap_angle(th - R.wrap_angle(th0)[..., None]))
    pick = np.take_along_axis(th, np.argmin(cost, axis=-1)[..., None], axis=-1)[..., 0]  # [T, S]
    Jn = R.quat_from_axis_angle(a, pick)
    w = R.quat_rotate(rest, R.quat_rotate(Jn, d))  # child bone with the hinge, parent frame
    v = R.quat_rotate(rest, v_body)
    w_perp = w - np.einsum("tsk,sk->ts", w, u)[..., None] * u
    v_perp = v - np.einsum("tsk,sk->ts", v, u)[..., None] * u
    phi = np.arctan2(np.einsum("tsk,sk->ts", np.cross(w_perp, v_perp), u), (w_perp * v_perp).sum(-1))
    Gp_new = R.quat_multiply(Gp, R.quat_from_axis_angle(u, phi))
    G[:, P] = Gp_new
    G[:, Bd] = R.quat_multiply(Gp_new, R.quat_multiply(rest, Jn))
    return applied


# -- result and algorithm --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RetargetResult:
    """Result of :func:`retarget`.

    Attributes:
        motion: :class:`~kangengine.animation.SkeletonMotion` on the target tree (for an articulation:
            ``SkeletonTree.from_articulation(desc)``, local rotations including the bodies' rest rotations):
            ``root_translation [frames, 3]`` m, ``local_rotation [frames, nodes, 4]`` WXYZ, the source fps,
            the source's float dtype.
        source_tpose: the source T-pose used (``SkeletonState``).
        target_tpose: the target T-pose used (``SkeletonState``).
        scale: the root-translation scale applied.
        ground_shift: m added to the root height by the ground fix (``root_height_offset`` included): a float,
            or ``[frames]`` for ``GroundFix.ROLLING_MIN``.
        mapped_target_joints: target joints driven by a source joint.
        unmapped_target_joints: target joints kept at their T-pose local rotation (including mapped bodies of
            an articulation that have no joint: they follow their parent rigidly).
        rigid_target_joints: mapped articulation bodies without a joint (a subset of the unmapped ones).
        projected_joints: bodies whose single hinge was fitted by ``project_hinges``.
    """

    motion: SkeletonMotion
    source_tpose: SkeletonState
    target_tpose: SkeletonState
    scale: float
    ground_shift: float | np.ndarray
    mapped_target_joints: tuple[str, ...]
    unmapped_target_joints: tuple[str, ...]
    rigid_target_joints: tuple[str, ...] = ()
    projected_joints: tuple[str, ...] = ()


def _check_names(names: Sequence[str], tree: SkeletonTree, side: str, path=None):
    missing = [n for n in names if n not in tree.node_names]
    if missing:
        raise UnknownNameError(
            f"{side} joints {missing} of the joint map are not in the {side} skeleton; its nodes "
            f"are: {', '.join(tree.node_names)}",
            path=path,
            item="joint_mapping",
        )


def _resolve_sources(mapping: dict, tree: SkeletonTree) -> dict:
    """Keys may list alternative source names, ``"LeftHandIndex1|LFingers"``: the first one in ``tree`` is used."""
    out, missing = {}, []
    for key, target in mapping.items():
        found = next((a for a in key.split("|") if a in tree.node_names), None)
        if found is None:
            missing.append(key)
        else:
            out[found] = target
    if missing:
        raise UnknownNameError(
            f"source joints {missing} of the joint map are not in the source skeleton; its nodes "
            f"are: {', '.join(tree.node_names)}",
            item="joint_mapping",
        )
    return out


#: Plausible range of a fitted ``scale="auto"`` (target height / source height, both in metres): a robot or
#: character between a tenth and ten times its performer. Outside it the T-poses do not describe the same
#: upright pose (a rest pose lying along another axis gave 0.0088) and the motion would be shrunk or blown up.
AUTO_SCALE_RANGE = (0.1, 10.0)


def _standing_height(pose: SkeletonState, idx, side: str) -> float:
    """Height of the mapped root above the lowest mapped joint of a T-pose, refused when the pose does not
    stand along +Z (its vertical extent under a fifth of its horizontal one)."""
    p = np.asarray(pose.global_translation, dtype=np.float64)[idx]
    h = float(p[0, 2] - p[:, 2].min())
    across = float(np.ptp(p[:, :2], axis=0).max())
    tall = float(np.ptp(p[:, 2]))
    if h <= 1e-9 or tall < 0.2 * across:
        raise MotionError(
            f"scale='auto': the {side} T-pose is {tall:.4g} m tall along +Z but {across:.4g} m across (root "
            f"{h:.4g} m above the lowest mapped joint): it does not stand up along +Z; give a number for scale, "
            f"or a {side} T-pose that stands (Z up)",
            item="scale",
        )
    return h


def _auto_scale(src_tpose: SkeletonState, tgt_tpose: SkeletonState, src_idx, tgt_idx) -> float:
    hs = _standing_height(src_tpose, src_idx, "source")
    ht = _standing_height(tgt_tpose, tgt_idx, "target")
    scale = ht / hs
    lo, hi = AUTO_SCALE_RANGE
    if not lo <= scale <= hi:
        raise MotionError(
            f"scale='auto' fitted {scale:.4g} (target root {ht:.4g} m over source root {hs:.4g} m above the "
            f"lowest mapped joint), outside the plausible {lo:g}-{hi:g}; check the units of the source and the "
            "target's rest pose, or give scale as a number",
            item="scale",
        )
    return float(scale)


def retarget_motion(
    source: SkeletonMotion,
    config: RetargetConfig | str,
    target=None,
    *,
    source_tpose: SkeletonState | None = None,
    target_tpose: SkeletonState | None = None,
) -> RetargetResult:
    """Retarget a motion onto another skeleton (see the module documentation for the algorithm).

    Args:
        source: ``SkeletonMotion`` (numpy or torch; computed in float64, returned in the source's dtype).
        config: a :class:`RetargetConfig` or the name of a shipped one (:func:`list_retarget_configs`).
        target: the target: ``ArticulationDesc`` (or a model file path, or a coordinate layout), a
            ``SkeletonTree``, or a ``SkeletonState`` whose pose is the target's rest pose. Default: the
            configuration's ``target_asset`` (:meth:`RetargetConfig.target_model_path`).
        source_tpose: the source T-pose (``SkeletonState`` on the source tree); default
            ``make_tpose(source.tree, config.source_tpose)`` (the source's rest pose, e.g. a BVH T-pose).
        target_tpose: the target T-pose on the target tree; default ``make_tpose(target, config.target_tpose)``.

    Returns:
        :class:`RetargetResult`.

    Raises:
        UnknownNameError: a mapped joint missing from a skeleton (the message lists the skeleton's nodes);
        FormatError: the target's root is not mapped; ShapeError: bad inputs.
    """
    if isinstance(config, str):
        config = load_retarget_config(config)
    if not isinstance(source, SkeletonMotion):
        raise ShapeError(f"source is {type(source).__name__}; expected a SkeletonMotion", item="source")
    if target is None:
        if config.target_asset is None:
            raise ShapeError(
                f"configuration {config.name!r} names no shipped target model; pass target=", item="target"
            )
        target = config.target_model_path()
    tgt = _as_target(target)
    src = source.numpy()
    dtype = src.local_rotation.dtype if src.local_rotation.dtype in (np.float32, np.float64) else np.float64
    if config.trim_frames is not None:
        b, e = config.trim_frames
        e = src.num_frames if e == -1 else min(e, src.num_frames)
        if b >= e:
            raise ShapeError(f"trim_frames {config.trim_frames} leave no frame of {src.num_frames}", item="trim_frames")
        src = src[b:e]
    jm = _resolve_sources(dict(config.joint_mapping), src.tree)
    _check_names(list(jm.values()), tgt.tree, "target")
    root_name = tgt.tree.node_names[0]
    inv = {v: k for k, v in jm.items()}
    if root_name not in inv:
        raise FormatError(
            f"the target root {root_name!r} is not mapped; map a source joint (the pelvis) to it", item="joint_mapping"
        )
    if source_tpose is None:
        source_tpose = _tpose_of(_as_target(src.tree), config.source_tpose)
    else:
        source_tpose = source_tpose.numpy()
        _check_names(list(jm), source_tpose.tree, "source T-pose")
    if target_tpose is None:
        target_tpose = _tpose_of(tgt, config.target_tpose)
    else:
        target_tpose = target_tpose.numpy()
        if target_tpose.tree.node_names != tgt.tree.node_names:
            raise UnknownNameError(
                f"the target T-pose has nodes {target_tpose.tree.node_names}; expected the "
                f"target's {tgt.tree.node_names}",
                item="target_tpose",
            )
    if source_tpose.batch_shape != () or target_tpose.batch_shape != ():
        raise ShapeError("T-poses must be single poses (batch shape ())", item="tpose")

    tgt_names = tgt.tree.node_names
    tgt_mapped = np.array([n in inv for n in tgt_names])
    rigid = []
    if tgt.art is not None:  # a body without joints cannot turn against its parent: it follows it at rest
        for k in np.flatnonzero(tgt_mapped):
            if k > 0 and not tgt.art.joints[k]:
                tgt_mapped[k] = False
                rigid.append(tgt_names[k])
    tgt_idx = np.flatnonzero(tgt_mapped)
    src_idx = np.array([src.tree.index(inv[tgt_names[k]]) for k in tgt_idx])
    srcT_idx = np.array([source_tpose.tree.index(inv[tgt_names[k]]) for k in tgt_idx])

    Q = config.rotation_wxyz
    Qc = R.quat_conjugate(Q)
    Gs = np.asarray(src.global_rotation, dtype=np.float64)[:, src_idx]  # [T, M, 4]
    Gst = np.asarray(source_tpose.global_rotation, dtype=np.float64)[srcT_idx]  # [M, 4]
    Gtt = np.asarray(target_tpose.global_rotation, dtype=np.float64)  # [N, 4]
    delta = R.quat_multiply(R.quat_multiply(Q, R.quat_multiply(Gs, R.quat_conjugate(Gst))), Qc)
    G_mapped = R.quat_normalize(R.quat_multiply(delta, Gtt[tgt_idx]))

    parents = tgt.tree.parent_indices
    T = src.num_frames
    n = tgt.tree.num_nodes
    tpose_local = np.asarray(target_tpose.local_rotation, dtype=np.float64)
    G = np.empty((T, n, 4))
    G[:, tgt_idx] = G_mapped
    if not tgt_mapped.all():  # unmapped joints follow their parent with the T-pose local rotation
        for k in np.flatnonzero(~tgt_mapped):  # parent-first order: the parent's G is final
            p = parents[k]
            G[:, k] = tpose_local[k] if p < 0 else R.quat_multiply(G[:, p], tpose_local[k])
    projected = []
    if config.project_hinges and tgt.art is not None:
        steps = _hinge_plan(tgt.art, tgt_mapped)
        _project_hinges(G, tgt.art, steps)
        projected = [tgt_names[st.body] for st in steps]
        if steps and not tgt_mapped.all():  # re-place unmapped bodies under projected parents
            for k in np.flatnonzero(~tgt_mapped):
                p = parents[k]
                if p >= 0:
                    G[:, k] = R.quat_multiply(G[:, p], tpose_local[k])
    local = R.quat_multiply(R.quat_conjugate(G[:, np.where(parents < 0, 0, parents)]), G)
    local[:, parents < 0] = G[:, parents < 0]
    unmapped_local = np.flatnonzero(~tgt_mapped)
    local[:, unmapped_local] = tpose_local[unmapped_local]  # exact, not through round-off
    local = R.quat_normalize(local)

    src_root = np.asarray(src.global_translation, dtype=np.float64)[:, src.tree.index(inv[root_name])]
    src_tpose_root = np.asarray(source_tpose.global_translation, dtype=np.float64)[
        source_tpose.tree.index(inv[root_name])
    ]
    scale = config.scale
    if scale == "auto":
        scale = _auto_scale(source_tpose, target_tpose, srcT_idx, tgt_idx)
    root = np.asarray(target_tpose.root_translation, dtype=np.float64) + scale * R.quat_rotate(
        Q, src_root - src_tpose_root
    )

    meta = dict(src.metadata)
    meta["retarget"] = {
        "config": config.name,
        "scale": float(scale),
        "rotation_wxyz": [float(x) for x in Q],
        "source_fps": src.fps,
        "trim_frames": None if config.trim_frames is None else list(config.trim_frames),
    }
    if config.level_feet and tgt.desc is not None:
        local, levelled, skipped = _level_feet(tgt.desc, tgt.tree, root, local, src.fps, config.level_feet)
        meta["retarget"]["feet_levelled_deg"] = levelled
        if skipped:
            meta["retarget"]["feet_not_levelled"] = skipped
    elif config.level_feet:
        meta["retarget"]["feet_not_levelled"] = {f: "the target has no collision geoms" for f, _ in config.level_feet}
    motion = SkeletonMotion(tgt.tree, root, local, src.fps, metadata=meta, skip_checks=True)
    shift = 0.0
    if config.ground_fix is not GroundFix.NONE:
        pos = motion.global_translation
        low = None
        if config.ground_reference is GroundReference.COLLISION_GEOMS and tgt.desc is not None:
            found = _lowest_points(tgt.desc, pos, motion.global_rotation)
            if found is not None:
                low, bare = found
                if bare:  # recorded: these bodies stand on their origins
                    meta["retarget"]["ground_bodies_without_geoms"] = list(bare)
        if low is None:
            low = pos[..., 2].min(axis=1)
        if config.ground_fix is GroundFix.ROLLING_MIN:
            from scipy.ndimage import minimum_filter1d, uniform_filter1d

            width = max(1, int(round(config.ground_window_s * src.fps)) | 1)
            shift = -uniform_filter1d(minimum_filter1d(low, width, mode="nearest"), width, mode="nearest")
        else:
            shift = -float(low.min() if config.ground_fix is GroundFix.CLIP_MIN else low[0])
    shift = shift + config.root_height_offset
    root = root.copy()
    root[:, 2] += shift
    meta["retarget"]["ground_shift"] = float(np.mean(shift))
    motion = SkeletonMotion(tgt.tree, root.astype(dtype), local.astype(dtype), src.fps, metadata=meta)
    return RetargetResult(
        motion=motion,
        source_tpose=source_tpose,
        target_tpose=target_tpose,
        scale=float(scale),
        ground_shift=shift,
        mapped_target_joints=tuple(tgt_names[k] for k in np.flatnonzero(tgt_mapped)),
        unmapped_target_joints=tuple(n for n, m in zip(tgt_names, tgt_mapped) if not m),
        rigid_target_joints=tuple(rigid),
        projected_joints=tuple(projected),
    )

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
import threading
import types
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .. import rotations as R
from .._deps import optional
from .._files import read_json
from ..animation.skeleton import SkeletonMotion, SkeletonState, SkeletonTree
from ..errors import FileMissingError, FormatError, KangEngineError, MotionError, ShapeError, UnknownNameError
from ._plant import Leg, despike_rotations, plant_feet

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
        plant_feet: ``((foot, toe), ...)`` target bodies (toe may be ``""``): for an articulation target whose
            foot hangs under a hinge knee (shank) under a thigh, each foot is held at one place through each of its
            contact phases (found from the source joints mapped onto the foot and the toe: low and slow), by an
            analytic two-bone IK (knee hinge, thigh swing; the foot keeps its world rotation), the pelvis lowered
            where the leg cannot reach; applied after ``level_feet`` and before the ground fix. The phases counted
            and the largest lowering are recorded in ``metadata["retarget"]["feet_planted"]``. A joint map copies
            the source's rotations onto other proportions, so a foot the performer holds still slides on the
            target; this holds it.
        despike_acceleration: rad/s^2, or ``None`` (off): a source joint rotation that stands away from the slerp
            midpoint of its two neighbouring frames by more than this acceleration's half-frame deviation
            (``a / (2 fps^2)``; a constant-speed turn gives none), ten times the joint's median over the clip,
            and came back (a capture glitch: a single-frame spike), is replaced by that midpoint before the
            retarget. Each correction is listed in ``metadata["retarget"]["spikes_corrected"]`` (source joint,
            source frame, deviation, the jumps into and out of it).
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
    plant_feet: tuple[tuple[str, str], ...] = ()
    despike_acceleration: float | None = None
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
        try:
            planted = tuple((str(f), str(t)) for f, t in self.plant_feet)
        except (TypeError, ValueError):
            raise FormatError(
                f'{self.plant_feet!r}; expected a list of [foot body, toe body or ""] pairs', item="plant_feet"
            ) from None
        object.__setattr__(self, "plant_feet", planted)
        if self.despike_acceleration is not None:
            a = float(self.despike_acceleration)
            if not (math.isfinite(a) and a > 0):
                raise FormatError(
                    f"{self.despike_acceleration!r}; expected rad/s^2 > 0 or null", item="despike_acceleration"
                )
            object.__setattr__(self, "despike_acceleration", a)
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
        "plant_feet",
        "despike_acceleration",
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
                plant_feet=d.get("plant_feet", ()),
                despike_acceleration=d.get("despike_acceleration"),
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
            "plant_feet": [list(p) for p in self.plant_feet],
            "despike_acceleration": self.despike_acceleration,
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


# -- quaternion algebra on clip-sized arrays -----------------------------------------------------------------
# A clip of a batch is small (tens of frames, a few bodies per step): the cost of a quaternion product is the
# number of numpy calls, not the arithmetic. These helpers do the products of :mod:`kangengine.rotations` through
# its structure constants (computed once from ``rotations.quat_multiply`` on the basis quaternions: the one
# product, not a second implementation): a product is one small matrix product and one einsum, a rotation
# matrix one outer product and one matrix product. Same values to rounding (``~1e-16``; the tests compare them
# with rotations.py).

_BASIS = np.eye(4)
# (a b)_i = sum_jk _HAMILTON[j, k, i] a_j b_k
_HAMILTON = R.quat_multiply(_BASIS[:, None], _BASIS[None, :])
# a @ _LEFT = the matrix L(a) [i, k] with (a b)_i = sum_k L(a)_ik b_k (flattened); _LEFT_CONJ: L(conj(a))
_LEFT = np.ascontiguousarray(np.swapaxes(_HAMILTON, 1, 2)).reshape(4, 16)
_LEFT_CONJ = np.diag([1.0, -1.0, -1.0, -1.0]) @ _LEFT
# R(q)_ij = sum_kl q_k q_l _MATRIX[kl, ij] for unit q: the vector part of e_k (0, e_j) conj(e_l)
_PURE = np.concatenate([np.zeros((3, 1)), np.eye(3)], axis=1)  # (0, e_j)
_MATRIX = np.ascontiguousarray(
    np.swapaxes(
        R.quat_multiply(
            R.quat_multiply(_BASIS[:, None, None], _PURE[None, None]), R.quat_conjugate(_BASIS)[None, :, None]
        )[..., 1:],
        2,
        3,
    )
).reshape(16, 9)


def _qmul(a: np.ndarray, b: np.ndarray, *, conj_a: bool = False) -> np.ndarray:
    """``a * b`` (``conj(a) * b`` with ``conj_a``) of WXYZ quaternions ``[..., 4]`` (float64; broadcast)."""
    left = (a.reshape(-1, 4) @ (_LEFT_CONJ if conj_a else _LEFT)).reshape(a.shape[:-1] + (4, 4))
    return np.einsum("...ik,...k->...i", left, b)


def _qmat(q: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` rotation matrices of unit WXYZ quaternions ``q [..., 4]`` (float64)."""
    outer = (q[..., :, None] * q[..., None, :]).reshape(-1, 16)
    return (outer @ _MATRIX).reshape(q.shape[:-1] + (3, 3))


def _qaxis(axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """``[..., 4]`` rotations by ``angle [...]`` rad about unit axes ``axis [..., 3]`` (broadcast)."""
    half = 0.5 * np.asarray(angle)[..., None]
    s = np.sin(half)
    return np.concatenate([np.cos(half) + 0.0 * s, s * axis], axis=-1)


def _cross_matrix(v: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` matrices ``[v]_x`` of the cross products ``x -> v x x`` (``v [..., 3]``)."""
    z = np.zeros(v.shape[:-1])
    x, y, w = v[..., 0], v[..., 1], v[..., 2]
    return np.stack([np.stack([z, -w, y], -1), np.stack([w, z, -x], -1), np.stack([-y, x, z], -1)], -2)


def _unit(q: np.ndarray) -> np.ndarray:
    """``q [..., 4]`` divided by its norm (float64; the norms here are ~1)."""
    return q / np.sqrt(np.einsum("...k,...k->...", q, q))[..., None]


def _kernels():
    """The compiled per-frame passes (:mod:`._skeleton_kernels`, numba), or None where numba does not import
    (the numpy paths of this module then run; both give the same values to rounding)."""
    return optional("kangengine.retarget._skeleton_kernels")


# -- ground ---------------------------------------------------------------------------------------------


_GEOM_KINDS = ("sphere", "capsule", "cylinder", "box", "ellipsoid")


def _usable_geoms(desc) -> list:
    """The collision geoms of ``desc`` whose lowest point has a closed form (no meshes, planes)."""
    from ..asset.desc import GeomType

    kinds = tuple(GeomType(k) for k in _GEOM_KINDS)
    return [g for g in getattr(desc, "geoms", ()) if g.body >= 0 and g.collides and g.type in kinds]


def _third_rows(rot: np.ndarray) -> np.ndarray:
    """``[..., 3]`` third row of the rotation matrix of unit WXYZ quaternions ``rot [..., 4]`` (the world z axis
    in the body frame: the ``z`` of a rotated vector is this row dotted with it)."""
    outer = (rot[..., :, None] * rot[..., None, :]).reshape(-1, 16)
    return (outer @ _MATRIX[:, 6:]).reshape(rot.shape[:-1] + (3,))


@dataclass(frozen=True, eq=False)
class _GroundGeoms:
    """What the lowest point of an articulation needs, computed once per model: its usable collision geoms
    (:func:`_usable_geoms`) as arrays, and the bodies that carry none.

    A geom's lowest world z is ``centre_z - extent`` with ``r`` the third row of ``world_from_geom``:
    ``extent = sum_k |r_k| linear_k + radius + disc sqrt(1 - r_z^2) + |r * ellipsoid|`` (sphere: ``radius``;
    capsule: ``|r_z| half-length + radius``; cylinder: ``|r_z| half-length + radius sqrt(1 - r_z^2)``; box:
    ``sum |r_k| half-size_k``; ellipsoid: ``|r * semi-axes|``): one formula for every kind."""

    bodies: np.ndarray  # [U] bodies that carry usable geoms
    geom_body: np.ndarray  # [G] index into ``bodies``
    centre: np.ndarray  # [G, 3] geom centres in their body frames
    geom_map: np.ndarray  # [G, 3, 4]: [body_from_geom | centre]: a body row r -> (r body_from_geom, r . centre)
    linear: np.ndarray  # [G, 3]
    radius: np.ndarray  # [G]
    disc: np.ndarray | None  # [G] (None: no cylinder)
    ellipsoid: np.ndarray | None  # [G, 3] semi-axes, zero for the other kinds (None: no ellipsoid)
    bare: np.ndarray  # [B] bodies without a usable geom: their origins count
    bare_names: tuple[str, ...]
    geom_body_index: np.ndarray | None = None  # [G] the body of each geom (``bodies[geom_body]``), for the kernel
    disc_or_zero: np.ndarray | None = None  # [G] ``disc``, zeros where None
    ellipsoid_or_zero: np.ndarray | None = None  # [G, 3] ``ellipsoid``, zeros where None

    @classmethod
    def from_desc(cls, desc) -> _GroundGeoms | None:
        """None if ``desc`` has no usable geom."""
        geoms = _usable_geoms(desc)
        if not geoms:
            return None
        gb = np.array([g.body for g in geoms])
        bodies, geom_body = np.unique(gb, return_inverse=True)
        size = np.array([g.size for g in geoms], dtype=np.float64)  # [G, 3]
        kind = np.array([_GEOM_KINDS.index(g.type.value) for g in geoms])
        linear = np.zeros((len(geoms), 3))
        linear[kind == 1, 2] = size[kind == 1, 1]  # capsule and cylinder: half-length along the geom's z
        linear[kind == 2, 2] = size[kind == 2, 1]
        linear[kind == 3] = size[kind == 3]  # box: half-sizes
        radius = np.where((kind == 0) | (kind == 1), size[:, 0], 0.0)
        disc = np.where(kind == 2, size[:, 0], 0.0) if (kind == 2).any() else None
        ellipsoid = np.where((kind == 4)[:, None], size, 0.0) if (kind == 4).any() else None
        bare = np.array(sorted(set(range(len(desc.bodies))) - set(gb.tolist())), dtype=np.int64)
        centre = np.array([g.pos for g in geoms], dtype=np.float64)
        mats = R.quat_to_matrix(np.array([g.quat_wxyz for g in geoms], dtype=np.float64))
        return cls(
            bodies=bodies,
            geom_body=geom_body,
            centre=centre,
            geom_map=np.concatenate([mats, centre[:, :, None]], axis=2),
            linear=linear,
            radius=radius,
            disc=disc,
            ellipsoid=ellipsoid,
            bare=bare,
            bare_names=tuple(desc.bodies[b].name for b in bare),
            geom_body_index=np.ascontiguousarray(bodies[geom_body], dtype=np.int64),
            disc_or_zero=np.zeros(len(geoms)) if disc is None else np.ascontiguousarray(disc, dtype=np.float64),
            ellipsoid_or_zero=np.zeros((len(geoms), 3)) if ellipsoid is None else np.ascontiguousarray(ellipsoid),
        )

    def lowest(self, body_pos: np.ndarray, body_rot: np.ndarray) -> np.ndarray:
        """``[frames]`` lowest world z (m) over the geoms and the bare bodies' origins, from the bodies' world
        poses ``body_pos [frames, n, 3]`` m and ``body_rot [frames, n, 4]`` WXYZ (unit; float64). One compiled
        pass over the frames (:func:`._skeleton_kernels.lowest_points`) where numba imports, else
        :meth:`lowest_numpy` (equal to rounding)."""
        kernels = _kernels()
        if kernels is None or self.geom_body_index is None:
            return self.lowest_numpy(body_pos, body_rot)
        low = np.empty(len(body_pos))
        kernels.lowest_points(
            np.ascontiguousarray(body_pos, dtype=np.float64),
            np.ascontiguousarray(body_rot, dtype=np.float64),
            self.geom_body_index,
            self.geom_map,
            self.linear,
            self.radius,
            self.disc_or_zero,
            self.ellipsoid_or_zero,
            self.bare,
            low,
        )
        return low

    def lowest_numpy(self, body_pos: np.ndarray, body_rot: np.ndarray) -> np.ndarray:
        """:meth:`lowest` in numpy array operations (over ``[geoms, frames]`` at once)."""
        rows = _third_rows(body_rot[:, self.bodies])[:, self.geom_body].swapaxes(0, 1)  # [G, T, 3]
        out = rows @ self.geom_map  # [G, T, 4]: third row of world_from_geom, then the centre's height offset
        centre_z = body_pos[:, self.bodies[self.geom_body], 2].T + out[..., 3]
        extent = np.einsum("gtk,gk->gt", np.abs(out[..., :3]), self.linear) + self.radius[:, None]
        if self.disc is not None:
            extent += self.disc[:, None] * np.sqrt(np.clip(1 - out[..., 2] ** 2, 0, 1))
        if self.ellipsoid is not None:
            extent += np.sqrt(((out[..., :3] * self.ellipsoid[:, None]) ** 2).sum(-1))
        low = (centre_z - extent).min(axis=0)
        if len(self.bare):
            low = np.minimum(low, body_pos[:, self.bare, 2].min(axis=1))
        return low


def _lowest_points(desc, body_pos, body_rot) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """``[frames]`` lowest world z over the collision geoms of ``desc`` and the origins of bodies that carry
    no usable collision geom (a foot without geometry still touches the ground at its origin), and the names
    of those bodies; None if the model has no usable geom at all. ``body_pos [frames, n, 3]`` m and
    ``body_rot [frames, n, 4]`` WXYZ: the bodies' world poses."""
    ground = _GroundGeoms.from_desc(desc)
    if ground is None:
        return None
    low = ground.lowest(np.asarray(body_pos, dtype=np.float64), np.asarray(body_rot, dtype=np.float64))
    return low, ground.bare_names


_STANCE_HEIGHT = 0.03  # m above the foot's lowest point over the clip
_STANCE_SPEED = 0.3  # m/s, horizontal speed of the foot body origin
_PITCH_RANGE = 0.6  # rad: the level pitch is looked for within +-34 degrees
# bisection steps, then one linear interpolation: the final bracket is 1.2 / 2**20 = 1.1e-6 rad wide, the error
# at most that where the median switches frames inside it (2e-7 m at the toes), ~1e-12 rad where it is smooth
_PITCH_STEPS = 20
_PITCH_STEPS_PER_CALL = 4  # steps decided by one evaluation on the 2**4 - 1 points they can visit


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
    return np.array(pts).reshape(-1, 3), np.array(rad)


@dataclass(frozen=True, eq=False)
class _Feet:
    """What ``level_feet`` needs of a target, computed once: the feet that have sole geoms, and every sole point
    of them (foot by foot: the foot body's points, then its toe's) in its body's frame."""

    names: tuple[str, ...]  # [F] feet to level
    foot: np.ndarray  # [F] body index
    toe: np.ndarray  # [F] toe body index (-1: none)
    point_body: np.ndarray  # [P] body of each sole point
    matrix_body: np.ndarray  # [B] the feet (first, in order), then the toes that carry sole points
    point_matrix: np.ndarray  # [P] each point's body in ``matrix_body``
    point_row: np.ndarray  # [F, Pmax] each foot's points (padded with its last point)
    point_valid: np.ndarray  # [F, Pmax] bool: not padding
    point_mean_weight: np.ndarray  # [F, Pmax]: 1 / (the foot's point count), 0 on padding
    has_toe_points: np.ndarray  # [F] bool
    toe_or_foot: np.ndarray  # [F] the toe body, or the foot where there is none
    point_local: np.ndarray  # [P, 3] m, in that body's frame
    radius: np.ndarray  # [P] m (contact z = point z - radius)
    start: np.ndarray  # [F + 1] each foot's first point (``start[F] = P``)
    skipped: Mapping[str, str]  # feet left as they are, and why
    subtree: np.ndarray | None = None  # [F, n] bool: the bodies at and below each foot

    @classmethod
    def from_target(cls, desc, tree: SkeletonTree, pairs) -> _Feet:
        geoms = _usable_geoms(desc)
        names, foot, toe, body, local, radius, start, on_foot, skipped = [], [], [], [], [], [], [0], [], {}
        for f, t in pairs:
            _check_names([f] + ([t] if t else []), tree, "target", None)
            fi = tree.index(f)
            ti = tree.index(t) if t else -1
            fp, fr = _sole_points([g for g in geoms if g.body == fi])
            tp, tr = _sole_points([g for g in geoms if ti >= 0 and g.body == ti])
            if len(fp) == 0:  # nothing to level: left as it is, and said so
                skipped[f] = "the foot has no collision geom"
                continue
            names.append(f)
            foot.append(fi)
            toe.append(ti)
            body += [fi] * len(fp) + [ti] * len(tp)
            local += [fp, tp]
            radius += [fr, tr]
            start.append(start[-1] + len(fp) + len(tp))
            on_foot.append(len(fp))
        matrix_body = list(foot) + sorted(set(body) - set(foot))
        counts = np.diff(start)
        width = max(1, int(counts.max())) if len(counts) else 1
        row = np.array([[start[f] + min(j, max(c - 1, 0)) for j in range(width)] for f, c in enumerate(counts)])
        valid = np.arange(width)[None] < counts[:, None]
        return cls(
            names=tuple(names),
            foot=np.array(foot, dtype=np.int64),
            toe=np.array(toe, dtype=np.int64),
            point_body=np.array(body, dtype=np.int64),
            matrix_body=np.array(matrix_body, dtype=np.int64),
            point_matrix=np.array([matrix_body.index(k) for k in body], dtype=np.int64),
            point_row=row.reshape(len(counts), width).astype(np.int64),
            point_valid=valid,
            point_mean_weight=valid / np.maximum(counts, 1)[:, None],
            has_toe_points=counts > np.array(on_foot, dtype=np.int64).reshape(-1),
            toe_or_foot=np.array([t if t >= 0 else f for f, t in zip(foot, toe)], dtype=np.int64),
            point_local=np.concatenate(local) if local else np.zeros((0, 3)),
            radius=np.concatenate(radius) if radius else np.zeros(0),
            start=np.array(start, dtype=np.int64),
            skipped=types.MappingProxyType(skipped),
            subtree=_subtrees(tree.parent_indices, foot),
        )


def _subtrees(parents, roots) -> np.ndarray:
    """``[R, n]`` bool: the nodes at and below each of ``roots`` in a parent-first tree (``parents [n]``)."""
    parents = np.asarray(parents)
    out = np.zeros((len(roots), len(parents)), dtype=bool)
    for r, root in enumerate(roots):
        out[r, root] = True
        for k in range(root + 1, len(parents)):  # parent-first: a node's parent comes before it
            out[r, k] = parents[k] >= 0 and out[r, parents[k]]
    return out


def _walking_direction(pts: np.ndarray, toe_minus_foot: np.ndarray | None) -> np.ndarray:
    """``[2]`` unit horizontal direction of the longest extent of the sole points ``pts [S, P, 3]`` (each frame's
    points about their mean: the principal axis, closed form of the 2x2 scatter), pointing to the toe
    (``toe_minus_foot [S, 2]``, the toe origin relative to the foot's); without a toe, the first right singular
    vector as ``np.linalg.svd`` gives it."""
    xy = pts[..., :2] - pts[..., :2].mean(axis=1, keepdims=True)
    if toe_minus_foot is None:
        return np.linalg.svd(xy.reshape(-1, 2), full_matrices=False)[2][0]
    c = np.einsum("spi,spj->ij", xy, xy)
    angle = 0.5 * math.atan2(2.0 * c[0, 1], c[0, 0] - c[1, 1])
    forward = np.array([math.cos(angle), math.sin(angle)])
    return -forward if float(np.mean(toe_minus_foot @ forward)) < 0 else forward


def _tilt_coefficients(R_foot, origin_z, pair_foot, radii, axis) -> np.ndarray:
    """``[3, T, F]``: the rear-minus-front sole height of each foot ``F`` at each frame ``T`` as
    ``k0 + k1 cos(theta) + k2 sin(theta)`` of the foot's pitch ``theta`` about ``axis [F, 3]`` (unit, foot frame),
    from the feet's world rotations ``R_foot [T, F, 3, 3]``, their origin heights ``origin_z [T, F]`` and the two
    sole points ``pair_foot [T, F, 2, 3]`` in the foot frame (rear, front; radii ``[F, 2]``).

    A point ``v`` of the foot frame pitched by ``theta`` is ``v cos + (a x v) sin + a (a.v)(1 - cos)``
    (Rodrigues), so its world height is ``k0 + k1 cos + k2 sin`` with ``g`` the world up axis in the foot frame
    (the third row of ``R_foot``): ``k0 = oz + (g.a)(a.v) - radius``, ``k1 = g.v - (g.a)(a.v)``,
    ``k2 = g.(a x v) = v.(g x a)``."""
    g = R_foot[..., 2, :]  # [T, F, 3]
    g_along = np.einsum("tfk,fk->tf", g, axis)[..., None] * axis  # (g.a) a
    g_x_a = -np.einsum("tfj,fij->tfi", g, _cross_matrix(axis))  # g x a = -(a x g)
    # k0 - oz + radius, k1, k2 = v . (g.a) a, v . (g - (g.a) a), v . (g x a)
    k = np.einsum("ctfk,tfqk->ctfq", np.stack([g_along, g - g_along, g_x_a]), pair_foot)  # [3, T, F, 2]
    k[0] += origin_z[..., None] - radii
    return k[..., 0] - k[..., 1]


def _median_tilt(coef: np.ndarray, count: np.ndarray):
    """``f(theta [L, K]) -> [L, K]``: per row ``l``, the median over its ``count[l]`` stance frames of
    ``k0 + k1 cos(theta) + k2 sin(theta)`` (``coef [L, 3, Smax]``, padded with ``k0 = +inf``, ``k1 = k2 = 0``:
    the padding sorts last and leaves the lower order statistics alone). Equal to ``np.median`` of the row's own
    frames (the same middle elements, the same mean of the middle pair)."""
    rows = np.arange(len(count))[:, None]
    lo, hi = ((count - 1) // 2)[:, None], (count // 2)[:, None]
    kth = np.unique(np.concatenate([lo.ravel(), hi.ravel()]))
    k0, k1, k2 = coef[:, 0, None, :], coef[:, 1, None, :], coef[:, 2, None, :]

    def f(theta):
        d = k0 + np.cos(theta)[..., None] * k1 + np.sin(theta)[..., None] * k2
        d = np.partition(d, kth, axis=-1)
        cols = np.arange(d.shape[1])[None]
        return 0.5 * (d[rows, cols, lo] + d[rows, cols, hi])

    return f


def _bisect_rows(f, lo, hi, *, steps: int, per_call: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(root [L], f(lo) [L], f(hi) [L])``: a root of each row of ``f`` (``f(theta [L, K]) -> [L, K]``) in
    ``[lo, hi]`` (``[L]`` each) where ``f(lo)`` and ``f(hi)`` differ in sign (the other rows' roots mean nothing):
    ``steps`` bisection steps, ``f`` evaluated once per ``per_call`` steps on the ``2**per_call - 1`` grid points
    those steps can visit (the first time with the ends), the steps then walking the grid with the decisions a
    one-point-at-a-time bisection takes; then the zero of the line through the final bracket's ends (inside the
    bracket; exact to the bracket's width squared where ``f`` is smooth there)."""
    lo, hi = np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    ends = None
    done = 0
    while done < steps:
        k = min(per_call, steps - done)
        n = 1 << k
        frac = np.arange(0 if ends is None else 1, n + 1 if ends is None else n) / n
        grid = lo[:, None] + (hi - lo)[:, None] * frac  # [L, n - 1], the first time [L, n + 1] with the ends
        values, points = f(grid), grid.tolist()
        if ends is None:
            ends = values[:, [0, -1]]
            f_lo, f_hi = ends[:, 0].tolist(), ends[:, 1].tolist()
            values, points = values[:, 1:-1], [p[1:-1] for p in points]
        for i, row in enumerate(values.tolist()):
            a, b, fa, fb = 0, n, f_lo[i], f_hi[i]
            sa = (fa > 0) - (fa < 0)
            for _ in range(k):
                m = (a + b) >> 1
                fm = row[m - 1]
                if (fm > 0) - (fm < 0) == sa:
                    a, fa = m, fm
                else:
                    b, fb = m, fm
            if a:
                lo[i] = points[i][a - 1]
            if b < n:
                hi[i] = points[i][b - 1]
            f_lo[i], f_hi[i] = fa, fb
        done += k
    fl, fh = np.array(f_lo), np.array(f_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(fh != fl, fl / (fl - fh), 0.5)
    return lo + np.clip(t, 0.0, 1.0) * (hi - lo), ends[:, 0], ends[:, 1]


def _level_feet(feet: _Feet, pos: np.ndarray, rot: np.ndarray, local: np.ndarray, fps: float) -> dict:
    """:func:`_level_feet_numpy` as one compiled pass (:func:`._skeleton_kernels.level_pitches`) where numba
    imports and every foot has toe points (its walking direction points at the toe), else the numpy path; the
    same pitches to rounding."""
    angles, _ = _level_feet_in_place(feet, pos, rot, local, fps)
    return angles


def _level_feet_in_place(feet: _Feet, pos: np.ndarray, rot: np.ndarray, local: np.ndarray, fps: float):
    """``(angles, poses_current)``: :func:`_level_feet`; where the kernel ran, the world poses ``pos``, ``rot`` at
    and below each levelled foot are updated in place and ``poses_current`` is True (no forward kinematics
    needed again); else they are stale where a foot was levelled, and it is False."""
    kernels = _kernels()
    nf = len(feet.names)
    usable = all(
        isinstance(a, np.ndarray) and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable
        for a in (pos, rot, local)
    )
    if kernels is None or not nf or not usable or feet.subtree is None or not feet.has_toe_points.all():
        angles = _level_feet_numpy(feet, pos, rot, local, fps)
        return angles, not any(angles.values())
    theta = np.zeros(nf)
    levelled = kernels.level_pitches(
        pos,
        rot,
        float(fps),
        feet.foot,
        feet.toe_or_foot,
        feet.point_body,
        feet.point_local,
        feet.radius,
        feet.start,
        _STANCE_HEIGHT,
        _STANCE_SPEED,
        _PITCH_RANGE,
        _PITCH_STEPS,
        _PITCH_STEPS_PER_CALL,
        feet.subtree,
        local,
        theta,
    )
    angles = dict.fromkeys(feet.names, 0.0)
    for i in np.flatnonzero(levelled).tolist():
        angles[feet.names[i]] = float(np.degrees(theta[i]))
    return angles, True


def _level_feet_numpy(feet: _Feet, pos: np.ndarray, rot: np.ndarray, local: np.ndarray, fps: float) -> dict:
    """Each foot's constant sole-levelling pitch (see ``RetargetConfig.level_feet``), found from the world poses
    ``pos [T, n, 3]``, ``rot [T, n, 4]`` and applied in place to the local rotations ``local [T, n, 4]`` (all
    float64); returns ``{foot: degrees}`` (the poses at and below a levelled foot are then stale: one more forward
    kinematics, native, costs less than turning them here).

    In the frames where the foot stands (low and slow), the rearmost and the frontmost sole points (of the
    foot's and the toe's collision geoms, along the foot's walking direction) are brought to the same height
    by one pitch of the foot about its lateral axis: the zero of the median height difference over those frames,
    found by bisection on its closed form (:func:`_tilt_coefficients`). Every foot at once: the stance frames
    are weights (``[T, F]``) and the points of each foot a padded row (``[F, Pmax]``).
    """
    nf = len(feet.names)
    if not nf:
        return {}
    mats = _qmat(rot[:, feet.matrix_body])  # [T, B, 3, 3] world_from_body of the feet, then the toes
    world = pos[:, feet.point_body] + np.einsum("tpij,pj->tpi", mats[:, feet.point_matrix], feet.point_local)
    low = np.minimum.reduceat(world[..., 2] - feet.radius, feet.start[:-1], axis=1)  # [T, F]
    foot_pos = pos[:, feet.foot]  # [T, F, 3]
    speed = np.zeros(low.shape)
    if len(pos) > 1:
        step = np.diff(foot_pos[..., :2], axis=0)
        v = np.hypot(step[..., 0], step[..., 1]) * fps  # [T - 1, F] horizontal speed
        speed = np.maximum(np.concatenate([v, v[-1:]]), np.concatenate([v[:1], v]))
    stance = (low < low.min(axis=0) + _STANCE_HEIGHT) & (speed < _STANCE_SPEED)  # [T, F]
    count = stance.sum(axis=0)
    angles = dict.fromkeys(feet.names, 0.0)
    if not ((count >= 3) & (feet.start[1:] - feet.start[:-1] >= 2)).any():
        return angles
    weight = stance / np.maximum(count, 1)  # [T, F]: means over each foot's stance frames
    pts = world[:, feet.point_row]  # [T, F, Pmax, 3], each foot's points (padding repeats a point, weight 0)
    valid = feet.point_valid  # [F, Pmax]
    # walking direction: the principal axis of the sole points about each frame's mean, toward the toe
    xy = pts[..., :2] - np.einsum("tfpi,fp->tfi", pts[..., :2], feet.point_mean_weight)[:, :, None]
    xy = xy * valid[..., None]
    cov = np.einsum("tf,tfpi,tfpj->fij", weight, xy, xy)
    angle = 0.5 * np.arctan2(2.0 * cov[:, 0, 1], cov[:, 0, 0] - cov[:, 1, 1])
    forward = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # [F, 2]
    toe_side = np.einsum("tf,tfi,fi->f", weight, pos[:, feet.toe_or_foot, :2] - foot_pos[..., :2], forward)
    forward = np.where((toe_side < 0)[:, None], -forward, forward)
    for f in np.flatnonzero(~feet.has_toe_points & (count >= 3)):  # no toe to point at: as np.linalg.svd gives it
        S = np.flatnonzero(stance[:, f])
        forward[f] = _walking_direction(world[S, feet.start[f] : feet.start[f + 1]], None)
    along = np.einsum("tf,tfpi,fi->fp", weight, pts[..., :2], forward)
    rear = np.argmin(np.where(valid, along, np.inf), axis=1)
    front = np.argmax(np.where(valid, along, -np.inf), axis=1)
    R_foot = mats[:, :nf]  # [T, F, 3, 3]
    lateral = np.stack([-forward[:, 1], forward[:, 0], np.zeros(nf)], axis=-1)
    axis = np.einsum("tf,fi,tfij->fj", weight, lateral, R_foot)  # the lateral axis in the foot frame
    axis /= np.maximum(np.linalg.norm(axis, axis=-1, keepdims=True), 1e-300)  # 0 for a foot that never stands
    feet_i = np.arange(nf)
    pair = np.stack([pts[:, feet_i, rear], pts[:, feet_i, front]], axis=2)  # [T, F, 2, 3] rear, front
    pair_foot = np.einsum("tfji,tfqj->tfqi", R_foot, pair - foot_pos[:, :, None])  # in the foot frame
    radii = feet.radius[feet.point_row[feet_i[:, None], np.stack([rear, front], axis=-1)]]  # [F, 2]
    k = _tilt_coefficients(R_foot, foot_pos[..., 2], pair_foot, radii, axis)  # [3, T, F]
    rows = np.flatnonzero((count >= 3) & (feet.start[1:] - feet.start[:-1] >= 2))
    pad = np.array([np.inf, 0.0, 0.0])[:, None, None]
    coef = np.where(stance.T[rows][None], k[:, :, rows].transpose(0, 2, 1), pad).transpose(1, 0, 2)  # [L, 3, T]
    theta, at_lo, at_hi = _bisect_rows(
        _median_tilt(coef, count[rows]),
        [-_PITCH_RANGE] * len(rows),
        [_PITCH_RANGE] * len(rows),
        steps=_PITCH_STEPS,
        per_call=_PITCH_STEPS_PER_CALL,
    )
    sel = np.flatnonzero(np.sign(at_lo) != np.sign(at_hi))  # else no level pitch within range: left
    if not len(sel):
        return angles
    levelled, axis, theta = rows[sel], axis[rows[sel]], theta[sel]
    fis = feet.foot[levelled]
    local[:, fis] = _qmul(local[:, fis], _qaxis(axis, theta))
    for i, t in zip(levelled, theta):
        angles[feet.names[i]] = float(np.degrees(t))
    return angles


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


@dataclass(frozen=True, eq=False)
class _Hinges:
    """The constants of :func:`_apply_hinges` for a list of :class:`_HingeStep` (those whose hinge can bend the
    child bone), computed once per target: per step ``s``, the parent and body positions in the node axis of
    the world rotations they are applied to, and the step's geometry (Python-float formulas of one step, as
    arrays over the steps)."""

    steps: tuple[_HingeStep, ...]
    parent: np.ndarray  # [S] node of the parent in G
    body: np.ndarray  # [S] node of the hinge body in G
    rest: np.ndarray  # [S, 4] rest parent_from_body rotation
    bone: np.ndarray  # [S, 3] unit parent -> body bone, parent frame
    bone_cross: np.ndarray  # [S, 3, 3]: x -> bone x x
    times_bone: np.ndarray  # [S, 4, 4]: q -> q (0, bone) (row vectors)
    rest_axis: np.ndarray  # [S, 4]: rest (0, axis)
    child_fixed: np.ndarray  # [S, 3]: rest-rotated child bone with the hinge at angle theta is
    child_cos: np.ndarray  # [S, 3]:   child_fixed + cos(theta) child_cos + sin(theta) child_sin
    child_sin: np.ndarray  # [S, 3]
    child: np.ndarray  # [S, 3] body -> child bone, body frame
    twist: np.ndarray  # [S, 4, 2]: parent_from_body -> (w, xyz . axis) of the joint rotation rest^-1 parent_from_body
    C: np.ndarray  # [S]
    rho: np.ndarray  # [S]
    base: np.ndarray  # [S]
    lo: np.ndarray  # [S] limits relative to ref (rad)
    hi: np.ndarray  # [S]

    @classmethod
    def from_steps(cls, art: _Articulation, steps: Sequence[_HingeStep], node=None) -> _Hinges | None:
        """``node``: ``[n]`` position of each body in G's node axis (default: the body index); None if no step
        can bend its child bone."""
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
                rows.append((st, rest, u, d, a, C, rho, math.atan2(B, A)))
        if not rows:
            return None
        applied = tuple(r[0] for r in rows)

        def pure(x):  # [S, 4] quaternions (0, x)
            return np.concatenate([np.zeros((len(x), 1)), x], axis=1)

        node = np.arange(len(art.parents)) if node is None else np.asarray(node)
        rest, u, d, a = (np.array([r[k] for r in rows], dtype=np.float64) for k in range(1, 5))
        C, rho, base = (np.array([r[k] for r in rows], dtype=np.float64) for k in range(5, 8))
        # (rest^-1 X)_w and (rest^-1 X)_xyz . axis are linear in X: their values on the basis quaternions
        joint_of_basis = R.quat_multiply(R.quat_conjugate(rest)[:, None], np.eye(4)[None])  # [S, 4 basis, 4]
        twist = np.stack([joint_of_basis[..., 0], np.einsum("sbk,sk->sb", joint_of_basis[..., 1:], a)], axis=-1)
        return cls(
            steps=applied,
            parent=node[[st.parent for st in applied]],
            body=node[[st.body for st in applied]],
            rest=rest,
            bone=u,
            bone_cross=_cross_matrix(u),
            times_bone=np.swapaxes(_quat_map(np.tile(_BASIS[0], (len(u), 1)), pure(u)), 1, 2),
            rest_axis=R.quat_multiply(rest, pure(a)),
            child_fixed=R.quat_rotate(rest, a * (a * d).sum(-1, keepdims=True)),
            child_cos=R.quat_rotate(rest, d - a * (a * d).sum(-1, keepdims=True)),
            child_sin=R.quat_rotate(rest, np.cross(a, d)),
            child=d,
            twist=twist,
            C=C,
            rho=rho,
            base=base,
            lo=np.array([st.lo for st in applied]),
            hi=np.array([st.hi for st in applied]),
        )


def _apply_hinges(G: np.ndarray, h: _Hinges) -> None:
    """In place on world rotations ``G [T, N, 4]`` (float64): every step of ``h`` at once (see
    ``RetargetConfig.project_hinges``).

    The steps are independent: each writes its parent (a body whose joints reach every rotation) and its body
    (a single hinge), and no step's parent or body is another step's, so one batch over ``[T, steps]`` equals
    the steps one after another. Per step and frame: the hinge angle that puts the child bone where the motion
    has it (of the two that reach, the one inside the limits, then nearest the swing-twist answer), and the
    twist of the parent about the parent -> body bone that turns the bent child bone onto the wanted one (none
    where the wanted child lies on that bone's line: the twist is then free and the parent keeps its own)."""
    Gp, Gb = G[:, h.parent], G[:, h.body]  # [T, S, 4]
    X = _qmul(Gp, Gb, conj_a=True)  # parent_from_body
    v = np.einsum("tsij,sj->tsi", _qmat(X), h.child)  # where the child should be, parent frame
    vu = np.einsum("tsk,sk->ts", v, h.bone)
    delta = np.arccos(np.clip((vu - h.C) / h.rho, -1.0, 1.0))
    twist = np.einsum("tsk,skj->tsj", X, h.twist)  # the joint rotation's w and xyz . axis
    jw, ja = twist[..., 0], twist[..., 1]
    th0 = np.where(np.hypot(jw, ja) <= np.finfo(np.float64).eps ** 2, 0.0, 2 * np.arctan2(ja, jw))  # swing-twist
    bends = np.stack([h.base + delta, h.base - delta], axis=-1)  # [T, S, 2] the two angles that reach
    wrapped = R.wrap_angle(np.concatenate([bends, bends - th0[..., None]], axis=-1))
    th, off = wrapped[..., :2], np.abs(wrapped[..., 2:])  # the angles, and how far each is from th0
    outside = np.maximum(h.lo[:, None] - th, 0) + np.maximum(th - h.hi[:, None], 0)
    cost = outside * 1e3 + off
    pick = np.where(cost[..., 1] < cost[..., 0], th[..., 1], th[..., 0])  # [T, S] (argmin: the first on ties)
    # rest * exp(axis pick): cos(pick/2) rest + sin(pick/2) rest (0, axis); its child bone, parent frame (Rodrigues)
    c, s = np.cos(0.5 * pick)[..., None], np.sin(0.5 * pick)[..., None]
    rest_joint = c * h.rest + s * h.rest_axis
    w = h.child_fixed + np.cos(pick)[..., None] * h.child_cos + np.sin(pick)[..., None] * h.child_sin
    # the turn about the bone u that takes w onto v: atan2(u . (w x v), w.v - (w.u)(v.u))
    wu = np.einsum("tsk,sk->ts", w, h.bone)
    u_x_w = np.einsum("tsj,sij->tsi", w, h.bone_cross)  # u x w; u . (w x v) = (u x w) . v
    phi = np.arctan2(np.einsum("tsk,tsk->ts", u_x_w, v), np.einsum("tsk,tsk->ts", w, v) - wu * vu)
    # the wanted child on the bone's line (|u x v| <= 1e-9 |v|, a straight limb's rest frame): no twist to find
    # (both arguments are rounding noise there), the parent keeps its own
    u_x_v = np.einsum("tsj,sij->tsi", v, h.bone_cross)
    phi[np.einsum("tsk,tsk->ts", u_x_v, u_x_v) <= 1e-18 * np.einsum("tsk,tsk->ts", v, v)] = 0.0
    # Gp exp(u phi) = cos(phi/2) Gp + sin(phi/2) Gp (0, u)
    Gp_new = np.cos(0.5 * phi)[..., None] * Gp + np.sin(0.5 * phi)[..., None] * np.einsum(
        "tsk,ski->tsi", Gp, h.times_bone
    )
    G[:, h.parent] = Gp_new
    G[:, h.body] = _qmul(Gp_new, rest_joint)


def _project_hinges(G: np.ndarray, art: _Articulation, steps: Sequence[_HingeStep]) -> list[_HingeStep]:
    """In place on world rotations ``G [T, n, 4]`` (every body of ``art``): the steps of :func:`_hinge_plan`
    (see :func:`_apply_hinges`); returns the steps applied (those whose hinge can bend the child bone)."""
    h = _Hinges.from_steps(art, steps)
    if h is None:
        return []
    _apply_hinges(G, h)
    return list(h.steps)


# -- result and algorithm --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RetargetResult:
    """Result of :func:`retarget`.

    Attributes:
        motion: :class:`~kangengine.animation.SkeletonMotion` on the target tree (for an articulation:
            ``SkeletonTree.from_articulation(desc)``, local rotations including the bodies' rest rotations):
            ``root_translation [frames, 3]`` m, ``local_rotation [frames, nodes, 4]`` WXYZ, the source fps,
            the source's float dtype.
        source_tpose: the source T-pose used (``SkeletonState``; unless given by the caller, the one every clip of
            the same configuration, target and source skeleton shares: its arrays are read-only).
        target_tpose: the target T-pose used (``SkeletonState``; shared and read-only likewise).
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


# -- the plan: what depends on the configuration, the target and the source skeleton only ------------------


def _quat_map(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``[..., 4, 4]`` matrices of the linear maps ``x -> left * x * right`` of WXYZ quaternions (``left``,
    ``right`` ``[..., 4]``): one matrix-vector product per frame instead of two quaternion products."""
    basis = np.eye(4)
    out = R.quat_multiply(R.quat_multiply(left[..., None, :], basis), right[..., None, :])  # [..., basis, 4]
    return np.swapaxes(out, -1, -2)


@dataclass(frozen=True, eq=False)
class _Plan:
    """Everything :func:`retarget_motion` computes from its configuration, target and source skeleton alone
    (names, T-poses, constant rotation products, hinge steps, sole points, collision geoms); a clip then costs a
    few array operations over its frames. ``M`` mapped target bodies, held in ``mapped_index`` order (the root
    first)."""

    tgt: _Target
    source_tpose: SkeletonState
    target_tpose: SkeletonState
    source_kinematics: object  # BodyKinematics of the source tree
    source_index: np.ndarray  # [M] source node of each mapped target body
    source_root: int  # source node mapped to the target root
    mapped: np.ndarray  # [n] bool: target bodies driven by a source joint
    mapped_index: np.ndarray  # [M] their indices
    rigid: tuple[str, ...]
    world_map: (
        np.ndarray
    )  # [M, 4, 4]: G_target = G_source @ world_map (row vectors): Q G_source G_source_tpose^-1 Q^-1 G_target_tpose
    ancestor: np.ndarray  # [M - 1] slot of the nearest mapped ancestor of mapped slots 1..M-1
    chain_slot: np.ndarray  # [C] slots whose parent is not mapped (follows its mapped ancestor at T-pose)
    chain_map: np.ndarray  # [C, 4, 4]: left multiplication by that chain's inverse T-pose rotation (row vectors)
    tpose_local: np.ndarray  # [n, 4]
    hinges: _Hinges | None
    projected: tuple[str, ...]
    scale: float
    root_map: np.ndarray  # [3, 3]: scale * R(Q)
    source_tpose_root: np.ndarray  # [3]
    target_tpose_root: np.ndarray  # [3]
    feet: _Feet | None  # level_feet on a target with geoms
    ground: _GroundGeoms | None  # the target's collision geoms (None: none, or no desc)
    kernel_args: tuple = ()  # the constant arguments of _skeleton_kernels.mapped_local_rotations after src_rot
    mapped_names: tuple[str, ...] = ()  # names of the mapped target bodies (``mapped_index``)
    unmapped_names: tuple[str, ...] = ()  # and of the others

    def local_rotation(self, G: np.ndarray) -> np.ndarray:
        """``[T, n, 4]`` target local rotations from the mapped bodies' world rotations ``G [T, M, 4]``: unmapped
        bodies at their T-pose local rotation, a mapped body relative to its parent (through the T-pose chain of
        unmapped bodies between it and its nearest mapped ancestor)."""
        mapped = np.empty_like(G)
        mapped[:, 0] = G[:, 0]
        mapped[:, 1:] = _qmul(G[:, self.ancestor], G[:, 1:], conj_a=True)  # relative to the mapped ancestor
        if len(self.chain_slot):  # through the T-pose rotation of the unmapped bodies between
            c = self.chain_slot
            mapped[:, c] = np.swapaxes(np.swapaxes(mapped[:, c], 0, 1) @ self.chain_map, 0, 1)
        local = np.empty((len(G),) + self.tpose_local.shape)
        local[:] = self.tpose_local
        local[:, self.mapped_index] = _unit(mapped)
        return local


def _build_plan(config: RetargetConfig, tgt: _Target, src_tree: SkeletonTree, source_tpose, target_tpose) -> _Plan:
    """The checks of :func:`retarget_motion` on names and T-poses, and its per-target constants."""
    jm = _resolve_sources(dict(config.joint_mapping), src_tree)
    _check_names(list(jm.values()), tgt.tree, "target")
    root_name = tgt.tree.node_names[0]
    inv = {v: k for k, v in jm.items()}
    if root_name not in inv:
        raise FormatError(
            f"the target root {root_name!r} is not mapped; map a source joint (the pelvis) to it", item="joint_mapping"
        )
    own_source, own_target = source_tpose is None, target_tpose is None
    if source_tpose is None:
        source_tpose = _tpose_of(_as_target(src_tree), config.source_tpose)
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
    mapped = np.array([n in inv for n in tgt_names])
    rigid = []
    if tgt.art is not None:  # a body without joints cannot turn against its parent: it follows it at rest
        for k in np.flatnonzero(mapped):
            if k > 0 and not tgt.art.joints[k]:
                mapped[k] = False
                rigid.append(tgt_names[k])
    tgt_idx = np.flatnonzero(mapped)
    slot = np.full(len(tgt_names), -1)
    slot[tgt_idx] = np.arange(len(tgt_idx))
    src_idx = np.array([src_tree.index(inv[tgt_names[k]]) for k in tgt_idx])
    srcT_idx = np.array([source_tpose.tree.index(inv[tgt_names[k]]) for k in tgt_idx])

    Q = config.rotation_wxyz
    Gst = np.asarray(source_tpose.global_rotation, dtype=np.float64)[srcT_idx]  # [M, 4]
    Gtt = np.asarray(target_tpose.global_rotation, dtype=np.float64)[tgt_idx]  # [M, 4]
    right = R.quat_multiply(R.quat_multiply(R.quat_conjugate(Gst), R.quat_conjugate(Q)), Gtt)
    world_map = np.swapaxes(_quat_map(np.broadcast_to(Q, right.shape), right), 1, 2).copy()  # row-vector form

    parents = tgt.tree.parent_indices
    tpose_local = np.asarray(target_tpose.local_rotation, dtype=np.float64)
    ancestor, chain_slot, chain = [], [], []
    for k in tgt_idx[1:]:  # the nearest mapped ancestor, and the T-pose rotation of the unmapped bodies between
        p, c = parents[k], np.array([1.0, 0.0, 0.0, 0.0])
        while not mapped[p]:
            c = R.quat_multiply(tpose_local[p], c)
            p = parents[p]
        ancestor.append(slot[p])
        if p != parents[k]:
            chain_slot.append(slot[k])
            chain.append(R.quat_conjugate(c))
    chain_map = np.swapaxes(
        _quat_map(np.array(chain).reshape(-1, 4), np.tile([1.0, 0.0, 0.0, 0.0], (len(chain), 1))), 1, 2
    )

    hinges, projected = None, ()
    if config.project_hinges and tgt.art is not None:
        hinges = _Hinges.from_steps(tgt.art, _hinge_plan(tgt.art, mapped), node=slot)
        projected = () if hinges is None else tuple(tgt_names[st.body] for st in hinges.steps)

    scale = config.scale
    if scale == "auto":
        scale = _auto_scale(source_tpose, target_tpose, srcT_idx, tgt_idx)
    src_root = source_tpose.tree.index(inv[root_name])
    feet = (
        _Feet.from_target(tgt.desc, tgt.tree, config.level_feet) if config.level_feet and tgt.desc is not None else None
    )
    for state, own in ((source_tpose, own_source), (target_tpose, own_target)):
        if own:  # built here, shared by every result of a kept plan: read-only
            for arr in (state.root_translation, state.local_rotation):
                arr.setflags(write=False)
    return _Plan(
        tgt=tgt,
        source_tpose=source_tpose,
        target_tpose=target_tpose,
        source_kinematics=src_tree.kinematics,
        source_index=src_idx,
        source_root=src_tree.index(inv[root_name]),
        mapped=mapped,
        mapped_index=tgt_idx,
        rigid=tuple(rigid),
        world_map=world_map,
        ancestor=np.array(ancestor, dtype=np.int64),
        chain_slot=np.array(chain_slot, dtype=np.int64),
        chain_map=chain_map,
        tpose_local=tpose_local,
        hinges=hinges,
        projected=projected,
        scale=float(scale),
        root_map=float(scale) * R.quat_to_matrix(Q),
        source_tpose_root=np.asarray(source_tpose.global_translation, dtype=np.float64)[src_root],
        target_tpose_root=np.asarray(target_tpose.root_translation, dtype=np.float64),
        feet=feet,
        ground=_GroundGeoms.from_desc(tgt.desc) if tgt.desc is not None else None,
        mapped_names=tuple(tgt_names[k] for k in tgt_idx),
        unmapped_names=tuple(n for n, m in zip(tgt_names, mapped) if not m),
        kernel_args=_kernel_args(src_idx, world_map, hinges, ancestor, chain_slot, chain_map, tgt_idx, tpose_local),
    )


def _kernel_args(src_idx, world_map, hinges: _Hinges | None, ancestor, chain_slot, chain_map, tgt_idx, tpose_local):
    """The constant arguments of :func:`._skeleton_kernels.mapped_local_rotations` (after ``src_rot``, before
    ``local``), contiguous and typed once per plan."""

    def f64(x):
        return np.ascontiguousarray(x, dtype=np.float64)

    def i64(x):
        return np.ascontiguousarray(x, dtype=np.int64).reshape(-1)

    M = len(tgt_idx)
    chain_of_slot = np.full(M, -1, dtype=np.int64)
    chain_of_slot[np.asarray(chain_slot, dtype=np.int64)] = np.arange(len(chain_slot))
    if hinges is None:
        e1, e3, e4 = np.zeros(0), np.zeros((0, 3)), np.zeros((0, 4))
        h = (i64([]), i64([]), e4, e3, e4, e3, e3, e3, e3, np.zeros((0, 4, 2)), e1, e1, e1, e1, e1)
    else:
        h = (
            i64(hinges.parent),
            i64(hinges.body),
            f64(hinges.rest),
            f64(hinges.bone),
            f64(hinges.rest_axis),
            f64(hinges.child_fixed),
            f64(hinges.child_cos),
            f64(hinges.child_sin),
            f64(hinges.child),
            f64(hinges.twist),
            f64(hinges.C),
            f64(hinges.rho),
            f64(hinges.base),
            f64(hinges.lo),
            f64(hinges.hi),
        )
    chain = f64(chain_map).reshape(-1, 4, 4)
    return (i64(src_idx), f64(world_map), *h, i64(ancestor), chain_of_slot, chain, i64(tgt_idx), f64(tpose_local))


# Plans and named configurations kept for the next clip (a batch converts many clips of one skeleton onto one
# target with one configuration). A plan is a pure function of immutable inputs: the configuration and target
# objects (frozen; held here, so their ids stay theirs) and the source tree's content; calls that pass their own
# T-poses (mutable states) or a target SkeletonState are not cached. A configuration read by name is kept while
# its file's modification time and size are unchanged.
_PLANS: OrderedDict = OrderedDict()
_PLANS_MAX = 8
_CONFIGS: dict = {}
_CONFIGS_MAX = 32
_CACHE_LOCK = threading.Lock()
_SHIPPED_PATHS: dict = {}  # shipped configuration name -> its file's absolute path


def _named_config(name: str) -> RetargetConfig:
    """:func:`load_retarget_config`, kept while the file is unchanged (modification time and size)."""
    if name.endswith(".json"):  # a file of the user's (relative to the working directory) or a shipped name
        p = Path(name)
        f = os.path.abspath(p if p.suffix == ".json" and p.is_file() else _CONFIG_DIR / f"{name}.json")
    else:  # a shipped name: its file, without pathlib's per-call cost
        f = _SHIPPED_PATHS.get(name)
        if f is None:
            f = _SHIPPED_PATHS.setdefault(name, os.path.abspath(_CONFIG_DIR / f"{name}.json"))
    try:
        st = os.stat(f)
    except OSError:
        return load_retarget_config(name)  # raises, naming the shipped configurations
    key = (name, f, st.st_mtime_ns, st.st_size)
    with _CACHE_LOCK:
        config = _CONFIGS.get(key)
    if config is None:
        config = load_retarget_config(name)
        with _CACHE_LOCK:
            if len(_CONFIGS) >= _CONFIGS_MAX:
                _CONFIGS.clear()
            _CONFIGS[key] = config
    return config


def _plan_for(config: RetargetConfig, target, src_tree: SkeletonTree, source_tpose, target_tpose) -> _Plan:
    from ..animation.layout import ArticulationCoordinateLayout
    from ..asset.desc import ArticulationDesc

    cacheable = (
        source_tpose is None
        and target_tpose is None
        and isinstance(target, (ArticulationDesc, ArticulationCoordinateLayout, SkeletonTree))
    )
    if not cacheable:
        return _build_plan(config, _as_target(target), src_tree, source_tpose, target_tpose)
    key = (
        id(config),
        id(target),
        src_tree.node_names,
        src_tree.parent_indices.tobytes(),
        src_tree.local_translation.tobytes(),
    )
    with _CACHE_LOCK:
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is config and hit[1] is target:
            _PLANS.move_to_end(key)
            return hit[2]
    plan = _build_plan(config, _as_target(target), src_tree, None, None)
    with _CACHE_LOCK:
        _PLANS[key] = (config, target, plan)
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return plan


def _legs(plan: _Plan, pairs) -> tuple[list[Leg], dict]:
    """The legs ``plant_feet`` can hold on the plan's target (foot under a one-hinge shank under a thigh, the foot
    and toe mapped from source joints), and ``{foot: why not}`` for the others."""
    tree, art = plan.tgt.tree, plan.tgt.art
    mapped = set(plan.mapped_index.tolist())
    legs, skipped = [], {}
    for f, t in pairs:
        _check_names([f] + ([t] if t else []), tree, "target", None)
        foot = tree.index(f)
        toe = tree.index(t) if t else foot
        shank = int(tree.parent_indices[foot])
        thigh = int(tree.parent_indices[shank]) if shank >= 0 else -1
        hinges = [] if art is None or shank < 0 else [j for j in art.joints[shank] if j.type.name == "HINGE"]
        if thigh < 0 or len(hinges) != 1 or (art is not None and len(art.joints[shank]) != 1):
            skipped[f] = "the foot's parent is not a one-hinge knee under a thigh"
        elif foot not in mapped or toe not in mapped:
            skipped[f] = "the foot or its toe is not mapped from a source joint"
        else:
            axis = np.asarray(hinges[0].axis, dtype=np.float64)
            toe_hinge = [] if art is None or toe == foot else [j for j in art.joints[toe] if j.type.name == "HINGE"]
            toe_axis = toe_hinge[0].axis / np.linalg.norm(toe_hinge[0].axis) if len(toe_hinge) == 1 else None
            legs.append(
                Leg(f, thigh, shank, foot, toe, axis / np.linalg.norm(axis), _heel(plan.tgt, foot, toe), toe_axis)
            )
    return legs, skipped


def _heel(tgt: _Target, foot: int, toe: int) -> np.ndarray:
    """``[3]`` m in the foot's frame: the rearmost sole point of the foot's collision geoms (along the foot->toe
    direction), where a landing foot touches first; the foot's origin where it has no geom."""
    if tgt.desc is None or toe == foot:
        return np.zeros(3)
    pts, _ = _sole_points([g for g in _usable_geoms(tgt.desc) if g.body == foot])
    if not len(pts):
        return np.zeros(3)
    return pts[int(np.argmin(pts @ tgt.tree.local_translation[toe]))]


def _rolling_ground(low: np.ndarray, width: int) -> np.ndarray:
    """``[T]`` m: the running minimum of the lowest points ``low [T]`` over ``width`` (odd) frames, then its running
    mean over the same window, the ends repeated (``GroundFix.ROLLING_MIN``; scipy's ``minimum_filter1d`` and
    ``uniform_filter1d`` with ``mode="nearest"``, or one compiled pass equal to them to rounding)."""
    kernels = _kernels()
    if kernels is None:
        from scipy.ndimage import minimum_filter1d, uniform_filter1d

        return uniform_filter1d(minimum_filter1d(low, width, mode="nearest"), width, mode="nearest")
    out = np.empty(len(low))
    kernels.rolling_ground(np.ascontiguousarray(low, dtype=np.float64), int(width), out)
    return out


def _ground_below(low: np.ndarray, width: int) -> np.ndarray:
    """``[T]`` m: the running mean over ``width`` (odd) frames of the running minimum of ``low [T]`` over
    ``2 width - 1`` frames: smooth, and at every frame at or under ``low`` (each mean's window of minima covers that
    frame), so no frame of the motion is under the ground (``GroundFix.ROLLING_MIN`` with ``plant_feet``)."""
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    return uniform_filter1d(minimum_filter1d(low, 2 * width - 1, mode="nearest"), width, mode="nearest")


def _local_rotations(plan: _Plan, src_rot: np.ndarray) -> np.ndarray:
    """``[T, n, 4]`` float64 target local rotations from the source world rotations ``src_rot [T, ns, 4]``: the
    mapped bodies' world rotations (``world_map``), the hinge projection, then relative to their parents; one
    compiled pass over the frames where numba imports, else :func:`_local_rotations_numpy` (equal to rounding)."""
    kernels = _kernels()
    if kernels is None or not plan.kernel_args or src_rot.dtype not in (np.float32, np.float64):
        return _local_rotations_numpy(plan, src_rot)
    local = np.empty((len(src_rot),) + plan.tpose_local.shape)
    # float64 in: one compiled specialisation (the numpy path converts the mapped rows to float64 likewise)
    kernels.mapped_local_rotations(np.ascontiguousarray(src_rot, dtype=np.float64), *plan.kernel_args, local)
    return local


def _local_rotations_numpy(plan: _Plan, src_rot: np.ndarray) -> np.ndarray:
    """:func:`_local_rotations` in numpy array operations (over all frames at once)."""
    Gs = np.asarray(src_rot[:, plan.source_index], dtype=np.float64).swapaxes(0, 1)  # [M, T, 4]
    G = _unit(np.swapaxes(Gs @ plan.world_map, 0, 1))  # [T, M, 4]: one small matrix product per body
    if plan.hinges is not None:
        _apply_hinges(G, plan.hinges)
    return plan.local_rotation(G)


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

    Everything that depends only on the configuration, the target and the source skeleton (names, T-poses,
    hinge steps, sole points, collision geoms) is computed once and kept for the next clip of the same
    configuration and target objects and an equal source skeleton (a batch of clips); a clip then costs one
    forward kinematics of the source and of the target and a few array operations over its frames.
    """
    if isinstance(config, str):
        config = _named_config(config)
    if not isinstance(source, SkeletonMotion):
        raise ShapeError(f"source is {type(source).__name__}; expected a SkeletonMotion", item="source")
    if target is None:
        if config.target_asset is None:
            raise ShapeError(
                f"configuration {config.name!r} names no shipped target model; pass target=", item="target"
            )
        target = config.target_model_path()
    arrays = (source.root_translation, source.local_rotation, source.local_translation)
    src = source if all(a is None or isinstance(a, np.ndarray) for a in arrays) else source.numpy()
    dtype = src.local_rotation.dtype if src.local_rotation.dtype in (np.float32, np.float64) else np.float64
    if config.trim_frames is not None:
        b, e = config.trim_frames
        e = src.num_frames if e == -1 else min(e, src.num_frames)
        if b >= e:
            raise ShapeError(f"trim_frames {config.trim_frames} leave no frame of {src.num_frames}", item="trim_frames")
        src = src[b:e]
    plan = _plan_for(config, target, src.tree, source_tpose, target_tpose)
    tgt = plan.tgt

    meta = dict(src.metadata)
    meta["retarget"] = {
        "config": config.name,
        "scale": plan.scale,
        "rotation_wxyz": [float(x) for x in config.rotation_wxyz],
        "source_fps": src.fps,
        "trim_frames": None if config.trim_frames is None else list(config.trim_frames),
    }
    src_local = src.local_rotation
    if config.despike_acceleration is not None:
        src_local, spikes = despike_rotations(src_local, src.fps, max_acceleration=config.despike_acceleration)
        first = 0 if config.trim_frames is None else config.trim_frames[0]
        meta["retarget"]["spikes_corrected"] = [
            {
                "joint": src.tree.node_names[k.joint],
                "source_frame": k.frame + first,
                "deviation_rad": k.deviation_rad,
                "speed_in_rad_s": k.speed_in_rad_s,
                "speed_out_rad_s": k.speed_out_rad_s,
                "reason": "single-frame spike: replaced by the slerp of its neighbours",
            }
            for k in spikes
        ]

    # world rotations of the mapped source joints (FK in the source's dtype), onto the target's bodies
    src_pos, src_rot = plan.source_kinematics.from_local(src.root_translation, src_local, src.local_translation)
    local = _local_rotations(plan, src_rot)
    src_root = np.asarray(src_pos[:, plan.source_root], dtype=np.float64)
    root = plan.target_tpose_root + (src_root - plan.source_tpose_root) @ plan.root_map.T
    pos = rot = None  # the target's world poses, once computed
    if config.level_feet and plan.feet is not None:
        pos, rot = tgt.tree.kinematics.from_local(root, local)
        levelled, current = _level_feet_in_place(plan.feet, pos, rot, local, src.fps)
        meta["retarget"]["feet_levelled_deg"] = levelled
        if not current:  # the feet and what hangs below them moved
            pos = None
        if plan.feet.skipped:
            meta["retarget"]["feet_not_levelled"] = dict(plan.feet.skipped)
    elif config.level_feet:
        meta["retarget"]["feet_not_levelled"] = {f: "the target has no collision geoms" for f, _ in config.level_feet}
    if config.plant_feet:
        legs, not_planted = _legs(plan, config.plant_feet)
        if legs:
            mapped = dict(zip(plan.mapped_index.tolist(), plan.source_index.tolist()))
            pts = np.asarray(src_pos, dtype=np.float64)[:, [mapped[k] for g in legs for k in (g.foot, g.toe)]]
            pts = plan.target_tpose_root + (pts - plan.source_tpose_root) @ plan.root_map.T  # [T, 2L, 3]
            pts = pts.reshape(len(pts), len(legs), 2, 3).transpose(1, 2, 0, 3)
            meta["retarget"]["feet_planted"] = plant_feet(
                tgt.tree.parent_indices, root, local, tgt.tree.kinematics, legs, pts, src.fps
            )
            pos = None
        if not_planted:
            meta["retarget"]["feet_not_planted"] = not_planted
    shift = 0.0
    if config.ground_fix is not GroundFix.NONE:
        if pos is None:
            pos, rot = tgt.tree.kinematics.from_local(root, local)
        if config.ground_reference is GroundReference.COLLISION_GEOMS and plan.ground is not None:
            low = plan.ground.lowest(pos, rot)
            if plan.ground.bare_names:  # recorded: these bodies stand on their origins
                meta["retarget"]["ground_bodies_without_geoms"] = list(plan.ground.bare_names)
        else:
            low = pos[..., 2].min(axis=1)
        if config.ground_fix is GroundFix.ROLLING_MIN:
            width = max(1, int(round(config.ground_window_s * src.fps)) | 1)
            shift = -(_ground_below(low, width) if config.plant_feet else _rolling_ground(low, width))
        else:
            shift = -float(low.min() if config.ground_fix is GroundFix.CLIP_MIN else low[0])
    shift = shift + config.root_height_offset
    root[:, 2] += shift
    meta["retarget"]["ground_shift"] = float(np.mean(shift))
    motion = SkeletonMotion(
        tgt.tree, root.astype(dtype, copy=False), local.astype(dtype, copy=False), src.fps, metadata=meta
    )
    return RetargetResult(
        motion=motion,
        source_tpose=plan.source_tpose,
        target_tpose=plan.target_tpose,
        scale=plan.scale,
        ground_shift=shift,
        mapped_target_joints=plan.mapped_names,
        unmapped_target_joints=plan.unmapped_names,
        rigid_target_joints=plan.rigid,
        projected_joints=plan.projected,
    )

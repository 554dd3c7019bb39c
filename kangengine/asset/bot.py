"""``.superdex_bot`` robot assets: typed, frozen :class:`BotPrefab` and its JSON reader and writer.

The schema is SuperDex's (``superdex_bot_schema.md``, ``superdex_articulated_actors.md``): parallel ``joints``
and ``links`` arrays (joint ``i`` is the inbound joint of link ``i``; index 0 is the world joint), parent-first
links, ``worldFromRoot``, ``defaultPose`` (one value per Revolute/Prismatic DOF, three per Spherical joint as a
rotation vector, none for Free/Hard), ``contactOverrides`` and ``cycles``.

Conventions at the boundary (DESIGN.md §3): the file stores quaternions XYZW; every :class:`TransformRT` and mesh
rotation here is WXYZ (``rotation_wxyz``), converted with :func:`kangengine.rotations.quat_xyzw_to_wxyz` on read
and :func:`~kangengine.rotations.quat_wxyz_to_xyzw` on write. SI units throughout (m, rad, kg).

Where the reference leaves the JSON spelling open, this module reads and writes:

- ``TransformRT``: ``{"rotation": [x, y, z, w], "translation": [x, y, z]}`` (either key may be missing: identity).
- link geometry: ``shapeFile`` / ``renderModelFile`` (the schema table's names); the shipped FR3 example's
  ``shape`` / ``renderModel`` are read as the same fields.
- ``contactOverrides``: ``{"linkA": name, "linkB": name, "enable": bool}``.
- ``cycles``: ``{"parentLink": i, "childLink": j, "jointFromChildLink": TransformRT, "stiffness": k}``; the pivot
  is the translation of ``jointFromChildLink``, a point in the child link's frame (as the reference describes it).
- ``sensors``: ``{"type": str, "name": str, ...}``; the other keys are kept verbatim in ``params``.
- ``friction``: ``{"viscous", "coulomb", "falloffVel", "stictionExtra", "stribeckVel"}``.

Rules enforced on every :class:`BotPrefab` (at construction, so on load and on conversion), each raising a
:class:`~kangengine.errors.KangEngineError` subclass that names the file, the joint or link and the rule: equal
joint and link counts, at least one link, parent-first order with link 0 the only root, names unique across joints
and links and free of ``/``, ``\\`` and NUL, a joint type set, a non-zero axis for Revolute/Prismatic (normalised),
limits along the axis with ``min <= max``, the five accepted mass-property combinations for links with a shape,
positive finite mass and density, an identity ``parentJointFromLink`` rotation, a ``defaultPose`` of the DOF
layout's length, contact overrides and cycles naming existing, distinct links.

Links without a shape "carry no mass properties" in the reference; the shipped FR3 file nevertheless writes
``mass: 0`` with a zero centre of mass and inertia on its shapeless base, and a URDF's sensor frames carry real
masses. So a shapeless link accepts either nothing, that all-zero triple, or a fully explicit positive mass with
centre of mass and inertia; density (nothing to integrate) and partial sets are refused.
"""

from __future__ import annotations

import enum
import json
import math
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import rotations as R
from .._files import atomic_write
from ..errors import DuplicateNameError, FileMissingError, FormatError, TopologyError

__all__ = [
    "BOT_SUFFIX",
    "BOT_ARCHIVE_SUFFIX",
    "BotFormatError",
    "MassPropertiesError",
    "BotJointType",
    "TransformRT",
    "BotJointFriction",
    "BotJointPrefab",
    "BotMeshRef",
    "BotMassProperties",
    "BotSensorPrefab",
    "BotLinkPrefab",
    "BotContactOverride",
    "BotCycleJoint",
    "BotPrefab",
    "load_bot",
    "save_bot",
    "parse_bot",
]

BOT_SUFFIX = ".superdex_bot"
BOT_ARCHIVE_SUFFIX = ".superdex_bot_archive"
_BAD_NAME_CHARS = ("/", "\\", "\x00")
_ROT_TOL = 1e-9  # identity rotation: |angle| below this (rad)


class BotFormatError(FormatError):
    """A ``.superdex_bot`` breaks a rule of the schema (the message names the joint or link and the rule)."""


class MassPropertiesError(BotFormatError):
    """A link's mass properties are not one of the accepted combinations, not positive and finite, or cannot be
    derived from its geometry."""


class BotJointType(enum.Enum):
    """SuperDex joint types; :attr:`pose_dof_count` is what the joint contributes to ``defaultPose``."""

    FREE = "Free"
    HARD = "Hard"
    REVOLUTE = "Revolute"
    PRISMATIC = "Prismatic"
    SPHERICAL = "Spherical"

    @property
    def pose_dof_count(self) -> int:
        return {"Free": 0, "Hard": 0, "Revolute": 1, "Prismatic": 1, "Spherical": 3}[self.value]

    @property
    def has_axis(self) -> bool:
        return self in (BotJointType.REVOLUTE, BotJointType.PRISMATIC)


def _tuple(x, n: int) -> tuple[float, ...]:
    a = np.asarray(x, dtype=np.float64).reshape(n)
    return tuple(float(v) for v in a)


@dataclass(frozen=True)
class TransformRT:
    """A rigid transform ``a_from_b``: ``x_a = rotate(rotation_wxyz, x_b) + translation``.

    Attributes:
        translation: ``(3,)`` m.
        rotation_wxyz: ``(4,)`` unit quaternion, WXYZ (the file stores XYZW).
    """

    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation_wxyz: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)

    def __post_init__(self):
        object.__setattr__(self, "translation", _tuple(self.translation, 3))
        q = np.array(_tuple(self.rotation_wxyz, 4))
        n = float(np.linalg.norm(q))
        if n > 0 and math.isfinite(n):  # a zero or non-finite rotation is kept and refused by the checks
            q = q / n
        object.__setattr__(self, "rotation_wxyz", _tuple(q, 4))

    @classmethod
    def identity(cls) -> TransformRT:
        return cls()

    @property
    def is_identity_rotation(self) -> bool:
        w = abs(self.rotation_wxyz[0])
        return 2.0 * math.acos(min(1.0, w)) < _ROT_TOL

    def compose(self, other: TransformRT) -> TransformRT:
        """``self * other`` (``a_from_b * b_from_c = a_from_c``)."""
        q = np.array(self.rotation_wxyz)
        t = np.array(self.translation) + R.quat_rotate(q, np.array(other.translation))
        return TransformRT(t, R.quat_normalize(R.quat_multiply(q, np.array(other.rotation_wxyz))))

    def inverse(self) -> TransformRT:
        q = R.quat_conjugate(np.array(self.rotation_wxyz))
        return TransformRT(-R.quat_rotate(q, np.array(self.translation)), q)

    def apply(self, point) -> np.ndarray:
        """``[3] float64``: ``point`` (frame b) in frame a."""
        return np.array(self.translation) + R.quat_rotate(np.array(self.rotation_wxyz), np.asarray(point, float))


@dataclass(frozen=True)
class BotJointFriction:
    """``ArticulatedJointFrictionParams``: viscous (N s/m or N m s/rad), coulomb (N or N m), falloff_vel,
    stiction_extra, stribeck_vel (m/s or rad/s)."""

    viscous: float = 0.0
    coulomb: float = 0.0
    falloff_vel: float = 1e-3
    stiction_extra: float = 0.0
    stribeck_vel: float = 0.0


@dataclass(frozen=True)
class BotJointPrefab:
    """One joint: the inbound joint of the link with the same index.

    Attributes:
        name: unique across joints and links; no ``/``, ``\\`` or NUL.
        type: :class:`BotJointType`.
        parent_link_from_joint: the joint frame in the parent link's frame (the root frame for joint 0).
        axis: ``(3,)`` unit axis in the joint frame (Revolute/Prismatic; normalised on construction).
        friction: :class:`BotJointFriction` (ignored for Free/Hard).
        inertia: joint (rotor) inertia, kg m^2 or kg; ``None``: unset (0).
        min_limit, max_limit: ``(3,)`` per-DOF limits in rad or m, ``None``: unlimited. For 1-DOF joints the
            scalar limit times the axis (:attr:`scalar_limits` gives the scalars).
        limit_stiffness, limit_damping: of the limit constraints (defaults 100 and 0).
        effort_limit: N m or N; negative: unbounded, 0: not actuated (advisory).
    """

    name: str
    type: BotJointType
    parent_link_from_joint: TransformRT = field(default_factory=TransformRT)
    axis: tuple[float, float, float] = (1.0, 0.0, 0.0)
    friction: BotJointFriction = field(default_factory=BotJointFriction)
    inertia: float | None = None
    min_limit: tuple[float, float, float] | None = None
    max_limit: tuple[float, float, float] | None = None
    limit_stiffness: float = 100.0
    limit_damping: float = 0.0
    effort_limit: float = -1.0

    def __post_init__(self):
        object.__setattr__(self, "axis", _tuple(self.axis, 3))
        for k in ("min_limit", "max_limit"):
            if getattr(self, k) is not None:
                object.__setattr__(self, k, _tuple(getattr(self, k), 3))
        if self.type.has_axis:
            n = float(np.linalg.norm(self.axis))
            if n > 0 and math.isfinite(n):
                object.__setattr__(self, "axis", tuple(a / n for a in self.axis))

    @property
    def scalar_limits(self) -> tuple[float, float] | None:
        """``(lower, upper)`` along the axis for Revolute/Prismatic joints with limits, else ``None``."""
        if not self.type.has_axis or self.min_limit is None or self.max_limit is None:
            return None
        n = np.array(self.axis)
        return float(np.dot(self.min_limit, n)), float(np.dot(self.max_limit, n))


@dataclass(frozen=True)
class BotMeshRef:
    """A mesh file with the scale, rotation (WXYZ) and translation (m) applied to it in the link frame:
    ``x_link = rotate(rotation_wxyz, scale * x_file) + translation``. ``file`` is as written in the bot file
    (relative paths resolve against the bot file's folder)."""

    file: str
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    rotation_wxyz: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self):
        object.__setattr__(self, "scale", _tuple(self.scale, 3))
        object.__setattr__(self, "rotation_wxyz", _tuple(self.rotation_wxyz, 4))
        object.__setattr__(self, "translation", _tuple(self.translation, 3))


@dataclass(frozen=True)
class BotMassProperties:
    """A link's inertial fields as written (each ``None`` when unset).

    Attributes:
        density: kg/m^3. mass: kg. center_of_mass: ``(3,)`` m in the link frame.
        moment_of_inertia: ``(6,)`` kg m^2 about the COM, ``[ixx, ixy, ixz, iyy, iyz, izz]`` as URDF writes
            them (the tensor's entries).
    """

    density: float | None = None
    mass: float | None = None
    center_of_mass: tuple[float, float, float] | None = None
    moment_of_inertia: tuple[float, float, float, float, float, float] | None = None

    def __post_init__(self):
        if self.center_of_mass is not None:
            object.__setattr__(self, "center_of_mass", _tuple(self.center_of_mass, 3))
        if self.moment_of_inertia is not None:
            object.__setattr__(self, "moment_of_inertia", _tuple(self.moment_of_inertia, 6))

    @property
    def combination(self) -> str:
        """Which fields are set: a ``+``-joined subset of ``density``, ``mass``, ``centerOfMass``,
        ``momentOfInertia`` in that order, or ``"none"``."""
        names = [
            n
            for n, v in (
                ("density", self.density),
                ("mass", self.mass),
                ("centerOfMass", self.center_of_mass),
                ("momentOfInertia", self.moment_of_inertia),
            )
            if v is not None
        ]
        return "+".join(names) or "none"

    @property
    def inertia_matrix(self) -> np.ndarray | None:
        """``[3, 3] float64`` kg m^2 or ``None``."""
        if self.moment_of_inertia is None:
            return None
        xx, xy, xz, yy, yz, zz = self.moment_of_inertia
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


ACCEPTED_MASS_COMBINATIONS = (
    "none",
    "density",
    "mass",
    "mass+centerOfMass+momentOfInertia",
    "density+centerOfMass+momentOfInertia",
)


@dataclass(frozen=True)
class BotSensorPrefab:
    """A sensor on a link: ``type``, ``name`` and the rest of its JSON object kept verbatim in ``params``."""

    type: str
    name: str = ""
    params: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "params", types.MappingProxyType(dict(self.params)))

    def __eq__(self, other):
        return (
            isinstance(other, BotSensorPrefab)
            and (self.type, self.name) == (other.type, other.name)
            and dict(self.params) == dict(other.params)
        )

    __hash__ = None


@dataclass(frozen=True)
class BotLinkPrefab:
    """One link (rigid body).

    Attributes:
        name: unique across joints and links; no ``/``, ``\\`` or NUL.
        parent_link: index of the parent link (``< own index``), -1 for the root (index 0 only).
        parent_joint_from_link: the link frame in its inbound joint's frame; rotation must be identity.
        layer: collision layer name. collider_type: SuperDex ``ColliderType`` name (default ``"Auto"``).
        contact: the ``ContactParams`` JSON object, kept verbatim. has_gravity: default ``True``.
        mass_properties: :class:`BotMassProperties` as written.
        shape: collision mesh or ``None`` (a dummy link). render_model: render mesh or ``None``.
        sensors: :class:`BotSensorPrefab` attached to the link.
    """

    name: str
    parent_link: int = -1
    parent_joint_from_link: TransformRT = field(default_factory=TransformRT)
    layer: str = ""
    collider_type: str = "Auto"
    contact: Mapping = field(default_factory=dict)
    has_gravity: bool = True
    mass_properties: BotMassProperties = field(default_factory=BotMassProperties)
    shape: BotMeshRef | None = None
    render_model: BotMeshRef | None = None
    sensors: tuple[BotSensorPrefab, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "parent_link", int(self.parent_link))
        object.__setattr__(self, "contact", types.MappingProxyType(dict(self.contact)))
        object.__setattr__(self, "sensors", tuple(self.sensors))

    def __eq__(self, other):
        if not isinstance(other, BotLinkPrefab):
            return NotImplemented
        names = [f for f in self.__dataclass_fields__ if f != "contact"]
        return all(getattr(self, f) == getattr(other, f) for f in names) and dict(self.contact) == dict(other.contact)

    __hash__ = None


@dataclass(frozen=True)
class BotContactOverride:
    """Enable or disable contact between two links (by name), overriding the adjacent-pair default."""

    link_a: str
    link_b: str
    enable: bool


@dataclass(frozen=True)
class BotCycleJoint:
    """A loop-closing soft spherical joint: the pivot ``joint_from_child_link.translation`` (m, child link frame)
    of ``child_link`` is held, with ``stiffness`` (N/m), at the point of ``parent_link`` where it lies in the
    bot's zero pose."""

    parent_link: int
    child_link: int
    joint_from_child_link: TransformRT = field(default_factory=TransformRT)
    stiffness: float = 50000.0


@dataclass(frozen=True, eq=True)
class BotPrefab:
    """A complete ``.superdex_bot``: one articulated robot. Checked on construction (see the module docstring).

    Attributes:
        name: bot name.
        joints: :class:`BotJointPrefab`, ``joints[i]`` is the inbound joint of ``links[i]``.
        links: :class:`BotLinkPrefab`, parent-first.
        world_from_root: the root frame in the world.
        default_pose: ``(pose_dof_count,)`` rad / m: per Revolute/Prismatic joint one value, per Spherical joint a
            rotation vector (three values), none for Free/Hard; empty: all zero.
        contact_overrides, cycles: optional.
        source: the file relative mesh paths resolve against (not compared, not written).
        notes: what a conversion dropped or changed, one sentence each (not compared, not written).
    """

    name: str
    joints: tuple[BotJointPrefab, ...]
    links: tuple[BotLinkPrefab, ...]
    world_from_root: TransformRT = field(default_factory=TransformRT)
    default_pose: tuple[float, ...] = ()
    contact_overrides: tuple[BotContactOverride, ...] = ()
    cycles: tuple[BotCycleJoint, ...] = ()
    source: str | None = field(default=None, compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        object.__setattr__(self, "joints", tuple(self.joints))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "default_pose", tuple(float(v) for v in self.default_pose))
        object.__setattr__(self, "contact_overrides", tuple(self.contact_overrides))
        object.__setattr__(self, "cycles", tuple(self.cycles))
        object.__setattr__(self, "notes", tuple(self.notes))
        if self.source is not None:
            object.__setattr__(self, "source", os.fspath(self.source))
        _check_bot(self)

    __hash__ = None

    @property
    def joint_names(self) -> tuple[str, ...]:
        return tuple(j.name for j in self.joints)

    @property
    def link_names(self) -> tuple[str, ...]:
        return tuple(lk.name for lk in self.links)

    @property
    def pose_dof_count(self) -> int:
        """Length of a full ``defaultPose``."""
        return sum(j.type.pose_dof_count for j in self.joints)

    @property
    def pose_dof_offsets(self) -> tuple[int, ...]:
        """``(joints,)``: offset of each joint's values in ``defaultPose``."""
        out, k = [], 0
        for j in self.joints:
            out.append(k)
            k += j.type.pose_dof_count
        return tuple(out)

    @property
    def default_pose_full(self) -> np.ndarray:
        """``[pose_dof_count] float64``: ``default_pose``, or zeros when it is empty."""
        if not self.default_pose:
            return np.zeros(self.pose_dof_count)
        return np.array(self.default_pose)

    def link_index(self, name: str) -> int:
        from ..errors import UnknownNameError

        for i, lk in enumerate(self.links):
            if lk.name == name:
                return i
        raise UnknownNameError(f"no link {name!r}; links are: {', '.join(self.link_names)}", path=self.source)


# -- rules -------------------------------------------------------------------------------------------------------
def _check_bot(bot: BotPrefab) -> None:
    src = bot.source
    if len(bot.joints) != len(bot.links):
        raise TopologyError(
            f"{len(bot.joints)} joints and {len(bot.links)} links; the schema needs one joint per link "
            "(joints[i] is the parent joint of links[i])",
            path=src,
            item="joints/links",
        )
    if not bot.links:
        raise TopologyError("no links; a bot needs at least one", path=src, item="links")
    _check_names(bot)
    for i, lk in enumerate(bot.links):
        item = f"link {lk.name!r} (links[{i}])"
        if i == 0 and lk.parent_link != -1:
            raise TopologyError(f"the root (index 0) has parentLink {lk.parent_link}; expected -1", path=src, item=item)
        if i > 0 and not 0 <= lk.parent_link < i:
            raise TopologyError(
                f"parentLink is {lk.parent_link}; links are parent-first, so expected 0 <= parentLink < {i} "
                "(only links[0] is the root)",
                path=src,
                item=item,
            )
        if not lk.parent_joint_from_link.is_identity_rotation:
            raise BotFormatError(
                f"parentJointFromLink rotation {list(lk.parent_joint_from_link.rotation_wxyz)} (WXYZ) is not "
                "identity; the schema supports identity rotations only",
                path=src,
                item=item,
            )
        _check_mass(lk.mass_properties, has_shape=lk.shape is not None, path=src, item=item)
    for i, jt in enumerate(bot.joints):
        _check_joint(jt, path=src, item=f"joint {jt.name!r} (joints[{i}])")
    if bot.default_pose and len(bot.default_pose) != bot.pose_dof_count:
        raise BotFormatError(
            f"defaultPose has {len(bot.default_pose)} values; the joints need {bot.pose_dof_count} "
            "(1 per Revolute/Prismatic, 3 per Spherical, 0 per Free/Hard) or none",
            path=src,
            item="defaultPose",
        )
    if not all(math.isfinite(v) for v in bot.default_pose):
        raise BotFormatError("defaultPose holds a non-finite value", path=src, item="defaultPose")
    names = set(bot.link_names)
    for k, co in enumerate(bot.contact_overrides):
        for ln in (co.link_a, co.link_b):
            if ln not in names:
                raise BotFormatError(
                    f"names link {ln!r}, which does not exist; links are: {', '.join(bot.link_names)}",
                    path=src,
                    item=f"contactOverrides[{k}]",
                )
        if co.link_a == co.link_b:
            raise BotFormatError(f"pairs link {co.link_a!r} with itself", path=src, item=f"contactOverrides[{k}]")
    n = len(bot.links)
    for k, c in enumerate(bot.cycles):
        if not (0 <= c.parent_link < n and 0 <= c.child_link < n) or c.parent_link == c.child_link:
            raise TopologyError(
                f"parentLink {c.parent_link} and childLink {c.child_link}; expected two distinct link indices "
                f"in 0..{n - 1}",
                path=src,
                item=f"cycles[{k}]",
            )
        if not (math.isfinite(c.stiffness) and c.stiffness > 0):
            raise BotFormatError(f"stiffness {c.stiffness} must be positive and finite", path=src, item=f"cycles[{k}]")


def _check_names(bot: BotPrefab) -> None:
    seen: dict[str, str] = {}
    for kind, items in (("joint", bot.joints), ("link", bot.links)):
        for i, x in enumerate(items):
            item = f"{kind} {x.name!r} ({kind}s[{i}])"
            if not x.name:
                raise DuplicateNameError(
                    "has an empty name; every joint and link needs one", path=bot.source, item=item
                )
            bad = [c for c in _BAD_NAME_CHARS if c in x.name]
            if bad:
                raise DuplicateNameError(
                    f"name holds {bad[0]!r}; names must not contain '/', '\\' or NUL", path=bot.source, item=item
                )
            here = f"{kind}s[{i}]"
            if x.name in seen:
                raise DuplicateNameError(
                    f"name is also used by {seen[x.name]}; names are unique across joints and links",
                    path=bot.source,
                    item=item,
                )
            seen[x.name] = here


def _check_joint(jt: BotJointPrefab, *, path, item) -> None:
    if not isinstance(jt.type, BotJointType):
        raise BotFormatError(f"type {jt.type!r} is not a BotJointType", path=path, item=item)
    if jt.type.has_axis:
        n = float(np.linalg.norm(jt.axis))
        if not (math.isfinite(n) and abs(n - 1.0) < 1e-9):
            raise BotFormatError(
                f"{jt.type.value} joint axis {list(jt.axis)} is zero or not finite; expected a non-zero direction",
                path=path,
                item=item,
            )
    vals = [*jt.parent_link_from_joint.translation, *jt.parent_link_from_joint.rotation_wxyz]
    if not all(math.isfinite(v) for v in vals) or not any(jt.parent_link_from_joint.rotation_wxyz):
        raise BotFormatError(
            "parentLinkFromJoint is not finite or its rotation is a zero quaternion", path=path, item=item
        )
    if (jt.min_limit is None) != (jt.max_limit is None) and jt.type not in (BotJointType.FREE, BotJointType.HARD):
        raise BotFormatError("gives one of minLimit/maxLimit; expected both or neither", path=path, item=item)
    if jt.min_limit is not None and jt.max_limit is not None and jt.type not in (BotJointType.FREE, BotJointType.HARD):
        lo, hi = np.array(jt.min_limit), np.array(jt.max_limit)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise BotFormatError("minLimit/maxLimit are not finite", path=path, item=item)
        if jt.type.has_axis:
            n = np.array(jt.axis)
            for name, v in (("minLimit", lo), ("maxLimit", hi)):
                if np.linalg.norm(v - np.dot(v, n) * n) > 1e-9 * max(1.0, float(np.linalg.norm(v))):
                    raise BotFormatError(
                        f"{name} {v.tolist()} is not along the axis {n.tolist()}; for a 1-DOF joint it is the "
                        "scalar limit times the axis",
                        path=path,
                        item=item,
                    )
            lo_s, hi_s = jt.scalar_limits
            if lo_s > hi_s:
                raise BotFormatError(f"lower limit {lo_s} > upper limit {hi_s}", path=path, item=item)
        elif np.any(lo > hi):
            raise BotFormatError(f"minLimit {lo.tolist()} exceeds maxLimit {hi.tolist()}", path=path, item=item)
    for name in ("limit_stiffness", "limit_damping"):
        v = getattr(jt, name)
        if not (math.isfinite(v) and v >= 0):
            raise BotFormatError(f"{name} {v} must be non-negative and finite", path=path, item=item)
    if jt.inertia is not None and not (math.isfinite(jt.inertia) and jt.inertia >= 0):
        raise BotFormatError(f"inertia {jt.inertia} must be non-negative and finite", path=path, item=item)
    if not math.isfinite(jt.effort_limit):
        raise BotFormatError(f"effortLimit {jt.effort_limit} is not finite", path=path, item=item)


def _check_mass(mp: BotMassProperties, *, has_shape: bool, path, item) -> None:
    for name, v in (("density", mp.density), ("mass", mp.mass)):
        if v is not None and not math.isfinite(v):
            raise MassPropertiesError(
                f"{name} {v} is not finite; expected a positive finite value", path=path, item=item
            )
    for name, v in (("centerOfMass", mp.center_of_mass), ("momentOfInertia", mp.moment_of_inertia)):
        if v is not None and not all(math.isfinite(x) for x in v):
            raise MassPropertiesError(f"{name} is not finite", path=path, item=item)
    combo = mp.combination
    zero_triple = (
        combo == "mass+centerOfMass+momentOfInertia"
        and mp.mass == 0
        and not any(mp.center_of_mass)
        and not any(mp.moment_of_inertia)
    )
    if not has_shape:
        if combo not in ("none", "mass+centerOfMass+momentOfInertia"):
            raise MassPropertiesError(
                f"has no shapeFile and gives {combo}; a link without geometry carries no mass properties (or a "
                "fully explicit mass + centerOfMass + momentOfInertia, or the all-zero triple)",
                path=path,
                item=item,
            )
    elif combo not in ACCEPTED_MASS_COMBINATIONS:
        raise MassPropertiesError(
            f"gives {combo}; accepted combinations are: {', '.join(ACCEPTED_MASS_COMBINATIONS)} (density and mass "
            "are mutually exclusive; centerOfMass and momentOfInertia come together)",
            path=path,
            item=item,
        )
    for name, v in (("density", mp.density), ("mass", mp.mass)):
        if v is not None and not (v > 0) and not (name == "mass" and zero_triple and not has_shape):
            raise MassPropertiesError(f"{name} {v} must be positive", path=path, item=item)
    inertia = mp.inertia_matrix
    if inertia is not None and not zero_triple:
        ev = np.linalg.eigvalsh(inertia)
        if ev[0] < -1e-12 * max(1.0, abs(ev[-1])) or ev[0] + ev[1] < ev[2] * (1 - 1e-9) - 1e-12:
            raise MassPropertiesError(
                f"momentOfInertia has principal moments {ev.tolist()}; expected a positive semi-definite tensor "
                "obeying the triangle inequality",
                path=path,
                item=item,
            )


# -- JSON reading -------------------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, path):
        self.path = None if path is None else os.fspath(path)
        self.notes: list[str] = []

    def fail(self, msg, item):
        raise BotFormatError(msg, path=self.path, item=item)

    def obj(self, x, item) -> dict:
        if not isinstance(x, dict):
            self.fail(f"expected a JSON object, got {type(x).__name__}", item)
        return x

    def number(self, d, key, default, item, *, allow_none=False):
        v = d.get(key, default)
        if v is None and (allow_none or default is None):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(f"{key} is {v!r}; expected a number", item)
        if not math.isfinite(v):
            self.fail(f"{key} is {v!r}; expected a finite number", item)
        return float(v)

    def vec(self, d, key, n, default, item):
        v = d.get(key, default)
        if v is None:
            return None
        if (
            not isinstance(v, list)
            or len(v) != n
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v)
        ):
            self.fail(f"{key} is {v!r}; expected {n} numbers", item)
        if not all(math.isfinite(x) for x in v):
            self.fail(f"{key} is {v!r}; expected finite numbers", item)
        return tuple(float(x) for x in v)

    def quat(self, d, key, item):
        v = self.vec(d, key, 4, [0.0, 0.0, 0.0, 1.0], item)
        n = math.sqrt(sum(x * x for x in v))
        if n < 1e-9:
            self.fail(f"{key} {list(v)} is a zero quaternion; expected a unit [x, y, z, w]", item)
        return tuple(float(x) for x in R.quat_xyzw_to_wxyz(np.array(v) / n))

    def string(self, d, key, default, item):
        v = d.get(key, default)
        if not isinstance(v, str):
            self.fail(f"{key} is {v!r}; expected a string", item)
        return v

    def transform(self, d, key, item):
        t = d.get(key)
        if t is None:
            return TransformRT()
        t = self.obj(t, f"{item}/{key}")
        return TransformRT(
            self.vec(t, "translation", 3, [0.0, 0.0, 0.0], f"{item}/{key}"), self.quat(t, "rotation", f"{item}/{key}")
        )

    def unknown(self, d, known, item):
        extra = sorted(set(d) - set(known))
        if extra:
            self.notes.append(f"{item}: ignored unknown keys {extra}")


_JOINT_KEYS = {
    "name",
    "type",
    "parentLinkFromJoint",
    "axis",
    "friction",
    "inertia",
    "minLimit",
    "maxLimit",
    "limitStiffness",
    "limitDamping",
    "effortLimit",
}
_LINK_KEYS = {
    "name",
    "parentLink",
    "parentJointFromLink",
    "layer",
    "colliderType",
    "contact",
    "hasGravity",
    "density",
    "mass",
    "centerOfMass",
    "momentOfInertia",
    "sensors",
}
_MESH_KEYS = {
    "shape": ("shapeFile", "shape", "shapeScale", "shapeRotation", "shapeTranslation"),
    "render": ("renderModelFile", "renderModel", "renderModelScale", "renderModelRotation", "renderModelTranslation"),
}
_TYPES = {t.value.lower(): t for t in BotJointType}


def _read_joint(rd: _Reader, d, i) -> BotJointPrefab:
    item = f"joints[{i}]"
    d = rd.obj(d, item)
    name = rd.string(d, "name", f"joint_{i}", item) or f"joint_{i}"
    item = f"joint {name!r} (joints[{i}])"
    t = d.get("type")
    if not isinstance(t, str) or t.lower() not in _TYPES:
        rd.fail(f"type is {t!r}; expected one of {[x.value for x in BotJointType]} (it must be set)", item)
    jtype = _TYPES[t.lower()]
    fr = rd.obj(d.get("friction", {}), item + "/friction")
    rd.unknown(fr, {"viscous", "coulomb", "falloffVel", "stictionExtra", "stribeckVel"}, item + "/friction")
    friction = BotJointFriction(
        viscous=rd.number(fr, "viscous", 0.0, item),
        coulomb=rd.number(fr, "coulomb", 0.0, item),
        falloff_vel=rd.number(fr, "falloffVel", 1e-3, item),
        stiction_extra=rd.number(fr, "stictionExtra", 0.0, item),
        stribeck_vel=rd.number(fr, "stribeckVel", 0.0, item),
    )
    axis = rd.vec(d, "axis", 3, [1.0, 0.0, 0.0], item)
    if jtype.has_axis and not np.linalg.norm(axis) > 0:
        rd.fail(f"{jtype.value} joint axis {list(axis)} is zero; expected a non-zero direction", item)
    rd.unknown(d, _JOINT_KEYS, item)
    return BotJointPrefab(
        name=name,
        type=jtype,
        parent_link_from_joint=rd.transform(d, "parentLinkFromJoint", item),
        axis=axis,
        friction=friction,
        inertia=rd.number(d, "inertia", None, item),
        min_limit=rd.vec(d, "minLimit", 3, None, item),
        max_limit=rd.vec(d, "maxLimit", 3, None, item),
        limit_stiffness=rd.number(d, "limitStiffness", 100.0, item),
        limit_damping=rd.number(d, "limitDamping", 0.0, item),
        effort_limit=rd.number(d, "effortLimit", -1.0, item),
    )


def _read_mesh(rd: _Reader, d, kind, item) -> BotMeshRef | None:
    file_key, alias, scale, rot, trans = _MESH_KEYS[kind]
    a, b = d.get(file_key), d.get(alias)
    if a is not None and b is not None and a != b:
        rd.fail(f"{file_key}={a!r} and {alias}={b!r} disagree; give one", item)
    f = a if a is not None else b
    if f is None or f == "":
        return None
    if not isinstance(f, str):
        rd.fail(f"{file_key} is {f!r}; expected a path string", item)
    return BotMeshRef(
        file=f,
        scale=rd.vec(d, scale, 3, [1.0, 1.0, 1.0], item),
        rotation_wxyz=rd.quat(d, rot, item),
        translation=rd.vec(d, trans, 3, [0.0, 0.0, 0.0], item),
    )


def _read_link(rd: _Reader, d, i) -> BotLinkPrefab:
    item = f"links[{i}]"
    d = rd.obj(d, item)
    name = rd.string(d, "name", f"link_{i}", item) or f"link_{i}"
    item = f"link {name!r} (links[{i}])"
    parent = d.get("parentLink", -1)
    if isinstance(parent, bool) or not isinstance(parent, int):
        rd.fail(f"parentLink is {parent!r}; expected an integer index", item)
    sensors = []
    for k, s in enumerate(d.get("sensors", []) or []):
        s = rd.obj(s, f"{item}/sensors[{k}]")
        sensors.append(
            BotSensorPrefab(
                type=rd.string(s, "type", "", f"{item}/sensors[{k}]"),
                name=rd.string(s, "name", "", f"{item}/sensors[{k}]"),
                params={key: v for key, v in s.items() if key not in ("type", "name")},
            )
        )
    gravity = d.get("hasGravity", True)
    if not isinstance(gravity, bool):
        rd.fail(f"hasGravity is {gravity!r}; expected true or false", item)
    rd.unknown(d, _LINK_KEYS | set(_MESH_KEYS["shape"]) | set(_MESH_KEYS["render"]), item)
    return BotLinkPrefab(
        name=name,
        parent_link=parent,
        parent_joint_from_link=rd.transform(d, "parentJointFromLink", item),
        layer=rd.string(d, "layer", "", item),
        collider_type=rd.string(d, "colliderType", "Auto", item),
        contact=rd.obj(d.get("contact", {}), item + "/contact"),
        has_gravity=gravity,
        mass_properties=BotMassProperties(
            density=rd.number(d, "density", None, item),
            mass=rd.number(d, "mass", None, item),
            center_of_mass=rd.vec(d, "centerOfMass", 3, None, item),
            moment_of_inertia=rd.vec(d, "momentOfInertia", 6, None, item),
        ),
        shape=_read_mesh(rd, d, "shape", item),
        render_model=_read_mesh(rd, d, "render", item),
        sensors=tuple(sensors),
    )


def parse_bot(data: Mapping, *, path: str | os.PathLike | None = None) -> BotPrefab:
    """Build a :class:`BotPrefab` from the decoded JSON object of a ``.superdex_bot`` (``path`` names it in
    errors and is where relative mesh paths resolve). Raises the errors :func:`load_bot` lists."""
    rd = _Reader(path)
    d = rd.obj(data, "top level")
    for key in ("joints", "links"):
        if not isinstance(d.get(key), list):
            rd.fail(f"{key} is {type(d.get(key)).__name__}; expected an array", key)
    joints = [_read_joint(rd, j, i) for i, j in enumerate(d["joints"])]
    links = [_read_link(rd, lk, i) for i, lk in enumerate(d["links"])]
    pose = d.get("defaultPose") or []
    if not isinstance(pose, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in pose):
        rd.fail(f"defaultPose is {pose!r}; expected an array of numbers", "defaultPose")
    overrides = []
    for k, co in enumerate(d.get("contactOverrides") or []):
        co = rd.obj(co, f"contactOverrides[{k}]")
        enable = co.get("enable")
        if not isinstance(enable, bool):
            rd.fail(f"enable is {enable!r}; expected true or false", f"contactOverrides[{k}]")
        overrides.append(
            BotContactOverride(
                rd.string(co, "linkA", None, f"contactOverrides[{k}]"),
                rd.string(co, "linkB", None, f"contactOverrides[{k}]"),
                enable,
            )
        )
    cycles = []
    for k, c in enumerate(d.get("cycles") or []):
        c = rd.obj(c, f"cycles[{k}]")
        idx = [c.get("parentLink"), c.get("childLink")]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in idx):
            rd.fail(f"parentLink/childLink are {idx}; expected link indices", f"cycles[{k}]")
        cycles.append(
            BotCycleJoint(
                idx[0],
                idx[1],
                rd.transform(c, "jointFromChildLink", f"cycles[{k}]"),
                rd.number(c, "stiffness", 50000.0, f"cycles[{k}]"),
            )
        )
    rd.unknown(
        d, {"name", "joints", "links", "worldFromRoot", "defaultPose", "contactOverrides", "cycles"}, "top level"
    )
    default_name = Path(path).name.split(".")[0] if path is not None else "bot"
    return BotPrefab(
        name=rd.string(d, "name", default_name, "name") or default_name,
        joints=tuple(joints),
        links=tuple(links),
        world_from_root=rd.transform(d, "worldFromRoot", "top level"),
        default_pose=tuple(float(v) for v in pose),
        contact_overrides=tuple(overrides),
        cycles=tuple(cycles),
        source=None if path is None else os.fspath(path),
        notes=tuple(rd.notes),
    )


def load_bot(
    path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    max_unpacked_bytes: int | None = None,
    max_members: int | None = None,
) -> BotPrefab:
    """Read a ``.superdex_bot`` (JSON) or a ``.superdex_bot_archive`` (a zip of one bot and its assets).

    An archive is extracted (safely, see :func:`kangengine.asset.extract_bot_archive`) into
    ``cache_dir/<sha256 of the archive>`` and the bot inside it is loaded from there, so its relative mesh paths
    resolve inside the cache.

    Args:
        path: the file.
        cache_dir: archives only: the cache root (default: ``$XDG_CACHE_HOME/kangengine/bots`` or
            ``~/.cache/kangengine/bots``).
        max_unpacked_bytes, max_members: archives only: caps (defaults in :func:`extract_bot_archive`).
    Returns:
        :class:`BotPrefab` with ``source`` set to the bot file.
    Raises:
        FileMissingError; BotFormatError (bad JSON, a wrong type, a broken rule), MassPropertiesError,
        TopologyError (counts, order), DuplicateNameError (names); ArchiveError for unsafe archives.
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError(
            f"no such bot file; expected an existing {BOT_SUFFIX} or {BOT_ARCHIVE_SUFFIX}", path=path
        )
    if path.name.lower().endswith(BOT_ARCHIVE_SUFFIX):
        from .bot_archive import extract_bot_archive

        kw = {k: v for k, v in (("max_unpacked_bytes", max_unpacked_bytes), ("max_members", max_members)) if v}
        path = extract_bot_archive(path, cache_dir=cache_dir, **kw)
    try:
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise BotFormatError(f"not UTF-8 text ({exc}); expected a JSON file", path=path) from exc
    except ValueError as exc:
        raise BotFormatError(f"not valid JSON: {exc}", path=path) from exc
    return parse_bot(data, path=path)


def _refuse_constant(name):
    raise ValueError(f"{name} is not a finite number")


# -- JSON writing -------------------------------------------------------------------------------------------------
def _transform_json(t: TransformRT) -> dict:
    return {
        "rotation": [float(x) for x in R.quat_wxyz_to_xyzw(np.array(t.rotation_wxyz))],
        "translation": list(t.translation),
    }


def _joint_json(j: BotJointPrefab) -> dict:
    f = j.friction
    out = {
        "name": j.name,
        "type": j.type.value,
        "parentLinkFromJoint": _transform_json(j.parent_link_from_joint),
        "axis": list(j.axis),
        "friction": {
            "viscous": f.viscous,
            "coulomb": f.coulomb,
            "falloffVel": f.falloff_vel,
            "stictionExtra": f.stiction_extra,
            "stribeckVel": f.stribeck_vel,
        },
        "limitStiffness": j.limit_stiffness,
        "limitDamping": j.limit_damping,
        "effortLimit": j.effort_limit,
    }
    for key, v in (("inertia", j.inertia), ("minLimit", j.min_limit), ("maxLimit", j.max_limit)):
        if v is not None:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def _mesh_json(m: BotMeshRef | None, kind: str) -> dict:
    if m is None:
        return {}
    file_key, _alias, scale, rot, trans = _MESH_KEYS[kind]
    return {
        file_key: m.file,
        scale: list(m.scale),
        rot: [float(x) for x in R.quat_wxyz_to_xyzw(np.array(m.rotation_wxyz))],
        trans: list(m.translation),
    }


def _link_json(lk: BotLinkPrefab) -> dict:
    mp = lk.mass_properties
    out = {
        "name": lk.name,
        "parentLink": lk.parent_link,
        "parentJointFromLink": _transform_json(lk.parent_joint_from_link),
        "layer": lk.layer,
        "colliderType": lk.collider_type,
        "contact": dict(lk.contact),
        "hasGravity": lk.has_gravity,
        "sensors": [{"type": s.type, "name": s.name, **dict(s.params)} for s in lk.sensors],
    }
    for key, v in (
        ("density", mp.density),
        ("mass", mp.mass),
        ("centerOfMass", mp.center_of_mass),
        ("momentOfInertia", mp.moment_of_inertia),
    ):
        if v is not None:
            out[key] = list(v) if isinstance(v, tuple) else v
    out.update(_mesh_json(lk.shape, "shape"))
    out.update(_mesh_json(lk.render_model, "render"))
    return out


def bot_to_json(bot: BotPrefab) -> dict:
    """The JSON object :func:`save_bot` writes (quaternions XYZW, keys as in the module docstring)."""
    return {
        "name": bot.name,
        "joints": [_joint_json(j) for j in bot.joints],
        "links": [_link_json(lk) for lk in bot.links],
        "worldFromRoot": _transform_json(bot.world_from_root),
        "defaultPose": list(bot.default_pose),
        "contactOverrides": [{"linkA": c.link_a, "linkB": c.link_b, "enable": c.enable} for c in bot.contact_overrides],
        "cycles": [
            {
                "parentLink": c.parent_link,
                "childLink": c.child_link,
                "jointFromChildLink": _transform_json(c.joint_from_child_link),
                "stiffness": c.stiffness,
            }
            for c in bot.cycles
        ],
    }


def save_bot(path: str | os.PathLike, bot: BotPrefab) -> Path:
    """Write ``bot`` as a ``.superdex_bot`` JSON file, atomically (temp file, fsync, rename).

    Mesh paths are written as stored; relative ones resolve against the new file's folder. Floats are written
    with ``repr`` precision, so :func:`load_bot` gives back an equal :class:`BotPrefab`.

    Raises:
        BotFormatError: ``path`` does not end in ``.superdex_bot``.
    """
    path = Path(path)
    if not path.name.endswith(BOT_SUFFIX):
        raise BotFormatError(f"a bot file name ends in {BOT_SUFFIX}", path=path)
    text = json.dumps(bot_to_json(bot), indent=2, sort_keys=True, allow_nan=False) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))

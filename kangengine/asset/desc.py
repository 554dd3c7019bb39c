"""`ArticulationDesc`: the loader-independent description of an articulated robot or character.

Frames and units (DESIGN.md §3): SI units (m, rad, kg), right-handed, quaternions WXYZ. Each body's
rest transform ``parent_from_body`` (``BodyDesc.pos``, ``BodyDesc.quat_wxyz``) places the body frame in
its parent body's frame (the world for the root). Joint anchors and axes are in the frame of the body
they move, as in MuJoCo (``jnt_pos``, ``jnt_axis``).

Joint values mean what MuJoCo's ``qpos`` means: a hinge or slide sits at its modelled pose when its value
equals ``JointDesc.ref``.

A description is built by a loader and never edited in place; use :func:`dataclasses.replace` to derive
a new one.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import DuplicateNameError, TopologyError, UnknownNameError

__all__ = [
    "JointType",
    "GeomType",
    "BodyDesc",
    "JointDesc",
    "GeomDesc",
    "MimicDesc",
    "TendonDesc",
    "SpatialTendonDesc",
    "CycleJointDesc",
    "ArticulationDesc",
]


class JointType(enum.Enum):
    """Joint types. ``q``/``qd`` sizes: FREE 7/6, BALL 4/3, HINGE 1/1, SLIDE 1/1, FIXED 0/0."""

    FREE = "free"
    BALL = "ball"
    HINGE = "hinge"
    SLIDE = "slide"
    FIXED = "fixed"

    @property
    def nq(self) -> int:
        return _NQ[self]

    @property
    def nv(self) -> int:
        return _NV[self]


_NQ = {JointType.FREE: 7, JointType.BALL: 4, JointType.HINGE: 1, JointType.SLIDE: 1, JointType.FIXED: 0}
_NV = {JointType.FREE: 6, JointType.BALL: 3, JointType.HINGE: 1, JointType.SLIDE: 1, JointType.FIXED: 0}


class GeomType(enum.Enum):
    """Collision geometry primitives. ``size`` follows MuJoCo: sphere ``(r,)``, capsule and cylinder
    ``(radius, half_length)`` along the geom's z axis, box half extents ``(x, y, z)``, ellipsoid radii,
    plane ``(half_x, half_y, grid)`` (normal along the geom's z axis); meshes are kept by reference."""

    PLANE = "plane"
    SPHERE = "sphere"
    CAPSULE = "capsule"
    ELLIPSOID = "ellipsoid"
    CYLINDER = "cylinder"
    BOX = "box"
    MESH = "mesh"


def _vec(x, n: int) -> np.ndarray:
    a = np.array(x, dtype=np.float64).reshape(n)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class BodyDesc:
    """One rigid body (link).

    Attributes:
        name: unique, without ``/``.
        parent: index of the parent body in ``ArticulationDesc.bodies``; -1 for the root (child of world).
        pos: ``[3] float64``, m: translation of ``parent_from_body``.
        quat_wxyz: ``[4] float64``: rotation of ``parent_from_body``.
        mass: kg.
        com: ``[3] float64``, m: centre of mass in the body frame.
        inertia: ``[3, 3] float64``, kg m^2: inertia tensor about the COM, in body-frame axes.
        joints: indices into ``ArticulationDesc.joints`` of the joints that move this body, in the order
            they apply (MJCF order; first joint nearest the parent).
    """

    name: str
    parent: int
    pos: np.ndarray
    quat_wxyz: np.ndarray
    mass: float = 0.0
    com: np.ndarray = field(default_factory=lambda: _vec((0, 0, 0), 3))
    inertia: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    joints: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "pos", _vec(self.pos, 3))
        object.__setattr__(self, "quat_wxyz", _vec(self.quat_wxyz, 4))
        object.__setattr__(self, "com", _vec(self.com, 3))
        inertia = np.array(self.inertia, dtype=np.float64).reshape(3, 3)
        inertia.setflags(write=False)
        object.__setattr__(self, "inertia", inertia)
        object.__setattr__(self, "joints", tuple(int(j) for j in self.joints))


@dataclass(frozen=True, eq=False)
class JointDesc:
    """One joint.

    Attributes:
        name: unique, without ``/``.
        type: :class:`JointType`.
        body: index of the body this joint moves.
        axis: ``[3] float64`` unit axis in the body frame (hinge, slide); ``(0, 0, 1)`` otherwise.
        anchor: ``[3] float64``, m: the joint position in the body frame (MuJoCo ``jnt_pos``).
        range: ``(lower, upper)`` in rad or m when limited, else ``None``. For a ball joint MuJoCo's
            range is ``(0, max_angle)``.
        ref: the joint value at the modelled pose (MuJoCo ``ref``; hinge and slide only).
        armature: joint inertia, kg m^2 or kg.
        damping: viscous joint damping, N m s/rad or N s/m.
        frictionloss: dry (Coulomb) joint friction, N m or N.
        stiffness, spring_ref: passive joint spring and its rest value.
        effort_limit: largest drive torque/force magnitude (from the URDF limit or the MJCF actuator
            gear and force/control ranges), ``None`` when unknown.
        velocity_limit: rad/s or m/s, ``None`` when unknown.
    """

    name: str
    type: JointType
    body: int
    axis: np.ndarray = field(default_factory=lambda: _vec((0, 0, 1), 3))
    anchor: np.ndarray = field(default_factory=lambda: _vec((0, 0, 0), 3))
    range: tuple[float, float] | None = None
    ref: float = 0.0
    armature: float = 0.0
    damping: float = 0.0
    frictionloss: float = 0.0
    stiffness: float = 0.0
    spring_ref: float = 0.0
    effort_limit: float | None = None
    velocity_limit: float | None = None

    def __post_init__(self):
        axis = np.array(self.axis, dtype=np.float64).reshape(3)
        norm = np.linalg.norm(axis)
        if norm > 0:
            axis = axis / norm
        object.__setattr__(self, "axis", _vec(axis, 3))
        object.__setattr__(self, "anchor", _vec(self.anchor, 3))
        if self.range is not None:
            object.__setattr__(self, "range", (float(self.range[0]), float(self.range[1])))

    @property
    def limited(self) -> bool:
        return self.range is not None


@dataclass(frozen=True, eq=False)
class GeomDesc:
    """A collision (or visual) geometry attached to a body (``body == -1``: the world).

    ``pos``/``quat_wxyz`` place the geom in its body's frame; ``size`` follows :class:`GeomType`.
    ``contype``/``conaffinity`` are MuJoCo's collision bit masks (a geom with both zero never collides);
    ``friction`` is MuJoCo's (sliding, torsional, rolling). ``mesh`` names the mesh for ``MESH`` geoms and
    ``mesh_file`` the file it came from when known (meshes are kept by reference, never loaded here).
    """

    name: str
    body: int
    type: GeomType
    size: np.ndarray
    pos: np.ndarray
    quat_wxyz: np.ndarray
    contype: int = 1
    conaffinity: int = 1
    friction: np.ndarray = field(default_factory=lambda: _vec((1.0, 0.005, 0.0001), 3))
    mesh: str | None = None
    mesh_file: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "size", _vec(self.size, 3))
        object.__setattr__(self, "pos", _vec(self.pos, 3))
        object.__setattr__(self, "quat_wxyz", _vec(self.quat_wxyz, 4))
        object.__setattr__(self, "friction", _vec(self.friction, 3))

    @property
    def collides(self) -> bool:
        return bool(self.contype or self.conaffinity)


@dataclass(frozen=True)
class MimicDesc:
    """``joint = multiplier * leader + offset`` (URDF ``<mimic>``, MJCF joint equality)."""

    joint: str
    leader: str
    multiplier: float = 1.0
    offset: float = 0.0


@dataclass(frozen=True)
class TendonDesc:
    """A fixed (joint-space) tendon: ``length = sum(coef_i * q_i) + offset`` over ``joints`` (m or rad).

    ``stiffness`` (N/m) and ``damping`` (N s/m) make a spring-damper of tension ``-k (l - l0) - c dl/dt``
    where ``l0`` is the nearest point of ``spring_length`` (a ``(lower, upper)`` dead band, MuJoCo
    ``springlength``; ``None``: the length at ``q = 0``). ``range``: length limits (``None``: unlimited).
    """

    name: str
    joints: tuple[str, ...]
    coefficients: tuple[float, ...]
    stiffness: float = 0.0
    damping: float = 0.0
    range: tuple[float, float] | None = None
    offset: float = 0.0
    spring_length: tuple[float, float] | None = None


@dataclass(frozen=True, eq=False)
class SpatialTendonDesc:
    """A spatial tendon through attachment sites: ``length = sum_k weight_k |p(site_b_k) - p(site_a_k)|``.

    Attributes:
        name: tendon name.
        site_bodies: ``S`` body names, one per attachment site.
        site_positions: ``[S, 3]`` m, each site in its body's frame.
        segments: ``G`` pairs ``(a, b)`` of site indices joined by a straight segment.
        segment_weights: ``G`` weights (1 on a plain path; ``1 / divisor`` after a MuJoCo pulley).
        stiffness, damping, spring_length, range: as :class:`TendonDesc` (``spring_length`` ``None``: the
            length at ``q = 0``).
    """

    name: str
    site_bodies: tuple[str, ...]
    site_positions: np.ndarray
    segments: tuple[tuple[int, int], ...]
    segment_weights: tuple[float, ...]
    stiffness: float = 0.0
    damping: float = 0.0
    range: tuple[float, float] | None = None
    spring_length: tuple[float, float] | None = None


@dataclass(frozen=True, eq=False)
class CycleJointDesc:
    """A loop-closing soft spherical joint: point ``pivot`` (child body frame, m) of ``child`` is held at
    the point ``parent_pivot`` (parent body frame) of ``parent`` with ``stiffness`` (N/m) and ``damping``
    (N s/m, on the relative velocity of the two points)."""

    name: str
    parent: str
    child: str
    pivot: np.ndarray
    parent_pivot: np.ndarray
    stiffness: float = 50000.0
    damping: float = 0.0


@dataclass(frozen=True, eq=False)
class ArticulationDesc:
    """A rooted kinematic tree with inertias, joints and collision geometry.

    Attributes:
        name: model name.
        bodies: parent-first (``bodies[i].parent < i``) in the loader's ``order``.
        joints: sorted by body (in body order), then in their order of application on the body.
        geoms: collision and visual geoms; ``body == -1`` for geoms fixed to the world (a floor).
        mimics, tendons, spatial_tendons, cycles: optional couplings.
        contact_exclusions: pairs of body names that never collide.
        order: ``"DFS"`` (the file's pre-order) or ``"BFS"`` (breadth first).
        source: the file it was loaded from.
        gravity: ``[3]`` m/s^2 in world.
    """

    name: str
    bodies: tuple[BodyDesc, ...]
    joints: tuple[JointDesc, ...]
    geoms: tuple[GeomDesc, ...] = ()
    mimics: tuple[MimicDesc, ...] = ()
    tendons: tuple[TendonDesc, ...] = ()
    spatial_tendons: tuple[SpatialTendonDesc, ...] = ()
    cycles: tuple[CycleJointDesc, ...] = ()
    contact_exclusions: tuple[tuple[str, str], ...] = ()
    order: str = "DFS"
    source: str | None = None
    gravity: np.ndarray = field(default_factory=lambda: _vec((0, 0, -9.81), 3))

    def __post_init__(self):
        object.__setattr__(self, "bodies", tuple(self.bodies))
        object.__setattr__(self, "joints", tuple(self.joints))
        object.__setattr__(self, "geoms", tuple(self.geoms))
        object.__setattr__(self, "gravity", _vec(self.gravity, 3))
        self._check()

    # -- checks ---------------------------------------------------------------------------------
    def _check(self) -> None:
        where = {"path": self.source}
        seen: dict[str, int] = {}
        for i, b in enumerate(self.bodies):
            if "/" in b.name:
                raise DuplicateNameError(f"body name {b.name!r} holds '/', which is reserved for 'actor/link'", **where)
            if b.name in seen:
                raise DuplicateNameError(f"body name {b.name!r} is used twice (bodies {seen[b.name]} and {i})", **where)
            seen[b.name] = i
            if not -1 <= b.parent < i:
                raise TopologyError(
                    f"body {b.name!r} (index {i}) has parent index {b.parent}; expected a parent listed "
                    "before it (parent-first order) or -1 for the root",
                    **where,
                )
        roots = [b.name for b in self.bodies if b.parent == -1]
        if len(self.bodies) == 0:
            raise TopologyError("the articulation has no bodies; expected at least one", **where)
        if len(roots) != 1:
            raise TopologyError(
                f"expected exactly one root body (child of the world), found {len(roots)}: {roots}", **where
            )
        jseen: dict[str, int] = {}
        for i, j in enumerate(self.joints):
            if "/" in j.name:
                raise DuplicateNameError(f"joint name {j.name!r} holds '/', which is reserved", **where)
            if j.name in jseen:
                raise DuplicateNameError(f"joint name {j.name!r} is used twice", **where)
            jseen[j.name] = i
            if not 0 <= j.body < len(self.bodies) or i not in self.bodies[j.body].joints:
                raise TopologyError(f"joint {j.name!r} is not listed by the body it moves", **where)
            if j.type is JointType.FREE and (self.bodies[j.body].parent != -1 or self.bodies[j.body].joints[0] != i):
                raise TopologyError(f"free joint {j.name!r} must be the first joint of the root body", **where)

    # -- queries --------------------------------------------------------------------------------
    @property
    def body_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bodies)

    @property
    def joint_names(self) -> tuple[str, ...]:
        return tuple(j.name for j in self.joints)

    @property
    def parent_indices(self) -> np.ndarray:
        """``[bodies] int64``: parent body index, -1 for the root."""
        return np.array([b.parent for b in self.bodies], dtype=np.int64)

    @property
    def total_mass(self) -> float:
        return float(sum(b.mass for b in self.bodies))

    def body_index(self, name: str) -> int:
        """Index of body ``name``; :class:`UnknownNameError` listing the bodies otherwise."""
        for i, b in enumerate(self.bodies):
            if b.name == name:
                return i
        raise UnknownNameError(f"no body {name!r}; bodies are: {', '.join(self.body_names)}", path=self.source)

    def joint_index(self, name: str) -> int:
        """Index of joint ``name``; :class:`UnknownNameError` listing the joints otherwise."""
        for i, j in enumerate(self.joints):
            if j.name == name:
                return i
        raise UnknownNameError(f"no joint {name!r}; joints are: {', '.join(self.joint_names)}", path=self.source)

    def children(self, body: int) -> list[int]:
        """Indices of the direct children of ``body`` (-1: the root)."""
        return [i for i, b in enumerate(self.bodies) if b.parent == body]

    def summary(self) -> dict:
        """A JSON-friendly summary: counts of bodies, joints by type, geoms, total mass."""
        counts: dict[str, int] = {}
        for j in self.joints:
            counts[j.type.value] = counts.get(j.type.value, 0) + 1
        return {
            "name": self.name,
            "source": self.source,
            "order": self.order,
            "bodies": len(self.bodies),
            "joints": counts,
            "geoms": len(self.geoms),
            "collision_geoms": sum(g.collides for g in self.geoms),
            "total_mass_kg": round(self.total_mass, 6),
            "mimics": len(self.mimics),
            "tendons": len(self.tendons),
            "spatial_tendons": len(self.spatial_tendons),
            "cycles": len(self.cycles),
        }


def reorder_bodies(desc: ArticulationDesc, order: str) -> ArticulationDesc:
    """Return ``desc`` with bodies in ``order`` ("DFS": pre-order keeping sibling order, "BFS":
    breadth-first keeping sibling order). Joints follow their bodies; geoms keep their bodies."""
    from .topology import body_order

    perm = body_order([b.parent for b in desc.bodies], order, path=desc.source)
    if list(perm) == list(range(len(desc.bodies))):
        return _replace(desc, order=order)
    new_index = {old: new for new, old in enumerate(perm)}
    new_joints: list[JointDesc] = []
    new_bodies: list[BodyDesc] = []
    for old in perm:
        b = desc.bodies[old]
        joint_ids = []
        for j in b.joints:
            jd = desc.joints[j]
            joint_ids.append(len(new_joints))
            new_joints.append(_replace(jd, body=new_index[old]))
        new_bodies.append(_replace(b, parent=-1 if b.parent < 0 else new_index[b.parent], joints=joint_ids))
    geoms = [g if g.body < 0 else _replace(g, body=new_index[g.body]) for g in desc.geoms]
    return _replace(desc, bodies=tuple(new_bodies), joints=tuple(new_joints), geoms=tuple(geoms), order=order)


def _replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def _names(items: Sequence) -> list[str]:
    return [x.name for x in items]

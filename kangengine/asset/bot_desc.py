"""Conversions between :class:`~kangengine.asset.BotPrefab` and :class:`~kangengine.asset.ArticulationDesc`.

**Bot -> desc** (:func:`bot_to_desc`): one body per link, in link order (then ``order``). Link ``i``'s rest
transform is ``parentLinkFromJoint * parentJointFromLink`` (times ``worldFromRoot`` for the root); its joint
moves about the joint frame's origin, which in the body frame is ``anchor = -t`` (``t`` the translation of
``parentJointFromLink``, whose rotation is identity), with the axis unchanged. Revolute -> HINGE, Prismatic ->
SLIDE, Spherical -> BALL, Free -> FREE (root only), Hard -> FIXED (a Hard world joint: a fixed base). Joint
values keep their meaning (``ref = 0``); Spherical per-DOF limits are not carried (a ball joint's range is a
cone). Friction ``viscous`` -> ``damping``, ``coulomb`` -> ``frictionloss``, joint ``inertia`` -> ``armature``,
``effortLimit`` -> ``effort_limit`` (negative: ``None``). The collision mesh becomes a MESH geom. Contact
overrides that disable contact become ``contact_exclusions``. A cycle's pivot (child link frame) is matched to
the point of the parent link where it lies in the bot's zero pose. Mass properties follow the schema's five
combinations; whatever is not explicit is integrated from the collision mesh (:mod:`kangengine.asset.mesh_inertia`:
``.stl``, ``.obj``, ``.off``, ``.ply``; other formats are refused with :class:`MassPropertiesError`): mass and COM and
inertia from the mesh at the density (default 1000 kg/m^3), or scaled to the given mass; with explicit COM and
inertia and a density, only the mass (density times volume).

**Desc -> bot** (:func:`bot_from_desc`): a body with ``k`` joints becomes ``k`` links (``k - 1`` shapeless
frames named ``{joint}_frame`` and the body last), a body without joints one link with a Hard joint (the URDF's
fixed joint keeps its name). A hinge's or slide's ``ref`` is baked into ``parentLinkFromJoint``, so a bot value
is the description's value minus ``ref``. The root body's rest transform becomes ``worldFromRoot``. A joint
that has a body's name (MJCF allows it; the schema does not) is renamed ``{name}_joint``. What the
schema cannot hold is dropped and said in ``BotPrefab.notes``: velocity limits, passive joint springs, mimics,
tendons, ball-joint ranges, primitive collision geoms and all but the first mesh per body.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from .. import rotations as R
from .bot import (
    BotContactOverride,
    BotCycleJoint,
    BotJointFriction,
    BotJointPrefab,
    BotJointType,
    BotLinkPrefab,
    BotMassProperties,
    BotMeshRef,
    BotPrefab,
    MassPropertiesError,
    TransformRT,
)
from .desc import ArticulationDesc, BodyDesc, CycleJointDesc, GeomDesc, GeomType, JointDesc, JointType

__all__ = [
    "bot_to_desc",
    "bot_from_desc",
    "bot_from_urdf",
    "bot_link_transforms",
    "bot_link_mass_properties",
    "bot_pose_joint_values",
]

_TO_DESC = {
    BotJointType.REVOLUTE: JointType.HINGE,
    BotJointType.PRISMATIC: JointType.SLIDE,
    BotJointType.SPHERICAL: JointType.BALL,
    BotJointType.FREE: JointType.FREE,
    BotJointType.HARD: JointType.FIXED,
}


def _rest(bot: BotPrefab, i: int) -> TransformRT:
    lk, jt = bot.links[i], bot.joints[i]
    t = jt.parent_link_from_joint.compose(lk.parent_joint_from_link)
    return bot.world_from_root.compose(t) if i == 0 else t


def bot_link_transforms(bot: BotPrefab, pose=None) -> tuple[np.ndarray, np.ndarray]:
    """World transforms of every link at a pose in the ``defaultPose`` layout (Free joints at identity).

    Args:
        pose: ``[pose_dof_count]`` rad / m, or ``None`` for the zero pose.
    Returns:
        ``(link_positions [links, 3] float64 m, link_rotations_wxyz [links, 4] float64)``: ``world_from_link``.
    """
    pose = np.zeros(bot.pose_dof_count) if pose is None else np.asarray(pose, dtype=np.float64)
    pos = np.zeros((len(bot.links), 3))
    rot = np.zeros((len(bot.links), 4))
    for i, (jt, off) in enumerate(zip(bot.joints, bot.pose_dof_offsets)):
        motion = TransformRT()
        if jt.type is BotJointType.REVOLUTE:
            motion = TransformRT(rotation_wxyz=R.quat_from_axis_angle(np.array(jt.axis), np.array(pose[off])))
        elif jt.type is BotJointType.PRISMATIC:
            motion = TransformRT(translation=np.array(jt.axis) * pose[off])
        elif jt.type is BotJointType.SPHERICAL:
            motion = TransformRT(rotation_wxyz=R.quat_from_rotvec(pose[off : off + 3]))
        local = jt.parent_link_from_joint.compose(motion).compose(bot.links[i].parent_joint_from_link)
        p = bot.links[i].parent_link
        parent = bot.world_from_root if p < 0 else TransformRT(pos[p], rot[p])
        world = parent.compose(local)
        pos[i], rot[i] = world.translation, world.rotation_wxyz
    return pos, rot


def bot_pose_joint_values(bot: BotPrefab, pose=None) -> dict[str, np.ndarray]:
    """Joint values of :func:`bot_to_desc`'s joints at a pose in the ``defaultPose`` layout.

    Args:
        pose: ``[pose_dof_count]`` rad / m; ``None``: ``bot.default_pose`` (zeros when empty).
    Returns:
        joint name -> ``[1] float64`` (Revolute/Prismatic: the value) or ``[4] float64`` (Spherical: the
        rotation vector as a WXYZ quaternion, a BALL joint's ``q``). Free and Hard joints are absent.
    """
    from ..errors import ShapeError

    pose = bot.default_pose_full if pose is None else np.asarray(pose, dtype=np.float64).reshape(-1)
    if pose.shape[0] != bot.pose_dof_count:
        raise ShapeError(f"pose has {pose.shape[0]} values; the bot's DOF layout has {bot.pose_dof_count}")
    out = {}
    for jt, off in zip(bot.joints, bot.pose_dof_offsets):
        if jt.type.has_axis:
            out[jt.name] = pose[off : off + 1].copy()
        elif jt.type is BotJointType.SPHERICAL:
            out[jt.name] = R.quat_from_rotvec(pose[off : off + 3])
    return out


def _mesh_path(bot: BotPrefab, file: str) -> Path:
    p = Path(file)
    if not p.is_absolute() and bot.source is not None:
        p = Path(bot.source).parent / p
    return p


def bot_link_mass_properties(bot: BotPrefab, i: int) -> tuple[float, np.ndarray, np.ndarray]:
    """``(mass kg, com [3] m in the link frame, inertia [3, 3] kg m^2 about the COM)`` of link ``i``, taking
    what is explicit and integrating the rest from its collision mesh (see the module docstring)."""
    from .mesh_inertia import load_triangle_mesh, mesh_mass_properties

    lk = bot.links[i]
    mp = lk.mass_properties
    explicit = mp.center_of_mass is not None
    if lk.shape is None:
        if mp.mass is None:
            return 0.0, np.zeros(3), np.zeros((3, 3))
        return float(mp.mass), np.array(mp.center_of_mass), mp.inertia_matrix
    if explicit and mp.mass is not None:
        return float(mp.mass), np.array(mp.center_of_mass), mp.inertia_matrix
    path = _mesh_path(bot, lk.shape.file)
    item = f"link {lk.name!r} (links[{i}])"
    try:
        tris = load_triangle_mesh(path)
        m = mesh_mass_properties(
            tris,
            density=mp.density,
            mass=mp.mass,
            scale=lk.shape.scale,
            rotation_wxyz=lk.shape.rotation_wxyz,
            translation=lk.shape.translation,
            path=path,
        )
    except Exception as exc:
        from ..errors import KangEngineError

        if not isinstance(exc, KangEngineError):
            raise
        raise MassPropertiesError(
            f"gives {mp.combination}, so its mass properties come from its shapeFile {lk.shape.file!r}, which "
            f"cannot be integrated: {exc}",
            path=bot.source,
            item=item,
        ) from exc
    if explicit:  # density + centerOfMass + momentOfInertia: only the mass comes from the geometry
        return m.mass, np.array(mp.center_of_mass), mp.inertia_matrix
    return m.mass, m.com, m.inertia


def bot_to_desc(bot: BotPrefab, *, order: str = "DFS") -> ArticulationDesc:
    """The :class:`ArticulationDesc` of a bot (see the module docstring), bodies in ``order`` ("DFS" or "BFS",
    sibling order kept), so the bot gets a layout, FK, mapping, a motion library and simulation like any model.

    Raises:
        TopologyError: a Free joint below the root.
        MassPropertiesError: geometry-derived mass properties whose mesh cannot be read or integrated.
    """
    from ..errors import TopologyError
    from .desc import reorder_bodies

    bodies, joints, geoms = [], [], []
    for i, (lk, jt) in enumerate(zip(bot.links, bot.joints)):
        rest = _rest(bot, i)
        mass, com, inertia = bot_link_mass_properties(bot, i)
        if jt.type is BotJointType.FREE and i != 0:
            raise TopologyError(
                "is a Free joint below the root; only the world joint (index 0) may be Free",
                path=bot.source,
                item=f"joint {jt.name!r} (joints[{i}])",
            )
        ids = (len(joints),)
        joints.append(_joint_desc(jt, i, lk))
        bodies.append(
            BodyDesc(
                name=lk.name,
                parent=lk.parent_link,
                pos=rest.translation,
                quat_wxyz=rest.rotation_wxyz,
                mass=mass,
                com=com,
                inertia=inertia,
                joints=ids,
            )
        )
        if lk.shape is not None:
            s = lk.shape
            geoms.append(
                GeomDesc(
                    name=f"{lk.name}_shape",
                    body=i,
                    type=GeomType.MESH,
                    size=s.scale,
                    pos=s.translation,
                    quat_wxyz=s.rotation_wxyz,
                    mesh=Path(s.file).name.split(".")[0],
                    mesh_file=s.file,
                )
            )
    pos, rot = bot_link_transforms(bot)
    cycles = []
    for k, c in enumerate(bot.cycles):
        pivot = np.array(c.joint_from_child_link.translation)
        world = TransformRT(pos[c.child_link], rot[c.child_link]).apply(pivot)
        parent_pivot = TransformRT(pos[c.parent_link], rot[c.parent_link]).inverse().apply(world)
        cycles.append(
            CycleJointDesc(
                name=f"cycle_{k}",
                parent=bot.links[c.parent_link].name,
                child=bot.links[c.child_link].name,
                pivot=pivot,
                parent_pivot=parent_pivot,
                stiffness=c.stiffness,
            )
        )
    exclusions = tuple((c.link_a, c.link_b) for c in bot.contact_overrides if not c.enable)
    desc = ArticulationDesc(
        name=bot.name,
        bodies=tuple(bodies),
        joints=tuple(joints),
        geoms=tuple(geoms),
        cycles=tuple(cycles),
        contact_exclusions=exclusions,
        order="DFS",
        source=bot.source,
    )
    return reorder_bodies(desc, order)


def _joint_desc(jt: BotJointPrefab, i: int, lk: BotLinkPrefab) -> JointDesc:
    jtype = _TO_DESC[jt.type]
    scalar = jt.type.has_axis
    return JointDesc(
        name=jt.name,
        type=jtype,
        body=i,
        axis=jt.axis if scalar else (0.0, 0.0, 1.0),
        anchor=-np.array(lk.parent_joint_from_link.translation) if jtype is not JointType.FREE else (0.0, 0.0, 0.0),
        range=jt.scalar_limits,
        armature=jt.inertia or 0.0,
        damping=jt.friction.viscous,
        frictionloss=jt.friction.coulomb,
        effort_limit=None if jt.effort_limit < 0 else jt.effort_limit,
    )


# -- desc -> bot ----------------------------------------------------------------------------------------------
class _Names:
    def __init__(self, desc: ArticulationDesc):
        self.used = set(desc.body_names) | set(desc.joint_names)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name


def _mass_and_shape(desc: ArticulationDesc, b: int, notes: list[str]):
    body = desc.bodies[b]
    meshes = [g for g in desc.geoms if g.body == b and g.type is GeomType.MESH and g.mesh_file]
    others = [g for g in desc.geoms if g.body == b and g not in meshes[:1]]
    shape = None
    if meshes:
        g = meshes[0]
        shape = BotMeshRef(file=g.mesh_file, scale=g.size, rotation_wxyz=g.quat_wxyz, translation=g.pos)
    if others:
        notes.append(
            f"body {body.name!r}: a bot link holds one collision mesh; dropped geoms "
            + ", ".join(f"{g.name} ({g.type.value})" for g in others)
        )
    if body.mass > 0:
        i = body.inertia
        mp = BotMassProperties(
            mass=body.mass,
            center_of_mass=body.com,
            moment_of_inertia=(i[0, 0], i[0, 1], i[0, 2], i[1, 1], i[1, 2], i[2, 2]),
        )
    else:
        mp = BotMassProperties()
        if shape is not None:
            notes.append(
                f"body {body.name!r}: massless with a collision mesh, which a bot cannot hold (a link with "
                "geometry has positive mass); the mesh was dropped"
            )
            shape = None
    return mp, shape


def _bot_joint(jd: JointDesc, parent_from_joint: TransformRT) -> tuple[BotJointPrefab, TransformRT]:
    """The bot joint of a desc joint and the link's ``parentJointFromLink``."""
    anchor = np.array(jd.anchor)
    frame = parent_from_joint.compose(TransformRT(translation=anchor))
    jtype = {v: k for k, v in _TO_DESC.items()}[jd.type]
    lo_hi = None
    if jd.type is JointType.HINGE:
        frame = frame.compose(TransformRT(rotation_wxyz=R.quat_from_axis_angle(np.array(jd.axis), np.array(-jd.ref))))
    elif jd.type is JointType.SLIDE:
        frame = frame.compose(TransformRT(translation=-jd.ref * np.array(jd.axis)))
    if jd.type in (JointType.HINGE, JointType.SLIDE) and jd.range is not None:
        lo_hi = (jd.range[0] - jd.ref, jd.range[1] - jd.ref)
    axis = np.array(jd.axis)
    joint = BotJointPrefab(
        name=jd.name,
        type=jtype,
        parent_link_from_joint=frame,
        axis=tuple(axis) if jtype.has_axis else (1.0, 0.0, 0.0),
        friction=BotJointFriction(viscous=jd.damping, coulomb=jd.frictionloss),
        inertia=jd.armature if jd.armature else None,
        min_limit=None if lo_hi is None else tuple(lo_hi[0] * axis),
        max_limit=None if lo_hi is None else tuple(lo_hi[1] * axis),
        effort_limit=-1.0 if jd.effort_limit is None else float(jd.effort_limit),
    )
    return joint, TransformRT(translation=-anchor)


def bot_from_desc(desc: ArticulationDesc, *, world_joint: str | None = None, name: str | None = None) -> BotPrefab:
    """The :class:`BotPrefab` of a description (see the module docstring).

    Args:
        desc: any loader's description.
        world_joint: for a root body without joints: ``"Free"`` or ``"Hard"`` (default ``"Hard"``); a root
            with a FREE joint keeps it (``"Hard"`` turns it into a weld). A world joint is injected at index 0,
            named ``world_joint`` (made unique).
        name: bot name (default ``desc.name``).
    """
    names, notes = _Names(desc), []
    body_names = set(desc.body_names)
    joints: list[BotJointPrefab] = []
    links: list[BotLinkPrefab] = []
    last_link: dict[int, int] = {}
    for b, body in enumerate(desc.bodies):
        parent_link = -1 if body.parent < 0 else last_link[body.parent]
        rest = TransformRT(body.pos, body.quat_wxyz)
        root = body.parent < 0
        chain = [desc.joints[j] for j in body.joints]
        if root and chain and chain[0].type is JointType.FREE and world_joint == "Hard":
            chain = [JointDesc(name=chain[0].name, type=JointType.FIXED, body=b)] + chain[1:]
        if root and not chain:
            wj = BotJointType.FREE if world_joint == "Free" else BotJointType.HARD
            chain = [JointDesc(name=names.fresh("world_joint"), type=_TO_DESC.get(wj, JointType.FIXED), body=b)]
        if not chain:
            chain = [JointDesc(name=names.fresh(f"{body.name}_joint"), type=JointType.FIXED, body=b)]
        from_parent = TransformRT() if root else rest
        for k, jd in enumerate(chain):
            last = k == len(chain) - 1
            if jd.name in body_names:  # a bot's names are unique across joints and links
                renamed = names.fresh(f"{jd.name}_joint")
                notes.append(f"joint {jd.name!r} renamed {renamed!r}: a body has its name")
                jd = dataclasses.replace(jd, name=renamed)
            joint, joint_from_link = _bot_joint(jd, from_parent)
            mp, shape = _mass_and_shape(desc, b, notes) if last else (BotMassProperties(), None)
            links.append(
                BotLinkPrefab(
                    name=body.name if last else names.fresh(f"{jd.name}_frame"),
                    parent_link=parent_link,
                    parent_joint_from_link=joint_from_link,
                    mass_properties=mp,
                    shape=shape,
                )
            )
            joints.append(joint)
            parent_link, from_parent = len(links) - 1, TransformRT()
        last_link[b] = len(links) - 1
    _conversion_notes(desc, notes)
    index = {lk.name: i for i, lk in enumerate(links)}
    cycles = tuple(
        BotCycleJoint(index[c.parent], index[c.child], TransformRT(translation=c.pivot), c.stiffness)
        for c in desc.cycles
    )
    root = desc.bodies[0]
    bot = BotPrefab(
        name=name or desc.name,
        joints=tuple(joints),
        links=tuple(links),
        world_from_root=TransformRT(root.pos, root.quat_wxyz),
        contact_overrides=tuple(BotContactOverride(a, b, False) for a, b in desc.contact_exclusions),
        cycles=cycles,
        source=desc.source,
        notes=tuple(notes),
    )
    moved = _cycle_mismatches(bot, desc)
    return dataclasses.replace(bot, notes=(*notes, *moved)) if moved else bot


def _cycle_mismatches(bot: BotPrefab, desc: ArticulationDesc) -> list[str]:
    """A bot cycle ties its pivot to where it lies in the zero pose; say so where the description's
    ``parent_pivot`` was elsewhere (the loop was not closed in the modelled pose)."""
    if not desc.cycles:
        return []
    pos, rot = bot_link_transforms(bot)
    out = []
    for c, bc in zip(desc.cycles, bot.cycles):
        world = TransformRT(pos[bc.child_link], rot[bc.child_link]).apply(c.pivot)
        implied = TransformRT(pos[bc.parent_link], rot[bc.parent_link]).inverse().apply(world)
        gap = float(np.linalg.norm(implied - np.asarray(c.parent_pivot)))
        if gap > 1e-9:
            out.append(
                f"cycle {c.name!r}: the bot holds the pivot where it lies in the zero pose, {gap:.3g} m from the "
                "description's parent_pivot"
            )
    return out


def _conversion_notes(desc: ArticulationDesc, notes: list[str]) -> None:
    vel = [j.name for j in desc.joints if j.velocity_limit is not None]
    if vel:
        notes.append(f"velocity limits dropped (the bot schema has none): {', '.join(vel)}")
    springs = [j.name for j in desc.joints if j.stiffness]
    if springs:
        notes.append(f"passive joint springs dropped (the bot schema has none): {', '.join(springs)}")
    balls = [j.name for j in desc.joints if j.type is JointType.BALL and j.range is not None]
    if balls:
        notes.append(f"ball-joint cone ranges dropped (bot limits are per DOF): {', '.join(balls)}")
    if desc.mimics:
        notes.append(f"mimic joints dropped (the bot schema has none): {', '.join(m.joint for m in desc.mimics)}")
    if desc.tendons:
        notes.append(f"tendons dropped (the bot schema has none): {', '.join(t.name for t in desc.tendons)}")


def bot_from_urdf(path: str | os.PathLike, *, fixed_base: bool = False, strict: bool = True) -> BotPrefab:
    """A :class:`BotPrefab` from a URDF, as SuperDex's ``load_bot_prefab_from_urdf_file`` does: a Free world
    joint at index 0 (a Hard weld with ``fixed_base=True``). Links keep their URDF inertials and their first
    collision mesh; primitive collision shapes are dropped and listed in ``notes``. Mesh paths stay as the
    URDF writes them (relative to the URDF's folder, which is the bot's ``source`` until it is saved).

    A URDF that welds its base to a ``world`` link keeps that weld (a Hard world joint) either way.

    Raises:
        The errors of :meth:`URDFLoader.load` and of :class:`BotPrefab`'s rules.
    """
    from .urdf import URDFLoader

    desc = URDFLoader.load(path, strict=strict)
    return bot_from_desc(desc, world_joint="Hard" if fixed_base else "Free")

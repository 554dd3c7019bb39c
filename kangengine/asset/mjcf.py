"""MJCF loader built on MuJoCo's own compiler.

MuJoCo (``mujoco.MjSpec`` + ``compile``) resolves includes, defaults and classes, angle units, every
frame orientation form (``quat``, ``euler``, ``axisangle``, ``xyaxes``, ``zaxis``), ``fromto`` geoms and
``inertiafromgeom``; this module only reads the compiled model back into an :class:`ArticulationDesc`.

Generated names (for elements the file leaves unnamed; documented and stable across loads):

* a body: ``body{i}`` where ``i`` is its MuJoCo body id (the file's pre-order, world = 0);
* a joint: ``{body}_joint{k}`` where ``k`` counts the joints of that body from 0 (a bare
  ``<freejoint/>`` on body ``torso`` becomes ``torso_joint0``);
* a geom: ``{body}_geom{k}`` (``world_geom{k}`` for world geoms), ``k`` counting the body's geoms.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from .. import rotations as R
from ..errors import FileMissingError, FormatError, TopologyError
from .desc import (
    ArticulationDesc,
    BodyDesc,
    CycleJointDesc,
    GeomDesc,
    GeomType,
    JointDesc,
    JointType,
    MimicDesc,
    SpatialTendonDesc,
    TendonDesc,
    reorder_bodies,
)
from .topology import check_order

__all__ = ["MJCFLoader"]


class MJCFLoader:
    """Load MJCF files into :class:`ArticulationDesc`.

    Example::

        desc = ke.asset.MJCFLoader.load("humanoid.xml", order="DFS")
    """

    @staticmethod
    def load(path: str | os.PathLike, order: str = "DFS") -> ArticulationDesc:
        """Compile ``path`` with MuJoCo and describe the articulation it holds.

        Args:
            path: an MJCF file (includes are resolved relative to it).
            order: ``"DFS"`` (the file's pre-order, MuJoCo's body order) or ``"BFS"``.
        Returns:
            ArticulationDesc with SI units, WXYZ rest rotations, joints in body order.
        Raises:
            FileMissingError: ``path`` does not exist.
            FormatError: MuJoCo cannot parse or compile the file (its message is kept).
            FormatError: a compiled value is NaN or infinite (positions, orientations, axes, masses,
                inertias, joint and tendon ranges, geom sizes, gravity: the item is named), or a name is not
                valid UTF-8.
            TopologyError: the world has more than one child body (not a single articulation).
            DuplicateNameError: a name holds ``/`` or clashes with a generated name.
        """
        import mujoco

        path = Path(path)
        order = check_order(order, path=path)
        if not path.is_file():
            raise FileMissingError("no such MJCF file; expected an existing .xml file", path=path)
        try:
            spec = mujoco.MjSpec.from_file(str(path))
            model = spec.compile()
        except Exception as exc:  # mujoco raises ValueError with "XML Error" / "Error: ..." text
            raise FormatError(f"MuJoCo could not compile the MJCF: {str(exc).strip()}", path=path) from exc
        mesh_files = {}
        try:
            for mesh in spec.meshes:
                if mesh.name:
                    mesh_files[mesh.name] = mesh.file or None
        except UnicodeDecodeError as exc:
            raise FormatError(f"a mesh name or file name is not valid UTF-8 ({exc})", path=path, item="mesh") from None
        _check_finite(model, path)
        desc = _from_model(model, path, mesh_files)
        return desc if order == "DFS" else reorder_bodies(desc, order)


_JTYPE = {0: JointType.FREE, 1: JointType.BALL, 2: JointType.SLIDE, 3: JointType.HINGE}
_GTYPE = {
    0: GeomType.PLANE,
    2: GeomType.SPHERE,
    3: GeomType.CAPSULE,
    4: GeomType.ELLIPSOID,
    5: GeomType.CYLINDER,
    6: GeomType.BOX,
    7: GeomType.MESH,
}


# (model array, what it holds, the name table of its rows, and whether a non-finite value is allowed
# where MuJoCo itself uses infinity: none here). Checked once after compiling, before anything is read.
_FINITE_FIELDS = (
    ("body_pos", "pos", "body"),
    ("body_quat", "quat", "body"),
    ("body_ipos", "inertial pos", "body"),
    ("body_iquat", "inertial quat", "body"),
    ("body_mass", "mass", "body"),
    ("body_inertia", "inertia", "body"),
    ("jnt_pos", "pos", "jnt"),
    ("jnt_axis", "axis", "jnt"),
    ("jnt_range", "range", "jnt"),
    ("jnt_stiffness", "stiffness", "jnt"),
    ("jnt_actfrcrange", "actuatorfrcrange", "jnt"),
    ("qpos0", "ref", None),
    ("qpos_spring", "springref", None),
    ("dof_armature", "armature", None),
    ("dof_damping", "damping", None),
    ("dof_frictionloss", "frictionloss", None),
    ("geom_size", "size", "geom"),
    ("geom_pos", "pos", "geom"),
    ("geom_quat", "quat", "geom"),
    ("geom_friction", "friction", "geom"),
    ("eq_data", "data", "eq"),
    ("tendon_range", "range", "tendon"),
    ("tendon_stiffness", "stiffness", "tendon"),
    ("tendon_damping", "damping", "tendon"),
    ("wrap_prm", "coef", None),
    ("actuator_gear", "gear", "actuator"),
    ("actuator_forcerange", "forcerange", "actuator"),
    ("actuator_ctrlrange", "ctrlrange", "actuator"),
    ("actuator_gainprm", "gainprm", "actuator"),
)


def _check_finite(m, path: Path) -> None:
    """Refuse NaN and infinity in every compiled value the loader reads (MuJoCo accepts ``nan`` and
    ``inf`` in the XML with only a printed warning)."""
    for field, what, kind in _FINITE_FIELDS:
        arr = getattr(m, field, None)
        if arr is None:
            continue
        arr = np.asarray(arr, dtype=np.float64)
        if arr.size == 0 or np.isfinite(arr).all():
            continue
        row = int(np.argwhere(~np.isfinite(arr.reshape(len(arr), -1)))[0][0])
        if kind is None:
            item = f"{field}[{row}]"
        else:
            item = f"{kind if kind != 'jnt' else 'joint'} {_name_at(m, kind, row, path)!r} {what}"
        raise FormatError(
            f"{what} holds {arr[row].tolist()}; expected finite numbers (NaN and infinity are refused)",
            path=path,
            item=item,
        )
    gravity = np.asarray(m.opt.gravity, dtype=np.float64)
    if not np.isfinite(gravity).all():
        raise FormatError(
            f"gravity {gravity.tolist()}; expected finite numbers (m/s^2)", path=path, item="option gravity"
        )


def _model_name(m, path) -> str:
    if not m.names:
        return path.stem
    raw = bytes(m.names[: m.names.index(b"\0")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(
            f"the model name {raw!r} is not valid UTF-8 ({exc.reason})", path=path, item="mujoco model"
        ) from None


def _name_at(m, kind: str, i: int, path) -> str:
    """Name of row ``i`` of a MuJoCo object table (``"body"``, ``"jnt"``, ``"geom"``...), read from the model's
    name buffer; ``""`` when unnamed. Invalid UTF-8 is a FormatError naming the object."""
    adr = int(getattr(m, f"name_{kind}adr")[i])
    raw = bytes(m.names[adr : m.names.index(b"\0", adr)])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(
            f"the name {raw!r} is not valid UTF-8 ({exc.reason} at byte {exc.start}); expected UTF-8 text",
            path=path,
            item=f"{kind if kind != 'jnt' else 'joint'} {i}",
        ) from None


def _from_model(m, path: Path, mesh_files: dict) -> ArticulationDesc:
    import mujoco

    src = str(path)
    nb = m.nbody - 1
    body_names = []
    for i in range(1, m.nbody):
        body_names.append(_name_at(m, "body", i, path) or f"body{i}")
    roots = [body_names[i - 1] for i in range(1, m.nbody) if m.body_parentid[i] == 0]
    if nb == 0:
        raise TopologyError("the model has no bodies besides the world; expected one articulation", path=src)
    if len(roots) != 1:
        raise TopologyError(
            f"the world has {len(roots)} child bodies ({', '.join(roots)}); expected exactly one articulation root",
            path=src,
        )

    # Joint names and per-joint effort limits from actuators.
    effort: dict[int, float] = {}
    for a in range(m.nu):
        if m.actuator_trntype[a] != mujoco.mjtTrn.mjTRN_JOINT:
            continue
        j = int(m.actuator_trnid[a, 0])
        gear = abs(float(m.actuator_gear[a, 0]))
        lim = None
        if m.actuator_forcelimited[a]:
            lim = gear * float(np.max(np.abs(m.actuator_forcerange[a])))
        elif (
            m.actuator_ctrllimited[a]
            and m.actuator_gaintype[a] == mujoco.mjtGain.mjGAIN_FIXED
            and m.actuator_biastype[a] == mujoco.mjtBias.mjBIAS_NONE
        ):
            lim = gear * abs(float(m.actuator_gainprm[a, 0])) * float(np.max(np.abs(m.actuator_ctrlrange[a])))
        if lim is not None:
            effort[j] = effort.get(j, 0.0) + lim
    joint_names = []
    count: dict[int, int] = {}
    for j in range(m.njnt):
        b = int(m.jnt_bodyid[j])
        k = count.get(b, 0)
        count[b] = k + 1
        joint_names.append(_name_at(m, "jnt", j, path) or f"{body_names[b - 1]}_joint{k}")

    joints: list[JointDesc] = []
    body_joints: list[list[int]] = [[] for _ in range(nb)]
    for j in range(m.njnt):
        jt = _JTYPE[int(m.jnt_type[j])]
        b = int(m.jnt_bodyid[j]) - 1
        qadr, dadr = int(m.jnt_qposadr[j]), int(m.jnt_dofadr[j])
        limited = bool(m.jnt_limited[j])
        lim = effort.get(j)
        if m.jnt_actfrclimited[j]:
            jl = float(np.max(np.abs(m.jnt_actfrcrange[j])))
            lim = jl if lim is None else min(lim, jl)
        scalar = jt in (JointType.HINGE, JointType.SLIDE)
        body_joints[b].append(len(joints))
        joints.append(
            JointDesc(
                name=joint_names[j],
                type=jt,
                body=b,
                axis=m.jnt_axis[j] if scalar else (0.0, 0.0, 1.0),
                anchor=m.jnt_pos[j],
                range=(float(m.jnt_range[j, 0]), float(m.jnt_range[j, 1]))
                if limited and jt is not JointType.FREE
                else None,
                ref=float(m.qpos0[qadr]) if scalar else 0.0,
                armature=float(m.dof_armature[dadr]),
                damping=float(m.dof_damping[dadr]),
                frictionloss=float(m.dof_frictionloss[dadr]),
                stiffness=float(m.jnt_stiffness[j]),
                spring_ref=float(m.qpos_spring[qadr]) if scalar else 0.0,
                effort_limit=None if jt is JointType.FREE else lim,
            )
        )

    bodies = []
    for i in range(1, m.nbody):
        rot = R.quat_to_matrix(np.asarray(m.body_iquat[i], dtype=np.float64))
        inertia = rot @ np.diag(m.body_inertia[i]) @ rot.T
        bodies.append(
            BodyDesc(
                name=body_names[i - 1],
                parent=int(m.body_parentid[i]) - 1,
                pos=m.body_pos[i],
                quat_wxyz=m.body_quat[i],
                mass=float(m.body_mass[i]),
                com=m.body_ipos[i],
                inertia=inertia,
                joints=tuple(body_joints[i - 1]),
            )
        )

    geoms = []
    gcount: dict[int, int] = {}
    for g in range(m.ngeom):
        gt = _GTYPE.get(int(m.geom_type[g]))
        b = int(m.geom_bodyid[g])
        k = gcount.get(b, 0)
        gcount[b] = k + 1
        if gt is None:  # height fields and SDFs are not represented
            continue
        owner = body_names[b - 1] if b > 0 else "world"
        mesh = mesh_file = None
        if gt is GeomType.MESH:
            mesh = _name_at(m, "mesh", int(m.geom_dataid[g]), path)
            mesh_file = mesh_files.get(mesh)
        geoms.append(
            GeomDesc(
                name=_name_at(m, "geom", g, path) or f"{owner}_geom{k}",
                body=b - 1,
                type=gt,
                size=m.geom_size[g],
                pos=m.geom_pos[g],
                quat_wxyz=m.geom_quat[g],
                contype=int(m.geom_contype[g]),
                conaffinity=int(m.geom_conaffinity[g]),
                friction=m.geom_friction[g],
                mesh=mesh,
                mesh_file=mesh_file,
            )
        )

    exclusions = []
    for e in range(m.nexclude):
        sig = int(m.exclude_signature[e])
        b1, b2 = (sig >> 16) - 1, (sig & 0xFFFF) - 1
        if b1 >= 0 and b2 >= 0:
            exclusions.append((body_names[b1], body_names[b2]))

    mimics, cycles = [], []
    for e in range(m.neq):
        if not m.eq_active0[e]:
            continue
        etype = int(m.eq_type[e])
        data = np.asarray(m.eq_data[e], dtype=np.float64)
        if etype == mujoco.mjtEq.mjEQ_JOINT and m.eq_obj2id[e] >= 0:
            j1, j2 = int(m.eq_obj1id[e]), int(m.eq_obj2id[e])
            if np.any(data[2:5] != 0):
                warnings.warn(
                    f"{src}: joint equality {_name_at(m, 'eq', e, path) or e} is polynomial of degree > 1; "
                    "only linear couplings are kept as mimic joints, this one is skipped",
                    stacklevel=3,
                )
                continue
            q10, q20 = float(m.qpos0[m.jnt_qposadr[j1]]), float(m.qpos0[m.jnt_qposadr[j2]])
            mimics.append(
                MimicDesc(
                    joint=joint_names[j1],
                    leader=joint_names[j2],
                    multiplier=float(data[1]),
                    offset=float(data[0] + q10 - data[1] * q20),
                )
            )
        elif etype == mujoco.mjtEq.mjEQ_CONNECT and int(m.eq_objtype[e]) == mujoco.mjtObj.mjOBJ_BODY:
            b1, b2 = int(m.eq_obj1id[e]), int(m.eq_obj2id[e])
            if b1 > 0 and b2 > 0:
                cycles.append(
                    CycleJointDesc(
                        name=_name_at(m, "eq", e, path) or f"cycle{len(cycles)}",
                        parent=body_names[b2 - 1],
                        child=body_names[b1 - 1],
                        pivot=data[0:3],
                        parent_pivot=data[3:6],
                    )
                )

    tendons, spatial = [], []
    for t in range(m.ntendon):
        adr, num = int(m.tendon_adr[t]), int(m.tendon_num[t])
        common = {
            "name": _name_at(m, "tendon", t, path) or f"tendon{t}",
            "stiffness": float(np.asarray(m.tendon_stiffness[t]).ravel()[0]),
            "damping": float(np.asarray(m.tendon_damping[t]).ravel()[0]),
            "range": (float(m.tendon_range[t, 0]), float(m.tendon_range[t, 1])) if m.tendon_limited[t] else None,
            "spring_length": _spring_length(m, t),
        }
        if all(m.wrap_type[adr + k] == mujoco.mjtWrap.mjWRAP_JOINT for k in range(num)):
            tendons.append(
                TendonDesc(
                    joints=tuple(joint_names[int(m.wrap_objid[adr + k])] for k in range(num)),
                    coefficients=tuple(float(m.wrap_prm[adr + k]) for k in range(num)),
                    **common,
                )
            )
        else:
            tendon = _spatial_tendon(m, adr, num, body_names, common, src)
            if tendon is not None:
                spatial.append(tendon)

    return ArticulationDesc(
        name=_model_name(m, path),
        bodies=tuple(bodies),
        joints=tuple(joints),
        geoms=tuple(geoms),
        mimics=tuple(mimics),
        tendons=tuple(tendons),
        spatial_tendons=tuple(spatial),
        cycles=tuple(cycles),
        contact_exclusions=tuple(exclusions),
        order="DFS",
        source=src,
        gravity=m.opt.gravity,
    )


def _spring_length(m, t: int) -> tuple[float, float]:
    """The compiled spring length (dead band) of tendon ``t``: MuJoCo computes it at ``qpos_spring`` when
    the file gives none."""
    ls = np.asarray(m.tendon_lengthspring[t], dtype=np.float64).ravel()
    return (float(ls[0]), float(ls[-1]))


def _spatial_tendon(m, adr: int, num: int, body_names, common: dict, src) -> SpatialTendonDesc | None:
    """A spatial tendon of sites and pulleys (straight segments; each pulley divides what follows by its
    divisor); one that wraps around a geom or attaches to the world is skipped with a warning."""
    import mujoco

    site_bodies, site_pos, segments, weights = [], [], [], []
    prev, divisor = None, 1.0
    for k in range(num):
        wt = int(m.wrap_type[adr + k])
        if wt == mujoco.mjtWrap.mjWRAP_PULLEY:
            prev, divisor = None, float(m.wrap_prm[adr + k])
            continue
        sid = int(m.wrap_objid[adr + k])
        if wt != mujoco.mjtWrap.mjWRAP_SITE or int(m.site_bodyid[sid]) == 0:
            what = "wraps around a geom" if wt != mujoco.mjtWrap.mjWRAP_SITE else "attaches to the world body"
            warnings.warn(
                f"{src}: spatial tendon {common['name']!r} {what}; only sites on bodies and pulleys are "
                "simulated, this tendon is skipped",
                stacklevel=4,
            )
            return None
        site_bodies.append(body_names[int(m.site_bodyid[sid]) - 1])
        site_pos.append(np.asarray(m.site_pos[sid], dtype=np.float64))
        here = len(site_bodies) - 1
        if prev is not None:
            segments.append((prev, here))
            weights.append(1.0 / divisor)
        prev = here
    return SpatialTendonDesc(
        site_bodies=tuple(site_bodies),
        site_positions=np.array(site_pos, dtype=np.float64).reshape(-1, 3),
        segments=tuple(segments),
        segment_weights=tuple(weights),
        **common,
    )

"""URDF loader with a hardened XML parser (``defusedxml``: no DTDs, no entity expansion).

Conventions: the URDF joint origin is the child link frame in the parent link frame (``BodyDesc.pos``,
``BodyDesc.quat_wxyz``); the joint axis is in the child link frame; ``rpy`` are extrinsic X-Y-Z (roll
about x, then pitch about y, then yaw about z, all fixed axes). Joint types map as revolute -> HINGE
(limited), continuous -> HINGE (unlimited), prismatic -> SLIDE, fixed -> FIXED, floating -> FREE;
``planar`` is refused. A link named ``world`` with no inertial that is the root stands for the world
frame: its child becomes the root body (a ``floating`` joint from it becomes the free root, a ``fixed``
one pins the root at the joint origin). Mesh files are kept by reference and never opened, so a missing
mesh is not an error.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from .. import rotations as R
from ..errors import FileMissingError, FormatError, TopologyError, UnsupportedJointError
from .desc import ArticulationDesc, BodyDesc, GeomDesc, GeomType, JointDesc, JointType, MimicDesc
from .topology import body_order, check_order, reroot

__all__ = ["URDFLoader"]

_JTYPES = {
    "revolute": JointType.HINGE,
    "continuous": JointType.HINGE,
    "prismatic": JointType.SLIDE,
    "fixed": JointType.FIXED,
    "floating": JointType.FREE,
}


class _Reader:
    def __init__(self, path: Path):
        self.path = str(path)

    def floats(self, el, attr: str, n: int, default=None, *, what: str) -> np.ndarray:
        text = el.get(attr)
        if text is None:
            if default is None:
                raise FormatError(f"missing attribute {attr!r}; expected {n} numbers", path=self.path, item=what)
            return np.array(default, dtype=np.float64)
        try:
            vals = [float(t) for t in text.split()]
        except ValueError:
            raise FormatError(
                f"attribute {attr}={text!r} is not numeric; expected {n} numbers", path=self.path, item=what
            ) from None
        if len(vals) != n:
            raise FormatError(
                f"attribute {attr}={text!r} has {len(vals)} numbers; expected {n}", path=self.path, item=what
            )
        arr = np.array(vals, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise FormatError(f"attribute {attr}={text!r} is not finite", path=self.path, item=what)
        return arr

    def scalar(self, el, attr: str, default: float | None, *, what: str) -> float | None:
        text = el.get(attr) if el is not None else None
        if text is None:
            return default
        try:
            v = float(text)
        except ValueError:
            raise FormatError(f"attribute {attr}={text!r} is not a number", path=self.path, item=what) from None
        if not math.isfinite(v):
            raise FormatError(f"attribute {attr}={text!r} is not finite", path=self.path, item=what)
        return v

    def origin(self, el, what: str) -> tuple[np.ndarray, np.ndarray]:
        o = el.find("origin") if el is not None else None
        if o is None:
            return np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0])
        return (
            self.floats(o, "xyz", 3, (0, 0, 0), what=what + "/origin"),
            R.quat_from_euler(self.floats(o, "rpy", 3, (0, 0, 0), what=what + "/origin"), "xyz", extrinsic=True),
        )


class URDFLoader:
    """Load URDF files into :class:`ArticulationDesc`."""

    @staticmethod
    def load(
        path: str | os.PathLike, order: str = "DFS", *, strict: bool = True, root: str | None = None
    ) -> ArticulationDesc:
        """Parse ``path`` (URDF) into an articulation.

        Args:
            path: a ``.urdf`` file.
            order: ``"DFS"``: pre-order from the root, children in the order their joints appear in the
                file; ``"BFS"``: breadth-first with the same sibling order.
            strict: the URDF specification requires ``<inertia>`` inside ``<inertial>`` (MuJoCo and
                urdfdom refuse the file without it); ``strict=False`` accepts it as a zero inertia tensor
                with a warning, as Isaac Gym does.
            root: ``None``: the file's root link; a link name: re-root the tree there (floating base only);
                ``"auto"``: the world-attached link, else the link of minimal eccentricity
                (:func:`kangengine.asset.select_root`). See :func:`kangengine.asset.reroot`.
        Raises:
            FileMissingError, FormatError (malformed XML, entities/DTD, bad numbers, missing elements),
            UnsupportedJointError (planar or unknown joint types), TopologyError (no root, several
            roots, a link with two parents, a cycle), DuplicateNameError.
        """
        from defusedxml import ElementTree as DET
        from defusedxml.common import DefusedXmlException

        path = Path(path)
        order = check_order(order, path=path)
        if not path.is_file():
            raise FileMissingError("no such URDF file; expected an existing .urdf file", path=path)
        try:
            xml = DET.parse(str(path), forbid_dtd=True).getroot()
        except DefusedXmlException as exc:
            raise FormatError(
                f"refused unsafe XML ({type(exc).__name__}); DTDs and entities are not allowed", path=path
            ) from exc
        except Exception as exc:  # xml.etree.ElementTree.ParseError
            raise FormatError(f"malformed XML: {exc}", path=path) from exc
        if xml.tag != "robot":
            raise FormatError(f"root element is <{xml.tag}>; expected <robot>", path=path)
        desc = _build(xml, path, order, strict)
        return desc if root is None else reroot(desc, root, order=order)


def _build(root, path: Path, order: str, strict: bool) -> ArticulationDesc:
    rd = _Reader(path)
    src = str(path)
    links = {}
    link_order = []
    for el in root.findall("link"):
        name = el.get("name")
        if not name:
            raise FormatError("a <link> has no name", path=src, item="link")
        if name in links:
            from ..errors import DuplicateNameError

            raise DuplicateNameError(f"link name {name!r} is used twice", path=src, item=f"link {name}")
        links[name] = el
        link_order.append(name)
    if not links:
        raise FormatError("no <link> elements; expected at least one", path=src)

    joints = []
    parent_of: dict[str, tuple[str, object]] = {}
    for el in root.findall("joint"):
        name = el.get("name")
        what = f"joint {name!r}"
        if not name:
            raise FormatError("a <joint> has no name", path=src, item="joint")
        jtype = el.get("type")
        if jtype not in _JTYPES:
            raise UnsupportedJointError(
                f"joint type {jtype!r} is not supported; expected one of {sorted(_JTYPES)}", path=src, item=what
            )
        p, c = el.find("parent"), el.find("child")
        if p is None or c is None or p.get("link") is None or c.get("link") is None:
            raise FormatError("needs <parent link=...> and <child link=...>", path=src, item=what)
        pl, cl = p.get("link"), c.get("link")
        for ln in (pl, cl):
            if ln not in links:
                raise TopologyError(f"refers to link {ln!r}, which is not defined", path=src, item=what)
        if cl in parent_of:
            raise TopologyError(
                f"link {cl!r} has two parent joints ({parent_of[cl][0]!r} and {name!r})", path=src, item=what
            )
        parent_of[cl] = (name, el)
        joints.append((name, el, pl, cl))

    roots = [ln for ln in link_order if ln not in parent_of]
    if len(roots) != 1:
        raise TopologyError(f"expected exactly one root link, found {len(roots)}: {roots}", path=src)
    world = None
    if roots[0] == "world" and links["world"].find("inertial") is None:
        world = "world"
        kids = [j for j in joints if j[2] == "world"]
        if len(kids) != 1:
            raise TopologyError(f"link 'world' has {len(kids)} child joints; expected one articulation root", path=src)
    names = [ln for ln in link_order if ln != world]
    index_in_file = {n: i for i, n in enumerate(names)}
    parents_file = []
    joint_order = {n: k for k, (n, *_rest) in enumerate(joints)}
    for ln in names:
        if ln in parent_of and parent_of[ln][1].find("parent").get("link") != world:
            parents_file.append(index_in_file[parent_of[ln][1].find("parent").get("link")])
        else:
            parents_file.append(-1)
    # Children in the order of their joints in the file (pre-order from the root).
    sort_key = [joint_order[parent_of[ln][0]] if ln in parent_of else -1 for ln in names]
    by_joint = sorted(range(len(names)), key=lambda i: sort_key[i])
    remap = {old: new for new, old in enumerate(by_joint)}
    parents_sorted = [-1 if parents_file[old] < 0 else remap[parents_file[old]] for old in by_joint]
    perm_sorted = body_order(parents_sorted, order, path=src, names=[names[i] for i in by_joint])
    perm = [by_joint[i] for i in perm_sorted]
    new_index = {old: new for new, old in enumerate(perm)}

    bodies, jdescs, geoms, mimics = [], [], [], []
    for new, old in enumerate(perm):
        ln = names[old]
        el = links[ln]
        pos, quat = np.zeros(3), np.array([1.0, 0, 0, 0])
        body_joint_ids: list[int] = []
        if ln in parent_of:
            jname, jel = parent_of[ln]
            what = f"joint {jname!r}"
            pos, quat = rd.origin(jel, what)
            jt = _JTYPES[jel.get("type")]
            axis = (
                rd.floats(jel.find("axis"), "xyz", 3, (1, 0, 0), what=what + "/axis")
                if jel.find("axis") is not None
                else np.array([1.0, 0, 0])
            )
            if jt in (JointType.HINGE, JointType.SLIDE) and np.linalg.norm(axis) < 1e-12:
                raise FormatError("axis is zero; expected a non-zero direction", path=src, item=what)
            lim = jel.find("limit")
            rng = None
            if jel.get("type") in ("revolute", "prismatic"):
                if lim is None:
                    raise FormatError(f"{jel.get('type')} joint needs a <limit>", path=src, item=what)
                lo = rd.scalar(lim, "lower", 0.0, what=what + "/limit")
                hi = rd.scalar(lim, "upper", 0.0, what=what + "/limit")
                if hi < lo:
                    raise FormatError(f"limit lower={lo} > upper={hi}", path=src, item=what)
                rng = (lo, hi)
            dyn = jel.find("dynamics")
            body_joint_ids.append(len(jdescs))
            jdescs.append(
                JointDesc(
                    name=jname,
                    type=jt,
                    body=new,
                    axis=axis if jt in (JointType.HINGE, JointType.SLIDE) else (0, 0, 1),
                    range=rng,
                    damping=rd.scalar(dyn, "damping", 0.0, what=what + "/dynamics") or 0.0,
                    frictionloss=rd.scalar(dyn, "friction", 0.0, what=what + "/dynamics") or 0.0,
                    effort_limit=rd.scalar(lim, "effort", None, what=what + "/limit") if lim is not None else None,
                    velocity_limit=rd.scalar(lim, "velocity", None, what=what + "/limit") if lim is not None else None,
                )
            )
            mim = jel.find("mimic")
            if mim is not None:
                if mim.get("joint") is None:
                    raise FormatError("<mimic> needs a joint attribute", path=src, item=what)
                mimics.append(
                    MimicDesc(
                        joint=jname,
                        leader=mim.get("joint"),
                        multiplier=rd.scalar(mim, "multiplier", 1.0, what=what + "/mimic"),
                        offset=rd.scalar(mim, "offset", 0.0, what=what + "/mimic"),
                    )
                )
        mass, com, inertia = 0.0, np.zeros(3), np.zeros((3, 3))
        inert = el.find("inertial")
        what = f"link {ln!r}"
        if inert is not None:
            m_el = inert.find("mass")
            if m_el is None:
                raise FormatError("<inertial> has no <mass>", path=src, item=what)
            mass = rd.scalar(m_el, "value", None, what=what + "/inertial/mass")
            if mass is None or mass < 0:
                raise FormatError("mass must be a non-negative number", path=src, item=what + "/inertial/mass")
            com, iq = rd.origin(inert, what + "/inertial")
            i_el = inert.find("inertia")
            if i_el is None and not strict:
                warnings.warn(
                    f"{src}: {what}: <inertial> has no <inertia>; using a zero inertia tensor (strict=False)",
                    stacklevel=4,
                )
                i_el = ElementTree.Element("inertia")
            if i_el is None:
                raise FormatError(
                    "<inertial> has no <inertia>; expected ixx ixy ixz iyy iyz izz", path=src, item=what + "/inertial"
                )
            vals = {
                k: rd.scalar(i_el, k, 0.0, what=what + "/inertial/inertia")
                for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")
            }
            local = np.array(
                [
                    [vals["ixx"], vals["ixy"], vals["ixz"]],
                    [vals["ixy"], vals["iyy"], vals["iyz"]],
                    [vals["ixz"], vals["iyz"], vals["izz"]],
                ]
            )
            _check_inertia(local, src, what + "/inertial/inertia")
            rot = R.quat_to_matrix(iq)
            inertia = rot @ local @ rot.T
        k = 0
        for col in el.findall("collision"):
            g = _geom(rd, col, ln, new, k)
            if g is not None:
                geoms.append(g)
                k += 1
        parent = -1 if parents_file[old] < 0 else new_index[parents_file[old]]
        bodies.append(
            BodyDesc(
                name=ln,
                parent=parent,
                pos=pos,
                quat_wxyz=quat,
                mass=mass,
                com=com,
                inertia=inertia,
                joints=tuple(body_joint_ids),
            )
        )
    _check_mimics(mimics, jdescs, src)
    return ArticulationDesc(
        name=root.get("name") or path.stem,
        bodies=tuple(bodies),
        joints=tuple(jdescs),
        geoms=tuple(geoms),
        mimics=tuple(mimics),
        order=order,
        source=src,
    )


def _check_inertia(local: np.ndarray, src: str, item: str) -> None:
    """Refuse an inertia tensor that no rigid body has: a negative principal moment (not positive
    semi-definite) or principal moments violating the triangle inequality ``I1 + I2 >= I3``. The tolerance is
    1e-6 of the trace (rounding in the file's printed digits)."""
    moments = np.linalg.eigvalsh(local)  # ascending
    tol = 1e-6 * max(float(np.abs(moments).sum()), 1e-12)
    if moments[0] < -tol:
        raise FormatError(
            f"inertia has principal moments {moments.tolist()} (kg m^2); expected a positive semi-definite "
            "tensor (no negative moment)",
            path=src,
            item=item,
        )
    if moments[0] + moments[1] < moments[2] - tol:
        raise FormatError(
            f"inertia has principal moments {moments.tolist()} (kg m^2), and {moments[0]:.6g} + {moments[1]:.6g} "
            f"< {moments[2]:.6g}; expected the triangle inequality I1 + I2 >= I3 of a rigid body",
            path=src,
            item=item,
        )


def _check_mimics(mimics: list, joints: list, src: str) -> None:
    names = [j.name for j in joints]
    known = set(names)
    for mim in mimics:
        if mim.leader not in known:
            raise TopologyError(
                f"<mimic joint={mim.leader!r}> names a joint that is not defined; joints are: {', '.join(names)}",
                path=src,
                item=f"joint {mim.joint!r}/mimic",
            )
        if mim.leader == mim.joint:
            raise TopologyError(
                "<mimic> names the joint itself; expected another joint", path=src, item=f"joint {mim.joint!r}/mimic"
            )


def _non_negative(rd: _Reader, value: float, what: str, item: str) -> float:
    if value < 0:
        raise FormatError(f"{what} is {value}; expected a size >= 0 (m)", path=rd.path, item=item)
    return value


def _geom(rd: _Reader, col, link: str, body: int, k: int) -> GeomDesc | None:
    what = f"link {link!r}/collision"
    pos, quat = rd.origin(col, what)
    geo = col.find("geometry")
    if geo is None or len(geo) == 0:
        raise FormatError("<collision> has no <geometry> child", path=rd.path, item=what)
    shape = geo[0]
    name = col.get("name") or f"{link}_geom{k}"
    kw = dict(name=name, body=body, pos=pos, quat_wxyz=quat)
    if shape.tag == "box":
        size = rd.floats(shape, "size", 3, what=what + "/box")
        if (size < 0).any():
            raise FormatError(f"box size {size.tolist()}; expected sizes >= 0 (m)", path=rd.path, item=what + "/box")
        return GeomDesc(type=GeomType.BOX, size=0.5 * size, **kw)
    if shape.tag == "sphere":
        r = rd.scalar(shape, "radius", None, what=what + "/sphere")
        if r is None:
            raise FormatError("<sphere> needs a radius", path=rd.path, item=what)
        _non_negative(rd, r, "sphere radius", what + "/sphere")
        return GeomDesc(type=GeomType.SPHERE, size=(r, 0, 0), **kw)
    if shape.tag in ("cylinder", "capsule"):
        r = rd.scalar(shape, "radius", None, what=what + "/" + shape.tag)
        length = rd.scalar(shape, "length", None, what=what + "/" + shape.tag)
        if r is None or length is None:
            raise FormatError(f"<{shape.tag}> needs radius and length", path=rd.path, item=what)
        _non_negative(rd, r, f"{shape.tag} radius", what + "/" + shape.tag)
        _non_negative(rd, length, f"{shape.tag} length", what + "/" + shape.tag)
        gt = GeomType.CYLINDER if shape.tag == "cylinder" else GeomType.CAPSULE
        return GeomDesc(type=gt, size=(r, 0.5 * length, 0), **kw)
    if shape.tag == "mesh":
        fn = shape.get("filename")
        scale = rd.floats(shape, "scale", 3, (1, 1, 1), what=what + "/mesh")
        return GeomDesc(type=GeomType.MESH, size=scale, mesh=Path(fn).stem if fn else None, mesh_file=fn, **kw)
    raise FormatError(
        f"unknown geometry <{shape.tag}>; expected box, sphere, cylinder, capsule or mesh", path=rd.path, item=what
    )

"""Tree helpers shared by the asset loaders: body order (DFS/BFS), root selection and re-rooting.

Root selection follows PhysX's automatic rule (``physx_reduced_coordinate_articulations.md``): for bodies and
joints given in any order, a joint to the world makes the articulation fixed-base with the body it attaches as
the root; otherwise (floating base) the root is the body of minimal eccentricity ``e(v) = max_u d(v, u)`` in the
joint graph (``d``: number of joints on the shortest path). Ties are broken, in this order, by the smaller sum of
distances to all bodies (the more central body), then by the name (smallest in Python's string order), so the
choice does not depend on the order the bodies and joints were listed in. A root the user names wins over both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .. import rotations as R
from ..errors import FormatError, TopologyError, UnknownNameError, UnsupportedJointError

__all__ = ["body_order", "check_order", "ORDERS", "GraphJoint", "RootSelection", "select_root", "reroot", "AUTO_ROOT"]

AUTO_ROOT = "auto"

ORDERS = ("DFS", "BFS")


def check_order(order: str, *, path=None) -> str:
    """Normalise an order name; ``FormatError`` unless it is "DFS" or "BFS" (any case)."""
    o = str(order).upper()
    if o not in ORDERS:
        raise FormatError(f"order must be one of {ORDERS}, got {order!r}", path=path, item="order")
    return o


def body_order(parents: Sequence[int], order: str, *, path=None, names: Sequence[str] | None = None) -> list[int]:
    """Permutation (new position -> old index) listing a forest of one tree in ``order``.

    Args:
        parents: parent index per node (-1 for the root), in the file's pre-order or any order.
        order: "DFS" (pre-order, children in their listed order) or "BFS" (level by level, children in
            their listed order).
    Raises:
        TopologyError: a parent index out of range, a cycle, or a node not reachable from the root.
    """
    order = check_order(order, path=path)
    n = len(parents)
    label = (lambda i: repr(names[i])) if names is not None else (lambda i: f"#{i}")
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, p in enumerate(parents):
        if p == -1:
            roots.append(i)
        elif 0 <= p < n:
            children[p].append(i)
        else:
            raise TopologyError(f"node {label(i)} has parent index {p}; expected -1 or 0..{n - 1}", path=path)
    out: list[int] = []
    if order == "DFS":
        stack = list(reversed(roots))
        while stack:
            i = stack.pop()
            out.append(i)
            stack.extend(reversed(children[i]))
    else:
        frontier = list(roots)
        while frontier:
            out.extend(frontier)
            frontier = [c for i in frontier for c in children[i]]
    if len(out) != n:
        missing = sorted(set(range(n)) - set(out))
        raise TopologyError(
            "the kinematic graph is not a tree: nodes "
            + ", ".join(label(i) for i in missing[:10])
            + " are on a cycle or not connected to the root",
            path=path,
        )
    return out


@dataclass(frozen=True)
class GraphJoint:
    """A joint of a topology graph: it connects ``body0`` and ``body1`` (body names; ``None`` is the world).
    Direction does not matter for root selection; :attr:`RootSelection.reversed` says which joints the chosen
    tree runs from ``body1`` to ``body0``."""

    name: str
    body0: str | None
    body1: str | None


@dataclass(frozen=True)
class RootSelection:
    """The rooted tree chosen by :func:`select_root`.

    Attributes:
        root: the root body.
        fixed_base: a joint to the world holds the root.
        world_joint: that joint's name, else ``None``.
        reason: how the root was chosen, in one sentence.
        bodies: every body, parent first (breadth-first from the root; neighbours in the order their joints
            were given).
        parents: ``(bodies,)`` the parent's name per entry of ``bodies``, ``None`` for the root.
        parent_joints: ``(bodies,)`` the joint to the parent (the world joint for a fixed root, else ``None``).
        reversed: ``(bodies,)`` whether that joint was given as (child, parent), i.e. ``body0`` is the child.
        eccentricity: body name -> eccentricity (joints to the farthest body).
        loop_joints: joints left out of the tree (they close loops; model them as cycle joints).
    """

    root: str
    fixed_base: bool
    world_joint: str | None
    reason: str
    bodies: tuple[str, ...]
    parents: tuple[str | None, ...]
    parent_joints: tuple[str | None, ...]
    reversed: tuple[bool, ...]
    eccentricity: Mapping[str, int] = field(default_factory=dict)
    loop_joints: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "eccentricity", MappingProxyType(dict(self.eccentricity)))


def _adjacency(bodies, joints, path):
    index = {b: i for i, b in enumerate(bodies)}
    if len(index) != len(bodies):
        dup = sorted({b for b in bodies if list(bodies).count(b) > 1})
        raise TopologyError(f"bodies listed twice: {dup}", path=path)
    adj: list[list[tuple[int, int]]] = [[] for _ in bodies]
    world: list[int] = []
    for k, j in enumerate(joints):
        ends = []
        for b in (j.body0, j.body1):
            if b is not None and b not in index:
                raise UnknownNameError(
                    f"joint {j.name!r} names body {b!r}, which is not listed; bodies are: {', '.join(bodies)}",
                    path=path,
                )
            ends.append(None if b is None else index[b])
        if ends[0] is None and ends[1] is None:
            raise TopologyError(f"joint {j.name!r} connects the world to the world", path=path)
        if ends[0] is None or ends[1] is None:
            world.append(k)
        elif ends[0] == ends[1]:
            raise TopologyError(f"joint {j.name!r} connects body {j.body0!r} to itself", path=path)
        else:
            adj[ends[0]].append((ends[1], k))
            adj[ends[1]].append((ends[0], k))
    return index, adj, world


def _distances(adj, start: int) -> np.ndarray:
    dist = np.full(len(adj), -1, dtype=np.int64)
    dist[start] = 0
    queue = deque([start])
    while queue:
        i = queue.popleft()
        for n, _k in adj[i]:
            if dist[n] < 0:
                dist[n] = dist[i] + 1
                queue.append(n)
    return dist


def select_root(
    bodies: Sequence[str], joints: Sequence[GraphJoint | tuple], *, root: str | None = None, path=None
) -> RootSelection:
    """Choose the root of a topology and the tree that hangs from it (rule in the module docstring).

    Args:
        bodies: body names, any order.
        joints: :class:`GraphJoint` or ``(name, body0, body1)`` tuples, any order; ``None`` for the world.
        root: a body name to use as root, or ``None`` / ``"auto"`` for the automatic rule.
    Raises:
        TopologyError: no bodies, a joint from a body to itself, several joints to the world, bodies not
            connected, or a named root that is not the world-attached body of a fixed-base topology.
        UnknownNameError: a joint or ``root`` names an unknown body.
    """
    bodies = [str(b) for b in bodies]
    joints = [j if isinstance(j, GraphJoint) else GraphJoint(*j) for j in joints]
    if not bodies:
        raise TopologyError("no bodies; expected at least one", path=path)
    index, adj, world = _adjacency(bodies, joints, path)
    if len(world) > 1:
        raise TopologyError(
            f"several joints attach bodies to the world ({', '.join(joints[k].name for k in world)}); a fixed-base "
            "articulation has one",
            path=path,
        )
    dist = np.stack([_distances(adj, i) for i in range(len(bodies))])
    if np.any(dist < 0):
        lost = [bodies[i] for i in np.nonzero(dist[0] < 0)[0]]
        raise TopologyError(
            f"bodies {lost[:10]} are not connected to {bodies[0]!r} by joints; expected one connected articulation",
            path=path,
        )
    ecc = dist.max(axis=1)
    eccentricity = {b: int(e) for b, e in zip(bodies, ecc)}
    if root is not None and root != AUTO_ROOT and root not in index:
        raise UnknownNameError(f"no body {root!r} to use as root; bodies are: {', '.join(bodies)}", path=path)
    wj = joints[world[0]] if world else None
    if wj is not None:
        attached = wj.body0 if wj.body0 is not None else wj.body1
        if root not in (None, AUTO_ROOT, attached):
            raise TopologyError(
                f"root {root!r} was asked for, but joint {wj.name!r} fixes body {attached!r} to the world; a "
                "fixed-base articulation is rooted at its world-attached body",
                path=path,
            )
        r, reason = index[attached], f"joint {wj.name!r} attaches body {attached!r} to the world (fixed base)"
    elif root not in (None, AUTO_ROOT):
        r, reason = index[root], f"root {root!r} named by the caller (floating base)"
    else:
        total = dist.sum(axis=1)
        r = min(range(len(bodies)), key=lambda i: (int(ecc[i]), int(total[i]), bodies[i]))
        tied = [bodies[i] for i in range(len(bodies)) if ecc[i] == ecc[r]]
        reason = f"minimal eccentricity {int(ecc[r])} (floating base)"
        if len(tied) > 1:
            reason += f", tie among {sorted(tied)} broken by the smallest distance sum ({int(total[r])}), then name"
    return _tree(bodies, joints, adj, r, wj, reason, eccentricity)


def _tree(bodies, joints, adj, r, wj, reason, eccentricity) -> RootSelection:
    parent = {r: None}
    pjoint = {r: None if wj is None else wj.name}
    rev = {r: wj is not None and wj.body0 is not None}
    order, queue, used = [r], deque([r]), set()
    while queue:
        i = queue.popleft()
        for n, k in adj[i]:
            if n in parent:
                continue
            parent[n], pjoint[n], used = i, joints[k].name, used | {k}
            rev[n] = joints[k].body0 == bodies[n]
            order.append(n)
            queue.append(n)
    world_k = {j.name for j in joints if j.body0 is None or j.body1 is None}
    loops = tuple(j.name for k, j in enumerate(joints) if k not in used and j.name not in world_k)
    return RootSelection(
        root=bodies[r],
        fixed_base=wj is not None,
        world_joint=None if wj is None else wj.name,
        reason=reason,
        bodies=tuple(bodies[i] for i in order),
        parents=tuple(None if parent[i] is None else bodies[parent[i]] for i in order),
        parent_joints=tuple(pjoint[i] for i in order),
        reversed=tuple(rev[i] for i in order),
        eccentricity=eccentricity,
        loop_joints=loops,
    )


def desc_graph(desc, *, welded_root: bool = False) -> tuple[list[str], list[GraphJoint]]:
    """The topology of an :class:`ArticulationDesc` for :func:`select_root`: each body's joints as one edge to
    its parent (named after its first joint, or ``{body}_weld`` when it has none); the root's joints, unless
    it has a FREE one, are a joint to the world. A root without joints floats (URDF: the base of a robot
    without a ``world`` link), or, with ``welded_root=True``, is welded to the world (MJCF: a body without
    joints is fixed to its parent)."""
    from .desc import JointType

    joints = []
    for b in desc.bodies:
        name = desc.joints[b.joints[0]].name if b.joints else f"{b.name}_weld"
        if b.parent >= 0:
            joints.append(GraphJoint(name, desc.bodies[b.parent].name, b.name))
        elif b.joints and desc.joints[b.joints[0]].type is not JointType.FREE:
            joints.append(GraphJoint(name, None, b.name))
        elif not b.joints and welded_root:
            joints.append(GraphJoint(name, None, b.name))
    return list(desc.body_names), joints


def reroot(desc, root: str | None, *, order: str | None = None, welded_root: bool = False):
    """``desc`` re-rooted at body ``root`` (a name, or ``"auto"`` for :func:`select_root`'s rule; ``None``
    returns ``desc`` unchanged).

    Body frames do not move, so inertias, geoms and joint values keep their meaning: each joint on the path
    from the new root to the old one is reversed (its body becomes the parent; the rest transform is inverted;
    hinge and slide axes are mapped into the other body's frame and negated, anchors moved with them, so a
    joint value still means the same relative pose). A FREE joint moves to the new root. Ball joints cannot be
    reversed with the same coordinates and are refused on that path. Bodies are then listed in ``order``
    (default: ``desc.order``).

    Raises:
        TopologyError: a fixed-base description (a root with non-free joints) re-rooted elsewhere.
        UnsupportedJointError: a ball or free joint on the path to reverse. UnknownNameError: no such body.
    """
    from .desc import reorder_bodies

    if root is None:
        return desc
    bodies, joints = desc_graph(desc, welded_root=welded_root)
    sel = select_root(bodies, joints, root=root, path=desc.source)
    order = desc.order if order is None else check_order(order, path=desc.source)
    new_root = desc.body_index(sel.root)
    if new_root == 0:
        return reorder_bodies(desc, order) if order != desc.order else desc
    return reorder_bodies(_reroot_at(desc, new_root), order)


def _inverse(pos, quat):
    qi = R.quat_conjugate(np.asarray(quat, dtype=np.float64))
    return -R.quat_rotate(qi, np.asarray(pos, dtype=np.float64)), qi


def _reroot_at(desc, new_root: int):
    import dataclasses

    from .desc import JointType

    path = [new_root]
    while desc.bodies[path[-1]].parent >= 0:
        path.append(desc.bodies[path[-1]].parent)
    bodies = list(desc.bodies)
    joints = list(desc.joints)
    body_joints = {i: [joints[j] for j in b.joints] for i, b in enumerate(bodies)}
    old_root = path[-1]
    free = [j for j in body_joints[old_root] if j.type is JointType.FREE]
    body_joints[old_root] = [j for j in body_joints[old_root] if j.type is not JointType.FREE]
    new_rest = {}
    for child, par in zip(path[:-1], path[1:]):  # edge par -> child becomes child -> par
        cb = desc.bodies[child]
        q = np.asarray(cb.quat_wxyz, dtype=np.float64)
        q = q / np.linalg.norm(q)
        p = np.asarray(cb.pos, dtype=np.float64)
        moved = []
        for jd in reversed(body_joints[child]):
            if jd.type in (JointType.BALL, JointType.FREE):
                raise UnsupportedJointError(
                    f"re-rooting would reverse {jd.type.value} joint {jd.name!r}, whose coordinates cannot be kept; "
                    "only hinge, slide and fixed joints can be reversed",
                    path=desc.source,
                    item=f"joint {jd.name!r}",
                )
            axis = -R.quat_rotate(q, np.asarray(jd.axis)) if jd.type in (JointType.HINGE, JointType.SLIDE) else jd.axis
            anchor = R.quat_rotate(q, np.asarray(jd.anchor)) + p
            moved.append(dataclasses.replace(jd, axis=axis, anchor=anchor))
        new_rest[par] = (child, *_inverse(p, q))
        body_joints[par + len(bodies)] = moved  # staged: assigned below once every edge is read
    for par, (child, pos, quat) in new_rest.items():
        bodies[par] = dataclasses.replace(bodies[par], parent=child, pos=pos, quat_wxyz=quat)
    for par in new_rest:
        body_joints[par] = body_joints.pop(par + len(bodies))
    # world pose of the new root at the modelled pose
    pos, quat = np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0])
    for i in reversed(path):
        b = desc.bodies[i]
        pos = pos + R.quat_rotate(quat, np.asarray(b.pos, dtype=np.float64))
        quat = R.quat_normalize(R.quat_multiply(quat, np.asarray(b.quat_wxyz, dtype=np.float64)))
    bodies[new_root] = dataclasses.replace(bodies[new_root], parent=-1, pos=pos, quat_wxyz=quat)
    body_joints[new_root] = free  # its own joints moved to its old parent
    return _rebuild(desc, bodies, body_joints)


def _rebuild(desc, bodies, body_joints):
    import dataclasses

    parents = [b.parent for b in bodies]
    perm = body_order(parents, "DFS", path=desc.source, names=[b.name for b in bodies])
    new_index = {old: new for new, old in enumerate(perm)}
    out_bodies, out_joints = [], []
    for old in perm:
        ids = []
        for jd in body_joints[old]:
            ids.append(len(out_joints))
            out_joints.append(dataclasses.replace(jd, body=new_index[old]))
        b = bodies[old]
        out_bodies.append(dataclasses.replace(b, parent=-1 if b.parent < 0 else new_index[b.parent], joints=tuple(ids)))
    geoms = [g if g.body < 0 else dataclasses.replace(g, body=new_index[g.body]) for g in desc.geoms]
    return dataclasses.replace(
        desc, bodies=tuple(out_bodies), joints=tuple(out_joints), geoms=tuple(geoms), order="DFS"
    )

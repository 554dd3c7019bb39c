"""Self-collision of a retargeted robot: capsule proxies of its collision geoms, the pairs that may touch, and the
source skeleton's own intersections (numpy; the solver's penalty uses the same capsules in torch).

* Proxies: a sphere is a capsule of length 0; a capsule is itself; a cylinder the capsule on its axis (its
  rims lie on the caps' spheres); a box the capsule along its longest axis enclosing it; an ellipsoid its
  enclosing sphere; a mesh (MJCF models, read through MuJoCo's compiler) the enclosing capsule along the
  principal axis of its vertices that has the least volume. Every proxy encloses its geom, so proxies apart
  means geoms apart.
* Pairs: two proxies on different bodies whose collision bits meet (MuJoCo's ``contype``/``conaffinity``),
  except parent-child bodies (MuJoCo's parent filter), near relatives (an ancestor with at most one colliding
  link between: their proxies interlock at the joint) and the model's contact exclusions. Each keeps a
  clearance (:func:`pair_clearance`): the margin, or for proxies that already overlap in the neutral pose (an
  enclosing capsule is fatter than its mesh: the G1's arms hang against its torso) their rest gap plus the
  margin: they overlap at least the margin less than at rest. A collision (the metric) is a pair deeper than
  zero, or than its rest overlap.
* Source: a capsule of :data:`SOURCE_LIMB_RADIUS_M` around every bone that ends at a source body of a
  correspondence (after scaling to the robot); two bones that share no joint intersect when their gap is
  negative. A robot self-collision frame where the source also intersects is the source's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rotations as R

__all__ = [
    "CollisionCapsules",
    "robot_capsules",
    "self_collision_pairs",
    "pair_clearance",
    "collision_depth",
    "capsule_gaps",
    "source_intersections",
]

#: radius (m, after scaling) of the capsule around each source bone for the source's own intersections
SOURCE_LIMB_RADIUS_M = 0.035


@dataclass(frozen=True)
class CollisionCapsules:
    """Capsule proxies of a robot's collision geoms.

    Attributes:
        body: ``[K] int64`` layout body of each capsule.
        segment: ``[K, 2, 3] float64`` m, the axis end points in the body frame (equal for a sphere).
        radius: ``[K] float64`` m.
        kind: ``[K]`` the geom type each proxy stands for (``"sphere"``, ``"capsule"``, ..., ``"mesh"``).
        bits: ``[K, 2] int64`` MuJoCo's ``contype`` and ``conaffinity`` of the geom.
    """

    body: np.ndarray
    segment: np.ndarray
    radius: np.ndarray
    kind: tuple[str, ...]
    bits: np.ndarray

    @property
    def num_capsules(self) -> int:
        return int(self.body.shape[0])


def _enclosing_capsule(v: np.ndarray) -> tuple[np.ndarray, float]:
    """``(segment [2, 3], radius)`` of the least-volume enclosing capsule of points ``v [P, 3]`` among those
    along the three principal axes (for each axis: the radius is the largest distance from the axis line
    through the centroid, the end points as close as the points allow)."""
    c = v.mean(0)
    if v.shape[0] < 4:  # too few points for axes: their enclosing sphere about the centroid
        return np.stack([c, c]), float(np.linalg.norm(v - c, axis=-1).max())
    _, vecs = np.linalg.eigh(np.cov((v - c).T) + 1e-12 * np.eye(3))
    best = None
    for axis in vecs.T:
        t = (v - c) @ axis
        rho = np.linalg.norm((v - c) - t[:, None] * axis, axis=-1)
        r = float(rho.max())
        room = np.sqrt(np.maximum(r * r - rho * rho, 0.0))
        a, b = float((t + room).min()), float((t - room).max())
        if a > b:  # shorter than its width: a sphere about the middle
            m = 0.5 * (a + b)
            a = b = m
            r = float(np.linalg.norm(v - (c + m * axis), axis=-1).max())
        vol = np.pi * r * r * (b - a) + 4.0 / 3.0 * np.pi * r**3
        if best is None or vol < best[0]:
            best = (vol, np.stack([c + a * axis, c + b * axis]), r)
    return best[1], best[2]


def _mesh_capsules(model_path, layout) -> list[tuple[int, np.ndarray, float, tuple[int, int]]]:
    """Enclosing capsules of the colliding mesh geoms of an MJCF model (MuJoCo's compiled vertices)."""
    import mujoco

    m = mujoco.MjModel.from_xml_path(str(model_path))
    out = []
    names = set(layout.body_names)
    for g in range(m.ngeom):
        if m.geom_type[g] != mujoco.mjtGeom.mjGEOM_MESH or not (m.geom_contype[g] or m.geom_conaffinity[g]):
            continue
        body = m.body(m.geom_bodyid[g]).name
        if body not in names:
            continue
        mid = int(m.geom_dataid[g])
        v = np.asarray(m.mesh_vert[m.mesh_vertadr[mid] : m.mesh_vertadr[mid] + m.mesh_vertnum[mid]], dtype=np.float64)
        v = np.asarray(m.geom_pos[g]) + R.quat_rotate(np.asarray(m.geom_quat[g], dtype=np.float64), v)
        for seg, r in _mesh_proxy(v):
            out.append((layout.body_index(body), seg, r, (int(m.geom_contype[g]), int(m.geom_conaffinity[g]))))
    return out


def _mesh_proxy(v: np.ndarray, max_pieces: int = 3) -> list[tuple[np.ndarray, float]]:
    """Enclosing capsules of a vertex cloud: the least total volume among 1 to ``max_pieces`` slabs of equal
    length along its longest principal axis, each slab's vertices enclosed by its own capsule; a further piece
    must cut the volume by a fifth (it adds pairs)."""
    c = v.mean(0)
    _, vecs = np.linalg.eigh(np.cov((v - c).T) + 1e-12 * np.eye(3))
    t = (v - c) @ vecs[:, -1]
    best, best_vol = None, np.inf
    for k in range(1, max_pieces + 1):
        edges = np.linspace(t.min(), t.max(), k + 1)
        piece = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, k - 1)
        caps = [_enclosing_capsule(v[piece == i]) for i in range(k) if (piece == i).any()]
        vol = sum(np.pi * r * r * np.linalg.norm(sg[1] - sg[0]) + 4.0 / 3.0 * np.pi * r**3 for sg, r in caps)
        if vol < 0.8 * best_vol:
            best, best_vol = caps, vol
    return best


def robot_capsules(desc, layout, model_path=None) -> CollisionCapsules:
    """The capsule proxies of every colliding geom of ``desc`` (see the module docstring); mesh geoms need the
    MJCF ``model_path`` (without it, or for another format, they are left out)."""
    from ..asset.desc import GeomType

    body, seg, rad, kind, bits = [], [], [], [], []
    for g in () if desc is None else desc.geoms:
        if g.body < 0 or not g.collides or g.type in (GeomType.PLANE, GeomType.MESH):
            continue
        c, qg, size = np.asarray(g.pos, float), np.asarray(g.quat_wxyz, float), np.asarray(g.size, float)
        if g.type is GeomType.SPHERE:
            s, r = np.stack([c, c]), size[0]
        elif g.type in (GeomType.CAPSULE, GeomType.CYLINDER):  # a cylinder's rims lie on its caps' spheres
            ax = R.quat_rotate(qg, np.array([0.0, 0.0, size[1]]))
            s, r = np.stack([c - ax, c + ax]), size[0]
        elif g.type is GeomType.BOX:
            corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) * size
            s, r = _enclosing_capsule(c + R.quat_rotate(qg, corners))
        else:  # ellipsoid
            s, r = np.stack([c, c]), size.max()
        body.append(g.body)
        seg.append(np.asarray(s, float))
        rad.append(float(r))
        kind.append(g.type.value)
        bits.append((g.contype, g.conaffinity))
    if model_path is not None and str(model_path).lower().endswith(".xml") and desc is not None:
        if any(g.type is GeomType.MESH and g.collides and g.body >= 0 for g in desc.geoms):
            for b, s, r, bt in _mesh_capsules(model_path, layout):
                body.append(b)
                seg.append(s)
                rad.append(r)
                kind.append("mesh")
                bits.append(bt)
    return CollisionCapsules(
        body=np.array(body, dtype=np.int64),
        segment=np.array(seg, dtype=np.float64).reshape(-1, 2, 3),
        radius=np.array(rad, dtype=np.float64),
        kind=tuple(kind),
        bits=np.array(bits, dtype=np.int64).reshape(-1, 2),
    )


def capsule_gaps(
    layout, q, caps: CollisionCapsules, pairs: np.ndarray, *, within: float = np.inf, fk=None
) -> np.ndarray:
    """``[frames, C]`` m: the gap between the two capsules of each pair at ``q [frames, nq]`` (negative: they
    intersect), from our forward kinematics. With ``within``, gaps whose bounding spheres are further apart than
    that are not computed exactly and read ``+inf`` (a broad phase: only the sign near contact matters).
    ``fk``: ``(body positions [frames, B, 3], body rotations wxyz [frames, B, 4])`` at ``q`` if already known."""
    import torch

    from ..animation.layout import forward_kinematics
    from .solver import bounding_gaps, capsules_world, pair_distances

    if pairs.size == 0:
        return np.zeros((q.shape[0], 0))
    p, r = forward_kinematics(layout, np.asarray(q, dtype=np.float64)) if fk is None else fk
    t = torch.as_tensor
    seg = capsules_world(t(p), t(r), t(caps.body), t(caps.segment))
    pr, rad = t(pairs), t(caps.radius)
    if not np.isfinite(within):
        return pair_distances(seg, pr, rad)[0].numpy()
    out = torch.full((q.shape[0], pairs.shape[0]), np.inf, dtype=seg.dtype)
    near = torch.nonzero(bounding_gaps(seg, pr, rad).amin(0) < within)[:, 0]
    if near.numel():
        out[:, near] = pair_distances(seg, pr[near], rad)[0]
    return out.numpy()


def _near_relatives(bi: np.ndarray, bj: np.ndarray, parents: np.ndarray, colliding: set) -> np.ndarray:
    """``[C] bool``: one body is an ancestor of the other with at most one colliding body between them (a
    grandparent, or an ancestor across links without geoms such as the G1's waist): their relative motion is
    one or two joints right at the contact, and their proxies overlap where the meshes fit into each other."""
    out = np.zeros(bi.shape[0], dtype=bool)
    for k, (a, b) in enumerate(zip(bi.tolist(), bj.tolist())):  # once per model, over pairs
        for lo, hi in ((a, b), (b, a)):
            between, x = 0, parents[lo]
            while x >= 0 and x != hi:
                between += x in colliding
                x = parents[x]
            if x == hi and between <= 1:
                out[k] = True
    return out


def self_collision_pairs(desc, layout, caps: CollisionCapsules) -> tuple[np.ndarray, np.ndarray]:
    """``(pairs [C, 2] int64 capsule indices, rest_gap [C] m)``: the pairs that may touch and their gap in the
    neutral pose (negative where the proxies of neighbouring links overlap although their geoms do not)."""
    k = caps.num_capsules
    if k < 2:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    i, j = np.triu_indices(k, 1)
    bi, bj = caps.body[i], caps.body[j]
    parents = np.asarray(layout.parent_indices)
    ok = bi != bj
    ok &= (parents[bi] != bj) & (parents[bj] != bi)
    ok &= ~_near_relatives(bi, bj, parents, set(caps.body.tolist()))
    ok &= ((caps.bits[i, 0] & caps.bits[j, 1]) | (caps.bits[j, 0] & caps.bits[i, 1])) != 0
    excl = set()
    for a, b in getattr(desc, "contact_exclusions", ()) or ():
        if a in layout.body_names and b in layout.body_names:
            excl.add(frozenset((layout.body_index(a), layout.body_index(b))))
    if excl:
        ok &= np.array([frozenset((int(a), int(b))) not in excl for a, b in zip(bi, bj)], dtype=bool)
    pairs = np.stack([i[ok], j[ok]], 1).astype(np.int64)
    rest = capsule_gaps(layout, layout.neutral()[None], caps, pairs)[0]
    return pairs, rest


def pair_clearance(rest_gap: np.ndarray, margin: float) -> np.ndarray:
    """``[C]`` m: the gap each pair keeps, ``min(margin, rest_gap + margin)`` (see the module docstring)."""
    return np.minimum(margin, np.asarray(rest_gap) + margin)


def collision_depth(gap: np.ndarray, rest_gap: np.ndarray) -> np.ndarray:
    """``[..., C]`` m: how far each pair is deeper than allowed (``min(0, rest_gap)``); positive: a collision."""
    return np.minimum(0.0, np.asarray(rest_gap)) - gap


def source_intersections(
    pos: np.ndarray, rest_pos: np.ndarray, parents, bones, *, radius: float = SOURCE_LIMB_RADIUS_M
) -> np.ndarray:
    """``[frames] bool``: two bones of the source (capsules of ``radius`` m) that share no joint and are apart in
    the rest pose intersect.

    Args:
        pos: ``[frames, joints, 3]`` m, the source joint positions (scaled to the robot).
        rest_pos: ``[joints, 3]`` m, the rest pose (same scale); pairs touching there are left out (the
            clavicles meeting at the spine).
        parents: ``[joints]`` parent index of each joint (-1: root).
        bones: joints whose bone (from its parent) is a capsule; roots are skipped.
    """
    import torch

    from .solver import segment_closest_points

    parents = np.asarray(parents)
    b = np.array([j for j in dict.fromkeys(int(x) for x in bones) if parents[j] >= 0], dtype=np.int64)
    if b.size < 2:
        return np.zeros(pos.shape[0], dtype=bool)
    ends = np.stack([parents[b], b], 1)  # [K, 2] joints
    i, j = np.triu_indices(b.size, 1)
    share = (ends[i][:, :, None] == ends[j][:, None, :]).any((1, 2))
    i, j = i[~share], j[~share]
    if i.size == 0:
        return np.zeros(pos.shape[0], dtype=bool)

    def gaps(p):  # [N, pairs]
        seg = torch.as_tensor(np.ascontiguousarray(p[:, ends]))  # [N, K, 2, 3]
        pa, pb = segment_closest_points(seg[:, i, 0], seg[:, i, 1], seg[:, j, 0], seg[:, j, 1])
        return (torch.linalg.norm(pa - pb, dim=-1) - 2.0 * radius).numpy()

    apart = gaps(np.asarray(rest_pos, dtype=np.float64)[None])[0] >= 0
    if not apart.any():
        return np.zeros(pos.shape[0], dtype=bool)
    i, j = i[apart], j[apart]
    pos = np.asarray(pos, dtype=np.float32)  # mm-exact at human scale, half the work of float64
    # broad phase: pairs whose bones' bounding spheres never meet cannot intersect
    mid = 0.5 * (pos[:, ends[:, 0]] + pos[:, ends[:, 1]])  # [N, K, 3]
    reach = 0.5 * np.linalg.norm(pos[:, ends[:, 1]] - pos[:, ends[:, 0]], axis=-1) + radius  # [N, K]
    near = (np.linalg.norm(mid[:, i] - mid[:, j], axis=-1) < reach[:, i] + reach[:, j]).any(0)
    if not near.any():
        return np.zeros(pos.shape[0], dtype=bool)
    i, j = i[near], j[near]
    return (gaps(pos) < 0).any(1)

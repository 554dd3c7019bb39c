"""The skeleton retarget's per-frame passes as compiled loops (numba), for :mod:`.skeleton`.

A clip of a batch is short (tens to hundreds of frames over ~30 bodies): in numpy its cost is the number of array
operations (a few microseconds each, ~150 per clip), not the arithmetic. These kernels run the same formulas as
the numpy paths of :mod:`.skeleton` frame by frame in one call each (no Python loop per frame, no temporaries):

* :func:`mapped_local_rotations`: source world rotations -> target world rotations (``world_map``) -> hinge
  projection (``_apply_hinges``) -> target local rotations (``_Plan.local_rotation``);
* :func:`lowest_points`: the lowest point of every collision geom and bare body origin per frame
  (``_GroundGeoms.lowest``).

Same formulas in the same order as the numpy paths (rotation matrices from the quaternion's quadratic form, as
``_MATRIX`` gives them), so the results equal them to float64 rounding (``~1e-15``; the tests compare both).
This module imports numba at import time: :mod:`.skeleton` imports it lazily (``_kernels()``) and keeps the numpy
paths where numba is missing.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["lowest_points", "mapped_local_rotations"]

_PI = math.pi
_TWO_PI = 2.0 * math.pi
_TINY = np.finfo(np.float64).eps ** 2
_STRAIGHT = 1e-18  # |u x v|^2 / |v|^2 at or under which the wanted child bone lies on the parent's bone


@njit(cache=True, inline="always")
def _qmul(aw, ax, ay, az, bw, bx, by, bz):
    return (
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    )


@njit(cache=True, inline="always")
def _rotate(w, x, y, z, vx, vy, vz):
    """``R(q) v`` with ``R`` the quaternion's quadratic form (``_MATRIX``: exact rotation for unit ``q``)."""
    ww, xx, yy, zz = w * w, x * x, y * y, z * z
    xy, xz, yz, wx, wy, wz = x * y, x * z, y * z, w * x, w * y, w * z
    return (
        (ww + xx - yy - zz) * vx + 2.0 * (xy - wz) * vy + 2.0 * (xz + wy) * vz,
        2.0 * (xy + wz) * vx + (ww - xx + yy - zz) * vy + 2.0 * (yz - wx) * vz,
        2.0 * (xz - wy) * vx + 2.0 * (yz + wx) * vy + (ww - xx - yy + zz) * vz,
    )


@njit(cache=True, inline="always")
def _wrap(x):
    """``rotations.wrap_angle`` of one float64 (into ``(-pi, pi]``)."""
    y = x + (-_TWO_PI) * np.rint(x * (1.0 / _TWO_PI))
    if y > _PI:
        y -= _TWO_PI
    elif y <= -_PI:
        y += _TWO_PI
    return y


@njit(cache=True, error_model="numpy")
def mapped_local_rotations(
    src_rot,  # [T, ns, 4] source world rotations (any float dtype)
    source_index,  # [M] source node of each mapped slot
    world_map,  # [M, 4, 4] row-vector maps: G = Gs @ world_map
    hinge_parent,  # [S] slots (empty: no hinges)
    hinge_body,  # [S]
    rest,  # [S, 4]
    bone,  # [S, 3]
    rest_axis,  # [S, 4]
    child_fixed,  # [S, 3]
    child_cos,  # [S, 3]
    child_sin,  # [S, 3]
    child,  # [S, 3]
    twist,  # [S, 4, 2]
    hC,  # [S]
    rho,  # [S]
    base,  # [S]
    lo,  # [S]
    hi,  # [S]
    ancestor,  # [M - 1] slot of the nearest mapped ancestor of slots 1..M-1
    chain_of_slot,  # [M] row of chain_map for a slot (-1: none)
    chain_map,  # [C, 4, 4]
    mapped_index,  # [M] target body of each slot
    tpose_local,  # [n, 4]
    local,  # out [T, n, 4] float64
):
    T = src_rot.shape[0]
    M = source_index.shape[0]
    n = tpose_local.shape[0]
    S = hinge_parent.shape[0]
    G = np.empty((M, 4))
    m = np.empty(4)
    for t in range(T):
        for k in range(M):  # world rotations of the mapped bodies, unit
            s = source_index[k]
            for i in range(4):
                acc = 0.0
                for j in range(4):
                    acc += np.float64(src_rot[t, s, j]) * world_map[k, j, i]
                G[k, i] = acc
            norm = math.sqrt(G[k, 0] * G[k, 0] + G[k, 1] * G[k, 1] + G[k, 2] * G[k, 2] + G[k, 3] * G[k, 3])
            for i in range(4):
                G[k, i] /= norm
        for h in range(S):  # hinge projection (see skeleton._apply_hinges)
            p, b = hinge_parent[h], hinge_body[h]
            pw, px, py, pz = G[p, 0], G[p, 1], G[p, 2], G[p, 3]
            Xw, Xx, Xy, Xz = _qmul(pw, -px, -py, -pz, G[b, 0], G[b, 1], G[b, 2], G[b, 3])
            vx, vy, vz = _rotate(Xw, Xx, Xy, Xz, child[h, 0], child[h, 1], child[h, 2])
            vu = vx * bone[h, 0] + vy * bone[h, 1] + vz * bone[h, 2]
            r = (vu - hC[h]) / rho[h]
            delta = math.acos(min(max(r, -1.0), 1.0))
            jw = Xw * twist[h, 0, 0] + Xx * twist[h, 1, 0] + Xy * twist[h, 2, 0] + Xz * twist[h, 3, 0]
            ja = Xw * twist[h, 0, 1] + Xx * twist[h, 1, 1] + Xy * twist[h, 2, 1] + Xz * twist[h, 3, 1]
            th0 = 0.0 if math.hypot(jw, ja) <= _TINY else 2.0 * math.atan2(ja, jw)
            b0, b1 = base[h] + delta, base[h] - delta
            t0, t1 = _wrap(b0), _wrap(b1)
            o0, o1 = abs(_wrap(b0 - th0)), abs(_wrap(b1 - th0))
            c0 = (max(lo[h] - t0, 0.0) + max(t0 - hi[h], 0.0)) * 1e3 + o0
            c1 = (max(lo[h] - t1, 0.0) + max(t1 - hi[h], 0.0)) * 1e3 + o1
            pick = t1 if c1 < c0 else t0
            ch, sh = math.cos(0.5 * pick), math.sin(0.5 * pick)
            rjw = ch * rest[h, 0] + sh * rest_axis[h, 0]
            rjx = ch * rest[h, 1] + sh * rest_axis[h, 1]
            rjy = ch * rest[h, 2] + sh * rest_axis[h, 2]
            rjz = ch * rest[h, 3] + sh * rest_axis[h, 3]
            cp, sp = math.cos(pick), math.sin(pick)
            wx = child_fixed[h, 0] + cp * child_cos[h, 0] + sp * child_sin[h, 0]
            wy = child_fixed[h, 1] + cp * child_cos[h, 1] + sp * child_sin[h, 1]
            wz = child_fixed[h, 2] + cp * child_cos[h, 2] + sp * child_sin[h, 2]
            ux, uy, uz = bone[h, 0], bone[h, 1], bone[h, 2]
            wu = wx * ux + wy * uy + wz * uz
            cx, cy, cz = uy * wz - uz * wy, uz * wx - ux * wz, ux * wy - uy * wx  # u x w
            phi = math.atan2(cx * vx + cy * vy + cz * vz, wx * vx + wy * vy + wz * vz - wu * vu)
            sx, sy, sz = uy * vz - uz * vy, uz * vx - ux * vz, ux * vy - uy * vx  # u x v
            if sx * sx + sy * sy + sz * sz <= _STRAIGHT * (vx * vx + vy * vy + vz * vz):
                phi = 0.0  # the child on the bone's line: no twist to find (the angle would be rounding noise)
            qw, qx, qy, qz = _qmul(pw, px, py, pz, 0.0, ux, uy, uz)  # Gp (0, u)
            cf, sf = math.cos(0.5 * phi), math.sin(0.5 * phi)
            nw, nx, ny, nz = cf * pw + sf * qw, cf * px + sf * qx, cf * py + sf * qy, cf * pz + sf * qz
            G[p, 0], G[p, 1], G[p, 2], G[p, 3] = nw, nx, ny, nz
            G[b, 0], G[b, 1], G[b, 2], G[b, 3] = _qmul(nw, nx, ny, nz, rjw, rjx, rjy, rjz)
        for j in range(n):  # unmapped bodies at their T-pose local rotation
            for i in range(4):
                local[t, j, i] = tpose_local[j, i]
        for k in range(M):  # a mapped body relative to its mapped ancestor (through the T-pose chain between)
            if k == 0:
                m[0], m[1], m[2], m[3] = G[0, 0], G[0, 1], G[0, 2], G[0, 3]
            else:
                a = ancestor[k - 1]
                m[0], m[1], m[2], m[3] = _qmul(
                    G[a, 0], -G[a, 1], -G[a, 2], -G[a, 3], G[k, 0], G[k, 1], G[k, 2], G[k, 3]
                )
                c = chain_of_slot[k]
                if c >= 0:
                    m0, m1, m2, m3 = m[0], m[1], m[2], m[3]
                    for i in range(4):
                        m[i] = m0 * chain_map[c, 0, i] + m1 * chain_map[c, 1, i] + m2 * chain_map[c, 2, i]
                        m[i] += m3 * chain_map[c, 3, i]
            norm = math.sqrt(m[0] * m[0] + m[1] * m[1] + m[2] * m[2] + m[3] * m[3])
            j = mapped_index[k]
            for i in range(4):
                local[t, j, i] = m[i] / norm


@njit(cache=True, error_model="numpy")
def lowest_points(
    body_pos,  # [T, n, 3] m
    body_rot,  # [T, n, 4] WXYZ
    geom_body,  # [G] body of each geom
    geom_map,  # [G, 3, 4]
    linear,  # [G, 3]
    radius,  # [G]
    disc,  # [G] (zeros: no cylinder)
    ellipsoid,  # [G, 3] (zeros: no ellipsoid)
    bare,  # [B] bodies without a usable geom
    low,  # out [T]
):
    T = body_pos.shape[0]
    for t in range(T):
        best = np.inf
        for g in range(geom_body.shape[0]):
            b = geom_body[g]
            w, x, y, z = body_rot[t, b, 0], body_rot[t, b, 1], body_rot[t, b, 2], body_rot[t, b, 3]
            r0 = 2.0 * (x * z - w * y)  # third row of world_from_body (the quadratic form, as _MATRIX)
            r1 = 2.0 * (y * z + w * x)
            r2 = w * w - x * x - y * y + z * z
            o0 = r0 * geom_map[g, 0, 0] + r1 * geom_map[g, 1, 0] + r2 * geom_map[g, 2, 0]
            o1 = r0 * geom_map[g, 0, 1] + r1 * geom_map[g, 1, 1] + r2 * geom_map[g, 2, 1]
            o2 = r0 * geom_map[g, 0, 2] + r1 * geom_map[g, 1, 2] + r2 * geom_map[g, 2, 2]
            o3 = r0 * geom_map[g, 0, 3] + r1 * geom_map[g, 1, 3] + r2 * geom_map[g, 2, 3]
            extent = abs(o0) * linear[g, 0] + abs(o1) * linear[g, 1] + abs(o2) * linear[g, 2] + radius[g]
            if disc[g] != 0.0:
                extent += disc[g] * math.sqrt(min(max(1.0 - o2 * o2, 0.0), 1.0))
            e0, e1, e2 = o0 * ellipsoid[g, 0], o1 * ellipsoid[g, 1], o2 * ellipsoid[g, 2]
            if e0 != 0.0 or e1 != 0.0 or e2 != 0.0:
                extent += math.sqrt(e0 * e0 + e1 * e1 + e2 * e2)
            v = (body_pos[t, b, 2] + o3) - extent
            if v < best:
                best = v
        for i in range(bare.shape[0]):
            v = body_pos[t, bare[i], 2]
            if v < best:
                best = v
        low[t] = best

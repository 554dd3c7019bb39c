"""The skeleton retarget's per-frame passes as compiled loops (numba), for :mod:`.skeleton`.

A clip of a batch is short (tens to hundreds of frames over ~30 bodies): in numpy its cost is the number of array
operations (a few microseconds each, ~150 per clip), not the arithmetic. These kernels run the same formulas as
the numpy paths of :mod:`.skeleton` frame by frame in one call each (no Python loop per frame, no temporaries):

* :func:`mapped_local_rotations`: source world rotations -> target world rotations (``world_map``) -> hinge
  projection (``_apply_hinges``) -> target local rotations (``_Plan.local_rotation``);
* :func:`level_pitches`: the feet's sole-levelling pitches (``_level_feet``), applied to the local rotations and
  to the world poses at and below each foot;
* :func:`lowest_points`: the lowest point of every collision geom and bare body origin per frame
  (``_GroundGeoms.lowest``); :func:`rolling_ground`: its running minimum and mean (``GroundFix.ROLLING_MIN``).

Same formulas in the same order as the numpy paths (rotation matrices from the quaternion's quadratic form, as
``_MATRIX`` gives them), so the results equal them to float64 rounding (``~1e-15``; the tests compare both).
This module imports numba at import time: :mod:`.skeleton` imports it lazily (``_kernels()``) and keeps the numpy
paths where numba is missing.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..animation._quat_scalars import qmul as _qmul
from ..animation._quat_scalars import wrap as _wrap

__all__ = ["level_pitches", "lowest_points", "mapped_local_rotations", "rolling_ground"]

_PI = math.pi
_TWO_PI = 2.0 * math.pi
_TINY = np.finfo(np.float64).eps ** 2
_STRAIGHT = 1e-18  # |u x v|^2 / |v|^2 at or under which the wanted child bone lies on the parent's bone


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


@njit(cache=True)
def _sole_world(pos, rot, point_body, point_local):
    """``[T, P, 3]`` world positions of the sole points (``point_local [P, 3]`` in their bodies' frames)."""
    T, P = pos.shape[0], point_body.shape[0]
    world = np.empty((T, P, 3))
    for t in range(T):
        for p in range(P):
            b = point_body[p]
            w, x, y, z = rot[t, b, 0], rot[t, b, 1], rot[t, b, 2], rot[t, b, 3]
            rx, ry, rz = _rotate(w, x, y, z, point_local[p, 0], point_local[p, 1], point_local[p, 2])
            world[t, p, 0] = pos[t, b, 0] + rx
            world[t, p, 1] = pos[t, b, 1] + ry
            world[t, p, 2] = pos[t, b, 2] + rz
    return world


@njit(cache=True)
def _stance(world, pos, fps, fb, first, last, radius, stance_height, stance_speed):
    """``[T]`` bool: the frames where the foot (body ``fb``, sole points ``first:last``) stands: its lowest contact
    within ``stance_height`` of its lowest over the clip, its origin slower than ``stance_speed`` horizontally (the
    larger of the speeds before and after the frame)."""
    T = world.shape[0]
    low = np.empty(T)
    for t in range(T):
        m = np.inf
        for p in range(first, last):
            m = min(m, world[t, p, 2] - radius[p])
        low[t] = m
    floor = low.min()
    stance = np.zeros(T, dtype=np.bool_)
    for t in range(T):
        speed = 0.0
        if T > 1:
            a = t if t < T - 1 else T - 2
            c = t - 1 if t > 0 else 0
            va = math.hypot(pos[a + 1, fb, 0] - pos[a, fb, 0], pos[a + 1, fb, 1] - pos[a, fb, 1]) * fps
            vc = math.hypot(pos[c + 1, fb, 0] - pos[c, fb, 0], pos[c + 1, fb, 1] - pos[c, fb, 1]) * fps
            speed = max(va, vc)
        stance[t] = (low[t] < floor + stance_height) and (speed < stance_speed)
    return stance


@njit(cache=True)
def _rear_front(world, pos, stance, inv, fb, toe, first, last):
    """``(fx, fy, rear, front)``: the walking direction (the principal axis of the sole points about each stance
    frame's mean, toward the toe) and the rearmost and frontmost sole points along it (mean over the stance
    frames)."""
    T, npts = world.shape[0], last - first
    c00 = c01 = c11 = 0.0
    toe_x = toe_y = 0.0
    for t in range(T):
        if not stance[t]:
            continue
        mx = my = 0.0
        for p in range(first, last):
            mx += world[t, p, 0] / npts
            my += world[t, p, 1] / npts
        s00 = s01 = s11 = 0.0
        for p in range(first, last):
            dx, dy = world[t, p, 0] - mx, world[t, p, 1] - my
            s00 += dx * dx
            s01 += dx * dy
            s11 += dy * dy
        c00 += inv * s00
        c01 += inv * s01
        c11 += inv * s11
        toe_x += inv * (pos[t, toe, 0] - pos[t, fb, 0])
        toe_y += inv * (pos[t, toe, 1] - pos[t, fb, 1])
    angle = 0.5 * math.atan2(2.0 * c01, c00 - c11)
    fx, fy = math.cos(angle), math.sin(angle)
    if toe_x * fx + toe_y * fy < 0:
        fx, fy = -fx, -fy
    rear, front, amin, amax = first, first, np.inf, -np.inf
    for p in range(first, last):
        along = 0.0
        for t in range(T):
            if stance[t]:
                along += inv * (world[t, p, 0] * fx + world[t, p, 1] * fy)
        if along < amin:
            amin, rear = along, p
        if along > amax:
            amax, front = along, p
    return fx, fy, rear, front


@njit(cache=True)
def _lateral_axis(rot, stance, inv, fb, fx, fy):
    """The unit lateral axis ``(-fy, fx, 0)`` in the foot frame, the mean over the stance frames of
    ``R_foot^T lateral`` (the row-vector product ``lateral R``)."""
    lx, ly = -fy, fx
    ax = ay = az = 0.0
    for t in range(rot.shape[0]):
        if stance[t]:
            w, x, y, z = rot[t, fb, 0], rot[t, fb, 1], rot[t, fb, 2], rot[t, fb, 3]
            ax += inv * ((w * w + x * x - y * y - z * z) * lx + 2.0 * (x * y + w * z) * ly)
            ay += inv * (2.0 * (x * y - w * z) * lx + (w * w - x * x + y * y - z * z) * ly)
            az += inv * (2.0 * (x * z + w * y) * lx + 2.0 * (y * z - w * x) * ly)
    norm = max(math.sqrt(ax * ax + ay * ay + az * az), 1e-300)
    return ax / norm, ay / norm, az / norm


@njit(cache=True)
def _tilt_rows(world, pos, rot, stance, fb, rear, front, radius, ax, ay, az, coef):
    """Fill ``coef [3, count]`` with the rear-minus-front sole height ``k0 + k1 cos + k2 sin`` of the foot's pitch
    at each stance frame (see ``skeleton._tilt_coefficients``: ``g`` the world up axis in the foot frame, ``v``
    the sole point in the foot frame, ``a`` the axis: ``k0 = oz + (g.a)(a.v) - radius``, ``k1 = g.v - (g.a)(a.v)``,
    ``k2 = v.(g x a)``)."""
    i = 0
    for t in range(world.shape[0]):
        if not stance[t]:
            continue
        w, x, y, z = rot[t, fb, 0], rot[t, fb, 1], rot[t, fb, 2], rot[t, fb, 3]
        gx, gy, gz = 2.0 * (x * z - w * y), 2.0 * (y * z + w * x), w * w - x * x - y * y + z * z
        ga = gx * ax + gy * ay + gz * az
        k0 = k1 = k2 = 0.0
        for q in range(2):
            p = rear if q == 0 else front
            ox, oy = world[t, p, 0] - pos[t, fb, 0], world[t, p, 1] - pos[t, fb, 1]
            oz = world[t, p, 2] - pos[t, fb, 2]
            vx, vy, vz = _rotate(w, -x, -y, -z, ox, oy, oz)  # R^T (point - origin)
            va = vx * ax + vy * ay + vz * az
            sign = 1.0 if q == 0 else -1.0
            k0 += sign * (ga * va + pos[t, fb, 2] - radius[p])
            k1 += sign * ((gx * vx + gy * vy + gz * vz) - ga * va)
            k2 += sign * (vx * (gy * az - gz * ay) + vy * (gz * ax - gx * az) + vz * (gx * ay - gy * ax))
        coef[0, i], coef[1, i], coef[2, i] = k0, k1, k2
        i += 1


@njit(cache=True)
def _median_tilt(coef, count, theta, buf):
    """The median over the ``count`` stance frames of ``k0 + cos(theta) k1 + sin(theta) k2`` (``coef [3, T]``;
    the mean of the middle pair, as ``np.median``)."""
    c, s = math.cos(theta), math.sin(theta)
    for i in range(count):
        buf[i] = coef[0, i] + c * coef[1, i] + s * coef[2, i]
    b = np.sort(buf[:count])
    return 0.5 * (b[(count - 1) // 2] + b[count // 2])


@njit(cache=True)
def _bisect(coef, count, lo, hi, steps, per_call, buf):
    """``(root, f(lo), f(hi))`` of the median tilt in ``[lo, hi]``: ``skeleton._bisect_rows`` for one row (the same
    grid points ``lo + (hi - lo) j / 2**per_call`` of each round, evaluated only where the bisection looks), then
    the zero of the line through the final bracket's ends."""
    f_lo = _median_tilt(coef, count, lo + (hi - lo) * 0.0, buf)
    f_hi = _median_tilt(coef, count, lo + (hi - lo) * 1.0, buf)
    end_lo, end_hi = f_lo, f_hi
    left = steps
    while left > 0:
        kk = min(per_call, left)
        n = 1 << kk
        a, b, fa, fb = 0, n, f_lo, f_hi
        sa = (fa > 0) - (fa < 0)
        new_lo, new_hi = lo, hi
        for _ in range(kk):
            mid = (a + b) >> 1
            point = lo + (hi - lo) * (mid / n)
            fm = _median_tilt(coef, count, point, buf)
            if (fm > 0) - (fm < 0) == sa:
                a, fa, new_lo = mid, fm, point
            else:
                b, fb, new_hi = mid, fm, point
        lo, hi, f_lo, f_hi = new_lo, new_hi, fa, fb
        left -= kk
    tt = f_lo / (f_lo - f_hi) if f_hi != f_lo else 0.5
    return lo + min(max(tt, 0.0), 1.0) * (hi - lo), end_lo, end_hi


@njit(cache=True)
def _apply_pitch(pos, rot, local, fb, subtree, qw, qx, qy, qz):
    """``local[:, fb] *= q`` and the world poses at and below body ``fb`` (``subtree [n]``) moved to match: each by
    ``C = W_fb q W_fb^-1`` about the foot's origin (``W_fb`` itself becomes ``W_fb q``)."""
    for t in range(pos.shape[0]):
        local[t, fb, 0], local[t, fb, 1], local[t, fb, 2], local[t, fb, 3] = _qmul(
            local[t, fb, 0], local[t, fb, 1], local[t, fb, 2], local[t, fb, 3], qw, qx, qy, qz
        )
        w, x, y, z = rot[t, fb, 0], rot[t, fb, 1], rot[t, fb, 2], rot[t, fb, 3]
        aw, ax, ay, az = _qmul(w, x, y, z, qw, qx, qy, qz)
        cw, cx, cy, cz = _qmul(aw, ax, ay, az, w, -x, -y, -z)
        ox, oy, oz = pos[t, fb, 0], pos[t, fb, 1], pos[t, fb, 2]
        for b in range(pos.shape[1]):
            if not subtree[b]:
                continue
            if b == fb:
                rot[t, b, 0], rot[t, b, 1], rot[t, b, 2], rot[t, b, 3] = aw, ax, ay, az
                continue
            rot[t, b, 0], rot[t, b, 1], rot[t, b, 2], rot[t, b, 3] = _qmul(
                cw, cx, cy, cz, rot[t, b, 0], rot[t, b, 1], rot[t, b, 2], rot[t, b, 3]
            )
            dx, dy, dz = _rotate(cw, cx, cy, cz, pos[t, b, 0] - ox, pos[t, b, 1] - oy, pos[t, b, 2] - oz)
            pos[t, b, 0], pos[t, b, 1], pos[t, b, 2] = ox + dx, oy + dy, oz + dz


@njit(cache=True, error_model="numpy")
def level_pitches(
    pos,  # [T, n, 3] target body positions, m (updated in place)
    rot,  # [T, n, 4] target world rotations (updated in place)
    fps,
    foot,  # [F] foot bodies
    toe_or_foot,  # [F]
    point_body,  # [P]
    point_local,  # [P, 3]
    radius,  # [P]
    start,  # [F + 1]
    stance_height,
    stance_speed,
    pitch_range,
    steps,
    per_call,
    subtree,  # [F, n] bool: the bodies at and below each foot
    local,  # [T, n, 4] float64 local rotations: each levelled foot's gets its pitch (in place)
    theta_out,  # out [F] pitch (rad)
):
    """``skeleton._level_feet`` for feet that all have toe points (the walking direction toward the toe): per foot,
    ``theta_out``; returns ``[F]`` int8: 1 where the foot is levelled, else 0. Same steps, same order of operations
    as the numpy path (see there for what each one does). Each levelled foot's local rotation is multiplied by its
    pitch (``local * exp(axis theta)``), and the world poses ``pos``, ``rot`` of the bodies at and below it are
    updated in place to what forward kinematics of the new local rotations gives (the world rotation
    ``C = W_foot exp(axis theta) W_foot^-1`` about the foot's origin), feet in body order (an ancestor first)."""
    T, F = pos.shape[0], foot.shape[0]
    world = _sole_world(pos, rot, point_body, point_local)
    done = np.zeros(F, dtype=np.int8)
    axis = np.zeros((F, 3))
    buf = np.empty(T)
    coef = np.empty((3, T))
    for f in range(F):  # every pitch from the poses before any levelling
        first, last, fb = start[f], start[f + 1], foot[f]
        stance = _stance(world, pos, fps, fb, first, last, radius, stance_height, stance_speed)
        count = int(stance.sum())
        if count < 3 or last - first < 2:
            continue
        inv = 1.0 / count
        fx, fy, rear, front = _rear_front(world, pos, stance, inv, fb, toe_or_foot[f], first, last)
        ax, ay, az = _lateral_axis(rot, stance, inv, fb, fx, fy)
        axis[f, 0], axis[f, 1], axis[f, 2] = ax, ay, az
        _tilt_rows(world, pos, rot, stance, fb, rear, front, radius, ax, ay, az, coef)
        theta, end_lo, end_hi = _bisect(coef, count, -pitch_range, pitch_range, steps, per_call, buf)
        theta_out[f] = theta
        if np.sign(end_lo) != np.sign(end_hi):  # else no level pitch within range: left
            done[f] = 1
    for f in np.argsort(foot):  # ancestors first: the later corrections see the earlier ones
        if done[f]:
            half = 0.5 * theta_out[f]
            sh = math.sin(half)
            _apply_pitch(
                pos, rot, local, foot[f], subtree[f], math.cos(half), sh * axis[f, 0], sh * axis[f, 1], sh * axis[f, 2]
            )
    return done


@njit(cache=True, error_model="numpy")
def rolling_ground(low, width, out):
    """``out [T]``: the running minimum of ``low [T]`` over ``width`` (odd) frames, then the running mean of that
    over the same window, the ends repeated (``scipy.ndimage.minimum_filter1d`` then ``uniform_filter1d``, both
    ``mode="nearest"``; the mean summed directly, equal to scipy's running sum to rounding)."""
    T = low.shape[0]
    h = width // 2
    m = np.empty(T)
    for i in range(T):
        v = np.inf
        for j in range(i - h, i + h + 1):
            v = min(v, low[min(max(j, 0), T - 1)])
        m[i] = v
    for i in range(T):
        acc = 0.0
        for j in range(i - h, i + h + 1):
            acc += m[min(max(j, 0), T - 1)]
        out[i] = acc / width

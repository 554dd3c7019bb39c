"""The mapper's whole motion pass for mixed hinge layouts as one compiled call (numba), for :mod:`.mapper`.

A layout like dm_control's CMU humanoid has bodies with one, two and three hinges, rest rotations and narrow
limits: in numpy, one clip costs some 250 small array operations whatever its length (a one-second clip at 30 fps
is 30 frames), so the per-call overhead of numpy is the cost. :func:`map_motion` runs the same formulas as the numpy
path of :class:`~kangengine.animation.ArticulationMotionMapper` frame by frame in one call per clip:

* the free root (position; the normalised quaternion, ``w >= 0`` at frame 0, then sign-continuous);
* bodies without joints (residual = the angle of ``rest^-1 * local``);
* per hinge body, ``J = rest^-1 * local`` and: 1 hinge, swing-twist (``_solve_hinge1``); 2 hinges, the closed
  form best fit (``_solve_hinge2``; the chain residual when the axes are not perpendicular); 3 hinges about
  ``+-e_i, +-e_j, +-e_k``, the intrinsic Euler angles of ``J`` times the axis signs (``rotations.quat_to_euler``,
  gimbal lock included), the two branches' cost difference and the crossing test of consecutive frames
  (``_fast_block``), then the track choice from the parity of crossings (``_solve_hinges``);
* unwrapping, the one 2 pi shift per hinge into its limits (``_place_hinges``, ``_turn_shift``), ``qd`` of the
  continuous path, re-wrapping of narrow hinges (``_rewrap_narrow``), the limit summary's per-hinge worst
  violation and frame count (``_mapping_summary``), and clamping with the residuals of the clamped bodies
  recomputed (``_clamp``);
* ``qd``: central differences over the layout's tangent runs and rotations, one-sided at the ends
  (``_velocities_small``).

The arithmetic is float64 throughout and rounded once into the output dtype, so float64 clips equal the numpy path
to float64 rounding and float32 clips to float32 rounding (numpy rounds every float32 step), with the same branch
choices. This module imports numba at import time: :mod:`.mapper` imports it lazily and keeps the numpy path where
numba is missing (the tests compare both).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._quat_scalars import qmul as _qmul
from ._quat_scalars import rotvec as _rotvec
from ._quat_scalars import wrap as _wrap

__all__ = ["map_motion"]

_PI = math.pi
_TWO_PI = 2.0 * math.pi
_COST_ANGLE_WEIGHT = 1e-3  # the mapper's: limit violation first, then small angles
_GIMBAL_EPS = 1e-7  # rotations.quat_to_euler's (scipy's) gimbal-lock test
_OVER_TOL = 1e-6  # the summary counts frames beyond the limits by more than this


@njit(cache=True, error_model="numpy")
def _joint(L, rest_inv, turned, t, b):
    """``rest^-1 * local`` of body ``b`` at frame ``t`` (float64, not normalised)."""
    w, x, y, z = float(L[t, b, 0]), float(L[t, b, 1]), float(L[t, b, 2]), float(L[t, b, 3])
    if turned[b]:
        r = rest_inv[b]
        return _qmul(r[0], r[1], r[2], r[3], w, x, y, z)
    return w, x, y, z


@njit(cache=True, inline="always", error_model="numpy")
def _angle(w, x, y, z):
    """``rotations.quat_angle``: ``2 atan2(|xyz|, |w|)``."""
    return 2.0 * math.atan2(math.sqrt(x * x + y * y + z * z), abs(w))


@njit(cache=True, error_model="numpy")
def _chain_residual(w, x, y, z, axes, theta, n):
    """Angle between the unit-normalised ``J = (w, x, y, z)`` and ``exp(a1 t1) ... exp(an tn)`` (``axes [3, 3]``,
    ``theta [3]``, the first ``n`` used): ``_chain_residual`` of the numpy path."""
    nrm = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / nrm, x / nrm, y / nrm, z / nrm
    pw, px, py, pz = 1.0, 0.0, 0.0, 0.0
    for i in range(n):
        h = 0.5 * theta[i]
        s = math.sin(h)
        pw, px, py, pz = _qmul(pw, px, py, pz, math.cos(h), s * axes[i, 0], s * axes[i, 1], s * axes[i, 2])
    e = _qmul(pw, -px, -py, -pz, w, x, y, z)
    return _angle(e[0], e[1], e[2], e[3])


@njit(cache=True, error_model="numpy")
def _euler(w, x, y, z, code):
    """Intrinsic Euler angles ``(t1, t2, t3)`` in letter order of the (not necessarily unit) quaternion: the closed
    form of ``rotations.quat_to_euler(q, order, extrinsic=False)``; ``code = (i, j, k, symmetric, s, keep_sign)``
    as ``mapper._euler_code`` builds it."""
    comp = (w, x, y, z)
    i, j, k, symmetric, s, keep = code[0], code[1], code[2], code[3], code[4], code[5]
    qw, qi, qj, qk = w, comp[i + 1], comp[j + 1], comp[k + 1]
    if symmetric:
        a, b, c, ds = qw, qi, qj, qk
    else:
        a, c = qw - qj, qj + qw
        if s > 0:
            b, ds = qi + qk, qk - qi
        else:
            b, ds = qi - qk, qk + qi
    middle = 2.0 * math.atan2(math.sqrt(c * c + ds * ds), math.sqrt(a * a + b * b))
    P, Q, bc, ac = a * ds, b * ds, b * c, a * c
    if s > 0:
        y1, x1, x3 = bc - P, ac + Q, ac - Q
        y3 = P + bc
    else:
        y1, x1, x3 = bc + P, ac - Q, ac + Q
        y3 = bc - P if symmetric else P - bc
    third = math.atan2(y1 + 0.0, x1)  # intrinsic: the last letter's angle
    first = math.atan2(y3 + 0.0, x3)
    at_zero = middle <= _GIMBAL_EPS
    if at_zero or abs(middle - _PI) <= _GIMBAL_EPS:
        d = s * ds
        yy = 2.0 * a * b if at_zero else 2.0 * c * d
        xx = a * a - b * b if at_zero else c * c - d * d
        first = math.atan2((yy if keep else -yy) + 0.0, xx)
        third = 0.0
    if not symmetric:
        middle -= 0.5 * _PI
    return first, middle, third


@njit(cache=True, inline="always", error_model="numpy")
def _cost(theta, ref, center, lo, hi):
    """``_angle_cost`` of one hinge: the limit violation after the best 2 pi shift plus the small angle term."""
    qv = theta + ref
    qv = qv - _TWO_PI * np.rint((qv - center) / _TWO_PI)
    return _COST_ANGLE_WEIGHT * abs(theta) + max(lo - qv, 0.0) + max(qv - hi, 0.0)


@njit(cache=True, error_model="numpy")
def _velocities(q, qd, runs, rots, fps):
    """``_velocities_small`` (any length): central differences over ``2 dt`` inside, one-sided over ``dt`` at
    the ends (the ends' quaternions normalised); scalar runs ``(a, v0, k)``, rotations ``(a, v0)``."""
    n = q.shape[0]
    if n < 2:
        return
    dt = 1.0 / fps
    for t in range(n):
        hi = min(t + 1, n - 1)
        lo = max(t - 1, 0)
        div = dt if t == 0 or t == n - 1 else 2.0 * dt
        for r in range(runs.shape[0]):
            a, v0, k = runs[r, 0], runs[r, 1], runs[r, 2]
            for c in range(k):
                qd[t, v0 + c] = (float(q[hi, a + c]) - float(q[lo, a + c])) / div
        for r in range(rots.shape[0]):
            a, v0 = rots[r, 0], rots[r, 1]
            w1, x1, y1, z1 = float(q[hi, a]), float(q[hi, a + 1]), float(q[hi, a + 2]), float(q[hi, a + 3])
            w0, x0, y0, z0 = float(q[lo, a]), float(q[lo, a + 1]), float(q[lo, a + 2]), float(q[lo, a + 3])
            if t == 0 or t == n - 1:
                n1 = max(math.sqrt(w1 * w1 + x1 * x1 + y1 * y1 + z1 * z1), 1e-12)
                n0 = max(math.sqrt(w0 * w0 + x0 * x0 + y0 * y0 + z0 * z0), 1e-12)
                w1, x1, y1, z1 = w1 / n1, x1 / n1, y1 / n1, z1 / n1
                w0, x0, y0, z0 = w0 / n0, x0 / n0, y0 / n0, z0 / n0
            e = _qmul(w1, x1, y1, z1, w0, -x0, -y0, -z0)
            rx, ry, rz = _rotvec(e[0], e[1], e[2], e[3])
            qd[t, v0] = rx / div
            qd[t, v0 + 1] = ry / div
            qd[t, v0 + 2] = rz / div


@njit(cache=True, error_model="numpy")
def _root(L, rt, q, root_body, root_q):
    """The free root: ``q[:, root_q:+3]`` the position, ``q[:, root_q+3:+7]`` the normalised quaternion with
    ``w >= 0`` at frame 0, then sign-continuous (``quat_hemisphere_continuity``)."""
    sign = 1.0
    pw = px = py = pz = 0.0
    for t in range(L.shape[0]):
        for c in range(3):
            q[t, root_q + c] = rt[t, c]
        w, x, y, z = (
            float(L[t, root_body, 0]),
            float(L[t, root_body, 1]),
            float(L[t, root_body, 2]),
            float(L[t, root_body, 3]),
        )
        n = max(math.sqrt(w * w + x * x + y * y + z * z), 1e-12)
        w, x, y, z = w / n, x / n, y / n, z / n
        if t == 0:
            sign = -1.0 if w < 0.0 else 1.0
        elif w * pw + x * px + y * py + z * pz < 0.0:
            sign = -sign
        pw, px, py, pz = w, x, y, z
        q[t, root_q + 3] = sign * w
        q[t, root_q + 4] = sign * x
        q[t, root_q + 5] = sign * y
        q[t, root_q + 6] = sign * z


@njit(cache=True, error_model="numpy")
def _solve_slots(L, rest_inv, turned, slots, slot_axes, slot_aux, slot_code, raw, residual, dcost, cross, cost_tab):
    """Per hinge body and frame: the closed forms into ``raw [N, hinges]`` (branch 0 of the triplets), the residuals
    of 1- and 2-hinge bodies, and for triplets the branch cost difference and the crossing flags
    (``dcost``/``cross [N, triplets]``). ``slots [S, 6]``: body, kind, hinge columns (3, -1 padded), triplet
    index; ``cost_tab [hinges, 4]``: ref, center, cost lower, cost upper."""
    N = L.shape[0]
    for s in range(slots.shape[0]):
        b, kind, c0, c1, c2, k3 = slots[s, 0], slots[s, 1], slots[s, 2], slots[s, 3], slots[s, 4], slots[s, 5]
        ax = slot_axes[s]
        for t in range(N):
            w, x, y, z = _joint(L, rest_inv, turned, t, b)
            if kind == 1:
                tw = ax[0, 0] * x + ax[0, 1] * y + ax[0, 2] * z
                px, py, pz = x - tw * ax[0, 0], y - tw * ax[0, 1], z - tw * ax[0, 2]
                raw[t, c0] = _wrap(2.0 * math.atan2(tw, w))
                residual[t, b] = 2.0 * math.atan2(math.sqrt(px * px + py * py + pz * pz), math.sqrt(w * w + tw * tw))
            elif kind == 2:
                d12 = slot_aux[s, 0]
                m00 = w
                m01 = ax[1, 0] * x + ax[1, 1] * y + ax[1, 2] * z
                m10 = ax[0, 0] * x + ax[0, 1] * y + ax[0, 2] * z
                m11 = -d12 * w + slot_aux[s, 1] * x + slot_aux[s, 2] * y + slot_aux[s, 3] * z
                E, F = 0.5 * (m00 + m11), 0.5 * (m00 - m11)
                G, H = 0.5 * (m10 + m01), 0.5 * (m10 - m01)
                ag, ah = math.atan2(G, F), math.atan2(H, E)
                t1, t2 = _wrap(ah + ag), _wrap(ag - ah)
                raw[t, c0] = t1
                raw[t, c1] = t2
                if d12 == 0.0:
                    Qn, Rn = math.sqrt(E * E + H * H), math.sqrt(F * F + G * G)
                    residual[t, b] = 2.0 * math.atan2(abs(Qn - Rn), Qn + Rn)
                else:
                    th = np.array([t1, t2, 0.0])
                    residual[t, b] = _chain_residual(w, x, y, z, ax, th, 2)
            else:
                sg = slot_aux[s]
                phi = sg[3]
                e1, e2, e3 = _euler(w, x, y, z, slot_code[s])
                t1, t2, t3 = sg[0] * e1, sg[1] * e2, sg[2] * e3
                raw[t, c0] = t1
                raw[t, c1] = t2
                raw[t, c2] = t3
                b1 = (t1 - math.copysign(_PI, t1), _wrap(2.0 * phi - t2), t3 - math.copysign(_PI, t3))
                b0 = (t1, t2, t3)
                dc = 0.0
                for i, col in enumerate((c0, c1, c2)):
                    tab = cost_tab[col]
                    dc += _cost(b1[i], tab[0], tab[1], tab[2], tab[3]) - _cost(b0[i], tab[0], tab[1], tab[2], tab[3])
                dcost[t, k3] = dc
                if t > 0:  # crossed < straight (see _fast_block)
                    d13 = abs(_wrap(t1 - raw[t - 1, c0])) + abs(_wrap(t3 - raw[t - 1, c2]))
                    if d13 > 0.5 * _PI:
                        a_now = abs(_wrap(t2 - phi))
                        a_prev = abs(_wrap(raw[t - 1, c1] - phi))
                        da = a_now - a_prev
                        ga = a_now + a_prev
                        ga = min(ga, _TWO_PI - ga)
                        cross[t, k3] = d13 > (ga * ga - da * da) * (0.5 / _PI) + _PI


@njit(cache=True, error_model="numpy")
def _choose_branches(raw, slots, slot_aux, dcost, cross):
    """Per triplet: the parity of crossings gives the branch of each of the two tracks; the track with the smaller
    total cost is kept (``_solve_hinges``' branch decision) and branch 1 written over branch 0 where it is taken:
    ``(t1 - pi sign(t1), 2 phi - t2, t3 - pi sign(t3))``."""
    N = raw.shape[0]
    for s in range(slots.shape[0]):
        if slots[s, 1] != 3:
            continue
        c0, c1, c2, k3 = slots[s, 2], slots[s, 3], slots[s, 4], slots[s, 5]
        phi = slot_aux[s, 3]
        parity = False
        total = 0.0
        odd = 0.0
        for t in range(N):
            parity = parity ^ cross[t, k3]
            total += dcost[t, k3]
            if parity:
                odd += dcost[t, k3]
        flip = total - 2.0 * odd < 0.0  # track 1 is cheaper
        parity = False
        for t in range(N):
            parity = parity ^ cross[t, k3]
            if parity ^ flip:
                t1, t2, t3 = raw[t, c0], raw[t, c1], raw[t, c2]
                raw[t, c0] = t1 - math.copysign(_PI, t1)
                raw[t, c1] = _wrap(2.0 * phi - t2)
                raw[t, c2] = t3 - math.copysign(_PI, t3)


@njit(cache=True, error_model="numpy")
def _turn_shift(first, qmin, qmax, lo, hi, center, limited):
    """``_turn_shift`` of one hinge series: the turns that put it inside its limits or overshoot them least
    (unlimited: frame 0 within pi of the centre, ``ref``)."""
    if not limited:
        return -np.rint((first - center) / _TWO_PI)
    k0 = np.rint((center - 0.5 * (qmin + qmax)) / _TWO_PI)
    best = k0
    best_v = max(lo - (qmin + _TWO_PI * k0), 0.0) + max(qmax + _TWO_PI * k0 - hi, 0.0)
    for dk in (-1.0, 1.0):
        k = k0 + dk
        v = max(lo - (qmin + _TWO_PI * k), 0.0) + max(qmax + _TWO_PI * k - hi, 0.0)
        if v < best_v - 1e-9:
            best, best_v = k, v
    return best


@njit(cache=True, error_model="numpy")
def _place(raw, q, h_q, h_tab, h_limited):
    """Unwrapped hinge series (no 2 pi jumps) ``+ ref``, shifted by one multiple of 2 pi per hinge
    (:func:`_turn_shift`), into ``q``'s hinge columns (``_place_hinges``); ``h_tab [hinges, 4]``: ref, centre,
    lower, upper. ``raw`` is overwritten with the unwrapped angles."""
    N = raw.shape[0]
    for h in range(raw.shape[1]):
        ref, center, lo, hi = h_tab[h, 0], h_tab[h, 1], h_tab[h, 2], h_tab[h, 3]
        turns = 0.0
        prev = 0.0
        qmin, qmax = np.inf, -np.inf
        for t in range(N):
            T = raw[t, h]
            if t > 0:
                turns += np.rint((T - prev) * (1.0 / _TWO_PI))
            prev = T
            v = T + ref - _TWO_PI * turns
            raw[t, h] = v
            qmin = min(qmin, v)
            qmax = max(qmax, v)
        if N == 0:
            continue
        shift = _TWO_PI * _turn_shift(raw[0, h], qmin, qmax, lo, hi, center, h_limited[h])
        col = h_q[h]
        for t in range(N):
            q[t, col] = raw[t, h] + shift


@njit(cache=True, error_model="numpy")
def _rewrap_and_count(q, h_q, h_tab, h_narrow, h_limited, rewrapped, worst, count):
    """Narrow hinges (limits spanning less than 2 pi) brought back from a wound angle frame by frame
    (``_rewrap_narrow``, counted per hinge into ``rewrapped``), then per limited hinge the largest violation and
    the frames beyond ``1e-6`` (the summary's counters, of ``q`` before any clamping)."""
    N = q.shape[0]
    for h in range(h_q.shape[0]):
        col = h_q[h]
        center, lo, hi = h_tab[h, 1], h_tab[h, 2], h_tab[h, 3]
        if h_narrow[h]:
            moved = 0
            for t in range(N):
                v = float(q[t, col])
                turns = np.rint((center - v) * (1.0 / _TWO_PI))
                if turns != 0.0:
                    q[t, col] = v + _TWO_PI * turns
                    moved += 1
            rewrapped[h] = moved
        if h_limited[h]:
            big = 0.0
            n = 0
            for t in range(N):
                v = float(q[t, col])
                over = max(lo - v, 0.0) + max(v - hi, 0.0)
                big = max(big, over)
                if over > _OVER_TOL:
                    n += 1
            worst[h] = big
            count[h] = n


@njit(cache=True, error_model="numpy")
def _clamp(L, rest_inv, turned, q, clamped, residual, slots, slot_axes, h_q, h_v, h_tab, h_limited):
    """Limited hinges clamped into their limits (``clamped = q_clamped - q``), and the residual of every body at
    every frame where one of its hinges moved recomputed from the clamped angles (``_clamp``)."""
    N = q.shape[0]
    th = np.zeros(3)
    for s in range(slots.shape[0]):
        b, kind = slots[s, 0], slots[s, 1]
        for t in range(N):
            moved = False
            for i in range(kind):
                h = slots[s, 2 + i]
                col = h_q[h]
                v = float(q[t, col])
                new = v
                if h_limited[h]:
                    new = min(max(v, h_tab[h, 2]), h_tab[h, 3])
                if new != v:
                    q[t, col] = new
                    clamped[t, h_v[h]] = new - v
                    moved = True
            if moved:
                for i in range(kind):
                    h = slots[s, 2 + i]
                    th[i] = float(q[t, h_q[h]]) - h_tab[h, 0]
                w, x, y, z = _joint(L, rest_inv, turned, t, b)
                residual[t, b] = _chain_residual(w, x, y, z, slot_axes[s], th, kind)


@njit(cache=True, error_model="numpy")
def _all_finite(a):
    for t in range(a.shape[0]):
        for c in range(a.shape[1]):
            if not math.isfinite(a[t, c]):
                return False
    return True


@njit(cache=True, error_model="numpy")
def map_motion(
    L,  # [N, B, 4] local rotations WXYZ (float32 or float64)
    rt,  # [N, 3] root translation
    root,  # [2] int64: root body, its q offset (-1, -1: no free root)
    none_bodies,  # [n0] int64 bodies without joints
    rest_inv,  # [B, 4] float64 rest^-1
    turned,  # [B] bool: rest rotation not the identity
    slots,  # [S, 6] int64: body, kind (1, 2, 3), hinge columns (-1 padded), triplet index
    slot_axes,  # [S, 3, 3] float64 hinge axes
    slot_aux,  # [S, 4] float64: 2 hinges (a1.a2, a1 x a2); 3 hinges (axis signs, phi)
    slot_code,  # [S, 6] int64 Euler constants of triplets (mapper._euler_code)
    cost_tab,  # [hinges, 4] float64: ref, centre, cost lower, cost upper (the branch cost's limits)
    h_q,  # [hinges] int64 q columns
    h_v,  # [hinges] int64 qd columns
    h_tab,  # [hinges, 4] float64: ref, centre, lower, upper (+-inf unlimited)
    h_limited,  # [hinges] bool
    h_narrow,  # [hinges] bool
    num_triplets,
    runs,  # [r, 3] int64 tangent runs (q offset, qd offset, count)
    rots,  # [r, 2] int64 tangent rotations (q offset, qd offset)
    fps,
    clamp,
    q,  # [N, nq] out, held joints already at ref
    qd,  # [N, nv] out, zeros
    residual,  # [N, B] out, zeros
    clamped,  # [N, nv] out, zeros
    rewrapped,  # [hinges] int64 out
    worst,  # [hinges] float64 out
    count,  # [hinges] int64 out
    info,  # [3] int64 out: frame and body of the first zero quaternion (-1: none), 1 when q or qd is not finite
):
    """The whole motion mapping of a mixed hinge layout (see the module docstring) in one call: ``q``, ``qd``,
    residuals ``[N, B]`` rad, clamping amounts, re-wrapped frame counts and the limit summary's counters written
    into the given arrays (the output dtype: float32 or float64). Returns early with ``info[:2]`` the frame and
    body of the first all-zero quaternion (frame-major order), leaving the outputs unfinished."""
    N, B = L.shape[0], L.shape[1]
    info[0] = info[1] = -1
    info[2] = 0
    for t in range(N):
        for b in range(B):
            if L[t, b, 0] == 0.0 and L[t, b, 1] == 0.0 and L[t, b, 2] == 0.0 and L[t, b, 3] == 0.0:
                info[0], info[1] = t, b
                return
    if root[0] >= 0:
        _root(L, rt, q, root[0], root[1])
    for i in range(none_bodies.shape[0]):
        b = none_bodies[i]
        for t in range(N):
            w, x, y, z = _joint(L, rest_inv, turned, t, b)
            residual[t, b] = _angle(w, x, y, z)
    nh = h_q.shape[0]
    raw = np.empty((N, nh))
    dcost = np.zeros((N, max(num_triplets, 1)))
    cross = np.zeros((N, max(num_triplets, 1)), dtype=np.bool_)
    _solve_slots(L, rest_inv, turned, slots, slot_axes, slot_aux, slot_code, raw, residual, dcost, cross, cost_tab)
    _choose_branches(raw, slots, slot_aux, dcost, cross)
    _place(raw, q, h_q, h_tab, h_limited)
    if not clamp:  # qd follows the continuous path, before narrow hinges are re-wrapped
        _velocities(q, qd, runs, rots, fps)
    _rewrap_and_count(q, h_q, h_tab, h_narrow, h_limited, rewrapped, worst, count)
    if clamp:  # qd of the clamped path
        _clamp(L, rest_inv, turned, q, clamped, residual, slots, slot_axes, h_q, h_v, h_tab, h_limited)
        _velocities(q, qd, runs, rots, fps)
    info[2] = 0 if _all_finite(q) and _all_finite(qd) else 1

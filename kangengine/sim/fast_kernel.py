"""The simulator's step for one world at a time as compiled native code (numba), for the CPU.

The same maths as :meth:`kangengine.sim.Simulator.step` (the torch step stays the reference): energy
correction, recursive Newton-Euler bias forces, composite inertias with the contact point stiffnesses, the
Newton iterations on the incremental potential with the same gradients, Gauss-Newton curvatures, the
``M dv`` taken from the Newton system, the pending contact forces and the same line search; the linear
systems are solved by the tree-sparse ``L^T D L`` factorisation (Featherstone), which equals the dense
Cholesky solve up to round-off. Everything runs in float64; worlds are looped inside the kernel, so a step
is one call instead of ~3600 small tensor operations.

Division follows IEEE 754 as in torch (``error_model="numpy"``: a zero divisor gives inf or NaN, which the
step's divergence check then catches, instead of raising). Only :mod:`kangengine.sim.fast` calls this
module; it is imported lazily (numba loads in ~0.5 s and compiles the kernels once per machine, 30-40 s,
cached on disk).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..animation._quat_scalars import qmul, rotvec

__all__ = ["step_kernel", "difference_kernel", "integrate_kernel"]

_SQRT_PI_2 = math.sqrt(math.pi) / 2.0


@njit(cache=True, inline="always", error_model="numpy")
def _phi_dx(x, vf, r, vs):
    """``phi'(x) / x`` (:func:`kangengine.sim.control.friction_phi_derivative_over_x`)."""
    if x < vf:
        return x / (-vf * vf) + 2.0 / vf
    if vs == 0.0:
        return r / max(x, 1e-30)
    t = (x - vf) / max(vs, 1e-30)
    return (r + (1.0 - r) * math.exp(-t * t)) / max(x, 1e-30)


@njit(cache=True, inline="always", error_model="numpy")
def _phi(x, vf, r, vs):
    """``phi(x)`` (:func:`kangengine.sim.control.friction_phi`)."""
    if x < vf:
        return x * x * (x / (-3.0 * vf * vf) + 1.0 / vf)
    if vs == 0.0:
        return r * x + (2.0 / 3.0 - r) * vf
    t = x - vf
    return 2.0 * vf / 3.0 + r * t + (1.0 - r) * vs * _SQRT_PI_2 * math.erf(t / max(vs, 1e-30))


@njit(cache=True, inline="always", error_model="numpy")
def _clamp(x, lo, hi):
    return min(max(x, lo), hi)


@njit(cache=True, error_model="numpy")
def _apply_inertia(f, m, out):
    """``out[6] = I m`` for the ten-number spatial inertia ``f`` and motion ``m``."""
    ms, hx, hy, hz, ixx, iyy, izz, ixy, ixz, iyz = f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]
    wx, wy, wz, vx, vy, vz = m[0], m[1], m[2], m[3], m[4], m[5]
    out[0] = ixx * wx + ixy * wy + ixz * wz + hy * vz - hz * vy
    out[1] = ixy * wx + iyy * wy + iyz * wz + hz * vx - hx * vz
    out[2] = ixz * wx + iyz * wy + izz * wz + hx * vy - hy * vx
    out[3] = ms * vx + wy * hz - wz * hy
    out[4] = ms * vy + wz * hx - wx * hz
    out[5] = ms * vz + wx * hy - wy * hx


@njit(cache=True, error_model="numpy")
def _twists(s, x, dof_body, parents, out):
    """``out [B, 6]``: body twists of DOF rates ``x [nv]`` (path sums, root first)."""
    out[:] = 0.0
    for j in range(s.shape[0]):
        b = dof_body[j]
        for k in range(6):
            out[b, k] += s[j, k] * x[j]
    for b in range(out.shape[0]):
        p = parents[b]
        if p >= 0:
            for k in range(6):
                out[b, k] += out[p, k]


@njit(cache=True, error_model="numpy")
def _gen_forces(s, f, dof_body, parents, out):
    """``out [nv]``: generalized forces of body forces ``f [B, 6]`` (summed over subtrees in place)."""
    for b in range(f.shape[0] - 1, 0, -1):
        p = parents[b]
        if p >= 0:
            for k in range(6):
                f[p, k] += f[b, k]
    for j in range(s.shape[0]):
        b = dof_body[j]
        acc = 0.0
        for k in range(6):
            acc += s[j, k] * f[b, k]
        out[j] = acc


@njit(cache=True, error_model="numpy")
def _mass_product(s, inertia, arm, x, dof_body, parents, tw, fb, tmp, out):
    """``out = M x`` (one pass down and one up the tree, armature included)."""
    _twists(s, x, dof_body, parents, tw)
    for b in range(inertia.shape[0]):
        _apply_inertia(inertia[b], tw[b], tmp)
        fb[b, :] = tmp
    _gen_forces(s, fb, dof_body, parents, out)
    for j in range(x.shape[0]):
        out[j] += arm[j] * x[j]


@njit(cache=True, error_model="numpy")
def _point_velocity(tw, cb, off, out):
    """``out [C, 3]``: velocities of the contact points (offsets ``off``) on bodies ``cb`` of twists ``tw``."""
    for c in range(cb.shape[0]):
        t = tw[cb[c]]
        rx, ry, rz = off[c, 0], off[c, 1], off[c, 2]
        out[c, 0] = t[3] + (t[1] * rz - t[2] * ry)
        out[c, 1] = t[4] + (t[2] * rx - t[0] * rz)
        out[c, 2] = t[5] + (t[0] * ry - t[1] * rx)


@njit(cache=True, error_model="numpy")
def _ltdl_solve(hm, par, rhs, out):
    """``out = H^-1 rhs`` for the lower triangle of ``hm [nv, nv]`` (overwritten by its ``L^T D L``
    factors; Featherstone's no-fill-in factorisation along the DOF parent chain ``par``)."""
    n = hm.shape[0]
    for k in range(n - 1, -1, -1):
        d = hm[k, k]
        i = par[k]
        while i >= 0:
            t = hm[k, i] / d
            j = i
            while j >= 0:
                hm[i, j] -= t * hm[k, j]
                j = par[j]
            hm[k, i] = t
            i = par[i]
    out[:] = rhs
    for k in range(n - 1, -1, -1):
        i = par[k]
        while i >= 0:
            out[i] -= hm[k, i] * out[k]
            i = par[i]
    for k in range(n):
        out[k] /= hm[k, k]
    for k in range(n):
        i = par[k]
        while i >= 0:
            out[k] -= hm[k, i] * out[i]
            i = par[i]


@njit(cache=True, error_model="numpy")
def _joint_speed(v, group, has_group, out):
    n = v.shape[0]
    if not has_group:
        for j in range(n):
            out[j] = abs(v[j])
        return
    for j in range(n):
        acc = 0.0
        g = group[j]
        for k in range(n):
            if group[k] == g:
                acc += v[k] * v[k]
        out[j] = math.sqrt(acc)


@njit(cache=True, error_model="numpy")
def _joint_energy(vv, qs, a, b, e_coef, e_const, effort, lim_active, jc, jf, group, flags, h, speed):
    """Summed energy of the joint-space terms at ``vv [nv]`` (:meth:`Simulator._joint_energy`)."""
    has_damping, has_springs, has_dry, has_limits, has_effort, has_group = flags
    e_damp, e_spring, spring_ref, lower, upper, e_klim, e_dlim = jc[5], jc[6], jc[7], jc[8], jc[9], jc[10], jc[11]
    mu0h, falloff, ratio, stribeck, group_size = jf[0], jf[1], jf[2], jf[3], jf[4]
    if has_dry:
        _joint_speed(vv, group, has_group, speed)
    total = 0.0
    for j in range(vv.shape[0]):
        v = vv[j]
        v2 = v * v
        e = e_damp[j] * v2 if has_damping else 0.0
        if has_springs:
            r = qs[j] - spring_ref[j] + h * v
            e += e_spring[j] * (r * r)
        if has_dry:
            ej = mu0h[j] * _phi(speed[j], falloff[j], ratio[j], stribeck[j])
            e += ej / group_size[j] if has_group else ej
        if has_limits:
            qn = qs[j] + h * v
            lim = qn - _clamp(qn, lower[j], upper[j])
            e += e_klim[j] * (lim * lim) + e_dlim[j] * lim_active[j] * v2
        x = a[j] - b[j] * v
        if has_effort:
            ax = abs(x)
            lm = min(ax, effort[j])
            e += e_coef[j] * (lm * (2.0 * ax - lm))
        else:
            e += e_coef[j] * (x * x)
        e -= e_const[j] * v
        total += e
    return total


@njit(cache=True, error_model="numpy")
def _contact_energy(u, depth0, act, mlh, cc, h, stiff, damp, falloff, stribeck):
    """Summed contact energy at point velocities ``u [C, 3]`` with lagged activity and friction bound."""
    total = 0.0
    for c in range(u.shape[0]):
        ux, uy, uz = u[c, 0], u[c, 1], u[c, 2]
        pen = max(depth0[c] - h * uz, 0.0)
        e = 0.5 * stiff * (pen * pen) + 0.5 * h * damp * (act[c] * uz * uz)
        slip = math.sqrt(ux * ux + uy * uy)
        e += mlh[c] * _phi(slip, falloff, cc[1, c], stribeck)
        total += e
    return total


@njit(cache=True, error_model="numpy")
def _frames(bp, bq, jp, axes, dof_step, is_ang, is_lin, rot, s):
    """Rotation matrices ``rot [B, 9]`` (row-major ``world_from_body``) and DOF motions ``s [nv, 6]``
    (angular, velocity of the point at the root origin) of one world from its forward kinematics."""
    ox, oy, oz = bp[0, 0], bp[0, 1], bp[0, 2]
    for b in range(bp.shape[0]):
        qw, qx, qy, qz = bq[b, 0], bq[b, 1], bq[b, 2], bq[b, 3]
        xx, yy, zz, xy, xz, yz = qx * qx, qy * qy, qz * qz, qx * qy, qx * qz, qy * qz
        wx, wy, wz = qw * qx, qw * qy, qw * qz
        r = rot[b]
        r[0], r[1], r[2] = 1.0 - 2.0 * (yy + zz), 2.0 * (xy - wz), 2.0 * (xz + wy)
        r[3], r[4], r[5] = 2.0 * (xy + wz), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - wx)
        r[6], r[7], r[8] = 2.0 * (xz - wy), 2.0 * (yz + wx), 1.0 - 2.0 * (xx + yy)
    for j in range(s.shape[0]):
        st = dof_step[j]
        jax, jay, jaz = jp[st, 0] - ox, jp[st, 1] - oy, jp[st, 2] - oz
        ax_, ay_, az_ = axes[j, 0] * is_ang[j], axes[j, 1] * is_ang[j], axes[j, 2] * is_ang[j]
        s[j, 0], s[j, 1], s[j, 2] = ax_, ay_, az_
        s[j, 3] = axes[j, 0] * is_lin[j] + (jay * az_ - jaz * ay_)
        s[j, 4] = axes[j, 1] * is_lin[j] + (jaz * ax_ - jax * az_)
        s[j, 5] = axes[j, 2] * is_lin[j] + (jax * ay_ - jay * ax_)


@njit(cache=True, error_model="numpy")
def _inertias(bp, rot, body_c, ri, wm, inertia):
    """``inertia [B, 10]``: spatial inertias about the root origin, world axes
    (:func:`kangengine.sim.dynamics.spatial_inertias`)."""
    ox, oy, oz = bp[0, 0], bp[0, 1], bp[0, 2]
    for b in range(bp.shape[0]):
        r = rot[b]
        bc = body_c[b]
        i00, i01, i02, i11, i12, i22 = bc[5], bc[6], bc[7], bc[8], bc[9], bc[10]
        cbx, cby, cbz = bc[2], bc[3], bc[4]
        cx = bp[b, 0] - ox + (r[0] * cbx + r[1] * cby + r[2] * cbz)
        cy = bp[b, 1] - oy + (r[3] * cbx + r[4] * cby + r[5] * cbz)
        cz = bp[b, 2] - oz + (r[6] * cbx + r[7] * cby + r[8] * cbz)
        for k in range(3):
            ra0, ra1, ra2 = r[3 * k], r[3 * k + 1], r[3 * k + 2]
            ri[k, 0] = ra0 * i00 + ra1 * i01 + ra2 * i02
            ri[k, 1] = ra0 * i01 + ra1 * i11 + ra2 * i12
            ri[k, 2] = ra0 * i02 + ra1 * i12 + ra2 * i22
        for k in range(3):
            for l in range(3):  # noqa: E741
                wm[k, l] = ri[k, 0] * r[3 * l] + ri[k, 1] * r[3 * l + 1] + ri[k, 2] * r[3 * l + 2]
        m = bc[0]
        mx, my, mz = m * cx, m * cy, m * cz
        f = inertia[b]
        f[0], f[1], f[2], f[3] = m, mx, my, mz
        f[4] = wm[0, 0] + my * cy + mz * cz
        f[5] = wm[1, 1] + mx * cx + mz * cz
        f[6] = wm[2, 2] + mx * cx + my * cy
        f[7] = wm[0, 1] - mx * cy
        f[8] = wm[0, 2] - mx * cz
        f[9] = wm[1, 2] - my * cz


@njit(cache=True, error_model="numpy")
def _mechanical_energy(inertia, tw, qd, arm, body_c, g, origin, tmp):
    """``(kinetic, gravitational)`` J of one world (:func:`kangengine.sim.dynamics.mechanical_energy_t`)."""
    kin_b = 0.0
    first = 0.0
    mg = 0.0
    for b in range(inertia.shape[0]):
        _apply_inertia(inertia[b], tw[b], tmp)
        for k in range(6):
            kin_b += tw[b, k] * tmp[k]
        first += (inertia[b, 1] * g[0] + inertia[b, 2] * g[1] + inertia[b, 3] * g[2]) * body_c[b, 1]
        mg += body_c[b, 0] * body_c[b, 1]
    ka = 0.0
    for j in range(qd.shape[0]):
        ka += arm[j] * qd[j] * qd[j]
    pot = -(first + mg * (origin[0] * g[0] + origin[1] * g[1] + origin[2] * g[2]))
    return 0.5 * kin_b + 0.5 * ka, pot


@njit(cache=True, error_model="numpy")
def _energy_scale(budget, kin, pot, frozen):
    """The velocity scale that meets ``budget`` and the kinetic-energy change it makes
    (:meth:`Simulator._energy_scale`)."""
    ratio = (budget - pot) / max(kin, 1e-30)
    if kin > 1e-9 and math.isfinite(ratio) and not frozen:
        ratio = _clamp(ratio, 0.5, 2.0)
    else:
        ratio = 1.0
    return math.sqrt(ratio), kin * (ratio - 1.0)


@njit(cache=True, error_model="numpy")
def _bias_forces(
    s, qd, tw, inertia, frame_ptr, frame_idx, dof_body, parents, body_c, g, uniform, sv, fv, acc, fb, tmp, out
):
    """``out [nv]``: Coriolis, centrifugal and gravity forces ``c(q, qd)`` by recursive Newton-Euler
    (:func:`kangengine.sim.dynamics.rnea`); ``tw``: the body twists of ``qd``; ``frame_ptr``/``frame_idx``: the
    nonzero pattern of ``dof_frame`` row by row (its entries are 1)."""
    nv, nb = s.shape[0], inertia.shape[0]
    gx, gy, gz = g[0], g[1], g[2]
    for j in range(nv):
        for k in range(6):
            sv[j, k] = s[j, k] * qd[j]
    acc[:] = 0.0
    for j in range(nv):
        fv[:] = 0.0
        for e in range(frame_ptr[j], frame_ptr[j + 1]):  # the DOFs that move the frame DOF j is expressed in
            i = frame_idx[e]
            for k in range(6):
                fv[k] += sv[i, k]
        b = dof_body[j]
        wa0, wa1, wa2, va0, va1, va2 = fv[0], fv[1], fv[2], fv[3], fv[4], fv[5]
        wb0, wb1, wb2, vb0, vb1, vb2 = sv[j, 0], sv[j, 1], sv[j, 2], sv[j, 3], sv[j, 4], sv[j, 5]
        acc[b, 0] += wa1 * wb2 - wa2 * wb1
        acc[b, 1] += wa2 * wb0 - wa0 * wb2
        acc[b, 2] += wa0 * wb1 - wa1 * wb0
        acc[b, 3] += (wa1 * vb2 - wa2 * vb1) + (va1 * wb2 - va2 * wb1)
        acc[b, 4] += (wa2 * vb0 - wa0 * vb2) + (va2 * wb0 - va0 * wb2)
        acc[b, 5] += (wa0 * vb1 - wa1 * vb0) + (va0 * wb1 - va1 * wb0)
    for b in range(nb):
        p = parents[b]
        if p >= 0:
            for k in range(6):
                acc[b, k] += acc[p, k]
    for b in range(nb):
        if uniform:  # gravity as a base acceleration
            acc[b, 3] -= gx
            acc[b, 4] -= gy
            acc[b, 5] -= gz
        _apply_inertia(inertia[b], acc[b], fb[b])
        _apply_inertia(inertia[b], tw[b], tmp)
        w0, w1, w2, l0, l1, l2 = tw[b, 0], tw[b, 1], tw[b, 2], tw[b, 3], tw[b, 4], tw[b, 5]
        n0, n1, n2, f0, f1, f2 = tmp[0], tmp[1], tmp[2], tmp[3], tmp[4], tmp[5]
        fb[b, 0] += (w1 * n2 - w2 * n1) + (l1 * f2 - l2 * f1)
        fb[b, 1] += (w2 * n0 - w0 * n2) + (l2 * f0 - l0 * f2)
        fb[b, 2] += (w0 * n1 - w1 * n0) + (l0 * f1 - l1 * f0)
        fb[b, 3] += w1 * f2 - w2 * f1
        fb[b, 4] += w2 * f0 - w0 * f2
        fb[b, 5] += w0 * f1 - w1 * f0
        if not uniform:  # gravity as a force on the links it acts on
            sc = body_c[b, 1]
            ms, hx, hy, hz = inertia[b, 0] * sc, inertia[b, 1] * sc, inertia[b, 2] * sc, inertia[b, 3] * sc
            fb[b, 0] -= hy * gz - hz * gy
            fb[b, 1] -= hz * gx - hx * gz
            fb[b, 2] -= hx * gy - hy * gx
            fb[b, 3] -= ms * gx
            fb[b, 4] -= ms * gy
            fb[b, 5] -= ms * gz
    _gen_forces(s, fb, dof_body, parents, out)


@njit(cache=True, error_model="numpy")
def _contact_points(bp, rot, cp_i, cp_c, ground, pos, off, depth0):
    """Contact points of one world: world positions ``pos``, offsets from the root origin ``off`` (``[C,
    3]``) and penetrations ``depth0 [C]`` (:func:`kangengine.sim.contact.contact_geometry`)."""
    for c in range(cp_i.shape[0]):
        b = cp_i[c]
        r = rot[b]
        lx, ly, lz = cp_c[c, 0], cp_c[c, 1], cp_c[c, 2]
        px = bp[b, 0] + (r[0] * lx + r[1] * ly + r[2] * lz)
        py = bp[b, 1] + (r[3] * lx + r[4] * ly + r[5] * lz)
        pz = bp[b, 2] + (r[6] * lx + r[7] * ly + r[8] * lz) - cp_c[c, 3]
        pos[c, 0], pos[c, 1], pos[c, 2] = px, py, pz
        off[c, 0], off[c, 1], off[c, 2] = px - bp[0, 0], py - bp[0, 1], pz - bp[0, 2]
        depth0[c] = ground - pz


@njit(cache=True, error_model="numpy")
def _assemble_lower(comp, s, dof_body, dof_par, parents, nfeat, applied, tmp, out):
    """The lower triangle ``out[j, i]`` (``i`` on ``j``'s path to the root) of the joint-space matrix of the
    per-body features ``comp [B, >= 10]`` (spatial inertias; with ``nfeat == 16`` also the contact point
    stiffnesses, :func:`kangengine.sim.contact.apply_point_stiffness`), summed over subtrees in place
    first: ``s_i . (Xc_body(j) s_j)``."""
    nb = comp.shape[0]
    for b in range(nb - 1, 0, -1):
        p = parents[b]
        if p >= 0:
            for k in range(comp.shape[1]):
                comp[p, k] += comp[b, k]
    for j in range(s.shape[0]):
        cf = comp[dof_body[j]]
        _apply_inertia(cf, s[j], tmp)
        for k in range(6):
            applied[j, k] = tmp[k]
        if nfeat == 16:
            t0, tx, ty, txx, txy, tyy = cf[10], cf[11], cf[12], cf[13], cf[14], cf[15]
            ma, mb, mz_ = s[j, 0], s[j, 1], s[j, 5]
            applied[j, 0] = tmp[0] + tyy * ma - txy * mb + ty * mz_
            applied[j, 1] = tmp[1] - txy * ma + txx * mb - tx * mz_
            applied[j, 5] = tmp[5] + (ty * ma - tx * mb + t0 * mz_)
        i = j
        while i >= 0:
            acc_h = 0.0
            for k in range(6):
                acc_h += s[i, k] * applied[j, k]
            out[j, i] = acc_h
            i = dof_par[i]


@njit(cache=True, error_model="numpy")
def _joint_terms(v, qs, spring0, a, bb, effort, jc, jf, group, flags, h, lim_active, speed, grad, hd):
    """Gradient ``grad`` and diagonal curvature ``hd`` (``[nv]``) of the joint-space terms at ``v`` and the
    lagged limit activity (:meth:`Simulator._joint_terms`)."""
    has_damping, has_springs, has_dry, has_limits, has_effort, has_group = flags
    diag_const, lower, upper, klim_h, dlim_h, lim_curv = jc[0], jc[8], jc[9], jc[2], jc[3], jc[4]
    mu0h, falloff, ratio, stribeck = jf[0], jf[1], jf[2], jf[3]
    if has_dry:
        _joint_speed(v, group, has_group, speed)
    for j in range(v.shape[0]):
        g = spring0[j] + diag_const[j] * v[j]
        hj = diag_const[j]
        if has_dry:
            wgt = _phi_dx(speed[j], falloff[j], ratio[j], stribeck[j]) * mu0h[j]
            g += wgt * v[j]
            hj = hj + wgt
        if has_limits:
            qn = qs[j] + h * v[j]
            lim = qn - _clamp(qn, lower[j], upper[j])
            la = 1.0 if lim != 0 else 0.0
            lim_active[j] = la
            g += klim_h[j] * lim + dlim_h[j] * la * v[j]
            hj = hj + lim_curv[j] * la
        x = a[j] - bb[j] * v[j]
        if has_effort:  # majorizing curvature of the clamped drive
            g -= h * _clamp(x, -effort[j], effort[j])
            hj = hj + h * bb[j] * min(effort[j] / max(abs(x), 1e-30), 1.0)
        else:
            g -= h * x
            hj = hj + h * bb[j]
        grad[j] = g
        hd[j] = hj


@njit(cache=True, error_model="numpy")
def _contact_features(u, off, depth0, pending, inertia, cp_i, cc, scal, comp, lagged):
    """Per body ``comp [B, 22]``: the spatial inertia, the stiffness features of the contact points
    (:func:`kangengine.sim.contact.point_stiffness_rows`) and the spatial force of ``h f`` less the pending
    ``K du``; per point ``lagged [C, 5]``: activity, ``h mu lambda``, tangent and normal curvature and the
    contact energy at ``u`` (:meth:`Simulator._contact_terms`)."""
    h, reach, kn_const, stiff, damp, falloff, strib = scal[0], scal[5], scal[6], scal[7], scal[8], scal[9], scal[10]
    for b in range(comp.shape[0]):
        for k in range(10):
            comp[b, k] = inertia[b, k]
        for k in range(10, 22):
            comp[b, k] = 0.0
    for c in range(cp_i.shape[0]):
        ux, uy, uz = u[c, 0], u[c, 1], u[c, 2]
        rx, ry, rz = off[c, 0], off[c, 1], off[c, 2]
        depth = depth0[c] - h * uz
        act = 1.0 if depth > 0 else 0.0
        pen = max(depth, 0.0)
        dmp = act * uz
        fz = pen * stiff - dmp * damp
        ml = max(fz, 0.0) * cc[2, c]
        slip = math.sqrt(ux * ux + uy * uy)
        k_t = _phi_dx(slip, falloff, cc[1, c], strib) * ml
        k_n = kn_const if (depth0[c] + reach) + h * abs(uz) > 0 else 0.0  # points that may touch in this step
        lg = lagged[c]
        lg[0], lg[1], lg[2], lg[3] = act, ml, k_t, k_n
        lg[4] = 0.5 * stiff * (pen * pen) + 0.5 * h * damp * (dmp * uz) + ml * _phi(slip, falloff, cc[1, c], strib)
        fx = -(pending[c, 0] + k_t * ux)
        fy = -(pending[c, 1] + k_t * uy)
        fzh = fz * h - pending[c, 2]
        kx, ky, kz = k_t * rx, k_t * ry, k_t * rz
        pxx, pyy, pzz = kx * rx, ky * ry, kz * rz
        dk = k_n - k_t
        dx, dy = dk * rx, dk * ry
        cf = comp[cp_i[c]]
        cf[0] += k_t
        cf[1] += kx
        cf[2] += ky
        cf[3] += kz
        cf[4] += pyy + pzz
        cf[5] += pxx + pzz
        cf[6] += pxx + pyy
        cf[7] += kx * -ry
        cf[8] += kx * -rz
        cf[9] += ky * -rz
        cf[10] += dk
        cf[11] += dx
        cf[12] += dy
        cf[13] += dx * rx
        cf[14] += dx * ry
        cf[15] += dy * ry
        cf[16] += ry * fzh - rz * fy
        cf[17] += rz * fx - rx * fzh
        cf[18] += rx * fy - ry * fx
        cf[19] += fx
        cf[20] += fy
        cf[21] += fzh


@njit(cache=True, error_model="numpy")
def _coupling_terms(v, cq, cpl_m, cpl, h, crate, ract, cw, grad, hm):
    """Joint-space coupling rows at ``v``: limit penalty and damper on ``C v`` into ``grad`` and the lower
    triangle of ``hm``; per row the rate, activity and curvature (:meth:`Simulator._coupling_terms`)."""
    nv = v.shape[0]
    for r in range(cpl_m.shape[0]):
        rate = 0.0
        for j in range(nv):
            rate += cpl_m[r, j] * v[j]
        ln = cq[r] + h * rate
        lim = ln - _clamp(ln, cpl[0, r], cpl[1, r])
        ca = 1.0 if lim != 0 else 0.0
        force = cpl[2, r] * lim + cpl[3, r] * ca * rate
        crate[r], ract[r], cw[r] = rate, ca, cpl[4, r] * ca
        for i in range(nv):
            ci = cpl_m[r, i]
            if ci != 0.0:
                grad[i] += ci * force
                for j in range(i + 1):
                    if cpl_m[r, j] != 0.0:
                        hm[i, j] += cw[r] * (ci * cpl_m[r, j])


@njit(cache=True, error_model="numpy")
def _coupling_energy_change(cq, crate, cdv, ract, cpl, h):
    """The coupling rows' energy at ``C (v + dv)`` less that at ``C v`` (lagged damper activity)."""
    de = 0.0
    for r in range(cq.shape[0]):
        for step in range(2):
            rr = crate[r] + cdv[r] if step == 1 else crate[r]
            ln = cq[r] + h * rr
            lim = ln - _clamp(ln, cpl[0, r], cpl[1, r])
            ec = cpl[5, r] * (lim * lim) + cpl[6, r] * ract[r] * (rr * rr)
            de += ec if step == 1 else -ec
    return de


@njit(cache=True, error_model="numpy")
def _step_length(de, slope):
    """1 when the full step lowers the energy by at least a quarter of the predicted decrease, else the
    minimiser of the quadratic through ``E(0)``, the slope and ``E(1)`` within ``[0.05, 1]``."""
    curv = de - slope
    back = _clamp(-slope / max(2.0 * curv, 1e-30), 0.05, 1.0)
    if not math.isfinite(back):
        back = 0.05
    return 1.0 if de <= 0.25 * slope else back


@njit(cache=True, error_model="numpy")
def _contact_report(u, depth0, pos, cc, scal, out):
    """``out [C, 7]``: normal force, friction x, y, depth at the end of the step and position per point."""
    h, stiff, damp, falloff, strib = scal[0], scal[7], scal[8], scal[9], scal[10]
    for c in range(out.shape[0]):
        ux, uy, uz = u[c, 0], u[c, 1], u[c, 2]
        depth = depth0[c] - h * uz
        act = 1.0 if depth > 0 else 0.0
        lam = max(stiff * depth - damp * uz, 0.0) * act
        slip = math.sqrt(ux * ux + uy * uy)
        fw = _phi_dx(slip, falloff, cc[1, c], strib) * cc[0, c] * lam
        o = out[c]
        o[0], o[1], o[2], o[3] = lam, -fw * ux, -fw * uy, depth
        o[4], o[5], o[6] = pos[c, 0], pos[c, 1], pos[c, 2]


@njit(cache=True, error_model="numpy")
def _drive_energy_terms(a, bb, effort, h, e_coef, e_const):
    """Per DOF ``h / (2 b)`` where ``b > 0`` and the constant force ``h clamp(a)`` where ``b == 0``."""
    for j in range(a.shape[0]):
        if bb[j] > 0:
            e_coef[j] = 0.5 * h / bb[j]
            e_const[j] = 0.0
        else:
            e_coef[j] = 0.0
            e_const[j] = h * _clamp(a[j], -effort[j], effort[j])


@njit(cache=True, error_model="numpy")
def _joint_inputs(
    w, qd, bias, tau_ext, qs_all, dof_q_index, jc, pinned, pinned_qd, has_pin, force, qs, spring0, v, free
):
    """Per DOF of world ``w``: the explicit force ``-c + tau_ext``, the scalar joint values ``qs``, the passive
    springs' force at ``q`` (times ``h``), the starting iterate ``v`` (pinned DOFs at their prescribed
    velocity) and the free-DOF mask."""
    spring_h, spring_ref, scalar = jc[1], jc[7], jc[13]
    for j in range(qd.shape[0]):
        force[j] = -bias[j] + tau_ext[w, j]
        qs[j] = qs_all[w, dof_q_index[j]] * scalar[j]
        spring0[j] = (qs[j] - spring_ref[j]) * spring_h[j]
        v[j] = qd[j]
        if has_pin:
            free[j] = 0.0 if pinned[w, j] else 1.0
            if pinned[w, j]:
                v[j] = pinned_qd[w, j]


@njit(cache=True, error_model="numpy")
def _contact_gradient(s, comp, dof_body, grad):
    """``grad -= J^T (h f - pending)``: each DOF's motion against its body's composite contact wrench."""
    for j in range(s.shape[0]):
        cf = comp[dof_body[j]]
        for k in range(6):
            grad[j] -= s[j, k] * cf[16 + k]


@njit(cache=True, error_model="numpy")
def _pin_rows(grad, hm, free, dof_par):
    """Pinned DOFs: zero gradient, identity rows and columns of the Hessian (so their ``dv`` is 0)."""
    for j in range(grad.shape[0]):
        grad[j] *= free[j]
        i = j
        while i >= 0:
            hm[j, i] *= free[j] * free[i]
            i = dof_par[i]
        hm[j, j] += 1.0 - free[j]


@njit(cache=True, error_model="numpy")
def _contact_stiffness_product(lagged, du, kdu, ncp):
    """``kdu = K du`` per contact point (lagged curvatures) and ``du . K du``."""
    total = 0.0
    for c in range(ncp):
        kdu[c, 0] = lagged[c, 2] * du[c, 0]
        kdu[c, 1] = lagged[c, 2] * du[c, 1]
        kdu[c, 2] = lagged[c, 3] * du[c, 2]
        total += kdu[c, 0] * du[c, 0] + kdu[c, 1] * du[c, 1] + kdu[c, 2] * du[c, 2]
    return total


@njit(cache=True, error_model="numpy")
def _inertial_change(dv, grad, mvq, force, h, dmd, pending, du, ncp):
    """``(de, slope)``: the exact change of the inertial part along ``dv`` (``dv.M(v - qd) + 1/2 dv.M dv -
    h force.dv`` plus the pending contact forces' work) and ``grad . dv``."""
    de = 0.5 * dmd
    slope = 0.0
    for j in range(dv.shape[0]):
        de += dv[j] * (mvq[j] - h * force[j])
        slope += grad[j] * dv[j]
    for c in range(ncp):
        de += pending[c, 0] * du[c, 0] + pending[c, 1] * du[c, 1] + pending[c, 2] * du[c, 2]
    return de, slope


@njit(cache=True, error_model="numpy")
def _budget(qd, v, dv_m, bias, h):
    """The work of the non-conservative forces at the mean velocity, from ``dv_m = M (v - qd)``."""
    work = 0.0
    for j in range(qd.shape[0]):
        work += 0.5 * (qd[j] + v[j]) * (dv_m[j] + h * bias[j])
    return work


@njit(cache=True, error_model="numpy")
def _add_diagonal(hm, hd, arm):
    for j in range(hd.shape[0]):
        hm[j, j] += hd[j] + arm[j]


@njit(cache=True, error_model="numpy")
def _start_energy(inertia, tw, qd, arm, body_c, g, origin, tmp, budget, frozen, flags):
    """``(kinetic, gravitational, correction)`` J at the step's start; with a budget (``flags[9]``) the
    velocities ``qd`` and twists ``tw`` are scaled in place to meet it and the kinetic energy includes the
    correction. All zero without energy correction (``flags[8]``)."""
    if not flags[8]:
        return 0.0, 0.0, 0.0
    kin0, pot0 = _mechanical_energy(inertia, tw, qd, arm, body_c, g, origin, tmp)
    if not flags[9]:
        return kin0, pot0, 0.0
    scale, fix = _energy_scale(budget, kin0, pot0, frozen)
    qd *= scale
    tw *= scale
    return kin0 + fix, pot0, fix


@njit(cache=True, error_model="numpy")
def _frame_pattern(dof_frame):
    """``(ptr [nv + 1], idx)``: the nonzero columns of each row of the 0/1 matrix ``dof_frame``."""
    nv = dof_frame.shape[0]
    ptr = np.zeros(nv + 1, np.int64)
    idx = np.empty(nv * nv, np.int64)
    n = 0
    for j in range(nv):
        for i in range(nv):
            if dof_frame[j, i] != 0.0:
                idx[n] = i
                n += 1
        ptr[j + 1] = n
    return ptr, idx[:n]


@njit(cache=True, error_model="numpy")
def _lin(out, x, y, b):
    """``out = x + b y`` element-wise (no temporaries)."""
    for i in range(out.shape[0]):
        out[i] = x[i] + b * y[i]


@njit(cache=True, error_model="numpy")
def _fma(out, x, y, z):
    """``out = x + y z`` element-wise."""
    for i in range(out.shape[0]):
        out[i] = x[i] + y[i] * z[i]


@njit(cache=True, error_model="numpy")
def _axpy(y, a, x):
    """``y += a x`` element-wise."""
    for i in range(y.shape[0]):
        y[i] += a * x[i]


@njit(cache=True, error_model="numpy")
def step_kernel(
    qs_all,
    qd_all,
    frozen,
    budget_in,
    body_pos,
    body_quat,
    joint_pos,
    dof_axes,
    drive_a,
    drive_b,
    tau_ext,
    pinned,
    pinned_qd,
    parents,
    dof_body,
    dof_step,
    dof_par,
    dof_q_index,
    group,
    body_c,
    dof_c,
    jc,
    jf,
    cp_i,
    cp_c,
    cc,
    cpl_m,
    cpl,
    scal,
    flags,
    out_v,
    out_x,
    out_contact,
    out_world,
):
    """One step of every world (see the module docstring); :class:`kangengine.sim.fast.FastStep` packs the
    arguments: the state and the frames of the forward kinematics (``[W, ...]``), the drive's ``a - b v``
    (``[W, nv]`` each), loads and pins, the tree's index arrays, the model's constants folded with ``dt`` as
    the torch step folds them, and ``flags`` (which terms are present).

    Outputs: ``out_v [W, nv]`` end-of-step velocities, ``out_x [W, nv]`` requested drive forces,
    ``out_contact [W, C, 7]`` (normal force, friction x, y, depth, position x, y, z), ``out_world [W, 3]``
    (energy budget handed on, energy at the step's start, energy correction applied).
    """
    h = scal[0]
    g = scal[1:4]
    iterations = int(scal[11])
    jflags = (flags[0], flags[1], flags[2], flags[3], flags[4], flags[5])
    has_contact, line_search, energy_corr, has_pin, uniform, has_cpl = (
        flags[6], flags[7], flags[8], flags[10], flags[11], flags[12],
    )  # fmt: skip
    is_ang, is_lin, arm, dof_frame = dof_c[0], dof_c[1], dof_c[2], dof_c[3:]
    effort = jc[12]
    nw, nv = qd_all.shape
    nb, ncp, nr = body_c.shape[0], cp_i.shape[0], cpl_m.shape[0]
    nc1, nr1 = max(ncp, 1), max(nr, 1)
    # scratch, reused for every world
    s, sv, applied = np.empty((nv, 6)), np.empty((nv, 6)), np.empty((nv, 6))
    rot, inertia, comp = np.empty((nb, 9)), np.empty((nb, 10)), np.empty((nb, 22))
    tw, tw2, fb, acc = np.empty((nb, 6)), np.empty((nb, 6)), np.empty((nb, 6)), np.empty((nb, 6))
    tmp, fv, ri, wm, origin = np.empty(6), np.empty(6), np.empty((3, 3)), np.empty((3, 3)), np.empty(3)
    qd, v, qs, force, bias, spring0 = np.empty(nv), np.empty(nv), np.empty(nv), np.empty(nv), np.empty(nv), np.empty(nv)
    free, mvq, grad, hd, lim_active = np.ones(nv), np.empty(nv), np.empty(nv), np.empty(nv), np.zeros(nv)
    speed, dv, mdv, rhs, vt = np.empty(nv), np.empty(nv), np.empty(nv), np.empty(nv), np.empty(nv)
    e_coef, e_const, zero_nv = np.empty(nv), np.empty(nv), np.zeros(nv)
    hm, mass_h = np.empty((nv, nv)), np.empty((nv, nv))
    off, pos, u1 = np.empty((nc1, 3)), np.empty((nc1, 3)), np.empty((nc1, 3))
    u, du = np.zeros((nc1, 3)), np.zeros((nc1, 3))
    pending, kdu, lagged, depth0 = np.zeros((nc1, 3)), np.empty((nc1, 3)), np.empty((nc1, 5)), np.empty(nc1)
    cq, crate, ract, cw, cdv = np.zeros(nr1), np.zeros(nr1), np.zeros(nr1), np.zeros(nr1), np.zeros(nr1)
    frame_ptr, frame_idx = _frame_pattern(dof_frame)
    for w in range(nw):
        a, bb, bp = drive_a[w], drive_b[w], body_pos[w]
        origin[:] = bp[0]
        # -- once per step: frames, inertias, energy and its correction, bias forces, contact points --
        _frames(bp, body_quat[w], joint_pos[w], dof_axes[w], dof_step, is_ang, is_lin, rot, s)
        _inertias(bp, rot, body_c, ri, wm, inertia)
        qd[:] = qd_all[w]
        _twists(s, qd, dof_body, parents, tw)
        kin0, pot0, fix = _start_energy(inertia, tw, qd, arm, body_c, g, origin, tmp, budget_in[w], frozen[w], flags)
        _bias_forces(
            s, qd, tw, inertia, frame_ptr, frame_idx, dof_body, parents, body_c, g, uniform, sv, fv, acc, fb, tmp, bias
        )
        _joint_inputs(
            w, qd, bias, tau_ext, qs_all, dof_q_index, jc, pinned, pinned_qd, has_pin, force, qs, spring0, v, free
        )
        _drive_energy_terms(a, bb, effort, h, e_coef, e_const)
        if has_cpl:
            cq[:nr] = cpl_m @ qs
        if has_contact:
            _contact_points(bp, rot, cp_i, cp_c, scal[4], pos, off, depth0)
            if has_pin:
                _twists(s, v, dof_body, parents, tw2)
                _point_velocity(tw2, cp_i, off, u)
            else:
                _point_velocity(tw, cp_i, off, u)
        else:  # the mass matrix once
            comp[:, :10] = inertia
            _assemble_lower(comp[:, :10], s, dof_body, dof_par, parents, 10, applied, tmp, mass_h)
        mvq[:] = 0.0
        if has_pin:  # M (v - qd)
            _lin(vt, v, qd, -1.0)
            _mass_product(s, inertia, arm, vt, dof_body, parents, tw2, fb, tmp, mvq)
        pending[:] = 0.0
        # -- Newton iterations --
        for it in range(iterations):
            last = it == iterations - 1
            _joint_terms(v, qs, spring0, a, bb, effort, jc, jf, group, jflags, h, lim_active, speed, grad, hd)
            _axpy(grad, 1.0, mvq)
            _axpy(grad, -h, force)
            if has_contact:  # contact forces and point stiffnesses mapped with the inertias in one pass
                _contact_features(u, off, depth0, pending, inertia, cp_i, cc, scal, comp, lagged)
                _assemble_lower(comp, s, dof_body, dof_par, parents, 16, applied, tmp, hm)
                _contact_gradient(s, comp, dof_body, grad)
            else:
                hm[:] = mass_h
            _add_diagonal(hm, hd, arm)
            if has_cpl:
                _coupling_terms(v, cq[:nr], cpl_m, cpl, h, crate, ract, cw, grad, hm)
            if has_pin:
                _pin_rows(grad, hm, free, dof_par)
            _lin(rhs, zero_nv, grad, -1.0)
            _ltdl_solve(hm, dof_par, rhs, dv)
            if has_contact:
                _twists(s, dv, dof_body, parents, tw2)
                _point_velocity(tw2, cp_i, off, du)
            if has_cpl:
                cdv[:nr] = cpl_m @ dv
            if last and not line_search:
                _axpy(v, 1.0, dv)
                _axpy(u.reshape(-1), 1.0, du.reshape(-1))
                continue
            # M dv from the Newton system; the contact part K du stays pending in point space
            _fma(mdv, grad, hd, dv)
            if has_cpl:
                mdv += cpl_m.T @ (cw[:nr] * cdv[:nr])
            mdv *= -1.0
            dmd = np.dot(dv, mdv) - _contact_stiffness_product(lagged, du, kdu, ncp)
            alpha = 1.0
            if line_search:
                de, slope = _inertial_change(dv, grad, mvq, force, h, dmd, pending, du, ncp)
                _lin(vt, v, dv, 1.0)
                de += _joint_energy(vt, qs, a, bb, e_coef, e_const, effort, lim_active, jc, jf, group, jflags, h, speed)
                de -= _joint_energy(v, qs, a, bb, e_coef, e_const, effort, lim_active, jc, jf, group, jflags, h, speed)
                if has_contact:
                    _lin(u1.reshape(-1), u.reshape(-1), du.reshape(-1), 1.0)
                    de += _contact_energy(
                        u1[:ncp], depth0, lagged[:, 0], lagged[:, 1], cc, h, scal[7], scal[8], scal[9], scal[10]
                    )
                    de -= lagged[:ncp, 4].sum()
                if has_cpl:
                    de += _coupling_energy_change(cq[:nr], crate, cdv, ract, cpl, h)
                alpha = _step_length(de, slope)
            _axpy(v, alpha, dv)
            _axpy(u.reshape(-1), alpha, du.reshape(-1))
            if not last:
                _axpy(mvq, alpha, mdv)
                _axpy(pending.reshape(-1), -alpha, kdu.reshape(-1))
        # -- report --
        out_v[w] = v
        out_x[w] = a - bb * v
        if has_contact:
            _contact_report(u, depth0, pos, cc, scal, out_contact[w])
        if energy_corr:  # the work of the other forces at the mean velocity: M (v - qd) + h c
            _lin(vt, v, qd, -1.0)
            _mass_product(s, inertia, arm, vt, dof_body, parents, tw2, fb, tmp, dv)
            out_world[w, 0] = kin0 + pot0 + _budget(qd, v, dv, bias, h)
            out_world[w, 1] = kin0 + pot0
        out_world[w, 2] = fix


_SMALL = 1e-3  # kangengine.rotations' small-angle threshold (Taylor series below it)


@njit(cache=True, error_model="numpy")
def difference_kernel(q1, q0, runs, rots, out):
    """``out [W, nv]``: the layout's ``difference(q1, q0)`` (``runs [R, 3]`` and ``rots [Q, 2]`` from
    ``layout.tangent_runs``; the formulas of :mod:`kangengine.rotations`)."""
    for w in range(q0.shape[0]):
        for r in range(runs.shape[0]):
            a, v0, k = runs[r, 0], runs[r, 1], runs[r, 2]
            for i in range(k):
                out[w, v0 + i] = q1[w, a + i] - q0[w, a + i]
        for r in range(rots.shape[0]):
            a, v0 = rots[r, 0], rots[r, 1]
            n1 = max(math.sqrt(q1[w, a] ** 2 + q1[w, a + 1] ** 2 + q1[w, a + 2] ** 2 + q1[w, a + 3] ** 2), 1e-12)
            n0 = max(math.sqrt(q0[w, a] ** 2 + q0[w, a + 1] ** 2 + q0[w, a + 2] ** 2 + q0[w, a + 3] ** 2), 1e-12)
            aw, ax, ay, az = q1[w, a] / n1, q1[w, a + 1] / n1, q1[w, a + 2] / n1, q1[w, a + 3] / n1
            bw, bx, by, bz = q0[w, a] / n0, -(q0[w, a + 1] / n0), -(q0[w, a + 2] / n0), -(q0[w, a + 3] / n0)
            rw, rx, ry, rz = qmul(aw, ax, ay, az, bw, bx, by, bz)
            out[w, v0], out[w, v0 + 1], out[w, v0 + 2] = rotvec(rw, rx, ry, rz)


@njit(cache=True, error_model="numpy")
def integrate_kernel(q, v, h, runs, rots, out):
    """``out [W, nq]``: the layout's ``integrate(q, v, h)`` (see :func:`difference_kernel`)."""
    out[:] = q
    for w in range(q.shape[0]):
        for r in range(runs.shape[0]):
            a, v0, k = runs[r, 0], runs[r, 1], runs[r, 2]
            for i in range(k):
                out[w, a + i] = q[w, a + i] + v[w, v0 + i] * h
        for r in range(rots.shape[0]):
            a, v0 = rots[r, 0], rots[r, 1]
            x, y, z = v[w, v0] * h, v[w, v0 + 1] * h, v[w, v0 + 2] * h
            a2 = x * x + y * y + z * z
            if a2 < _SMALL * _SMALL:
                cw = 1.0 - a2 / 8.0 + a2 * a2 / 384.0
                scale = 0.5 - a2 / 48.0 + a2 * a2 / 3840.0
            else:
                angle = math.sqrt(a2)
                cw = math.cos(0.5 * angle)
                scale = math.sin(0.5 * angle) / angle
            ew, ex, ey, ez = cw, x * scale, y * scale, z * scale
            bw, bx, by, bz = q[w, a], q[w, a + 1], q[w, a + 2], q[w, a + 3]
            rw, rx, ry, rz = qmul(ew, ex, ey, ez, bw, bx, by, bz)
            n = max(math.sqrt(rw * rw + rx * rx + ry * ry + rz * rz), 1e-12)
            out[w, a], out[w, a + 1], out[w, a + 2], out[w, a + 3] = rw / n, rx / n, ry / n, rz / n


@njit(cache=True, error_model="numpy")
def finish_kernel(q, qd, v, x, h, runs, rots, limits, a, b, tau_ext, frozen, q_out, v_out, tau, frozen_out, newly):
    """Advance and check every world as the torch step does: ``q_out = integrate(q, v, h)`` unless the world
    is frozen or diverged (then ``q``, ``qd`` stay), ``tau = clamp(x, -effort, effort)``; a world diverges
    when a coordinate or speed leaves ``limits = (distance, speed)`` (NaN included) or a drive input or
    external force is not finite. ``limits[2:]`` holds the effort limits ``[nv]``."""
    integrate_kernel(q, v, h, runs, rots, q_out)
    dist, speed = limits[0], limits[1]
    effort = limits[2:]
    for w in range(q.shape[0]):
        ok = True
        for i in range(q.shape[1]):
            ok = ok and abs(q_out[w, i]) <= dist
        for j in range(v.shape[1]):
            ok = ok and abs(v[w, j]) <= speed and math.isfinite(a[w, j]) and math.isfinite(b[w, j])
            ok = ok and math.isfinite(tau_ext[w, j])
            tau[w, j] = _clamp(x[w, j], -effort[j], effort[j])
        frozen_out[w] = frozen[w] or not ok
        newly[w] = frozen_out[w] and not frozen[w]
        if frozen_out[w]:
            q_out[w] = q[w]
            v_out[w] = qd[w]
        else:
            v_out[w] = v[w]

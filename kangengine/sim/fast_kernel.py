"""The simulator's step for one world at a time as compiled native code (numba), for small batches on the CPU.

The same maths as :meth:`kangengine.sim.Simulator.step` (the torch step stays the reference): energy
correction, recursive Newton-Euler bias forces, composite inertias with the contact point stiffnesses, the
Newton iterations on the incremental potential with the same gradients, Gauss-Newton curvatures, the
``M dv`` taken from the Newton system, the pending contact forces and the same line search; the linear
systems are solved by the tree-sparse ``L^T D L`` factorisation (Featherstone), which equals the dense
Cholesky solve up to round-off. Everything runs in float64; worlds are looped inside the kernel, so a step
is one call instead of ~1500 small tensor operations.

Only :mod:`kangengine.sim.fast` calls this module; it is imported lazily (numba loads in ~0.5 s and
compiles the kernel once per machine, cached on disk).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["step_kernel", "difference_kernel", "integrate_kernel"]

_SQRT_PI_2 = math.sqrt(math.pi) / 2.0


@njit(cache=True, inline="always")
def _phi_dx(x, vf, r, vs):
    """``phi'(x) / x`` (:func:`kangengine.sim.control.friction_phi_derivative_over_x`)."""
    if x < vf:
        return x / (-vf * vf) + 2.0 / vf
    if vs == 0.0:
        return r / max(x, 1e-30)
    t = (x - vf) / max(vs, 1e-30)
    return (r + (1.0 - r) * math.exp(-t * t)) / max(x, 1e-30)


@njit(cache=True, inline="always")
def _phi(x, vf, r, vs):
    """``phi(x)`` (:func:`kangengine.sim.control.friction_phi`)."""
    if x < vf:
        return x * x * (x / (-3.0 * vf * vf) + 1.0 / vf)
    if vs == 0.0:
        return r * x + (2.0 / 3.0 - r) * vf
    t = x - vf
    return 2.0 * vf / 3.0 + r * t + (1.0 - r) * vs * _SQRT_PI_2 * math.erf(t / max(vs, 1e-30))


@njit(cache=True, inline="always")
def _clamp(x, lo, hi):
    return min(max(x, lo), hi)


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _mass_product(s, inertia, arm, x, dof_body, parents, tw, fb, tmp, out):
    """``out = M x`` (one pass down and one up the tree, armature included)."""
    _twists(s, x, dof_body, parents, tw)
    for b in range(inertia.shape[0]):
        _apply_inertia(inertia[b], tw[b], tmp)
        fb[b, :] = tmp
    _gen_forces(s, fb, dof_body, parents, out)
    for j in range(x.shape[0]):
        out[j] += arm[j] * x[j]


@njit(cache=True)
def _point_velocity(tw, cb, off, out):
    """``out [C, 3]``: velocities of the contact points (offsets ``off``) on bodies ``cb`` of twists ``tw``."""
    for c in range(cb.shape[0]):
        t = tw[cb[c]]
        rx, ry, rz = off[c, 0], off[c, 1], off[c, 2]
        out[c, 0] = t[3] + (t[1] * rz - t[2] * ry)
        out[c, 1] = t[4] + (t[2] * rx - t[0] * rz)
        out[c, 2] = t[5] + (t[0] * ry - t[1] * rx)


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def step_kernel(  # noqa: C901 - one straight-line step, its parts named in comments
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
    """One step of every world (see the module docstring); the arguments are packed by
    :class:`kangengine.sim.fast.FastStep` (its ``_pack`` documents each block).

    Outputs: ``out_v [W, nv]`` end-of-step velocities, ``out_x [W, nv]`` requested drive forces,
    ``out_contact [W, C, 7]`` (normal force, friction x, y, depth, position x, y, z), ``out_world [W, 3]``
    (energy budget handed on, energy at the step's start, energy correction applied).
    """
    h, gx, gy, gz, ground, reach, kn_const, stiff, damp, c_falloff, c_strib = (
        scal[0], scal[1], scal[2], scal[3], scal[4], scal[5], scal[6], scal[7], scal[8], scal[9], scal[10],
    )  # fmt: skip
    iterations = int(scal[11])
    has_damping, has_springs, has_dry, has_limits, has_effort, has_group = (
        flags[0], flags[1], flags[2], flags[3], flags[4], flags[5],
    )  # fmt: skip
    jflags = (has_damping, has_springs, has_dry, has_limits, has_effort, has_group)
    has_contact, line_search, energy_corr, has_budget, has_pin, uniform, has_cpl = (
        flags[6], flags[7], flags[8], flags[9], flags[10], flags[11], flags[12],
    )  # fmt: skip
    nr = cpl_m.shape[0]
    c_lower, c_upper, c_kh, c_dh, c_curv, c_ek, c_ed = cpl[0], cpl[1], cpl[2], cpl[3], cpl[4], cpl[5], cpl[6]
    cq = np.zeros(max(nr, 1))
    crate = np.zeros(max(nr, 1))
    ract = np.zeros(max(nr, 1))
    cw = np.zeros(max(nr, 1))
    cdv = np.zeros(max(nr, 1))
    nb = body_c.shape[0]
    mass, gscale = body_c[:, 0], body_c[:, 1]
    is_ang, is_lin, arm, dof_frame = dof_c[0], dof_c[1], dof_c[2], dof_c[3:]
    diag_const, spring_h, spring_ref, lower, upper = jc[0], jc[1], jc[7], jc[8], jc[9]
    klim_h, dlim_h, lim_curv, effort, scalar = jc[2], jc[3], jc[4], jc[12], jc[13]
    mu0h_j, falloff_j, ratio_j, strib_j = jf[0], jf[1], jf[2], jf[3]
    nw, nv = qd_all.shape
    ncp = cp_i.shape[0]
    # scratch
    s = np.empty((nv, 6))
    rot = np.empty((nb, 9))
    inertia = np.empty((nb, 10))
    tw = np.empty((nb, 6))
    tw2 = np.empty((nb, 6))
    fb = np.empty((nb, 6))
    tmp = np.empty(6)
    fv = np.empty(6)
    ri = np.empty((3, 3))
    wm = np.empty((3, 3))
    sv = np.empty((nv, 6))
    acc = np.empty((nb, 6))
    qd = np.empty(nv)
    v = np.empty(nv)
    qs = np.empty(nv)
    force = np.empty(nv)
    bias = np.empty(nv)
    spring0 = np.empty(nv)
    free = np.ones(nv)
    mvq = np.empty(nv)
    grad = np.empty(nv)
    hd = np.empty(nv)
    lim_active = np.zeros(nv)
    speed = np.empty(nv)
    dv = np.empty(nv)
    mdv = np.empty(nv)
    rhs = np.empty(nv)
    vt = np.empty(nv)
    e_coef = np.empty(nv)
    e_const = np.empty(nv)
    eff = np.empty(nv)
    hm = np.empty((nv, nv))
    mass_h = np.empty((nv, nv))
    applied = np.empty((nv, 6))
    comp = np.empty((nb, 22))
    off = np.empty((max(ncp, 1), 3))
    pos = np.empty((max(ncp, 1), 3))
    depth0 = np.empty(max(ncp, 1))
    u = np.empty((max(ncp, 1), 3))
    du = np.empty((max(ncp, 1), 3))
    u1 = np.empty((max(ncp, 1), 3))
    pending = np.zeros((max(ncp, 1), 3))
    kdu = np.empty((max(ncp, 1), 3))
    cact = np.empty(max(ncp, 1))
    mlh = np.empty(max(ncp, 1))
    kt = np.empty(max(ncp, 1))
    kn = np.empty(max(ncp, 1))
    ce0 = np.empty(max(ncp, 1))
    for w in range(nw):
        a = drive_a[w]
        bb = drive_b[w]
        # -- frames: rotations, DOF motions (angular, velocity of the point at the root origin) --
        ox, oy, oz = body_pos[w, 0, 0], body_pos[w, 0, 1], body_pos[w, 0, 2]
        for b in range(nb):
            qw, qx, qy, qz = body_quat[w, b, 0], body_quat[w, b, 1], body_quat[w, b, 2], body_quat[w, b, 3]
            xx, yy, zz, xy, xz, yz = qx * qx, qy * qy, qz * qz, qx * qy, qx * qz, qy * qz
            wx, wy, wz = qw * qx, qw * qy, qw * qz
            r = rot[b]
            r[0], r[1], r[2] = 1.0 - 2.0 * (yy + zz), 2.0 * (xy - wz), 2.0 * (xz + wy)
            r[3], r[4], r[5] = 2.0 * (xy + wz), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - wx)
            r[6], r[7], r[8] = 2.0 * (xz - wy), 2.0 * (yz + wx), 1.0 - 2.0 * (xx + yy)
        for j in range(nv):
            st = dof_step[j]
            jax = joint_pos[w, st, 0] - ox
            jay = joint_pos[w, st, 1] - oy
            jaz = joint_pos[w, st, 2] - oz
            ax_, ay_, az_ = dof_axes[w, j, 0] * is_ang[j], dof_axes[w, j, 1] * is_ang[j], dof_axes[w, j, 2] * is_ang[j]
            s[j, 0], s[j, 1], s[j, 2] = ax_, ay_, az_
            s[j, 3] = dof_axes[w, j, 0] * is_lin[j] + (jay * az_ - jaz * ay_)
            s[j, 4] = dof_axes[w, j, 1] * is_lin[j] + (jaz * ax_ - jax * az_)
            s[j, 5] = dof_axes[w, j, 2] * is_lin[j] + (jax * ay_ - jay * ax_)
        # -- spatial inertias about the root origin, world axes --
        for b in range(nb):
            r = rot[b]
            bc = body_c[b]
            i00, i01, i02, i11, i12, i22 = bc[5], bc[6], bc[7], bc[8], bc[9], bc[10]
            cbx, cby, cbz = bc[2], bc[3], bc[4]
            cx = body_pos[w, b, 0] - ox + (r[0] * cbx + r[1] * cby + r[2] * cbz)
            cy = body_pos[w, b, 1] - oy + (r[3] * cbx + r[4] * cby + r[5] * cbz)
            cz = body_pos[w, b, 2] - oz + (r[6] * cbx + r[7] * cby + r[8] * cbz)
            for k in range(3):
                ra0, ra1, ra2 = r[3 * k], r[3 * k + 1], r[3 * k + 2]
                ri[k, 0] = ra0 * i00 + ra1 * i01 + ra2 * i02
                ri[k, 1] = ra0 * i01 + ra1 * i11 + ra2 * i12
                ri[k, 2] = ra0 * i02 + ra1 * i12 + ra2 * i22
            for k in range(3):
                for l in range(3):  # noqa: E741
                    wm[k, l] = ri[k, 0] * r[3 * l] + ri[k, 1] * r[3 * l + 1] + ri[k, 2] * r[3 * l + 2]
            m = mass[b]
            mx, my, mz = m * cx, m * cy, m * cz
            f = inertia[b]
            f[0], f[1], f[2], f[3] = m, mx, my, mz
            f[4] = wm[0, 0] + my * cy + mz * cz
            f[5] = wm[1, 1] + mx * cx + mz * cz
            f[6] = wm[2, 2] + mx * cx + my * cy
            f[7] = wm[0, 1] - mx * cy
            f[8] = wm[0, 2] - mx * cz
            f[9] = wm[1, 2] - my * cz
        # -- energy at the start and its correction --
        for j in range(nv):
            qd[j] = qd_all[w, j]
        _twists(s, qd, dof_body, parents, tw)
        fix = 0.0
        kin0 = 0.0
        pot0 = 0.0
        if energy_corr:
            kin_b = 0.0
            first = 0.0
            mg = 0.0
            for b in range(nb):
                _apply_inertia(inertia[b], tw[b], tmp)
                for k in range(6):
                    kin_b += tw[b, k] * tmp[k]
                first += (inertia[b, 1] * gx + inertia[b, 2] * gy + inertia[b, 3] * gz) * gscale[b]
                mg += mass[b] * gscale[b]
            ka = 0.0
            for j in range(nv):
                ka += arm[j] * qd[j] * qd[j]
            kin0 = 0.5 * kin_b + 0.5 * ka
            pot0 = -(first + mg * (ox * gx + oy * gy + oz * gz))
            if has_budget:
                ratio = (budget_in[w] - pot0) / max(kin0, 1e-30)
                if kin0 > 1e-9 and math.isfinite(ratio) and not frozen[w]:
                    ratio = _clamp(ratio, 0.5, 2.0)
                else:
                    ratio = 1.0
                scale = math.sqrt(ratio)
                fix = kin0 * (ratio - 1.0)
                for j in range(nv):
                    qd[j] *= scale
                for b in range(nb):
                    for k in range(6):
                        tw[b, k] *= scale
                kin0 = kin0 + fix
        # -- bias forces c(q, qd) by recursive Newton-Euler --
        for j in range(nv):
            for k in range(6):
                sv[j, k] = s[j, k] * qd[j]
        acc[:] = 0.0
        for j in range(nv):
            fv[:] = 0.0
            for i in range(nv):
                if dof_frame[j, i] != 0.0:
                    for k in range(6):
                        fv[k] += dof_frame[j, i] * sv[i, k]
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
            if uniform:
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
            if not uniform:
                sc = gscale[b]
                ms, hx, hy, hz = inertia[b, 0] * sc, inertia[b, 1] * sc, inertia[b, 2] * sc, inertia[b, 3] * sc
                fb[b, 0] -= hy * gz - hz * gy
                fb[b, 1] -= hz * gx - hx * gz
                fb[b, 2] -= hx * gy - hy * gx
                fb[b, 3] -= ms * gx
                fb[b, 4] -= ms * gy
                fb[b, 5] -= ms * gz
        _gen_forces(s, fb, dof_body, parents, bias)
        for j in range(nv):
            force[j] = -bias[j] + tau_ext[w, j]
        # -- drive energies, joint values, pins --
        for j in range(nv):
            eff[j] = effort[j]
            if bb[j] > 0:
                e_coef[j] = 0.5 * h / bb[j]
                e_const[j] = 0.0
            else:
                e_coef[j] = 0.0
                e_const[j] = h * _clamp(a[j], -effort[j], effort[j])
            qs[j] = qs_all[w, dof_q_index[j]] * scalar[j]
            spring0[j] = (qs[j] - spring_ref[j]) * spring_h[j]
            v[j] = qd[j]
            if has_pin:
                if pinned[w, j]:
                    v[j] = pinned_qd[w, j]
                    free[j] = 0.0
                else:
                    free[j] = 1.0
        if has_cpl:
            for r in range(nr):
                acc_c = 0.0
                for j in range(nv):
                    acc_c += cpl_m[r, j] * qs[j]
                cq[r] = acc_c
        # -- contact points --
        if has_contact:
            for c in range(ncp):
                b = cp_i[c]
                r = rot[b]
                lx, ly, lz = cp_c[c, 0], cp_c[c, 1], cp_c[c, 2]
                px = body_pos[w, b, 0] + (r[0] * lx + r[1] * ly + r[2] * lz)
                py = body_pos[w, b, 1] + (r[3] * lx + r[4] * ly + r[5] * lz)
                pz = body_pos[w, b, 2] + (r[6] * lx + r[7] * ly + r[8] * lz) - cp_c[c, 3]
                pos[c, 0], pos[c, 1], pos[c, 2] = px, py, pz
                off[c, 0], off[c, 1], off[c, 2] = px - ox, py - oy, pz - oz
                depth0[c] = ground - pz
            if has_pin:
                _twists(s, v, dof_body, parents, tw2)
                _point_velocity(tw2, cp_i, off, u)
            else:
                _point_velocity(tw, cp_i, off, u)
        else:
            for b in range(nb):  # the mass matrix once: composite inertias applied to the DOF motions
                for k in range(10):
                    comp[b, k] = inertia[b, k]
            for b in range(nb - 1, 0, -1):
                p = parents[b]
                if p >= 0:
                    for k in range(10):
                        comp[p, k] += comp[b, k]
            for j in range(nv):
                _apply_inertia(comp[dof_body[j]], s[j], applied[j])
                i = j
                while i >= 0:
                    acc_h = 0.0
                    for k in range(6):
                        acc_h += s[i, k] * applied[j, k]
                    mass_h[j, i] = acc_h
                    i = dof_par[i]
        if has_pin:
            for j in range(nv):
                vt[j] = v[j] - qd[j]
            _mass_product(s, inertia, arm, vt, dof_body, parents, tw2, fb, tmp, mvq)
        else:
            mvq[:] = 0.0
        pending[:] = 0.0
        has_pending = False
        # -- Newton iterations --
        for it in range(iterations):
            last = it == iterations - 1
            # joint terms: gradient and diagonal curvature
            if has_dry:
                _joint_speed(v, group, has_group, speed)
            for j in range(nv):
                g = spring0[j] + diag_const[j] * v[j]
                hj = diag_const[j]
                if has_dry:
                    wgt = _phi_dx(speed[j], falloff_j[j], ratio_j[j], strib_j[j]) * mu0h_j[j]
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
                if has_effort:
                    g -= h * _clamp(x, -eff[j], eff[j])
                    hj = hj + h * bb[j] * min(eff[j] / max(abs(x), 1e-30), 1.0)
                else:
                    g -= h * x
                    hj = hj + h * bb[j]
                grad[j] = g + mvq[j] - h * force[j]
                hd[j] = hj
            if has_contact:
                # contact forces at this iterate and the point stiffnesses, summed per body with the inertias
                for b in range(nb):
                    for k in range(10):
                        comp[b, k] = inertia[b, k]
                    for k in range(10, 22):
                        comp[b, k] = 0.0
                for c in range(ncp):
                    ux, uy, uz = u[c, 0], u[c, 1], u[c, 2]
                    rx, ry, rz = off[c, 0], off[c, 1], off[c, 2]
                    depth = depth0[c] - h * uz
                    act = 1.0 if depth > 0 else 0.0
                    pen = max(depth, 0.0)
                    dmp = act * uz
                    fz = pen * stiff - dmp * damp
                    ml = max(fz, 0.0) * cc[2, c]
                    slip = math.sqrt(ux * ux + uy * uy)
                    k_t = _phi_dx(slip, c_falloff, cc[1, c], c_strib) * ml
                    k_n = kn_const if (depth0[c] + reach) + h * abs(uz) > 0 else 0.0
                    cact[c], mlh[c], kt[c], kn[c] = act, ml, k_t, k_n
                    ce0[c] = (
                        0.5 * stiff * (pen * pen)
                        + 0.5 * h * damp * (dmp * uz)
                        + ml * _phi(slip, c_falloff, cc[1, c], c_strib)
                    )
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
                for b in range(nb - 1, 0, -1):
                    p = parents[b]
                    if p >= 0:
                        for k in range(22):
                            comp[p, k] += comp[b, k]
                for j in range(nv):
                    cf = comp[dof_body[j]]
                    gsum = 0.0
                    for k in range(6):
                        gsum += s[j, k] * cf[16 + k]
                    grad[j] -= gsum
                    _apply_inertia(cf, s[j], tmp)
                    t0, tx, ty, txx, txy, tyy = cf[10], cf[11], cf[12], cf[13], cf[14], cf[15]
                    ma, mb, mz_ = s[j, 0], s[j, 1], s[j, 5]
                    applied[j, 0] = tmp[0] + tyy * ma - txy * mb + ty * mz_
                    applied[j, 1] = tmp[1] - txy * ma + txx * mb - tx * mz_
                    applied[j, 2] = tmp[2]
                    applied[j, 3] = tmp[3]
                    applied[j, 4] = tmp[4]
                    applied[j, 5] = tmp[5] + (ty * ma - tx * mb + t0 * mz_)
                    i = j
                    while i >= 0:
                        acc_h = 0.0
                        for k in range(6):
                            acc_h += s[i, k] * applied[j, k]
                        hm[j, i] = acc_h
                        i = dof_par[i]
            else:
                for j in range(nv):
                    i = j
                    while i >= 0:
                        hm[j, i] = mass_h[j, i]
                        i = dof_par[i]
            for j in range(nv):
                hm[j, j] += hd[j] + arm[j]
            if has_cpl:  # joint-space coupling rows: limit penalties and dampers on C v
                for r in range(nr):
                    rate = 0.0
                    for j in range(nv):
                        rate += cpl_m[r, j] * v[j]
                    ln = cq[r] + h * rate
                    lim = ln - _clamp(ln, c_lower[r], c_upper[r])
                    ca = 1.0 if lim != 0 else 0.0
                    fr_ = c_kh[r] * lim + c_dh[r] * ca * rate
                    crate[r], ract[r], cw[r] = rate, ca, c_curv[r] * ca
                    for i in range(nv):
                        ci = cpl_m[r, i]
                        if ci != 0.0:
                            grad[i] += ci * fr_
                            for j in range(i + 1):
                                if cpl_m[r, j] != 0.0:
                                    hm[i, j] += cw[r] * (ci * cpl_m[r, j])
            if has_pin:
                for j in range(nv):
                    grad[j] *= free[j]
                    i = j
                    while i >= 0:
                        hm[j, i] *= free[j] * free[i]
                        i = dof_par[i]
                    hm[j, j] += 1.0 - free[j]
            for j in range(nv):
                rhs[j] = -grad[j]
            _ltdl_solve(hm, dof_par, rhs, dv)
            if has_contact:
                _twists(s, dv, dof_body, parents, tw2)
                _point_velocity(tw2, cp_i, off, du)
            if has_cpl:
                for r in range(nr):
                    acc_c = 0.0
                    for j in range(nv):
                        acc_c += cpl_m[r, j] * dv[j]
                    cdv[r] = acc_c
            if last and not line_search:
                for j in range(nv):
                    v[j] += dv[j]
                for c in range(ncp):
                    for k in range(3):
                        u[c, k] += du[c, k]
                continue
            # M dv from the Newton system; the contact part stays pending in point space
            dmd = 0.0
            for j in range(nv):
                mdv[j] = grad[j] + hd[j] * dv[j]
            if has_cpl:
                for r in range(nr):
                    for j in range(nv):
                        mdv[j] += cpl_m[r, j] * (cw[r] * cdv[r])
            for j in range(nv):
                mdv[j] = -mdv[j]
                dmd += dv[j] * mdv[j]
            if has_contact:
                for c in range(ncp):
                    kdu[c, 0] = kt[c] * du[c, 0]
                    kdu[c, 1] = kt[c] * du[c, 1]
                    kdu[c, 2] = kn[c] * du[c, 2]
                    dmd -= kdu[c, 0] * du[c, 0] + kdu[c, 1] * du[c, 1] + kdu[c, 2] * du[c, 2]
            alpha = 1.0
            if line_search:
                de = 0.0
                slope = 0.0
                for j in range(nv):
                    de += dv[j] * (mvq[j] - h * force[j])
                    slope += grad[j] * dv[j]
                de += 0.5 * dmd
                if has_pending:
                    for c in range(ncp):
                        de += pending[c, 0] * du[c, 0] + pending[c, 1] * du[c, 1] + pending[c, 2] * du[c, 2]
                for j in range(nv):
                    vt[j] = v[j] + dv[j]
                de += _joint_energy(vt, qs, a, bb, e_coef, e_const, eff, lim_active, jc, jf, group, jflags, h, speed)
                de -= _joint_energy(v, qs, a, bb, e_coef, e_const, eff, lim_active, jc, jf, group, jflags, h, speed)
                if has_contact:
                    for c in range(ncp):
                        for k in range(3):
                            u1[c, k] = u[c, k] + du[c, k]
                    e1 = _contact_energy(u1, depth0, cact, mlh, cc, h, stiff, damp, c_falloff, c_strib)
                    e0 = 0.0
                    for c in range(ncp):
                        e0 += ce0[c]
                    de += e1 - e0
                if has_cpl:
                    for r in range(nr):
                        for step in range(2):
                            rr = crate[r] + cdv[r] if step == 1 else crate[r]
                            ln = cq[r] + h * rr
                            lim = ln - _clamp(ln, c_lower[r], c_upper[r])
                            ec = c_ek[r] * (lim * lim) + c_ed[r] * ract[r] * (rr * rr)
                            de += ec if step == 1 else -ec
                curv = de - slope
                back = _clamp(-slope / max(2.0 * curv, 1e-30), 0.05, 1.0)
                if not math.isfinite(back):
                    back = 0.05
                alpha = 1.0 if de <= 0.25 * slope else back
            for j in range(nv):
                v[j] += alpha * dv[j]
            if has_contact:
                for c in range(ncp):
                    for k in range(3):
                        u[c, k] += alpha * du[c, k]
            if not last:
                for j in range(nv):
                    mvq[j] += alpha * mdv[j]
                if has_contact:
                    for c in range(ncp):
                        for k in range(3):
                            pending[c, k] += -alpha * kdu[c, k]
                    has_pending = True
        # -- report --
        for j in range(nv):
            out_v[w, j] = v[j]
            out_x[w, j] = a[j] - bb[j] * v[j]
        if has_contact:
            for c in range(ncp):
                ux, uy, uz = u[c, 0], u[c, 1], u[c, 2]
                depth = depth0[c] - h * uz
                act = 1.0 if depth > 0 else 0.0
                lam = max(stiff * depth - damp * uz, 0.0) * act
                slip = math.sqrt(ux * ux + uy * uy)
                fw = _phi_dx(slip, c_falloff, cc[1, c], c_strib) * cc[0, c] * lam
                o = out_contact[w, c]
                o[0], o[1], o[2], o[3] = lam, -fw * ux, -fw * uy, depth
                o[4], o[5], o[6] = pos[c, 0], pos[c, 1], pos[c, 2]
        if energy_corr:
            for j in range(nv):
                vt[j] = v[j] - qd[j]
            _mass_product(s, inertia, arm, vt, dof_body, parents, tw2, fb, tmp, dv)
            work = 0.0
            for j in range(nv):
                work += 0.5 * (qd[j] + v[j]) * (dv[j] + h * bias[j])
            out_world[w, 0] = kin0 + pot0 + work
            out_world[w, 1] = kin0 + pot0
        out_world[w, 2] = fix


_SMALL = 1e-3  # kangengine.rotations' small-angle threshold (Taylor series below it)


@njit(cache=True)
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
            rw = aw * bw - ax * bx - ay * by - az * bz
            rx = aw * bx + ax * bw + ay * bz - az * by
            ry = aw * by - ax * bz + ay * bw + az * bx
            rz = aw * bz + ax * by - ay * bx + az * bw
            if rw < 0:
                rw, rx, ry, rz = -rw, -rx, -ry, -rz
            n2 = rx * rx + ry * ry + rz * rz
            if n2 < (_SMALL * _SMALL) * (rw * rw):
                r2 = n2 / (rw * rw)
                scale = (2.0 / rw) * (1.0 - r2 / 3.0 + r2 * r2 / 5.0)
            else:
                n = math.sqrt(n2)
                scale = 2.0 * math.atan2(n, rw) / n
            out[w, v0], out[w, v0 + 1], out[w, v0 + 2] = rx * scale, ry * scale, rz * scale


@njit(cache=True)
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
            rw = ew * bw - ex * bx - ey * by - ez * bz
            rx = ew * bx + ex * bw + ey * bz - ez * by
            ry = ew * by - ex * bz + ey * bw + ez * bx
            rz = ew * bz + ex * by - ey * bx + ez * bw
            n = max(math.sqrt(rw * rw + rx * rx + ry * ry + rz * rz), 1e-12)
            out[w, a], out[w, a + 1], out[w, a + 2], out[w, a + 3] = rw / n, rx / n, ry / n, rz / n

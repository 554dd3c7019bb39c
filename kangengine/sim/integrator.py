"""The time step: backward Euler found by minimising the incremental potential with Newton iterations.

For generalized velocities ``v`` at the end of a step of length ``h`` from ``(q, qd)``::

    E(v) = 1/2 (v - v_pred)^T M (v - v_pred) + U(q (+) h v) + h R(v),   v_pred = qd + h M^-1 (tau_ext - c(q, qd))

``M`` and the bias forces ``c`` (Coriolis, centrifugal, gravity) are evaluated once at ``q``. ``U`` holds
joint-limit springs, passive joint springs, the PD drives and the ground-contact normal penalty; ``R``
holds joint damping, joint friction, limit and contact damping and the contact friction potential (the
drive's damping enters through its implicit force). Joint-space terms use ``q (+) h v`` exactly; contact
positions are linearised at ``q`` (``p(v) = p(q) + h J(q) v``), so one forward kinematics per step serves
all iterations.

Newton: exact Hessians of the quadratic terms (``M``, springs, viscous damping, active penalties);
Gauss-Newton / majorizing curvatures for the rest (friction ``phi'(|u|)/|u|``, clamped drives
``min(1, limit/|x|)``), so a full step never overshoots a stick. Each iteration solves ``H dv = -grad``
by Cholesky and picks the step length from a fixed set of candidates by the energy (a line search that
only shortens the step when the energy would not decrease). The iteration count is fixed and every
choice is a ``torch.where``: no data-dependent Python branching, no host-device synchronisation, static
shapes, so a step can be captured by CUDA graphs or ``torch.compile``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .contact import (
    apply_point_stiffness,
    contact_geometry,
    point_forces_to_bodies,
    point_stiffness_features,
    point_velocities,
)
from .control import (
    Control,
    _phi_derivative_over_x,
    friction_phi,
    huber,
)
from .dynamics import _rnea, apply_inertia, composite, generalized_forces, joint_space_lower, spatial_inertias
from .kinematics import body_twists, compute_frames, rows
from .model import Model, State

__all__ = ["Simulator", "StepResult"]


@dataclass(frozen=True, eq=False)
class StepResult:
    """What one step produced, for ``W`` worlds and ``C`` contact slots (``model.contact_point_body``).

    Attributes:
        state: the new :class:`State`.
        contact_normal_force: ``[W, C]`` N, normal (+z) force of the ground on each contact point (>= 0).
        contact_friction_force: ``[W, C, 2]`` N, tangential (world x, y) friction force on each point.
        contact_depth: ``[W, C]`` m, penetration at the end of the step (> 0 inside the ground).
        contact_position: ``[W, C, 3]`` m, contact points (world) at the start of the step.
        drive_force: ``[W, nv]`` generalized force the PD drives applied (after the effort clamp).
        drive_force_requested: ``[W, nv]`` the force the drives asked for before the clamp (PD plus
            feed-forward at the end-of-step state); above ``effort_limit`` where saturated.
        drive_saturated: ``[W, nv]`` bool, the drive hit its effort limit.
        nonfinite: ``[W]`` bool, worlds that became non-finite in this step (now frozen).
    """

    state: State
    contact_normal_force: torch.Tensor
    contact_friction_force: torch.Tensor
    contact_depth: torch.Tensor
    contact_position: torch.Tensor
    drive_force: torch.Tensor
    drive_force_requested: torch.Tensor
    drive_saturated: torch.Tensor
    nonfinite: torch.Tensor


class Simulator:
    """Implicit articulated-body simulator over ``W`` worlds.

    Args:
        model: the :class:`Model`.
        dt: step length, s.
        iterations: Newton iterations per step (fixed; 2 is enough at control rates, more converges
            friction and clamped drives further).
        line_search: shorten a Newton step whose energy does not decrease enough (one extra energy
            evaluation per iteration, no branching); ``False`` always takes the full step.
        check_inputs: validate shapes/dtypes of the state and control on every step (turn off in hot loops
            once the shapes are known to be right).

    Example::

        sim = ke.sim.Simulator(model, dt=1 / 60)
        state = ke.sim.State.neutral(model, num_worlds=64)
        result = sim.step(state, ke.sim.Control(q_target=state.q))
        state = result.state
    """

    def __init__(
        self, model: Model, *, dt: float, iterations: int = 2, line_search: bool = True, check_inputs: bool = True
    ):
        if not dt > 0:
            raise ValueError(f"dt must be positive, got {dt}")
        self.model = m = model
        self.dt = h = float(dt)
        self.iterations = int(iterations)
        self.check_inputs = bool(check_inputs)
        self._line_search = bool(line_search)
        c = m.contact
        self._has_contact = c.enabled and m.num_contact_points > 0
        # a point this close to the ground may touch it within one step under gravity alone
        self._reach = h * h * float(torch.linalg.vector_norm(m.gravity)) + 1e-4
        mu = m.contact_friction[:, None]  # [C, 1]: contact quantities are [C, W]
        self._c_mu0 = mu + c.stiction_extra
        self._c_ratio = torch.where(self._c_mu0 > 0, mu / torch.clamp(self._c_mu0, min=1e-30), torch.ones_like(mu))
        self._c_stribeck = c.stribeck_vel if c.stribeck_vel > 0 else 0.0
        mu0 = m.friction_coulomb + m.friction_stiction
        self._j_mu0 = mu0
        self._j_ratio = torch.where(mu0 > 0, m.friction_coulomb / torch.clamp(mu0, min=1e-30), torch.ones_like(mu0))
        self._j_has_dry = bool((mu0 > 0).any())
        self._j_stribeck = m.friction_stribeck if bool((m.friction_stribeck > 0).any()) else 0.0
        self._has_limits = bool((m.limit_stiffness > 0).any() or (m.limit_damping > 0).any())
        self._has_springs = bool((m.spring_stiffness > 0).any())
        self._has_damping = bool((m.damping > 0).any())
        self._has_couplings = m.coupling_matrix is not None and m.coupling_matrix.shape[0] > 0
        if self._has_couplings:
            self._coupling_t = m.coupling_matrix.t().contiguous()  # [nv, R]
            # lower-triangle entries (i >= j) touched by some row, and each row's c_i c_j there
            cm = m.coupling_matrix.detach().cpu().double()
            outer = torch.einsum("ri,rj->rij", cm, cm).tril()
            pos = torch.nonzero(outer.abs().sum(0) > 0)
            self._coupling_pos_t = (pos[:, 1] * m.nv + pos[:, 0]).to(m.device)
            self._coupling_outer = outer[:, pos[:, 0], pos[:, 1]].to(dtype=m.dtype, device=m.device)  # [R, P]
        # exact constant curvature of the quadratic joint terms (viscous damping, passive springs)
        self._diag_const = h * m.damping + h * h * m.spring_stiffness
        self._scalar = m.scalar_dof.to(m.dtype)
        if m.has_ball_friction:
            g = m.friction_group
            self._group = (g[:, None] == g[None, :]).to(m.dtype)  # [nv, nv] same friction group
            self._group_size = self._group.sum(-1)
        else:
            self._group = None

    # ------------------------------------------------------------------------------------------------
    def step(self, state: State, control: Control | None = None) -> StepResult:
        """Advance every world by ``dt``.

        Args:
            state: :class:`State` with ``q [W, nq]``, ``qd [W, nv]``.
            control: :class:`Control` (targets, gains, loads, pinned DOFs) or ``None``.
        Returns:
            :class:`StepResult` (``.state`` is the new state).
        """
        m = self.model
        h = self.dt
        control = control if control is not None else Control()
        q, qd = state.q, state.qd
        if self.check_inputs:
            m.check_state(q, qd)
            control.check(m, q.shape[0])
        w = q.shape[0]

        # -- once per step: kinematics, inertia, bias, loads ----------------------------------------------
        # The dense [W, nv, nv] matrices are the memory-heaviest objects: the Hessian is formed once per
        # iteration in one product (mass and contact stiffness composited together, lower triangle only,
        # which is all the Cholesky factorisation reads), and M x products go through the tree instead.
        fr = compute_frames(m, q)
        inertia = spatial_inertias(m, fr)
        inertia_dof = composite(m, inertia)  # subtree inertias per DOF, 10 x [nv, W]
        twists = []
        force = -_rnea(m, fr, inertia, qd, None, twists_out=twists)  # generalized force at zero acceleration
        if control.tau_external is not None:
            force = force + control.tau_external
        s = fr.motion
        drive = self._drive(control, q, w)
        qs = q[:, m.scalar_q] * self._scalar  # scalar joint values (0 elsewhere)
        pinned = control.pinned
        v = qd
        if pinned is not None:
            pv = control.pinned_qd if control.pinned_qd is not None else torch.zeros_like(qd)
            v = torch.where(pinned, pv, qd)
            free = (~pinned).to(m.dtype)
            pin_eye = torch.diag_embed(pinned.to(m.dtype))
        if self._has_contact:
            geo = contact_geometry(m, fr)
            offset, depth0 = geo.offset, geo.depth
            tw = twists[0] if pinned is None else body_twists(m, s, v.t().contiguous())
            u = point_velocities(m, tw, offset)  # linear in v: updated below, never recomputed
        else:
            mass_lower = joint_space_lower(m, apply_inertia(inertia_dof, s), fr.motion_rows)
        # M (v - qd), kept up to date below
        if pinned is None:
            mvq = torch.zeros_like(qd)
        else:
            dvq = v - qd
            mvq = self._mass_times(inertia, s, body_twists(m, s, dvq.t().contiguous()), dvq)

        for _ in range(self.iterations):
            grad, hdiag, lim_active = self._joint_terms(v, qs, drive)
            grad = grad + mvq - h * force
            cterms = None
            if self._has_contact:
                cg, feats, cterms = self._contact_terms(u, depth0, offset)
                grad = grad - h * generalized_forces(m, s, cg)
                comp = composite(m, feats)
                joint = tuple(a + b for a, b in zip(inertia_dof, comp[:10])) + comp[10:]
                hess = joint_space_lower(m, apply_point_stiffness(joint, s), fr.motion_rows)
            else:
                hess = mass_lower.clone(memory_format=torch.preserve_format)
            hess.diagonal(dim1=-2, dim2=-1).add_(hdiag + m.armature)
            coup_active = None
            if self._has_couplings:
                cgrad, coup_active = self._coupling_terms(v, qs, hess)
                grad = grad + cgrad
            if pinned is not None:
                grad = grad * free
                hess = hess * free[:, :, None] * free[:, None, :] + pin_eye
            chol, _ = torch.linalg.cholesky_ex(hess)
            dv = -torch.cholesky_solve(grad[..., None], chol)[..., 0]
            tw_dv = body_twists(m, s, dv.t().contiguous())
            mdv = self._mass_times(inertia, s, tw_dv, dv)
            du = point_velocities(m, tw_dv, offset) if self._has_contact else None
            if self._line_search:
                alpha = self._step_length(
                    v,
                    dv,
                    grad,
                    mvq,
                    mdv,
                    force,
                    qs,
                    drive,
                    (lim_active, coup_active),
                    u if self._has_contact else None,
                    du,
                    depth0 if self._has_contact else None,
                    cterms,
                )
                a_v, a_u = alpha[:, None], alpha[None, :]
            else:
                a_v = a_u = 1.0
            v = v + a_v * dv
            mvq = mvq + a_v * mdv
            if self._has_contact:
                u = tuple(a + a_u * b for a, b in zip(u, du))

        # -- report and advance ---------------------------------------------------------------------------
        drive_a, drive_b, effort = drive[0], drive[1], drive[2]
        x = drive_a - drive_b * v
        tau = torch.maximum(torch.minimum(x, effort), -effort)
        saturated = x.abs() > effort
        if self._has_contact:
            cp = m.contact
            ux, uy, uz = u
            depth = depth0 - h * uz
            act = (depth > 0).to(m.dtype)
            lam = torch.clamp(cp.stiffness * depth - cp.damping * uz, min=0.0) * act
            slip = torch.sqrt(ux * ux + uy * uy)
            fw = _phi_derivative_over_x(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck) * self._c_mu0 * lam
            normal, cdepth = lam.t(), depth.t()
            friction = torch.stack([-fw * ux, -fw * uy], -1).transpose(0, 1)
            cpos = rows(geo.position)
        else:
            z = torch.zeros(w, 0, dtype=m.dtype, device=m.device)
            normal, friction, cdepth, cpos = z, z[..., None].expand(-1, -1, 2), z, z[..., None].expand(-1, -1, 3)
        q_new = m.layout.integrate(q, v, h)
        finite = torch.isfinite(q_new).all(-1) & torch.isfinite(v).all(-1)
        frozen = state.frozen | ~finite
        newly = frozen & ~state.frozen
        q_out = torch.where(frozen[:, None], q, q_new)
        v_out = torch.where(frozen[:, None], qd, v)
        return StepResult(
            state=State(q=q_out, qd=v_out, frozen=frozen),
            contact_normal_force=normal,
            contact_friction_force=friction,
            contact_depth=cdepth,
            contact_position=cpos,
            drive_force=tau,
            drive_force_requested=x,
            drive_saturated=saturated,
            nonfinite=newly,
        )

    # -- terms --------------------------------------------------------------------------------------------
    def _drive(self, control: Control, q: torch.Tensor, w: int):
        """``(a, b, effort)`` with the drive force ``clamp(a - b v, -effort, effort)``."""
        m, h = self.model, self.dt
        kp = m.drive_stiffness if control.drive_stiffness is None else control.drive_stiffness
        kd = m.drive_damping if control.drive_damping is None else control.drive_damping
        kp = kp.expand(w, -1)
        kd = kd.expand(w, -1)
        if control.q_target is not None:
            a = kp * m.layout.difference(control.q_target, q)
            b = h * kp + kd
        else:
            a = torch.zeros(w, m.nv, dtype=m.dtype, device=m.device)
            b = kd
        if control.qd_target is not None:
            a = a + kd * control.qd_target
        if control.tau_feedforward is not None:
            a = a + control.tau_feedforward
        return a, b, m.effort_limit.expand(w, -1)

    def _joint_speed(self, v: torch.Tensor) -> torch.Tensor:
        """Speed each DOF's dry friction sees: ``|v|`` (hinge, slide), the angular speed (ball)."""
        if self._group is None:
            return v.abs()
        return torch.sqrt(torch.matmul(v * v, self._group))

    def _joint_terms(self, v, qs, drive):
        """Gradient and diagonal Hessian of the joint-space terms at ``v`` (``[W, nv]`` each)."""
        m, h = self.model, self.dt
        grad = (
            h * (m.damping * v + m.spring_stiffness * (qs + h * v - m.spring_ref))
            if (self._has_damping or self._has_springs)
            else torch.zeros_like(v)
        )
        hdiag = self._diag_const.expand_as(v)
        lim_active = None
        if self._j_has_dry:
            wgt = _phi_derivative_over_x(self._joint_speed(v), m.friction_falloff, self._j_ratio, self._j_stribeck)
            grad = grad + h * self._j_mu0 * wgt * v
            hdiag = hdiag + h * self._j_mu0 * wgt
        if self._has_limits:
            qn = qs + h * v
            over = torch.clamp(qn - m.upper, min=0.0)
            under = torch.clamp(m.lower - qn, min=0.0)
            lim_active = ((over > 0) | (under > 0)).to(m.dtype)
            grad = grad + h * m.limit_stiffness * (over - under) + h * m.limit_damping * lim_active * v
            hdiag = hdiag + (h * h * m.limit_stiffness + h * m.limit_damping) * lim_active
        a, b, effort = drive
        x = a - b * v
        ax = x.abs()
        grad = grad - h * torch.maximum(torch.minimum(x, effort), -effort)
        # majorizing curvature of the clamped drive: b inside the limit, b * limit / |x| outside
        hdiag = hdiag + h * b * torch.clamp(effort / torch.clamp(ax, min=1e-30), max=1.0)
        return grad, hdiag, lim_active

    def _mass_times(self, inertia, s, twists, x):
        """``M x`` through the tree (no dense matrix): ``sum_b J_b^T I_b (J_b x) + armature x``, given the
        body twists of ``x``."""
        m = self.model
        return generalized_forces(m, s, apply_inertia(inertia, twists)) + m.armature * x

    def _coupling_terms(self, v, qs, hess):
        """Gradient and activity of the joint-space coupling rows at ``v``; their rank-R Hessian is added
        in place to the lower triangle of ``hess`` (a few entries per row)."""
        m, h = self.model, self.dt
        ln = (qs + h * v) @ self._coupling_t  # [W, R] values at the end of the step
        rate = v @ self._coupling_t
        over = torch.clamp(ln - m.coupling_upper, min=0.0)
        under = torch.clamp(m.coupling_lower - ln, min=0.0)
        act = ((over > 0) | (under > 0)).to(m.dtype)
        force = h * (m.coupling_stiffness * (over - under) + m.coupling_damping * act * rate)
        grad = force @ m.coupling_matrix
        weight = (h * h * m.coupling_stiffness + h * m.coupling_damping) * act  # [W, R]
        # hess is a transposed view: its (i, j) entry lives at j * nv + i of the underlying array
        hess.mT.reshape(hess.shape[0], -1).index_add_(1, self._coupling_pos_t, weight @ self._coupling_outer)
        return grad, act

    def _contact_terms(self, u, depth0, offset):
        """Contact forces at the current iterate (as body forces) and the stiffness features of the
        Newton model, plus the lagged quantities the line search keeps fixed."""
        m, h = self.model, self.dt
        cp = m.contact
        ux, uy, uz = u
        depth = depth0 - h * uz
        act = (depth > 0).to(m.dtype)
        fz = cp.stiffness * torch.clamp(depth, min=0.0) - cp.damping * act * uz
        mu_lam = self._c_mu0 * torch.clamp(fz, min=0.0)
        slip = torch.sqrt(ux * ux + uy * uy)
        fw = _phi_derivative_over_x(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck) * mu_lam
        # curvature: the penalty also for points that could reach the ground in this step (a majorizer)
        near = ((depth0 + h * uz.abs() + self._reach) > 0).to(m.dtype)
        kn = h * (h * cp.stiffness + cp.damping) * torch.maximum(act, near)
        feats = point_stiffness_features(m, offset, h * fw, kn)
        return point_forces_to_bodies(m, offset, (-fw * ux, -fw * uy, fz)), feats, (act, mu_lam)

    def _joint_energy(self, v, qs, drive, active):
        """Per-DOF energy of the joint-space terms for velocities ``v [W, A, nv]`` (lagged limit damping)."""
        m, h = self.model, self.dt
        e = torch.zeros_like(v)
        if self._has_damping:
            e = e + 0.5 * h * m.damping * v * v
        if self._has_springs:
            r = qs[:, None] + h * v - m.spring_ref
            e = e + 0.5 * m.spring_stiffness * r * r
        if self._j_has_dry:
            sp = self._joint_speed(v.reshape(-1, m.nv)).reshape(v.shape)
            ej = h * self._j_mu0 * friction_phi(sp, m.friction_falloff, self._j_ratio, self._j_stribeck)
            e = e + (ej / self._group_size if self._group is not None else ej)
        lim_active, coup_active = active
        if self._has_limits:
            qn = qs[:, None] + h * v
            over = torch.clamp(qn - m.upper, min=0.0)
            under = torch.clamp(m.lower - qn, min=0.0)
            e = e + 0.5 * m.limit_stiffness * (over * over + under * under)
            e = e + 0.5 * h * m.limit_damping * lim_active[:, None] * v * v
        if self._has_couplings:  # added to the first DOF's entry: only sums over DOFs are used
            ln = (qs[:, None] + h * v) @ self._coupling_t  # [W, A, R]
            rate = v @ self._coupling_t
            over = torch.clamp(ln - m.coupling_upper, min=0.0)
            under = torch.clamp(m.coupling_lower - ln, min=0.0)
            ec = 0.5 * m.coupling_stiffness * (over * over + under * under)
            ec = ec + 0.5 * h * m.coupling_damping * coup_active[:, None] * rate * rate
            e = torch.cat([e[..., :1] + ec.sum(-1, keepdim=True), e[..., 1:]], dim=-1)
        a, b, effort = (x[:, None] for x in drive)
        # drive: h/b huber(a - b v); with b = 0 the constant force clamp(a)
        hub = huber(a - b * v, effort) * (h / torch.clamp(b, min=1e-30))
        const = -h * torch.maximum(torch.minimum(a, effort), -effort) * v
        return e + torch.where(b > 0, hub, const)

    def _step_length(self, v, dv, grad, mvq, mdv, force, qs, drive, active, u, du, depth0, cterms):
        """Per world, the step length along ``dv``: 1 when the full Newton step lowers the energy enough
        (at least a quarter of the decrease the quadratic model predicts), else the minimiser of the
        quadratic through ``E(0)``, the slope ``grad . dv`` and ``E(1)``, within ``[0.05, 1]``.

        Energy changes use this iteration's lagged quantities (normal forces under friction, active
        dampers); the inertial part is exact: ``dv.M(v - qd) + 1/2 dv.M dv - h force.dv``."""
        m, h = self.model, self.dt
        de = (dv * (mvq - h * force)).sum(-1) + 0.5 * (dv * mdv).sum(-1)
        vv = torch.stack([v, v + dv], dim=1)  # [W, 2, nv]
        ej = self._joint_energy(vv, qs, drive, active)
        de = de + (ej[:, 1] - ej[:, 0]).sum(-1)
        if u is not None:
            cp = m.contact
            act, mu_lam = cterms

            def energy(ux, uy, uz):
                d = torch.clamp(depth0 - h * uz, min=0.0)
                e = 0.5 * cp.stiffness * d * d + 0.5 * h * cp.damping * act * uz * uz
                slip = torch.sqrt(ux * ux + uy * uy)
                return e + h * mu_lam * friction_phi(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck)

            de = de + (energy(*(a + b for a, b in zip(u, du))) - energy(*u)).sum(0)
        slope = (grad * dv).sum(-1)  # < 0: dv is a descent direction (H is positive definite)
        curv = de - slope
        backtrack = torch.clamp(-slope / torch.clamp(2.0 * curv, min=1e-30), min=0.05, max=1.0)
        backtrack = torch.where(torch.isfinite(backtrack), backtrack, torch.full_like(backtrack, 0.05))
        good = de <= 0.25 * slope
        return torch.where(good, torch.ones_like(de), backtrack)

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

from .contact import contact_geometry, point_forces_to_bodies, point_stiffness_to_bodies, point_velocities
from .control import (
    Control,
    _phi_derivative_over_x,
    friction_phi,
    huber,
    integrate,
    tangent_difference,
)
from .dynamics import _mass_matrix, _rnea, composite_rigid_body, generalized_forces, spatial_inertias
from .kinematics import body_twists, compute_frames
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
        drive_saturated: ``[W, nv]`` bool, the drive hit its effort limit.
        nonfinite: ``[W]`` bool, worlds that became non-finite in this step (now frozen).
    """

    state: State
    contact_normal_force: torch.Tensor
    contact_friction_force: torch.Tensor
    contact_depth: torch.Tensor
    contact_position: torch.Tensor
    drive_force: torch.Tensor
    drive_saturated: torch.Tensor
    nonfinite: torch.Tensor


class Simulator:
    """Implicit articulated-body simulator over ``W`` worlds.

    Args:
        model: the :class:`Model`.
        dt: step length, s.
        iterations: Newton iterations per step (fixed).
        line_search: number of step-length candidates ``1, 1/2, 1/4, ...`` tried per iteration (0: always
            take the full Newton step).
        check_inputs: validate shapes/dtypes of the state and control on every step (turn off in hot loops
            once the shapes are known to be right).

    Example::

        sim = ke.sim.Simulator(model, dt=1 / 60)
        state = ke.sim.State.neutral(model, num_worlds=64)
        result = sim.step(state, ke.sim.Control(q_target=state.q))
        state = result.state
    """

    def __init__(
        self, model: Model, *, dt: float, iterations: int = 3, line_search: int = 4, check_inputs: bool = True
    ):
        if not dt > 0:
            raise ValueError(f"dt must be positive, got {dt}")
        self.model = model
        self.dt = float(dt)
        self.iterations = int(iterations)
        self.check_inputs = bool(check_inputs)
        m = model
        self._alphas = torch.tensor([0.5**k for k in range(max(int(line_search), 1))], dtype=m.dtype, device=m.device)
        self._line_search = int(line_search) > 0
        self._has_contact = m.contact.enabled and m.contact_body.numel() > 0
        # a point this close to the ground may touch it within one step under gravity alone
        self._reach = self.dt * self.dt * float(torch.linalg.vector_norm(m.gravity)) + 1e-4
        c = m.contact
        mu = m.contact_friction.reshape(-1)
        self._c_mu0 = mu + c.stiction_extra
        self._c_ratio = torch.where(self._c_mu0 > 0, mu / torch.clamp(self._c_mu0, min=1e-30), torch.ones_like(mu))
        self._c_valid = m.contact_valid.reshape(-1)
        mu0 = m.friction_coulomb + m.friction_stiction
        self._j_mu0 = mu0
        self._j_ratio = torch.where(mu0 > 0, m.friction_coulomb / torch.clamp(mu0, min=1e-30), torch.ones_like(mu0))
        self._j_has_dry = bool((mu0 > 0).any())
        self._j_has_damping = bool((m.damping > 0).any())
        self._has_limits = bool((m.limit_stiffness > 0).any() or (m.limit_damping > 0).any())
        self._has_springs = bool((m.spring_stiffness > 0).any())
        self._scalar = m.scalar_dof.to(m.dtype)
        if m.has_ball_friction:
            g = m.friction_group
            self._group = (g[:, None] == g[None, :]).to(m.dtype)  # [nv, nv] same friction group
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

        # -- once per step: kinematics, inertia, bias, loads -------------------------------------------
        fr = compute_frames(m, q)
        inertia = spatial_inertias(m, fr)
        mass = _mass_matrix(m, fr, inertia)
        force = -_rnea(m, fr, inertia, qd, None)  # generalized force at zero acceleration
        if control.tau_external is not None:
            force = force + control.tau_external
        s = fr.motion

        # drive: tau(v) = clamp(a - b v, +-effort)
        kp = m.drive_stiffness if control.drive_stiffness is None else control.drive_stiffness
        kd = m.drive_damping if control.drive_damping is None else control.drive_damping
        kp = kp.expand(w, -1)
        kd = kd.expand(w, -1)
        drive_a = torch.zeros_like(qd)
        if control.q_target is not None:
            drive_a = drive_a + kp * tangent_difference(m, control.q_target, q)
            drive_b = h * kp + kd
        else:
            drive_b = kd
        if control.qd_target is not None:
            drive_a = drive_a + kd * control.qd_target
        if control.tau_feedforward is not None:
            drive_a = drive_a + control.tau_feedforward
        effort = m.effort_limit.expand(w, -1)
        drive_bsafe = torch.clamp(drive_b, min=1e-30)
        drive_on = drive_b > 0

        qs = q[:, m.scalar_q] * self._scalar  # scalar joint values (0 elsewhere)

        if self._has_contact:
            geo = contact_geometry(m, fr)
            offset, depth0 = geo.offset, geo.depth
        pinned = control.pinned
        v = qd
        if pinned is not None:
            pv = control.pinned_qd if control.pinned_qd is not None else torch.zeros_like(qd)
            v = torch.where(pinned, pv, qd)
            free = (~pinned).to(m.dtype)
            pin_eye = torch.diag_embed(pinned.to(m.dtype))
        cp = m.contact
        mu0c, ratio_c, valid = self._c_mu0, self._c_ratio, self._c_valid

        for _ in range(self.iterations):
            grad = torch.matmul(mass, (v - qd)[..., None])[..., 0] - h * force
            hdiag = torch.zeros_like(v)
            terms = {}

            # joint damping and dry friction
            if self._j_has_damping:
                grad = grad + h * m.damping * v
                hdiag = hdiag + h * m.damping
            if self._j_has_dry:
                speed = self._joint_speed(v)
                wgt = _phi_derivative_over_x(speed, m.friction_falloff, self._j_ratio, m.friction_stribeck)
                grad = grad + h * self._j_mu0 * wgt * v
                hdiag = hdiag + h * self._j_mu0 * wgt
            # limits and springs (scalar DOFs, exact in q + h v)
            if self._has_limits:
                qn = qs + h * v
                over = torch.clamp(qn - m.upper, min=0.0)
                under = torch.clamp(m.lower - qn, min=0.0)
                lim_active = ((over > 0) | (under > 0)).to(m.dtype)
                grad = grad + h * m.limit_stiffness * (over - under) + h * m.limit_damping * lim_active * v
                hdiag = hdiag + (h * h * m.limit_stiffness + h * m.limit_damping) * lim_active
                terms["lim_active"] = lim_active
            if self._has_springs:
                grad = grad + h * m.spring_stiffness * (qs + h * v - m.spring_ref)
                hdiag = hdiag + h * h * m.spring_stiffness
            # drives (implicit PD, clamped)
            x = drive_a - drive_b * v
            tau = torch.maximum(torch.minimum(x, effort), -effort)
            grad = grad - h * tau
            hdiag = hdiag + h * drive_b * torch.where(
                x.abs() > effort, effort / torch.clamp(x.abs(), min=1e-30), torch.ones_like(x)
            )
            hess = mass + torch.diag_embed(hdiag)

            # contact
            if self._has_contact:
                tw = body_twists(m, s, v)
                u = point_velocities(m, tw, offset)
                depth = depth0 - h * u[..., 2]
                act = (depth > 0).to(m.dtype) * valid
                fz = cp.stiffness * torch.clamp(depth, min=0.0) - cp.damping * act * u[..., 2]
                lam = torch.clamp(fz, min=0.0) * act
                ut = u[..., :2]
                slip = torch.sqrt((ut * ut).sum(-1))
                mu_lam = mu0c * lam
                fw = _phi_derivative_over_x(slip, cp.falloff_vel, ratio_c, cp.stribeck_vel) * mu_lam
                pf = torch.cat([-fw[..., None] * ut, fz[..., None]], dim=-1)
                grad = grad - h * generalized_forces(m, s, point_forces_to_bodies(m, offset, pf))
                # curvature: the penalty also for points that could reach the ground in this step
                near = ((depth0 + h * u[..., 2].abs() + self._reach) > 0).to(m.dtype) * valid
                kz = h * (h * cp.stiffness + cp.damping) * torch.maximum(act, near)
                kt = h * fw
                stiff = torch.stack([kt, kt, kz], dim=-1)
                hess = hess + composite_rigid_body(m, point_stiffness_to_bodies(m, offset, stiff), s)
                terms.update(u=u, act=act, mu_lam=mu_lam)

            if pinned is not None:
                grad = grad * free
                hess = hess * free[:, :, None] * free[:, None, :] + pin_eye
            chol, _ = torch.linalg.cholesky_ex(hess)
            dv = -torch.cholesky_solve(grad[..., None], chol)[..., 0]
            if self._line_search:
                alpha = self._step_length(
                    v,
                    dv,
                    qd,
                    mass,
                    force,
                    qs,
                    drive_a,
                    drive_b,
                    drive_bsafe,
                    drive_on,
                    effort,
                    terms,
                    offset if self._has_contact else None,
                    depth0 if self._has_contact else None,
                    s,
                )
                v = v + alpha[:, None] * dv
            else:
                v = v + dv

        # -- report and advance ---------------------------------------------------------------------------
        x = drive_a - drive_b * v
        tau = torch.maximum(torch.minimum(x, effort), -effort)
        saturated = x.abs() > effort
        if self._has_contact:
            tw = body_twists(m, s, v)
            u = point_velocities(m, tw, offset)
            depth = depth0 - h * u[..., 2]
            act = (depth > 0).to(m.dtype) * valid
            lam = torch.clamp(cp.stiffness * depth - cp.damping * u[..., 2], min=0.0) * act
            ut = u[..., :2]
            slip = torch.sqrt((ut * ut).sum(-1))
            fw = _phi_derivative_over_x(slip, cp.falloff_vel, ratio_c, cp.stribeck_vel) * mu0c * lam
            normal, friction, cdepth, cpos = lam, -fw[..., None] * ut, depth * valid, geo.position
        else:
            z = torch.zeros(w, 0, dtype=m.dtype, device=m.device)
            normal, friction, cdepth, cpos = z, z[..., None].expand(-1, -1, 2), z, z[..., None].expand(-1, -1, 3)
        q_new = integrate(m, q, v, h)
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
            drive_saturated=saturated,
            nonfinite=newly,
        )

    # ------------------------------------------------------------------------------------------------
    def _joint_speed(self, v: torch.Tensor) -> torch.Tensor:
        """Speed each DOF's dry friction sees: ``|v|`` (hinge, slide), the angular speed (ball)."""
        if self._group is None:
            return v.abs()
        return torch.sqrt(torch.matmul(v * v, self._group))

    def _step_length(
        self, v, dv, qd, mass, force, qs, drive_a, drive_b, drive_bsafe, drive_on, effort, terms, offset, depth0, s
    ):
        """Per world, the candidate step length with the lowest energy change (0 if none decreases it).

        Energies are differences ``E(v + alpha dv) - E(v)`` per term, with the lagged quantities of this
        iteration (normal forces for friction, active damping) held fixed."""
        m = self.model
        h = self.dt
        al = self._alphas  # [A]
        a2 = al[None, :, None]  # [1, A, 1]
        mdv = torch.matmul(mass, dv[..., None])[..., 0]
        de = al[None] * ((v - qd) * mdv).sum(-1, keepdim=True) + 0.5 * al[None] ** 2 * (dv * mdv).sum(-1, keepdim=True)
        de = de - al[None] * h * (force * dv).sum(-1, keepdim=True)  # [W, A]
        v0 = v[:, None]
        v1 = v0 + a2 * dv[:, None]  # [W, A, nv]
        per_dof = torch.zeros_like(v1)
        if self._j_has_damping:
            per_dof = per_dof + 0.5 * h * m.damping * (v1 * v1 - v0 * v0)
        if self._j_has_dry:
            sp0 = self._joint_speed(v)[:, None]
            sp1 = self._joint_speed(v1.reshape(-1, m.nv)).reshape(v1.shape)
            ph = lambda x: friction_phi(x, m.friction_falloff, self._j_ratio, m.friction_stribeck)
            e = h * self._j_mu0 * (ph(sp1) - ph(sp0))
            if self._group is not None:  # a ball joint's potential counted once: divide by its 3 DOFs
                e = e / self._group.sum(-1)
            per_dof = per_dof + e
        if self._has_limits:
            q0 = qs[:, None] + h * v0
            q1 = qs[:, None] + h * v1
            sq = lambda qq: torch.clamp(qq - m.upper, min=0.0) ** 2 + torch.clamp(m.lower - qq, min=0.0) ** 2
            per_dof = per_dof + 0.5 * m.limit_stiffness * (sq(q1) - sq(q0))
            per_dof = per_dof + 0.5 * h * m.limit_damping * terms["lim_active"][:, None] * (v1 * v1 - v0 * v0)
        if self._has_springs:
            r0 = qs[:, None] + h * v0 - m.spring_ref
            r1 = qs[:, None] + h * v1 - m.spring_ref
            per_dof = per_dof + 0.5 * m.spring_stiffness * (r1 * r1 - r0 * r0)
        # drive: h/b (huber(a - b v1) - huber(a - b v0)); with b = 0 a constant force
        da = drive_a[:, None]
        db = drive_b[:, None]
        eff = effort[:, None]
        hub = (huber(da - db * v1, eff) - huber(da - db * v0, eff)) * (h / drive_bsafe[:, None])
        const = -h * torch.maximum(torch.minimum(da, eff), -eff) * (v1 - v0)
        per_dof = per_dof + torch.where(drive_on[:, None], hub, const)
        de = de + per_dof.sum(-1)
        if offset is not None:
            cp = m.contact
            u0 = terms["u"][:, None]  # [W, 1, C, 3]
            du = point_velocities(m, body_twists(m, s, dv), offset)[:, None]
            u1 = u0 + al[None, :, None, None] * du
            d0 = depth0[:, None] - h * u0[..., 2]
            d1 = depth0[:, None] - h * u1[..., 2]
            valid = self._c_valid
            act = terms["act"][:, None]
            ec = 0.5 * cp.stiffness * (torch.clamp(d1, min=0.0) ** 2 - torch.clamp(d0, min=0.0) ** 2) * valid
            ec = ec + 0.5 * h * cp.damping * act * (u1[..., 2] ** 2 - u0[..., 2] ** 2)
            s0 = torch.sqrt((u0[..., :2] ** 2).sum(-1))
            s1 = torch.sqrt((u1[..., :2] ** 2).sum(-1))
            ph = lambda x: friction_phi(x, cp.falloff_vel, self._c_ratio, cp.stribeck_vel)
            ec = ec + h * terms["mu_lam"][:, None] * (ph(s1) - ph(s0))
            de = de + ec.sum(-1)
        de = torch.where(torch.isfinite(de), de, torch.full_like(de, float("inf")))
        best = torch.argmin(de, dim=1)
        alpha = al[best]
        return torch.where(de.gather(1, best[:, None])[:, 0] < 0, alpha, torch.zeros_like(alpha))

"""The time step: backward Euler found by minimising the incremental potential with Newton iterations.

For generalized velocities ``v`` at the end of a step of length ``h`` from ``(q, qd)``::

    E(v) = 1/2 (v - v_pred)^T M (v - v_pred) + U(q (+) h v) + h R(v),   v_pred = qd + h M^-1 (tau_ext - c(q, qd))

``M`` and the bias forces ``c`` (Coriolis, centrifugal, gravity) are evaluated once at ``q``. ``U`` holds
joint-limit springs, passive joint springs, the PD drives and the ground-contact normal penalty; ``R``
holds joint damping, joint friction, limit and contact damping and the contact friction potential (the
drive's damping enters through its implicit force). Joint-space terms use ``q (+) h v`` exactly; contact
positions are linearised at ``q`` (``p(v) = p(q) + h J(q) v``), so one forward kinematics per step serves
all iterations. The rows of cycle joints, tendon spring-dampers, spatial tendons, compliant mimic joints and
the pose controller's Cartesian targets (:mod:`~kangengine.sim.constraints`, :mod:`~kangengine.sim.pose`)
are linearised the same way and add ``J^T diag(w) J`` to the dense Hessian; a drive envelope
(:mod:`~kangengine.sim.drives`) makes the effort clamp speed-dependent and adds a joint speed barrier.
Hard mimic joints (``Model.mimic_matrix``) are equality rows ``C (q + h v) + b = 0``, linear in ``v``: each
Newton iteration solves the KKT system by its Schur complement ``S = C H^-1 C^T`` (``dv += H^-1 C^T
S^-1 (target - C (v + dv))``), and a last projection with the same factors puts a step the line search
shortened back on the rows, so ``r`` stays at round-off whatever the loads (dense solver only).

Newton: exact Hessians of the quadratic terms (``M``, springs, viscous damping, active penalties);
Gauss-Newton / majorizing curvatures for the rest (friction ``phi'(|u|)/|u|``, clamped drives
``min(1, limit/|x|)``), so a full step never overshoots a stick. Each iteration assembles ``H`` from
subtree composites (mass and contact stiffness together), solves ``H dv = -grad`` by the tree-sparse
``L^T D L`` factorisation vectorised over worlds (:mod:`~kangengine.sim.treesolve`) or a batched dense
Cholesky (:class:`LinearSolver`), and picks the step length by the energy (a line search that only
shortens the step when the energy would not decrease). ``M dv`` for the energy and the next gradient
comes from the Newton system itself (``H dv = -grad`` less the non-inertial curvatures), not from another
pass over the tree. The iteration count is fixed and every
choice is a ``torch.where``: no data-dependent Python branching, no host-device synchronisation, static
shapes, so a step can be captured by CUDA graphs or ``torch.compile``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import Enum

import torch

from ..asset.desc import JointType
from .contact import (
    apply_point_stiffness,
    contact_geometry,
    point_stiffness_rows,
    point_velocities,
    point_wrenches,
    self_contact_rows,
)
from .control import Control, friction_phi_derivative_over_x, friction_phi_fast
from .dynamics import (
    apply_inertia,
    composite,
    generalized_forces_t,
    joint_space_lower,
    mass_product_t,
    mechanical_energy_t,
    rnea,
    spatial_inertias,
)
from .fast import FastPathUnavailable, FastStep, fast_step_available, fast_step_unsupported
from .kinematics import compute_frames, dof_path_sums, rows, subtree_sums_
from .model import Model, State
from .treesolve import TreePattern

__all__ = ["Simulator", "StepResult", "LinearSolver", "cholesky_solve"]

# worlds from which the tree-sparse factorisation beats a batched dense Cholesky on CPU (measured)
_TREE_MIN_WORLDS_CPU = 256
# worlds up to which the compiled fast path (kangengine.sim.fast) runs on CPU: it loops over worlds, while
# the torch step's cost per world falls with the batch (measured with benchmarks/bench_sim.py)
_FAST_MAX_WORLDS = 1 << 30


def cholesky_solve(rhs: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """``torch.cholesky_solve(rhs, chol)`` (``rhs [W, n, k]``, lower ``chol [W, n, n]``) whose result for one
    batch entry never depends on where in the batch it sits: LAPACK's float32 triangular solves take
    alignment-dependent code paths (the same system at another batch index differed in the last bit), so
    float32 systems are solved in float64 (the factorisation is not affected) and rounded back."""
    if rhs.dtype == torch.float32:
        return torch.cholesky_solve(rhs.double(), chol.double()).to(rhs.dtype)
    return torch.cholesky_solve(rhs, chol)


class LinearSolver(str, Enum):
    """How a Newton step solves ``H dv = -grad``.

    ``DENSE``: a batched Cholesky factorisation of the dense ``[W, nv, nv]`` Hessian (one small LAPACK or
    cuSOLVER call per world). ``TREE``: the tree-sparse ``L^T D L`` factorisation vectorised over worlds
    (:mod:`kangengine.sim.treesolve`), which needs every joint-space coupling row to stay on one branch
    of the tree. ``AUTO``: ``TREE`` on CPU from a few hundred worlds on where possible, else ``DENSE``.
    All give the same result up to round-off.
    """

    AUTO = "auto"
    DENSE = "dense"
    TREE = "tree"


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
        nonfinite: ``[W]`` bool, worlds that diverged in this step (now frozen): a non-finite state or
            control input, a generalized speed above the simulator's ``divergence_speed`` or a coordinate
            beyond its ``divergence_distance``. The name is kept from when only non-finite states counted.
        energy_correction: ``[W]`` J, the change of mechanical energy this step applied at its start to meet
            the incoming state's ``energy_budget`` (0 where none; see ``Simulator(energy_correction=...)``).
        self_contact_depth: ``[W, P]`` m, penetration of each link-to-link pair (``model.self_pair_names``)
            at the end of the step (> 0: overlapping; negative: the gap), ``P = 0`` unless the model has
            ``ContactParams(self_collision=True)``.
        self_contact_force: ``[W, P]`` N, normal force between the two links of each pair (>= 0; the
            ground's law: ``stiffness * depth - damping * separation speed``).
        self_contact_count: ``[W]`` long, pairs overlapping at the end of the step.
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
    energy_correction: torch.Tensor | None = None
    self_contact_depth: torch.Tensor | None = None
    self_contact_force: torch.Tensor | None = None
    self_contact_count: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class _Drive:
    """PD drive of one step, DOF-major: force ``clamp(a - b v, -effort, effort)``."""

    a: torch.Tensor  # [nv, W]
    b: torch.Tensor  # [nv, 1] or [nv, W]
    hb: torch.Tensor  # h b
    e_coef: torch.Tensor  # h / (2 b) where b > 0, else 0 (energy of the unclamped drive)
    e_const: torch.Tensor | None  # h clamp(a) where b == 0 (a constant force), else 0; None when b > 0 everywhere


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
        solver: :class:`LinearSolver` (or its value) for the Newton systems; ``"auto"`` picks per
            number of worlds and device.
        divergence_speed: m/s and rad/s; a world whose generalized velocity has an entry faster than this
            after a step has diverged (an energy blow-up shows here first) and is frozen at its last state.
        divergence_distance: m (rad for angles); a world with a coordinate farther than this from 0 after a
            step has diverged likewise. A world with a non-finite state or a non-finite control input
            (targets, gains, feed-forward, external forces) is frozen too: all are cheap per-world checks,
            so no absurd number ever leaves the step.
        energy_correction: keep the energy of the conservative forces exact. Gravity and Coriolis forces
            enter a step explicitly (at its start), which alone would let an undamped chain gain energy at
            O(h). Each step therefore hands on ``state.energy_budget``: its starting mechanical energy plus
            the work of every other force (drives, contacts, damping, limits, pins, external loads: the
            impulse ``M (v - qd) + h c`` at the mean velocity ``(qd + v) / 2``, which keeps the implicit
            dissipation of those forces); the next step scales each world's velocities by
            ``sqrt((budget - V) / T)`` (within ``[1/2, 2]`` in energy; not where ``T`` is ~0) before it
            starts and reports the change in ``StepResult.energy_correction``. Exact for a conservative
            chain; for other systems it removes only the spurious part. A state without a budget
            (``State.from_q``) is not corrected.
        fast_path: on the CPU, run each step as one compiled call (:mod:`kangengine.sim.fast`: the same step,
            computed in float64 whatever the model's dtype, equal to this torch step to round-off; 10-20x
            faster at 1-16 worlds, 1.2-2x at thousands) where the model's features allow; ``False``: always the
            torch step. Calls with inputs that require grad take the torch step.
        fast_path_max_worlds: the largest batch the fast path takes (larger ones take the torch step).

    Attributes:
        fast_path: whether the fast path is available for this model (bool).
        fast_path_reason: why not (``"self-collision"``, ``"fast_path=False"``, ...), ``None`` when it is.
        fast_path_max_worlds: as given.

    Example::

        sim = ke.sim.Simulator(model, dt=1 / 60)
        state = ke.sim.State.neutral(model, num_worlds=64)
        result = sim.step(state, ke.sim.Control(q_target=state.q))
        state = result.state
    """

    def __init__(
        self,
        model: Model,
        *,
        dt: float,
        iterations: int = 2,
        line_search: bool = True,
        check_inputs: bool = True,
        solver: LinearSolver | str = LinearSolver.AUTO,
        divergence_speed: float = 1e4,
        divergence_distance: float = 1e6,
        energy_correction: bool = True,
        fast_path: bool = True,
        fast_path_max_worlds: int = _FAST_MAX_WORLDS,
    ):
        if not dt > 0:
            raise ValueError(f"dt must be positive, got {dt}")
        if not (divergence_speed > 0 and divergence_distance > 0):
            raise ValueError(
                f"divergence_speed and divergence_distance must be positive, got {divergence_speed}, "
                f"{divergence_distance}"
            )
        self.energy_correction = bool(energy_correction)
        self.divergence_speed = float(divergence_speed)
        self.divergence_distance = float(divergence_distance)
        try:
            self.solver = LinearSolver(solver)
        except ValueError:
            choices = ", ".join(repr(x.value) for x in LinearSolver)
            raise ValueError(f"solver must be one of {choices}, got {solver!r}") from None
        self.model = m = model
        self.dt = h = float(dt)
        self.iterations = int(iterations)
        self.check_inputs = bool(check_inputs)
        self._line_search = bool(line_search)
        col = lambda x: x.reshape(-1, 1).contiguous()  # per-DOF / per-point constants as [n, 1] columns
        # -- contacts (quantities are [C, W]) --
        c = m.contact
        self._has_contact = c.enabled and m.num_contact_points > 0
        # a point this close to the ground may touch it within one step under gravity alone
        self._reach = h * h * float(torch.linalg.vector_norm(m.gravity)) + 1e-4
        mu = m.contact_friction[:, None]
        self._c_mu0 = mu + c.stiction_extra
        self._c_ratio = torch.where(self._c_mu0 > 0, mu / torch.clamp(self._c_mu0, min=1e-30), torch.ones_like(mu))
        self._c_stribeck = c.stribeck_vel if c.stribeck_vel > 0 else 0.0
        self._c_mu0h = h * self._c_mu0
        self._kn_const = h * (h * c.stiffness + c.damping)  # normal curvature of an active (or near) point
        # -- joint terms (quantities are [nv, W]) --
        mu0 = m.dof_friction_coulomb + m.dof_friction_stiction
        self._j_has_dry = bool((mu0 > 0).any())
        self._j_mu0h = col(h * mu0)
        ratio = torch.where(mu0 > 0, m.dof_friction_coulomb / torch.clamp(mu0, min=1e-30), torch.ones_like(mu0))
        self._j_ratio = col(ratio)
        self._j_falloff = col(m.dof_friction_falloff)
        self._j_stribeck = col(m.dof_friction_stribeck) if bool((m.dof_friction_stribeck > 0).any()) else 0.0
        self._has_limits = bool((m.dof_limit_stiffness > 0).any() or (m.dof_limit_damping > 0).any())
        self._has_springs = bool((m.dof_spring_stiffness > 0).any())
        self._has_damping = bool((m.dof_damping > 0).any())
        self._has_effort = bool(torch.isfinite(m.dof_effort_limit).any())
        self._effort = col(m.dof_effort_limit)
        # whether the drive's implicit damping b (h kp + kd with a position target, else kd) is positive on
        # every DOF for the model's own gains (else the energy needs the constant-force branch)
        self._drive_b_positive = {
            True: bool((h * m.dof_drive_stiffness + m.dof_drive_damping > 0).all()),
            False: bool((m.dof_drive_damping > 0).all()),
        }
        # exact constant curvature of the quadratic joint terms (viscous damping, passive springs)
        self._diag_const = col(h * m.dof_damping + h * h * m.dof_spring_stiffness)
        self._spring_h = col(h * m.dof_spring_stiffness)
        self._spring_ref = col(m.dof_spring_ref)
        self._lower, self._upper = col(m.dof_lower), col(m.dof_upper)
        self._klim_h = col(h * m.dof_limit_stiffness)
        self._dlim_h = col(h * m.dof_limit_damping)
        self._lim_curv = col(h * h * m.dof_limit_stiffness + h * m.dof_limit_damping)
        self._armature = col(m.dof_armature)
        self._e_damp = col(0.5 * h * m.dof_damping)  # energies (line search)
        self._e_spring = col(0.5 * m.dof_spring_stiffness)
        self._e_klim = col(0.5 * m.dof_limit_stiffness)
        self._e_dlim = col(0.5 * h * m.dof_limit_damping)
        self._scalar = col(m.dof_is_scalar.to(m.dtype))
        if m.has_ball_friction:
            g = m.dof_friction_group
            self._group = (g[:, None] == g[None, :]).to(m.dtype)  # [nv, nv] same friction group (symmetric)
            self._group_size = col(self._group.sum(-1))
        else:
            self._group = None
        # -- joint-space coupling rows (quantities are [R, W]) --
        self._has_couplings = m.coupling_matrix is not None and m.coupling_matrix.shape[0] > 0
        self._tree = TreePattern(m.dof_above, m.device)
        if self._has_couplings:
            self._coupling = m.coupling_matrix.contiguous()  # [R, nv]
            self._coupling_t = m.coupling_matrix.t().contiguous()  # [nv, R]
            self._c_lower, self._c_upper = col(m.coupling_lower), col(m.coupling_upper)
            self._c_kh = col(h * m.coupling_stiffness)
            self._c_dh = col(h * m.coupling_damping)
            self._c_curv = col(h * h * m.coupling_stiffness + h * m.coupling_damping)
            self._c_ek = col(0.5 * m.coupling_stiffness)
            self._c_ed = col(0.5 * h * m.coupling_damping)
            # lower-triangle entries (i >= j) touched by some row, and each row's c_i c_j there
            cm = m.coupling_matrix.detach().cpu().double()
            outer = torch.einsum("ri,rj->rij", cm, cm).tril()
            pos = torch.nonzero(outer.abs().sum(0) > 0)
            # the dense Hessian is a transposed view: its (i, j) entry lives at j * nv + i
            self._coupling_pos_t = (pos[:, 1] * m.nv + pos[:, 0]).to(m.device)
            self._coupling_outer_t = outer[:, pos[:, 0], pos[:, 1]].t().contiguous().to(m.dtype).to(m.device)  # [P, R]
            # the tree-sparse pattern cannot hold a coupling row that spans two branches
            self._coupling_pos_tree = self._tree.positions(pos[:, 0], pos[:, 1])
            if self._coupling_pos_tree is None:
                self._tree = None
        # -- rows of cycle joints and tendons, drive envelope (kangengine.sim.constraints / .drives) --
        self._rows = m.constraints if m.constraints is not None and m.constraints.num_rows > 0 else None
        self._envelope = m.drive_envelope
        if self._envelope is not None:
            self._has_effort = True
        if self._rows is not None:  # dense rows J^T W J: the tree-sparse pattern cannot hold them
            if self.solver is LinearSolver.TREE:
                raise ValueError(f"{m.name}: cycle joints and tendon rows need solver='dense' (or 'auto')")
            self._tree = None
        # -- hard mimic joints: equality rows C q + b = 0 of the Newton solve (a KKT step, dense) --
        self._hard = m.mimic_matrix is not None and m.mimic_matrix.shape[0] > 0
        if self._hard:
            if self.solver is LinearSolver.TREE:
                raise ValueError(f"{m.name}: hard mimic joints need solver='dense' (or 'auto')")
            self._tree = None
            self._mimic = m.mimic_matrix.contiguous()  # [M, nv]
            self._mimic_t = m.mimic_matrix.t().contiguous()  # [nv, M]
            self._mimic_bias = col(m.mimic_bias)
        if self._tree is not None:
            self._assembly = self._assembly_plan(self._tree)
        # -- link-to-link contact pairs (quantities are [P, W]); dense rank-one rows, like the cycle rows --
        self._has_self = m.contact.self_collision and m.num_self_pairs > 0
        if self._has_self:
            if self.solver is LinearSolver.TREE:
                raise ValueError(f"{m.name}: self-collision needs solver='dense' (or 'auto')")
            self._tree = None
            moves = m.dof_moves_body
            pair_body = m.self_geom_body.index_select(0, m.self_pair_geom.reshape(-1)).reshape(-1, 2)
            self._self_sign = (
                moves.index_select(0, pair_body[:, 0]) - moves.index_select(0, pair_body[:, 1])
            ).contiguous()
        if self.solver is LinearSolver.TREE and self._tree is None:
            raise ValueError(
                f"{m.name}: a joint-space coupling row (fixed tendon or mimic joint) joins two branches of the "
                "tree, so the tree-sparse solver cannot be used; use solver='dense'"
            )
        # -- the CPU fast path: the same step as one compiled call (kangengine.sim.fast) --
        self._fast = None
        reason = "fast_path=False" if not fast_path else fast_step_unsupported(m, self) or fast_step_available()
        if reason is None:
            self._fast = FastStep(self)
        self.fast_path = self._fast is not None
        self.fast_path_reason = reason
        self.fast_path_max_worlds = int(fast_path_max_worlds)

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
        if self._fast is not None and w <= self.fast_path_max_worlds and self._fast.accepts(state, control):
            try:
                return self._fast.step(state, control)
            except FastPathUnavailable as exc:  # recorded once; the torch step from now on
                warnings.warn(f"kangengine.sim: fast path off: {exc}", stacklevel=2)
                self._fast, self.fast_path, self.fast_path_reason = None, False, str(exc)
        tree = self._use_tree(w, q.device) if control.pose_targets is None else None  # pose rows are dense

        # -- once per step: kinematics, inertia, bias, loads ----------------------------------------------
        # Inside the step everything per DOF is DOF-major ([nv, W], worlds innermost) like the tree
        # quantities ([B, W]) and contact points ([C, W]). The Hessian is assembled once per iteration
        # from subtree composites (mass and contact stiffness together); M x products are never formed
        # separately: the Newton system gives M dv.
        fr = compute_frames(m, q)
        s = fr.motion
        inertia = spatial_inertias(m, fr)
        qd_t = qd.t().contiguous()
        tw0 = dof_path_sums(m, fr.motion_stack * qd_t[:, None, :])  # [B, 6, W] body twists
        energy_fix = kin0 = pot0 = None
        if self.energy_correction:
            kin0, pot0 = mechanical_energy_t(m, fr, inertia, tw0, qd_t)
            if state.energy_budget is not None:
                scale, energy_fix = self._energy_scale(state, kin0, pot0)
                qd_t, tw0, kin0 = qd_t * scale, tw0 * scale, kin0 + energy_fix
        twists = [tw0]
        bias = rnea(m, fr, inertia, qd_t, None, twists=tw0, dof_major=True)  # c(q, qd)
        force = -bias
        if control.tau_external is not None:
            force = force.add_(control.tau_external.t())
        drive = self._drive(control, q, w)
        qs = q.t().index_select(0, m.dof_q_index).mul_(self._scalar)  # scalar joint values (0 elsewhere)
        spring0 = (qs - self._spring_ref).mul_(self._spring_h) if self._has_springs else None
        coupling_q = self._coupling @ qs if self._has_couplings else None  # coupling values at q
        crow = self._rows.rows_at(m, fr, qs) if self._rows is not None else None  # cycle/tendon rows at q
        if control.pose_targets is not None:  # the pose controller's Cartesian PD rows
            prow = control.pose_targets.rows_at(m, fr)
            crow = prow if crow is None else crow.concat(prow)
        pinned = control.pinned
        v = qd_t
        if pinned is not None:
            pin_b = pinned.t()
            pv = control.pinned_qd.t() if control.pinned_qd is not None else torch.zeros_like(qd_t)
            v = torch.where(pin_b, pv, qd_t)
            pin_t = pin_b.to(m.dtype)
            free_t = 1.0 - pin_t
            if tree:
                pin_entries = free_t.index_select(0, tree.row).mul_(free_t.index_select(0, tree.col))
            else:
                free_w = free_t.t()
                pin_eye = torch.diag_embed(pin_t.t())
        if tree:  # DOF motions at the column of every stored Hessian entry outside the root columns
            gen_col = self._assembly["gen_col"]
            s_col = [c.index_select(0, gen_col) for c in s] if gen_col.numel() else []
        u = depth0 = None
        if self._has_contact:
            geo = contact_geometry(m, fr)
            offset, depth0 = geo.offset, geo.depth
            depth_reach = depth0 + self._reach
            neg_offset = (-offset[1], -offset[2])
            tw = twists[0] if pinned is None else dof_path_sums(m, fr.motion_stack * v[:, None, :])
            u = point_velocities(m, tw, offset)  # linear in v: updated below, never recomputed
            nb = m.num_bodies
            body_base = torch.cat([torch.stack(inertia, dim=1), inertia[0].new_zeros(nb, 12, w)], dim=1)  # [B, 22, W]
        else:
            mass_applied = apply_inertia(composite(m, inertia), s)
            if tree:
                mass_h = self._assemble(tree, s_col, mass_applied)
            else:
                mass_h = joint_space_lower(m, mass_applied, fr.motion_rows)
        # M (v - qd), kept up to date below (its contact part as pending point forces)
        if pinned is None:
            mvq = torch.zeros_like(v)
        else:
            dvq = v - qd_t
            tw_q = dof_path_sums(m, fr.motion_stack * dvq[:, None, :]).unbind(1)
            mvq = generalized_forces_t(m, s, apply_inertia(inertia, tw_q)).addcmul_(self._armature, dvq)
        pending = None
        srow = None
        mimic = None
        if self._hard:  # end-of-step rows C (q + h v) + b = 0, i.e. C v = -(C q + b) / h, on the free DOFs
            mimic_target = (self._mimic @ qs + self._mimic_bias).mul_(-1.0 / h)  # [M, W]
            mimic_ct = self._mimic_t.expand(w, -1, -1) if pinned is None else self._mimic_t * free_w[:, :, None]
        if self._has_self:  # link-to-link pairs, linearised at q like the ground contact
            srow = self_contact_rows(m, fr, self._self_sign)
            srate = torch.einsum("pjw,jw->pw", srow.direction, v)  # separation speeds, linear in v

        for it in range(self.iterations):
            last = it == self.iterations - 1
            grad, hd, jaux = self._joint_terms(v, qs, spring0, drive)
            grad = grad.add_(mvq).add_(force, alpha=-h)
            caux = None
            if self._has_contact:
                points, caux = self._contact_terms(u, depth0, depth_reach, offset, neg_offset, pending)
                body = body_base.clone().index_add_(0, m.contact_point_body, points)
                comp_t = subtree_sums_(m, body).index_select(0, m.dof_body)  # [nv, 22, W]
                grad = grad.sub_((fr.motion_stack * comp_t[:, 16:]).sum(1))  # J^T (h f - pending)
                applied = apply_point_stiffness(comp_t[:, :16].unbind(1), s)
                hess = self._assemble(tree, s_col, applied) if tree else joint_space_lower(m, applied, fr.motion_rows)
            elif tree:
                hess = torch.empty_like(mass_h)
                hess[: tree.nnz] = mass_h[: tree.nnz]
            else:
                hess = mass_h.clone(memory_format=torch.preserve_format)
            diag = hd + self._armature
            if tree:
                hess.index_add_(0, tree.diag, diag.expand(-1, w))
            else:
                hess.diagonal(dim1=-2, dim2=-1).add_(diag.t())
            coup = None
            if self._has_couplings:
                cgrad, coup, cvals = self._coupling_terms(v, coupling_q)
                grad = grad.add_(cgrad)
                if tree:
                    hess.index_add_(0, self._coupling_pos_tree, cvals)
                else:
                    hess.mT.reshape(w, -1).index_add_(1, self._coupling_pos_t, cvals.t())
            if crow is not None:
                rgrad, rhess, ract = crow.terms(v, h)
                grad = grad.add_(rgrad)
                hess = hess + rhess
            if srow is not None:
                sgrad, shess, sk, sact = self._self_terms(srow, srate)
                grad = grad.add_(sgrad)
                hess = hess + shess
            if pinned is not None:
                grad = grad.mul_(free_t)
                if tree:
                    hess[: tree.nnz].mul_(pin_entries)
                    hess.index_add_(0, tree.diag, pin_t)
                else:
                    hess = hess * free_w[:, :, None] * free_w[:, None, :] + pin_eye
            if tree:
                torch.neg(grad, out=hess[tree.nnz :])
                dv = tree.solve_(hess)
            else:
                chol, _ = torch.linalg.cholesky_ex(hess)
                dv = cholesky_solve(grad.t().unsqueeze(-1), chol).squeeze(-1).t().neg().contiguous()
                if self._hard:  # KKT step: dv += H^-1 C^T lambda with C (v + dv) = target (Schur complement)
                    mimic = self._mimic_factor(chol, mimic_ct)
                    dv, mimic_lam = self._mimic_correct(mimic, mimic_target, v, dv)
            if self._has_contact:
                du = point_velocities(m, dof_path_sums(m, fr.motion_stack * dv[:, None, :]), offset)
            else:
                du = None
            if coup is not None:
                coup = coup + (self._coupling @ dv,)  # (activity, weight, C v, C dv)
            if srow is not None:
                srate_dv = torch.einsum("pjw,jw->pw", srow.direction, dv)
            if last and not self._line_search:  # the full step; nothing else is needed
                v = v.add(dv)
                if srow is not None:
                    srate = srate + srate_dv
                if self._has_contact:
                    u = tuple(a + b for a, b in zip(u, du))
                continue
            # M dv on the free DOFs from the Newton system H dv = -grad, H = M + K_contact + diag(hd) + C^T W C
            # (pinned rows of M dv are not used: their gradient is zeroed and their dv is 0); the contact part
            # K dv = J^T (K du) stays in point space ("pending") until the next iteration maps its forces
            mdv = grad.add(hd * dv)
            if mimic is not None:  # H dv = -grad + C^T lambda
                mdv = mdv.sub_(torch.einsum("wnm,mw->nw", mimic_ct, mimic_lam))
            if coup is not None:
                mdv = mdv.add_(self._coupling_t @ (coup[1] * coup[3]))
            if crow is not None:
                mdv = mdv.add_(torch.einsum("wnm,mw->nw", rhess, dv))
            if srow is not None:
                mdv = mdv.add_(torch.einsum("pjw,pw->jw", srow.direction, sk * srate_dv))
            mdv = mdv.neg_()
            kdu = None
            dmd = (dv * mdv).sum(0)
            if self._has_contact:
                kt, kn = caux[2], caux[3]
                kdu = (kt * du[0], kt * du[1], kn * du[2])
                dmd = dmd - (kdu[0] * du[0] + kdu[1] * du[1] + kdu[2] * du[2]).sum(0)  # - du.K du
            if self._line_search:
                de = (dv * torch.add(mvq, force, alpha=-h)).sum(0) + 0.5 * dmd
                if pending is not None:
                    de = de + (pending[0] * du[0] + pending[1] * du[1] + pending[2] * du[2]).sum(0)
                if crow is not None:
                    de = de + crow.energy(v + dv, h, ract) - crow.energy(v, h, ract)
                if srow is not None:
                    de = de + (
                        self._self_energy(srow, srate + srate_dv, sact) - self._self_energy(srow, srate, sact)
                    ).sum(0)
                alpha = self._step_length(v, dv, grad, de, qs, drive, jaux, coup, coupling_q, u, du, depth0, caux)
                if self._envelope is not None and self._envelope.has_speed_limit:
                    alpha = self._envelope.speed_step(v, dv, alpha)
                a_row = alpha[None, :]
            else:
                a_row = 1.0
            v = v + a_row * dv
            if self._has_contact:
                u = tuple(a + a_row * b for a, b in zip(u, du))
            if srow is not None:
                srate = srate + a_row * srate_dv
            if not last:
                mvq = mvq + a_row * mdv
                if self._has_contact:  # - alpha K du, mapped with the next iteration's contact forces
                    kdu = tuple(-a_row * k for k in kdu)
                    pending = kdu if pending is None else tuple(p + k for p, k in zip(pending, kdu))

        if mimic is not None:  # a step the line search shortened still ends on the constraint (round-off)
            v = v + self._mimic_correct(mimic, mimic_target, v, torch.zeros_like(v))[0]

        # -- report and advance ---------------------------------------------------------------------------
        x = torch.addcmul(drive.a, drive.b, v, value=-1.0)
        effort = self._effort if self._envelope is None else self._envelope.effort_bound(v.abs())
        tau = torch.clamp(x, -effort, effort)
        saturated = x.abs() > effort
        if self._has_contact:
            cp = m.contact
            ux, uy, uz = u
            depth = depth0 - h * uz
            act = (depth > 0).to(m.dtype)
            lam = torch.clamp(cp.stiffness * depth - cp.damping * uz, min=0.0) * act
            slip = torch.sqrt(ux * ux + uy * uy)
            fw = (
                friction_phi_derivative_over_x(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck)
                * self._c_mu0
                * lam
            )
            normal, cdepth = lam.t(), depth.t()
            friction = torch.stack([-fw * ux, -fw * uy], -1).transpose(0, 1)
            cpos = rows(geo.position)
        else:
            z = torch.zeros(w, 0, dtype=m.dtype, device=m.device)
            normal, friction, cdepth, cpos = z, z[..., None].expand(-1, -1, 2), z, z[..., None].expand(-1, -1, 3)
        if srow is not None:
            cp = m.contact
            sdepth = srow.depth - h * srate
            sforce = torch.clamp(cp.stiffness * sdepth - cp.damping * srate, min=0.0) * (sdepth > 0).to(m.dtype)
            self_out = (sdepth.t().contiguous(), sforce.t().contiguous(), (sdepth > 0).sum(0))
        else:
            z = torch.zeros(w, 0, dtype=m.dtype, device=m.device)
            self_out = (z, z, torch.zeros(w, dtype=torch.long, device=m.device))
        budget = None
        if self.energy_correction:  # E(q, qd) + the work of the other forces at the mean velocity
            impulse = mass_product_t(m, fr, inertia, v - qd_t).add_(bias, alpha=h)  # M (v - qd) + h c
            budget = kin0 + pot0 + (0.5 * (qd_t + v) * impulse).sum(0)
        v_w = v.t()
        q_new = m.layout.integrate(q, v_w, h)
        # |x| <= bound is False for NaN and inf: one comparison per entry flags every kind of divergence
        within = (q_new.abs() <= self.divergence_distance).all(-1) & (v_w.abs() <= self.divergence_speed).all(-1)
        within = within & torch.isfinite(drive.a).all(0) & torch.isfinite(drive.b).all(0)
        if control.tau_external is not None:
            within = within & torch.isfinite(control.tau_external).all(-1)
        frozen = state.frozen | ~within
        newly = frozen & ~state.frozen
        q_out = torch.where(frozen[:, None], q, q_new)
        v_out = torch.where(frozen[:, None], qd, v_w).contiguous()
        if budget is not None:
            budget = torch.where(frozen, kin0 + pot0, budget)
        if energy_fix is None:
            energy_fix = torch.zeros(w, dtype=m.dtype, device=m.device)
        return StepResult(
            state=State(q=q_out, qd=v_out, frozen=frozen, energy_budget=budget),
            energy_correction=energy_fix,
            self_contact_depth=self_out[0],
            self_contact_force=self_out[1],
            self_contact_count=self_out[2],
            contact_normal_force=normal,
            contact_friction_force=friction,
            contact_depth=cdepth,
            contact_position=cpos,
            drive_force=tau.t().contiguous(),
            drive_force_requested=x.t().contiguous(),
            drive_saturated=saturated.t().contiguous(),
            nonfinite=newly,
        )

    def _mimic_factor(self, chol, ct):
        """``(H^-1 C^T [W, nv, M], Cholesky factor of S = C H^-1 C^T [W, M, M])`` for the hard mimic rows
        (``ct``: ``C^T`` with the pinned DOFs' rows zeroed). ``S`` gets a relative ``1e-12`` on its diagonal
        so that a row whose DOFs are all pinned (a zero row) stays solvable and moves nothing."""
        hinv_ct = cholesky_solve(ct, chol)  # [W, nv, M]
        schur = ct.transpose(1, 2) @ hinv_ct  # [W, M, M]
        diag = schur.diagonal(dim1=-2, dim2=-1)
        eps = 1e-12 * diag.abs().amax(-1, keepdim=True) + 1e-300
        schur = schur + torch.diag_embed(eps.expand_as(diag))
        return hinv_ct, torch.linalg.cholesky_ex(schur)[0]

    def _mimic_correct(self, mimic, target, v, dv):
        """``dv`` corrected so that ``C (v + dv) = target`` (``[M, W]``) with the least change in the ``H``
        metric: ``dv + H^-1 C^T lambda``, ``lambda = S^-1 (target - C (v + dv))``; returns it and
        ``lambda [M, W]`` (times ``-1/h``, the rows' generalized impulse per unit row)."""
        hinv_ct, schur_chol = mimic
        gap = target - self._mimic @ (v + dv)  # [M, W]
        lam = cholesky_solve(gap.t().unsqueeze(-1), schur_chol).squeeze(-1)  # [W, M]
        return dv + torch.einsum("wnm,wm->nw", hinv_ct, lam), lam.t()

    def _self_terms(self, srow, rate):
        """Gradient ``[nv, W]``, Hessian ``[W, nv, nv]`` (exact: rank one per pair), curvature ``[P, W]`` and
        lagged activity ``[P, W]`` of the link-to-link penalties at separation speeds ``rate [P, W]``:
        energy ``stiffness/2 depth^2 + h damping/2 act rate^2`` with ``depth = depth0 - h rate`` (the ground's
        normal law along the pair's normal)."""
        cp, h = self.model.contact, self.dt
        depth = srow.depth - h * rate
        act = (depth > 0).to(rate.dtype)
        lam = cp.stiffness * torch.clamp(depth, min=0.0) - cp.damping * act * rate
        near = (srow.depth + h * rate.abs() + self._reach > 0).to(rate.dtype)  # could touch within the step
        curv = near * self._kn_const
        grad = torch.einsum("pjw,pw->jw", srow.direction, -h * lam)
        hess = torch.einsum("piw,pjw->wij", srow.direction * curv[:, None, :], srow.direction)
        return grad, hess, curv, act

    def _self_energy(self, srow, rate, act):
        """``[P, W]`` energy of the link-to-link penalties at separation speeds ``rate`` (lagged activity)."""
        cp, h = self.model.contact, self.dt
        pen = torch.clamp(srow.depth - h * rate, min=0.0)
        return 0.5 * cp.stiffness * pen * pen + (0.5 * h * cp.damping) * act * rate * rate

    def _energy_scale(self, state: State, kin: torch.Tensor, pot: torch.Tensor):
        """Per world, the velocity scale ``[1, W]`` that meets ``state.energy_budget`` (1 where frozen, at
        rest or non-finite) and the kinetic-energy change ``[W]`` J it makes."""
        ratio = (state.energy_budget - pot) / torch.clamp(kin, min=1e-30)
        ok = (kin > 1e-9) & torch.isfinite(ratio) & ~state.frozen
        ratio = torch.where(ok, torch.clamp(ratio, 0.5, 2.0), 1.0)
        return torch.sqrt(ratio)[None, :], kin * (ratio - 1.0)

    # -- terms --------------------------------------------------------------------------------------------
    def solver_for(self, num_worlds: int, device: torch.device | str | None = None) -> LinearSolver:
        """The solver (``DENSE`` or ``TREE``) a step of ``num_worlds`` worlds on ``device`` (default: the
        model's) uses. A caller whose number of worlds changes (a tracker that drops finished worlds) can
        build its :class:`Simulator` with this fixed choice, so that each world's result never depends on
        how many others share its batch."""
        dev = torch.device(device) if device is not None else self.model.device
        return LinearSolver.TREE if self._use_tree(int(num_worlds), dev) is not None else LinearSolver.DENSE

    def _use_tree(self, w: int, device: torch.device) -> TreePattern | None:
        """The tree pattern when this step solves with it (a choice by shape and device only)."""
        if self.solver is LinearSolver.DENSE or self._tree is None:
            return None
        if self.solver is LinearSolver.TREE or (device.type == "cpu" and w >= _TREE_MIN_WORLDS_CPU):
            return self._tree
        return None

    def _assembly_plan(self, tree: TreePattern) -> dict:
        """Index plan of :meth:`_assemble`. The free root's DOF motions are unit spatial vectors (world axes
        about the root origin: linear DOF k moves along e_k, angular DOF k turns about e_k through the
        origin), so an entry in a root column is one component of the row's composite wrench, no dot
        product; the other entries take one."""
        m = self.model
        unit = [-1] * m.nv
        for blk in m.layout.blocks:
            if blk.joint_type is JointType.FREE and m.parents[blk.body_index] < 0:
                start = blk.qd_slice.start
                for k in range(3):
                    unit[start + k] = 3 + k  # linear velocity e_k: force component k
                    unit[start + 3 + k] = k  # angular velocity e_k: moment component k
        row, col = tree.row.tolist(), tree.col.tolist()
        u_pos = [e for e, c in enumerate(col) if unit[c] >= 0]
        g_pos = [e for e, c in enumerate(col) if unit[c] < 0]
        lt = lambda x: torch.as_tensor(x, dtype=torch.long, device=m.device)
        return {
            "unit_pos": lt(u_pos),
            "unit_src": lt([row[e] * 6 + unit[col[e]] for e in u_pos]),
            "gen_pos": lt(g_pos),
            "gen_row": lt([row[e] for e in g_pos]),
            "gen_col": lt([col[e] for e in g_pos]),
        }

    def _assemble(self, tree: TreePattern, s_col: list, applied) -> torch.Tensor:
        """``[nnz + nv, W]``: the stored entries ``H[i, j] = s_j . (Xc_body(i) s_i)`` (``i >= j``) of the
        joint-space matrix whose subtree-composite operators applied to each DOF's motion are ``applied``
        (6 x ``[nv, W]``), then room for the right-hand side; ``s_col``: the motion components gathered
        at the general entries' columns (:meth:`_assembly_plan`)."""
        plan = self._assembly
        w = applied[0].shape[1]
        out = applied[0].new_empty(tree.nnz + tree.nv, w)
        stacked = torch.stack(applied, dim=1).view(-1, w)  # [nv * 6, W]
        out.index_copy_(0, plan["unit_pos"], stacked.index_select(0, plan["unit_src"]))
        if s_col:
            rows = plan["gen_row"]
            h = s_col[0] * applied[0].index_select(0, rows)
            for sc, f in zip(s_col[1:], applied[1:]):
                h = h.addcmul_(sc, f.index_select(0, rows))
            out.index_copy_(0, plan["gen_pos"], h)
        return out

    def _drive(self, control: Control, q: torch.Tensor, w: int) -> _Drive:
        m, h = self.model, self.dt
        kp = m.dof_drive_stiffness if control.drive_stiffness is None else control.drive_stiffness
        kd = m.dof_drive_damping if control.drive_damping is None else control.drive_damping
        if control.q_target is not None:
            a = kp * m.layout.difference(control.q_target, q)
            b = h * kp + kd
        else:
            a = None
            b = kd
        if control.qd_target is not None:
            a = kd * control.qd_target if a is None else a.addcmul_(kd, control.qd_target)
        if control.tau_feedforward is not None:
            a = control.tau_feedforward if a is None else a + control.tau_feedforward
        a = torch.zeros(m.nv, w, dtype=m.dtype, device=m.device) if a is None else a.t().contiguous()
        b = b.reshape(-1, 1) if b.dim() == 1 else b.t().contiguous()
        pos = b > 0
        e_coef = torch.where(pos, (0.5 * h) / torch.where(pos, b, 1.0), 0.0)
        e_const = None
        model_gains = control.drive_stiffness is None and control.drive_damping is None
        if not (model_gains and self._drive_b_positive[control.q_target is not None]):
            e_const = torch.where(pos, 0.0, h * torch.clamp(a, -self._effort, self._effort))
        return _Drive(a=a, b=b, hb=h * b, e_coef=e_coef, e_const=e_const)

    def _joint_speed(self, v: torch.Tensor) -> torch.Tensor:
        """Speed each DOF's dry friction sees: ``|v|`` (hinge, slide), the angular speed (ball); DOF-major,
        any leading dimensions."""
        if self._group is None:
            return v.abs()
        return torch.sqrt(torch.matmul(self._group, v * v))

    def _joint_terms(self, v, qs, spring0, drive: _Drive):
        """Gradient ``[nv, W]``, diagonal Hessian (everything on the diagonal except the armature) and
        the lagged limit activity of the joint-space terms at ``v``."""
        m, h = self.model, self.dt
        if spring0 is not None:
            grad = torch.addcmul(spring0, self._diag_const, v)
        elif self._has_damping:
            grad = self._diag_const * v
        else:
            grad = torch.zeros_like(v)
        hd = self._diag_const
        lim_active = None
        if self._j_has_dry:
            wgt = friction_phi_derivative_over_x(self._joint_speed(v), self._j_falloff, self._j_ratio, self._j_stribeck)
            wgt = wgt.mul_(self._j_mu0h)
            grad = grad.addcmul_(wgt, v)
            hd = hd + wgt
        if self._has_limits:
            qn = torch.add(qs, v, alpha=h)
            lim = qn - torch.clamp(qn, self._lower, self._upper)  # distance beyond the range (signed)
            lim_active = (lim != 0).to(m.dtype)
            grad = grad.addcmul_(self._klim_h, lim).addcmul_(self._dlim_h * lim_active, v)
            hd = hd + self._lim_curv * lim_active
        x = torch.addcmul(drive.a, drive.b, v, value=-1.0)
        effort = self._effort
        if self._envelope is not None:  # the envelope's bound at this iterate's speed (lagged), speed barrier
            effort = self._envelope.effort_bound(v.abs())
            if self._envelope.has_speed_limit:
                sg, sh = self._envelope.speed_terms(v)
                grad, hd = grad.add_(sg), hd + sh
        if self._has_effort:
            grad = grad.add_(torch.clamp(x, -effort, effort), alpha=-h)
            # majorizing curvature of the clamped drive: b inside the limit, b * limit / |x| outside
            hd = hd + drive.hb * torch.clamp(effort / torch.clamp(x.abs(), min=1e-30), max=1.0)
            if self._envelope is not None:  # a saturated drive pushing along v loses effort with speed
                slope = self._envelope.effort_bound_slope(v.abs())
                along = ((x.abs() > effort) & (x * v > 0)).to(v.dtype)
                hd = hd - (h * along) * slope
        else:
            grad = grad.add_(x, alpha=-h)
            hd = hd + drive.hb
        return grad, hd, (lim_active, effort)

    def _coupling_terms(self, v, coupling_q):
        """Gradient ``[nv, W]``, ``(activity, Hessian weights, rates C v)`` (``[R, W]`` each) and the Hessian
        entries ``[P, W]`` (at ``_coupling_pos_tree`` / ``_coupling_pos_t``) of the joint-space coupling
        rows at ``v``; ``coupling_q``: their values ``C q`` at the start of the step."""
        h = self.dt
        rate = self._coupling @ v  # [R, W]
        ln = torch.add(coupling_q, rate, alpha=h)  # values at the end of the step
        lim = ln - torch.clamp(ln, self._c_lower, self._c_upper)
        act = (lim != 0).to(v.dtype)
        force = self._c_kh * lim + self._c_dh * act * rate
        weight = self._c_curv * act
        return self._coupling_t @ force, (act, weight, rate), self._coupling_outer_t @ weight

    def _contact_terms(self, u, depth0, depth_reach, offset, neg_offset, pending):
        """Contact point forces at the current iterate (times ``h``, less the pending ``alpha K du`` of
        earlier iterations) and the point-stiffness features of the Newton model, ``points [C, 22, W]``
        (16 features, see :func:`~kangengine.sim.contact.point_stiffness_rows`, then the spatial force:
        moment about the reference origin, force). Returns ``points`` and the lagged quantities the line
        search keeps fixed, the curvatures and the contact energy at ``u``:
        ``(act, h mu lambda, k_tangent, k_normal, energy [C, W])``."""
        m, h = self.model, self.dt
        cp = m.contact
        ux, uy, uz = u
        rx, ry, rz = offset
        depth = torch.add(depth0, uz, alpha=-h)
        act = (depth > 0).to(m.dtype)
        pen = torch.clamp(depth, min=0.0)
        damp = act * uz
        fz = torch.mul(pen, cp.stiffness).sub_(damp, alpha=cp.damping)
        mlh = torch.clamp(fz, min=0.0).mul_(self._c_mu0h)  # h mu lambda
        slip = torch.sqrt(torch.addcmul(ux * ux, uy, uy))
        kt = friction_phi_derivative_over_x(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck).mul_(mlh)
        # curvature: the penalty also for points that could reach the ground in this step (a majorizer)
        kn = (torch.add(depth_reach, uz.abs(), alpha=h) > 0).to(m.dtype).mul_(self._kn_const)
        energy = (pen * pen).mul_(0.5 * cp.stiffness).addcmul_(damp, uz, value=0.5 * h * cp.damping)
        energy = energy.addcmul_(mlh, friction_phi_fast(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck))
        feats = point_stiffness_rows(offset, neg_offset, kt, kn)
        # spatial force of h f (friction -h fw u_t = -kt u_t, normal h fz) less the pending K du
        if pending is None:
            fx, fy, fzh = -(kt * ux), -(kt * uy), fz * h
        else:
            fx = -torch.addcmul(pending[0], kt, ux)
            fy = -torch.addcmul(pending[1], kt, uy)
            fzh = fz * h - pending[2]
        points = torch.stack(feats + point_wrenches(offset, (fx, fy, fzh)), dim=1)  # [C, 22, W]
        return points, (act, mlh, kt, kn, energy)

    def _step_length(self, v, dv, grad, de, qs, drive, jaux, coup, coupling_q, u, du, depth0, caux):
        """Per world, the step length along ``dv``: 1 when the full Newton step lowers the energy enough
        (at least a quarter of the decrease the quadratic model predicts), else the minimiser of the
        quadratic through ``E(0)``, the slope ``grad . dv`` and ``E(1)``, within ``[0.05, 1]``.

        ``de`` holds the exact change of the inertial part, ``dv.M(v - qd) + 1/2 dv.M dv - h force.dv``;
        the other terms are evaluated at ``v + dv`` (and at ``v``, unless given) with this iteration's
        lagged quantities (normal forces under friction, active dampers)."""
        m, h = self.model, self.dt
        vv = torch.stack([v, v + dv])  # [2, nv, W]
        e = self._joint_energy(vv, qs, drive, jaux)
        de = de + (e[1] - e[0]).sum(0)
        if coup is not None:
            act, _, r0, r_dv = coup
            r1 = r0 + r_dv
            base = coupling_q
            ec = []
            for r in (r0, r1):
                ln = torch.add(base, r, alpha=h)
                lim = ln - torch.clamp(ln, self._c_lower, self._c_upper)
                ec.append(self._c_ek * lim * lim + self._c_ed * act * r * r)
            de = de + (ec[1] - ec[0]).sum(0)
        if u is not None:
            cp = m.contact
            act, mlh, e0 = caux[0], caux[1], caux[4]
            ux, uy, uz = (a + b for a, b in zip(u, du))
            pen = torch.add(depth0, uz, alpha=-h).clamp_(min=0.0)
            e1 = (pen * pen).mul_(0.5 * cp.stiffness).addcmul_(act * uz, uz, value=0.5 * h * cp.damping)
            slip = torch.sqrt(torch.addcmul(ux * ux, uy, uy))
            e1 = e1.addcmul_(mlh, friction_phi_fast(slip, cp.falloff_vel, self._c_ratio, self._c_stribeck))
            de = de + e1.sub_(e0).sum(0)
        slope = (grad * dv).sum(0)  # < 0: dv is a descent direction (H is positive definite)
        curv = de - slope
        backtrack = torch.clamp(-slope / torch.clamp(2.0 * curv, min=1e-30), min=0.05, max=1.0)
        backtrack = torch.where(torch.isfinite(backtrack), backtrack, 0.05)
        return torch.where(de <= 0.25 * slope, 1.0, backtrack)

    def _joint_energy(self, vv, qs, drive: _Drive, jaux):
        """Per-DOF energy of the joint-space terms for velocities ``vv [A, nv, W]`` (lagged limit damping and
        drive effort bound, ``jaux`` from :meth:`_joint_terms`)."""
        h = self.dt
        lim_active, effort = jaux
        v2 = vv * vv
        e = self._e_damp * v2 if self._has_damping else torch.zeros_like(vv)
        if self._has_springs:
            r = torch.add(qs - self._spring_ref, vv, alpha=h)
            e = e.addcmul_(self._e_spring, r * r)
        if self._j_has_dry:
            ej = self._j_mu0h * friction_phi_fast(
                self._joint_speed(vv), self._j_falloff, self._j_ratio, self._j_stribeck
            )
            e = e + (ej / self._group_size if self._group is not None else ej)
        if self._has_limits:
            qn = torch.add(qs, vv, alpha=h)
            lim = qn - torch.clamp(qn, self._lower, self._upper)
            e = e.addcmul_(self._e_klim, lim * lim).addcmul_(self._e_dlim * lim_active, v2)
        # drive: h/b huber(a - b v, effort); with b = 0 the constant force clamp(a)
        x = torch.addcmul(drive.a, drive.b, vv, value=-1.0)
        if self._has_effort:
            ax = x.abs()
            lim = torch.minimum(ax, effort)
            e = e.addcmul_(drive.e_coef, lim * (2.0 * ax - lim))
        else:
            e = e.addcmul_(drive.e_coef, x * x)
        if drive.e_const is not None:
            e = e.addcmul_(drive.e_const, vv, value=-1.0)
        if self._envelope is not None and self._envelope.has_speed_limit:
            e = e + self._envelope.speed_energy(vv)
        return e

"""The CPU fast path of :meth:`kangengine.sim.Simulator.step`: the whole step as one compiled call.

At small batches the torch step is bound by per-operation overhead (about 1500 small tensor operations
per step, 5-10 us each on a CPU), not by arithmetic. :class:`FastStep` runs the same step (energy
correction, bias forces, drives with effort limits, joint limits, springs, damping and dry friction,
ground contact with friction, pins, the Newton iterations and the line search) for one world after another
inside one numba kernel (:mod:`kangengine.sim.fast_kernel`), in float64 whatever the model's dtype, with
forward kinematics from the foundation's native kernel; the layout's ``difference`` and ``integrate`` run
in numpy. The torch step stays the reference, and the path for CUDA, autograd, large batches and the
features the kernel does not cover (joint-space coupling rows, cycle and tendon rows, hard mimic joints,
drive envelopes, self-collision, pose targets): :func:`fast_step_unsupported` names the first of those
a model has, and :class:`~kangengine.sim.Simulator` records it (``fast_path``, ``fast_path_reason``).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .control import Control
from .model import Model, State

__all__ = ["FastStep", "FastPathUnavailable", "fast_step_unsupported", "fast_step_available"]


class FastPathUnavailable(RuntimeError):
    """The fast path's kernel could not be compiled on this machine (the simulator falls back to torch)."""


def fast_step_available() -> str | None:
    """``None`` when numba imports, else why not (a sentence)."""
    try:
        import numba  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: use the torch step
        return f"numba is not importable ({type(exc).__name__}: {exc})"
    return None


def fast_step_unsupported(model: Model, sim) -> str | None:
    """``None`` when the fast path covers ``model`` stepped by ``sim`` (a :class:`Simulator`), else the first
    feature it does not cover, as a short phrase."""
    if model.device.type != "cpu":
        return f"the model lives on {model.device}"
    if model.dtype not in (torch.float32, torch.float64):
        return f"dtype {model.dtype}"
    if sim._has_couplings and sim._coupling_pos_tree is None:
        return "a joint-space coupling row joining two branches of the tree"
    if sim._rows is not None:
        return "cycle-joint or tendon rows"
    if sim._hard:
        return "hard mimic joints"
    if sim._envelope is not None:
        return "a drive envelope"
    if sim._has_self:
        return "self-collision"
    if any(p >= b for b, p in enumerate(model.parents)):
        return "bodies not ordered parent first"
    return None


_CONTROL_FIELDS = (
    "q_target",
    "qd_target",
    "tau_feedforward",
    "tau_external",
    "drive_stiffness",
    "drive_damping",
    "pinned",
    "pinned_qd",
)


def _np(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a C-contiguous float64 numpy array (a view when it already is one)."""
    return np.ascontiguousarray(x.detach().numpy(), dtype=np.float64)


class FastStep:
    """The fast path of one :class:`~kangengine.sim.Simulator` (built by it; see the module docstring).

    Args:
        sim: the simulator whose constants (already folded with ``dt``) the kernel reads.
    """

    def __init__(self, sim):
        from .fast_kernel import difference_kernel, finish_kernel, step_kernel

        self._kernel, self._difference, self._finish = step_kernel, difference_kernel, finish_kernel
        m, h = sim.model, sim.dt
        self.sim = sim
        nv = m.nv
        row = lambda x: _np(x).reshape(-1) if isinstance(x, torch.Tensor) else np.full(nv, float(x))
        ii = lambda x: np.ascontiguousarray(np.asarray(x, dtype=np.int64))
        above = m.dof_above.detach().cpu().numpy() > 0
        dof_par = [max([j for j in range(k) if above[j, k]], default=-1) for k in range(nv)]
        self._int = (
            ii(m.parents),
            ii(m.dof_body.cpu().numpy()),
            ii(m.dof_step.cpu().numpy()),
            ii(dof_par),
            ii(m.dof_q_index.cpu().numpy()),
            ii(m.dof_friction_group.cpu().numpy()),
        )
        inertia = _np(m.body_inertia)
        pairs = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))
        body_c = np.concatenate(
            [_np(m.body_mass)[:, None], _np(m.body_gravity)[:, None], _np(m.body_com)]
            + [inertia[:, a, b][:, None] for a, b in pairs],
            axis=1,
        )
        sc = m.step_cache
        dof_c = np.concatenate(
            [row(sc.dof_is_angular_c)[None], row(sc.dof_is_linear_c)[None], row(m.dof_armature)[None], _np(m.dof_frame)]
        )
        jc = np.stack(
            [
                row(sim._diag_const),
                row(sim._spring_h),
                row(sim._klim_h),
                row(sim._dlim_h),
                row(sim._lim_curv),
                row(sim._e_damp),
                row(sim._e_spring),
                row(sim._spring_ref),
                row(sim._lower),
                row(sim._upper),
                row(sim._e_klim),
                row(sim._e_dlim),
                row(sim._effort),
                row(sim._scalar),
            ]
        )
        group_size = row(sim._group_size) if sim._group is not None else np.ones(nv)
        jf = np.stack([row(sim._j_mu0h), row(sim._j_falloff), row(sim._j_ratio), row(sim._j_stribeck), group_size])
        cp = m.contact
        ncp = m.num_contact_points if sim._has_contact else 0
        if ncp:
            cp_i = ii(m.contact_point_body.cpu().numpy())
            cp_c = np.concatenate([_np(m.contact_point_local), _np(m.contact_radius)[:, None]], axis=1)
            cc = np.stack([row(sim._c_mu0), row(sim._c_ratio), row(sim._c_mu0h)])
        else:
            cp_i, cp_c, cc = np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros((3, 0))
        if sim._has_couplings:
            cpl_m = _np(sim._coupling)
            names = ("_c_lower", "_c_upper", "_c_kh", "_c_dh", "_c_curv", "_c_ek", "_c_ed")
            cpl = np.stack([_np(getattr(sim, k)).reshape(-1) for k in names])
        else:
            cpl_m, cpl = np.zeros((0, nv)), np.zeros((7, 0))
        self._consts = (body_c, dof_c, jc, jf, cp_i, cp_c, cc, cpl_m, cpl)
        self._scal = np.array(
            [h, *sc.gravity_t, cp.ground_height, sim._reach, sim._kn_const, cp.stiffness, cp.damping]
            + [cp.falloff_vel, float(sim._c_stribeck), float(sim.iterations)]
        )
        self._flags = np.array(
            [
                sim._has_damping,
                sim._has_springs,
                sim._j_has_dry,
                sim._has_limits,
                sim._has_effort,
                sim._group is not None,
                bool(ncp),
                sim._line_search,
                sim.energy_correction,
                False,
                False,
                sc.uniform_gravity,
                sim._has_couplings,
            ],
            dtype=np.bool_,
        )
        self.num_contact_points = ncp
        self._kp = _np(m.dof_drive_stiffness)
        self._kd = _np(m.dof_drive_damping)
        self._limits = np.concatenate([[sim.divergence_distance, sim.divergence_speed], self._consts[2][12]])
        self._np_dtype = np.float32 if m.dtype == torch.float32 else np.float64
        runs, rots = m.layout.tangent_runs
        plan = m.layout.kinematics.plan
        ns = sum(len(st) for st in plan.steps)
        self._fk = None
        self._compiled = False
        self._fk_shapes = ((plan.num_bodies, 3), (plan.num_bodies, 4), (ns, 3), (ns, 4), (nv, 3))
        self._runs = np.array(runs, dtype=np.int64).reshape(-1, 3)
        self._rots = np.array(rots, dtype=np.int64).reshape(-1, 2)

    def accepts(self, state: State, control: Control) -> bool:
        """Whether this step can run here: CPU tensors without autograd and no pose targets."""
        tensors = [state.q, state.qd] + [getattr(control, f) for f in _CONTROL_FIELDS]
        return control.pose_targets is None and all(
            x is None or (x.device.type == "cpu" and not x.requires_grad) for x in tensors
        )

    def _frames(self, q64: torch.Tensor):
        """``(body_pos [W, B, 3], body_quat [W, B, 4], joint_pos [W, S, 3], dof_axes [W, nv, 3])`` float64
        numpy of the foundation's forward kinematics: its native kernel run on numpy buffers (what
        :func:`kangengine.sim.kinematics._native_joint_frames` does, without the torch wrappers), else the
        replay."""
        from .kinematics import _NATIVE_JOINT_FRAMES, _native_joint_frames

        m = self.sim.model
        if self._fk is None:
            out = _native_joint_frames(m, q64)  # builds or loads the kernel (None: not available here)
            prog = m.layout.kinematics._traced_joint_frames()
            entry = _NATIVE_JOINT_FRAMES.get((id(prog), torch.float64))
            self._fk = (prog, entry[1] if out is not None and entry is not None else None)
        prog, kern = self._fk
        if kern is None or os.environ.get("KANGENGINE_FK_BACKEND", "auto").strip().lower() == "numpy":
            jf = m.layout.kinematics.joint_frames(q64)
            out = (jf.body_positions, jf.body_rotations_wxyz, jf.joint_positions, jf.dof_axes)
            return [x.numpy() if x.dtype == torch.float64 and x.is_contiguous() else _np(x) for x in out]
        from ..animation.kinematics import native
        from ..animation.kinematics.replay import array_namespace

        n = q64.shape[0]
        outs = [np.empty((n, a, b)) for a, b in self._fk_shapes]
        views = [torch.from_numpy(x) for x in outs]

        def fallback(s, e):  # frames whose angles left the kernel's exact sin/cos range: the replay
            prog(q64[s:e].T.contiguous(), array_namespace(q64), *views, s, e)

        if n > 4096:  # in chunks on the foundation's thread pool
            native.run_kernel(kern, [q64.numpy()], outs, n, fallback, chunk=16384)
            return outs[0], outs[1], outs[2], outs[4]
        # one chunk: the kernel called directly (run_kernel's bookkeeping costs more than the kernel here)
        addr = lambda x: x.__array_interface__["data"][0]
        q = q64.numpy()
        flags = np.empty(n + kern.width, dtype=np.uint8)
        rows = lambda x: x.shape[1] * (x.shape[2] if x.ndim > 2 else 1) if n > 1 else 0
        if kern([(addr(q), rows(q))], [(addr(x), rows(x)) for x in outs], n, addr(flags)):
            for s, e in native._runs(flags[:n]):
                fallback(s, e)
        return outs[0], outs[1], outs[2], outs[4]

    def _drive(self, control: Control, q: np.ndarray, w: int):
        """``(a, b)`` ``[W, nv]`` float64 of :meth:`Simulator._drive` (numpy; the layout's difference)."""
        m, h = self.sim.model, self.sim.dt
        kp = self._kp if control.drive_stiffness is None else _np(control.drive_stiffness)
        kd = self._kd if control.drive_damping is None else _np(control.drive_damping)
        a = None
        if control.q_target is not None:
            diff = np.empty((w, m.nv))
            self._difference(_np(control.q_target), q, self._runs, self._rots, diff)
            a = kp * diff
            b = h * kp + kd
        else:
            b = kd
        if control.qd_target is not None:
            a = kd * _np(control.qd_target) if a is None else a + kd * _np(control.qd_target)
        if control.tau_feedforward is not None:
            ff = _np(control.tau_feedforward)
            a = ff if a is None else a + ff
        a_full, b_full = np.empty((w, m.nv)), np.empty((w, m.nv))
        a_full[:] = 0.0 if a is None else a
        b_full[:] = b
        return a_full, b_full

    def step(self, state: State, control: Control):
        """:meth:`Simulator.step` on the fast path (inputs already checked by the caller)."""
        from .integrator import StepResult

        sim = self.sim
        m, h = sim.model, sim.dt
        dtype = m.dtype
        q = _np(state.q)
        q64 = torch.from_numpy(q)
        qd = _np(state.qd)
        w = q.shape[0]
        frozen = state.frozen.numpy()
        body_pos, body_quat, joint_pos, dof_axes = self._frames(q64)
        a, b = self._drive(control, q, w)
        flags = self._flags.copy()
        has_budget = state.energy_budget is not None and sim.energy_correction
        flags[9] = has_budget
        budget = _np(state.energy_budget) if has_budget else np.zeros(w)
        tau_ext = _np(control.tau_external) if control.tau_external is not None else np.zeros((w, m.nv))
        if control.pinned is not None:
            flags[10] = True
            pinned = control.pinned.numpy()
            pinned_qd = _np(control.pinned_qd) if control.pinned_qd is not None else np.zeros((w, m.nv))
        else:
            pinned, pinned_qd = np.zeros((1, 1), np.bool_), np.zeros((1, 1))
        ncp = self.num_contact_points
        out_v = np.empty((w, m.nv))
        out_x = np.empty((w, m.nv))
        out_c = np.zeros((w, ncp, 7))
        out_w = np.zeros((w, 3))
        try:
            self._kernel(
                q, qd, frozen, budget, body_pos, body_quat, joint_pos, dof_axes, a, b, tau_ext, pinned, pinned_qd,
                *self._int, *self._consts, self._scal, flags, out_v, out_x, out_c, out_w,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - only a first call's compile failure is turned into this
            if self._compiled:
                raise
            raise FastPathUnavailable(f"the kernel did not compile ({type(exc).__name__}: {exc})") from exc
        self._compiled = True
        # -- advance, divergence, outputs (as the torch step) --
        q_new, v_new, tau = np.empty_like(q), np.empty_like(out_v), np.empty_like(out_x)
        frozen_new, newly = np.empty(w, np.bool_), np.empty(w, np.bool_)
        self._finish(
            q, qd, out_v, out_x, h, self._runs, self._rots, self._limits, a, b, tau_ext, frozen,
            q_new, v_new, tau, frozen_new, newly,
        )  # fmt: skip
        f64 = dtype == torch.float64
        t = lambda x: torch.from_numpy(x if f64 and x.flags.c_contiguous else x.astype(self._np_dtype))
        budget_out = None
        if sim.energy_correction:
            budget_out = t(np.where(frozen_new, out_w[:, 1], out_w[:, 0]))
        effort = self._consts[2][12]
        x = out_x
        z = torch.from_numpy(np.zeros((w, 0), self._np_dtype))
        return StepResult(
            state=State(q=t(q_new), qd=t(v_new), frozen=torch.from_numpy(frozen_new), energy_budget=budget_out),
            energy_correction=t(out_w[:, 2]),
            self_contact_depth=z,
            self_contact_force=z,
            self_contact_count=torch.from_numpy(np.zeros(w, np.int64)),
            contact_normal_force=t(out_c[:, :, 0]),
            contact_friction_force=t(out_c[:, :, 1:3]),
            contact_depth=t(out_c[:, :, 3]),
            contact_position=t(out_c[:, :, 4:7]),
            drive_force=t(tau),
            drive_force_requested=t(x),
            drive_saturated=torch.from_numpy(np.abs(x) > effort),
            nonfinite=torch.from_numpy(newly),
        )

"""Cycle joints, tendon spring-dampers and spatial tendons as terms of the implicit step.

Each term is a *row* ``r(q)`` (a length, or one world component of a loop-closure gap) with a Jacobian
``J = dr/dv`` at the start of the step, linearised over the step like the contact points:
``r(v) = r(q) + h J v``. Its part of the incremental potential is::

    1/2 k dist(r(v), [spring_lower, spring_upper])^2 + 1/2 h c (J v)^2
      + 1/2 k_lim dist(r(v), [lower, upper])^2 + 1/2 h c_lim [r outside the range] (J v)^2

(``dist`` is the distance to the interval; a spring's rest value is an interval of zero width unless a
dead band is given). Newton uses the exact Hessian ``J^T diag(w) J`` of the active pieces, so a stiff
loop closure costs one linear solve like a joint spring; the line search evaluates the energy at the trial
velocities. The force a row applies is ``-(k dist + c J v)`` along ``J`` (tension of a tendon, spring
of a cycle joint), its generalized force ``J^T`` times that.

Rows, in order: three per cycle joint (``p_child - p_parent`` in world axes, rest 0), one per fixed
tendon with stiffness or damping (``l = a . q + offset``; its range stays a joint-space coupling row of
:class:`~kangengine.sim.Model`), one per spatial tendon (``l = sum_k w_k |p_b_k - p_a_k|``, with its
range as limit rows here).

This module reads the step's frames by their attributes only (``body_pos``, ``body_rot``, ``origin``,
``motion_rows``) and imports nothing from the rest of the simulator, so the model can build it.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclasses_fields

import numpy as np
import torch

from ..asset.desc import ArticulationDesc, JointType
from ..errors import UnknownNameError
from ..rotations import quat_rotate

__all__ = [
    "Constraints",
    "ConstraintRows",
    "build_constraints",
    "constraint_rows",
    "point_jacobians",
    "mimic_rows",
    "with_compliant_mimics",
]

_INF = float("inf")


@dataclass(frozen=True, eq=False)
class Constraints:
    """Constants of the cycle joints and tendons of one model (built by :func:`build_constraints`).

    Sizes: ``P`` attachment points (cycle pivots and tendon sites), ``K`` cycle joints, ``T`` fixed tendons
    with a spring or damper, ``S`` spatial tendons, ``G`` spatial segments; ``R = 3 K + T + S`` rows.

    Attributes:
        point_body: ``[P]`` long, body of each point; point_local: ``[P, 3]`` m, in the body frame.
        cycle_child, cycle_parent: ``[K]`` long point indices (pivot on the child, on the parent).
        fixed_matrix: ``[T, nv]`` tendon coefficients ``a`` over the DOFs (hinge/slide); fixed_offset ``[T]``
            (compliant mimic rows, :func:`with_compliant_mimics`, are appended to this block).
        segment_a, segment_b: ``[G]`` long point indices; segment_weight ``[G]``; segment_tendon ``[G]``
            long, the spatial tendon (``0..S-1``) each segment belongs to.
        stiffness, damping: ``[R]`` N/m (N m/rad for a fixed tendon over hinges), N s/m.
        spring_lower, spring_upper: ``[R]`` the rest interval (0 for cycles).
        lower, upper, limit_stiffness, limit_damping: ``[R]`` length limits (+-inf and 0 where none).
        names: ``R`` row names (``"<cycle>.x"``, ``"<tendon>"``).
        cycle_names, fixed_names, spatial_names: names by kind.
    """

    point_body: torch.Tensor
    point_local: torch.Tensor
    cycle_child: torch.Tensor
    cycle_parent: torch.Tensor
    fixed_matrix: torch.Tensor
    fixed_offset: torch.Tensor
    segment_a: torch.Tensor
    segment_b: torch.Tensor
    segment_weight: torch.Tensor
    segment_tendon: torch.Tensor
    stiffness: torch.Tensor
    damping: torch.Tensor
    spring_lower: torch.Tensor
    spring_upper: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    limit_stiffness: torch.Tensor
    limit_damping: torch.Tensor
    names: tuple[str, ...]
    cycle_names: tuple[str, ...]
    fixed_names: tuple[str, ...]
    spatial_names: tuple[str, ...]

    @property
    def num_rows(self) -> int:
        return len(self.names)

    def rows_at(self, model, frames, qs: torch.Tensor) -> ConstraintRows:
        """The rows at the start of a step: values ``[R, W]`` and Jacobians ``[W, R, nv]``.

        Args:
            model: the :class:`~kangengine.sim.Model` (for ``dof_moves_body``).
            frames: the step's :class:`~kangengine.sim.kinematics.Frames` at ``q``.
            qs: ``[nv, W]`` scalar joint values (hinge/slide; 0 elsewhere).
        """
        w = qs.shape[1]
        parts_v, parts_j = [], []
        if self.point_body.numel():
            pos, jac = point_jacobians(model, frames, self.point_body, self.point_local)  # [W,P,3], [W,P,3,nv]
        if self.cycle_names:
            gap = pos[:, self.cycle_child] - pos[:, self.cycle_parent]  # [W, K, 3]
            jg = jac[:, self.cycle_child] - jac[:, self.cycle_parent]  # [W, K, 3, nv]
            parts_v.append(gap.reshape(w, -1).t())
            parts_j.append(jg.reshape(w, -1, jg.shape[-1]))
        if self.fixed_names:
            parts_v.append(self.fixed_matrix @ qs + self.fixed_offset[:, None])
            parts_j.append(self.fixed_matrix[None].expand(w, -1, -1))
        if self.spatial_names:
            d = pos[:, self.segment_b] - pos[:, self.segment_a]  # [W, G, 3]
            seg_len = torch.linalg.vector_norm(d, dim=-1)  # [W, G]
            unit = d / torch.clamp(seg_len, min=1e-12)[..., None]
            jd = torch.einsum("wgk,wgkn->wgn", unit, jac[:, self.segment_b] - jac[:, self.segment_a])
            s = len(self.spatial_names)
            length = seg_len.new_zeros(w, s).index_add_(1, self.segment_tendon, seg_len * self.segment_weight)
            jl = jd.new_zeros(w, s, jd.shape[-1]).index_add_(1, self.segment_tendon, jd * self.segment_weight[:, None])
            parts_v.append(length.t())
            parts_j.append(jl)
        return ConstraintRows(
            value=torch.cat(parts_v, 0),
            jacobian=torch.cat(parts_j, 1),
            stiffness=self.stiffness,
            damping=self.damping,
            spring_lower=self.spring_lower,
            spring_upper=self.spring_upper,
            lower=self.lower,
            upper=self.upper,
            limit_stiffness=self.limit_stiffness,
            limit_damping=self.limit_damping,
        )


@dataclass(frozen=True, eq=False)
class ConstraintRows:
    """The rows of one step (see the module docstring), ``R`` of them over ``W`` worlds.

    Attributes:
        value: ``[R, W]`` row values at the start of the step (m, or rad for fixed tendons over hinges and
            rotation rows).
        jacobian: ``[W, R, nv]`` ``dr/dv``.
        stiffness, damping, spring_lower, spring_upper, lower, upper, limit_stiffness, limit_damping:
            ``[R]`` as in :class:`Constraints`.
    """

    value: torch.Tensor
    jacobian: torch.Tensor
    stiffness: torch.Tensor
    damping: torch.Tensor
    spring_lower: torch.Tensor
    spring_upper: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    limit_stiffness: torch.Tensor
    limit_damping: torch.Tensor

    @classmethod
    def springs(cls, value: torch.Tensor, jacobian: torch.Tensor, stiffness, damping) -> ConstraintRows:
        """Rows ``value [R, W]``, ``jacobian [W, R, nv]`` held at 0 by springs ``stiffness`` and dampers
        ``damping`` (floats or ``[R]``), with no limits."""
        r = value.shape[0]
        full = lambda x: torch.as_tensor(x, dtype=value.dtype, device=value.device).expand(r).contiguous()
        zero, inf = full(0.0), full(_INF)
        return cls(value, jacobian, full(stiffness), full(damping), zero, zero, -inf, inf, zero, zero)

    def concat(self, other: ConstraintRows | None) -> ConstraintRows:
        """These rows followed by ``other``'s (same worlds)."""
        if other is None:
            return self
        w = max(self.jacobian.shape[0], other.jacobian.shape[0])
        return ConstraintRows(
            value=torch.cat([self.value.expand(-1, w), other.value.expand(-1, w)], 0),
            jacobian=torch.cat([self.jacobian.expand(w, -1, -1), other.jacobian.expand(w, -1, -1)], 1),
            **{
                k: torch.cat([getattr(self, k), getattr(other, k)])
                for k in (
                    "stiffness",
                    "damping",
                    "spring_lower",
                    "spring_upper",
                    "lower",
                    "upper",
                    "limit_stiffness",
                    "limit_damping",
                )
            },
        )

    def rate(self, v: torch.Tensor) -> torch.Tensor:
        """``[R, W]``: ``J v`` for DOF-major velocities ``v [nv, W]``."""
        return torch.einsum("wrn,nw->rw", self.jacobian, v)

    def _pieces(self, rate: torch.Tensor, h: float):
        c = self
        val = torch.add(self.value, rate, alpha=h)  # at the end of the step
        ds = val - torch.clamp(val, c.spring_lower[:, None], c.spring_upper[:, None])
        dl = val - torch.clamp(val, c.lower[:, None], c.upper[:, None])
        return ds, dl

    def terms(self, v: torch.Tensor, h: float):
        """Gradient ``[nv, W]``, Hessian ``[W, nv, nv]`` and the lagged limit activity ``[R, W]`` at ``v``."""
        c = self
        rate = self.rate(v)
        ds, dl = self._pieces(rate, h)
        act_s, act_l = (ds != 0).to(v.dtype), (dl != 0).to(v.dtype)
        k, d = c.stiffness[:, None], c.damping[:, None]
        kl, dlim = c.limit_stiffness[:, None], c.limit_damping[:, None]
        force = k * ds + d * rate + kl * dl + dlim * act_l * rate  # [R, W]
        weight = (h * h) * (k * act_s + kl * act_l) + h * (d + dlim * act_l)
        grad = torch.einsum("wrn,rw->nw", self.jacobian, force).mul_(h)
        hess = torch.einsum("wrn,rw,wrm->wnm", self.jacobian, weight, self.jacobian)
        return grad, hess, act_l

    def energy(self, v: torch.Tensor, h: float, act_l: torch.Tensor) -> torch.Tensor:
        """``[W]`` J: the rows' part of the incremental potential at ``v [nv, W]`` (limit damping lagged)."""
        c = self
        rate = self.rate(v)
        ds, dl = self._pieces(rate, h)
        e = 0.5 * c.stiffness[:, None] * ds * ds + 0.5 * h * c.damping[:, None] * rate * rate
        e = e + 0.5 * c.limit_stiffness[:, None] * dl * dl + 0.5 * h * c.limit_damping[:, None] * act_l * rate * rate
        return e.sum(0)

    def forces(self, v: torch.Tensor, h: float) -> torch.Tensor:
        """``[R, W]`` the force each row applies at the end-of-step velocities ``v [nv, W]``: minus the
        tension ``k dist + c J v`` (plus its limit part); its generalized force is ``J^T`` times it."""
        c = self
        rate = self.rate(v)
        ds, dl = self._pieces(rate, h)
        act_l = (dl != 0).to(v.dtype)
        return -(c.stiffness[:, None] * ds + c.damping[:, None] * rate + c.limit_stiffness[:, None] * dl) - (
            c.limit_damping[:, None] * act_l * rate
        )


def point_jacobians(model, frames, body: torch.Tensor, local: torch.Tensor):
    """World positions ``[W, P, 3]`` m and Jacobians ``[W, P, 3, nv]`` (velocity of the point per unit DOF
    rate, world axes) of points ``local [P, 3]`` (m, body frame) fixed to bodies ``body [P]``."""
    w = frames.motion_stack.shape[-1]
    rot = torch.stack(frames.body_rot, dim=0).permute(2, 1, 0).reshape(w, -1, 3, 3)  # [W, B, 3, 3] row-major
    bpos = torch.stack(frames.body_pos, dim=-1).transpose(0, 1)  # [W, B, 3]
    origin = torch.stack(frames.origin, dim=-1).transpose(0, 1)  # [W, 1, 3]
    pos = bpos[:, body] + torch.einsum("wpij,pj->wpi", rot[:, body], local)
    s = frames.motion_rows  # [W, nv, 6]: angular, velocity of the point at the origin
    ang, lin = s[..., :3], s[..., 3:]
    r = (pos - origin)[:, :, None, :]  # [W, P, 1, 3]
    vel = lin[:, None] + torch.linalg.cross(
        ang[:, None].expand(-1, r.shape[1], -1, -1), r.expand(-1, -1, ang.shape[1], -1)
    )
    mask = model.dof_moves_body[body][None, :, :, None]  # [1, P, nv, 1]
    return pos, (vel * mask).transpose(-1, -2)


def _tendon_rest(spring_length, length0: float) -> tuple[float, float]:
    if spring_length is None:
        return length0, length0
    lo, hi = float(spring_length[0]), float(spring_length[-1])
    return min(lo, hi), max(lo, hi)


def build_constraints(
    desc: ArticulationDesc,
    layout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    cycle_stiffness: float | None = None,
    cycle_damping: float | None = None,
    tendon_limit_stiffness: float = 100.0,
    tendon_limit_damping: float = 0.0,
) -> Constraints | None:
    """The :class:`Constraints` of ``desc`` (``None`` when it has no cycle joint, no fixed tendon with a
    spring or damper and no spatial tendon).

    Args:
        desc, layout: the articulation and its coordinate layout (same bodies).
        device, dtype: where the tensors live.
        cycle_stiffness, cycle_damping: override every cycle joint's own (N/m, N s/m); ``None`` keeps
            ``CycleJointDesc.stiffness`` (default 50000) and ``.damping``.
        tendon_limit_stiffness, tendon_limit_damping: penalty on a spatial tendon leaving its range.
    Raises:
        UnknownNameError: a cycle joint or spatial tendon names a body the articulation lacks.
    """
    fixed = [t for t in desc.tendons if t.stiffness > 0 or t.damping > 0]
    if not (desc.cycles or fixed or desc.spatial_tendons):
        return None
    bodies = {name: i for i, name in enumerate(desc.body_names)}
    pb, pl = [], []

    def point(body_name: str, local, what: str) -> int:
        if body_name not in bodies:
            raise UnknownNameError(
                f"{what} names body {body_name!r}; bodies are: {', '.join(desc.body_names)}",
                path=desc.source,
                item=what,
            )
        pb.append(bodies[body_name])
        pl.append(np.asarray(local, dtype=np.float64).reshape(3))
        return len(pb) - 1

    rows = {k: [] for k in ("k", "c", "sl", "su", "lo", "hi", "kl", "cl", "name")}

    def row(name, k, c, sl=0.0, su=0.0, lo=-_INF, hi=_INF, kl=0.0, cl=0.0):
        for key, val in zip(rows, (k, c, sl, su, lo, hi, kl, cl, name)):
            rows[key].append(val)

    cc, cp = [], []
    for cyc in desc.cycles:
        cc.append(point(cyc.child, cyc.pivot, f"cycle joint {cyc.name!r}"))
        cp.append(point(cyc.parent, cyc.parent_pivot, f"cycle joint {cyc.name!r}"))
        k = cyc.stiffness if cycle_stiffness is None else cycle_stiffness
        c = cyc.damping if cycle_damping is None else cycle_damping
        for axis in "xyz":
            row(f"{cyc.name}.{axis}", k, c)
    dof = {b.joint_name: b.qd_offset for b in layout.blocks if b.joint_type in (JointType.HINGE, JointType.SLIDE)}
    fmat = np.zeros((len(fixed), layout.nv))
    foff = np.zeros(len(fixed))
    for i, t in enumerate(fixed):
        for j, a in zip(t.joints, t.coefficients):
            if j not in dof:
                raise UnknownNameError(
                    f"fixed tendon {t.name!r} names joint {j!r}, which has no hinge/slide DOF; such joints "
                    f"are: {', '.join(dof)}",
                    path=desc.source,
                    item=f"tendon {t.name!r}",
                )
            fmat[i, dof[j]] += a
        foff[i] = t.offset
        sl, su = _tendon_rest(t.spring_length, t.offset)
        row(t.name, t.stiffness, t.damping, sl, su)
    sa, sb, sw, st = [], [], [], []
    for k, t in enumerate(desc.spatial_tendons):
        idx = [point(b, p, f"spatial tendon {t.name!r}") for b, p in zip(t.site_bodies, t.site_positions)]
        for (a, b), wgt in zip(t.segments, t.segment_weights):
            sa.append(idx[a])
            sb.append(idx[b])
            sw.append(wgt)
            st.append(k)
        sl, su = _tendon_rest(t.spring_length, _rest_length(desc, layout, t))
        lo, hi = t.range if t.range is not None else (-_INF, _INF)
        lim = t.range is not None
        row(t.name, t.stiffness, t.damping, sl, su, lo, hi, tendon_limit_stiffness * lim, tendon_limit_damping * lim)
    tf = lambda a: torch.as_tensor(np.array(a, dtype=np.float64), dtype=dtype, device=device)
    ti = lambda a: torch.as_tensor(np.array(a, dtype=np.int64), device=device)
    return Constraints(
        point_body=ti(pb),
        point_local=tf(pl).reshape(-1, 3),
        cycle_child=ti(cc),
        cycle_parent=ti(cp),
        fixed_matrix=tf(fmat).reshape(len(fixed), layout.nv),
        fixed_offset=tf(foff),
        segment_a=ti(sa),
        segment_b=ti(sb),
        segment_weight=tf(sw),
        segment_tendon=ti(st),
        stiffness=tf(rows["k"]),
        damping=tf(rows["c"]),
        spring_lower=tf(rows["sl"]),
        spring_upper=tf(rows["su"]),
        lower=tf(rows["lo"]),
        upper=tf(rows["hi"]),
        limit_stiffness=tf(rows["kl"]),
        limit_damping=tf(rows["cl"]),
        names=tuple(rows["name"]),
        cycle_names=tuple(c.name for c in desc.cycles),
        fixed_names=tuple(t.name for t in fixed),
        spatial_names=tuple(t.name for t in desc.spatial_tendons),
    )


def _rest_length(desc: ArticulationDesc, layout, tendon) -> float:
    """Length of a spatial tendon at the layout's neutral pose, from the foundation FK."""
    pos, rot = layout.kinematics.from_coordinates(layout.neutral()[None])
    pos, rot = np.asarray(pos, dtype=np.float64)[0], np.asarray(rot, dtype=np.float64)[0]
    bodies = {name: i for i, name in enumerate(desc.body_names)}
    idx = [bodies[b] for b in tendon.site_bodies]
    pts = pos[idx] + quat_rotate(rot[idx], np.asarray(tendon.site_positions, dtype=np.float64))
    return float(sum(w * np.linalg.norm(pts[b] - pts[a]) for (a, b), w in zip(tendon.segments, tendon.segment_weights)))


def constraint_rows(model, q: torch.Tensor) -> ConstraintRows:
    """The cycle-joint and tendon rows of ``model`` at coordinates ``q [W, nq]`` (model dtype and device):
    ``.value [R, W]`` (cycle gaps in m, world axes; tendon lengths) and ``.jacobian [W, R, nv]``; row names
    in ``model.constraints.names``.

    Raises:
        ValueError: the model has no such rows.
    """
    from .kinematics import compute_frames

    if model.constraints is None:
        raise ValueError(f"{model.name}: the model has no cycle joints or tendon rows")
    model.check_state(q)
    qs = q.t().index_select(0, model.dof_q_index) * model.dof_is_scalar.to(q.dtype)[:, None]
    return model.constraints.rows_at(model, compute_frames(model, q), qs)


def mimic_rows(desc: ArticulationDesc, layout, mimics, *, kind: str = "mimic") -> tuple[np.ndarray, np.ndarray]:
    """``(matrix [M, nv], bias [M])`` of the mimic rows ``r = q_joint - multiplier q_leader - offset``: each row
    has ``+1`` at the joint's DOF and ``-multiplier`` at the leader's (hinge/slide DOFs of ``layout``, at their
    velocity offsets), and ``bias = -offset`` (rad or m).

    Raises:
        UnknownNameError: a mimic joint or its leader has no hinge/slide DOF (``kind`` names the row kind in
            the message, e.g. ``"hard mimic"``).
    """
    dof = {b.joint_name: b.qd_offset for b in layout.blocks if b.joint_type in (JointType.HINGE, JointType.SLIDE)}
    matrix = np.zeros((len(mimics), layout.nv))
    bias = np.zeros(len(mimics))
    for i, mm in enumerate(mimics):
        for j in (mm.joint, mm.leader):
            if j not in dof:
                raise UnknownNameError(
                    f"{kind} joint {mm.joint!r} names joint {j!r}, which has no hinge/slide DOF",
                    path=desc.source,
                    item=f"mimic {mm.joint}",
                )
        matrix[i, dof[mm.joint]] += 1.0
        matrix[i, dof[mm.leader]] -= mm.multiplier
        bias[i] = -mm.offset
    return matrix, bias


def with_compliant_mimics(model, desc: ArticulationDesc, natural_frequency: float, damping_ratio: float):
    """``model`` with its mimic joints (``desc.mimics``) as rows of the step whose spring and damper come
    from a natural frequency and a damping ratio instead of fixed gains (and without their joint-space
    coupling springs): for the row ``r = q_joint - multiplier q_leader - offset`` with effective mass
    ``m = 1 / (J M^-1 J^T)`` (``M`` at the neutral pose, armature included), ``k = m omega^2`` and ``c = 2 zeta
    m omega``, so the violation of the ratio obeys ``r'' + 2 zeta omega r' + omega^2 r = (load on the row) /
    m``. A static load ``f`` along the row leaves ``r = f / k``.

    Args:
        natural_frequency: ``omega`` rad/s (> 0). damping_ratio: ``zeta`` (>= 0; 1 is critical).
    Raises:
        ValueError: a non-positive frequency or a negative ratio.
        UnknownNameError: a mimic joint or leader has no hinge/slide DOF.
    """
    import dataclasses

    from .dynamics import mass_matrix

    if not natural_frequency > 0 or not damping_ratio >= 0:
        raise ValueError(
            f"natural_frequency must be > 0 and damping_ratio >= 0, got {natural_frequency}, {damping_ratio}"
        )
    if not desc.mimics:
        return model
    layout = model.layout
    rows, offset = mimic_rows(desc, layout, desc.mimics)
    names = [f"mimic {mm.joint}" for mm in desc.mimics]
    q0 = torch.as_tensor(layout.neutral()[None], dtype=torch.float64)
    m64 = dataclasses.replace(model, dtype=torch.float64, **_as_float64(model))
    mass = mass_matrix(m64, q0)[0].cpu().numpy()
    m_eff = 1.0 / np.einsum("ri,ri->r", rows, np.linalg.solve(mass, rows.T).T)
    k = m_eff * natural_frequency**2
    c = 2.0 * damping_ratio * natural_frequency * m_eff
    tf = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=model.dtype, device=model.device)
    base = model.constraints
    n = len(desc.mimics)
    if base is None:
        empty = lambda: torch.zeros(0, dtype=model.dtype, device=model.device)
        ie = torch.zeros(0, dtype=torch.long, device=model.device)
        base = Constraints(
            point_body=ie,
            point_local=torch.zeros(0, 3, dtype=model.dtype, device=model.device),
            cycle_child=ie,
            cycle_parent=ie,
            fixed_matrix=torch.zeros(0, layout.nv, dtype=model.dtype, device=model.device),
            fixed_offset=empty(),
            segment_a=ie,
            segment_b=ie,
            segment_weight=empty(),
            segment_tendon=ie,
            **{f: empty() for f in _ROW_FIELDS},
            names=(),
            cycle_names=(),
            fixed_names=(),
            spatial_names=(),
        )
    cut = 3 * len(base.cycle_names) + len(base.fixed_names)  # mimic rows go after the fixed tendons' rows
    add = {
        "stiffness": tf(k),
        "damping": tf(c),
        "spring_lower": tf(np.zeros(n)),
        "spring_upper": tf(np.zeros(n)),
        "lower": tf(np.full(n, -_INF)),
        "upper": tf(np.full(n, _INF)),
        "limit_stiffness": tf(np.zeros(n)),
        "limit_damping": tf(np.zeros(n)),
    }
    merged = dataclasses.replace(
        base,
        fixed_matrix=torch.cat([base.fixed_matrix, tf(rows)]),
        fixed_offset=torch.cat([base.fixed_offset, tf(offset)]),
        names=base.names[:cut] + tuple(names) + base.names[cut:],
        fixed_names=base.fixed_names + tuple(names),
        **{f: torch.cat([getattr(base, f)[:cut], add[f], getattr(base, f)[cut:]]) for f in _ROW_FIELDS},
    )
    keep = [i for i, nm in enumerate(model.coupling_names) if not nm.startswith("mimic ")]
    ki = torch.as_tensor(keep, dtype=torch.long, device=model.device)
    return dataclasses.replace(
        model,
        constraints=merged,
        coupling_matrix=model.coupling_matrix.index_select(0, ki),
        coupling_lower=model.coupling_lower.index_select(0, ki),
        coupling_upper=model.coupling_upper.index_select(0, ki),
        coupling_stiffness=model.coupling_stiffness.index_select(0, ki),
        coupling_damping=model.coupling_damping.index_select(0, ki),
        coupling_names=tuple(model.coupling_names[i] for i in keep),
    )


_ROW_FIELDS = (
    "stiffness",
    "damping",
    "spring_lower",
    "spring_upper",
    "lower",
    "upper",
    "limit_stiffness",
    "limit_damping",
)


def _as_float64(model) -> dict:
    """The float tensors of ``model`` in float64 (for an accurate effective mass)."""
    out = {}
    for f in dataclasses_fields(model):
        x = getattr(model, f.name)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out[f.name] = x.double()
    out.pop("step_cache", None)
    return out

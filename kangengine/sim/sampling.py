"""Sampling-based short-horizon optimisation of the tracker's PD targets (SAMCON).

:attr:`~kangengine.sim.Controller.SAMPLING` keeps a real, noisy, retargeted clip balanced with the model's own
actuators by searching, segment by segment, for offsets of the ``PD`` tracker's joint targets (Liu et al. 2010,
"Sampling-based contact-rich motion control"; Liu et al. 2015, improved SAMCON). The per-step controllers
(``PD``, ``WHOLE_BODY``, ``IMPLICIT``) all fall within about a second on CMU 02_01 because a one-step model of
the penalty contact and its friction does not predict what the step does; the search asks the simulator
itself, over a horizon of several steps, and keeps what worked.

The clip is cut into segments of ``sampling_segment_steps`` control steps. A beam of ``sampling_keep``
simulator states starts at the reference's first frame. Per segment:

1. ``sampling_samples`` samples, all in **one batched step** of the :class:`~kangengine.sim.Simulator`: sample
   ``i`` starts from beam entry ``i mod keep`` (states, contact forces of the last step and offsets gathered by
   index) with a target offset ``dq_i ~ N(c dq_parent, diag(sigma^2))`` held over the segment (``c``:
   ``sampling_coherence``; ``sigma`` per DOF group (:func:`dof_groups`): ``sampling_sigma_legs`` on the chains
   from the root to the bodies the reference stands on, ``sampling_sigma_torso`` on the trunk and arms,
   ``sampling_sigma_limbs`` elsewhere).
   The first ``keep`` samples are their parents' offsets unperturbed, so a segment never loses the best
   continuation it already had. The noise of the non-leg DOFs is scaled, per sample, by one of
   :data:`POSE_NOISE_SCALES` (1, 0.5, 0.25, 0), cycled over each parent's samples: on the CMU humanoid the
   chosen offsets were as large as the noise drawn (rms 0.1 rad on the trunk and arms) and they were the error
   (07_01's first 1.5 s: 6.1 cm, arms 7.8 and head 8.1 cm, while the PD tracker with its root held follows the
   arms within 1 cm); offered samples that leave the pose alone, the beam takes them where balance allows
   (4.6 cm, arms 3.7, head 4.7 cm, same seed, same world-steps).
2. Each sample runs the segment with :func:`~kangengine.sim.tracking.pd_control` (feed-forward, implicit drives,
   stance-leg balance, plus its offset), exactly the command :func:`~kangengine.sim.track` replays.
3. Its cost, summed over the states the segment reaches: mean body position error (m), centre-of-mass
   position error (m), root orientation error (rad), root linear and angular velocity errors (m/s, rad/s) and,
   the mean distance of the bodies from the reference's when the trunk, arm and head offsets are reached
   (:meth:`_Search.target_pose_error`, times the segment's steps: a 2 Hz drive shows only part of a held
   offset within a 0.1 s segment; the legs' offsets are balance and are not counted), and,
   for a model with link-to-link pairs, the deepest overlap of two links (m), with the weights of
   :data:`COST_WEIGHTS` (after SAMCON's pose, root, end-effector and balance terms; the end
   effectors are among the bodies). A sample whose state meets the tracker's fall rule
   (:func:`~kangengine.sim.tracking._fallen`) or diverges is out.
4. The ``keep`` survivors that stayed within ``sampling_fail_error`` and are cheapest over this segment *and
   the next* become the beam (parent indices and offsets stored for backtracking): the
   :data:`LOOKAHEAD_CANDIDATES` ``x keep`` cheapest run the next segment too, their offsets continued (times
   ``sampling_coherence``, no noise), so a state that tracks well now but is heading away is not kept. A
   segment with none is searched again from one, two, three, then (:data:`BACKOFF_SEGMENTS`) up to twelve
   segments back, with :data:`DEEP_RETRY_SAMPLE_SCALE` times the samples after the third failure
   (``sampling_retries`` per clip). When every sample is out, the search stops there: the clip falls at that
   segment. A clip whose path falls or ends over ``sampling_good_error`` is searched again with the next seeds
   (``sampling_restarts``); the furthest, then closest, path is kept.

Jumps: a reference's flight phases are compared against the ballistic arc through its lift-off and touchdown
(:func:`ballistic_shift`; a retargeted, scaled jump keeps its timing and does not fall with gravity), the
push-off that arc needs is added to every sample's offsets as feed-forward (:meth:`_Search.flight_feedforward`),
and the segments near a take-off or landing add a centre-of-mass velocity term (``COST_WEIGHTS["com_velocity"]``)
and double the offsets' spread (:data:`FLIGHT_SIGMA_SCALE`); there, the samples' distribution is refined
(:data:`REFINE_ROUNDS` cross-entropy rounds: refit the mean and per-DOF spread of the elite's noise, draw again,
each round one batched segment; :meth:`_Search._refine`). A clip without flight rows is searched as before.

At the end the cheapest leaf's path gives per-frame target offsets, which :func:`~kangengine.sim.track` replays
through its normal loop (:attr:`~kangengine.sim.TrackingReference.target_offset`): the report describes that
replay, a real simulated trajectory. The samples are a multiple of 32 worlds (``batch_invariant``), so the
replay of the chosen path is bit-identical to the search's (``tests/test_sampling.py``).

Cost: ``sampling_samples`` world-steps per control step, in batches of ``sampling_samples`` worlds
(``docs/tracking.md``: env-steps and seconds per clip-second).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import rotations as R
from ..animation.motion import ArticulationMotion
from .integrator import Simulator
from .kinematics import link_transforms
from .model import Model, State
from .tracking import (
    TrackingReference,
    TrackingSettings,
    _fallen,
    _first_joint_dof,
    _pad_index,
    _self_penetration,
    _with_budget,
    drive_gains,
    pd_control,
    prepare_reference,
    uses_balance,
)

__all__ = ["COST_WEIGHTS", "SamplingPlan", "ballistic_shift", "dof_groups", "sample_target_offsets"]

#: Weights of the search's cost terms, per state reached (units of the terms: m, m, rad, m/s, rad/s, m, m/s, m).
#: ``com_velocity`` counts only in segments near a take-off or landing of the reference (none in a walk).
COST_WEIGHTS = {
    "body": 1.0,
    "com": 2.0,
    "root_rotation": 0.1,
    "root_velocity": 0.2,
    "root_angular_velocity": 0.05,
    "self_penetration": 10.0,
    "com_velocity": 1.0,
    "target_pose": 1.0,
}

#: Compare flights against the ballistic arc of :func:`ballistic_shift` (body, centre of mass and its velocity).
BALLISTIC = True
#: Factor on the offsets' standard deviations in the segments near a take-off or landing (from one segment
#: before to one after): a jump's push-off and landing need larger, coordinated changes than a stance.
FLIGHT_SIGMA_SCALE = 2.0
#: Add the feed-forward the ballistic arc needs (:meth:`_Search.flight_feedforward`) as target offsets.
FLIGHT_FEEDFORWARD = True
#: Control steps per segment near a take-off or landing (``sampling_segment_steps`` elsewhere).
FLIGHT_SEGMENT_STEPS = 6
#: Rounds of refinement of a segment near a take-off or landing (improved SAMCON's iterated sample distribution,
#: a cross-entropy method): each round fits the mean and per-DOF spread of the noise of the ``sampling_keep``
#: cheapest samples that stayed within ``sampling_fail_error`` and draws ``sampling_samples`` more from their
#: parents with it; the segment's beam is chosen from all rounds' samples. 0: off.
REFINE_ROUNDS = 2
#: Smallest spread of a refinement round, times the segment's own ``sigma`` (the fitted spread is clamped to
#: ``REFINE_MIN_SPREAD * sigma .. sigma``), so the distribution does not collapse onto one sample.
REFINE_MIN_SPREAD = 0.25
#: Segments a failed segment's search goes back, by the number of failures since the search last got further:
#: one, two, three segments, then (a drift that began earlier than 0.3 s) further, up to this table's last entry.
BACKOFF_SEGMENTS = (1, 2, 3, 6, 9, 12)
#: Factor on ``sampling_samples`` for the segments searched again after more than three failures at one place
#: (from where the search went back to the furthest segment reached); a multiple of 32 worlds either way.
DEEP_RETRY_SAMPLE_SCALE = 2
#: Lookahead of the beam's selection: the ``LOOKAHEAD_CANDIDATES x sampling_keep`` cheapest survivors of a segment
#: run the next segment too (their offsets continued, no noise), and the beam is the ``keep`` whose own cost plus
#: ``LOOKAHEAD_WEIGHT`` x that continuation's cost is lowest (a continuation that fails ranks last): a state
#: that tracks well now but is heading for a fall is not kept. 0 candidates: no lookahead.
LOOKAHEAD_CANDIDATES = 4
#: Factors on the spread of the non-leg DOFs' noise (trunk, arms, head), cycled over each beam entry's samples:
#: an offset there is pose error first and balance seldom, so the search is offered samples that leave it alone.
POSE_NOISE_SCALES = (1.0, 0.5, 0.25, 0.0)
LOOKAHEAD_WEIGHT = 1.0


@dataclass(frozen=True, eq=False)
class SamplingPlan:
    """What the sampling search found for ``W`` clips (``N`` reference rows in all, as in the
    :class:`~kangengine.sim.TrackingReference` it was planned on).

    Attributes:
        target_offset: ``[N, nv]`` target offset (layout tangent, rad or m; root rows 0) of the step leaving
            each row; 0 after the search stopped.
        q: ``[N, nq]`` the chosen path's simulated state at each row (the first row: the reference's; rows
            after ``reached_step``: the last state reached).
        reached_step: ``[W]`` int64, last step of each clip the chosen path reached (a fall: before the end).
        cost: ``[W]`` the chosen path's summed cost (:data:`COST_WEIGHTS`).
        env_step_count: ``[W]`` int64, world-steps simulated for each clip (samples times steps, every
            restart included).
        seed_offset: ``[W]`` int64, the restart whose path was kept (its seed: ``sampling_seed`` plus this).
    """

    target_offset: torch.Tensor
    q: torch.Tensor
    reached_step: torch.Tensor
    cost: torch.Tensor
    env_step_count: torch.Tensor
    seed_offset: torch.Tensor


def dof_groups(model: Model, stance_bodies: torch.Tensor) -> torch.Tensor:
    """``[nv]`` int64 group of each DOF: 0 legs (a body on the chain from the root to one of ``stance_bodies``
    ``[n]`` int64), 1 trunk and arms (another body whose subtree branches, i.e. holds two or more leaves: the
    spine and thorax, and on the CMU humanoid the arms down to the hands, which end in fingers and a thumb; the
    G1's waist), 2 the rest (neck and head, fingers, single-link ends); the root's DOFs are 2 (no offset)."""
    nb = model.num_bodies
    parents = model.parents
    children = [0] * nb
    for b in range(nb):
        if parents[b] >= 0:
            children[parents[b]] += 1
    leaves = [1 if children[b] == 0 else 0 for b in range(nb)]
    for b in reversed(range(nb)):  # parents come before children in the body order
        if parents[b] >= 0:
            leaves[parents[b]] += leaves[b]
    group = [1 if leaves[b] >= 2 else 2 for b in range(nb)]
    for b in stance_bodies.tolist():
        while b > 0:
            group[b] = 0
            b = parents[b]
    body_group = torch.as_tensor(group, dtype=torch.int64, device=model.device)
    out = body_group[model.dof_body].clone()
    out[: _first_joint_dof(model)] = 2
    return out


def _com(model: Model, pos: torch.Tensor, quat: torch.Tensor) -> torch.Tensor:
    """``[n, 3]`` centre of mass (world, m) of links at ``pos [n, B, 3]``, ``quat [n, B, 4]``."""
    c = pos + R.quat_rotate(quat, model.body_com.expand(pos.shape[0], -1, -1))
    return (c * model.body_mass[:, None]).sum(1) / model.body_mass.sum()


def ballistic_shift(
    com: torch.Tensor,
    lowest: torch.Tensor,
    gravity: torch.Tensor,
    dt: float,
    *,
    contact_height: float = 0.03,
    lift_margin: float = 0.005,
    ramp_s: float = 0.15,
    min_support: float = 0.5,
) -> torch.Tensor:
    """``[K, 3]`` m, what moves a reference's centre of mass ``com [K, 3]`` (world, one row per step of ``dt``
    s) onto a ballistic arc in each of its flight phases; ``lowest [K]`` m: the height of the reference's lowest
    contact point per row, ``gravity [3]`` m/s^2.

    A flight is a run of rows whose lowest point is over ``contact_height`` (the tracker's contact rule),
    widened to where the feet really leave and meet the ground: back to the last row (forward to the first)
    within ``lift_margin`` of the lowest height of the stance before (after) it. Mocap feet rise through the
    contact rule's 3 cm while the body still accelerates upwards (the G1's 01_01 hops). The lift-off is never
    put before a row where the reference's centre of mass still needs the ground to carry more than
    ``min_support`` of its weight (its vertical second difference above ``(min_support - 1) |g|``): on the CMU
    humanoid the retargeted toes rise 3 cm over the last 0.1 s of a push-off that still accelerates the body
    upwards at up to 1.6 g, and a flight widened over it would ask for an impossible take-off (2.5 m/s at the
    crouch's end instead of the reference's 1.7 m/s at its real lift-off).

    A retargeted, scaled jump keeps its timing, so its flight does not fall with ``gravity`` either (the G1's
    01_01 hops fall at about 7.3 m/s^2, its size over the performer's), and no body can follow it. The arc kept
    goes through the reference's centre of mass at the lift-off and touchdown rows, over the same time:
    ``p(t) = p_0 + (p_1 - p_0) t / T + g t (t - T) / 2``. The jump in velocity this asks for at take-off (landing)
    is spread over the ``ramp_s`` s of stance before (after) it by a cubic ``s(u) = dv u (1 + u / ramp_s)^2``
    (``dv t (1 - t / ramp_s)^2``) that starts (ends) at rest: a deeper, faster push-off and a softer landing. The
    shift is 0 elsewhere; flights that touch the clip's first or last row are left as they are."""
    shift = torch.zeros_like(com)
    k = lowest.shape[0]
    airborne = lowest >= contact_height
    flag = torch.cat([airborne.new_zeros(1), airborne, airborne.new_zeros(1)]).to(torch.int8)
    edges = torch.nonzero(flag[1:] - flag[:-1]).flatten().tolist()  # a flight is rows edges[2i] .. edges[2i+1]-1
    ramp = max(int(round(ramp_s / dt)), 1)
    g = torch.linalg.vector_norm(gravity)
    up = -gravity / g
    for a, b in zip(edges[0::2], edges[1::2]):  # one iteration per flight phase, not per frame
        if a == 0 or b >= k:
            continue
        lo = max(a - 2 * ramp, 0)
        before = lowest[lo:a]
        wide = lo + int(torch.nonzero(before <= before.min() + lift_margin).max()) + 1  # first row off the ground
        rows = torch.arange(max(wide - 1, 1), a, device=com.device)  # may the ground still carry the body there?
        accel = ((com[rows + 1] - 2.0 * com[rows] + com[rows - 1]) @ up.to(com.dtype)) / dt**2
        pushed = rows[accel > (min_support - 1.0) * g]
        a = max(wide, int(pushed.max()) + 1) if pushed.numel() else wide
        hi = min(b + 2 * ramp, k)
        after = lowest[b:hi]
        b = b + int(torch.nonzero(after <= after.min() + lift_margin).min())  # touchdown row
        t = torch.arange(1, b - a + 1, dtype=com.dtype, device=com.device)[:, None] * dt
        span = (b - a + 1) * dt
        arc = com[a - 1] + (com[b] - com[a - 1]) * (t / span) + 0.5 * gravity * t * (t - span)
        shift[a:b] = arc - com[a:b]
        dv_off, dv_land = shift[a] / dt, -shift[b - 1] / dt  # the velocity jumps at take-off and landing
        lo = max(a - 1 - ramp, 0)
        u = (torch.arange(lo, a, dtype=com.dtype, device=com.device)[:, None] - (a - 1)) * dt  # -ramp_s .. 0
        shift[lo:a] += dv_off * u * (1.0 + u / ramp_s).clamp(min=0.0) ** 2
        hi = min(b + ramp + 1, k)
        t = (torch.arange(b, hi, dtype=com.dtype, device=com.device)[:, None] - b) * dt  # 0 .. ramp_s
        shift[b:hi] += dv_land * t * (1.0 - t / ramp_s).clamp(min=0.0) ** 2
    return shift


@dataclass(frozen=True, eq=False)
class _Beam:
    """States of the search (``n`` of them): simulator state, last step's normal contact forces ``[n, C]`` N,
    the target offset that led there ``[n, nv]``, and the summed cost of the path ``[n]``."""

    state: State
    normal: torch.Tensor
    offset: torch.Tensor
    cost: torch.Tensor


def _take(state: State, idx: torch.Tensor) -> State:
    return State(q=state.q[idx], qd=state.qd[idx], frozen=state.frozen[idx], energy_budget=state.energy_budget[idx])


def _join(a: tuple, b: tuple) -> tuple:
    """Two :meth:`_Search.segment` results as one (``a``'s samples first)."""
    (sa, *ra), (sb, *rb) = a, b
    state = State(
        q=torch.cat([sa.state.q, sb.state.q]),
        qd=torch.cat([sa.state.qd, sb.state.qd]),
        frozen=torch.cat([sa.state.frozen, sb.state.frozen]),
        energy_budget=torch.cat([sa.state.energy_budget, sb.state.energy_budget]),
    )
    cat = lambda x, y: torch.cat([x, y])  # noqa: E731
    joined = _Beam(state, cat(sa.normal, sb.normal), cat(sa.offset, sb.offset), cat(sa.cost, sb.cost))
    return (joined, *[cat(x, y) for x, y in zip(ra, rb)])


class _Search:
    """The search of one clip (row range ``start .. start + count``), see the module docstring."""

    def __init__(self, model: Model, ref: TrackingReference, settings: TrackingSettings, sim: Simulator):
        self.model, self.ref, self.settings, self.sim = model, ref, settings, sim
        self.balance = uses_balance(model, settings)
        self.gains = drive_gains(model, settings)
        self.j0 = _first_joint_dof(model)
        self._pads = {}
        self._ref_pos = {}

    def _pad(self, n: int) -> torch.Tensor:
        """Indices of ``n`` samples padded to a multiple of 32 worlds (``batch_invariant``)."""
        if n not in self._pads:
            dev = self.model.device
            self._pads[n] = _pad_index(n, 32, dev) if self.settings.batch_invariant else torch.arange(n, device=dev)
        return self._pads[n]

    def sigma(self, start: int, count: int) -> torch.Tensor:
        st, ref = self.settings, self.ref
        stands = (ref.contact_height[start : start + count] < st.contact_height).any(0)
        groups = dof_groups(self.model, ref.contact_bodies[stands])
        table = torch.tensor(
            [st.sampling_sigma_legs, st.sampling_sigma_torso, st.sampling_sigma_limbs],
            dtype=self.model.dtype,
            device=self.model.device,
        )
        sigma = table[groups]
        sigma[: self.j0] = 0.0
        self.pose_mask = (groups != 0).to(sigma.dtype)  # the legs' offsets are balance, not pose: not costed
        return sigma

    def cost(self, state, pos, quat, row: int, ref_com, com_before, ref_com_velocity, shift, flight: bool):
        """``([n] cost, [n] mean body error m, [n, 3] centre of mass m)`` of states at reference row ``row``
        (links ``pos``, ``quat``) against the reference shifted by ``shift [3]`` m (:func:`ballistic_shift`);
        ``com_before [n, 3]``: the centres of mass one step earlier (their difference over ``dt`` is compared
        with ``ref_com_velocity [3]`` m/s when ``flight``: around a take-off or landing)."""
        ref, st = self.ref, self.settings
        body = torch.linalg.vector_norm(pos - (ref.body_pos[row] + shift), dim=-1).mean(-1)
        com_now = _com(self.model, pos, quat)
        com = torch.linalg.vector_norm(com_now - ref_com, dim=-1)
        q_ref = ref.q_raw[row].expand(state.q.shape[0], -1)
        rel = R.quat_multiply(q_ref[:, 3:7], R.quat_conjugate(state.q[:, 3:7]))
        rot = torch.linalg.vector_norm(R.quat_to_rotvec(rel), dim=-1)
        dv = state.qd[:, :6] - ref.qd[row, :6]
        w = COST_WEIGHTS
        cost = (
            w["body"] * body
            + w["com"] * com
            + w["root_rotation"] * rot
            + w["root_velocity"] * torch.linalg.vector_norm(dv[:, :3], dim=-1)
            + w["root_angular_velocity"] * torch.linalg.vector_norm(dv[:, 3:], dim=-1)
        )
        if flight and w["com_velocity"] > 0:
            dcom = (com_now - com_before) / st.dt - ref_com_velocity
            cost = cost + w["com_velocity"] * torch.linalg.vector_norm(dcom, dim=-1)
        if self.model.num_self_pairs:  # limbs driven through the body would be rejected (self_collision)
            cost = cost + w["self_penetration"] * _self_penetration(self.model, pos, quat)[0]
        return cost, body, com_now

    def target_pose_error(self, row: int, offset: torch.Tensor) -> torch.Tensor:
        """``[n]`` m, mean distance of the bodies of reference row ``row``'s pose moved by the target offsets
        ``offset [n, nv]`` (its own root) from that pose's: the pose error the offsets ask for once the drives
        have reached them (:data:`COST_WEIGHTS` ``target_pose``)."""
        q_ref = self.ref.q[row]
        moved = self.model.layout.integrate(q_ref.expand(offset.shape[0], -1), offset * self.pose_mask)
        pos, _ = link_transforms(self.model, moved)
        if row not in self._ref_pos:  # the pose moved by no offset: integrate's renormalising round-off cancels
            still = self.model.layout.integrate(q_ref[None], torch.zeros_like(offset[:1]))
            self._ref_pos = {row: link_transforms(self.model, still)[0]}
        return torch.linalg.vector_norm(pos - self._ref_pos[row], dim=-1).mean(-1)

    def segment(
        self, beam: _Beam, start: int, k: int, steps: int, sigma, targets, generator, n: int, flight: bool, draw=None
    ):
        """Simulate the samples of one segment (steps ``k .. k + steps`` of the clip at row ``start``) from
        ``beam``: ``(samples: _Beam, parent [n], qs [n, steps, nq], alive [n], worst [n] m)``, ``worst`` the
        largest mean body error the segment reached. ``draw``: ``(parent [n], offset [n, nv])`` given instead
        of drawn (:meth:`_refine`)."""
        model, ref, st = self.model, self.ref, self.settings
        dev, dt_ = model.device, model.dtype
        ref_com, ref_com_velocity, shift, base = targets
        if draw is None:
            nb = beam.state.num_worlds
            parent = torch.arange(n, device=dev) % nb
            noise = torch.randn(n, model.nv, generator=generator, dtype=dt_, device=dev) * sigma
            if POSE_NOISE_SCALES:  # each parent's samples: every spread of the non-leg DOFs, down to none
                scales = torch.tensor(POSE_NOISE_SCALES, dtype=dt_, device=dev)
                scale = scales[(torch.arange(n, device=dev) // nb) % scales.shape[0]]
                noise = noise * (1.0 - self.pose_mask + self.pose_mask * scale[:, None])
            noise[:nb] = 0.0
            offset = st.sampling_coherence * beam.offset[parent] + noise
        else:
            parent, offset = draw
        state, normal = _take(beam.state, parent), beam.normal[parent]
        alive = torch.ones(n, dtype=torch.bool, device=dev)
        cost = torch.zeros(n, dtype=dt_, device=dev)
        worst = torch.zeros(n, dtype=dt_, device=dev)
        qs = torch.zeros(n, steps, model.nq, dtype=dt_, device=dev)
        pos, quat = link_transforms(model, state.q)
        com = _com(model, pos, quat)
        p = self._pad(n)
        every = torch.arange(n, device=dev)
        for j in range(steps):
            ci = start + k + j
            cis = torch.full((n,), ci, dtype=torch.int64, device=dev)
            alive &= ~_fallen(model, ref, st, pos, cis) & ~state.frozen
            run = _take(state, p)
            ctrl = pd_control(
                model,
                ref,
                st,
                run,
                cis[p],
                cis[p] + 1,
                normal[p],
                (pos[p], quat[p]),
                self.gains,
                self.balance,
                (offset + base[k + j])[p],
            )
            out = self.sim.step(run, ctrl)
            state = _with_budget(_take(out.state, every))
            normal = out.contact_normal_force[:n]
            qs[:, j] = state.q
            pos, quat = link_transforms(model, state.q)
            c, body, com = self.cost(
                state, pos, quat, ci + 1, ref_com[k + j + 1], com, ref_com_velocity[k + j + 1], shift[k + j + 1], flight
            )
            cost, worst = cost + c, torch.maximum(worst, body)
        if COST_WEIGHTS["target_pose"] > 0:  # where the held offset sends the bodies, which 6 steps show in part
            cost = cost + COST_WEIGHTS["target_pose"] * steps * self.target_pose_error(start + k + steps, offset)
        end = torch.full((n,), start + k + steps, dtype=torch.int64, device=dev)
        alive &= ~_fallen(model, ref, st, pos, end) & ~state.frozen
        return _Beam(state, normal, offset, cost), parent, qs, alive, worst

    def run(self, start: int, count: int, generator: torch.Generator):
        """``(offset [count, nv], q [count, nq], reached_step, cost, env_steps)`` for the clip at rows
        ``start .. start + count``: segment by segment; a segment none of whose samples stays within
        ``sampling_fail_error`` is searched again from up to three segments back (``sampling_retries`` times in
        all per clip), then accepted as it is."""
        model, ref, st = self.model, self.ref, self.settings
        dev, dt_ = model.device, model.dtype
        n, keep, seg = int(st.sampling_samples), int(st.sampling_keep), int(st.sampling_segment_steps)
        sigma = self.sigma(start, count)
        pos_r, quat_r = link_transforms(model, ref.q_raw[start : start + count])
        ref_com = _com(model, pos_r, quat_r)  # [count, 3]
        airborne = (ref.contact_height[start : start + count] >= st.contact_height).all(-1)
        lowest = ref.contact_height[start : start + count].amin(-1)
        shift = (
            ballistic_shift(ref_com, lowest, model.gravity, st.dt, contact_height=st.contact_height)
            if BALLISTIC
            else torch.zeros_like(ref_com)
        )
        pos_s, quat_s = link_transforms(model, ref.q[start : start + count])
        com_smooth = _com(model, pos_s, quat_s) + shift  # the velocity target: smoothed, not the raw mocap's noise
        com_velocity = torch.zeros_like(com_smooth)
        com_velocity[1:] = (com_smooth[1:] - com_smooth[:-1]) / st.dt
        base = self.flight_feedforward(start, count, shift)
        targets = (ref_com + shift, com_velocity, shift, base)
        first = _with_budget(State.from_q(model, ref.q[start : start + 1], ref.qd[start : start + 1]))
        zeros = lambda *shape: torch.zeros(*shape, dtype=dt_, device=dev)  # noqa: E731
        beams = [_Beam(first, zeros(1, model.num_contact_points), zeros(1, model.nv), zeros(1))]
        flag = airborne.to(torch.int8)
        change = torch.cat([flag.new_zeros(1), (flag[1:] - flag[:-1]).abs()]).bool()  # rows where contact changes
        segments, near = [], []
        for k in range(0, count - 1, seg):  # one iteration per segment, not per frame
            # near a take-off or landing (from one segment before to one after): shorter segments, wider offsets
            close = bool(change[max(k - seg, 0) : k + 2 * seg + 1].any())
            part = max(min(FLIGHT_SEGMENT_STEPS, seg), 1) if close else seg
            for kk in range(k, min(k + seg, count - 1), part):
                segments.append((kk, min(part, k + seg - kk, count - 1 - kk)))
                near.append(close)
        records, env_steps, retries, fails, fell, i, furthest = [], 0, 0, 0, False, 0, 0
        while i < len(segments):
            k, steps = segments[i]
            sig = sigma * FLIGHT_SIGMA_SCALE if near[i] else sigma
            deep = fails > 3  # re-searching a drift that began earlier than three segments back: more samples
            ns = n * DEEP_RETRY_SAMPLE_SCALE if deep else n
            samples, parent, qs, alive, worst = self.segment(
                beams[i], start, k, steps, sig, targets, generator, ns, near[i]
            )
            env_steps += ns * steps
            if near[i] and REFINE_ROUNDS > 0:
                drawn, extra = self._refine(
                    beams[i], (samples, parent, qs, alive, worst), start, k, steps, sig, targets, generator, ns
                )
                samples, parent, qs, alive, worst = drawn
                env_steps += extra
            good = alive & (worst < st.sampling_fail_error)
            if not bool(good.any()) and retries < st.sampling_retries and i > 0:
                retries, fails = retries + 1, fails + 1
                i -= min(BACKOFF_SEGMENTS[min(fails, len(BACKOFF_SEGMENTS)) - 1], i)  # further back each time
                del beams[i + 1 :], records[i:]
                continue
            pool = good if bool(good.any()) else alive
            survivors = int(pool.sum())
            fell = survivors == 0
            ranked = torch.where(pool, samples.cost, torch.full_like(samples.cost, float("inf")))
            if fell:  # every sample is out: the clip falls in this segment; keep its cheapest sample
                ranked = samples.cost.nan_to_num(float("inf"))
            best = torch.topk(ranked, max(min(keep, survivors), 1), largest=False).indices
            if not fell and LOOKAHEAD_CANDIDATES > 0 and i + 1 < len(segments):
                best, extra = self._lookahead(
                    samples, ranked, survivors, start, segments[i + 1], near[i + 1], targets, generator
                )
                env_steps += extra
            records.append((k, steps, parent[best], samples.offset[best], qs[best]))
            total = beams[i].cost[parent[best]] + samples.cost[best]
            beams.append(_Beam(_take(samples.state, best), samples.normal[best], samples.offset[best], total))
            i += 1
            if i > furthest:  # progress past the furthest segment reached resets the back-off
                furthest, fails = i, 0
            if fell:
                break
        return self._backtrack(records, count, ref.q[start], beams[-1].cost[0], fell, base) + (env_steps,)

    def _refine(self, beam: _Beam, drawn: tuple, start: int, k: int, steps: int, sigma, targets, generator, n: int):
        """``(drawn joined with REFINE_ROUNDS rounds of n samples each, world-steps)``: each round refits the
        noise distribution (mean and per-DOF spread of ``offset - sampling_coherence * parent's offset``) to the
        ``sampling_keep`` cheapest good samples so far and draws ``n`` new samples from it, their parents cycled
        over the elite's; every round is one batched segment (:data:`REFINE_ROUNDS`)."""
        st = self.settings
        keep, c = int(st.sampling_keep), st.sampling_coherence
        extra = 0
        for _ in range(REFINE_ROUNDS):
            samples, parent, _, alive, worst = drawn
            good = alive & (worst < st.sampling_fail_error)
            pool = good if bool(good.any()) else alive
            m = min(keep, int(pool.sum()))
            if m < 2:
                break
            ranked = torch.where(pool, samples.cost, torch.full_like(samples.cost, float("inf")))
            elite = torch.topk(ranked, m, largest=False).indices
            noise = samples.offset[elite] - c * beam.offset[parent[elite]]
            mean = noise.mean(0)
            spread = torch.minimum(torch.maximum(noise.std(0), REFINE_MIN_SPREAD * sigma), sigma)
            pick = elite[torch.arange(n, device=elite.device) % m]
            fresh = torch.randn(n, noise.shape[1], generator=generator, dtype=noise.dtype, device=noise.device)
            offset = c * beam.offset[parent[pick]] + mean + fresh * spread
            more = self.segment(beam, start, k, steps, sigma, targets, generator, n, True, (parent[pick], offset))
            drawn = _join(drawn, more)
            extra += int(self._pad(n).shape[0]) * steps
        return drawn, extra

    def _lookahead(self, samples: _Beam, ranked, survivors: int, start: int, nxt, near: bool, targets, generator):
        """``([<= keep] indices into samples, world-steps)``: the beam chosen by each candidate's segment cost
        (``ranked [n]``, inf for samples out) plus its continuation's over the next segment ``nxt = (k, steps)``
        of the clip at row ``start`` (:data:`LOOKAHEAD_CANDIDATES`; the continuation's noise is 0, so its
        offsets are ``sampling_coherence`` times the candidates')."""
        keep = int(self.settings.sampling_keep)
        m = min(LOOKAHEAD_CANDIDATES * keep, survivors)
        cand = torch.topk(ranked, m, largest=False).indices
        start_beam = _Beam(_take(samples.state, cand), samples.normal[cand], samples.offset[cand], samples.cost[cand])
        k, steps = nxt
        zero = torch.zeros(self.model.nv, dtype=self.model.dtype, device=self.model.device)
        ahead, _, _, alive, worst = self.segment(start_beam, start, k, steps, zero, targets, generator, m, near)
        fine = alive & (worst < self.settings.sampling_fail_error)
        score = samples.cost[cand] + LOOKAHEAD_WEIGHT * ahead.cost.nan_to_num(0.0)
        score = torch.where(fine, score, score.nan_to_num(0.0) + 1e6)  # a failing continuation ranks last
        order = torch.topk(score, min(keep, m), largest=False).indices
        return cand[order], int(self._pad(m).shape[0]) * steps  # the worlds simulated, padding included

    def flight_feedforward(self, start: int, count: int, shift: torch.Tensor) -> torch.Tensor:
        """``[count, nv]`` target offsets (rad, m) whose drive torques ``kp * offset`` are what the feed-forward
        of the reference moved by ``shift [count, 3]`` m (:func:`ballistic_shift`, applied to the root) adds to
        the reference's own: the push-off a ballistic flight of the same duration needs. The shifted clip gets
        the reference's own inverse dynamics and contact fit (:func:`~kangengine.sim.prepare_reference`, no
        smoothing); 0 on rows the shift leaves alone and on the root."""
        model, ref, st = self.model, self.ref, self.settings
        out = torch.zeros(count, model.nv, dtype=model.dtype, device=model.device)
        moved = shift.abs().amax(-1) > 0
        if not FLIGHT_FEEDFORWARD or not bool(moved.any()):
            return out
        moved[1:] |= moved[:-1].clone()  # the step leaving a moved row and the one reaching it
        moved[:-1] |= moved[1:].clone()
        q = ref.q[start : start + count].clone()
        q[:, :3] += shift
        motion = ArticulationMotion(
            q.cpu().numpy(), ref.qd[start : start + count].cpu().numpy(), 1.0 / st.dt, model.layout.model_signature
        )
        moved_ref = prepare_reference(model, [motion], replace(st, smoothing_s=0.0))
        extra = moved_ref.feedforward[:count] - ref.feedforward[start : start + count]
        kp = self.gains[0]
        j0 = self.j0
        out[:, j0:] = torch.where(moved[:, None] & (kp[j0:] > 0), extra[:, j0:] / kp[j0:].clamp(min=1e-9), 0.0)
        return out

    def _backtrack(self, records, count: int, q0: torch.Tensor, cost: torch.Tensor, fell: bool, base):
        model = self.model
        offset = torch.zeros(count, model.nv, dtype=model.dtype, device=model.device)
        q = q0.expand(count, -1).clone()
        leaf, last = 0, 0
        for k, steps, parent, off, qs in reversed(records):
            offset[k : k + steps] = off[leaf] + base[k : k + steps]
            q[k + 1 : k + 1 + steps] = qs[leaf]
            last = max(last, k + steps)
            leaf = int(parent[leaf])
        reached = last - 1 if fell else last  # a fallen path's last segment ends in a fallen state
        q[last + 1 :] = q[last]
        return offset, q, reached, cost


def sample_target_offsets(
    model: Model, ref: TrackingReference, settings: TrackingSettings, sim: Simulator
) -> SamplingPlan:
    """Search per-segment offsets of the ``PD`` tracker's joint targets for every clip of ``ref`` (module
    docstring; one clip at a time, ``settings.sampling_samples`` worlds per step, seeded by
    ``settings.sampling_seed``: the same inputs give the same plan).

    Args:
        model: the :class:`~kangengine.sim.Model` the reference was prepared for.
        ref: :func:`~kangengine.sim.prepare_reference` result (free root).
        settings: :class:`~kangengine.sim.TrackingSettings` (``sampling_*`` fields and the tracker's own).
        sim: the :class:`~kangengine.sim.Simulator` :func:`~kangengine.sim.track` steps with (its solver fixed),
            so the search and the replay share every operation.
    Returns:
        :class:`SamplingPlan`.
    """
    search = _Search(model, ref, settings, sim)
    dev = model.device
    offsets = torch.zeros(ref.q.shape[0], model.nv, dtype=model.dtype, device=dev)
    q_path = ref.q.clone()
    w = ref.num_clips
    reached = torch.zeros(w, dtype=torch.int64, device=dev)
    costs = torch.zeros(w, dtype=model.dtype, device=dev)
    env = torch.zeros(w, dtype=torch.int64, device=dev)
    restarts = torch.zeros(w, dtype=torch.int64, device=dev)
    for c in range(w):  # one clip at a time: its samples are the batch
        start, count = int(ref.clip_step_start[c]), int(ref.clip_step_count[c])
        best, spent = None, 0
        for r in range(int(settings.sampling_restarts) + 1):
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(settings.sampling_seed) + r)
            off, q, last, cost, steps = search.run(start, count, gen)
            spent += steps
            pos, _ = link_transforms(model, q[: last + 1])
            error = float(torch.linalg.vector_norm(pos - ref.body_pos[start : start + last + 1], dim=-1).mean())
            rank = (-last, error)  # the furthest path first, then the closest
            if best is None or rank < best[0]:
                best = (rank, off, q, last, cost, r)
            if last == count - 1 and error <= settings.sampling_good_error:
                break
        _, off, q, last, cost, r = best
        offsets[start : start + count] = off
        q_path[start : start + count] = q
        reached[c], costs[c], env[c], restarts[c] = last, cost, spent, r
    return SamplingPlan(
        target_offset=offsets, q=q_path, reached_step=reached, cost=costs, env_step_count=env, seed_offset=restarts
    )

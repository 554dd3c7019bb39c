"""Track mapped motions in the simulator and measure what physics says about them.

:func:`track` runs one world per clip, every clip in one batch (padded to the longest), with the
simulator following each reference by its implicit PD drives plus feed-forward torques from inverse
dynamics of the reference. It returns per-frame metrics (:class:`TrackingResult`) that
:func:`kangengine.sim.validate` turns into per-clip reports.

How a reference becomes controls (all batched over the clips' frames, once, before the first step):

1. **Resampling.** Every clip is resampled to the simulator's step times ``t_k = k dt`` with the layout's
   geodesic interpolation, so clips of any length and fps share one time grid. A Gaussian smoothing of
   ``smoothing_s`` in the tangent space (``q_k (+) sum_j w_j (q_{k+j} (-) q_k)``) removes mocap jitter
   before differentiation; the metrics compare against the unsmoothed reference.
2. **Discretely consistent derivatives.** ``v_k = (q_k (-) q_{k-1}) / dt`` and ``a_k = (v_{k+1} - v_k) / dt``.
   These are exactly what the backward-Euler step produces when it lands on the reference, so with the
   feed-forward ``ID(q_k, v_k, a_k)`` and the PD targets ``(q_{k+1}, v_{k+1})`` an actuated root would
   reproduce the reference to round-off.
3. **Contact-consistent feed-forward** (:attr:`FeedForward.CONTACT`, the default). The root is not
   actuated: the first six rows of ``ID`` are the wrench the motion needs from outside (the *residual
   wrench*). It is distributed over the contact points that are near the ground in the reference by a
   small non-negative least-squares fit in a linearised friction cone (four edges per point, a fixed
   number of accelerated projected-gradient iterations, batched over all frames), and the joint
   feed-forward becomes ``tau = ID - J_c^T f_c`` (plus the model's passive spring and damper forces),
   so the torques are those of the reference motion *with* its ground reaction forces. What the fit
   cannot explain is the *unsupported wrench* (a frame that needs it is physically impossible with
   this contact). Where several contacts share the load (two feet, a foot's heel, toe and toe body), the
   root's wrench does not fix the split, and the minimum-norm one puts force where the ankles need the most
   torque. So (``fit_effort``, an option: off by default, see ``docs/tracking.md`` for why), among the cone
   forces that explain the same root wrench, the fit
   takes those that minimise ``sum_j ((tau_j - (J_c^T f)_j) / limit_j)^2`` over the joints (a DOF without an
   effort limit weighs as the median one): the torque-minimising contact distribution of whole-body
   controllers, which is what a policy with the model's own actuators must find. The root's wrench stays
   first: a frame keeps these forces only where they explain it as well as the minimum-norm ones.
4. **Balance by the stance legs** (``balance``, on by default). Open-loop joint tracking drifts: the
   root follows from contact forces, and a humanoid on its feet is an inverted pendulum. Each step the
   joint targets are shifted by ``dq`` solving ``J_p,joints dq = -J_p,root e`` in damped least squares over
   the contact points that carry load in the current step (rows weighted by their normal force), where
   ``e`` is the root's pose error against the reference: with the loaded points held where they are, the
   legs would put the root back on the reference. Only joints move, so the body can push on the ground,
   never on the root: a floating or skating reference still fails.
5. **Root assistance** (``root_assist_frequency_hz``, off by default): an implicit PD drive on the root
   DOFs towards the reference root, a virtual external wrench (by default horizontal force and torque
   only, never vertical support). When used, its force and torque are reported per frame and in the
   validation report.

Per step, only tensors are gathered (one reference row per world by index), so there is no Python loop
over clips: the same code runs on CPU and CUDA. The worlds are slots (``num_worlds``): a world whose clip
ends, whose tracker falls (``early_stop``) or whose simulation diverges stops and takes the next clip, or
leaves the batch; that bookkeeping reads one boolean per step from the device. Each clip's result does not
depend on its batch (``batch_invariant``), so a bad clip never changes another's numbers.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .. import rotations as R
from ..animation.motion import ArticulationMotion
from ..errors import MotionError, ShapeError
from .contact import closest_segment_points
from .control import Control
from .dynamics import inverse_dynamics, mass_matrix
from .integrator import Simulator, cholesky_solve
from .kinematics import link_jacobians, link_transforms
from .model import Model, State
from .wbc import whole_body_control

__all__ = [
    "Controller",
    "FeedForward",
    "TrackingSettings",
    "TrackingReference",
    "TrackingResult",
    "prepare_reference",
    "track",
    "drive_gains",
]

GRAVITY = 9.81

#: ``TrackingSettings.batch_invariant`` pads the tracked batch to a multiple of this many worlds: twice the
#: widest CPU SIMD vector in float32 (AVX-512), so no world falls into a kernel's scalar remainder loop.
_BATCH_MULTIPLE = 32


class FeedForward(str, enum.Enum):
    """Feed-forward torques added to the PD drives.

    ``CONTACT``: inverse dynamics of the reference minus the generalized forces of the contact forces
    fitted to its residual wrench (``ID - J_c^T f_c``). ``INVERSE_DYNAMICS``: the joint rows of inverse
    dynamics alone (the root residual is dropped). ``NONE``: PD only.
    """

    CONTACT = "contact"
    INVERSE_DYNAMICS = "inverse_dynamics"
    NONE = "none"


class Controller(str, enum.Enum):
    """How :func:`track` turns the reference into drive commands each step.

    ``PD`` (default): the reference's feed-forward (:class:`FeedForward`) plus PD drives towards the reference
    and the stance-leg balance correction of the targets (``balance``). ``WHOLE_BODY`` (experimental;
    ``docs/tracking.md`` says what it achieves): the whole-body controller of :mod:`kangengine.sim.wbc`:
    desired accelerations of every DOF, the free root included (reference acceleration plus pose and velocity
    feedback), realised by joint torques and ground forces in linearised friction cones, applied as the
    drives' feed-forward with the implicit PD drives as a damping layer around the planned next state.
    ``IMPLICIT`` (experimental): plans with the simulator's own contact model: a probe step with the reference
    feed-forward, then the joint torques that land the implicit step on ``qd_des = qd_ref' + h (Kp (q_ref - q)
    + Kd (qd_ref - qd))`` (root rows included) by the step's linearisation ``d qd' / d tau = h H^-1 S^T``,
    a regularised least squares per world; two steps per step. All three fall on real mocap within about a
    second without root assistance (measured on CMU 02_01: PD at 1.08 s, IMPLICIT at 0.95-0.98 s; see
    ``docs/tracking.md``). ``SAMPLING``: the ``PD`` tracker with per-segment offsets of its joint targets found
    by a sampling search through the simulator (SAMCON, :mod:`kangengine.sim.sampling`), then replayed.
    """

    WHOLE_BODY = "whole_body"
    PD = "pd"
    IMPLICIT = "implicit"
    SAMPLING = "sampling"


@dataclass(frozen=True)
class TrackingSettings:
    """How :func:`track` follows a reference.

    Attributes:
        dt: simulator step, s.
        iterations: Newton iterations per step (:class:`~kangengine.sim.Simulator`).
        drive_frequency_hz: natural frequency of the joint PD drives: ``kp_i = I_i w^2``,
            ``kd_i = 2 zeta I_i w``, where ``I_i`` is the inertia of the whole body about DOF ``i``'s axis
            at the neutral pose (a stance leg carries the body, so its drives are sized for it).
        drive_damping_ratio: ``zeta``.
        drive_stiffness, drive_damping: explicit gains replacing the ones above: a scalar (every
            non-root DOF), an ``[nv]`` array, or a mapping from joint/DOF names to values.
        controller: :class:`Controller` (default ``PD``; ``WHOLE_BODY`` and ``IMPLICIT`` are experimental, see
            ``docs/tracking.md``).
        sampling_samples: :attr:`Controller.SAMPLING`'s worlds per segment (samples, one batch).
        sampling_keep: states kept after each segment (``n_save``, the beam).
        sampling_segment_steps: control steps per segment (one offset per segment).
        sampling_sigma_legs, sampling_sigma_torso, sampling_sigma_limbs: rad (m for slides), standard deviation
            of the target offsets of the DOFs that carry the body to the ground (root-to-stance-body chains), of
            the trunk and arms (other bodies whose subtree branches) and of the rest (head, fingers;
            :func:`kangengine.sim.sampling.dof_groups`).
        sampling_coherence: the mean of a sample's offset is this times its parent's offset (temporal coherence).
        sampling_seed: seed of the search's random generator (same seed, same plan).
        sampling_fail_error: m, a sample whose mean body error exceeds this within its segment has failed; a
            segment with no other sample is searched again from up to three segments back.
        sampling_retries: most such searches again per clip (then the segment's best is kept as it is).
        sampling_restarts: searches of a clip again with the next seeds when its path falls or its mean body
            error exceeds ``sampling_good_error`` (m); the furthest, then closest, path is kept.
        sampling_fallback: :func:`kangengine.pipelines.validate` only: a clip the ``PD`` tracker (without root
            assistance) loses (``fell``, ``tracking_error``) and that no reference-side rule rejects is tracked
            again with :attr:`Controller.SAMPLING`, and that result is reported (with an info reason).
        wbc_root_frequency_hz, wbc_joint_frequency_hz: natural frequencies of the whole-body controller's
            acceleration feedback ``Kp = w^2``, ``Kd = 2 zeta w`` on the root pose and on the joints.
        wbc_damping_ratio: its ``zeta``.
        wbc_root_weight, wbc_joint_weight: weights of the root's and the joints' acceleration errors (times
            the inertia about each DOF, :func:`drive_gains`' ``I_i``).
        wbc_stance_settle_s: s, the stance bodies' twists are brought to rest at this rate (a hard constraint
            of the plan: a body the reference stands on and that touches the ground does not slip or roll).
        wbc_contact_height: m, a simulated contact point of a body the reference stands on may carry load in
            the plan when it is this close to the ground (the penalty contact pushes only when it touches).
        wbc_iterations: projected-gradient iterations of the per-step force distribution.
        implicit_root_frequency_hz, implicit_joint_frequency_hz: :attr:`Controller.IMPLICIT`'s feedback
            ``Kp = w^2``, ``Kd = 2 w`` (critically damped) on the root pose and on the joints in its desired next
            velocity ``qd_des = qd_ref' + h (Kp (q_ref - q) + Kd (qd_ref - qd))``.
        implicit_root_weight: weight of the root rows against the joints' (both times :func:`drive_gains`'
            ``I_i``).
        implicit_regularization: weight of ``||h (tau - tau_ID) / sqrt(I)||^2`` against the velocity errors.
        implicit_drive_scale: the implicit PD drives of ``IMPLICIT`` use :func:`drive_gains` times this (stiff
            drives inside the step cancel most of a feed-forward change within it).
        wbc_drive_scale: the implicit PD drives around the planned next state use :func:`drive_gains`
            times this (a damping layer; the whole-body torques do the tracking).
        feedforward: :class:`FeedForward` (``Controller.PD`` only; the whole-body controller computes its
            own torques each step).
        smoothing_s: standard deviation (s) of the Gaussian smoothing of the reference before it is
            differentiated; 0 turns it off.
        contact_height: m, a reference contact point this close to the ground (or below) may carry load
            in the contact fit.
        fit_points: most contact points per frame considered by the fit (the lowest ones).
        fit_iterations: projected-gradient iterations of the contact fit.
        fit_effort: distribute the fitted contact forces where the joints' torques, relative to their effort
            limits, are smallest (see the module docstring, item 3); off (the default): the minimum-norm
            distribution, which tracks the CMU humanoid's walks better with the search and costs ~20x less.
        fit_effort_penalty, fit_effort_rounds, fit_effort_iterations, fit_effort_ridge: its augmented
            Lagrangian (penalty on the root's wrench, in units of ``m g``, against the squared torque/limit
            ratios), its rounds, the active-set steps per round and the ridge on the forces (units of ``m g``).
        friction: Coulomb coefficient used by the fit (``None``: the model's per-point friction); the fit
            uses ``friction_margin`` times it.
        friction_margin: safety factor on the friction cone of the fit.
        balance: stance-leg balance correction of the joint targets (see the module docstring).
        balance_gain: fraction of the root error the correction removes per step (1: all of it).
        balance_regularization: damping of the least-squares solve (m^2 per unit load share).
        root_assist_frequency_hz: natural frequency of the virtual root PD drive (``kp = M_root w^2``,
            ``kd = 2 zeta M_root w`` on the diagonal of the whole-body root inertia); 0 (default) turns
            it off.
        root_assist_damping_ratio: its ``zeta``.
        root_assist_horizontal_scale, root_assist_vertical_scale, root_assist_rotation_scale: gain scale
            of its horizontal force, vertical force (default 0: the body is never held up) and torque.
        self_collision: simulate link-to-link contact while tracking (needs a model built with
            ``ContactParams(self_collision=True)``; off by default: on the CMU humanoid's 1069 pairs it made a
            tracked step 3.1x as expensive, see ``docs/tracking.md``). Whether it is on or off, a model with
            pairs gets the self-penetration of the reference and of the tracked motion measured (geometry
            only) for the verdict's ``self_collision`` rule.
        clamp_effort: clamp drive efforts at the model's effort limits (default: unclamped, and the
            effort over the limit is reported instead).
        early_stop: stop simulating a clip whose tracker has fallen (mean body error over
            ``fall_body_error`` m, or the root below ``fall_root_height_ratio`` of the reference root's
            height: the verdict's fall rule) and give its world to the next clip.
        batch_invariant: pad the batch to a multiple of 32 worlds (copies, discarded) so that each clip's
            result is bit-identical whichever clips share its batch and wherever it sits in it (one torch
            thread; see :func:`track`); costs about 20% of a step at one world, nothing from 32 on.
        threads: torch intra-op threads while :func:`track` runs (restored after); ``None`` keeps torch's
            setting. One (the default) is the fast choice on a machine whose cores other processes also use
            (there torch's one thread per core made a 1024-world step 15-25x slower, see ``docs/sim.md``),
            costs at most the 1.6x that a second core gives on a quiet one, and makes results independent
            of the machine's core count; run several processes for more throughput.
        fall_body_error, fall_root_height_ratio: the fall rule of ``early_stop`` (``validate`` sets them
            from its :class:`~kangengine.sim.ValidationThresholds`).
        divergence_speed: m/s and rad/s, a generalized speed above which the simulation of a clip has
            diverged (stopped and reported ``diverged``); divergence_distance: m (rad), the same for a
            coordinate's distance from 0.
        chunk_frames: reference frames processed together during setup.
    """

    dt: float = 1.0 / 60.0
    iterations: int = 2
    drive_frequency_hz: float = 2.0
    drive_damping_ratio: float = 1.0
    drive_stiffness: float | Sequence[float] | Mapping[str, float] | None = None
    drive_damping: float | Sequence[float] | Mapping[str, float] | None = None
    controller: Controller = Controller.PD
    sampling_samples: int = 256
    sampling_keep: int = 32
    sampling_segment_steps: int = 6
    sampling_sigma_legs: float = 0.15
    sampling_sigma_torso: float = 0.1
    sampling_sigma_limbs: float = 0.02
    sampling_coherence: float = 0.5
    sampling_fail_error: float = 0.1
    sampling_retries: int = 20
    sampling_fallback: bool = True
    sampling_restarts: int = 2
    sampling_good_error: float = 0.05
    sampling_seed: int = 0
    wbc_root_frequency_hz: float = 2.0
    wbc_joint_frequency_hz: float = 6.0
    wbc_damping_ratio: float = 1.0
    wbc_root_weight: float = 10.0
    wbc_joint_weight: float = 1.0
    wbc_stance_settle_s: float = 0.05
    wbc_contact_height: float = 0.005
    wbc_iterations: int = 40
    wbc_drive_scale: float = 0.25
    implicit_root_frequency_hz: float = 2.0
    implicit_joint_frequency_hz: float = 4.0
    implicit_root_weight: float = 10.0
    implicit_regularization: float = 1e-2
    implicit_drive_scale: float = 0.25
    feedforward: FeedForward = FeedForward.CONTACT
    smoothing_s: float = 0.02
    contact_height: float = 0.03
    fit_points: int = 16
    fit_iterations: int = 150
    fit_effort_ridge: float = 1e-4
    fit_effort: bool = False
    fit_effort_penalty: float = 1e4
    fit_effort_rounds: int = 3
    fit_effort_iterations: int = 30
    friction: float | None = None
    friction_margin: float = 0.8
    balance: bool = True
    balance_gain: float = 1.0
    balance_regularization: float = 1e-2
    root_assist_frequency_hz: float = 0.0
    root_assist_damping_ratio: float = 1.0
    root_assist_horizontal_scale: float = 1.0
    root_assist_vertical_scale: float = 0.0
    root_assist_rotation_scale: float = 1.0
    self_collision: bool = False
    clamp_effort: bool = False
    early_stop: bool = True
    batch_invariant: bool = True
    threads: int | None = 1
    fall_body_error: float = 0.5
    fall_root_height_ratio: float = 0.5
    divergence_speed: float = 1000.0
    divergence_distance: float = 10000.0
    chunk_frames: int = 256

    def __post_init__(self):
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise ShapeError(f"dt is {self.dt}; expected a positive number of seconds", item="TrackingSettings.dt")
        object.__setattr__(self, "feedforward", FeedForward(self.feedforward))
        object.__setattr__(self, "controller", Controller(self.controller))
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise ShapeError(
                f"threads is {self.threads!r}; expected None or an int >= 1", item="TrackingSettings.threads"
            )
        for name in ("divergence_speed", "divergence_distance", "fall_body_error"):
            v = getattr(self, name)
            if not (v > 0):
                raise ShapeError(f"{name} is {v}; expected a number > 0", item=f"TrackingSettings.{name}")
        for name in ("sampling_samples", "sampling_keep", "sampling_segment_steps"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ShapeError(f"{name} is {v!r}; expected an int >= 1", item=f"TrackingSettings.{name}")
        if self.sampling_keep > self.sampling_samples:
            raise ShapeError(
                f"sampling_keep is {self.sampling_keep}, more than sampling_samples ({self.sampling_samples}); "
                "expected at most as many kept states as samples",
                item="TrackingSettings.sampling_keep",
            )
        for name in ("sampling_retries", "sampling_restarts"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ShapeError(f"{name} is {v!r}; expected an int >= 0", item=f"TrackingSettings.{name}")
        for name in (
            "sampling_sigma_legs",
            "sampling_sigma_torso",
            "sampling_sigma_limbs",
            "sampling_coherence",
            "sampling_fail_error",
            "sampling_good_error",
        ):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ShapeError(f"{name} is {v}; expected a finite number >= 0", item=f"TrackingSettings.{name}")
        for name in ("drive_frequency_hz", "root_assist_frequency_hz", "smoothing_s", "balance_gain"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ShapeError(f"{name} is {v}; expected a finite number >= 0", item=f"TrackingSettings.{name}")

    def to_dict(self) -> dict:
        """JSON-ready settings (enums as their values, arrays as lists)."""
        out = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, Mapping):
                v = {str(a): float(b) for a, b in sorted(v.items())}
            elif isinstance(v, (np.ndarray, list, tuple)):
                v = [float(x) for x in np.asarray(v).ravel()]
            out[k] = v
        return out


@dataclass(frozen=True, eq=False)
class TrackingReference:
    """The references of ``W`` clips on the simulator's time grid, packed frame-major (``N`` = total
    number of grid frames of all clips), plus what the reference alone says (no simulation). The tensors live
    on the model's device in its dtype.

    Attributes:
        dt: grid step, s.
        clip_step_start: ``[W]`` int64, first row of each clip; clip_step_count: ``[W]`` rows per clip.
        q: ``[N, nq]`` tracked (smoothed) coordinates; qd, qdd: ``[N, nv]`` their discrete derivatives.
        q_raw: ``[N, nq]`` resampled, unsmoothed coordinates (what metrics compare against).
        feedforward: ``[N, nv]`` feed-forward drive force for the step leaving each frame (root rows 0).
        residual_wrench: ``[N, 6]`` first six rows of inverse dynamics with no contact: world force (N) at
            the root origin, world torque (N m) about it.
        unsupported_wrench: ``[N, 6]`` the part of it the contact fit could not explain.
        contact_force: ``[N, Bc]`` N, vertical force the fit puts on each contact body.
        contact_height: ``[N, Bc]`` m, height of each contact body's lowest contact point (unsmoothed).
        contact_speed: ``[N, Bc]`` m/s, horizontal speed of the slowest material point of the body's sole on
            the ground (the convex hull of its contact points within ``contact_height``: a foot turning about
            a point of its sole is still); of the lowest point where none is that low.
        body_pos: ``[N, B, 3]`` m, body origins of the unsmoothed reference (world).
        contact_bodies: ``[Bc]`` int64, bodies with contact points.
        target_offset: ``[N, nv]`` or ``None``: added (layout tangent, rad or m; root rows 0) to the PD position
            targets of the step leaving each frame, after the balance correction (:attr:`Controller.SAMPLING`'s
            plan, :func:`kangengine.sim.sampling.sample_target_offsets`).
    """

    dt: float
    clip_step_start: torch.Tensor
    clip_step_count: torch.Tensor
    q: torch.Tensor
    qd: torch.Tensor
    qdd: torch.Tensor
    q_raw: torch.Tensor
    feedforward: torch.Tensor
    residual_wrench: torch.Tensor
    unsupported_wrench: torch.Tensor
    contact_force: torch.Tensor
    contact_height: torch.Tensor
    contact_speed: torch.Tensor
    body_pos: torch.Tensor
    contact_bodies: torch.Tensor
    target_offset: torch.Tensor | None = None

    @property
    def num_clips(self) -> int:
        return int(self.clip_step_start.shape[0])


@dataclass(frozen=True, eq=False)
class TrackingResult:
    """Per-frame metrics of ``W`` tracked clips on the simulator grid of ``K`` steps (the longest clip);
    numpy arrays ``[W, K, ...]``, entries past a clip's end are 0 and ``valid`` is False there.

    Attributes:
        dt: s per frame. clip_names: ``W`` names. clip_step_count: ``[W]`` frames of each clip.
        settings: the :class:`TrackingSettings` used. total_mass: kg. body_names: ``B`` names.
        dof_names: names of the ``nv - 6`` non-root DOFs (or ``nv`` for a fixed root).
        contact_body_names: ``Bc`` bodies with contact points.
        valid: ``[W, K]`` bool.
        body_error: ``[W, K, B]`` m, distance between simulated and reference body origins.
        body_error_mean, body_error_max: ``[W, K]`` m, mean and max over bodies.
        dof_error: ``[W, K, D]`` rad or m, ``|q_sim (-) q_ref|`` per non-root DOF.
        root_error: ``[W, K]`` m (3-D); root_horizontal_error ``[W, K]`` m; root_height_error ``[W, K]`` m
            (simulated minus reference); heading_error ``[W, K]`` rad (signed yaw, simulated minus reference).
        reference_limit_violation, sim_limit_violation: ``[W, K]`` rad or m, largest distance of a DOF
            beyond its range.
        effort_ratio: ``[W, K]`` largest ``|drive force| / effort limit`` over DOFs in the simulation.
        feedforward_ratio: ``[W, K]`` the same for the reference's feed-forward alone.
        residual_force, residual_torque: ``[W, K]`` N and N m, norms of the reference's residual wrench.
        unsupported_force, unsupported_torque: ``[W, K]`` what the contact fit could not explain.
        reference_contact_height: ``[W, K, Bc]`` m; reference_contact_speed ``[W, K, Bc]`` m/s;
            reference_contact_force ``[W, K, Bc]`` N (fitted, vertical).
        sim_contact_force: ``[W, K, Bc]`` N, normal ground force per contact body in the simulation.
        sim_skating_speed: ``[W, K]`` m/s, largest horizontal speed of a loaded simulated contact point.
        sim_penetration: ``[W, K]`` m, deepest simulated contact point.
        assist_force, assist_torque: ``[W, K]`` N and N m, root assistance (zero when off).
        reference_root_height: ``[W, K]`` m, height of the reference root origin.
        feedforward_ratio_by_dof: ``[W, D]`` 95th percentile over each clip's frames of
            ``|feed-forward| / effort limit`` per non-root DOF.
        reference_self_penetration, sim_self_penetration: ``[W, K]`` m, deepest overlap of two links' collision
            geoms (``model.self_pair_names``; 0 where none overlap or the model has no pairs) in the
            reference and in the tracked motion; reference_self_pair, sim_self_pair: ``[W, K]`` int64, index of
            that pair in ``self_pair_names`` (-1: none). sim_self_contact_force: ``[W, K]`` N, largest
            link-to-link normal force of the step (0 unless ``self_collision`` is simulated).
        self_pair_names: ``P`` ``(geom, geom)`` names.
        simulated: ``[W, K]`` bool, frames the simulation reached (False after the clip's stop: a fall with
            ``early_stop`` or a divergence; the state then stays at the last simulated one).
        stop_step: ``[W]`` int64, last simulated step of each clip.
        fell_step: ``[W]`` int64, step at which the tracker was found fallen and stopped (-1: it did not,
            or ``early_stop`` is off).
        diverged: ``[W]`` bool, the simulation diverged (non-finite or absurd state, non-finite input)
            after ``stop_step``; the world was stopped there.
        step_count: ``[W]`` int64, simulator steps spent on each clip (its share of the cost).
        timings: seconds spent in ``setup``, ``search`` (:attr:`Controller.SAMPLING` only), ``simulation`` and
            ``metrics``.
        search_step_count: ``[W]`` int64, simulator world-steps the sampling search spent on each clip (samples
            times steps; ``None`` for the other controllers).
    """

    dt: float
    clip_names: tuple[str, ...]
    clip_step_count: np.ndarray
    settings: TrackingSettings
    total_mass: float
    body_names: tuple[str, ...]
    dof_names: tuple[str, ...]
    contact_body_names: tuple[str, ...]
    valid: np.ndarray
    body_error: np.ndarray
    body_error_mean: np.ndarray
    body_error_max: np.ndarray
    dof_error: np.ndarray
    root_error: np.ndarray
    root_horizontal_error: np.ndarray
    root_height_error: np.ndarray
    heading_error: np.ndarray
    reference_limit_violation: np.ndarray
    sim_limit_violation: np.ndarray
    effort_ratio: np.ndarray
    feedforward_ratio: np.ndarray
    residual_force: np.ndarray
    residual_torque: np.ndarray
    unsupported_force: np.ndarray
    unsupported_torque: np.ndarray
    reference_contact_height: np.ndarray
    reference_contact_speed: np.ndarray
    reference_contact_force: np.ndarray
    sim_contact_force: np.ndarray
    sim_skating_speed: np.ndarray
    sim_penetration: np.ndarray
    assist_force: np.ndarray
    assist_torque: np.ndarray
    reference_root_height: np.ndarray
    feedforward_ratio_by_dof: np.ndarray
    reference_self_penetration: np.ndarray
    reference_self_pair: np.ndarray
    sim_self_penetration: np.ndarray
    sim_self_pair: np.ndarray
    sim_self_contact_force: np.ndarray
    self_pair_names: tuple
    simulated: np.ndarray
    stop_step: np.ndarray
    fell_step: np.ndarray
    diverged: np.ndarray
    step_count: np.ndarray
    timings: dict = field(default_factory=dict)
    search_step_count: np.ndarray | None = None

    @property
    def num_clips(self) -> int:
        return len(self.clip_names)

    @property
    def nonfinite(self) -> np.ndarray:
        """``[W]`` bool, the former name of :attr:`diverged`."""
        return self.diverged

    @property
    def weight(self) -> float:
        """``m g`` in N."""
        return self.total_mass * GRAVITY


# -- gains -------------------------------------------------------------------------------------------


def _root_block(model: Model) -> torch.Tensor:
    """``[6, 6]`` composite inertia of the whole body in root coordinates at the neutral pose."""
    q0 = torch.as_tensor(model.layout.neutral(), dtype=model.dtype, device=model.device)[None]
    return mass_matrix(model, q0)[0, :6, :6]


def _axis_inertia(model: Model) -> torch.Tensor:
    """``[nv]``: inertia (kg m^2 or kg) of the whole body, rigid, about each DOF's motion axis at the
    neutral pose (root DOFs: the diagonal of the root block), plus the DOF's joint inertia."""
    q0 = torch.as_tensor(model.layout.neutral(), dtype=model.dtype, device=model.device)[None]
    mroot = mass_matrix(model, q0)[0, :6, :6] if model.layout.free_root else None
    pos, _ = link_transforms(model, q0)
    jac = link_jacobians(model, q0)[0]  # [B, 6, nv]
    nv = model.nv
    cols = jac[model.dof_body, :, torch.arange(nv, device=model.device)]  # [nv, 6]: (v_link, w)
    lin, ang = cols[:, :3], cols[:, 3:]
    if mroot is None:
        # fixed root: the whole tree moves with nothing; use the composite inertia seen by the DOF
        full = mass_matrix(model, q0)[0]
        return full.diagonal()
    o = pos[0, 0]
    ob = pos[0, model.dof_body]
    v_root = lin + torch.linalg.cross(ang, o - ob)  # velocity of the root origin for a rigid rotation
    s = torch.cat([v_root, ang], dim=-1)  # [nv, 6] in root coordinates
    inertia = torch.einsum("ni,ij,nj->n", s, mroot, s)
    return inertia + model.dof_armature


def _per_dof(model: Model, value, default: torch.Tensor, what: str) -> torch.Tensor:
    if value is None:
        return default
    nv = model.nv
    names = model.layout.dof_names
    out = default.clone()
    if isinstance(value, Mapping):
        joints = {}
        for blk in model.layout.blocks:
            if blk.qd_dim:
                joints[blk.joint_name] = list(range(blk.qd_offset, blk.qd_offset + blk.qd_dim))
        for k, v in value.items():
            idx = joints.get(k) or ([names.index(k)] if k in names else None)
            if idx is None:
                from ..errors import UnknownNameError

                raise UnknownNameError(
                    f"{what}: no joint or DOF {k!r}; names are: {', '.join(names)}", item=f"TrackingSettings.{what}"
                )
            out[idx] = float(v)
        return out
    arr = torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=model.dtype, device=model.device)
    if arr.ndim == 0:
        out[_first_joint_dof(model) :] = arr
        return out
    if tuple(arr.shape) != (nv,):
        raise ShapeError(
            f"{what} has shape {tuple(arr.shape)}; expected a scalar, [{nv}] or a name mapping",
            item=f"TrackingSettings.{what}",
        )
    return arr.clone()


def _first_joint_dof(model: Model) -> int:
    return 6 if model.layout.free_root else 0


def drive_gains(model: Model, settings: TrackingSettings = TrackingSettings()) -> tuple[torch.Tensor, torch.Tensor]:
    """Joint PD gains of :func:`track`: ``(kp [nv], kd [nv])``, N m/rad and N m s/rad (N/m, N s/m for
    slides), root DOFs 0 (or the root-assistance gains when it is on).

    ``kp_i = I_i w^2`` and ``kd_i = 2 zeta I_i w`` with ``w = 2 pi drive_frequency_hz`` and ``I_i`` the
    inertia of the whole body about DOF ``i``'s axis at the neutral pose; explicit ``drive_stiffness`` /
    ``drive_damping`` settings replace them.
    """
    inertia = _axis_inertia(model)
    w = 2.0 * math.pi * settings.drive_frequency_hz
    kp = inertia * w * w
    kd = 2.0 * settings.drive_damping_ratio * inertia * w
    j0 = _first_joint_dof(model)
    kp[:j0] = 0.0
    kd[:j0] = 0.0
    kp = _per_dof(model, settings.drive_stiffness, kp, "drive_stiffness")
    kd = _per_dof(model, settings.drive_damping, kd, "drive_damping")
    if j0 and settings.root_assist_frequency_hz > 0:
        wr = 2.0 * math.pi * settings.root_assist_frequency_hz
        diag = _root_block(model).diagonal()
        kp[:6] = diag * wr * wr
        kd[:6] = 2.0 * settings.root_assist_damping_ratio * diag * wr
        kp[2] = kp[2] * settings.root_assist_vertical_scale
        kd[2] = kd[2] * settings.root_assist_vertical_scale
        kp[:2] = kp[:2] * settings.root_assist_horizontal_scale
        kd[:2] = kd[:2] * settings.root_assist_horizontal_scale
        kp[3:6] = kp[3:6] * settings.root_assist_rotation_scale
        kd[3:6] = kd[3:6] * settings.root_assist_rotation_scale
    elif j0:
        kp[:6] = 0.0
        kd[:6] = 0.0
    return kp, kd


# -- reference preparation ---------------------------------------------------------------------------------


def _resample(layout, motion: ArticulationMotion, dt: float) -> np.ndarray:
    q = np.asarray(motion.q, dtype=np.float64)
    fps = motion.fps()
    frames = q.shape[0]
    steps = int(math.floor((frames - 1) / fps / dt + 1e-6)) + 1
    f = np.arange(steps) * dt * fps
    i0 = np.clip(np.floor(f + 1e-9).astype(np.int64), 0, frames - 2)
    a = np.clip(f - i0, 0.0, 1.0)
    return layout.interpolate(q[i0], q[i0 + 1], a)


def _extend(layout, q: np.ndarray, pad: int, fit: int) -> np.ndarray:
    """``pad`` frames before the first and after the last, continuing a least-squares quadratic fitted in
    the tangent space to the ``fit`` frames at each end (a constant-acceleration motion continues exactly),
    so that smoothing does not bend the clip's ends."""
    n = q.shape[0]
    m = min(fit, n)
    j = np.arange(m, dtype=np.float64)
    design = np.stack([j, j * j], axis=1)  # offsets from the end frame: b j + c j^2 (zero at j = 0)
    out = []
    for end in (q[:m], q[::-1][:m]):  # the start, and the end read backwards
        d = layout.difference(end, np.broadcast_to(end[0], end.shape))  # [m, nv]
        coef, *_ = np.linalg.lstsq(design, d, rcond=None)  # [2, nv]
        k = np.arange(1, pad + 1, dtype=np.float64)[:, None]
        # frames beyond the end, going outwards: j = -k
        ext = layout.integrate(np.broadcast_to(end[0], (pad, q.shape[1])), -k * coef[0] + k * k * coef[1])
        out.append(ext)
    before, after = out[0][::-1], out[1]
    return np.concatenate([before, q, after])


def _smooth(layout, q: np.ndarray, sigma_steps: float) -> np.ndarray:
    """Gaussian smoothing in the tangent space around each frame; the clip is extended beyond its ends by
    a fitted constant-acceleration motion first (:func:`_extend`)."""
    if sigma_steps <= 0 or q.shape[0] < 3:
        return q
    rad = int(math.ceil(3.0 * sigma_steps))
    off = np.arange(-rad, rad + 1)
    w = np.exp(-0.5 * (off / sigma_steps) ** 2)
    w /= w.sum()
    n = q.shape[0]
    qe = _extend(layout, q, rad, 2 * rad + 1)
    k = np.arange(n) + rad
    acc = np.zeros((n, layout.nv))
    for o, wo in zip(off, w):
        if o == 0:
            continue
        acc += wo * layout.difference(qe[k + o], q)
    return layout.integrate(q, acc)


def _contact_points(model: Model, pos: torch.Tensor, quat: torch.Tensor) -> torch.Tensor:
    """``[n, C, 3]`` world position of the lowest point of every contact sphere."""
    pb = model.contact_point_body
    centre = pos[:, pb] + R.quat_rotate(quat[:, pb], model.contact_point_local.expand(pos.shape[0], -1, -1))
    return centre - torch.stack(
        [torch.zeros_like(model.contact_radius), torch.zeros_like(model.contact_radius), model.contact_radius], -1
    )


def _body_wrenches(model: Model, pos: torch.Tensor, points: torch.Tensor, body: torch.Tensor, force: torch.Tensor):
    """``[n, B, 6]`` (force, moment about the link origin) of point forces ``force [n, P, 3]`` at
    ``points [n, P, 3]`` on bodies ``body [n, P]``."""
    n = force.shape[0]
    lever = points - torch.gather(pos, 1, body[..., None].expand(-1, -1, 3))
    wrench = torch.cat([force, torch.linalg.cross(lever, force)], dim=-1)
    out = torch.zeros(n, model.num_bodies, 6, dtype=force.dtype, device=force.device)
    return out.scatter_add_(1, body[..., None].expand(-1, -1, 6), wrench)


def _generalized(jac: torch.Tensor, wrench: torch.Tensor) -> torch.Tensor:
    """``sum_b J_b^T w_b``: ``jac [n, B, 6, nv]``, ``wrench [n, B, 6]`` -> ``[n, nv]``."""
    return torch.einsum("nbiv,nbi->nv", jac, wrench)


def _effort_weights(model: Model, j0: int) -> torch.Tensor:
    """``[nv - j0]`` 1/N m (1/N for slides): the inverse effort limit of each joint DOF; a DOF without a
    (finite, positive) limit gets the median weight of those with one (a typical actuator: neither free nor
    precious), and on a model with no limit at all every DOF gets ``1 / (m g 1 m)``."""
    limit = model.dof_effort_limit[j0:]
    finite = torch.isfinite(limit) & (limit > 0)
    weight = torch.where(finite, 1.0 / torch.where(finite, limit, torch.ones_like(limit)), torch.zeros_like(limit))
    neutral = weight[finite].median() if bool(finite.any()) else 1.0 / (model.total_mass * GRAVITY)
    return torch.where(finite, weight, torch.full_like(weight, float(neutral)))


def _fit_effort(model, settings, cones, a, lam, joints):
    """The second stage of :func:`_fit_contacts`: among the cone forces that explain the wrench ``A lam0`` the
    first stage explained, those that minimise ``sum_j ((tau_j - (G lam)_j) / limit_j)^2 + eps ||lam||^2``
    (the equality held by an augmented Lagrangian with penalty ``fit_effort_penalty``: ``fit_effort_rounds``
    rounds of ``fit_effort_iterations`` active-set steps, warm started from ``lam0``; float64 inside).

    Args:
        cones: ``(points [n, k, 3], index [n, k], edges [n, k, 4, 3], active [n, k])``; a ``[n, 6, 4k]`` root
            rows; lam ``[n, 4k]`` the first stage (units of ``m g``); joints as in :func:`_fit_contacts`.
    Returns:
        ``[n, 4k]`` edge magnitudes, units of ``m g``.
    """
    p, idx, d, active = cones
    pos, jac, tau = joints
    n, k = idx.shape
    mg = model.total_mass * GRAVITY
    j0 = _first_joint_dof(model)
    body = model.contact_point_body[idx]  # [n, k]
    lever = p - torch.gather(pos, 1, body[..., None].expand(-1, -1, 3))
    edge = torch.cat([d, torch.linalg.cross(lever[:, :, None].expand_as(d), d)], -1)  # [n, k, 4, 6]
    jb = torch.gather(jac, 1, body[..., None, None].expand(-1, -1, 6, jac.shape[-1]))[..., j0:]
    w = _effort_weights(model, j0)  # [nj]
    g = torch.einsum("nkiv,nkei->nvke", jb, edge * active[..., None, None]).reshape(n, -1, 4 * k)
    g = g * (w * mg)[:, None]  # [n, nj, 4k]: weighted joint torque per unit of m g on each edge
    f64 = torch.float64
    g, a, lam = g.to(f64), a.to(f64), lam.to(f64)
    gt, at = g.transpose(1, 2), a.transpose(1, 2)
    goal = (a @ lam[..., None])[..., 0]  # [n, 6] the wrench the first stage explains, units of m g
    rho = settings.fit_effort_penalty
    m = 4 * k
    hess = gt @ g + rho * (at @ a) + settings.fit_effort_ridge * torch.eye(m, dtype=f64, device=g.device)
    base = (gt @ (tau[:, j0:].to(f64) * w.to(f64))[..., None])[..., 0]
    mult = torch.zeros_like(goal)
    for _ in range(settings.fit_effort_rounds):
        rhs = base + (at @ (rho * goal - mult)[..., None])[..., 0]
        lam = _active_set_qp(hess, rhs, lam, settings.fit_effort_iterations)
        mult = mult + rho * ((a @ lam[..., None])[..., 0] - goal)
    return lam.to(p.dtype)


def _active_set_qp(hess, rhs, x, iterations):
    """``argmin_{x >= 0} 1/2 x^T H x - b^T x`` by a primal active-set method, batched over rows: each
    iteration solves the equality problem on the free variables (those above 0, and those at 0 whose gradient
    and Newton step both point up) and moves towards its solution until the first free variable reaches 0. A
    row stops moving once it is at the optimum of its free set with no variable to release (the KKT point).

    Args:
        hess: ``[n, m, m]`` symmetric positive definite; rhs ``[n, m]``; x ``[n, m]`` start (>= 0).
    Returns:
        ``[n, m]``.
    """
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)

    def newton(free):
        reduced = hess * free[:, :, None] * free[:, None, :] + eye * (1.0 - free)[:, None, :]
        return -torch.linalg.solve(reduced, grad * free)

    for _ in range(iterations):
        grad = (hess @ x[..., None])[..., 0] - rhs
        at_zero = x <= 0.0
        free = (~at_zero | (grad < 0.0)).to(x.dtype)
        step = newton(free)
        free = free * ~(at_zero & (step < 0.0))  # a released variable the step would push down stays at 0
        step = newton(free)
        down = (step < 0.0) & ~at_zero
        ratio = torch.where(down, x / (-step).clamp(min=1e-300), torch.full_like(x, math.inf))
        alpha = ratio.amin(-1).clamp(max=1.0)
        blocking = down & (ratio <= alpha[:, None])  # lands exactly on its bound (else it creeps there forever)
        x = torch.where(blocking, torch.zeros_like(x), torch.clamp(x + alpha[:, None] * step, min=0.0))
    return x


def _fit_contacts(model, settings, points, origin, wrench, joints=None):
    """Contact forces on linearised friction cones that explain the residual wrench, distributed where the
    joints' torques are cheapest (see the module docstring, item 3).

    Two stages over the cone-edge magnitudes ``lam >= 0``, batched over frames. First the minimum-norm
    non-negative least squares of the root rows, ``||A lam - w||^2 + eps ||lam||^2`` (``fit_iterations``
    accelerated projected-gradient steps). Then (``fit_effort`` and ``joints`` given, :func:`_fit_effort`),
    among the forces that explain the same wrench ``A lam``, those that minimise
    ``sum_j ((tau_j - (G lam)_j) / limit_j)^2``, where ``G`` holds each edge's generalised force at its point
    (``J_b(p)^T d``) and ``tau`` the joints' inverse dynamics; a frame keeps them only where they explain the
    root's wrench as well (its force and its torque each to ``1e-4 m g``, resp. ``1e-4 m g`` x 1 m), so the
    unsupported wrench is never larger than the first stage's.

    Args:
        points: ``[n, C, 3]`` contact points (world); origin ``[n, 3]`` root origin; wrench ``[n, 6]``.
        joints: ``None`` (no effort weighting) or ``(pos [n, B, 3] link origins, jac [n, B, 6, nv] link
            Jacobians, tau [n, nv] joint torques without contact, N m)``.
    Returns:
        ``(forces [n, k, 3] N world, index [n, k] contact point, explained [n, 6], points [n, k, 3])``.
    """
    n, c, _ = points.shape
    k = min(settings.fit_points, c)
    height = points[..., 2] - model.contact.ground_height
    neg, idx = torch.topk(-height, k, dim=1)
    active = (-neg < settings.contact_height).to(points.dtype)  # [n, k]
    p = torch.gather(points, 1, idx[..., None].expand(-1, -1, 3))
    r = p - origin[:, None]
    if settings.friction is not None:
        mu = torch.full_like(height[:, :k], float(settings.friction))
    else:
        mu = model.contact_friction[idx]
    mu = mu * settings.friction_margin
    ang = torch.arange(4, dtype=points.dtype, device=points.device) * (math.pi / 2)
    cs = torch.stack([torch.cos(ang), torch.sin(ang), torch.zeros_like(ang)], -1)  # [4, 3]
    ez = torch.tensor([0.0, 0.0, 1.0], dtype=points.dtype, device=points.device)
    d = ez + mu[..., None, None] * cs  # [n, k, 4, 3]
    tq = torch.linalg.cross(r[:, :, None].expand_as(d), d)
    a = torch.cat([d, tq], dim=-1) * active[..., None, None]  # [n, k, 4, 6]
    a = a.reshape(n, 4 * k, 6).transpose(1, 2)  # [n, 6, 4k]
    at = a.transpose(1, 2)
    lip = torch.linalg.eigvalsh(a @ at)[:, -1]
    eps = 1e-4 * lip + 1e-9
    step = 1.0 / (lip + eps)
    lam = torch.zeros(n, 4 * k, dtype=points.dtype, device=points.device)
    y = lam
    t = 1.0
    for _ in range(settings.fit_iterations):
        g = (at @ ((a @ y[..., None])[..., 0] - wrench)[..., None])[..., 0] + eps[:, None] * y
        new = torch.clamp(y - step[:, None] * g, min=0.0)
        t1 = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        y = new + ((t - 1.0) / t1) * (new - lam)
        lam, t = new, t1
    if joints is not None and settings.fit_effort:
        # the root's wrench first: a frame keeps the effort-weighted forces only where they explain it as well
        # (to 1e-4 m g) as the minimum-norm ones
        mg = model.total_mass * GRAVITY
        # only frames whose loaded points lie on two bodies or more have a split to choose: on one body the root's
        # wrench fixes every joint torque
        body = model.contact_point_body[idx]
        first = torch.where(active > 0, body, torch.full_like(body, -1)).amax(-1, keepdim=True)
        split = ((active > 0) & (body != first)).any(-1).nonzero().flatten()
        weighted = lam.clone()
        if split.numel():
            pos, jac, tau = joints
            cones = (p[split], idx[split], d[split], active[split])
            sub = _fit_effort(model, settings, cones, a[split], lam[split] / mg, (pos[split], jac[split], tau[split]))
            weighted[split] = sub * mg

        def miss(x):  # [n, 2] unexplained force (N) and torque (N m)
            r = (a @ x[..., None])[..., 0] - wrench
            return torch.stack(
                [torch.linalg.vector_norm(r[:, :3], dim=-1), torch.linalg.vector_norm(r[:, 3:], dim=-1)], -1
            )

        keep = (miss(weighted) <= miss(lam) + 1e-4 * mg).all(-1)
        lam = torch.where(keep[:, None], weighted, lam)
    forces = (lam.reshape(n, k, 4, 1) * d).sum(2)  # [n, k, 3]
    explained = (a @ lam[..., None])[..., 0]
    return forces, idx, explained, p


def _slowest_support_speed(vel: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """Slowest horizontal speed of a rigid body's material points in the convex hull of its points ``on`` the
    ground: a foot that turns about a point of its sole pivots there, it does not slide.

    A rigid body's horizontal velocity is affine in the point, so the slowest point of the hull of the points is
    the point of the hull of their velocities closest to zero: ``0`` when zero lies inside it (its velocities
    leave no angular gap of ``pi`` or more), else the nearest vertex or segment.

    Args:
        vel: ``[N, P, 2]`` m/s, horizontal velocity of the body's material point under each contact point.
        on: ``[N, P]`` bool, the points near the ground.
    Returns:
        ``[N]`` m/s; ``inf`` where no point is on the ground.
    """
    n, p, _ = vel.shape
    norm = torch.linalg.vector_norm(vel, dim=-1)
    best = torch.where(on, norm, torch.full_like(norm, math.inf)).amin(-1)
    i, j = torch.triu_indices(p, p, 1, device=vel.device)
    a, d = vel[:, i], vel[:, j] - vel[:, i]  # [N, pairs, 2]
    t = (-(a * d).sum(-1) / (d * d).sum(-1).clamp(min=1e-12)).clamp(0.0, 1.0)
    seg = torch.linalg.vector_norm(a + t[..., None] * d, dim=-1)
    best = torch.minimum(best, torch.where(on[:, i] & on[:, j], seg, torch.full_like(seg, math.inf)).amin(-1))
    # zero inside the hull: the sorted directions of the points on the ground leave no gap of pi
    ang = torch.where(on, torch.atan2(vel[..., 1], vel[..., 0]), torch.full_like(norm, math.inf))
    ang, _ = ang.sort(-1)
    m = on.sum(-1)
    last = torch.gather(ang, 1, (m - 1).clamp(min=0)[:, None])[:, 0]
    steps = ang[:, 1:] - ang[:, :-1]
    valid = torch.arange(1, p, device=vel.device)[None] < m[:, None]
    gap = torch.where(valid, steps, torch.zeros_like(steps)).amax(-1)
    gap = torch.maximum(gap, ang[:, 0] + 2.0 * math.pi - last)
    return torch.where((m >= 3) & (gap < math.pi), torch.zeros_like(best), best)


def _contact_bodies(model: Model) -> torch.Tensor:
    return torch.unique(model.contact_point_body)


def prepare_reference(
    model: Model, motions: Sequence[ArticulationMotion], settings: TrackingSettings = TrackingSettings()
) -> TrackingReference:
    """Resample, smooth and differentiate every clip on the simulator grid and compute its feed-forward
    torques, residual and unsupported wrenches and reference contact quantities (see the module
    docstring), batched over all frames of all clips.

    Raises:
        LayoutMismatch: a motion belongs to another layout. MotionError: a clip shorter than one step.
    """
    layout = model.layout
    dev, dt_ = model.device, model.dtype
    dt = settings.dt
    q_trk, q_raw, v_all, a_all, starts, counts = [], [], [], [], [], []
    start = 0
    for i, m in enumerate(motions):
        m.check_layout(layout, what=f"motion {i}")
        if m.num_frames < 2 or m.duration < dt:
            raise MotionError(
                f"clip {i} lasts {m.duration:.4g} s ({m.num_frames} frames); expected at least one step of {dt:.4g} s",
                item=f"motion {i}",
            )
        raw = _resample(layout, m, dt)
        q = _smooth(layout, raw, settings.smoothing_s / dt)
        v = np.zeros((q.shape[0], layout.nv))
        v[1:] = layout.difference(q[1:], q[:-1], dt)
        v[0] = 2.0 * v[1] - v[2] if q.shape[0] > 2 else v[1]  # extrapolated: the first step's a equals the next
        acc = np.zeros_like(v)
        acc[:-1] = (v[1:] - v[:-1]) / dt
        acc[-1] = acc[-2]
        q_trk.append(q)
        q_raw.append(raw)
        v_all.append(v)
        a_all.append(acc)
        starts.append(start)
        counts.append(q.shape[0])
        start += q.shape[0]

    def cat(x):
        return torch.as_tensor(np.concatenate(x), dtype=dt_, device=dev)

    Q, QR, V, A = cat(q_trk), cat(q_raw), cat(v_all), cat(a_all)
    n_total = Q.shape[0]
    nv = model.nv
    cbodies = _contact_bodies(model)
    bc = int(cbodies.shape[0])
    body_slot = torch.full((model.num_bodies,), -1, dtype=torch.int64, device=dev)
    body_slot[cbodies] = torch.arange(bc, device=dev)
    point_slot = body_slot[model.contact_point_body]  # [C]

    ff = torch.zeros(n_total, nv, dtype=dt_, device=dev)
    resid = torch.zeros(n_total, 6, dtype=dt_, device=dev)
    unsup = torch.zeros(n_total, 6, dtype=dt_, device=dev)
    cforce = torch.zeros(n_total, bc, dtype=dt_, device=dev)
    cheight = torch.zeros(n_total, bc, dtype=dt_, device=dev)
    body_pos = torch.zeros(n_total, model.num_bodies, 3, dtype=dt_, device=dev)
    raw_points = torch.zeros(n_total, model.num_contact_points, 3, dtype=dt_, device=dev)
    raw_quat = torch.zeros(n_total, model.num_bodies, 4, dtype=dt_, device=dev)
    free = model.layout.free_root
    j0 = _first_joint_dof(model)
    scalar = model.dof_is_scalar.to(dt_)
    chunk = max(int(settings.chunk_frames), 1)
    for s in range(0, n_total, chunk):
        e = min(s + chunk, n_total)
        q, v, a = Q[s:e], V[s:e], A[s:e]
        tau = inverse_dynamics(model, q, v, a)
        # passive joint forces the drives must overcome: springs and dampers of the model
        qs = q[:, model.dof_q_index] * scalar
        tau_p = model.dof_damping * v + model.dof_spring_stiffness * (qs - model.dof_spring_ref) * scalar
        if free:
            resid[s:e] = tau[:, :6]
        pos, quat = link_transforms(model, q)
        if model.num_contact_points:
            pts = _contact_points(model, pos, quat)
            if free and settings.feedforward is FeedForward.CONTACT:
                jac = link_jacobians(model, q)
                joints = (pos, jac, tau + tau_p)
                forces, idx, explained, p = _fit_contacts(model, settings, pts, pos[:, 0], tau[:, :6], joints)
                unsup[s:e] = tau[:, :6] - explained
                pbody = model.contact_point_body[idx]
                tau = tau - _generalized(jac, _body_wrenches(model, pos, p, pbody, forces))
                cforce[s:e].scatter_add_(1, point_slot[idx], forces[..., 2])
            elif free:
                unsup[s:e] = tau[:, :6]
            rpos, rquat = link_transforms(model, QR[s:e])
            raw_points[s:e] = _contact_points(model, rpos, rquat)
            raw_quat[s:e] = rquat
            body_pos[s:e] = rpos
        else:
            body_pos[s:e], _ = link_transforms(model, QR[s:e])
            if free:
                unsup[s:e] = tau[:, :6]
        if settings.feedforward is FeedForward.NONE:
            tau = torch.zeros_like(tau)
        tau = tau + tau_p
        tau[:, :j0] = 0.0
        ff[s:e] = tau

    # reference contact heights and horizontal speeds (unsmoothed), per contact body
    st = torch.as_tensor(starts, dtype=torch.int64, device=dev)
    ct = torch.as_tensor(counts, dtype=torch.int64, device=dev)
    cspeed = torch.zeros(n_total, bc, dtype=dt_, device=dev)
    if model.num_contact_points:
        clip_of = torch.repeat_interleave(torch.arange(len(counts), device=dev), ct)
        row = torch.arange(n_total, device=dev)
        lo, hi = st[clip_of], st[clip_of] + ct[clip_of] - 1
        nxt, prv = torch.minimum(row + 1, hi), torch.maximum(row - 1, lo)
        span = ((nxt - prv).clamp(min=1) * dt).to(dt_)
        # slip, not rolling: the velocity of the body's material point under each contact point (the lowest
        # point of a rolling sphere moves while the material point touching the ground stands still)
        pb = model.contact_point_body
        local = R.quat_rotate_inverse(raw_quat[:, pb], raw_points - body_pos[:, pb])  # [N, C, 3] body frame

        def material(rows):
            return body_pos[rows][:, pb] + R.quat_rotate(raw_quat[rows][:, pb], local)

        vel = (material(nxt)[..., :2] - material(prv)[..., :2]) / span[:, None, None]
        speed = torch.linalg.vector_norm(vel, dim=-1)
        h = raw_points[..., 2] - model.contact.ground_height
        # per body: its lowest point, and the slowest material point of the part of its sole on the ground
        big = torch.full((n_total, bc, model.num_contact_points), math.inf, dtype=dt_, device=dev)
        mask = point_slot[None, :] == torch.arange(bc, device=dev)[:, None]  # [Bc, C]
        big = torch.where(mask[None], h[:, None, :], big)
        cheight, arg = big.min(-1)
        cspeed = torch.gather(speed, 1, arg)
        near = h < settings.contact_height
        for b in range(bc):
            pts = torch.nonzero(mask[b]).flatten()
            if pts.numel() > 1:
                cspeed[:, b] = torch.minimum(cspeed[:, b], _slowest_support_speed(vel[:, pts], near[:, pts]))
    return TrackingReference(
        dt=dt,
        clip_step_start=st,
        clip_step_count=ct,
        q=Q,
        qd=V,
        qdd=A,
        q_raw=QR,
        feedforward=ff,
        residual_wrench=resid,
        unsupported_wrench=unsup,
        contact_force=cforce,
        contact_height=cheight,
        contact_speed=cspeed,
        body_pos=body_pos,
        contact_bodies=cbodies,
    )


# -- tracking ---------------------------------------------------------------------------------------------


def _root_error(q_ref: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``[W, 6]``: (position error, rotation vector of ref * sim^-1), world frame."""
    dp = q_ref[:, :3] - q[:, :3]
    rel = R.quat_multiply(q_ref[:, 3:7], R.quat_conjugate(q[:, 3:7]))
    return torch.cat([dp, R.quat_to_rotvec(rel)], dim=-1)


def _yaw(quat: torch.Tensor) -> torch.Tensor:
    fwd = R.quat_rotate(
        quat, torch.tensor([1.0, 0.0, 0.0], dtype=quat.dtype, device=quat.device).expand_as(quat[..., 1:])
    )
    return torch.atan2(fwd[..., 1], fwd[..., 0])


def track(
    model: Model,
    motions: ArticulationMotion | Sequence[ArticulationMotion],
    *,
    settings: TrackingSettings = TrackingSettings(),
    names: Sequence[str] | None = None,
    reference: TrackingReference | None = None,
    num_worlds: int | None = None,
) -> TrackingResult:
    """Simulate every clip in its own world, tracking it, and measure per-frame metrics.

    Worlds are slots: ``num_worlds`` of them step together and each takes the next waiting clip (in the
    order given) when its clip ends, its tracker falls (``settings.early_stop``: the fall rule of
    :class:`~kangengine.sim.ValidationThresholds` with the settings' ``fall_body_error`` and
    ``fall_root_height_ratio``) or its simulation diverges (a non-finite state or input, a speed above
    ``divergence_speed``, a coordinate beyond ``divergence_distance``). A slot with no clip left to take
    is dropped from the batch, so a fallen or finished clip costs no more steps. Each world's result
    does not depend on which clips share its batch: the linear solver is fixed for the whole run.

    Args:
        model: the simulator :class:`~kangengine.sim.Model` (its device and dtype are used; its own drive
            gains are replaced by :func:`drive_gains`).
        motions: one or more :class:`~kangengine.animation.ArticulationMotion` of ``model.layout`` (any
            lengths and fps).
        settings: :class:`TrackingSettings`.
        names: clip names for the result (default ``clip_0``, ...).
        reference: a :func:`prepare_reference` result for these motions and settings (computed when omitted).
        num_worlds: worlds simulated together (default: one per clip, all at once).
    Returns:
        :class:`TrackingResult`; ``simulated``, ``stop_step``, ``fell_step``, ``diverged`` and
        ``step_count`` say what was simulated of each clip.
    Raises:
        LayoutMismatch, MotionError: see :func:`prepare_reference`.
    """
    if isinstance(motions, ArticulationMotion):
        motions = [motions]
    motions = list(motions)
    if not motions:
        raise MotionError("no clips to track; expected at least one ArticulationMotion", item="motions")
    names = tuple(names) if names is not None else tuple(f"clip_{i}" for i in range(len(motions)))
    if len(names) != len(motions):
        raise ShapeError(f"{len(names)} names for {len(motions)} clips", item="names")
    if num_worlds is not None and not int(num_worlds) >= 1:
        raise ShapeError(f"num_worlds is {num_worlds}; expected at least 1", item="num_worlds")
    before = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        return _track(model, motions, settings, names, reference, num_worlds)
    finally:
        torch.set_num_threads(before)


def tracking_simulator(model: Model, settings: TrackingSettings, slots: int) -> Simulator:
    """The simulator ``track`` steps: effort limits lifted unless ``settings.clamp_effort``, link-to-link
    contact as ``settings.self_collision`` says, the step's settings from ``settings`` and the linear solver
    fixed for ``slots`` worlds (a world's result must not depend on the batch's size; the sampling search
    builds its batches with it too)."""
    sim_model = (
        model
        if settings.clamp_effort
        else replace(model, dof_effort_limit=torch.full_like(model.dof_effort_limit, math.inf))
    )
    if sim_model.contact.self_collision != settings.self_collision:
        sim_model = replace(sim_model, contact=replace(sim_model.contact, self_collision=settings.self_collision))
    sim = Simulator(
        sim_model,
        dt=settings.dt,
        iterations=settings.iterations,
        check_inputs=False,
        divergence_speed=settings.divergence_speed,
        divergence_distance=settings.divergence_distance,
    )
    sim.solver = sim.solver_for(slots)
    return sim


def _track(model, motions, settings, names, reference, num_worlds) -> TrackingResult:
    t0 = time.perf_counter()
    ref = reference if reference is not None else prepare_reference(model, motions, settings)
    w = ref.num_clips
    slots = w if num_worlds is None else min(int(num_worlds), w)
    if settings.self_collision and model.num_self_pairs == 0:
        raise ShapeError(
            f"{model.name}: TrackingSettings.self_collision needs a model with link-to-link pairs; build it with "
            "Model.from_desc(..., contact=ContactParams(self_collision=True)) (this one has none)",
            item="TrackingSettings.self_collision",
        )
    sim = tracking_simulator(model, settings, slots)
    t_setup = time.perf_counter() - t0
    timings, search_steps = {"setup": t_setup}, None
    if settings.controller is Controller.SAMPLING and model.layout.free_root and ref.target_offset is None:
        from .sampling import sample_target_offsets  # the search builds on this module's step command

        t1 = time.perf_counter()
        plan = sample_target_offsets(model, ref, settings, sim)
        ref = replace(ref, target_offset=plan.target_offset)
        search_steps = plan.env_step_count.cpu().numpy()
        timings["search"] = time.perf_counter() - t1
    logs = _Logs.zeros(model, ref)
    t1 = time.perf_counter()
    _simulate(model, ref, settings, sim, logs, slots)
    timings["simulation"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    result = _metrics(model, ref, names, settings, logs)
    timings["metrics"] = time.perf_counter() - t2
    return replace(result, timings=timings, search_step_count=search_steps)


@dataclass(eq=False)
class _Logs:
    """Per-step records of every clip, ``[K, W, ...]`` (step of the clip, clip), written by :func:`_simulate`."""

    q: torch.Tensor  # [K, W, nq]
    effort: torch.Tensor  # [K, W]
    assist: torch.Tensor  # [K, W, 2]
    contact_force: torch.Tensor  # [K, W, Bc]
    skating: torch.Tensor  # [K, W]
    penetration: torch.Tensor  # [K, W]
    self_force: torch.Tensor  # [K, W] largest link-to-link normal force
    stop_step: torch.Tensor  # [W] last simulated step
    fell_step: torch.Tensor  # [W] -1: no fall detected
    diverged: torch.Tensor  # [W] bool
    step_count: torch.Tensor  # [W] simulator steps spent on the clip

    @classmethod
    def zeros(cls, model: Model, ref: TrackingReference) -> _Logs:
        dev, dt_ = model.device, model.dtype
        w, k = ref.num_clips, int(ref.clip_step_count.max())
        bc = int(ref.contact_bodies.shape[0])
        z = lambda *s: torch.zeros(*s, dtype=dt_, device=dev)  # noqa: E731
        zi = lambda: torch.zeros(w, dtype=torch.int64, device=dev)  # noqa: E731
        q = z(k, w, model.nq)
        q[0] = ref.q[ref.clip_step_start]
        return cls(
            q=q,
            effort=z(k, w),
            assist=z(k, w, 2),
            contact_force=z(k, w, bc),
            skating=z(k, w),
            penetration=z(k, w),
            self_force=z(k, w),
            stop_step=zi(),
            fell_step=zi() - 1,
            diverged=torch.zeros(w, dtype=torch.bool, device=dev),
            step_count=zi(),
        )


@dataclass(eq=False)
class _Slots:
    """The worlds stepping now (``S`` rows): which clip each runs, at which of its steps, and what a step
    carries over to the next (contact forces and points of the last step)."""

    clip: torch.Tensor  # [S] int64
    k: torch.Tensor  # [S] int64, step of the clip the state is at
    state: State
    prev_normal: torch.Tensor  # [S, C]
    prev_pos: torch.Tensor  # [S, C, 3]

    @classmethod
    def start(cls, model: Model, ref: TrackingReference, clips: torch.Tensor) -> _Slots:
        rows = ref.clip_step_start[clips]
        n, c = clips.shape[0], model.num_contact_points
        return cls(
            clip=clips,
            k=torch.zeros_like(clips),
            state=_with_budget(State.from_q(model, ref.q[rows], ref.qd[rows])),
            prev_normal=torch.zeros(n, c, dtype=model.dtype, device=model.device),
            prev_pos=torch.zeros(n, c, 3, dtype=model.dtype, device=model.device),
        )

    def take(self, keep: torch.Tensor) -> _Slots:
        """The rows ``keep`` ([S'] int64), in that order."""
        st = self.state
        return _Slots(
            clip=self.clip[keep],
            k=self.k[keep],
            state=State(q=st.q[keep], qd=st.qd[keep], frozen=st.frozen[keep], energy_budget=st.energy_budget[keep]),
            prev_normal=self.prev_normal[keep],
            prev_pos=self.prev_pos[keep],
        )

    @staticmethod
    def cat(a: _Slots, b: _Slots) -> _Slots:
        sa, sb = a.state, b.state
        state = State(
            q=torch.cat([sa.q, sb.q]),
            qd=torch.cat([sa.qd, sb.qd]),
            frozen=torch.cat([sa.frozen, sb.frozen]),
            energy_budget=torch.cat([sa.energy_budget, sb.energy_budget]),
        )
        return _Slots(
            clip=torch.cat([a.clip, b.clip]),
            k=torch.cat([a.k, b.k]),
            state=state,
            prev_normal=torch.cat([a.prev_normal, b.prev_normal]),
            prev_pos=torch.cat([a.prev_pos, b.prev_pos]),
        )


def _with_budget(state: State) -> State:
    """``state`` with an ``energy_budget [W]`` (NaN where it has none: the step then leaves that world's
    energy uncorrected), so that slots with and without a budget can be concatenated."""
    if state.energy_budget is not None:
        return state
    nan = torch.full((state.num_worlds,), math.nan, dtype=state.q.dtype, device=state.q.device)
    return replace(state, energy_budget=nan)


def _budget(state: State, n: int) -> torch.Tensor | None:
    """The first ``n`` worlds' energy budgets (``None`` without energy correction)."""
    return None if state.energy_budget is None else state.energy_budget[:n]


def _fallen(model: Model, ref: TrackingReference, settings: TrackingSettings, pos: torch.Tensor, rows: torch.Tensor):
    """``[S]`` bool: the fall rule of the verdict at the current states (link origins ``pos [S, B, 3]``)
    against reference rows ``rows``: mean body error over ``fall_body_error``, or the root below
    ``fall_root_height_ratio`` of the reference root's height above the ground."""
    ref_pos = ref.body_pos[rows]
    err = torch.linalg.vector_norm(pos - ref_pos, dim=-1).mean(-1)
    ground = model.contact.ground_height
    low = (pos[:, 0, 2] - ground) < settings.fall_root_height_ratio * (ref_pos[:, 0, 2] - ground)
    return (err > settings.fall_body_error) | low


def _pad_index(n: int, multiple: int, device) -> torch.Tensor:
    """``[P]`` rows ``0 .. n-1`` then copies of row 0, ``P`` the next multiple of ``multiple``."""
    idx = torch.arange(-(-n // multiple) * multiple, device=device)
    return torch.where(idx < n, idx, torch.zeros_like(idx))


def _simulate(model, ref, settings, sim, logs: _Logs, slots: int) -> None:
    """Step the clips of ``ref`` through ``slots`` worlds, writing ``logs`` (see :func:`track`).

    Per step, one reference row per world is gathered by index and the logs are written by index: no
    Python loop over worlds. A world that finished, fell or diverged is replaced by the next waiting clip
    or dropped; that bookkeeping reads one boolean per step from the device.

    With ``settings.batch_invariant`` the batch is padded to a multiple of :data:`_BATCH_MULTIPLE` worlds
    (copies of the first, discarded): torch's CPU kernels run the last ``W mod 2 x SIMD width`` entries of a
    row through a scalar loop whose rounding differs in the last bit, so without padding a world's result
    depends on how many worlds share its batch (and chaos makes that bit visible in the report)."""
    dev = model.device
    free = model.layout.free_root
    j0 = _first_joint_dof(model)
    use_wbc = free and settings.controller is Controller.WHOLE_BODY
    implicit = _Implicit(model, settings, sim) if free and settings.controller is Controller.IMPLICIT else None
    if implicit is not None:
        kp, kd = implicit_gains(model, settings)
    balance = uses_balance(model, settings)
    counts, starts = ref.clip_step_count, ref.clip_step_start
    kp, kd = drive_gains(model, settings)
    wbc = None
    if use_wbc:
        wbc = _WholeBody(model, ref, settings)
        kp, kd = kp.clone(), kd.clone()
        kp[6:], kd[6:] = kp[6:] * settings.wbc_drive_scale, kd[6:] * settings.wbc_drive_scale
    bc = int(ref.contact_bodies.shape[0])
    body_slot = torch.full((model.num_bodies,), -1, dtype=torch.int64, device=dev)
    body_slot[ref.contact_bodies] = torch.arange(bc, device=dev)
    point_slot = body_slot[model.contact_point_body]
    effort = model.dof_effort_limit
    w = ref.num_clips
    multiple = _BATCH_MULTIPLE if settings.batch_invariant else 1
    cur = _Slots.start(model, ref, torch.arange(slots, device=dev))
    waiting = slots  # next clip to start
    while cur.clip.numel():
        n = cur.clip.shape[0]
        run = cur.take(_pad_index(n, multiple, dev)) if multiple > 1 else cur
        st = starts[run.clip]
        ci = st + run.k
        pos = quat = None
        if balance or settings.early_stop:
            pos, quat = link_transforms(model, run.state.q)
        # -- which worlds stop before this step ------------------------------------------------------------
        diverged = cur.state.frozen
        ended = cur.k >= counts[cur.clip] - 1
        fell = torch.zeros_like(ended)
        if settings.early_stop:
            fell = _fallen(model, ref, settings, pos[:n], ci[:n]) & ~diverged
        stop = diverged | ended | fell
        if bool(stop.any()):
            done = torch.nonzero(stop)[:, 0]
            clips = cur.clip[done]
            # a diverged world's state at k is its frozen state at k - 1: simulated up to k - 1
            logs.stop_step[clips] = cur.k[done] - diverged[done].to(torch.int64)
            logs.diverged[clips] = diverged[done]
            logs.fell_step[clips] = torch.where(fell[done], cur.k[done], -1)
            new = torch.arange(waiting, min(waiting + done.numel(), w), device=dev)
            waiting += int(new.numel())
            cur = cur.take(torch.nonzero(~stop)[:, 0])
            if new.numel():
                cur = _Slots.cat(cur, _Slots.start(model, ref, new))
            continue
        ni = st + torch.minimum(run.k + 1, counts[run.clip] - 1)
        state = run.state
        m = run.clip.shape[0]
        if wbc is not None:
            q_tgt, qd_tgt, tau_ff = wbc.command(state, ci, ni)
            ctrl = Control(
                q_target=q_tgt,
                qd_target=qd_tgt,
                tau_feedforward=tau_ff,
                drive_stiffness=kp.expand(m, -1),
                drive_damping=kd.expand(m, -1),
            )
        else:
            offset = ref.target_offset[ci] if ref.target_offset is not None else None
            ctrl = pd_control(
                model, ref, settings, state, ci, ni, run.prev_normal, (pos, quat), (kp, kd), balance, offset
            )
        if implicit is not None:
            ctrl = implicit.refine(state, ctrl, ref, ci, ni)
        out = sim.step(state, ctrl)
        k1 = cur.k + 1
        at = (k1, cur.clip)
        new_state = _with_budget(
            State(
                q=out.state.q[:n], qd=out.state.qd[:n], frozen=out.state.frozen[:n], energy_budget=_budget(out.state, n)
            )
        )
        logs.q.index_put_(at, new_state.q)
        logs.step_count.index_add_(0, cur.clip, torch.ones_like(cur.clip))
        drive = out.drive_force[:n]
        if model.nv > j0:
            logs.effort.index_put_(at, (drive[:, j0:].abs() / effort[j0:]).amax(-1))
        if free:
            assist = torch.stack(
                [torch.linalg.vector_norm(drive[:, :3], dim=-1), torch.linalg.vector_norm(drive[:, 3:6], dim=-1)], -1
            )
            logs.assist.index_put_(at, assist)
        if out.self_contact_force is not None and out.self_contact_force.shape[-1]:
            logs.self_force.index_put_(at, out.self_contact_force[:n].amax(-1))
        prev_normal, prev_pos = cur.prev_normal, cur.prev_pos
        if model.num_contact_points:
            normal = out.contact_normal_force[:n]
            cf = torch.zeros(n, bc, dtype=model.dtype, device=dev).index_add_(1, point_slot, normal)
            logs.contact_force.index_put_(at, cf)
            logs.penetration.index_put_(at, out.contact_depth[:n].amax(-1).clamp(min=0.0))
            pos_c = out.contact_position[:n]
            # speed between the contact points of the last two states (none at a clip's first step)
            sp = torch.linalg.vector_norm(pos_c[..., :2] - prev_pos[..., :2], dim=-1) / settings.dt
            skate = torch.where(normal > 1.0, sp, torch.zeros_like(sp)).amax(-1)
            skate = torch.where(cur.k > 0, skate, torch.zeros_like(skate))
            logs.skating.index_put_((cur.k, cur.clip), skate)
            prev_normal, prev_pos = normal, pos_c
        cur = _Slots(clip=cur.clip, k=k1, state=new_state, prev_normal=prev_normal, prev_pos=prev_pos)
    # frames after a stop keep the last simulated state
    k_all = torch.arange(logs.q.shape[0], device=dev)
    hold = torch.minimum(k_all[:, None], logs.stop_step.clamp(min=0)[None, :])
    logs.q = logs.q[hold, torch.arange(w, device=dev)[None, :]]


def pd_control(
    model: Model,
    ref: TrackingReference,
    settings: TrackingSettings,
    state: State,
    ci: torch.Tensor,
    ni: torch.Tensor,
    prev_normal: torch.Tensor,
    links: tuple[torch.Tensor | None, torch.Tensor | None],
    gains: tuple[torch.Tensor, torch.Tensor],
    balance: bool,
    offset: torch.Tensor | None = None,
) -> Control:
    """The :attr:`Controller.PD` command of one step for ``W`` worlds: PD targets at the next reference rows
    ``ni [W]``, the feed-forward of rows ``ci [W]``, the stance-leg balance correction (``balance``; from the last
    step's normal forces ``prev_normal [W, C]`` N and the current links ``links = (pos [W, B, 3], quat [W, B, 4])``)
    and then the target offsets ``offset [W, nv]`` (layout tangent; ``None``: none). ``gains``: ``(kp, kd)``
    ``[nv]`` (:func:`drive_gains`). :func:`track` and the sampling search (:mod:`kangengine.sim.sampling`) both
    build their commands here, so a replayed plan runs the same arithmetic as its search."""
    m = state.q.shape[0]
    q_tgt, qd_tgt, tau_ff = ref.q[ni], ref.qd[ni], ref.feedforward[ci]
    if balance:
        pos, quat = links
        j0 = _first_joint_dof(model)
        q_tgt, qd_tgt = _stance_correction(
            model, state.q, state.qd, q_tgt, qd_tgt, prev_normal, settings, j0, pos, quat
        )
    if offset is not None:
        q_tgt = model.layout.integrate(q_tgt, offset)
    kp, kd = gains
    return Control(
        q_target=q_tgt,
        qd_target=qd_tgt,
        tau_feedforward=tau_ff,
        drive_stiffness=kp.expand(m, -1),
        drive_damping=kd.expand(m, -1),
    )


def uses_balance(model: Model, settings: TrackingSettings) -> bool:
    """Whether :func:`pd_control` applies the stance-leg balance correction for ``model`` and ``settings``."""
    return (
        model.layout.free_root
        and settings.controller in (Controller.PD, Controller.SAMPLING)
        and settings.balance
        and settings.balance_gain > 0
        and model.num_contact_points > 0
    )


def implicit_gains(model: Model, settings: TrackingSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """The PD gains ``(kp [nv], kd [nv])`` of :attr:`Controller.IMPLICIT`: :func:`drive_gains` with the joint
    rows times ``implicit_drive_scale`` (the planned feed-forward does the tracking)."""
    kp, kd = drive_gains(model, settings)
    j0 = _first_joint_dof(model)
    kp, kd = kp.clone(), kd.clone()
    kp[j0:], kd[j0:] = kp[j0:] * settings.implicit_drive_scale, kd[j0:] * settings.implicit_drive_scale
    return kp, kd


class _Implicit:
    """:attr:`Controller.IMPLICIT`: per step, a probe step with the reference feed-forward, then the
    actuated feed-forward that makes the step itself land on the desired next velocity, in the step's own
    linearisation: ``qd'(tau) = qd'(tau0) + h H^-1 S^T (tau - tau0)`` with ``H`` the Newton Hessian of the
    step (mass matrix, implicit drive and joint damping, the ground contact's normal stiffness/damping and
    its friction curvature at sticking, built here from the probe's contact forces and points)."""

    def __init__(self, model: Model, settings: TrackingSettings, sim: Simulator):
        self.model, self.settings, self.sim = model, settings, sim
        dev, dt_ = model.device, model.dtype
        nv = model.nv
        h = settings.dt
        wr = 2.0 * math.pi * settings.implicit_root_frequency_hz
        wj = 2.0 * math.pi * settings.implicit_joint_frequency_hz
        freq = torch.full((nv,), wj, dtype=dt_, device=dev)
        freq[:6] = wr
        self.kp, self.kd = freq * freq, 2.0 * freq
        inertia = _axis_inertia(model).clamp(min=1e-6)
        weight = torch.ones(nv, dtype=dt_, device=dev)
        weight[:6] = settings.implicit_root_weight
        self.w2 = weight * inertia  # [nv] velocity-error weights (kg m^2: energy-like)
        self.reg = settings.implicit_regularization * h * h / inertia[6:]  # [na]
        kp, kd = implicit_gains(model, settings)
        self.hd = h * (h * kp + kd) + h * model.dof_damping + h * h * model.dof_spring_stiffness  # [nv]
        c = model.contact
        self.kn = h * (h * c.stiffness + c.damping)
        self.mu = model.contact_friction
        self.kt_coef = h * 2.0 / c.falloff_vel
        self.effort = model.dof_effort_limit[6:]

    def hessian(self, q: torch.Tensor, normal: torch.Tensor, cpos: torch.Tensor) -> torch.Tensor:
        """``[W, nv, nv]`` the step's Newton Hessian at ``q`` with contact points ``cpos [W, C, 3]`` carrying
        ``normal [W, C]`` N in the probe."""
        model = self.model
        hmat = mass_matrix(model, q) + torch.diag_embed(self.hd.expand(q.shape[0], -1))
        if model.num_contact_points:
            pos, _ = link_transforms(model, q)
            jac = link_jacobians(model, q)  # [W, B, 6, nv]
            pb = model.contact_point_body
            jb = jac[:, pb]  # [W, C, 6, nv]
            r = cpos - pos[:, pb]  # [W, C, 3]
            ang = jb[:, :, 3:]
            jp = jb[:, :, :3] + torch.linalg.cross(
                ang.transpose(-1, -2), r[:, :, None].expand(-1, -1, ang.shape[-1], -1)
            ).transpose(-1, -2)
            loaded = (normal > 0).to(q.dtype)
            kt = self.kt_coef * self.mu * normal  # [W, C]
            k = torch.stack([kt, kt, self.kn * loaded], -1)  # [W, C, 3]
            hmat = hmat + torch.einsum("wcav,wca,wcau->wvu", jp, k, jp)
        return hmat

    def sensitivity(self, hmat: torch.Tensor) -> torch.Tensor:
        """``[W, nv, na]`` ``d qd' / d tau = h H^-1 S^T`` for the Hessians ``hmat [W, nv, nv]``."""
        model = self.model
        na = model.nv - 6
        sel = torch.zeros(model.nv, na, dtype=model.dtype, device=model.device)
        sel[6:] = torch.eye(na, dtype=model.dtype, device=model.device)
        chol, _ = torch.linalg.cholesky_ex(hmat)  # no error check: no host-device synchronisation
        return cholesky_solve((self.settings.dt * sel).expand(hmat.shape[0], -1, -1), chol)

    def refine(self, state: State, ctrl: Control, ref: TrackingReference, ci: torch.Tensor, ni: torch.Tensor):
        """``ctrl`` with the joint feed-forward that lands the step on the desired next velocity (root rows
        included) in the least-squares sense, from a probe step with ``ctrl`` at ``state`` (reference rows
        ``ci``, next rows ``ni``); clamped at the model's effort limits."""
        st, model = self.settings, self.model
        h = st.dt
        probe = self.sim.step(state, ctrl)
        qd0 = probe.state.qd
        e = model.layout.difference(ref.q[ci], state.q)
        qd_des = ref.qd[ni] + h * (self.kp * e + self.kd * (ref.qd[ci] - state.qd))
        hmat = self.hessian(state.q, probe.contact_normal_force, probe.contact_position)
        x = self.sensitivity(hmat)  # [W, nv, na]
        xw = x * self.w2[None, :, None]
        a = x.transpose(1, 2) @ xw + torch.diag_embed(self.reg.expand(hmat.shape[0], -1))
        b = (xw.transpose(1, 2) @ (qd_des - qd0)[..., None])[..., 0]
        dtau = torch.linalg.solve(a, b)
        tau = ctrl.tau_feedforward.clone()
        tau[:, 6:] = torch.maximum(torch.minimum(tau[:, 6:] + dtau, self.effort), -self.effort)
        return replace(ctrl, tau_feedforward=tau)


class _WholeBody:
    """Per-step commands of :attr:`Controller.WHOLE_BODY` (:func:`~kangengine.sim.wbc.whole_body_control`):
    desired accelerations from the reference row ``ci`` of each world, then the planned torques as the
    drives' feed-forward and the planned next state as their targets."""

    def __init__(self, model: Model, ref: TrackingReference, settings: TrackingSettings):
        self.model, self.ref, self.settings = model, ref, settings
        dev, dt_ = model.device, model.dtype
        nv = model.nv
        wr = 2.0 * math.pi * settings.wbc_root_frequency_hz
        wj = 2.0 * math.pi * settings.wbc_joint_frequency_hz
        z = settings.wbc_damping_ratio
        freq = torch.full((nv,), wj, dtype=dt_, device=dev)
        freq[:6] = wr
        self.kp, self.kd = freq * freq, 2.0 * z * freq
        self.implicit = 1.0 / (1.0 + settings.dt * self.kd + settings.dt**2 * self.kp)
        weight = torch.full((nv,), settings.wbc_joint_weight, dtype=dt_, device=dev)
        weight[:6] = settings.wbc_root_weight
        self.dof_weight = weight * _axis_inertia(model).clamp(min=1e-6)
        mu = (
            torch.full_like(model.contact_friction, float(settings.friction))
            if settings.friction is not None
            else model.contact_friction
        )
        self.friction = mu * settings.friction_margin
        bc = int(ref.contact_bodies.shape[0])
        body_slot = torch.full((model.num_bodies,), -1, dtype=torch.int64, device=dev)
        body_slot[ref.contact_bodies] = torch.arange(bc, device=dev)
        self.point_slot = body_slot[model.contact_point_body]
        self.scalar = model.dof_is_scalar.to(dt_)
        ever = (ref.contact_height < settings.contact_height).any(0)  # [Bc] bodies the references stand on
        self.stance_candidates = ref.contact_bodies[ever]

    def command(self, state: State, ci: torch.Tensor, ni: torch.Tensor):
        """``(q_target [S, nq], qd_target [S, nv], tau_feedforward [S, nv])`` for the states at reference rows
        ``ci [S]`` (``ni``: the next rows, the root assistance's target when it is on)."""
        model, ref, st = self.model, self.ref, self.settings
        q, qd = state.q, state.qd
        err = model.layout.difference(ref.q[ci], q)
        derr = ref.qd[ci] - qd
        # the feedback evaluated at the end of the step (backward Euler, as the simulator): stable at any gain
        qdd_des = ref.qdd[ci] + (self.kp * (err + st.dt * derr) + self.kd * derr) * self.implicit
        stance_c = ref.contact_height[ci] < st.contact_height  # [S, Bc] the reference stands on these
        allowed = stance_c[:, self.point_slot]
        stance_body = torch.zeros(q.shape[0], model.num_bodies, dtype=torch.bool, device=q.device)
        stance_body[:, ref.contact_bodies] = stance_c
        cmd = whole_body_control(
            model,
            q,
            qd,
            qdd_des,
            allowed,
            stance_body,
            self.stance_candidates,
            dof_weight=self.dof_weight,
            stance_time=st.wbc_stance_settle_s,
            friction=self.friction,
            contact_height=st.wbc_contact_height,
            max_points=st.fit_points,
            iterations=st.wbc_iterations,
        )
        v_next = qd + st.dt * cmd.qdd
        q_next = model.layout.integrate(q, v_next, st.dt)
        # the implicit step applies the passive springs and dampers at the end-of-step state: compensate them
        # there (a light, heavily damped DOF such as a toe would otherwise not follow the plan)
        qs = q_next[:, model.dof_q_index] * self.scalar
        spring = model.dof_spring_stiffness * (qs - model.dof_spring_ref) * self.scalar
        passive = model.dof_damping * v_next + spring
        tau = cmd.tau + passive
        tau[:, :6] = 0.0
        if st.root_assist_frequency_hz > 0:  # the virtual root drive pulls towards the reference
            q_next = torch.cat([ref.q[ni, :7], q_next[:, 7:]], -1)
            v_next = torch.cat([ref.qd[ni, :6], v_next[:, 6:]], -1)
        return q_next, v_next, tau


def _stance_correction(model, q, qd, q_ref, qd_ref, normal, settings, j0, pos, quat):
    """Shift the joint targets so that, with the loaded contact points held where they are, the root
    would sit at the reference: ``J_p,joints dq = -J_p,root e`` (damped least squares over the contact
    points, rows weighted by each point's normal force; a line of points leaves rolling about it free).
    ``pos, quat``: the links of ``q`` (:func:`~kangengine.sim.link_transforms`)."""
    w = q.shape[0]
    e = _root_error(q_ref, q)
    de = qd_ref[:, :6] - qd[:, :6]
    share = normal / normal.sum(-1, keepdim=True).clamp(min=1e-6)  # [W, C]
    pts = _contact_points(model, pos, quat)
    pb = model.contact_point_body
    lever = pts - pos[:, pb]  # [W, C, 3] from each point's link origin
    # per link: sum_i w_i P_i^T P_i with P_i = [I, -[l_i]x] (point velocity from the link twist (v, w))
    nb = model.num_bodies
    s0 = torch.zeros(w, nb, dtype=q.dtype, device=q.device).index_add_(1, pb, share)
    s1 = torch.zeros(w, nb, 3, dtype=q.dtype, device=q.device).index_add_(1, pb, share[..., None] * lever)
    ll = share[..., None, None] * lever[..., :, None] * lever[..., None, :]
    s2 = torch.zeros(w, nb, 3, 3, dtype=q.dtype, device=q.device).index_add_(1, pb, ll)
    eye3 = torch.eye(3, dtype=q.dtype, device=q.device)
    x, y, z = s1.unbind(-1)
    o = torch.zeros_like(x)
    sk = torch.stack([torch.stack([o, -z, y], -1), torch.stack([z, o, -x], -1), torch.stack([-y, x, o], -1)], -2)
    s_ang = s2.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] * eye3 - s2
    sb = torch.cat([torch.cat([s0[..., None, None] * eye3, -sk], -1), torch.cat([sk, s_ang], -1)], -2)
    jac = link_jacobians(model, q)  # [W, B, 6, nv]
    sj = sb @ jac  # [W, B, 6, nv]
    jj = jac[..., j0:]
    h = torch.einsum("wbiu,wbiv->wuv", jj, sj[..., j0:])
    h = h + settings.balance_regularization * torch.eye(h.shape[-1], dtype=q.dtype, device=q.device)
    target = torch.stack(
        [torch.einsum("wbiv,wv->wbi", sj[..., :j0], e), torch.einsum("wbiv,wv->wbi", sj[..., :j0], de)], -1
    )
    rhs = -torch.einsum("wbiu,wbik->wuk", jj, target)
    chol, _ = torch.linalg.cholesky_ex(h)  # no error check: no host-device synchronisation
    sol = cholesky_solve(rhs, chol)  # the same result at any batch index
    gain = settings.balance_gain
    dq = torch.zeros(w, model.nv, dtype=q.dtype, device=q.device)
    dq[:, j0:] = gain * sol[..., 0]
    dqd = torch.zeros_like(dq)
    dqd[:, j0:] = gain * sol[..., 1]
    return model.layout.integrate(q_ref, dq), qd_ref + dqd


def _self_penetration(model: Model, pos: torch.Tensor, quat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Deepest link-to-link overlap ``[n]`` m (0 when none) and its pair ``[n]`` int64 (-1: none) at link
    poses ``pos [n, B, 3]``, ``quat [n, B, 4]``: the capsule segments of ``model``'s self-contact geoms
    (:class:`~kangengine.sim.ContactParams` ``self_collision``), closest points by
    :func:`~kangengine.sim.contact.closest_segment_points`."""
    n = pos.shape[0]
    g = model.self_geom_body
    rot = quat[:, g]
    centre = pos[:, g] + R.quat_rotate(rot, model.self_geom_center.expand(n, -1, -1))
    axis = R.quat_rotate(rot, model.self_geom_axis.expand(n, -1, -1))
    start, seg = centre - axis, 2.0 * axis
    a, b = model.self_pair_geom[:, 0], model.self_pair_geom[:, 1]
    comps = lambda x: tuple(x[..., k] for k in range(3))  # noqa: E731
    s, t = closest_segment_points(comps(start[:, a]), comps(seg[:, a]), comps(start[:, b]), comps(seg[:, b]))
    gap = (start[:, a] + s[..., None] * seg[:, a]) - (start[:, b] + t[..., None] * seg[:, b])
    depth = model.self_geom_radius[a] + model.self_geom_radius[b] - torch.linalg.vector_norm(gap, dim=-1)
    best, pair = depth.max(-1)
    return best.clamp(min=0.0), torch.where(best > 0, pair, torch.full_like(pair, -1))


def _metrics(model, ref, names, settings, logs: _Logs) -> TrackingResult:
    dev, dt_ = model.device, model.dtype
    q_log, effort_log, assist_log, cforce_log = logs.q, logs.effort, logs.assist, logs.contact_force
    skate_log, pen_log = logs.skating, logs.penetration
    steps, w, _ = q_log.shape
    counts = ref.clip_step_count
    k_all = torch.arange(steps, device=dev)
    valid = k_all[:, None] < counts[None, :]  # [K, W]
    simulated = valid & (k_all[:, None] <= logs.stop_step[None, :])
    idx = ref.clip_step_start[None, :] + torch.minimum(k_all[:, None], counts[None, :] - 1)  # reference rows
    nb = model.num_bodies
    j0 = _first_joint_dof(model)
    body_err = torch.zeros(steps, w, nb, dtype=dt_, device=dev)
    dof_err = torch.zeros(steps, w, model.nv - j0, dtype=dt_, device=dev)
    root_err = torch.zeros(steps, w, 3, dtype=dt_, device=dev)
    heading = torch.zeros(steps, w, dtype=dt_, device=dev)
    sim_lim = torch.zeros(steps, w, dtype=dt_, device=dev)
    self_pen = torch.zeros(2, steps, w, dtype=dt_, device=dev)  # reference, simulation
    self_pair = torch.full((2, steps, w), -1, dtype=torch.int64, device=dev)
    chunk = max(int(settings.chunk_frames) // max(w, 1), 1)
    scalar = model.dof_is_scalar
    for s in range(0, steps, chunk):
        e = min(s + chunk, steps)
        q = q_log[s:e].reshape(-1, model.nq)
        rows = idx[s:e].reshape(-1)
        qr = ref.q_raw[rows]
        pos, quat = link_transforms(model, q)
        body_err[s:e] = torch.linalg.vector_norm(pos - ref.body_pos[rows], dim=-1).reshape(e - s, w, nb)
        diff = model.layout.difference(qr, q)
        dof_err[s:e] = diff[:, j0:].abs().reshape(e - s, w, -1)
        root_err[s:e] = (pos[:, 0] - ref.body_pos[rows, 0]).reshape(e - s, w, 3)
        if model.layout.free_root:
            heading[s:e] = R.wrap_angle(_yaw(q[:, 3:7]) - _yaw(qr[:, 3:7])).reshape(e - s, w)
        qs = q[:, model.dof_q_index]
        viol = torch.maximum(qs - model.dof_upper, model.dof_lower - qs).clamp(min=0.0) * scalar
        sim_lim[s:e] = (viol.amax(-1) if viol.shape[-1] else torch.zeros_like(qs[:, 0])).reshape(e - s, w)
        if model.num_self_pairs:
            for j, (p_, r_) in enumerate((link_transforms(model, qr), (pos, quat))):
                depth, pair = _self_penetration(model, p_, r_)
                self_pen[j, s:e] = depth.reshape(e - s, w)
                self_pair[j, s:e] = pair.reshape(e - s, w)
    rows = idx.reshape(-1)
    qr = ref.q_raw[rows][:, model.dof_q_index]
    rviol = torch.maximum(qr - model.dof_upper, model.dof_lower - qr).clamp(min=0.0) * scalar
    ref_lim = (rviol.amax(-1) if rviol.shape[-1] else torch.zeros_like(qr[:, 0])).reshape(steps, w)
    ffr = (
        (ref.feedforward[rows][:, j0:].abs() / model.dof_effort_limit[j0:]).amax(-1).reshape(steps, w)
        if model.nv > j0
        else torch.zeros(steps, w, dtype=dt_, device=dev)
    )
    rw, uw = ref.residual_wrench[rows], ref.unsupported_wrench[rows]
    if model.nv > j0:
        ratio = (ref.feedforward[rows][:, j0:].abs() / model.dof_effort_limit[j0:]).reshape(steps, w, -1)
        ratio = torch.where(valid[..., None], ratio, torch.full_like(ratio, math.nan))
        ff_dof = torch.nanquantile(ratio.to(torch.float64), 0.95, dim=0).nan_to_num(0.0, posinf=math.inf)
    else:
        ff_dof = torch.zeros(w, 0, dtype=torch.float64, device=dev)
    root_h = ref.body_pos[rows, 0, 2].reshape(steps, w) - model.contact.ground_height

    def out(x):  # [K, W, ...] -> numpy [W, K, ...], zero where invalid
        v = valid.reshape(valid.shape + (1,) * (x.ndim - 2))
        return torch.where(v, x, torch.zeros_like(x)).transpose(0, 1).detach().cpu().numpy()

    def per(x):
        return x.reshape(steps, w, *x.shape[1:])

    # the contact-speed skating of the simulation is measured between steps k and k+1; the last step has none
    layout = model.layout
    dof_names = layout.dof_names[j0:]
    return TrackingResult(
        dt=settings.dt,
        clip_names=tuple(names),
        clip_step_count=counts.cpu().numpy(),
        settings=settings,
        total_mass=model.total_mass,
        body_names=tuple(layout.body_names),
        dof_names=tuple(dof_names),
        contact_body_names=tuple(layout.body_names[int(b)] for b in ref.contact_bodies.cpu()),
        valid=valid.transpose(0, 1).cpu().numpy(),
        body_error=out(body_err),
        body_error_mean=out(body_err.mean(-1)),
        body_error_max=out(body_err.amax(-1)),
        dof_error=out(dof_err),
        root_error=out(torch.linalg.vector_norm(root_err, dim=-1)),
        root_horizontal_error=out(torch.linalg.vector_norm(root_err[..., :2], dim=-1)),
        root_height_error=out(root_err[..., 2]),
        heading_error=out(heading),
        reference_limit_violation=out(ref_lim),
        sim_limit_violation=out(sim_lim),
        effort_ratio=out(effort_log),
        feedforward_ratio=out(ffr),
        residual_force=out(per(torch.linalg.vector_norm(rw[:, :3], dim=-1))),
        residual_torque=out(per(torch.linalg.vector_norm(rw[:, 3:], dim=-1))),
        unsupported_force=out(per(torch.linalg.vector_norm(uw[:, :3], dim=-1))),
        unsupported_torque=out(per(torch.linalg.vector_norm(uw[:, 3:], dim=-1))),
        reference_contact_height=out(per(ref.contact_height[rows])),
        reference_contact_speed=out(per(ref.contact_speed[rows])),
        reference_contact_force=out(per(ref.contact_force[rows])),
        sim_contact_force=out(cforce_log),
        sim_skating_speed=out(skate_log),
        sim_penetration=out(pen_log),
        assist_force=out(assist_log[..., 0]),
        assist_torque=out(assist_log[..., 1]),
        reference_root_height=out(root_h),
        feedforward_ratio_by_dof=ff_dof.cpu().numpy(),
        reference_self_penetration=out(self_pen[0]),
        reference_self_pair=out(self_pair[0] + 1) - 1,
        sim_self_penetration=out(self_pen[1]),
        sim_self_pair=out(self_pair[1] + 1) - 1,
        sim_self_contact_force=out(logs.self_force),
        self_pair_names=tuple(model.self_pair_names),
        simulated=simulated.transpose(0, 1).cpu().numpy(),
        stop_step=logs.stop_step.cpu().numpy(),
        fell_step=logs.fell_step.cpu().numpy(),
        diverged=logs.diverged.cpu().numpy(),
        step_count=logs.step_count.cpu().numpy(),
    )

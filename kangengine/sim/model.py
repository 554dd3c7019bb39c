"""`Model`: the simulator's view of an articulation, as torch tensors built once; `State`: ``q, qd``
batched over worlds.

Everything a step needs that does not change with the state is precomputed here: body inertias, the
motion axes of every DOF in the frame of its joint, the tree masks that replace recursions over bodies
(which DOFs move which body, which bodies lie in which subtree), joint damping and friction, limits,
passive springs, PD drive gains and effort limits, and the contact points of the collision geoms.

Units are SI; frames and the velocity convention are the layout's (``docs/conventions.md``): free root
``qd`` = (linear velocity of the root body origin in world, angular velocity in world), ball ``qd`` =
angular velocity in the parent joint frame, hinge/slide ``qd`` = joint rate.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import rotations as R
from ..animation.layout import ArticulationCoordinateLayout
from ..asset.desc import ArticulationDesc, GeomType, JointType
from ..errors import FormatError, LayoutMismatch, ShapeError, TopologyError, UnknownNameError
from .constraints import Constraints, build_constraints, mimic_rows, with_compliant_mimics
from .drives import DriveEnvelope

__all__ = ["JointFriction", "ContactParams", "PerDof", "Model", "StepCache", "State", "read_effort_limits"]

_INF = math.inf


@dataclass(frozen=True)
class JointFriction:
    """Smoothed Coulomb/Stribeck joint friction shared by every DOF that does not set its own
    (reference: ``ArticulatedJointFrictionParams``).

    The dry-friction potential of a DOF (a ball joint: of the norm of its angular velocity) is
    ``mu0 * phi(|v|)`` with ``mu0 = coulomb + stiction_extra``; see :func:`kangengine.sim.friction_phi`.

    Attributes:
        falloff_vel: velocity (m/s or rad/s) below which dry friction ramps from 0 to its peak.
        stiction_extra: extra static friction (N or N m) above the Coulomb value, for every DOF.
        stribeck_vel: Stribeck velocity (m/s or rad/s); 0 drops from static to dynamic friction at
            ``falloff_vel`` at once.
    """

    falloff_vel: float = 1e-3
    stiction_extra: float = 0.0
    stribeck_vel: float = 0.0


@dataclass(frozen=True)
class ContactParams:
    """Ground contact (a plane ``z = ground_height``) of the collision geoms.

    Each sphere, capsule end, box corner, cylinder rim point and ellipsoid surface point is a contact
    point with a compliant normal penalty ``U = stiffness/2 * depth^2`` (``depth`` = penetration, m), normal damping
    ``damping * depth_rate`` while penetrating, and smoothed Coulomb friction whose potential is
    ``friction * normal_force * phi(|slip velocity|)`` with the same ``phi`` as joint friction.

    Attributes:
        stiffness: N/m per contact point.
        damping: N s/m per contact point.
        friction: Coulomb coefficient; ``None`` takes each geom's MJCF sliding friction combined with
            the world plane's by ``max`` (MuJoCo's rule), 1.0 where the file has none.
        falloff_vel: m/s, slip velocity below which friction ramps up (see :class:`JointFriction`).
        stiction_extra: extra static friction coefficient on top of ``friction``.
        stribeck_vel: m/s.
        ground_height: m, height of the ground plane.
        enabled: ``False`` disables ground contact.
        self_collision: simulate link-to-link contact (off by default): every pair of collision geoms on
            two links that may collide (MuJoCo's ``contype``/``conaffinity`` rule, not parent and child, not
            welded together, not in the file's ``<exclude>``; ``Model.collision_filter_pairs``) gets the
            same normal law as the ground (``stiffness``, ``damping``; no friction) inside the implicit
            step. Spheres and capsules are exact; a box, cylinder or ellipsoid is approximated by the capsule
            along its longest axis whose radius is the larger of its other two half-sizes.
    """

    stiffness: float = 5e4
    damping: float = 1e3
    friction: float | None = None
    falloff_vel: float = 1e-2
    stiction_extra: float = 0.0
    stribeck_vel: float = 0.0
    ground_height: float = 0.0
    enabled: bool = True
    self_collision: bool = False


PerDof = float | Sequence[float] | np.ndarray | Mapping[str, float] | None


@dataclass(frozen=True, eq=False)
class Model:
    """Tensors of one articulation for the simulator, built once by :meth:`from_desc`.

    Sizes: ``B`` bodies, ``nq``/``nv`` coordinates/DOFs, ``S`` joint steps (the layout's non-FIXED
    blocks), ``C`` contact-point slots (``contact_bodies x points_per_body``). All float tensors have
    the model's ``dtype`` and live on its ``device``.

    Bodies:
        body_mass ``[B]`` kg; body_com ``[B, 3]`` m (body frame); body_inertia ``[B, 3, 3]`` kg m^2 about
        the COM in body axes; body_gravity ``[B]`` 1.0 where gravity acts, 0.0 where switched off;
        gravity ``[3]`` m/s^2 (world).
    DOFs (every per-DOF tensor is ``[nv]`` and named ``dof_*``):
        dof_body: body each DOF moves; dof_step: its joint step; dof_angular_axis and dof_linear_axis
        ``[nv, 3]``: the DOF's unit motion in its joint frame (hinge: angular = axis; slide: linear = axis;
        ball: angular = e_k; free: linear e_k then angular e_k, in world axes); dof_is_scalar (bool):
        hinge/slide DOFs; dof_q_index: the ``q`` index of a hinge/slide DOF's coordinate (0 elsewhere).
        dof_armature (joint inertia, kg m^2 or kg), dof_damping (viscous, N m s/rad or N s/m),
        dof_friction_coulomb / dof_friction_stiction (N m or N) / dof_friction_falloff /
        dof_friction_stribeck (rad/s or m/s), dof_friction_group (the first DOF of a ball joint for its
        three DOFs, else the DOF itself: dry friction acts on the norm over a group), dof_lower / dof_upper
        limits (+-inf where none), dof_limit_stiffness / dof_limit_damping, dof_spring_stiffness /
        dof_spring_ref (passive joint springs, hinge/slide), dof_drive_stiffness / dof_drive_damping (PD
        gains), dof_effort_limit (+inf where none).
    Tree masks (0/1 in the float dtype):
        dof_moves_body ``[B, nv]``; subtree ``[B, B]`` (``subtree[b, k]``: k lies in b's subtree);
        dof_above ``[nv, nv]`` (``body(i)`` is ``body(j)`` or an ancestor); dof_above_strict (a proper
        ancestor); dof_below (the transpose of dof_above); dof_coupled ``[nv, nv]`` (one of the two);
        dof_frame ``[nv, nv]``: DOFs whose motion moves the frame DOF i is expressed in.
    Contacts (``C`` points, flat, ordered by body):
        contact_point_body ``[C]`` body of each contact point; contact_point_local ``[C, 3]`` m (centre
        of the point's sphere, body frame); contact_radius ``[C]`` m; contact_friction ``[C]`` Coulomb
        coefficient; contact_point_geom ``C`` geom names; contact: :class:`ContactParams`;
        skipped_geoms: collision geoms of unsupported types (not simulated).
    Joint-space couplings (``R`` rows over the hinge/slide DOFs, ``L = coupling_matrix @ q``):
        coupling_matrix ``[R, nv]``; coupling_lower / coupling_upper ``[R]`` (a penalty
        ``stiffness/2 * violation^2`` outside ``[lower, upper]``, damping on ``L'`` while violated);
        coupling_stiffness / coupling_damping ``[R]``; coupling_names. Fixed tendons with a range give
        limit rows, mimic joints give spring rows (``lower = upper = offset``).
    Self-collision filter:
        collision_filter_pairs: body-name pairs that never collide with each other (adjacent links, also
        across welded links as MuJoCo filters parents, links welded by fixed joints or joined through a
        link without geometry, and the file's exclusions).
    Self-collision (``G`` geoms as segments with a radius, ``P`` pairs; empty unless
    ``ContactParams.self_collision``):
        self_geom_body ``[G]``; self_geom_center ``[G, 3]`` m and self_geom_axis ``[G, 3]`` m (segment centre
        and half-segment vector, body frame; zero for a sphere); self_geom_radius ``[G]`` m; self_geom_names
        ``G`` names; self_pair_geom ``[P, 2]`` long (geom indices); self_pair_names ``P`` ``(geom, geom)``.
    Rows of the implicit step and drive limits:
        constraints: :class:`~kangengine.sim.constraints.Constraints` (cycle joints, tendon
        spring-dampers, spatial tendons) or ``None``; drive_envelope:
        :class:`~kangengine.sim.drives.DriveEnvelope` (speed-dependent effort limits, joint speed limits)
        or ``None`` (then ``dof_effort_limit`` is a constant clamp); see
        :func:`~kangengine.sim.drives.with_drive_envelope`.
    Hard mimic joints (``M`` rows, ``Model.from_desc(mimic="hard")``): mimic_matrix ``[M, nv]`` and
        mimic_bias ``[M]`` give ``r = mimic_matrix @ q + mimic_bias = q_joint - multiplier q_leader -
        offset``, held at 0 as an equality constraint of the Newton solve (``None`` when there are none);
        mimic_names (``"mimic <joint>"``).
    Derived:
        has_ball_friction: some ball joint has dry friction; step_cache: :class:`StepCache`, the layouts
        of these tensors that the step's maths reads, rebuilt with every new model (also by
        :func:`dataclasses.replace`).
    """

    layout: ArticulationCoordinateLayout
    name: str
    device: torch.device
    dtype: torch.dtype
    parents: tuple[int, ...]
    body_mass: torch.Tensor
    body_com: torch.Tensor
    body_inertia: torch.Tensor
    body_gravity: torch.Tensor
    gravity: torch.Tensor
    dof_body: torch.Tensor
    dof_step: torch.Tensor
    dof_angular_axis: torch.Tensor
    dof_linear_axis: torch.Tensor
    dof_is_scalar: torch.Tensor
    dof_q_index: torch.Tensor
    dof_armature: torch.Tensor
    dof_damping: torch.Tensor
    dof_friction_coulomb: torch.Tensor
    dof_friction_stiction: torch.Tensor
    dof_friction_falloff: torch.Tensor
    dof_friction_stribeck: torch.Tensor
    dof_friction_group: torch.Tensor
    dof_lower: torch.Tensor
    dof_upper: torch.Tensor
    dof_limit_stiffness: torch.Tensor
    dof_limit_damping: torch.Tensor
    dof_spring_stiffness: torch.Tensor
    dof_spring_ref: torch.Tensor
    dof_drive_stiffness: torch.Tensor
    dof_drive_damping: torch.Tensor
    dof_effort_limit: torch.Tensor
    dof_moves_body: torch.Tensor
    subtree: torch.Tensor
    dof_above: torch.Tensor
    dof_above_strict: torch.Tensor
    dof_below: torch.Tensor
    dof_coupled: torch.Tensor
    dof_frame: torch.Tensor
    contact_point_body: torch.Tensor
    contact_point_local: torch.Tensor
    contact_radius: torch.Tensor
    contact_friction: torch.Tensor
    contact_point_geom: tuple[str, ...]
    contact: ContactParams
    skipped_geoms: tuple[str, ...]
    collision_filter_pairs: tuple[tuple[str, str], ...]
    coupling_matrix: torch.Tensor = None
    coupling_lower: torch.Tensor = None
    coupling_upper: torch.Tensor = None
    coupling_stiffness: torch.Tensor = None
    coupling_damping: torch.Tensor = None
    coupling_names: tuple[str, ...] = ()
    has_ball_friction: bool = False
    self_geom_body: torch.Tensor = None
    self_geom_center: torch.Tensor = None
    self_geom_axis: torch.Tensor = None
    self_geom_radius: torch.Tensor = None
    self_geom_names: tuple[str, ...] = ()
    self_pair_geom: torch.Tensor = None
    self_pair_names: tuple[tuple[str, str], ...] = ()
    constraints: Constraints | None = None
    drive_envelope: DriveEnvelope | None = None
    mimic_matrix: torch.Tensor | None = None
    mimic_bias: torch.Tensor | None = None
    mimic_names: tuple[str, ...] = ()
    step_cache: StepCache = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "step_cache", StepCache.from_model(self))

    # -- sizes ----------------------------------------------------------------------------------------
    @property
    def nq(self) -> int:
        return self.layout.nq

    @property
    def nv(self) -> int:
        return self.layout.nv

    @property
    def num_bodies(self) -> int:
        return len(self.parents)

    @property
    def body_names(self) -> tuple[str, ...]:
        return self.layout.body_names

    @property
    def num_contact_points(self) -> int:
        """``C``: number of contact points (every sphere, capsule end, box corner, cylinder rim point)."""
        return int(self.contact_point_body.shape[0])

    @property
    def num_self_pairs(self) -> int:
        """``P``: number of link-to-link contact pairs (0 unless ``ContactParams.self_collision``)."""
        return 0 if self.self_pair_geom is None else int(self.self_pair_geom.shape[0])

    @property
    def total_mass(self) -> float:
        return float(self.body_mass.sum())

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def from_desc(
        cls,
        desc: ArticulationDesc,
        layout: ArticulationCoordinateLayout | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        free_root: bool = True,
        drive_stiffness: PerDof = 0.0,
        drive_damping: PerDof = 0.0,
        effort_limit: PerDof = None,
        limit_stiffness: PerDof = 100.0,
        limit_damping: PerDof = 0.0,
        armature: PerDof = None,
        joint_damping: PerDof = None,
        joint_friction: PerDof = None,
        friction_params: JointFriction = JointFriction(),
        passive_springs: bool = True,
        gravity: Sequence[float] | None = None,
        link_gravity: Mapping[str, bool] | None = None,
        contact: ContactParams = ContactParams(),
        tendon_limit_stiffness: float = 100.0,
        tendon_limit_damping: float = 0.0,
        mimic: str | Mapping[str, str] | None = None,
        mimic_stiffness: float | None = None,
        mimic_damping: float | None = None,
        cycle_stiffness: float | None = None,
        cycle_damping: float | None = None,
        mimic_natural_frequency: float | None = None,
        mimic_damping_ratio: float = 1.0,
        contact_layers: Mapping[str, str] | None = None,
        layer_contacts: Mapping[tuple[str, str], bool] | None = None,
        contact_overrides: Mapping[tuple[str, str], bool] | None = None,
    ) -> Model:
        """Build the simulator model of ``desc``.

        Per-DOF arguments (``PerDof``) take a scalar (every hinge/slide/ball DOF; free-root DOFs get 0
        for gains and +inf for effort limits), an ``[nv]`` array, or a mapping from joint names or
        DOF names (``layout.dof_names``) to values (unnamed DOFs keep the default).

        Args:
            desc: the articulation (any loader).
            layout: its coordinate layout; built with ``free_root`` when omitted.
            device, dtype: where and in which precision the tensors live (float32 or float64).
            drive_stiffness, drive_damping: PD gains (N m/rad, N m s/rad; N/m, N s/m).
            effort_limit: largest drive effort per DOF; ``None`` takes the file's (``+inf`` where none).
            limit_stiffness, limit_damping: joint-limit spring and damper (defaults 100 and 0). Limits
                are the file's ranges (MJCF ``range`` of limited hinges and slides).
            armature: joint inertia; ``None`` takes the file's (MJCF ``armature``).
            joint_damping: viscous joint damping; ``None`` takes the file's (MJCF ``damping``).
            joint_friction: Coulomb joint friction (N m or N); ``None`` takes MJCF ``frictionloss``.
            friction_params: smoothing shared by the joint friction (:class:`JointFriction`).
            passive_springs: keep the file's passive joint springs (MJCF ``stiffness``/``springref``).
            gravity: ``[3]`` m/s^2; ``None`` takes the file's.
            link_gravity: body name -> whether gravity acts on it (default: all).
            contact: ground contact parameters.
            tendon_limit_stiffness, tendon_limit_damping: penalty on fixed tendons (``desc.tendons``) leaving
                their range (N/m or N m/rad per unit of tendon length; defaults like joint limits).
            mimic: how the mimic joints (``desc.mimics``, ``joint = multiplier * leader + offset``) are
                held: ``"hard"`` (an equality constraint inside the Newton solve: the ratio holds to
                round-off, whatever the loads, like PhysX mimic joints), ``"compliant"`` (a spring-damper
                row, like MuJoCo's joint equality with its ``solref``), or a mapping from mimic joint names
                to either (unnamed ones take the default). Default (``None``): ``"compliant"`` when any of
                ``mimic_stiffness``, ``mimic_damping``, ``mimic_natural_frequency`` is given, else
                ``"hard"`` (the reference's articulations are PhysX's, whose mimic joints are hard).
            mimic_stiffness, mimic_damping: spring (default 1e4) and damper (default 10) of a compliant
                mimic joint in joint space.
            cycle_stiffness, cycle_damping: override the cycle joints' own spring (N/m, default 50000) and
                damper (N s/m, default 0); ``None`` keeps each ``CycleJointDesc``'s. Cycle joints, fixed
                tendons with a spring or damper and spatial tendons are rows of the implicit step
                (:mod:`kangengine.sim.constraints`, ``Model.constraints``).
            mimic_natural_frequency, mimic_damping_ratio: when a frequency (rad/s) is given, the mimic
                joints are rows of the step whose spring and damper follow from it and the damping ratio and
                each row's effective mass (:func:`~kangengine.sim.constraints.with_compliant_mimics`), in
                place of ``mimic_stiffness`` / ``mimic_damping``.
            contact_layers, layer_contacts, contact_overrides: link-to-link contact filtering (reference:
                contact layers and per-actor overrides), applied in this order on top of the adjacency
                filter: ``contact_layers`` puts links (by name) on named layers (unnamed links: layer
                ``"default"``); ``layer_contacts`` switches a pair of layers off (``False``) or on (either
                order); ``contact_overrides`` switches a pair of links off or on and has the last word (an
                enabled pair collides even when adjacent or its geoms' contype/conaffinity masks disagree;
                the bot's ``contactOverrides``).
        Raises:
            LayoutMismatch: ``layout`` was built for another description.
            UnknownNameError: a name in a mapping argument is not a joint, DOF or body.
            ShapeError: an array argument has the wrong length.
        """
        if layout is None:
            layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=free_root)
        if layout.body_names != desc.body_names:
            raise LayoutMismatch(
                "the layout's bodies differ from the description's; build the layout from it",
                path=desc.source,
                item="layout",
            )
        device = torch.device(device)
        if dtype not in (torch.float32, torch.float64):
            raise ShapeError(
                f"dtype {dtype} is not supported; expected torch.float32 or torch.float64",
                path=desc.source,
                item="dtype",
            )
        nv, nb = layout.nv, layout.num_bodies
        t = lambda a: torch.as_tensor(np.array(a, dtype=np.float64), dtype=dtype, device=device)
        ti = lambda a: torch.as_tensor(np.array(a, dtype=np.int64), device=device)

        # -- bodies -----------------------------------------------------------------------------------
        parents = tuple(int(p) for p in layout.parent_indices)
        mass = np.array([b.mass for b in desc.bodies])
        com = np.array([b.com for b in desc.bodies]).reshape(nb, 3)
        inertia = np.array([b.inertia for b in desc.bodies]).reshape(nb, 3, 3)
        grav_mask = np.ones(nb)
        for name, on in (link_gravity or {}).items():
            grav_mask[_body_index(desc, name)] = 1.0 if on else 0.0
        g = np.asarray(desc.gravity if gravity is None else gravity, dtype=np.float64).reshape(3)

        # -- DOFs -----------------------------------------------------------------------------------
        joints = {j.name: j for j in desc.joints}
        dof_body = np.zeros(nv, dtype=np.int64)
        dof_step = np.zeros(nv, dtype=np.int64)
        dof_joint = np.zeros(nv, dtype=np.int64)
        ang = np.zeros((nv, 3))
        lin = np.zeros((nv, 3))
        kind = [""] * nv
        arm = np.zeros(nv)
        damp = np.zeros(nv)
        fric = np.zeros(nv)
        lower = np.full(nv, -_INF)
        upper = np.full(nv, _INF)
        kspring = np.zeros(nv)
        spring_ref = np.zeros(nv)
        effort = np.full(nv, _INF)
        scalar = np.zeros(nv, dtype=bool)
        scalar_q = np.zeros(nv, dtype=np.int64)
        free_dof = np.zeros(nv, dtype=bool)
        group = np.arange(nv)
        step = 0
        for bi, blk in enumerate(layout.blocks):
            jt = blk.joint_type
            if jt is JointType.FIXED:
                continue
            sl = blk.qd_slice
            dof_body[sl] = blk.body_index
            dof_step[sl] = step
            dof_joint[sl] = bi
            jd = joints.get(blk.joint_name)
            if jt is JointType.FREE:
                lin[sl.start : sl.start + 3] = np.eye(3)
                ang[sl.start + 3 : sl.stop] = np.eye(3)
                kind[sl] = ["free_lin"] * 3 + ["free_ang"] * 3
                free_dof[sl] = True
            elif jt is JointType.BALL:
                ang[sl] = np.eye(3)
                kind[sl] = ["ball"] * 3
                group[sl] = sl.start
            elif jt is JointType.HINGE:
                ang[sl.start] = blk.axis
                kind[sl.start] = "hinge"
            elif jt is JointType.SLIDE:
                lin[sl.start] = blk.axis
                kind[sl.start] = "slide"
            if jt in (JointType.HINGE, JointType.SLIDE):
                scalar[sl.start] = True
                scalar_q[sl.start] = blk.q_offset
                if blk.limits is not None:
                    lower[sl.start], upper[sl.start] = blk.limits
            if jd is not None and jt is not JointType.FREE:
                arm[sl] = jd.armature
                damp[sl] = jd.damping
                fric[sl] = jd.frictionloss
                if jd.effort_limit is not None:
                    effort[sl] = jd.effort_limit
                if passive_springs and jt in (JointType.HINGE, JointType.SLIDE):
                    kspring[sl] = jd.stiffness
                    spring_ref[sl] = jd.spring_ref
            step += 1
        if step != sum(len(s) for s in layout.tree_plan.steps):
            raise LayoutMismatch("joint steps of the layout's plan and its blocks disagree", path=desc.source)

        names = _dof_keys(layout)
        movable = ~free_dof
        arm = _per_dof(armature, arm, names, nv, "armature", desc.source, movable)
        damp = _per_dof(joint_damping, damp, names, nv, "joint_damping", desc.source, movable)
        fric = _per_dof(joint_friction, fric, names, nv, "joint_friction", desc.source, movable)
        kp = _per_dof(drive_stiffness, np.zeros(nv), names, nv, "drive_stiffness", desc.source, movable)
        kd = _per_dof(drive_damping, np.zeros(nv), names, nv, "drive_damping", desc.source, movable)
        effort = _per_dof(effort_limit, effort, names, nv, "effort_limit", desc.source, movable)
        klim = _per_dof(limit_stiffness, np.zeros(nv), names, nv, "limit_stiffness", desc.source, scalar)
        dlim = _per_dof(limit_damping, np.zeros(nv), names, nv, "limit_damping", desc.source, scalar)
        has_limit = np.isfinite(lower) | np.isfinite(upper)
        klim = np.where(has_limit, klim, 0.0)
        dlim = np.where(has_limit, dlim, 0.0)
        fric = np.where(free_dof, 0.0, fric)
        damp = np.where(free_dof, 0.0, damp)
        arm = np.where(free_dof, 0.0, arm)

        # -- tree masks --------------------------------------------------------------------------------
        anc = np.zeros((nb, nb), dtype=bool)  # anc[a, b]: a is b or an ancestor of b
        for b in range(nb):
            a = b
            while a >= 0:
                anc[a, b] = True
                a = parents[a]
        moves = anc[dof_body][:, :].T  # [B, nv]: moves[b, d] = anc[body(d), b]
        above = anc[np.ix_(dof_body, dof_body)]  # [nv, nv]
        coupled = above | above.T
        frame = np.zeros((nv, nv), dtype=bool)
        for i in range(nv):
            for j in range(nv):
                bi_, bj = dof_body[i], dof_body[j]
                if bj != bi_:
                    frame[i, j] = anc[bj, bi_]
                elif dof_joint[j] < dof_joint[i]:
                    frame[i, j] = True
                elif dof_joint[j] == dof_joint[i] and kind[i] == "free_ang" and kind[j] == "free_lin":
                    frame[i, j] = True

        # -- friction groups (ball joints use the norm of their angular velocity) -------------------------
        has_ball_friction = bool(np.any([(kind[d] == "ball") and fric[d] > 0 for d in range(nv)]))
        fr = friction_params
        stiction = np.where(fric > 0, fr.stiction_extra, 0.0)

        # -- contact points ------------------------------------------------------------------------------
        cdata = _contact_points(desc, contact)
        compliant_given = not (mimic_stiffness is None and mimic_damping is None and mimic_natural_frequency is None)
        hard_mimics, soft_mimics = _split_mimics(desc, mimic, compliant_given)
        soft_desc = dataclasses.replace(desc, mimics=soft_mimics) if hard_mimics else desc
        coup = _couplings(
            soft_desc,
            layout,
            tendon_limit_stiffness,
            tendon_limit_damping,
            1e4 if mimic_stiffness is None else mimic_stiffness,
            10.0 if mimic_damping is None else mimic_damping,
        )
        hard = _hard_mimic_rows(desc, layout, hard_mimics)
        filter_pairs = _collision_filter(desc)
        filter_pairs, forced = _filtered_by_layers(
            desc, filter_pairs, contact_layers, layer_contacts, contact_overrides
        )
        sdata = _self_contact(desc, filter_pairs, contact, forced)
        rows = build_constraints(
            desc,
            layout,
            device=device,
            dtype=dtype,
            cycle_stiffness=cycle_stiffness,
            cycle_damping=cycle_damping,
            tendon_limit_stiffness=tendon_limit_stiffness,
            tendon_limit_damping=tendon_limit_damping,
        )

        model = cls(
            layout=layout,
            name=desc.name,
            device=device,
            dtype=dtype,
            parents=parents,
            body_mass=t(mass),
            body_com=t(com),
            body_inertia=t(inertia),
            body_gravity=t(grav_mask),
            gravity=t(g),
            dof_body=ti(dof_body),
            dof_step=ti(dof_step),
            dof_angular_axis=t(ang),
            dof_linear_axis=t(lin),
            dof_is_scalar=torch.as_tensor(scalar, device=device),
            dof_q_index=ti(scalar_q),
            dof_armature=t(arm),
            dof_damping=t(damp),
            dof_friction_coulomb=t(fric),
            dof_friction_stiction=t(stiction),
            dof_friction_falloff=t(np.full(nv, fr.falloff_vel)),
            dof_friction_stribeck=t(np.full(nv, fr.stribeck_vel)),
            dof_friction_group=ti(group),
            dof_lower=t(lower),
            dof_upper=t(upper),
            dof_limit_stiffness=t(klim),
            dof_limit_damping=t(dlim),
            dof_spring_stiffness=t(kspring),
            dof_spring_ref=t(spring_ref),
            dof_drive_stiffness=t(kp),
            dof_drive_damping=t(kd),
            dof_effort_limit=t(effort),
            dof_moves_body=t(moves),
            subtree=t(anc),
            dof_above=t(above),
            dof_above_strict=t(above & (dof_body[:, None] != dof_body[None, :])),
            dof_below=t(above.T),
            dof_coupled=t(coupled),
            dof_frame=t(frame),
            contact_point_body=ti(cdata["point_body"]),
            contact_point_local=t(cdata["local"]).reshape(-1, 3),
            contact_radius=t(cdata["radius"]),
            contact_friction=t(cdata["friction"]),
            contact_point_geom=cdata["point_geom"],
            contact=contact,
            skipped_geoms=cdata["skipped"],
            collision_filter_pairs=filter_pairs,
            self_geom_body=ti(sdata["body"]),
            self_geom_center=t(sdata["center"]).reshape(-1, 3),
            self_geom_axis=t(sdata["axis"]).reshape(-1, 3),
            self_geom_radius=t(sdata["radius"]),
            self_geom_names=sdata["names"],
            self_pair_geom=ti(sdata["pairs"]).reshape(-1, 2),
            self_pair_names=sdata["pair_names"],
            coupling_matrix=t(coup["matrix"]),
            coupling_lower=t(coup["lower"]),
            coupling_upper=t(coup["upper"]),
            coupling_stiffness=t(coup["stiffness"]),
            coupling_damping=t(coup["damping"]),
            coupling_names=coup["names"],
            has_ball_friction=has_ball_friction,
            constraints=rows,
            mimic_matrix=t(hard["matrix"]) if hard["names"] else None,
            mimic_bias=t(hard["bias"]) if hard["names"] else None,
            mimic_names=hard["names"],
        )
        if mimic_natural_frequency is not None:
            model = with_compliant_mimics(model, soft_desc, mimic_natural_frequency, mimic_damping_ratio)
        return model

    # -- helpers ------------------------------------------------------------------------------------------
    def with_joint_friction(self, coulomb, *, stiction_extra: float = 0.0) -> Model:
        """A model with Coulomb joint friction ``coulomb`` (N m or N; scalar or ``[nv]``) and ``stiction_extra``
        on the DOFs that have friction; every other tensor is shared and the step cache rebuilt (the
        reference's ``SetArticulatedJointFrictionParams``; a simulator picks it up through
        :func:`kangengine.sim.runtime.set_joint_friction`)."""
        c = self._dof_values(coulomb, "coulomb")
        stiction = torch.where(c > 0, float(stiction_extra), 0.0).to(c.dtype)
        return dataclasses.replace(self, dof_friction_coulomb=c, dof_friction_stiction=stiction)

    def with_joint_inertia(self, armature) -> Model:
        """A model with joint inertia ``armature`` (kg m^2 or kg; scalar or ``[nv]``), as
        :meth:`with_joint_friction` (``SetArticulatedJointInertiaParams``)."""
        return dataclasses.replace(self, dof_armature=self._dof_values(armature, "armature"))

    def _dof_values(self, values, what: str) -> torch.Tensor:
        x = torch.as_tensor(values, dtype=self.dtype, device=self.device)
        x = x.expand(self.nv).clone() if x.dim() == 0 else x
        if tuple(x.shape) != (self.nv,) or not bool(torch.isfinite(x).all()) or bool((x < 0).any()):
            raise ShapeError(
                f"expected a scalar or [{self.nv}] finite values >= 0, got shape {tuple(x.shape)}",
                path=self.layout.source,
                item=what,
            )
        return x

    def check_state(self, q: torch.Tensor, qd: torch.Tensor | None = None) -> None:
        """Raise :class:`ShapeError` unless ``q [W, nq]`` (and ``qd [W, nv]``) match the model's sizes,
        dtype and device."""
        for name, x, n in (("q", q, self.nq), ("qd", qd, self.nv)):
            if x is None:
                continue
            if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[-1] != n:
                shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
                raise ShapeError(
                    f"expected a torch tensor [worlds, {n}], got {shape}", path=self.layout.source, item=name
                )
            if x.dtype != self.dtype or x.device != self.device:
                raise ShapeError(
                    f"expected {self.dtype} on {self.device}, got {x.dtype} on {x.device}",
                    path=self.layout.source,
                    item=name,
                )


@dataclass(frozen=True, eq=False)
class StepCache:
    """Layouts of a :class:`Model`'s constants that the step's component-wise maths reads (columns and
    per-component tuples broadcast against ``[n, W]`` tensors, worlds innermost), built from the model by
    :meth:`from_model`; nothing here is new information.

    Attributes:
        gravity_t: ``(g_x, g_y, g_z)`` floats, m/s^2 (world).
        uniform_gravity: gravity acts on every body (``body_gravity`` is 1 everywhere).
        body_mass_c, body_gravity_c: ``[B, 1]`` columns of ``body_mass`` and ``body_gravity``.
        body_com_t: 3 x ``[B, 1]`` the components of ``body_com``.
        body_inertia_t: 6 x ``[B, 1]`` the entries xx, xy, xz, yy, yz, zz of ``body_inertia``.
        body_levels: per tree depth 1, 2, ... the ``(bodies, their parents)`` long tensors, for sums along
            the tree level by level.
        dof_is_angular_c, dof_is_linear_c: ``[nv, 1]`` 1.0 where the DOF has an angular (linear) motion
            axis.
        contact_point_local_t: 3 x ``[C, 1]`` the components of ``contact_point_local``.
        contact_radius_c: ``[C, 1]`` column of ``contact_radius``.
        self_geom_center_t, self_geom_axis_t: 3 x ``[G, 1]`` the components of ``self_geom_center`` and
            ``self_geom_axis``; self_geom_radius_c: ``[G, 1]`` column of ``self_geom_radius``.
    """

    gravity_t: tuple[float, float, float]
    uniform_gravity: bool
    body_mass_c: torch.Tensor
    body_gravity_c: torch.Tensor
    body_com_t: tuple[torch.Tensor, ...]
    body_inertia_t: tuple[torch.Tensor, ...]
    body_levels: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    dof_is_angular_c: torch.Tensor
    dof_is_linear_c: torch.Tensor
    contact_point_local_t: tuple[torch.Tensor, ...]
    contact_radius_c: torch.Tensor
    self_geom_center_t: tuple[torch.Tensor, ...] = ()
    self_geom_axis_t: tuple[torch.Tensor, ...] = ()
    self_geom_radius_c: torch.Tensor | None = None

    @classmethod
    def from_model(cls, model: Model) -> StepCache:
        """The cache of ``model`` (reads its tensors once; on CUDA this waits for them)."""
        col = lambda x: x[:, None].contiguous()
        comps = lambda x, k: tuple(x[:, i : i + 1].contiguous() for i in range(k))
        ti = lambda a: torch.as_tensor(np.array(a, dtype=np.int64), device=model.device)
        inertia = model.body_inertia
        pairs = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))
        return cls(
            gravity_t=tuple(float(x) for x in model.gravity.tolist()),
            uniform_gravity=bool(torch.all(model.body_gravity == 1.0)),
            body_mass_c=col(model.body_mass),
            body_gravity_c=col(model.body_gravity),
            body_com_t=comps(model.body_com, 3),
            body_inertia_t=tuple(col(inertia[:, a, b]) for a, b in pairs),
            body_levels=_body_levels(model.parents, ti),
            dof_is_angular_c=col(model.dof_angular_axis.abs().sum(1) > 0).to(model.dtype),
            dof_is_linear_c=col(model.dof_linear_axis.abs().sum(1) > 0).to(model.dtype),
            contact_point_local_t=comps(model.contact_point_local, 3),
            contact_radius_c=col(model.contact_radius),
            self_geom_center_t=comps(model.self_geom_center, 3) if model.self_geom_center is not None else (),
            self_geom_axis_t=comps(model.self_geom_axis, 3) if model.self_geom_axis is not None else (),
            self_geom_radius_c=col(model.self_geom_radius) if model.self_geom_radius is not None else None,
        )


@dataclass(frozen=True, eq=False)
class State:
    """Simulation state of ``W`` worlds.

    Attributes:
        q: ``[W, nq]`` generalized coordinates (m, rad, WXYZ quaternions), the layout's convention, so an
            :class:`~kangengine.animation.ArticulationMotion` frame is a state.
        qd: ``[W, nv]`` generalized velocities, canonical tangent convention.
        frozen: ``[W]`` bool: worlds whose state became non-finite; they keep their last finite state and
            are no longer advanced (clear the flag to resume a world after resetting it).
        energy_budget: ``[W]`` J or ``None``: the mechanical energy (kinetic plus gravitational) this state
            should hold, set by the step that produced it: the energy at that step's start plus the work its
            non-conservative and external forces did over the step (at the mean velocity). The next step
            scales the velocities of each world to meet it (removing the spurious energy of explicit gravity
            and Coriolis forces; see :class:`~kangengine.sim.Simulator` ``energy_correction``). ``None`` for
            a state built from coordinates; after editing ``q`` or ``qd`` of a stepped state, rebuild it
            (or drop the budget) so the edit is not undone.
    """

    q: torch.Tensor
    qd: torch.Tensor
    frozen: torch.Tensor
    energy_budget: torch.Tensor | None = None

    @property
    def num_worlds(self) -> int:
        return int(self.q.shape[0])

    @classmethod
    def from_q(cls, model: Model, q, qd=None) -> State:
        """A state from coordinates ``q [W, nq]`` or ``[nq]`` (any array) and optional velocities
        ``qd [W, nv]`` (zero when omitted), cast to the model's dtype and device."""
        qt = torch.as_tensor(
            np.asarray(q) if not isinstance(q, torch.Tensor) else q, dtype=model.dtype, device=model.device
        )
        if qt.ndim == 1:
            qt = qt[None]
        if qd is None:
            qdt = torch.zeros(qt.shape[0], model.nv, dtype=model.dtype, device=model.device)
        else:
            qdt = torch.as_tensor(
                np.asarray(qd) if not isinstance(qd, torch.Tensor) else qd, dtype=model.dtype, device=model.device
            )
            if qdt.ndim == 1:
                qdt = qdt[None].expand(qt.shape[0], -1)
        model.check_state(qt, qdt)
        if qdt.shape[0] != qt.shape[0]:
            raise ShapeError(
                f"q has {qt.shape[0]} worlds but qd has {qdt.shape[0]}", path=model.layout.source, item="qd"
            )
        frozen = torch.zeros(qt.shape[0], dtype=torch.bool, device=model.device)
        return cls(q=qt.contiguous(), qd=qdt.contiguous(), frozen=frozen)

    @classmethod
    def neutral(cls, model: Model, num_worlds: int = 1) -> State:
        """``num_worlds`` copies of the modelled pose (``layout.neutral()``) at rest."""
        q = np.tile(model.layout.neutral(), (num_worlds, 1))
        return cls.from_q(model, q)

    @classmethod
    def from_motion(cls, model: Model, motion, frame=0) -> State:
        """The state of an :class:`~kangengine.animation.ArticulationMotion` at ``frame`` (an int, or an
        ``[W]`` index array giving one world per entry)."""
        idx = np.atleast_1d(np.asarray(frame, dtype=np.int64))
        q = np.asarray(motion.q)[idx]
        qd = np.asarray(motion.qd)[idx]
        return cls.from_q(model, q, qd)


# -- helpers -----------------------------------------------------------------------------------------------


def read_effort_limits(path) -> dict[str, float]:
    """Per-joint effort limits from a JSON file, for ``Model.from_desc(..., effort_limit=...)``.

    The file holds a mapping from joint (or DOF) names to limits, N m for hinges and N for slides, either
    as the whole document or under an ``"effort_limit"`` key (with any other keys, e.g. ``"source"``,
    ignored). The shipped ``kangengine.data.CMU_HUMANOID_TRACKING_EFFORT`` is such a file: dm_control's
    tracking walker's force ranges for the suite CMU humanoid. Names are checked against the model by
    ``from_desc``.

    Returns:
        ``{name: limit}`` (floats, each finite or ``inf``, > 0).
    Raises:
        FileMissingError, FormatError: no such file, not JSON, not a mapping of names to positive numbers.
    """
    from .._files import read_json

    doc = read_json(path, kind="effort-limit file")
    table = doc.get("effort_limit", doc) if isinstance(doc, dict) else doc
    if not isinstance(table, dict) or not table:
        raise FormatError(
            "expected a mapping of joint names to effort limits (N m or N)", path=path, item="effort_limit"
        )
    out = {}
    for name, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (float(v) > 0):
            raise FormatError(f"effort limit {v!r}; expected a number > 0 (N m or N)", path=path, item=str(name))
        out[str(name)] = float(v)
    return out


def _body_levels(parents: Sequence[int], ti) -> tuple:
    depth = [0] * len(parents)
    for b, p in enumerate(parents):  # parents come first
        depth[b] = depth[p] + 1 if p >= 0 else 0
    levels = []
    for d in range(1, max(depth, default=0) + 1):
        bodies = [b for b in range(len(parents)) if depth[b] == d]
        levels.append((ti(bodies), ti([parents[b] for b in bodies])))
    return tuple(levels)


def _body_index(desc: ArticulationDesc, name: str) -> int:
    return desc.body_index(name)


def _dof_keys(layout: ArticulationCoordinateLayout) -> dict[str, list[int]]:
    keys: dict[str, list[int]] = {}
    for blk in layout.blocks:
        if blk.qd_dim:
            keys.setdefault(blk.joint_name, []).extend(range(blk.qd_offset, blk.qd_offset + blk.qd_dim))
    for d, n in enumerate(layout.dof_names):
        keys.setdefault(n, [d])
    return keys


def _per_dof(value: PerDof, default: np.ndarray, names: dict, nv: int, what: str, src, scalar_mask) -> np.ndarray:
    out = np.array(default, dtype=np.float64, copy=True)
    if value is None:
        return out
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k not in names:
                raise UnknownNameError(
                    f"{what}: no joint or DOF {k!r}; names are: {', '.join(names)}", path=src, item=what
                )
            out[names[k]] = float(v)
        return out
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        return np.where(scalar_mask, float(arr), out)
    if arr.shape != (nv,):
        raise ShapeError(
            f"{what} has shape {arr.shape}; expected a scalar, [{nv}] or a name mapping", path=src, item=what
        )
    return arr.copy()


def _geom_points(g) -> list[tuple[np.ndarray, float]] | None:
    """Contact spheres (point in the geom frame, radius) of a geom, or None when unsupported."""
    s = g.size
    if g.type is GeomType.SPHERE:
        return [(np.zeros(3), float(s[0]))]
    if g.type is GeomType.CAPSULE:
        return [(np.array([0.0, 0.0, -s[1]]), float(s[0])), (np.array([0.0, 0.0, s[1]]), float(s[0]))]
    if g.type is GeomType.BOX:
        return [(np.array([x * s[0], y * s[1], z * s[2]]), 0.0) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
    if g.type is GeomType.CYLINDER:  # two rims of 8 points: exact flat on the ground, polygonal on its side
        ang = np.arange(8) * (np.pi / 4)
        return [(np.array([s[0] * np.cos(a), s[0] * np.sin(a), z * s[1]]), 0.0) for z in (-1, 1) for a in ang]
    if g.type is GeomType.ELLIPSOID:  # 14 surface points: the 6 axis ends and 8 diagonal directions
        dirs = [np.eye(3)[i] * sgn for i in range(3) for sgn in (-1, 1)]
        dirs += [np.array([x, y, z]) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
        return [(d / np.sqrt(np.sum((d / s) ** 2)), 0.0) for d in dirs]
    return None


def _contact_points(desc: ArticulationDesc, contact: ContactParams) -> dict:
    planes = [g for g in desc.geoms if g.body < 0 and g.type is GeomType.PLANE]
    per_body: dict[int, list] = {}
    skipped = []
    for g in desc.geoms:
        if g.body < 0 or not g.collides:
            continue
        if planes and not any((g.contype & p.conaffinity) or (p.contype & g.conaffinity) for p in planes):
            continue
        pts = _geom_points(g)
        if pts is None:
            skipped.append(g.name)
            continue
        if contact.friction is not None:
            mu = float(contact.friction)
        else:
            mu = max([float(g.friction[0])] + [float(p.friction[0]) for p in planes])
        rot = R.quat_to_matrix(np.asarray(g.quat_wxyz, dtype=np.float64))
        for p, r in pts:
            per_body.setdefault(g.body, []).append((g.pos + rot @ p, r, mu, g.name))
    if skipped:
        warnings.warn(
            f"{desc.source or desc.name}: collision geoms of unsupported type are not simulated "
            f"(sphere, capsule, box, cylinder and ellipsoid are): {', '.join(skipped)}",
            stacklevel=3,
        )
    bodies = sorted(per_body) if contact.enabled else []
    pts = [(b, *item) for b in bodies for item in per_body[b]]
    return {
        "point_body": np.array([p[0] for p in pts], dtype=np.int64),
        "local": np.array([p[1] for p in pts], dtype=np.float64).reshape(-1, 3),
        "radius": np.array([p[2] for p in pts], dtype=np.float64),
        "friction": np.array([p[3] for p in pts], dtype=np.float64),
        "point_geom": tuple(p[4] for p in pts),
        "skipped": tuple(skipped),
    }


_MIMIC_MODES = ("hard", "compliant")


def _split_mimics(desc, mimic, compliant_given: bool) -> tuple[tuple, tuple]:
    """``desc.mimics`` split into the hard and the compliant ones by ``Model.from_desc``'s ``mimic``."""
    default = "compliant" if compliant_given else "hard"
    per = {}
    if isinstance(mimic, str) or mimic is None:
        default = default if mimic is None else mimic
    else:
        per = dict(mimic)
        names = {mm.joint for mm in desc.mimics}
        for name in per:
            if name not in names:
                raise UnknownNameError(
                    f"mimic= names joint {name!r}, which mimics no other; mimic joints are: "
                    f"{', '.join(sorted(names)) or '(none)'}",
                    path=desc.source,
                    item=f"mimic {name}",
                )
    for name, mode in [("mimic", default)] + list(per.items()):
        if mode not in _MIMIC_MODES:
            raise UnknownNameError(
                f"mimic mode of {name!r} must be one of {', '.join(map(repr, _MIMIC_MODES))}, got {mode!r}",
                path=desc.source,
                item=f"mimic {name}",
            )
    hard = tuple(mm for mm in desc.mimics if per.get(mm.joint, default) == "hard")
    soft = tuple(mm for mm in desc.mimics if per.get(mm.joint, default) != "hard")
    return hard, soft


def _hard_mimic_rows(desc, layout, mimics) -> dict:
    """``r = q_joint - multiplier q_leader - offset`` rows ``[M, nv]`` and biases ``[M]`` of hard mimic joints;
    one naming a joint without a hinge/slide DOF is refused (a hard constraint cannot be dropped quietly)."""
    matrix, bias = mimic_rows(desc, layout, mimics, kind="hard mimic")
    followers = [mm.joint for mm in mimics]
    if len(set(followers)) != len(followers):
        dup = sorted({j for j in followers if followers.count(j) > 1})
        raise TopologyError(
            f"joint(s) {', '.join(dup)} mimic more than one leader: hard mimic rows must be independent",
            path=desc.source,
            item=f"mimic {dup[0]}",
        )
    return {"matrix": matrix, "bias": bias, "names": tuple(f"mimic {mm.joint}" for mm in mimics)}


def _couplings(desc, layout, k_tendon, d_tendon, k_mimic, d_mimic) -> dict:
    """Rows of fixed-tendon limits and mimic springs over the hinge/slide DOFs; couplings that name a joint
    the layout has no scalar DOF for are skipped with a warning."""
    dof = {b.joint_name: b.qd_offset for b in layout.blocks if b.joint_type in (JointType.HINGE, JointType.SLIDE)}
    out = {"matrix": [], "lower": [], "upper": [], "stiffness": [], "damping": [], "names": []}
    skipped = []

    def add(name, coefs, lo, hi, k, d):
        row = np.zeros(layout.nv)
        for j, c in coefs:
            row[dof[j]] += c
        for key, val in (
            ("matrix", row),
            ("lower", lo),
            ("upper", hi),
            ("stiffness", k),
            ("damping", d),
            ("names", name),
        ):
            out[key].append(val)

    for t in desc.tendons:
        if t.range is None:
            continue
        if not all(j in dof for j in t.joints):
            skipped.append(t.name)
            continue
        add(t.name, list(zip(t.joints, t.coefficients)), t.range[0], t.range[1], k_tendon, d_tendon)
    for mm in desc.mimics:
        if mm.joint not in dof or mm.leader not in dof:
            skipped.append(f"mimic {mm.joint}")
            continue
        # joint = multiplier * leader + offset, in joint values q (MuJoCo qpos)
        add(f"mimic {mm.joint}", [(mm.joint, 1.0), (mm.leader, -mm.multiplier)], mm.offset, mm.offset, k_mimic, d_mimic)
    if skipped:
        warnings.warn(
            f"{desc.source or desc.name}: couplings over joints without a hinge/slide DOF are not simulated: "
            f"{', '.join(skipped)}",
            stacklevel=3,
        )
    nv = layout.nv
    return {
        "matrix": np.array(out["matrix"], dtype=np.float64).reshape(-1, nv),
        "lower": np.array(out["lower"], dtype=np.float64),
        "upper": np.array(out["upper"], dtype=np.float64),
        "stiffness": np.array(out["stiffness"], dtype=np.float64),
        "damping": np.array(out["damping"], dtype=np.float64),
        "names": tuple(out["names"]),
    }


def _self_segment(g) -> tuple[np.ndarray, float] | None:
    """Half-segment vector (geom frame) and radius of a geom as a capsule, or None (meshes, planes)."""
    s = np.asarray(g.size, dtype=np.float64)
    if g.type is GeomType.SPHERE:
        return np.zeros(3), float(s[0])
    if g.type in (GeomType.CAPSULE, GeomType.CYLINDER):
        return np.array([0.0, 0.0, float(s[1])]), float(s[0])
    if g.type in (GeomType.BOX, GeomType.ELLIPSOID):  # the capsule along the longest axis
        k = int(np.argmax(s[:3]))
        r = float(max(s[i] for i in range(3) if i != k))
        axis = np.zeros(3)
        axis[k] = max(float(s[k]) - r, 0.0)
        return axis, r
    return None


def _filtered_by_layers(desc: ArticulationDesc, filter_pairs, layers, layer_contacts, overrides):
    """The filter pairs after contact layers and per-pair overrides, and the pairs an override enables
    (``frozenset`` of two body names each)."""
    names = desc.body_names
    for what, mapping in (("contact_layers", layers or {}), ("contact_overrides", overrides or {})):
        for key in mapping:
            for n in (key,) if isinstance(key, str) else key:
                if n not in names:
                    raise UnknownNameError(
                        f"{what}: no link {n!r}; links are: {', '.join(names)}", path=desc.source, item=what
                    )
    skip = {frozenset(p) for p in filter_pairs}
    if layer_contacts:
        layer = {n: (layers or {}).get(n, "default") for n in names}
        off = {frozenset(k) for k, on in layer_contacts.items() if not on}
        on = {frozenset(k) for k, on in layer_contacts.items() if on}
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                key = frozenset((layer[a], layer[b]))
                if key in off and key not in on:
                    skip.add(frozenset((a, b)))
    forced = set()
    for (a, b), on in (overrides or {}).items():
        pair = frozenset((a, b))
        if on:
            skip.discard(pair)
            forced.add(pair)
        else:
            skip.add(pair)
            forced.discard(pair)
    return tuple(sorted(tuple(sorted(p)) for p in skip if len(p) == 2)), forced


def _self_contact(desc: ArticulationDesc, filter_pairs, contact: ContactParams, forced=frozenset()) -> dict:
    """Segment geoms and the pairs that may collide (see ``ContactParams.self_collision``); ``forced`` body
    pairs collide whatever their geoms' masks say."""
    body, center, axis, radius, names, masks = [], [], [], [], [], []
    if contact.self_collision:
        for g in desc.geoms:
            if g.body < 0 or not g.collides:
                continue
            seg = _self_segment(g)
            if seg is None:
                continue
            rot = R.quat_to_matrix(np.asarray(g.quat_wxyz, dtype=np.float64))
            body.append(g.body)
            center.append(np.asarray(g.pos, dtype=np.float64))
            axis.append(rot @ seg[0])
            radius.append(seg[1])
            names.append(g.name)
            masks.append((int(g.contype), int(g.conaffinity)))
    bodies = desc.body_names
    skip = {frozenset(p) for p in filter_pairs}
    pairs = []
    for a in range(len(body)):
        for b in range(a + 1, len(body)):
            if body[a] == body[b] or frozenset((bodies[body[a]], bodies[body[b]])) in skip:
                continue
            masked = not ((masks[a][0] & masks[b][1]) or (masks[b][0] & masks[a][1]))
            if masked and frozenset((bodies[body[a]], bodies[body[b]])) not in forced:
                continue
            pairs.append((a, b))
    return {
        "body": np.array(body, dtype=np.int64),
        "center": np.array(center, dtype=np.float64).reshape(-1, 3),
        "axis": np.array(axis, dtype=np.float64).reshape(-1, 3),
        "radius": np.array(radius, dtype=np.float64),
        "names": tuple(names),
        "pairs": np.array(pairs, dtype=np.int64).reshape(-1, 2),
        "pair_names": tuple((names[a], names[b]) for a, b in pairs),
    }


def _collision_filter(desc: ArticulationDesc) -> tuple[tuple[str, str], ...]:
    """Body pairs that never collide: parent-child (MuJoCo's rule, on weld groups), links welded by fixed
    joints (no DOF) or joined through a link without collision geometry, and the file's exclusions
    (reference: contact filter)."""
    nb = len(desc.bodies)
    has_geom = np.zeros(nb, dtype=bool)
    for g in desc.geoms:
        if g.body >= 0 and g.collides:
            has_geom[g.body] = True
    # rigid groups: a body without joints is welded to its parent
    group = list(range(nb))
    for b, body in enumerate(desc.bodies):
        if body.parent >= 0 and not body.joints:
            group[b] = group[body.parent]
    pairs: set[tuple[int, int]] = set()

    def add(a, b):
        if a != b:
            pairs.add((min(a, b), max(a, b)))

    for b, body in enumerate(desc.bodies):
        p = body.parent
        if p < 0:
            continue
        add(b, p)
        # through shapeless links: every body reachable from b over shapeless ancestors
        a = p
        while a >= 0 and not has_geom[a] and desc.bodies[a].parent >= 0:
            a = desc.bodies[a].parent
            add(b, a)
    # MuJoCo's parent filter acts on weld groups: a link is not tested against the group its own group hangs
    # from (a head welded to the torso never touches the upper arms hinged to that torso)
    # (the group of a root without joints is the world's, which MuJoCo's filter leaves out)
    up = [group[desc.bodies[group[b]].parent] if desc.bodies[group[b]].parent >= 0 else -1 for b in range(nb)]
    up = [-1 if u >= 0 and desc.bodies[u].parent < 0 and not desc.bodies[u].joints else u for u in up]
    for a in range(nb):
        for b in range(a + 1, nb):
            if group[a] == group[b] or up[a] == group[b] or up[b] == group[a]:
                add(a, b)
    names = desc.body_names
    for n1, n2 in desc.contact_exclusions:
        add(names.index(n1), names.index(n2))
    return tuple(sorted((names[a], names[b]) for a, b in pairs))

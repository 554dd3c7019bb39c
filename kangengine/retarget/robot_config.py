"""`RobotRetargetConfig`: how a human skeleton's motion is put onto a robot (read from JSON, checked on load).

A configuration names the robot model file (relative to the configuration file), the model's layout
signature (a configuration written for one model refuses another), the source-body -> robot-body
correspondences with their weights and local offsets, the scale, the feet with their sole points, the
ground height and the heading alignment. The JSON layout (see ``configs/cmu_bvh_to_g1.json``)::

    {
      "name": "cmu_bvh_to_g1",
      "target_model": "relative/or/absolute/path/to/model.xml",
      "model_signature": "487073a8514741e4",
      "source_to_robot_rotation_wxyz": [1, 0, 0, 0],
      "scale": "auto" | 0.75 | {"default": "auto", "bodies": {"left_wrist_yaw_link": 0.9}},
      "ground_height": 0.0,
      "heading_alignment": {"mode": "none" | "initial", "left": ["LeftUpLeg|LeftHip"], "right": [...]},
      "bodies": [{"robot": "pelvis", "source": "Hips", "position_weight": 1.0,
                  "orientation_weight": 1.0, "offset": [0, 0, 0]}, ...],
      "feet": [{"robot": "left_ankle_roll_link", "source_heel": "LeftFoot|LeftAnkle",
                "source_toe": "LeftToeBase|LeftToe", "sole_points": [[x, y, z], ...]}],
      "contact": {"height_threshold": 0.04, "speed_threshold": 0.6, ...},
      "solver": {"iterations": 3, "smoothness_weight": 1.0, ...}
    }

A source name may list alternatives separated by ``|`` (the cgspeed and 3dsMax releases of the CMU BVH
name the same joint differently); the first one the source skeleton has is used, in order.

``"extends": "cmu_bvh_to_g1"`` (a shipped configuration name, or a ``.json`` path relative to this file) takes
every key of that configuration and replaces the top-level keys this file gives (``name``, ``description``,
``target_model``, ``model_signature``, ``bodies``, ...): a variant for another model file of the same robot
(the URDF, the mesh MJCF) or another source of the same skeleton is a few lines.

**Where the robot model is found** (:meth:`RobotRetargetConfig.target_model_path`), first match wins:

1. the ``model=`` argument of :func:`load_robot_config` / :func:`retarget_to_robot` (the CLI's ``MODEL``);
2. ``target_model`` as an absolute path, or relative to the folder of the configuration file that set it
   (the shipped G1 configurations name the G1 MJCF shipped in ``kangengine/data/unitree_g1``);
3. each folder of the environment variable ``KANGENGINE_MODEL_PATH`` (folders separated by ``os.pathsep``),
   first joined with ``target_model`` as written, then with its file name alone.

When none exists, :class:`~kangengine.errors.FileMissingError` names the configuration, the file and every
place searched. The mesh MJCF and the URDF of the G1 are third-party files too large (meshes) to ship; their
configurations are found this way.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._files import read_json
from ..errors import FileMissingError, FormatError, LayoutMismatch, UnknownNameError

__all__ = [
    "BodyCorrespondence",
    "FootSpec",
    "ContactOptions",
    "SolverOptions",
    "HeadingAlignment",
    "RobotRetargetConfig",
    "load_robot_config",
    "list_robot_configs",
    "resolve_source_name",
    "MODEL_PATH_ENV",
]

_CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_HEADING_MODES = ("none", "initial")
#: environment variable: folders (``os.pathsep``-separated) searched for a configuration's ``target_model``
MODEL_PATH_ENV = "KANGENGINE_MODEL_PATH"
_MAX_EXTENDS = 8


def resolve_source_name(spec: str, names, *, item: str, path=None) -> int:
    """Index in ``names`` of the first of the ``|``-separated alternatives in ``spec`` that exists.

    Raises:
        UnknownNameError: none exists; the message lists the source skeleton's names.
    """
    names = list(names)
    for alt in spec.split("|"):
        if alt in names:
            return names.index(alt)
    raise UnknownNameError(f"no source body {spec!r}; source bodies are: {', '.join(names)}", path=path, item=item)


def _vec(value, n: int, item: str, path) -> tuple[float, ...]:
    try:
        v = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        v = ()
    if len(v) != n or not all(math.isfinite(x) for x in v):
        raise FormatError(f"is {value!r}; expected {n} finite numbers", path=path, item=item)
    return v


def _number(value, item: str, path, *, lo: float = 0.0, strict: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < lo or (strict and x <= lo):
        raise FormatError(f"is {value!r}; expected a number {'>' if strict else '>='} {lo}", path=path, item=item)
    return x


def _keys(d, allowed, item: str, path, required=()) -> None:
    if not isinstance(d, Mapping):
        raise FormatError(f"is {type(d).__name__}; expected a JSON object", path=path, item=item)
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise FormatError(f"unknown keys {unknown}; valid keys are: {', '.join(allowed)}", path=path, item=item)
    for k in required:
        if k not in d:
            raise FormatError(f"missing key {k!r}; valid keys are: {', '.join(allowed)}", path=path, item=item)


@dataclass(frozen=True)
class BodyCorrespondence:
    """One key-body task: the robot point ``world_from_body(robot) * offset`` follows the scaled source body.

    Attributes:
        robot: robot body name.
        source: source body name (``|`` separates alternatives).
        position_weight: weight of the position residual (m).
        orientation_weight: weight of the orientation residual (rad); the target is the source body's world
            rotation relative to its reference pose, applied to the robot body's rest (neutral) world rotation.
        offset: ``[3]`` m, the task point in the robot body frame.
        orientation_reference: which source pose the robot's neutral rotation stands for: ``"rest"`` (the
            source skeleton's rest pose) or ``"standing"`` (a foot: the source foot standing flat in the clip,
            calibrated per clip from its planted frames so that a flat source foot asks for a flat robot sole
            at the source foot's heel-to-toe heading; the robot body must be one of ``feet``).
    """

    robot: str
    source: str
    position_weight: float = 1.0
    orientation_weight: float = 0.0
    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    orientation_reference: str = "rest"

    _KEYS = ("robot", "source", "position_weight", "orientation_weight", "offset", "orientation_reference")
    _REFERENCES = ("rest", "standing")

    @classmethod
    def from_dict(cls, d, *, item: str, path=None) -> BodyCorrespondence:
        _keys(d, cls._KEYS, item, path, required=("robot", "source"))
        ref = d.get("orientation_reference", "rest")
        if ref not in cls._REFERENCES:
            raise FormatError(
                f"is {ref!r}; valid choices are: {', '.join(cls._REFERENCES)}",
                path=path,
                item=f"{item}.orientation_reference",
            )
        return cls(
            robot=str(d["robot"]),
            source=str(d["source"]),
            position_weight=_number(d.get("position_weight", 1.0), f"{item}.position_weight", path),
            orientation_weight=_number(d.get("orientation_weight", 0.0), f"{item}.orientation_weight", path),
            offset=_vec(d.get("offset", (0.0, 0.0, 0.0)), 3, f"{item}.offset", path),
            orientation_reference=str(ref),
        )


@dataclass(frozen=True)
class FootSpec:
    """A robot foot and the source joints its contacts are read from.

    Attributes:
        robot: robot foot body name.
        source_heel: source joint whose height and speed say the heel is down (the ankle in the CMU BVH).
        source_toe: source joint for the toe (``None``: heel only).
        sole_points: ``[points, 3]`` m, the sole in the foot frame (its lowest points; the corners of a
            flat sole). In a contact phase they are held on the ground at one place, the sole flat.
    """

    robot: str
    source_heel: str
    source_toe: str | None
    sole_points: tuple[tuple[float, float, float], ...]

    _KEYS = ("robot", "source_heel", "source_toe", "sole_points", "sole_box")

    @classmethod
    def from_dict(cls, d, *, item: str, path=None) -> FootSpec:
        _keys(d, cls._KEYS, item, path, required=("robot", "source_heel"))
        if "sole_points" in d:
            pts = d["sole_points"]
            if not isinstance(pts, list) or not pts:
                raise FormatError(f"is {pts!r}; expected a list of [x, y, z]", path=path, item=f"{item}.sole_points")
            sole = tuple(_vec(p, 3, f"{item}.sole_points[{i}]", path) for i, p in enumerate(pts))
        elif "sole_box" in d:
            box = d["sole_box"]
            _keys(box, ("min_xy", "max_xy", "z"), f"{item}.sole_box", path, required=("min_xy", "max_xy", "z"))
            lo = _vec(box["min_xy"], 2, f"{item}.sole_box.min_xy", path)
            hi = _vec(box["max_xy"], 2, f"{item}.sole_box.max_xy", path)
            z = float(box["z"])
            sole = ((lo[0], lo[1], z), (lo[0], hi[1], z), (hi[0], lo[1], z), (hi[0], hi[1], z))
        else:
            raise FormatError("missing 'sole_points' (or 'sole_box')", path=path, item=item)
        toe = d.get("source_toe")
        return cls(str(d["robot"]), str(d["source_heel"]), None if toe is None else str(toe), sole)


@dataclass(frozen=True)
class ContactOptions:
    """How contact phases are read from the source (source heights in m after scaling, speeds in m/s).

    Attributes:
        height_threshold: a heel/toe joint is down when it is less than this above its own standing height
            (its 5th-percentile height over the clip).
        speed_threshold: ... and moves slower than this (horizontal speed).
        min_phase_s: phases shorter than this are dropped; gaps shorter than this are closed.
        blend_s: the contact weight ramps over this time before and after a phase (smooth transitions).
    """

    height_threshold: float = 0.04
    speed_threshold: float = 0.3
    min_phase_s: float = 0.05
    blend_s: float = 0.08

    @classmethod
    def from_dict(cls, d, *, path=None) -> ContactOptions:
        d = {} if d is None else d
        names = tuple(cls.__dataclass_fields__)
        _keys(d, names, "contact", path)
        return cls(**{k: _number(v, f"contact.{k}", path) for k, v in d.items()})


_INT_SOLVER_KEYS = (
    "iterations",
    "coarse_stride",
    "coarse_iterations",
    "smoothing_iterations",
    "smoothing_reuse",
    "smoothing_filter_only",
    "held_yaw_from_solve",
    "held_pivot",
    "limit_round",
)


@dataclass(frozen=True)
class SolverOptions:
    """Weights and iteration counts of the whole-clip solver (see :mod:`.solver`).

    Attributes:
        iterations: Gauss-Newton iterations on every frame (after the coarse pass).
        coarse_stride, coarse_iterations: the coarse pass solves every ``coarse_stride``-th frame first
            (warm start for the fine pass, interpolated on the manifold).
        damping: Levenberg-Marquardt damping added to the normal equations (per DOF, 1/rad^2).
        smoothness_weight: weight of the pull ``|difference(q, q_smooth)|^2`` towards the low-passed solution
            in the smoothing pass (0: no smoothing pass).
        smoothing_s: standard deviation (s) of the Gaussian low-pass.
        smoothing_iterations: Gauss-Newton iterations of the smoothing pass.
        smoothing_reuse: 1: a one-iteration smoothing pass reuses the fine pass's normal equations (the step
            minimises that pass's quadratic model plus the pull, no new Jacobians: one full linearisation
            fewer per clip); 0: it linearises again at the low-passed solution.
        smoothing_filter_only: 1: the smoothing pass is the low-pass alone, no Gauss-Newton step after it (the
            low-passed solution is the answer; ``smoothing_iterations`` and ``smoothing_reuse`` are then unused).
        contact_weight: weight of the sole points held on the ground during a contact phase.
        held_yaw_from_solve: 0: a held foot keeps the source foot's mean heading over the phase; 1: the coarse
            pass holds the soles' height only (their horizontal place weakly) and each phase's foot is then held
            at the mean heading the robot foot took there (one heading per phase, the legs' choice: the G1 has
            no ankle yaw, its knee can only follow a source knee turning over a straight foot by turning the foot).
        held_pivot: 1: a held foot turns with the source foot within a phase, frame by frame, about its sole
            centre (a pivot or a twist on the spot, without sliding the sole centre); 0: one heading per phase.
        hold_radius_m: m, how far the source heel may wander within a contact phase before the held sole
            follows it by the excess (:func:`.contact.held_sole_targets`).
        key_weight_floor_m, key_weight_peak_m: m, after the coarse pass each key-body point's weight is rescaled
            per frame by its error ``e`` there: ``clamp(key_weight_floor_m / e, 1, 3)`` (small errors count
            more, so the squares weigh like the distances the mean error adds up) times
            ``min(1 + (e / key_weight_peak_m)^2, key_weight_peak_max)`` (the worst frames count more); 0 turns a
            factor off.
        orient_weight_floor_rad, orient_weight_peak_rad: rad, the same rescaling of each orientation task's
            weight by its angle error after the coarse pass; 0 turns a factor off.
        held_orientation_share: the share of a foot's orientation weight kept while its sole is held (0: the
            held sole alone sets the foot's orientation; with a ``"standing"`` orientation reference the
            target of a flat source foot is the held flat sole, so keeping it agrees with the hold).
        held_key_share: the share of a foot's key-body position weights kept while its sole is held (the rest
            is left to the held sole; 1: the foot's key points pull as hard as in swing, so a held foot settles
            between its hold and where the source foot is).
        refine_share: the share of frames (those the fine pass leaves with the highest cost) that get one
            more Gauss-Newton iteration (0: none): solver capacity where it pays, at that share of an iteration.
        ground_weight: weight of the non-penetration penalty of every collision geom.
        posture_weight: weak pull of the joints towards the neutral pose (regularises redundant DOFs).
        posture_joints: ``{joint name: weight}`` (JSON object; kept as ``((name, weight), ...)``), a further
            pull of these joints towards neutral: for DOFs the tasks barely see (the G1's wrists move the wrist
            task point by a few centimetres only), which a weak global pull lets drift onto a limit.
        max_step: largest step of one iteration (rad / m, infinity norm).
        limit_round: 1: each step gets one active-set round on the joint limits (the hinges it would carry past a
            bound are fixed on the bound and the frame's other DOFs solved again): a joint held at its limit no
            longer stalls the rest of its chain (a clamped Newton step is not a descent direction); 0: the step
            is only clamped.
        self_collision_weight: weight of the penalty keeping pairs of the robot's collision capsules apart
            (0: no self-collision avoidance).
        self_collision_margin: m, the clearance kept between two capsules beyond their radii.
    """

    iterations: int = 3
    coarse_stride: int = 4
    coarse_iterations: int = 8
    damping: float = 1e-3
    smoothness_weight: float = 1.0
    smoothing_s: float = 0.02
    smoothing_iterations: int = 2
    smoothing_reuse: int = 0
    smoothing_filter_only: int = 0
    contact_weight: float = 20.0
    held_yaw_from_solve: int = 0
    held_pivot: int = 0
    hold_radius_m: float = 0.02
    key_weight_floor_m: float = 0.0
    key_weight_peak_m: float = 0.0
    key_weight_peak_max: float = 4.0
    orient_weight_floor_rad: float = 0.0
    orient_weight_peak_rad: float = 0.0
    held_orientation_share: float = 0.0
    held_key_share: float = 0.2
    refine_share: float = 0.0
    ground_weight: float = 200.0
    posture_weight: float = 1e-3
    posture_joints: tuple[tuple[str, float], ...] = ()
    max_step: float = 0.5
    limit_round: int = 0
    self_collision_weight: float = 100.0
    self_collision_margin: float = 0.01

    @classmethod
    def from_dict(cls, d, *, path=None) -> SolverOptions:
        d = {} if d is None else d
        names = tuple(cls.__dataclass_fields__)
        _keys(d, names, "solver", path)
        out = {}
        for k, v in d.items():
            if k == "posture_joints":
                if not isinstance(v, Mapping):
                    msg = f"is {v!r}; expected {{joint name: weight}}"
                    raise FormatError(msg, path=path, item="solver.posture_joints")
                out[k] = tuple((str(j), _number(w, f"solver.posture_joints.{j}", path)) for j, w in v.items())
                continue
            x = _number(v, f"solver.{k}", path)
            out[k] = int(x) if k in _INT_SOLVER_KEYS else x
        if out.get("coarse_stride", 1) < 1:
            raise FormatError("is 0; expected an integer >= 1", path=path, item="solver.coarse_stride")
        return cls(**out)


@dataclass(frozen=True)
class HeadingAlignment:
    """How the source's heading is read and aligned.

    Attributes:
        mode: ``"none"``: the robot keeps the source's world heading and position; ``"initial"``: the clip is
            turned about the vertical through its first root position so that it starts facing the robot's
            +X, with the root above the origin.
        left, right: source joints on the left and right of the body (hips, shoulders); the heading is
            ``(left - right) x up`` averaged over the pairs.
    """

    mode: str = "none"
    left: tuple[str, ...] = ()
    right: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d, *, path=None) -> HeadingAlignment:
        d = {} if d is None else d
        _keys(d, ("mode", "left", "right"), "heading_alignment", path, required=("left", "right"))
        mode = str(d.get("mode", "none"))
        if mode not in _HEADING_MODES:
            raise FormatError(
                f"is {mode!r}; valid modes are: {', '.join(_HEADING_MODES)}", path=path, item="heading_alignment.mode"
            )
        left, right = tuple(str(x) for x in d["left"]), tuple(str(x) for x in d["right"])
        if not left or len(left) != len(right):
            raise FormatError(
                f"left {list(left)} and right {list(right)}; expected the same number (>= 1) of joints",
                path=path,
                item="heading_alignment",
            )
        return cls(mode, left, right)


@dataclass(frozen=True, eq=False)
class RobotRetargetConfig:
    """A human -> robot retargeting configuration (see the module docstring for the JSON layout).

    Attributes:
        name, description: what the configuration is for.
        target_model: the robot model file (absolute, or relative to ``config_dir``).
        model_signature: the ``model_signature`` of the robot's layout (free root) the configuration was
            written for; checked on load.
        source_to_robot_rotation_wxyz: ``[4]`` rotation applied to the source world (its facing onto the
            robot's +X) before anything else.
        scale: a number (robot length / source length), ``"auto"`` (leg length of the robot's neutral pose
            over the source's rest pose, root to the lowest foot point), or
            ``{"default": number | "auto", "bodies": {robot body: number}}`` for per-segment scales of the
            body offsets from the root.
        ground_height: m, world height of the floor the robot stands on.
        heading_alignment: :class:`HeadingAlignment`.
        bodies: key-body tasks (:class:`BodyCorrespondence`).
        feet: :class:`FootSpec` per foot.
        contact: :class:`ContactOptions`. solver: :class:`SolverOptions`.
        config_dir: folder of the configuration file (``None``: built in Python).
    """

    name: str
    target_model: str
    bodies: tuple[BodyCorrespondence, ...]
    feet: tuple[FootSpec, ...]
    model_signature: str | None = None
    description: str = ""
    source_to_robot_rotation_wxyz: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)
    scale: object = "auto"
    ground_height: float = 0.0
    heading_alignment: HeadingAlignment = field(default_factory=HeadingAlignment)
    contact: ContactOptions = field(default_factory=ContactOptions)
    solver: SolverOptions = field(default_factory=SolverOptions)
    config_dir: str | None = None

    _KEYS = (
        "name",
        "extends",
        "description",
        "target_model",
        "model_signature",
        "source_to_robot_rotation_wxyz",
        "scale",
        "ground_height",
        "heading_alignment",
        "bodies",
        "feet",
        "contact",
        "solver",
    )

    # -- JSON -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping, *, path=None, config_dir=None) -> RobotRetargetConfig:
        """Build and check the structure (the robot body names are checked by :meth:`check_model`)."""
        _keys(d, cls._KEYS, "config", path, required=("target_model", "bodies", "feet"))
        if "extends" in d:
            raise FormatError("is only read from a file (RobotRetargetConfig.from_json)", path=path, item="extends")
        bodies = d["bodies"]
        if not isinstance(bodies, list) or not bodies:
            raise FormatError(f"is {bodies!r}; expected a non-empty list", path=path, item="bodies")
        feet = d["feet"]
        if not isinstance(feet, list):
            raise FormatError(f"is {feet!r}; expected a list", path=path, item="feet")
        rot = _vec(d.get("source_to_robot_rotation_wxyz", (1, 0, 0, 0)), 4, "source_to_robot_rotation_wxyz", path)
        if abs(math.sqrt(sum(x * x for x in rot)) - 1.0) > 1e-3:
            raise FormatError(f"is {list(rot)}; expected a unit WXYZ quaternion", path=path, item="rotation")
        cfg = cls(
            name=str(d.get("name", "")),
            description=str(d.get("description", "")),
            target_model=str(d["target_model"]),
            model_signature=None if d.get("model_signature") is None else str(d["model_signature"]),
            bodies=tuple(BodyCorrespondence.from_dict(b, item=f"bodies[{i}]", path=path) for i, b in enumerate(bodies)),
            feet=tuple(FootSpec.from_dict(f, item=f"feet[{i}]", path=path) for i, f in enumerate(feet)),
            source_to_robot_rotation_wxyz=rot,
            scale=_check_scale(d.get("scale", "auto"), path),
            ground_height=float(_vec([d.get("ground_height", 0.0)], 1, "ground_height", path)[0]),
            heading_alignment=HeadingAlignment.from_dict(d.get("heading_alignment"), path=path),
            contact=ContactOptions.from_dict(d.get("contact"), path=path),
            solver=SolverOptions.from_dict(d.get("solver"), path=path),
            config_dir=None if config_dir is None else str(config_dir),
        )
        cfg._check_standing_references(path)
        return cfg

    def _check_standing_references(self, path) -> None:
        feet = [f.robot for f in self.feet]
        for i, b in enumerate(self.bodies):
            if b.orientation_reference == "standing" and b.robot not in feet:
                raise FormatError(
                    f"is 'standing' but {b.robot!r} is not a foot; the feet are: {', '.join(feet)}",
                    path=path,
                    item=f"bodies[{i}].orientation_reference",
                )

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> RobotRetargetConfig:
        """Read a configuration file (structure only; see :func:`load_robot_config` for the model checks)."""
        p = Path(path)
        d, model_dir = _read_extended(p)
        return cls.from_dict(d, path=p, config_dir=model_dir)

    def to_dict(self) -> dict:
        """The JSON object layout (round-trips through :meth:`from_dict`)."""
        return {
            "name": self.name,
            "description": self.description,
            "target_model": self.target_model,
            "model_signature": self.model_signature,
            "source_to_robot_rotation_wxyz": list(self.source_to_robot_rotation_wxyz),
            "scale": self.scale,
            "ground_height": self.ground_height,
            "heading_alignment": {
                "mode": self.heading_alignment.mode,
                "left": list(self.heading_alignment.left),
                "right": list(self.heading_alignment.right),
            },
            "bodies": [
                {
                    "robot": b.robot,
                    "source": b.source,
                    "position_weight": b.position_weight,
                    "orientation_weight": b.orientation_weight,
                    "offset": list(b.offset),
                    "orientation_reference": b.orientation_reference,
                }
                for b in self.bodies
            ],
            "feet": [
                {
                    "robot": f.robot,
                    "source_heel": f.source_heel,
                    "source_toe": f.source_toe,
                    "sole_points": f.sole_points,
                }
                for f in self.feet
            ],
            "contact": {k: getattr(self.contact, k) for k in ContactOptions.__dataclass_fields__},
            "solver": {
                k: dict(v) if k == "posture_joints" else v
                for k, v in ((k, getattr(self.solver, k)) for k in SolverOptions.__dataclass_fields__)
            },
        }

    def replace(self, **changes) -> RobotRetargetConfig:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    # -- the model ----------------------------------------------------------------------------------------
    def target_model_candidates(self) -> list[Path]:
        """The places :meth:`target_model_path` looks, in order (see the module docstring)."""
        p = Path(self.target_model)
        if p.is_absolute():
            return [p]
        out = [Path(self.config_dir or _CONFIG_DIR) / p]
        for folder in os.environ.get(MODEL_PATH_ENV, "").split(os.pathsep):
            if folder:
                out += [Path(folder) / p, Path(folder) / p.name]
        return list(dict.fromkeys(out))

    def target_model_path(self) -> Path:
        """The robot model file: ``target_model`` absolute, relative to ``config_dir``, or found in a folder of
        ``KANGENGINE_MODEL_PATH`` (first match).

        Raises:
            FileMissingError: found nowhere; the message lists every place searched and how to give the model.
        """
        places = self.target_model_candidates()
        for p in places:
            if p.is_file():
                return p.resolve()
        raise FileMissingError(
            f"the robot model {self.target_model!r} of configuration {self.name!r} was not found; searched: "
            f"{', '.join(str(x) for x in places)}; give the model file (model= in Python, MODEL on the command "
            f"line) or put its folder in {MODEL_PATH_ENV}",
            path=places[0],
            item="target_model",
        )

    def check_model(self, layout, *, path=None) -> None:
        """Check this configuration against a robot layout (free root).

        Raises:
            LayoutMismatch: ``model_signature`` differs from the layout's.
            UnknownNameError: a robot body name does not exist; the message lists the robot's bodies.
        """
        if self.model_signature is not None and self.model_signature != layout.model_signature:
            raise LayoutMismatch(
                f"configuration {self.name!r} was written for a model with layout signature {self.model_signature}; "
                f"this model has signature {layout.model_signature} (nq={layout.nq}, nv={layout.nv})",
                path=path or layout.source,
                item="model_signature",
            )
        for what, items in (("bodies", self.bodies), ("feet", self.feet)):
            for i, b in enumerate(items):
                if b.robot not in layout.body_names:
                    raise UnknownNameError(
                        f"no robot body {b.robot!r}; the robot's bodies are: {', '.join(layout.body_names)}",
                        path=path,
                        item=f"{what}[{i}].robot",
                    )
        scale = self.scale
        if isinstance(scale, Mapping):
            for b in scale.get("bodies", {}):
                if b not in layout.body_names:
                    raise UnknownNameError(
                        f"no robot body {b!r}; the robot's bodies are: {', '.join(layout.body_names)}",
                        path=path,
                        item="scale.bodies",
                    )
        joints = [b.joint_name for b in layout.blocks]
        for j, _ in self.solver.posture_joints:
            if j not in joints:
                raise UnknownNameError(
                    f"no joint {j!r}; the robot's joints are: {', '.join(joints)}",
                    path=path,
                    item="solver.posture_joints",
                )


def _check_scale(value, path):
    def one(v, item):
        if v == "auto":
            return "auto"
        if isinstance(v, str):
            raise FormatError(f"is {v!r}; expected a number > 0 or 'auto'", path=path, item=item)
        return _number(v, item, path, strict=True)

    if isinstance(value, Mapping):
        _keys(value, ("default", "bodies"), "scale", path)
        bodies = value.get("bodies", {})
        if not isinstance(bodies, Mapping):
            raise FormatError(f"is {bodies!r}; expected {{robot body: number}}", path=path, item="scale.bodies")
        return {
            "default": one(value.get("default", "auto"), "scale.default"),
            "bodies": {str(k): _number(v, f"scale.bodies.{k}", path, strict=True) for k, v in bodies.items()},
        }
    return one(value, "scale")


def list_robot_configs() -> tuple[str, ...]:
    """Names of the robot retarget configurations shipped with KangEngine (``configs/*.json`` without a
    ``joint_mapping``, with a ``target_model`` and ``bodies`` or an ``extends``)."""
    out = []
    for p in sorted(_CONFIG_DIR.glob("*.json")):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if (
            isinstance(d, dict)
            and "joint_mapping" not in d
            and ("extends" in d or {"target_model", "bodies"} <= set(d))
        ):
            out.append(p.stem)
    return tuple(out)


def _read_extended(path: Path) -> tuple[dict, Path]:
    """The configuration object of ``path`` with its ``extends`` chain merged (top-level keys of the file
    replace those of its base), and the folder of the file that set ``target_model``.

    Raises:
        FormatError: ``extends`` is not a string, forms a cycle or chains more than 8 files.
        UnknownNameError: ``extends`` names no shipped configuration (the message lists them).
    """
    chain: list[tuple[dict, Path]] = []
    seen: set[Path] = set()
    p = path
    while True:
        d = read_json(p, kind="robot retarget configuration")
        if not isinstance(d, Mapping):
            raise FormatError(f"is {type(d).__name__}; expected a JSON object", path=p, item="config")
        chain.append((dict(d), p.resolve().parent))
        seen.add(p.resolve())
        base = d.get("extends")
        if base is None:
            break
        if not isinstance(base, str) or not base:
            raise FormatError(f"is {base!r}; expected a configuration name or a .json path", path=p, item="extends")
        nxt = _config_file(base, relative_to=p.resolve().parent, path=p)
        if nxt.resolve() in seen or len(chain) >= _MAX_EXTENDS:
            raise FormatError(
                f"{base!r} makes a cycle or a chain over {_MAX_EXTENDS} files; expected a configuration without "
                "'extends' at its end",
                path=p,
                item="extends",
            )
        p = nxt
    merged: dict = {}
    model_dir = chain[-1][1]
    for d, folder in reversed(chain):
        if "target_model" in d:
            model_dir = folder
        merged.update(d)
    merged.pop("extends", None)
    return merged, model_dir


def _config_file(name_or_path, *, relative_to: Path | None = None, path=None) -> Path:
    """The file of a shipped configuration name or a ``.json`` path (relative to ``relative_to`` first)."""
    p = Path(name_or_path)
    if p.suffix == ".json":
        if relative_to is not None and not p.is_absolute() and (relative_to / p).is_file():
            return relative_to / p
        return p
    if p.is_file():
        return p
    f = _CONFIG_DIR / f"{name_or_path}.json"
    if not f.is_file() or str(name_or_path) not in list_robot_configs():
        raise UnknownNameError(
            f"no shipped robot retarget configuration {str(name_or_path)!r}; configurations are: "
            f"{', '.join(list_robot_configs())}",
            path=path,
            item="extends" if path is not None else None,
        )
    return f


def load_robot_config(name_or_path: str | os.PathLike, *, model=None):
    """A robot retarget configuration, checked against its robot model.

    Args:
        name_or_path: a shipped configuration name (``"cmu_bvh_to_g1"``) or a ``.json`` file path.
        model: the robot model to use instead of the configuration's ``target_model``: a model file path,
            an ``ArticulationDesc`` or a free-root ``ArticulationCoordinateLayout``. Its layout must have the
            configuration's signature.
    Returns:
        the checked :class:`RobotRetargetConfig`; its ``target_model`` is the model file actually used
        (absolute) when one was read.
    Raises:
        UnknownNameError: no such shipped configuration, or a robot body the model lacks (the message lists
            the valid names).
        LayoutMismatch: the model's layout signature is not the configuration's.
        FormatError: a malformed configuration (the message names the key and the valid choices).
    """
    cfg_path = _config_file(name_or_path)
    cfg = RobotRetargetConfig.from_json(cfg_path)
    layout, desc, model_path = load_robot_model(cfg, model)
    cfg.check_model(layout, path=cfg_path)
    return cfg.replace(target_model=str(model_path) if model_path is not None else cfg.target_model)


@functools.lru_cache(maxsize=8)
def _load_model_file(path: str, mtime_ns: int, size: int):
    """``(layout, desc)`` of a model file, kept for the next clip while the file is unchanged (its time and size
    are in the key): both are frozen, and parsing the MJCF is a large part of a short clip's time."""
    from ..animation.layout import ArticulationCoordinateLayout
    from ..asset import load as load_asset

    desc = load_asset(Path(path))
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=True), desc


def load_robot_model(cfg: RobotRetargetConfig, model=None):
    """``(layout, desc, path)`` of the robot: ``model`` (a path, an ``ArticulationDesc`` or a layout) or the
    configuration's ``target_model``. ``desc`` is ``None`` when a layout was given; ``path`` is ``None``
    when no file was read."""
    from ..animation.layout import ArticulationCoordinateLayout
    from ..asset.desc import ArticulationDesc

    if model is None:
        model = cfg.target_model_path()
    if isinstance(model, ArticulationCoordinateLayout):
        return model, None, None
    path = None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model).resolve()
        if not path.is_file():
            raise FileMissingError("no such robot model file", path=path, item="model")
        st = path.stat()
        layout, desc = _load_model_file(str(path), st.st_mtime_ns, st.st_size)
        return layout, desc, path
    if not isinstance(model, ArticulationDesc):
        raise FormatError(
            f"model is {type(model).__name__}; expected a model file path, an ArticulationDesc or a layout",
            item="model",
        )
    layout = ArticulationCoordinateLayout.from_data(data=model, free_root=True)
    return layout, model, path

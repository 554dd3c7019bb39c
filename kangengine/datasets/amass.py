"""AMASS and other SMPL-family motion arrays (SMPL, SMPL-H, SMPL-X) as :class:`SkeletonMotion`.

An AMASS ``.npz`` holds plain arrays (read with ``allow_pickle=False``):

=====================  =======================================================================
key                    content
=====================  =======================================================================
``poses``              ``[frames, 72 | 156 | 165]`` axis-angle (rad) per joint, SMPL joint order:
                       SMPL 24 joints; SMPL-H 52 (22 body + 2 x 15 finger joints); SMPL-X 55
                       (22 body, jaw, left eye, right eye, 2 x 15 finger joints)
``trans``              ``[frames, 3]`` m, world translation of the body model
``betas``              ``[num_betas]`` shape coefficients (10 or 16 in AMASS)
``gender``             ``"male"`` / ``"female"`` / ``"neutral"`` (str, bytes or a 0-d array of either)
``mocap_framerate``    frames per second (SMPL-X AMASS spells it ``mocap_frame_rate``)
``surface_model_type`` optional ``"smpl"`` / ``"smplh"`` / ``"smplx"``
=====================  =======================================================================

SMPL-X AMASS files may instead split the pose into ``root_orient``, ``pose_body``, ``pose_jaw``,
``pose_eye`` and ``pose_hand``; both forms are read.

**Axes.** AMASS data is Z up already: the clips' root orientations turn the SMPL model's own frame
(Y up, Z forward, X to the subject's left) so that the body stands along world +Z. ``smplx`` outputs
joints in the frame of its inputs, so its joint positions for an AMASS clip are AMASS world positions;
KangEngine changes no world coordinate. It does rotate each **body frame**: the returned skeleton's joint
frames are the SMPL frames turned by ``zup_from_yup`` (the same fixed rotation KangEngine uses for Y-up
files), so that its rest pose (all local rotations identity) stands along +Z facing +X, exactly the rest
pose of the SMPL humanoid MJCF (``smpl_humanoid.xml`` of ProtoMotions/PHC). Local rotations are
``C q C^-1`` (root: ``q C^-1``) and offsets ``C t`` with ``C = zup_from_yup``; world joint positions are
unchanged and equal ``smplx``'s. Joint names follow that MJCF (``Pelvis``, ``L_Hip``, ...) where it has
the joint, so SMPL -> SMPL humanoid retargeting is a renaming; SMPL-H/X finger, jaw and eye joints keep
their ``smplx`` names.

**Joint offsets.** With body-model files (``model_dir``), the rest joints are ``smplx``'s for the clip's
betas: ``J = J_regressor (v_template + shapedirs betas)`` (``smplx.lbs.blend_shapes`` and
``vertices2joints``). Without them, the SMPL neutral mean-shape tree that ProtoMotions publishes in
``smpl_humanoid.xml`` is used (shipped as ``kangengine/datasets/data/smpl_humanoid_tree.json``); it has the
24 SMPL joints only, so SMPL-H/X finger, jaw and eye joints are dropped (with a warning) and ``L_Hand`` /
``R_Hand`` keep their rest rotation.
"""

from __future__ import annotations

import enum
import json
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import conventions as axes
from .. import rotations as R
from .._files import load_npz, npz_scalar
from ..animation.skeleton import SkeletonMotion, SkeletonTree
from ..errors import FileMissingError, FormatError, NonFiniteError, ShapeError

__all__ = [
    "BodyModelType",
    "SMPLParams",
    "RestJoints",
    "read_params",
    "load",
    "from_params",
    "joint_names",
    "joint_parents",
    "rest_joints",
    "skeleton_tree",
    "find_model_file",
    "BODY_FROM_SMPL_WXYZ",
    "SMPL_JOINT_NAMES",
]

_DATA = Path(__file__).resolve().parent / "data"

#: ``zup_from_yup``: the rotation from SMPL's model frame (Y up, Z forward, X left) to KangEngine's body
#: frames (Z up, X forward, Y left): (x, y, z) -> (z, x, y), 120 degrees about (1, 1, 1). WXYZ.
BODY_FROM_SMPL_WXYZ = np.array([0.5, 0.5, 0.5, 0.5])


class BodyModelType(enum.Enum):
    """The SMPL family member a clip was fit with."""

    SMPL = "smpl"
    SMPLH = "smplh"
    SMPLX = "smplx"

    @property
    def num_joints(self) -> int:
        return {"smpl": 24, "smplh": 52, "smplx": 55}[self.value]

    @property
    def file_prefix(self) -> str:
        """Model file prefix in the ``smplx`` layout (``SMPL_NEUTRAL.pkl``, ``SMPLH_MALE.pkl``, ``SMPLX_*.npz``)."""
        return self.value.upper()


@lru_cache(maxsize=1)
def _mean_shape() -> dict:
    with open(_DATA / "smpl_humanoid_tree.json", encoding="utf-8") as f:
        return json.load(f)


#: The 24 SMPL joints named as in the SMPL humanoid MJCF, SMPL order.
SMPL_JOINT_NAMES: tuple[str, ...] = tuple(_mean_shape()["joint_names"])
_SMPL_PARENTS = tuple(_mean_shape()["parents"])
_FINGERS = [f"{f}{k}" for f in ("index", "middle", "pinky", "ring", "thumb") for k in (1, 2, 3)]


def _hand_parents(wrist: int, first: int) -> list[int]:
    out = []
    for i in range(15):
        out.append(wrist if i % 3 == 0 else first + i - 1)
    return out


def joint_names(model_type: BodyModelType | str) -> tuple[str, ...]:
    """Node names of the skeleton :func:`load` returns for ``model_type`` with body-model files."""
    mt = BodyModelType(model_type)
    body = SMPL_JOINT_NAMES[:22]
    hands = tuple(f"left_{f}" for f in _FINGERS) + tuple(f"right_{f}" for f in _FINGERS)
    if mt is BodyModelType.SMPL:
        return SMPL_JOINT_NAMES
    if mt is BodyModelType.SMPLH:
        return body + hands
    return body + ("jaw", "left_eye_smplhf", "right_eye_smplhf") + hands


def joint_parents(model_type: BodyModelType | str) -> np.ndarray:
    """``[joints] int64`` parent indices (SMPL kinematic tree; -1 for the pelvis)."""
    mt = BodyModelType(model_type)
    body = list(_SMPL_PARENTS[:22])
    if mt is BodyModelType.SMPL:
        return np.array(_SMPL_PARENTS, dtype=np.int64)
    if mt is BodyModelType.SMPLH:
        return np.array(body + _hand_parents(20, 22) + _hand_parents(21, 37), dtype=np.int64)
    return np.array(body + [15, 15, 15] + _hand_parents(20, 25) + _hand_parents(21, 40), dtype=np.int64)


# -- parameters --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SMPLParams:
    """SMPL-family motion parameters as stored (SMPL model frame, no KangEngine conversion).

    Attributes:
        model_type: the body model the clip was fit with.
        poses: ``[frames, joints, 3] float`` rad, axis-angle per joint in SMPL joint order
            (``model_type.num_joints`` joints).
        trans: ``[frames, 3] float`` m, world translation.
        betas: ``[num_betas] float64`` shape coefficients.
        gender: ``"male"``, ``"female"`` or ``"neutral"``.
        fps: frames per second.
        source: the file read, if any.
    """

    model_type: BodyModelType
    poses: np.ndarray
    trans: np.ndarray
    betas: np.ndarray
    gender: str
    fps: float
    source: str | None = None

    @property
    def num_frames(self) -> int:
        return int(self.poses.shape[0])


_GENDERS = ("male", "female", "neutral")


def _gender(value, path, key="gender") -> str:
    v = value
    if isinstance(v, np.ndarray):
        if v.size != 1 or v.dtype.kind not in "USO":
            raise FormatError(f"is an array of {v.dtype} {v.shape}; expected a string", path=path, item=key)
        v = v.reshape(()).item()
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str):
        raise FormatError(f"is {v!r}; expected one of {_GENDERS}", path=path, item=key)
    g = v.strip().lower()
    if g not in _GENDERS:
        raise FormatError(f"is {v!r}; expected one of {_GENDERS}", path=path, item=key)
    return g


def _float_array(z: dict, key: str, path) -> np.ndarray:
    a = z[key]
    if a.dtype.kind not in "fiu":
        raise FormatError(f"dtype {a.dtype} is not numeric", path=path, item=key)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise NonFiniteError("holds NaN or inf", path=path, item=key)
    return a


_CLIP_KEYS = (
    "poses",
    "root_orient",
    "pose_body",
    "pose_jaw",
    "pose_eye",
    "pose_hand",
    "trans",
    "betas",
    "gender",
    "surface_model_type",
    "mocap_framerate",
    "mocap_frame_rate",
    "fps",
    "frame_rate",
)


def _read_npz(path: Path) -> dict:
    """The members of an AMASS clip that :func:`read_params` uses (others are never read), memory bounded by
    the file's size (:func:`kangengine._files.load_npz`)."""
    return load_npz(path, optional=_CLIP_KEYS, kind="AMASS/SMPL")


_SPLIT_KEYS = {  # SMPL-X AMASS / human_body_prior layout
    "root_orient": 3,
    "pose_body": 63,
    "pose_jaw": 3,
    "pose_eye": 6,
    "pose_hand": 90,
}


def _poses_from_split(z, path, model_type):
    parts = []
    order = ["root_orient", "pose_body"]
    if model_type is BodyModelType.SMPLX:
        order += ["pose_jaw", "pose_eye", "pose_hand"]
    elif model_type is BodyModelType.SMPLH:
        order += ["pose_hand"]
    for k in order:
        if k not in z or z[k] is None:
            raise FormatError(f"missing; without 'poses' a {model_type.value} file needs {order}", path=path, item=k)
        a = _float_array(z, k, path)
        if a.ndim != 2 or a.shape[1] != _SPLIT_KEYS[k]:
            raise ShapeError(f"shape {a.shape}; expected [frames, {_SPLIT_KEYS[k]}]", path=path, item=k)
        parts.append(a)
    frames = {p.shape[0] for p in parts}
    if len(frames) != 1:
        raise ShapeError(f"the pose parts {order} have different frame counts {sorted(frames)}", path=path)
    poses = np.concatenate(parts, axis=1)
    if model_type is BodyModelType.SMPL:  # no hands given: SMPL's L_Hand/R_Hand at rest
        poses = np.concatenate([poses, np.zeros((poses.shape[0], 6), poses.dtype)], axis=1)
    return poses


def read_params(
    path: str | os.PathLike,
    *,
    model_type: BodyModelType | str | None = None,
    gender: str | None = None,
    fps: float | None = None,
) -> SMPLParams:
    """Read an AMASS / SMPL-family ``.npz`` (plain arrays only, no pickle) into :class:`SMPLParams`.

    Args:
        path: the ``.npz`` file.
        model_type: ``"smpl"``, ``"smplh"`` or ``"smplx"``; default: the file's ``surface_model_type``, else
            the pose width (72, 156, 165).
        gender: overrides the file's ``gender`` (default ``"neutral"`` when the file has none).
        fps: overrides the file's ``mocap_framerate`` / ``mocap_frame_rate`` (required when it has neither).

    Raises:
        FileMissingError, FormatError, ShapeError, NonFiniteError: naming the file and the key.
    """
    path = Path(path)
    z = _read_npz(path)
    mt = None
    if model_type is not None:
        try:
            mt = BodyModelType(str(getattr(model_type, "value", model_type)).lower())
        except ValueError:
            raise FormatError(
                f"model_type {model_type!r}; expected one of smpl, smplh, smplx", item="model_type"
            ) from None
    elif z.get("surface_model_type") is not None:
        smt = _text(z["surface_model_type"], path, "surface_model_type")
        try:
            mt = BodyModelType(smt.lower())
        except ValueError:
            raise FormatError(
                f"is {smt!r}; expected smpl, smplh or smplx", path=path, item="surface_model_type"
            ) from None
    if "poses" in z and z["poses"] is not None:
        poses = _float_array(z, "poses", path)
        if poses.ndim == 3 and poses.shape[2] == 3:
            poses = poses.reshape(poses.shape[0], -1)
        if poses.ndim != 2 or poses.shape[1] % 3:
            raise ShapeError(f"shape {poses.shape}; expected [frames, 72 | 156 | 165]", path=path, item="poses")
        by_width = {72: BodyModelType.SMPL, 156: BodyModelType.SMPLH, 165: BodyModelType.SMPLX}
        if mt is None:
            if poses.shape[1] not in by_width:
                raise ShapeError(
                    f"shape {poses.shape}: {poses.shape[1]} values per frame; expected 72 (SMPL), "
                    "156 (SMPL-H) or 165 (SMPL-X)",
                    path=path,
                    item="poses",
                )
            mt = by_width[poses.shape[1]]
        elif poses.shape[1] != 3 * mt.num_joints:
            raise ShapeError(
                f"shape {poses.shape}; a {mt.value} clip has {3 * mt.num_joints} values per frame",
                path=path,
                item="poses",
            )
    elif "root_orient" in z:
        if mt is None:
            mt = (
                BodyModelType.SMPLX
                if "pose_jaw" in z
                else (BodyModelType.SMPLH if "pose_hand" in z else BodyModelType.SMPL)
            )
        poses = _poses_from_split(z, path, mt)
    else:
        raise FormatError(
            f"missing; an AMASS file holds 'poses' (or 'root_orient' + 'pose_body'); the file holds {sorted(z)}",
            path=path,
            item="poses",
        )
    if poses.shape[0] == 0:
        raise ShapeError("zero frames; expected at least one", path=path, item="poses")
    if "trans" not in z or z["trans"] is None:
        raise FormatError(f"missing; the file holds {sorted(z)}", path=path, item="trans")
    trans = _float_array(z, "trans", path)
    if trans.shape != (poses.shape[0], 3):
        raise ShapeError(f"shape {trans.shape}; expected ({poses.shape[0]}, 3) to match poses", path=path, item="trans")
    if "betas" in z and z["betas"] is not None:
        betas = _float_array(z, "betas", path).astype(np.float64)
        if betas.ndim == 2:
            if not np.allclose(betas, betas[:1]):
                raise ShapeError(
                    f"shape {betas.shape} with betas that change over frames; expected one shape",
                    path=path,
                    item="betas",
                )
            betas = betas[0]
        if betas.ndim != 1:
            raise ShapeError(f"shape {betas.shape}; expected [num_betas]", path=path, item="betas")
    else:
        betas = np.zeros(0)
    if gender is not None:
        g = _gender(gender, None, "gender argument")
    elif z.get("gender") is not None:
        g = _gender(z["gender"], path)
    else:
        g = "neutral"
    if fps is None:
        for key in ("mocap_framerate", "mocap_frame_rate", "fps", "frame_rate"):
            if z.get(key) is not None:
                fps = npz_scalar(z, key, path)
                if not fps > 0:
                    raise FormatError(f"is {fps}; expected frames per second > 0", path=path, item=key)
                break
        else:
            raise FormatError(
                "no frame rate: expected 'mocap_framerate' (or 'mocap_frame_rate'); pass fps= to give one",
                path=path,
                item="mocap_framerate",
            )
    return SMPLParams(
        model_type=mt,
        poses=poses.reshape(poses.shape[0], -1, 3),
        trans=trans,
        betas=betas,
        gender=g,
        fps=float(fps),
        source=os.fspath(path),
    )


def _text(v: np.ndarray, path, key: str) -> str:
    """The one string of a text (``U`` or ``S``) array."""
    if v.size != 1 or v.dtype.kind not in "US":
        raise FormatError(f"is an array of {v.dtype} {v.shape}; expected one string", path=path, item=key)
    v = v.reshape(()).item()
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


# -- body-model files ----------------------------------------------------------------------------------------


def find_model_file(model_dir: str | os.PathLike, model_type: BodyModelType | str, gender: str) -> Path:
    """The body-model file for ``model_type`` and ``gender`` under ``model_dir``.

    Looks for, in order (``TYPE`` = SMPL/SMPLH/SMPLX, ``GENDER`` = NEUTRAL/MALE/FEMALE): ``model_dir`` itself
    if it is a file; ``model_dir/<type>/TYPE_GENDER.{npz,pkl}`` (the ``smplx`` layout);
    ``model_dir/TYPE_GENDER.{npz,pkl}``; ``model_dir/<type>/<gender>/model.npz`` (the AMASS layout).

    Raises:
        FileMissingError: listing every path tried.
    """
    mt = BodyModelType(model_type)
    base = Path(model_dir)
    if base.is_file():
        return base
    name = f"{mt.file_prefix}_{gender.upper()}"
    tried = []
    for folder in (base / mt.value, base):
        for ext in ("npz", "pkl"):
            tried.append(folder / f"{name}.{ext}")
    tried.append(base / mt.value / gender / "model.npz")
    for p in tried:
        if p.is_file():
            return p
    raise FileMissingError(
        f"no {mt.value} body model for gender {gender!r}; tried: {', '.join(os.fspath(p) for p in tried)}", path=base
    )


class _PickledStub:
    """Stand-in for ``scipy.sparse`` matrices and ``chumpy`` arrays in SMPL ``.pkl`` files: it only stores
    the pickled state, nothing of the original class runs."""

    kind = "object"

    def __setstate__(self, state):
        self.state = state


class _CSCStub(_PickledStub):
    kind = "csc"


class _CSRStub(_PickledStub):
    kind = "csr"


class _ChumpyStub(_PickledStub):
    kind = "chumpy"


def _reconstructor(cls, base, state):  # copyreg._reconstructor for the stubs only
    if not (isinstance(cls, type) and issubclass(cls, _PickledStub)) or base is not object:
        raise FormatError(f"refused copyreg._reconstructor({cls!r}, {base!r})")
    return cls.__new__(cls)


def _model_pickle_globals() -> dict:
    g = {("copyreg", "_reconstructor"): _reconstructor, ("builtins", "object"): object}
    for mod in ("scipy.sparse.csc", "scipy.sparse._csc"):
        g[(mod, "csc_matrix")] = _CSCStub
    for mod in ("scipy.sparse.csr", "scipy.sparse._csr"):
        g[(mod, "csr_matrix")] = _CSRStub
    for mod, name in (
        ("chumpy.ch", "Ch"),
        ("chumpy.ch_ops", "add"),
        ("chumpy.ch_ops", "subtract"),
        ("chumpy.ch_ops", "multiply"),
        ("chumpy.reordering", "Select"),
        ("chumpy.reordering", "select"),
        ("chumpy.reordering", "Reshape"),
        ("chumpy.ch", "Select"),
    ):
        g[(mod, name)] = _ChumpyStub
    return g


def _dense(value, key: str, path) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (_CSCStub, _CSRStub)):
        import scipy.sparse as sp

        st = value.state if isinstance(value.state, dict) else {}
        shape = st.get("_shape", st.get("shape"))
        try:
            cls = sp.csc_matrix if value.kind == "csc" else sp.csr_matrix
            return cls((st["data"], st["indices"], st["indptr"]), shape=tuple(shape)).toarray()
        except Exception as exc:
            raise FormatError(
                f"a {value.kind} sparse matrix that cannot be rebuilt ({exc})", path=path, item=key
            ) from exc
    if isinstance(value, _ChumpyStub):
        st = value.state if isinstance(value.state, dict) else {}
        for k in ("x", "a", "r"):
            if isinstance(st.get(k), np.ndarray):
                return st[k]
        raise FormatError(
            "a chumpy object without a plain array inside; convert the model with smplx's tools/clean_ch.py or to .npz",
            path=path,
            item=key,
        )
    raise FormatError(f"holds {type(value).__name__}; expected an array", path=path, item=key)


def _read_model(path: Path) -> dict:
    keys = ("v_template", "shapedirs", "J_regressor", "kintree_table")
    if path.suffix == ".npz":
        return load_npz(path, required=keys, optional=(), kind="body-model")
    from .._files import load_pickle

    d = load_pickle(path, extra_globals=_model_pickle_globals())
    if not isinstance(d, dict):
        raise FormatError(f"holds {type(d).__name__}; expected a dict of arrays", path=path)
    out = {}
    for k in keys:
        if k not in d:
            raise FormatError(f"missing; a body-model file holds {list(keys)}", path=path, item=k)
        out[k] = _dense(d[k], k, path)
    return out


@dataclass(frozen=True, eq=False)
class RestJoints:
    """Rest joint positions of a body model for one shape.

    Attributes:
        model_type: the body model.
        positions: ``[joints, 3] float64`` m, rest joint locations in the SMPL model frame (Y up).
        parents: ``[joints] int64`` parent indices.
        num_betas: how many betas were applied.
        model_file: the body-model file, or ``None`` for the shipped SMPL mean-shape tree.
    """

    model_type: BodyModelType
    positions: np.ndarray
    parents: np.ndarray
    num_betas: int
    model_file: str | None


def rest_joints(
    model_type: BodyModelType | str, *, model_dir: str | os.PathLike | None = None, gender: str = "neutral", betas=None
) -> RestJoints:
    """Rest joint positions ``J = J_regressor (v_template + shapedirs betas)`` for a shape, through ``smplx``.

    Without ``model_dir`` the SMPL neutral mean shape (24 joints, from the SMPL humanoid MJCF) is returned
    whatever ``model_type`` and ``betas`` are.

    Args:
        model_type: ``"smpl"``, ``"smplh"`` or ``"smplx"``.
        model_dir: folder (or file) of body models, see :func:`find_model_file`.
        gender: ``"neutral"``, ``"male"`` or ``"female"``.
        betas: ``[num_betas]`` shape coefficients (zeros: the template). Every beta the model has shape
            directions for is used (AMASS's 16 with a 16-shape SMPL+H model); extra ones are ignored with a
            warning when not zero. SMPL-X files with fewer than 400 directions hold 10 shape + 10 expression
            directions (``smplx``'s rule); expression is zero.
    """
    mt = BodyModelType(model_type)
    if model_dir is None:
        ms = _mean_shape()
        C = axes.QUAT_WXYZ_YUP_FROM_ZUP
        off = np.array(ms["offsets_mjcf"], dtype=np.float64)
        parents = np.array(ms["parents"], dtype=np.int64)
        local = R.quat_rotate(C, off)  # back to the SMPL model frame
        local[0] = off[0]  # the pelvis entry is J_0 in the SMPL frame already
        pos = np.zeros_like(local)
        for i, p in enumerate(parents):
            pos[i] = local[i] if p < 0 else pos[p] + local[i]
        return RestJoints(BodyModelType.SMPL, pos, parents, 0, None)
    from .._deps import require

    smplx_lbs = require("smplx.lbs", "smpl")
    import torch

    path = find_model_file(model_dir, mt, _gender(gender, None))
    m = _read_model(path)
    v_template = np.asarray(m["v_template"], dtype=np.float64)
    shapedirs = np.asarray(m["shapedirs"], dtype=np.float64)
    jreg = np.asarray(m["J_regressor"], dtype=np.float64)
    kin = np.asarray(m["kintree_table"]).astype(np.int64)
    if v_template.ndim != 2 or v_template.shape[1] != 3:
        raise FormatError(f"shape {v_template.shape}; expected [vertices, 3]", path=path, item="v_template")
    nv = v_template.shape[0]
    if shapedirs.ndim != 3 or shapedirs.shape[:2] != (nv, 3):
        raise FormatError(f"shape {shapedirs.shape}; expected [{nv}, 3, num_shapes]", path=path, item="shapedirs")
    nj = mt.num_joints
    if jreg.shape != (nj, nv):
        raise FormatError(
            f"shape {jreg.shape}; a {mt.value} model regresses ({nj}, {nv})", path=path, item="J_regressor"
        )
    if kin.shape[-1] != nj:
        raise FormatError(f"shape {kin.shape}; expected (2, {nj})", path=path, item="kintree_table")
    parents = kin[0].copy()
    parents[0] = -1
    expected = joint_parents(mt)
    if not np.array_equal(parents, expected):
        raise FormatError(
            f"parents {parents.tolist()} differ from the {mt.value} tree {expected.tolist()}",
            path=path,
            item="kintree_table",
        )
    nshape = shapedirs.shape[-1]
    if mt is BodyModelType.SMPLX:
        nshape = 300 if nshape >= 400 else min(10, nshape)
    b = np.zeros(0) if betas is None else np.asarray(betas, dtype=np.float64).reshape(-1)
    nb = min(len(b), nshape)
    if len(b) > nb and np.any(b[nb:] != 0):
        warnings.warn(
            f"{path}: the model has {nshape} shape directions; betas {nb}..{len(b) - 1} are ignored", stacklevel=2
        )
    v = torch.as_tensor(v_template)[None]
    if nb:
        v = v + smplx_lbs.blend_shapes(torch.as_tensor(b[:nb])[None], torch.as_tensor(shapedirs[:, :, :nb]))
    joints = smplx_lbs.vertices2joints(torch.as_tensor(jreg), v)[0].numpy()
    return RestJoints(mt, joints, parents, nb, os.fspath(path))


def skeleton_tree(
    model_type: BodyModelType | str = "smpl",
    *,
    model_dir: str | os.PathLike | None = None,
    gender: str = "neutral",
    betas=None,
) -> SkeletonTree:
    """The skeleton :func:`load` puts a clip on: SMPL joint order, SMPL humanoid names, KangEngine body frames
    (rest pose stands along +Z facing +X). Offsets are ``zup_from_yup (J_i - J_parent)``; the root entry is
    the pelvis rest position ``J_0`` (m, where the pelvis is for zero ``trans``).

    Without ``model_dir``: the 24-joint SMPL mean-shape tree, whose offsets equal the body positions of
    ``smpl_humanoid.xml``.
    """
    rj = rest_joints(model_type, model_dir=model_dir, gender=gender, betas=betas)
    return _tree_from_rest(rj)


def _tree_from_rest(rj: RestJoints) -> SkeletonTree:
    names = joint_names(rj.model_type)
    parents = rj.parents
    rel = rj.positions - rj.positions[np.where(parents < 0, 0, parents)]
    off = axes.vec_zup_from_yup(rel)
    off[0] = rj.positions[0]
    return SkeletonTree(names, parents, off)


def from_params(params: SMPLParams, *, model_dir: str | os.PathLike | None = None) -> SkeletonMotion:
    """A :class:`SkeletonMotion` from SMPL-family parameters (see :func:`load`)."""
    mt = params.model_type
    rj = rest_joints(mt, model_dir=model_dir, gender=params.gender, betas=params.betas)
    tree = _tree_from_rest(rj)
    dtype = params.poses.dtype if params.poses.dtype in (np.float32, np.float64) else np.float64
    poses = params.poses.astype(np.float64)
    dropped: list[str] = []
    if rj.model_type is not mt:  # mean-shape SMPL tree for an SMPL-H/X clip: keep the 22 body joints
        full = joint_names(mt)
        dropped = list(full[22:])
        poses = np.concatenate([poses[:, :22], np.zeros((poses.shape[0], 2, 3))], axis=1)
        warnings.warn(
            f"{params.source or 'SMPL params'}: no {mt.value} body model given, so the clip goes on the "
            f"24-joint SMPL mean-shape tree and {len(dropped)} joints ({dropped[0]}, ...) are dropped; "
            "pass model_dir= to keep them",
            stacklevel=3,
        )
    q = R.quat_from_rotvec(poses)  # [T, J, 4], SMPL frames
    C = axes.QUAT_WXYZ_ZUP_FROM_YUP
    Cinv = R.quat_conjugate(C)
    local = R.quat_multiply(R.quat_multiply(C, q), Cinv)
    local[:, 0] = R.quat_multiply(q[:, 0], Cinv)
    root = params.trans.astype(np.float64) + rj.positions[0]
    meta = {
        "source": params.source,
        "format": "amass",
        "model_type": mt.value,
        "gender": params.gender,
        "betas": [float(x) for x in params.betas],
        "num_betas_used": rj.num_betas,
        "body_model": rj.model_file or "smpl_humanoid_mean_shape",
        "body_frame": "SMPL joint frames turned by zup_from_yup (rest pose stands along +Z facing +X)",
        "source_units": "m",
        "source_up_axis": "z",
    }
    if dropped:
        meta["dropped_joints"] = dropped
    return SkeletonMotion(tree, root.astype(dtype), local.astype(dtype), params.fps, metadata=meta)


def load(
    path: str | os.PathLike,
    *,
    model_dir: str | os.PathLike | None = None,
    model_type: BodyModelType | str | None = None,
    gender: str | None = None,
    fps: float | None = None,
) -> SkeletonMotion:
    """Read an AMASS / SMPL-family ``.npz`` clip as a :class:`~kangengine.animation.SkeletonMotion`.

    Args:
        path: the ``.npz`` (plain arrays; pickled object arrays are refused).
        model_dir: body models in the ``smplx`` layout (``model_dir/smpl/SMPL_NEUTRAL.pkl``,
            ``smplh/SMPLH_MALE.npz``, ``smplx/SMPLX_FEMALE.npz``, ...; see :func:`find_model_file`). With it,
            joint offsets are ``smplx``'s for the clip's betas and every joint is kept; without it, the SMPL
            mean-shape tree is used (24 joints).
        model_type: ``"smpl"`` / ``"smplh"`` / ``"smplx"`` (default: from the file).
        gender: overrides the file's gender when picking the model file.
        fps: overrides the file's frame rate.

    Returns:
        ``SkeletonMotion``: ``local_rotation [frames, joints, 4]`` WXYZ (KangEngine body frames, see the module
        doc), ``root_translation [frames, 3]`` m = ``trans + J_0`` (world pelvis position, Z up), the file's
        fps and float dtype, ``metadata`` with ``model_type``, ``gender``, ``betas``, ``body_model``. Global
        joint positions equal ``smplx``'s ``joints[:, :joints]`` for the same parameters (flat hand mean, no
        PCA).

    Raises:
        FileMissingError, FormatError, ShapeError, NonFiniteError: naming the file and the key;
        MissingDependencyError: ``model_dir`` given but ``smplx`` not installed (``pip install kangengine[smpl]``).
    """
    params = read_params(path, model_type=model_type, gender=gender, fps=fps)
    return from_params(params, model_dir=model_dir)

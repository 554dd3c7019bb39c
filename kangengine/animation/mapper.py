"""`ArticulationMotionMapper`: skeleton motion on an articulation's own skeleton <-> articulation motion.

The skeleton of an articulation is ``SkeletonTree.from_articulation(desc)``: one node per body, same
names and order. A :class:`~kangengine.animation.SkeletonState` of it holds, per body, the local rotation
``parent_from_body`` *including* the body's rest rotation (``layout.rest_rotations_wxyz``). The mapper
splits each body's joint rotation ``J = rest^-1 * local`` onto the body's own joints, exactly, on the
model's real axes, and reports the rotation the joints cannot represent.

Per body (``J`` in the body frame; several hinges compose as ``exp(a1 t1) exp(a2 t2) ...``, the first
joint of the body applied first, as MuJoCo does):

==========================  ======================================================================
joints on the body          decomposition
==========================  ======================================================================
free (root)                 ``q = (root position, root rotation)`` in world; residual 0
ball                        the joint quaternion ``J``, sign-continuous in time; residual 0
                            (other rotational joints on the body stay at ``ref``)
1 hinge                     swing-twist about the axis: angle = twist, residual = swing angle
2 hinges                    closed-form best fit: the top singular pair of a 2x2 matrix gives the
                            half-angles that maximise ``|<exp(a1 t1) exp(a2 t2), J>|``, i.e. minimise
                            the geodesic residual (exact for any axes)
3 hinges                    closed-form generalised (Davenport) Euler angles for any axes with
                            consecutive axes not parallel (Shuster & Markley 2003); both branches;
                            a few Gauss-Newton steps where the rotation is out of reach of the axes
parallel consecutive axes,  consecutive parallel axes merged (angle split evenly), then the closed form
or more than 3 hinges       above (first three axes; further hinges at ``ref``), both branches; frames out
                            of its reach refined by vectorised Gauss-Newton anchored to it
slides                      held at ``ref`` (zero displacement): a skeleton carries no joint
                            translations the mapper would trust
fixed / no joint            nothing to solve; residual = angle between ``J`` and the identity
==========================  ======================================================================

Over time (motions), the two branches of a 3-hinge body are followed as two continuous tracks (a
vectorised matching of consecutive frames, see :meth:`ArticulationMotionMapper.to_articulation_motion`),
angles are unwrapped (no 2*pi jumps) and each hinge is shifted by a constant multiple of 2*pi that puts
it inside its limits. Everything is vectorised over frames; Python loops run over groups of bodies that
share one joint structure (e.g. all x/y/z hinge triplets are solved as one batch).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np

from .. import _buffers
from .. import rotations as R
from .._deps import optional
from ..asset.desc import JointType
from ..errors import FormatError, LayoutMismatch, MotionError, ShapeError, UnknownNameError
from .kinematics.trace import add as _add
from .kinematics.trace import mul as _mul
from .kinematics.trace import sub as _sub
from .layout import ArticulationCoordinateLayout
from .motion import ArticulationMotion
from .skeleton import SkeletonMotion, SkeletonState, SkeletonTree

__all__ = ["ArticulationMotionMapper", "MappingResult", "CoordinatesResult", "SkeletonOffsetWarning"]

_TWO_PI = 2.0 * math.pi
_COST_ANGLE_WEIGHT = 1e-3  # branch choice: limit violation first, then small angles
_COST_RESIDUAL_WEIGHT = 10.0
_GIMBAL_SIN = 1e-2  # below this sin(alpha), the third Davenport angle comes from the remainder
_REFINE_TOL = 1e-7  # rad: Gauss-Newton refines frames whose closed-form residual exceeds this
_CHAIN_REG = 1e-10  # redundant chains: weight of |theta|^2 (picks the smallest of equivalent angles)
_CHUNK = 4096  # frames per block in the per-frame stage (keeps temporaries in cache)
_SUMMARY_CHUNK = 4096  # frames per block of the limit-violation summary
_ROT_CHUNK = 32768  # frames per block of the quaternion velocities (a few rotation calls per block)
# frames per call of the fused native pass: its loops (three chunks of bodies, then the root) each touch part of
# every q, qd and quaternion row; 1024 frames of the SMPL humanoid are ~1 MB, so the lines they share stay in L2
_FUSED_CHUNK = 1024


class SkeletonOffsetWarning(UserWarning):
    """The skeleton's names and parents match the layout but its rest translations do not: rotations
    map as usual, but body positions of the mapped ``q`` follow the articulation, not the skeleton."""


@dataclass(frozen=True)
class MappingResult:
    """Result of :meth:`ArticulationMotionMapper.to_articulation_motion`.

    Attributes:
        motion: the :class:`~kangengine.animation.ArticulationMotion` (``q [frames, nq]``, ``qd [frames,
            nv]`` float32, canonical tangent convention, the layout's signature).
        residual_angles: ``[frames, bodies]`` rad, float32 for float32 input else float64: geodesic angle
            between the wanted joint rotation of each body and the one its joints reproduce (clamping
            included when asked). Bodies in ``layout.body_names`` order; 0 for the free root, ball
            joints and bodies whose joints reach every rotation (e.g. 3 hinges with the middle axis
            perpendicular to the other two), by construction.
        clamped: ``[frames, nv]`` rad (hinges) or m (slides): ``q_clamped - q_unclamped`` per DOF; zeros
            unless ``clamp_to_limits=True``.
    """

    motion: ArticulationMotion
    residual_angles: np.ndarray
    clamped: np.ndarray


@dataclass(frozen=True)
class CoordinatesResult:
    """Result of :meth:`ArticulationMotionMapper.to_articulation_coordinates`.

    Attributes:
        q: ``[..., nq]`` generalized coordinates (the state's batch shape; dtype of the state).
        residual_angles: ``[..., bodies]`` rad, as in :class:`MappingResult`.
        clamped: ``[..., nv]``, ``q_clamped - q_unclamped``; zeros unless ``clamp_to_limits=True``.
    """

    q: np.ndarray
    residual_angles: np.ndarray
    clamped: np.ndarray


# ------------------------------------------------------------------------------------------------
# small vector helpers on components (Python floats fold away, see kinematics._mul)
# ------------------------------------------------------------------------------------------------


def _snap(v: float) -> float:
    v = float(v)
    if abs(v) < 1e-12:
        return 0.0
    if abs(abs(v) - 1.0) < 1e-12:
        return math.copysign(1.0, v)
    return v


def _snapv(v) -> tuple[float, float, float]:
    return tuple(_snap(x) for x in v)


def _dot(comps, const):
    out = 0.0
    for c, k in zip(comps, const):
        out = _add(out, _mul(c, k))
    return out


def _lin(p0, c, p1, s, p2):
    """p0 + c p1 + s p2 with folding."""
    return _add(_add(p0, _mul(c, p1)), _mul(s, p2))


def _arr(x, like):
    """Materialise a folded component as an array shaped like ``like``."""
    if isinstance(x, float):
        return np.full_like(like, x)
    return x


class _RotMat:
    """Rotation-matrix elements of (not necessarily unit) quaternions, computed on demand."""

    def __init__(self, w, x, y, z, scale):
        self.w, self.x, self.y, self.z, self.s = w, x, y, z, scale
        self._cache: dict = {}

    def __call__(self, i: int, j: int):
        key = (i, j)
        if key not in self._cache:
            w, x, y, z, s = self.w, self.x, self.y, self.z, self.s
            if i == j:
                a, b = [(y, z), (x, z), (x, y)][i]
                v = 1.0 - s * (a * a + b * b)
            else:
                u = (x, y, z)
                sym = u[i] * u[j]
                k = 3 - i - j
                cross = w * u[k]
                sign = 1.0 if (j - i) % 3 == 1 else -1.0  # R[i][j] = s (u_i u_j -/+ w u_k)
                v = s * (sym - sign * cross)
            self._cache[key] = v
        return self._cache[key]

    def mul_vec(self, a):
        """``R a`` for a constant vector ``a``."""
        return tuple(_dot(tuple(self(i, j) if a[j] != 0.0 else 0.0 for j in range(3)), a) for i in range(3))

    def tmul_vec(self, a):
        """``R^T a`` for a constant vector ``a``."""
        return tuple(_dot(tuple(self(i, j) if a[i] != 0.0 else 0.0 for i in range(3)), a) for j in range(3))


# ------------------------------------------------------------------------------------------------
# generic hinge chains (rare structures; also residuals after clamping)
# ------------------------------------------------------------------------------------------------


def _axis_quats(axes: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``[..., n, 4]`` quaternions exp(a_i theta_i) for axes ``[n, 3]`` and angles ``[..., n]``."""
    h = 0.5 * theta
    s = np.sin(h)
    return np.concatenate([np.cos(h)[..., None], s[..., None] * axes], axis=-1)


def _chain_quat(axes: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``exp(a1 t1) exp(a2 t2) ...``: ``[..., 4]`` for angles ``[..., n]``."""
    e = _axis_quats(axes, theta)
    p = e[..., 0, :]
    for i in range(1, axes.shape[0]):
        p = R.quat_multiply(p, e[..., i, :])
    return p


def _chain_residual(J: np.ndarray, axes: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Angle ``[...]`` between ``J [..., 4]`` and the chain's rotation at ``theta [..., n]``."""
    E = R.quat_multiply(R.quat_conjugate(_chain_quat(axes, theta)), J)
    return R.quat_angle(E)


def _chain_gauss_newton(
    J: np.ndarray, axes: np.ndarray, theta: np.ndarray, iters: int = 12, reg: float = 0.0, anchor=None
) -> np.ndarray:
    """Damped Gauss-Newton (Levenberg-Marquardt) on ``|log(chain(theta)^-1 J)|^2 + reg |theta - anchor|^2``
    (``anchor`` defaults to the seed), vectorised over samples.

    ``J [N, 4]`` unit quaternions, ``axes [n, 3]``, seed ``theta [N, n]``. The error ``E = p^-1 J`` is in
    the body frame; a step ``delta`` changes it to ``exp(-G delta) E`` with ``G[:, i]`` the i-th axis seen
    from the end of the chain, so ``delta = (G^T G + (reg + lam) I)^-1 (G^T log(E) - reg (theta - anchor))``.
    A tiny ``reg`` picks, among equally good angles (redundant chains), those nearest the seed, so a seed
    continuous in time gives a solution continuous in time. Steps that do not lower the objective are
    refused and the damping raised (per sample).
    """
    n = axes.shape[0]
    N = J.shape[0]
    if N == 0:
        return theta
    theta = np.array(theta, dtype=np.float64)
    J = np.asarray(J, dtype=np.float64)
    anchor = theta.copy() if anchor is None else np.asarray(anchor, dtype=np.float64)

    def error(th):
        E = R.quat_multiply(R.quat_conjugate(_chain_quat(axes, th)), J)
        E = np.where(E[:, :1] < 0, -E, E)
        return R.quat_to_rotvec(E)

    def objective(err, th):
        d = th - anchor
        return np.einsum("ni,ni->n", err, err) + reg * np.einsum("ni,ni->n", d, d)

    err = error(theta)
    res = objective(err, theta)
    lam = np.full(N, 1e-9)
    eye = np.eye(n)
    for _ in range(iters):
        e = _axis_quats(axes, theta)
        G = np.empty((N, 3, n))
        suf = R.quat_identity((N,), dtype=np.float64)
        for i in range(n - 1, -1, -1):
            G[:, :, i] = R.quat_rotate_inverse(suf, np.broadcast_to(axes[i], (N, 3)))
            suf = R.quat_multiply(e[:, i, :], suf)
        H = np.einsum("nki,nkj->nij", G, G) + (reg + lam)[:, None, None] * eye
        g = np.einsum("nki,nk->ni", G, err) - reg * (theta - anchor)
        delta = np.linalg.solve(H, g[..., None])[..., 0]
        cand = theta + delta
        err2 = error(cand)
        res2 = objective(err2, cand)
        better = res2 <= res
        theta = np.where(better[:, None], cand, theta)
        err = np.where(better[:, None], err2, err)
        res = np.where(better, res2, res)
        lam = np.clip(np.where(better, lam * 0.1, lam * 100.0), 1e-12, 1e6)
        if float(np.max(np.abs(delta))) < 1e-13:
            break
    return theta


# ------------------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------------------

_NONE, _BALL, _HINGE1, _HINGE2, _HINGE3, _CHAIN = "none", "ball", "hinge1", "hinge2", "hinge3", "chain"


@dataclass(frozen=True)
class _Group:
    """Bodies that share one joint structure (kind and axes), solved as one batch."""

    kind: str
    axes: tuple[tuple[float, float, float], ...]
    bodies: np.ndarray  # [k] body indices
    hinge_cols: np.ndarray  # [k, n] positions into the hinge-column table
    complete: bool  # every rotation reachable (residual 0 by construction)


class _Davenport:
    """Constants of the generalised Euler decomposition ``J = exp(a1 t1) exp(a2 t2) exp(a3 t3)``.

    ``t2`` solves ``a1 . exp(a2 t2) a3 = a1 . J a3``: ``A cos t2 + B sin t2 + C = d`` with
    ``A = a1.a3 - (a1.a2)(a2.a3)``, ``B = a1.(a2 x a3)``, ``C = (a1.a2)(a2.a3)``, so
    ``t2 = phi +- acos((d - C) / rho)``, ``rho e^(i phi) = A + iB`` (two branches). ``t1`` is the angle
    about ``a1`` taking ``exp(a2 t2) a3`` to ``J a3``; ``t3`` the angle about ``a3`` taking ``J^T a1`` to
    ``exp(-a2 t2) a1``. Each is an atan2 of terms linear in ``(1, cos t2, sin t2)`` with constant vectors.
    """

    def __init__(self, axes):
        a1, a2, a3 = (np.asarray(a, dtype=np.float64) / np.linalg.norm(a) for a in axes)
        self.a1, self.a2, self.a3 = _snapv(a1), _snapv(a2), _snapv(a3)
        self.axes = (self.a1, self.a2, self.a3)
        d12, d23, d13 = float(a1 @ a2), float(a2 @ a3), float(a1 @ a3)
        A = d13 - d12 * d23
        B = float(a1 @ np.cross(a2, a3))
        C = d12 * d23
        self.rho = math.hypot(A, B)
        self.A, self.B, self.C = _snap(A), _snap(B), _snap(C)
        phi = math.atan2(B, A)
        self.phi = phi
        self.cphi, self.sphi = _snap(math.cos(phi)), _snap(math.sin(phi))
        # t1 = atan2(y1, x1): y1 = w3.(k3 + c (k1 - k3) + s k2), x1 = w3.(x0 + c x1c + s x2) - (A c + B s + C) d
        k1 = np.cross(a1, a3)
        k2 = np.cross(a1, np.cross(a2, a3))
        k3 = d23 * np.cross(a1, a2)
        self.y1 = (_snapv(k3), _snapv(k1 - k3), _snapv(k2))
        self.x1 = (_snapv(d23 * a2), _snapv(a3 - d23 * a2), _snapv(np.cross(a2, a3)))
        # t3 = atan2(y3, x3): y3 = m1.(K3 + c (K1 - K3) + s K2), x3 = m1.(.) - d (A c + B s + C)
        K1 = np.cross(a1, a3)
        K2 = -np.cross(np.cross(a2, a1), a3)
        K3 = d12 * np.cross(a2, a3)
        self.y3 = (_snapv(K3), _snapv(K1 - K3), _snapv(K2))
        self.x3 = (_snapv(d12 * a2), _snapv(a1 - d12 * a2), _snapv(-np.cross(a2, a1)))
        self.complete = abs(d12) < 1e-9 and abs(d23) < 1e-9
        self.degenerate = self.rho < 1e-6
        # axes +-e_i, +-e_j, +-e_k: the intrinsic Euler angles of J (rotations.quat_to_euler, order "ijk")
        # times the axis signs
        basis = [int(np.argmax(np.abs(a))) for a in (self.a1, self.a2, self.a3)]
        self.euler = None
        if self.complete and all(sum(c != 0.0 for c in a) == 1 for a in self.axes):
            signs = tuple(float(a[i]) for a, i in zip(self.axes, basis))
            self.euler = ("".join("xyz"[i] for i in basis), signs)


class _Sym:
    """A component while a folded expression is traced (:func:`_folded`): each arithmetic op on it appends one
    Python statement (the same operation, the same operand order) to ``lines``."""

    __slots__ = ("name", "lines")

    def __init__(self, name: str, lines: list):
        self.name, self.lines = name, lines

    def _op(self, expr: str) -> _Sym:
        out = _Sym(f"t{len(self.lines)}", self.lines)
        self.lines.append(f"    {out.name} = {expr}")
        return out

    @staticmethod
    def _s(o) -> str:
        return o.name if isinstance(o, _Sym) else f"({float(o)!r})"

    def __mul__(self, o):
        return self._op(f"{self.name} * {self._s(o)}")

    def __rmul__(self, o):
        return self._op(f"{self._s(o)} * {self.name}")

    def __add__(self, o):
        return self._op(f"{self.name} + {self._s(o)}")

    def __radd__(self, o):
        return self._op(f"{self._s(o)} + {self.name}")

    def __sub__(self, o):
        return self._op(f"{self.name} - {self._s(o)}")

    def __rsub__(self, o):
        return self._op(f"{self._s(o)} - {self.name}")

    def __neg__(self):
        return self._op(f"-{self.name}")


def _hinge1_terms(axis, comps):
    """``(w a . v, |v - (a . v) a|^2)`` folded (constants of ``axis`` fold away); components or traced."""
    w, x, y, z = comps
    v = (x, y, z)
    t = _dot(v, axis)
    perp = tuple(_sub(v[i], _mul(t, axis[i])) for i in range(3))
    return t, _dot(perp, perp)


def _hinge2_terms(axes, comps):
    """``(<a2, v>, <a1, v>, -d12 w + <a1 x a2, v>)`` folded; components or traced."""
    a1, a2 = axes
    w, x, y, z = comps
    v = (x, y, z)
    d12, c12 = _hinge2_consts(axes) if isinstance(axes, tuple) else _hinge2_consts.__wrapped__(axes)
    return _dot(v, a2), _dot(v, a1), _add(_mul(w, -d12), _dot(v, c12))


@functools.lru_cache(maxsize=256)
def _folded(terms, axes):
    """``terms(axes, comps)`` (:func:`_hinge1_terms` / :func:`_hinge2_terms`) as a function of ``(w, x, y, z)``
    compiled once per axes: the folded arithmetic traced into straight-line code (the same numpy operations in
    the same order, so the same values) without the folding helpers' per-call work."""
    lines: list = []
    outs = terms(axes, tuple(_Sym(n, lines) for n in "wxyz"))
    ret = ", ".join(_Sym._s(o) for o in outs)
    src = "def _f(w, x, y, z):\n" + "\n".join(lines + [f"    return ({ret},)"]) + "\n"
    scope: dict = {}
    exec(compile(src, f"<mapper fold {terms.__name__} {axes}>", "exec"), scope)  # our own generated code
    return scope["_f"]


def _solve_hinge1(axis, comps):
    """Swing-twist about ``axis``: (angle in [-pi, pi], residual = swing angle), arrays like ``comps``."""
    w = comps[0]
    if isinstance(axis, tuple):
        t, pn = _folded(_hinge1_terms, axis)(*comps)
    else:
        t, pn = _hinge1_terms(axis, comps)
    pn = _arr(pn, w)
    angle = R.wrap_angle(2.0 * np.arctan2(_arr(t, w), w))
    residual = 2.0 * np.arctan2(np.sqrt(pn), np.sqrt(w * w + t * t))
    return angle, residual


@functools.lru_cache(maxsize=256)
def _hinge2_consts(axes):
    """``(a1 . a2, a1 x a2)`` of a hinge pair (snapped), per axes tuple: constants, not rebuilt every call."""
    a1, a2 = axes
    return _snap(float(np.dot(a1, a2))), _snapv(np.cross(a1, a2))


def _solve_hinge2(axes, comps):
    """Best fit of exp(a1 t1) exp(a2 t2) to J: the top singular pair of
    ``M = [[<1,J>, <a2,J>], [<a1,J>, <a1 a2,J>]]`` gives ``(cos t1/2, sin t1/2)`` and
    ``(cos t2/2, sin t2/2)``; ``M = Rot(phi) diag(sx, sy) Rot(theta)`` in closed form."""
    w = comps[0]
    if isinstance(axes, tuple):  # constants (Python floats): the compiled fold
        d12 = _hinge2_consts(axes)[0]
        terms = _folded(_hinge2_terms, axes)(*comps)
    else:  # array axes (numpy scalars keep their own promotion): folded on the fly
        d12 = _hinge2_consts.__wrapped__(axes)[0]
        terms = _hinge2_terms(axes, comps)
    m00 = w
    m01, m10, m11 = (_arr(m, w) for m in terms)
    E = 0.5 * (m00 + m11)
    F = 0.5 * (m00 - m11)
    G = 0.5 * (m10 + m01)
    H = 0.5 * (m10 - m01)
    ag = np.arctan2(G, F)
    ah = np.arctan2(H, E)
    t1 = R.wrap_angle(ah + ag)
    t2 = R.wrap_angle(ag - ah)
    if d12 == 0.0:  # orthonormal basis {1, a1, a2, a1 a2}: sx^2 + sy^2 = |J|^2
        Q = np.sqrt(E * E + H * H)
        Rr = np.sqrt(F * F + G * G)
        residual = 2.0 * np.arctan2(np.abs(Q - Rr), Q + Rr)
    else:
        J = np.stack(comps, axis=-1)
        J = J / np.linalg.norm(J, axis=-1, keepdims=True)
        residual = _chain_residual(J, np.array(axes), np.stack([t1, t2], axis=-1)).astype(w.dtype)
    return t1, t2, residual


def _davenport_core(dv: _Davenport, comps, signs):
    """Closed-form Davenport angles of quaternion components ``comps`` (4 arrays ``[...]``).

    Returns ``(branches, alpha)``: per sign in ``signs`` (-1: ``t2 = phi - alpha``, +1: ``phi + alpha``)
    a tuple ``(t1, t2, t3)`` (``t1``, ``t3`` in [-pi, pi], ``t2`` unwrapped), and ``alpha [...]`` in
    [0, pi]. Near gimbal lock (``sin(alpha)`` small) ``t3`` comes from the remainder
    ``exp(-a2 t2) exp(-a1 t1) J``, so the rotation stays exact where ``t1`` alone is ill-conditioned.
    """
    w, x, y, z = comps
    nrm = w * w + x * x + y * y + z * z
    rot = _RotMat(w, x, y, z, 2.0 / nrm)
    w3 = rot.mul_vec(dv.a3)
    m1 = rot.tmul_vec(dv.a1)
    d = _arr(_dot(w3, dv.a1), w)
    xc = (d - dv.C) / dv.rho if dv.rho != 1.0 or dv.C != 0.0 else d.copy()
    np.clip(xc, -1.0, 1.0, out=xc)
    alpha = np.arccos(xc)
    sa = np.sqrt(np.maximum((1.0 - xc) * (1.0 + xc), 0.0))
    Y1 = tuple(_dot(w3, vec) for vec in dv.y1)
    X1 = tuple(_dot(w3, vec) for vec in dv.x1)
    Y3 = tuple(_dot(m1, vec) for vec in dv.y3)
    X3 = tuple(_dot(m1, vec) for vec in dv.x3)
    lock = np.flatnonzero(sa.reshape(-1) < _GIMBAL_SIN)
    out = []
    for sgn in signs:
        c = _sub(_mul(xc, dv.cphi), _mul(sa, sgn * dv.sphi))
        s = _add(_mul(xc, dv.sphi), _mul(sa, sgn * dv.cphi))
        proj = _add(_add(_mul(c, dv.A), _mul(s, dv.B)), dv.C)  # a1 . exp(a2 t2) a3
        t2 = dv.phi + sgn * alpha
        t1 = np.arctan2(
            _arr(_lin(*_interleave(Y1, c, s)), w), _arr(_sub(_lin(*_interleave(X1, c, s)), _mul(proj, d)), w)
        )
        t3 = np.arctan2(
            _arr(_lin(*_interleave(Y3, c, s)), w), _arr(_sub(_lin(*_interleave(X3, c, s)), _mul(proj, d)), w)
        )
        if lock.size:  # t1, t3 ill-conditioned: t3 from the remainder exp(-a2 t2) exp(-a1 t1) J
            J = np.stack([v.reshape(-1)[lock] for v in comps], axis=-1).astype(np.float64)
            J /= np.linalg.norm(J, axis=-1, keepdims=True)
            axes = np.array(dv.axes)
            th = np.stack([t1.reshape(-1)[lock], t2.reshape(-1)[lock]], axis=-1).astype(np.float64)
            K = R.quat_multiply(R.quat_conjugate(_chain_quat(axes[:2], th)), J)
            t3.reshape(-1)[lock] = 2.0 * np.arctan2(K[:, 1:] @ axes[2], K[:, 0])
            t3 = R.wrap_angle(t3)
        out.append((t1, t2, t3))
    return out, alpha


def _euler_angles(dv: _Davenport, Lg: np.ndarray):
    """Branch 0 of a 3-hinge body with axes ``+-e_i, +-e_j, +-e_k`` (Tait-Bryan or proper Euler): the intrinsic
    Euler angles of ``J`` (:func:`~kangengine.rotations.quat_to_euler`, the quaternion closed form of Bernardes &
    Viollet 2022) times the axis signs. ``Lg [4, ...]`` component-major (read without a copy); ``J`` need not be
    unit. Returns contiguous ``(t1, t2, t3)`` with ``t1``, ``t3`` in [-pi, pi]."""
    order, signs = dv.euler
    nd = Lg.ndim  # transposes: the views np.moveaxis makes, without its argument checks (short clips)
    comps_last = Lg.transpose(tuple(range(1, nd)) + (0,))
    angles = R.quat_to_euler(comps_last, order, extrinsic=False)  # keeps Lg's component-major layout
    out = tuple(angles.transpose((nd - 1,) + tuple(range(nd - 1))))
    for t, sg in zip(out, signs):
        if sg < 0:
            np.negative(t, out=t)
    return out


def _solve_davenport(dv: _Davenport, comps, theta_out, res_out):
    """Both Davenport branches of quaternion components ``comps`` (4 arrays ``[...]``) into
    ``theta_out [2, ..., 3]`` (angles in [-pi, pi]) and, unless every rotation is reachable,
    ``res_out [2, ...]`` (Gauss-Newton refines the frames out of reach)."""
    branches, _ = _davenport_core(dv, comps, (-1.0, 1.0))
    for br, (t1, t2, t3) in enumerate(branches):
        theta_out[br, ..., 0] = t1
        theta_out[br, ..., 1] = R.wrap_angle(t2)
        theta_out[br, ..., 2] = t3
    if not dv.complete:
        J = np.stack(comps, axis=-1).astype(np.float64)
        J /= np.linalg.norm(J, axis=-1, keepdims=True)
        axes = np.array(dv.axes)
        for br in range(2):
            th = theta_out[br].astype(np.float64)
            r = _chain_residual(J, axes, th)
            bad = r > _REFINE_TOL
            if bad.any():
                th[bad] = _chain_gauss_newton(J[bad], axes, th[bad])
                r[bad] = _chain_residual(J[bad], axes, th[bad])
            theta_out[br] = R.wrap_angle(th)
            res_out[br] = r


def _merge_parallel(axes: np.ndarray):
    """Consecutive parallel axes merged: (reduced axes [m, 3], member lists, signs [n])."""
    red, members, signs = [], [], []
    for i, a in enumerate(axes):
        if red and abs(float(a @ red[-1])) > 1.0 - 1e-9:
            members[-1].append(i)
            signs.append(float(np.sign(a @ red[-1])))
        else:
            red.append(a)
            members.append([i])
            signs.append(1.0)
    return np.array(red), members, np.array(signs)


def _closed_form_seeds(J: np.ndarray, axes: np.ndarray) -> list[np.ndarray]:
    """Closed-form solutions ``[M, m]`` of a chain without consecutive parallel axes: one (1 or 2 axes) or
    the two Davenport branches of the first three axes, further angles at zero."""
    comps = tuple(np.ascontiguousarray(J[:, i]) for i in range(4))
    m = axes.shape[0]
    ax = tuple(_snapv(a) for a in axes)
    if m == 1:
        return [_solve_hinge1(ax[0], comps)[0][:, None]]
    if m == 2:
        t1, t2, _ = _solve_hinge2(ax, comps)
        return [np.stack([t1, t2], axis=-1)]
    dv = _Davenport(ax[:3])
    if dv.degenerate:
        return []
    out = np.empty((2, J.shape[0], 3))
    _solve_davenport(dv, comps, out, np.empty((2, J.shape[0])))
    pad = np.zeros((J.shape[0], m - 3))
    return [np.concatenate([out[0], pad], axis=-1), np.concatenate([out[1], pad], axis=-1)]


def _solve_chain(J: np.ndarray, axes: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Any other hinge chain on one body (consecutive parallel axes, 4+ hinges): ``J [M, 4]`` unit
    float64, ``axes [n, 3]`` -> candidate solutions ``(angles [M, n] in [-pi, pi], residual [M])``.

    Consecutive parallel axes are merged (their angle is split evenly), which leaves a chain without
    degenerate triples; its closed form (1 or 2 hinges; the two Davenport branches of the first three, the
    others at zero) gives one or two candidates, continuous in time like the closed forms themselves. Frames
    the closed form does not reach are refined by Gauss-Newton anchored to it (``_CHAIN_REG``).
    """
    M, n = J.shape[0], axes.shape[0]
    red, members, signs = _merge_parallel(axes)
    out = []
    for th_red in _closed_form_seeds(J, red):
        th = np.empty((M, n))
        for r, mem in enumerate(members):
            for i in mem:
                th[:, i] = signs[i] * th_red[:, r] / len(mem)
        res = _chain_residual(J, axes, th)
        bad = res > _REFINE_TOL
        if bad.any():
            th[bad] = _chain_gauss_newton(J[bad], axes, th[bad], iters=20, reg=_CHAIN_REG)
            res[bad] = _chain_residual(J[bad], axes, th[bad])
        out.append((R.wrap_angle(th), res))
    return out


def _body_plan(layout: ArticulationCoordinateLayout, b: int):
    """(kind, hinge blocks to solve, ball block or None, blocks held at ref)."""
    blocks = [x for x in layout.blocks_of_body(b) if x.joint_type is not JointType.FIXED]
    if any(x.joint_type is JointType.FREE for x in blocks):
        return "free", [], None, [x for x in blocks if x.joint_type in (JointType.HINGE, JointType.SLIDE)]
    balls = [x for x in blocks if x.joint_type is JointType.BALL]
    hinges = [x for x in blocks if x.joint_type is JointType.HINGE]
    slides = [x for x in blocks if x.joint_type is JointType.SLIDE]
    if balls:
        return _BALL, [], balls[0], hinges + slides
    kind = {0: _NONE, 1: _HINGE1, 2: _HINGE2, 3: _HINGE3}.get(len(hinges), _CHAIN)
    if kind == _HINGE3 and _Davenport([h.axis for h in hinges]).degenerate:
        kind = _CHAIN
    return kind, hinges, None, slides


# ------------------------------------------------------------------------------------------------
# the mapper
# ------------------------------------------------------------------------------------------------


class ArticulationMotionMapper:
    """Maps skeleton motion on an articulation's own skeleton to articulation coordinates and back.

    Args:
        layout: the :class:`~kangengine.animation.ArticulationCoordinateLayout`. Its skeleton is
            ``mapper.skeleton_tree`` (``SkeletonTree.from_articulation(layout)``).

    The input skeleton must have the layout's body names in the layout's order and the same parents
    (:class:`~kangengine.errors.UnknownNameError` / :class:`~kangengine.errors.LayoutMismatch`
    otherwise). Rest translations that differ from the layout's only warn
    (:class:`SkeletonOffsetWarning`): the mapping uses rotations (and the root translation), never the
    skeleton's offsets.

    Attributes:
        use_native: ``True`` (default): motions use the native machine-code passes of
            :mod:`~kangengine.animation.native_mapper` where they apply (llvmlite installed; x/y/z hinge
            triplets; for a free root plus such triplets alone, e.g. the SMPL humanoid, one fused pass writes
            ``q``, ``qd`` and the limit summary), and for layouts of 1-, 2- and 3-hinge bodies without such
            triplets (e.g. the CMU humanoid) the compiled pass of :mod:`~kangengine.animation.native_mapper_mixed`
            (numba installed; the whole motion in one call); ``False``: the numpy reference path everywhere (same
            values to ``1e-9`` rad in float64).
    """

    def __init__(self, layout: ArticulationCoordinateLayout):
        if not isinstance(layout, ArticulationCoordinateLayout):
            raise ShapeError(
                f"got {type(layout).__name__}; expected an ArticulationCoordinateLayout",
                item="ArticulationMotionMapper(layout)",
            )
        self.layout = layout
        self.skeleton_tree = SkeletonTree.from_articulation(layout)
        self.use_native = True  # the native Euler kernel where it applies (False: the numpy reference path)
        self._native_cache: dict = {}
        self._build()

    # -- plan ------------------------------------------------------------------------------------------
    def _build(self):
        lay = self.layout
        nb = lay.num_bodies
        rest = np.asarray(lay.rest_rotations_wxyz, dtype=np.float64)
        self._rest_inv = R.quat_conjugate(rest)
        self._rest_is_identity = np.all(np.abs(rest - [1.0, 0.0, 0.0, 0.0]) < 1e-15, axis=-1)
        self._free = None
        self._ball_bodies, self._ball_q = [], []
        self._none_bodies = []
        self._held = []  # (q offset, ref) of joints kept at ref
        hinge_q, hinge_v, hinge_ref, hinge_lo, hinge_hi = [], [], [], [], []
        groups: dict = {}
        for b in range(nb):
            kind, hinges, ball, held = _body_plan(lay, b)
            self._held += [(x.q_offset, x.ref) for x in held]
            if kind == "free":
                fb = next(x for x in lay.blocks_of_body(b) if x.joint_type is JointType.FREE)
                self._free = (b, fb.q_offset)
                continue
            if kind == _BALL:
                self._ball_bodies.append(b)
                self._ball_q.append(ball.q_offset)
                continue
            if kind == _NONE:
                self._none_bodies.append(b)
                continue
            cols = []
            for h in hinges:
                cols.append(len(hinge_q))
                hinge_q.append(h.q_offset)
                hinge_v.append(h.qd_offset)
                hinge_ref.append(h.ref)
                lo, hi = h.limits if h.limits is not None else (-np.inf, np.inf)
                hinge_lo.append(lo)
                hinge_hi.append(hi)
            axes = tuple(_snapv(np.asarray(h.axis) / np.linalg.norm(h.axis)) for h in hinges)
            groups.setdefault((kind, axes), ([], []))
            groups[(kind, axes)][0].append(b)
            groups[(kind, axes)][1].append(cols)
        self._groups = []
        for (kind, axes), (bodies, cols) in groups.items():
            complete = False
            if kind == _HINGE3:
                complete = _Davenport(axes).complete
            self._groups.append(
                _Group(
                    kind=kind,
                    axes=axes,
                    bodies=np.array(bodies, dtype=np.int64),
                    hinge_cols=np.array(cols, dtype=np.int64),
                    complete=complete,
                )
            )
        self._davenport = {g.axes: _Davenport(g.axes) for g in self._groups if g.kind == _HINGE3}
        self._group_rest_identity = {id(g): bool(np.all(self._rest_is_identity[g.bodies])) for g in self._groups}
        turned = [g for g in self._groups if not self._group_rest_identity[id(g)]]
        self._rest_union = np.unique(np.concatenate([g.bodies for g in turned])) if turned else np.zeros(0, np.int64)
        self._rest_union_pos = {id(g): np.searchsorted(self._rest_union, g.bodies) for g in turned}
        self._rest_union_inv: dict = {}  # dtype -> rest^-1 of self._rest_union [U, 4]
        self._cost_cols: dict = {}  # id(group) -> _cost_columns
        self._summary_plan = None  # _build_summary_plan, on the first mapping
        self._joint_names = lay.joint_names  # a tuple, built from the blocks on every access
        self._trees_ok: set = set()  # skeletons (by exact contents) that passed _check_tree without a warning
        self._two_branch_slow = {
            id(g): (g.kind == _HINGE3 and not g.complete)
            or (g.kind == _CHAIN and len(_merge_parallel(np.array(g.axes))[0]) >= 3)
            for g in self._groups
        }
        self._hinge_q = np.array(hinge_q, dtype=np.int64)
        self._hinge_v = np.array(hinge_v, dtype=np.int64)
        self._hinge_ref = np.array(hinge_ref, dtype=np.float64)
        self._hinge_lo = np.array(hinge_lo, dtype=np.float64)
        self._hinge_hi = np.array(hinge_hi, dtype=np.float64)
        self._hinge_limited = np.isfinite(self._hinge_lo) & np.isfinite(self._hinge_hi)
        lim = self._hinge_limited
        mid = 0.5 * (np.where(lim, self._hinge_lo, 0.0) + np.where(lim, self._hinge_hi, 0.0))
        center = np.where(self._hinge_limited, mid, self._hinge_ref)
        self._hinge_center = center
        self._hinge_narrow = lim & (self._hinge_hi - np.where(lim, self._hinge_lo, 0.0) < _TWO_PI - 1e-9)
        self._group_narrow = {id(g): bool(self._hinge_narrow[g.hinge_cols].any()) for g in self._groups}
        # scalar DOFs that clamping may move: hinges (solved) and held joints (slides/hinges at ref)
        self._slides = [x for x in lay.blocks if x.joint_type is JointType.SLIDE]
        self._tangent_runs = lay.tangent_runs
        runs, rots = self._tangent_runs
        self._tangent_covers = sum(k for _, _, k in runs) + 3 * len(rots) == lay.nv
        hq = self._hinge_q
        self._hinge_contiguous = bool(len(hq)) and bool(np.array_equal(hq, np.arange(hq[0], hq[0] + len(hq))))
        self._group_qcols = {id(g): hq[g.hinge_cols] for g in self._groups}  # [k, n] q columns per group
        # the complete 3-hinge groups the native Euler kernel handles (axes +-e_i, +-e_j, +-e_k, identity rest
        # rotations, limits that never bind)
        self._native_groups = [
            g
            for g in self._groups
            if g.kind == _HINGE3
            and self._davenport[g.axes].euler is not None
            and g.complete
            and not self._group_narrow[id(g)]
            and self._group_rest_identity[id(g)]
        ]
        lim = self._hinge_limited  # _turn_shift's tables of the limited hinges (None: no limited hinge)
        self._limited_tables = (
            (np.flatnonzero(lim), self._hinge_lo[lim], self._hinge_hi[lim], self._hinge_center[lim])
            if lim.any()
            else (None, None, None, None)
        )
        self._fused_spec = self._fused_plan()
        self._mixed_spec = self._mixed_plan()

    def _fused_plan(self):
        """The constants of the fused native pass (:func:`~kangengine.animation.native_mapper.fused_ir`) when the
        articulation is a free root plus one group of x/y/z hinge triplets that the native Euler kernel handles
        (identity rest rotations, limits that never bind) and ``q``/``qd`` hold nothing else (the SMPL humanoid),
        else None."""
        lay = self.layout
        if self._free is None or self._ball_bodies or self._none_bodies or self._held or len(self._groups) != 1:
            return None
        g = self._groups[0]
        dv = self._davenport.get(g.axes) if g.kind == _HINGE3 else None
        if dv is None or dv.euler is None or not g.complete or self._group_narrow[id(g)]:
            return None
        if not self._group_rest_identity[id(g)]:
            return None
        hq, hv, nh = self._hinge_q, self._hinge_v, len(self._hinge_q)
        rb, rq = self._free
        rv = next(x.qd_offset for x in lay.blocks_of_body(rb) if x.joint_type is JointType.FREE)
        runs, rots = self._tangent_runs
        want_runs = sorted([(rq, rv, 3), (int(hq[0]), int(hv[0]), nh)])
        if sorted(tuple(map(int, r)) for r in runs) != want_runs or [tuple(map(int, r)) for r in rots] != [
            (rq + 3, rv + 3)
        ]:
            return None  # the hinges are one run of q and qd columns, the root the only other block
        if lay.nq != 7 + nh or lay.nv != 6 + nh:
            return None
        order, signs = dv.euler
        cols = g.hinge_cols
        limits = np.stack([self._hinge_lo[cols], self._hinge_hi[cols]], axis=-1)
        return dict(
            num_bodies=lay.num_bodies,
            bodies=g.bodies,
            qcols=hq[cols],
            vcols=hv[cols],
            order=order,
            signs=signs,
            phi=dv.phi,
            weight=_COST_ANGLE_WEIGHT,
            limits=limits,
            refs=self._hinge_ref[cols],
            root_body=rb,
            root_q=rq,
            root_v=rv,
            nq=lay.nq,
            nv=lay.nv,
        )

    def _mixed_plan(self):
        """The tables of the compiled mixed-layout pass (:func:`~kangengine.animation.native_mapper_mixed.map_motion`)
        when every body is the free root, jointless, or 1, 2 or 3 hinges with a closed form (3 hinges: about
        ``+-e_i, +-e_j, +-e_k``), no hinge triplet is served by the llvm Euler kernels (the SMPL humanoid keeps
        them) and no joint held at ``ref`` has limits (e.g. the CMU humanoid), else None. Layout constants, built
        once per mapper."""
        lay = self.layout
        if self._ball_bodies or self._native_groups or not len(self._hinge_q):
            return None
        held = {off for off, _ in self._held}
        if any(b.q_offset in held and b.limits is not None for b in lay.blocks):
            return None
        slots, axes, aux, codes = [], [], [], []
        nh = len(self._hinge_q)
        cost_lo, cost_hi = np.full(nh, -np.inf), np.full(nh, np.inf)
        triplets = 0
        for g in self._groups:
            if g.kind == _HINGE3:
                dv = self._davenport[g.axes]
                if not g.complete or dv.euler is None:
                    return None
                order, signs = dv.euler
                g_aux, code = (*signs, dv.phi), _euler_code(order)
                for i in range(3):  # the branch cost's limits, as _cost_columns takes them
                    cols = g.hinge_cols[:, i]
                    if self._group_narrow[id(g)] and self._hinge_narrow[cols].any():
                        cost_lo[cols], cost_hi[cols] = self._hinge_lo[cols], self._hinge_hi[cols]
            elif g.kind == _HINGE2:
                d12, c12 = _hinge2_consts(g.axes)
                g_aux, code = (d12, *c12), (0,) * 6
            elif g.kind == _HINGE1:
                g_aux, code = (0.0,) * 4, (0,) * 6
            else:
                return None
            n = len(g.axes)
            for b, cols in zip(g.bodies, g.hinge_cols):
                slots.append([int(b), n, *cols, *([-1] * (3 - n)), triplets if n == 3 else -1])
                triplets += n == 3
                axes.append(list(g.axes) + [(0.0, 0.0, 0.0)] * (3 - n))
                aux.append(g_aux)
                codes.append(code)
        runs, rots = self._tangent_runs
        lo, hi = self._hinge_lo, self._hinge_hi
        column = {int(c): h for h, c in enumerate(self._hinge_q)}
        scalar = [b for b in lay.blocks if b.joint_type in (JointType.HINGE, JointType.SLIDE) and b.limits is not None]
        self._mixed_summary_plan = (
            np.array([column[b.q_offset] for b in scalar], dtype=np.int64),  # all hinges (held ones are unlimited)
            [lay.dof_names[b.qd_offset] for b in scalar],
        )
        return dict(
            root=np.array(self._free if self._free is not None else (-1, -1), dtype=np.int64),
            none_bodies=np.array(self._none_bodies, dtype=np.int64),
            rest_inv=np.ascontiguousarray(self._rest_inv, dtype=np.float64),
            turned=~self._rest_is_identity,
            slots=np.array(slots, dtype=np.int64),
            slot_axes=np.array(axes, dtype=np.float64),
            slot_aux=np.array(aux, dtype=np.float64),
            slot_code=np.array(codes, dtype=np.int64),
            cost_tab=np.stack([self._hinge_ref, self._hinge_center, cost_lo, cost_hi], axis=-1),
            h_q=self._hinge_q,
            h_v=self._hinge_v,
            h_tab=np.stack([self._hinge_ref, self._hinge_center, lo, hi], axis=-1),
            h_limited=self._hinge_limited,
            h_narrow=self._hinge_narrow,
            num_triplets=triplets,
            runs=np.array(runs, dtype=np.int64).reshape(-1, 3),
            rots=np.array(rots, dtype=np.int64).reshape(-1, 2),
        )

    # -- input checks ----------------------------------------------------------------------------------
    def _check_tree(self, tree: SkeletonTree, what: str):
        """The input checks of a skeleton (names, order, parents; offsets warn). A skeleton that passed every
        check without a warning is remembered by its exact contents (names, parent and offset bytes), so the
        next motion on the same skeleton skips the comparisons; any other skeleton is checked in full."""
        lt, parents = tree.local_translation, tree.parent_indices
        key = (tuple(tree.node_names), parents.dtype.str, parents.tobytes(), lt.dtype.str, lt.shape, lt.tobytes())
        if key in self._trees_ok:
            return
        if self._check_tree_full(tree, what):  # warned: not remembered, the next motion on it warns again
            return
        if len(self._trees_ok) >= 64:  # a bounded memory: skeletons of many shapes are checked in full again
            self._trees_ok.clear()
        self._trees_ok.add(key)

    def _check_tree_full(self, tree: SkeletonTree, what: str) -> bool:
        """:meth:`_check_tree` in full; True when the offsets differ (warned)."""
        names = self.layout.body_names
        if tree.node_names != names:
            unknown = [n for n in tree.node_names if n not in names]
            missing = [n for n in names if n not in tree.node_names]
            if unknown or missing:
                raise UnknownNameError(
                    f"{what} skeleton nodes do not match the articulation's bodies: unknown nodes {unknown}, "
                    f"missing bodies {missing}; bodies are (in order): {', '.join(names)}. Map the motion onto "
                    "SkeletonTree.from_articulation(desc) first (retargeting)",
                    path=self.layout.source,
                )
            first = next(i for i, (a, b) in enumerate(zip(tree.node_names, names)) if a != b)
            raise LayoutMismatch(
                f"{what} skeleton has the articulation's bodies in another order (first difference at index "
                f"{first}: {tree.node_names[first]!r}, expected {names[first]!r}); expected the order "
                f"{', '.join(names)} (the loader's BFS/DFS order)",
                path=self.layout.source,
            )
        if not np.array_equal(tree.parent_indices, np.asarray(self.layout.parent_indices)):
            bad = [names[i] for i, (a, b) in enumerate(zip(tree.parent_indices, self.layout.parent_indices)) if a != b]
            raise LayoutMismatch(
                f"{what} skeleton has other parents than the articulation for nodes {bad}", path=self.layout.source
            )
        if tree is not self.skeleton_tree and not np.allclose(
            tree.local_translation[1:], self.layout.rest_positions[1:], atol=1e-6
        ):
            diff = np.abs(tree.local_translation[1:] - self.layout.rest_positions[1:]).max()
            warnings.warn(
                f"{what} skeleton offsets differ from the articulation's rest offsets (max {diff:.3g} m): "
                "rotations are mapped, but body positions will follow the articulation",
                SkeletonOffsetWarning,
                stacklevel=4,
            )
            return True
        return False

    # -- public API ----------------------------------------------------------------------------------
    def to_articulation_motion(
        self, skeleton_motion: SkeletonMotion, *, clamp_to_limits: bool = False
    ) -> MappingResult:
        """Map a motion on the articulation's skeleton to ``q``/``qd``.

        Args:
            skeleton_motion: :class:`~kangengine.animation.SkeletonMotion` on ``self.skeleton_tree``
                (same node names, order and parents): ``root_translation [frames, 3]`` m in world,
                ``local_rotation [frames, bodies, 4]`` WXYZ ``parent_from_body`` including the rest
                rotation. numpy or torch (converted to numpy), float32 or float64.
            clamp_to_limits: clamp hinge and slide values into their limits after decomposition;
                ``clamped`` reports the moves and ``residual_angles`` includes their effect.

        Returns:
            :class:`MappingResult`. Over time: the 3-hinge branch is followed continuously (consecutive
            frames' two solutions are matched by a vectorised nearest-pair rule and the track with the
            smaller total limit violation, then smaller angles, is kept); hinge angles are unwrapped and
            shifted by a constant multiple of 2 pi into their limits (unlimited hinges: first frame within
            pi of ``ref``); a hinge whose limits span less than 2 pi cannot wind: its frames more than pi
            from the middle of its limits are re-wrapped to the nearest feasible turn (counted per DOF in
            ``metadata["mapper"]["rewrapped_frames"]``, with the limit violations and clamping amounts);
            quaternions (free root, balls) are sign-continuous with ``w >= 0`` at frame 0.
            ``qd`` are central differences through ``layout.difference`` of the unwrapped path (the
            clamped one when clamping; one-sided at the ends; zeros for
            a single frame). Large ``q`` and ``qd`` of the fused native pass (the SMPL humanoid) are written into
            freed memory of earlier results when it fits (``ke.animation.output_pool``; ordinary writable arrays,
            never memory another live array uses).
        """
        if not isinstance(skeleton_motion, SkeletonMotion):
            raise ShapeError(
                f"got {type(skeleton_motion).__name__}; expected a SkeletonMotion (use "
                "to_articulation_coordinates for single or batched states)",
                item="to_articulation_motion",
            )
        self._check_tree(skeleton_motion.tree, "motion")
        m = skeleton_motion.numpy()
        L = np.asarray(m.local_rotation)
        rt = np.asarray(m.root_translation)
        dtype = L.dtype if L.dtype in (np.float32, np.float64) else np.float64
        lay = self.layout
        fps = skeleton_motion.fps
        fused = self._native_fused(dtype) if not clamp_to_limits and L.shape[0] >= 3 else None
        if fused is not None:  # one native pass writes q, qd and the summary's counters (the SMPL humanoid)
            return self._map_fused(fused, skeleton_motion, L.astype(dtype, copy=False), rt.astype(dtype, copy=False))
        mixed = _mixed_kernel() if self._mixed_spec is not None and self.use_native and L.shape[0] else None
        if mixed is not None:  # one compiled pass (mixed 1-3 hinge layouts: the CMU humanoid)
            return self._map_mixed(
                mixed, skeleton_motion, L.astype(dtype, copy=False), rt.astype(dtype, copy=False), clamp_to_limits
            )
        # the native second pass can write the hinges' qd on the way (q_path is q: no clamping, no re-wrapping)
        qd_out = {"fps": fps, "qd": None} if not clamp_to_limits and not self._hinge_narrow.any() else None
        q, residual, clamped, rewrapped, q_path = self._solve(
            L.astype(dtype, copy=False),
            rt.astype(dtype, copy=False),
            time_axis=True,
            clamp=clamp_to_limits,
            qd_out=qd_out,
        )
        qd = self._velocities(q_path, fps, None if qd_out is None else qd_out["qd"], unit=True)
        meta = dict(skeleton_motion.metadata)
        meta["mapper"] = self._mapping_summary(q, residual, clamped, rewrapped, clamp_to_limits)
        motion = ArticulationMotion(q, qd, fps, lay.model_signature, joint_names=self._joint_names, metadata=meta)
        return MappingResult(motion=motion, residual_angles=residual, clamped=clamped)

    def _map_mixed(
        self, kern, skeleton_motion: SkeletonMotion, L: np.ndarray, rt: np.ndarray, clamp: bool
    ) -> MappingResult:
        """:meth:`to_articulation_motion` by the compiled mixed-layout pass (:meth:`_mixed_plan`): ``q``, ``qd``,
        residuals, clamping, re-wrapping and the limit summary's per-hinge counters in one call; the same values
        as the numpy path to the dtype's rounding, the same branch choices."""
        lay = self.layout
        N, dt, fps = L.shape[0], L.dtype, skeleton_motion.fps
        L = np.ascontiguousarray(L)
        rt = np.ascontiguousarray(rt)
        q = np.zeros((N, lay.nq), dtype=dt)
        for off, ref in self._held:
            q[:, off] = ref
        qd = np.zeros((N, lay.nv), dtype=dt)
        residual = np.zeros((N, lay.num_bodies), dtype=dt)
        clamped = np.zeros((N, lay.nv), dtype=dt)
        nh = len(self._hinge_q)
        rewrapped, count = np.zeros(nh, dtype=np.int64), np.zeros(nh, dtype=np.int64)
        worst = np.zeros(nh)
        info = np.zeros(3, dtype=np.int64)
        kern(L, rt, **self._mixed_spec, fps=float(fps), clamp=bool(clamp), q=q, qd=qd, residual=residual,
             clamped=clamped, rewrapped=rewrapped, worst=worst, count=count, info=info)  # fmt: skip
        if info[0] >= 0:  # an all-zero quaternion: refused naming its frame and body
            f = int(info[0])
            self._check_nonzero(np.ascontiguousarray(L[f : f + 1].transpose(2, 0, 1)), f)
        meta = dict(skeleton_motion.metadata)
        meta["mapper"] = self._mixed_summary(residual, clamped, rewrapped, worst, count, clamp)
        args = (q, qd, fps, lay.model_signature)
        if info[2]:  # refused as ArticulationMotion refuses it, naming the frame and column
            ArticulationMotion(*args, joint_names=self._joint_names, metadata=meta)
        motion = ArticulationMotion(*args, joint_names=self._joint_names, metadata=meta, skip_checks=True)
        return MappingResult(motion=motion, residual_angles=residual, clamped=clamped)

    def _mixed_summary(self, residual, clamped, rewrapped, worst, count, clamp: bool) -> dict:
        """:meth:`_mapping_summary` from the compiled pass's per-hinge counters (``worst``, ``count [hinges]``, of
        ``q`` before clamping): every limited scalar DOF of a mixed layout is a hinge (:meth:`_mixed_plan`), so the
        summary is read off the counters, the same dictionary."""
        plan = self._summary_plan
        if plan is None:
            plan = self._summary_plan = self._build_summary_plan()
        names = plan[6]
        pick, dofs = self._mixed_summary_plan  # the hinge column and DOF name of each limited scalar block
        worst_over = worst[pick]
        n = residual.shape[0]
        viol = {dofs[i]: {"max": float(worst_over[i]), "fraction": float(count[pick[i]] / n)}
                for i in np.flatnonzero(worst_over > 1e-6)}  # fmt: skip
        top = sorted(viol.items(), key=lambda kv: -kv[1]["max"])[:10]
        return {
            "clamp_to_limits": bool(clamp),
            "max_residual_angle": float(residual.max()) if residual.size else 0.0,
            "limit_violation_max": max((v["max"] for v in viol.values()), default=0.0),
            "limit_violation_dofs": dict(top),
            "clamped_max": float(max(clamped.max(), -clamped.min())) if clamp and clamped.size else 0.0,
            "rewrapped_frames": {names[i]: int(rewrapped[i]) for i in np.flatnonzero(rewrapped)},
        }

    def _mapping_summary(
        self, q, residual, clamped, rewrapped, clamp_to_limits: bool, *, hinge_over=None, max_residual=None
    ) -> dict:
        """What a user must see about a mapped clip (kept in the motion's metadata): residuals, how far the
        reference leaves the joint limits (before clamping), how much clamping moved, and the hinges whose
        frames were brought back from a wound angle (:meth:`_rewrap_narrow`). ``hinge_over``: ``(worst, count,
        known)`` per hinge-table column from the fused native pass (the largest violation, the frames beyond
        ``1e-6``, whether they hold for the final ``q``); ``max_residual``: the largest residual when known (0 by
        construction), else read from ``residual``."""
        lay = self.layout
        plan = self._summary_plan
        if plan is None:  # layout constants: built on the first call
            plan = self._summary_plan = self._build_summary_plan()
        scalar, qcols, vcols, lo, hi, pick, hinge_names = plan
        viol = {}
        n = q.shape[0]
        if scalar and n:
            worst_over = np.zeros(len(scalar))
            count = np.zeros(len(scalar), dtype=np.int64)
            todo = np.ones(len(scalar), dtype=bool)
            if hinge_over is not None:  # the native pass counted these columns already
                column = {int(c): i for i, c in enumerate(self._hinge_q)}
                for i, b in enumerate(scalar):
                    h = column.get(b.q_offset)
                    if h is not None and hinge_over[2][h]:
                        worst_over[i], count[i], todo[i] = hinge_over[0][h], int(hinge_over[1][h]), False
            for s in range(0, n if todo.any() else 0, _SUMMARY_CHUNK):  # frame blocks: temporaries in cache
                block = q[s : s + _SUMMARY_CHUNK, pick]
                if clamp_to_limits:
                    block = block.astype(np.float64) - clamped[s : s + _SUMMARY_CHUNK, vcols]  # before clamping
                    out = np.flatnonzero(todo)
                else:  # only columns whose block leaves the limits can violate them (exact comparisons)
                    mn, mx = block.min(axis=0).astype(np.float64), block.max(axis=0).astype(np.float64)
                    out = np.flatnonzero(((mn < lo) | (mx > hi)) & todo)
                    if out.size == 0:
                        continue
                col = block[:, out].astype(np.float64)
                over = np.maximum(lo[out] - col, 0.0)
                over += np.maximum(col - hi[out], 0.0)
                worst_over[out] = np.maximum(worst_over[out], over.max(axis=0))
                count[out] += np.count_nonzero(over > 1e-6, axis=0)
            for i in np.flatnonzero(worst_over > 1e-6):  # in column order, as a loop over all of them
                b = scalar[i]
                viol[lay.dof_names[b.qd_offset]] = {"max": float(worst_over[i]), "fraction": float(count[i] / n)}
        worst = sorted(viol.items(), key=lambda kv: -kv[1]["max"])[:10]
        names = hinge_names
        return {
            "clamp_to_limits": bool(clamp_to_limits),
            "max_residual_angle": float(max_residual)
            if max_residual is not None
            else (float(residual.max()) if residual.size else 0.0),
            "limit_violation_max": max((v["max"] for v in viol.values()), default=0.0),
            "limit_violation_dofs": dict(worst),
            # zeros unless clamping (never read then: a zero array's pages stay unallocated); no |.| temporary
            "clamped_max": float(max(clamped.max(), -clamped.min())) if clamp_to_limits and clamped.size else 0.0,
            "rewrapped_frames": {names[i]: int(rewrapped[i]) for i in np.flatnonzero(rewrapped)},
        }

    def _build_summary_plan(self) -> tuple:
        """The layout constants of :meth:`_mapping_summary`: the limited scalar blocks, their q and qd columns,
        limits, the q selection (a slice when contiguous) and the hinge DOF names."""
        lay = self.layout
        scalar = [b for b in lay.blocks if b.joint_type in (JointType.HINGE, JointType.SLIDE) and b.limits is not None]
        qcols = np.array([b.q_offset for b in scalar], dtype=np.int64)
        vcols = np.array([b.qd_offset for b in scalar], dtype=np.int64)
        lo, hi = np.asarray(lay.dof_lower)[vcols], np.asarray(lay.dof_upper)[vcols]
        pick = qcols
        if scalar and np.array_equal(qcols, np.arange(qcols[0], qcols[0] + len(qcols))):
            pick = slice(int(qcols[0]), int(qcols[0]) + len(qcols))
        names = [lay.dof_names[int(v)] for v in self._hinge_v] if len(self._hinge_v) else []
        return scalar, qcols, vcols, lo, hi, pick, names

    def to_articulation_coordinates(
        self, skeleton_state: SkeletonState, *, clamp_to_limits: bool = False
    ) -> CoordinatesResult:
        """Map one pose or a batch of independent poses to ``q``.

        Args:
            skeleton_state: :class:`~kangengine.animation.SkeletonState` on ``self.skeleton_tree`` with
                ``local_rotation [..., bodies, 4]`` and ``root_translation [..., 3]`` (numpy or torch).
            clamp_to_limits: as in :meth:`to_articulation_motion`.

        Returns:
            :class:`CoordinatesResult` with ``q [..., nq]`` (the state's dtype). Each pose is solved on its
            own: the 3-hinge branch with the smaller limit violation, then smaller angles; hinge angles
            within pi of the middle of their limits (unlimited: of ``ref``); quaternions with ``w >= 0``.
        """
        if not isinstance(skeleton_state, SkeletonState):
            raise ShapeError(
                f"got {type(skeleton_state).__name__}; expected a SkeletonState", item="to_articulation_coordinates"
            )
        self._check_tree(skeleton_state.tree, "state")
        s = skeleton_state.numpy()
        L = np.asarray(s.local_rotation)
        rt = np.asarray(s.root_translation)
        lead = L.shape[:-2]
        dtype = L.dtype if L.dtype in (np.float32, np.float64) else np.float64
        L2 = L.reshape((-1,) + L.shape[-2:]).astype(dtype, copy=False)
        rt2 = rt.reshape(-1, 3).astype(dtype, copy=False)
        q, residual, clamped, _, _ = self._solve(L2, rt2, time_axis=False, clamp=clamp_to_limits)
        nb = self.layout.num_bodies
        return CoordinatesResult(
            q=q.reshape(lead + (self.layout.nq,)),
            residual_angles=residual.reshape(lead + (nb,)),
            clamped=clamped.reshape(lead + (self.layout.nv,)),
        )

    def to_skeleton_state(self, q) -> SkeletonState:
        """The articulation's skeleton posed at ``q``.

        Args:
            q: ``[..., nq]`` numpy or torch, float32/float64.

        Returns:
            :class:`~kangengine.animation.SkeletonState` of ``self.skeleton_tree`` (same array type,
            dtype and device): ``local_rotation`` = ``parent_from_body`` rotations at ``q`` (rest rotation
            included), ``root_translation`` = the root body's world position and, when a joint anchor
            moves a body origin, per-pose ``local_translation``; its global transforms equal
            :func:`~kangengine.animation.forward_kinematics`.

        Raises:
            MotionError: the layout has prismatic (slide) joints, which a skeleton cannot represent.
        """
        self._refuse_slides("to_skeleton_state")
        pos, rot = self.layout.local_transforms(q)
        lt = pos if self._needs_local_translation else None
        return SkeletonState(self.skeleton_tree, pos[..., 0, :], rot, lt, skip_checks=True)

    def to_skeleton_motion(self, motion: ArticulationMotion) -> SkeletonMotion:
        """The articulation's skeleton following ``motion`` (for viewing, BVH export, motion libraries).

        Args:
            motion: :class:`~kangengine.animation.ArticulationMotion` made for this layout (same nq, nv and
                signature, else :class:`~kangengine.errors.LayoutMismatch`).

        Returns:
            :class:`~kangengine.animation.SkeletonMotion` (float32, ``[frames, bodies, ...]``, same fps and
            metadata), as :meth:`to_skeleton_state` per frame.

        Raises:
            MotionError: the layout has prismatic joints.
        """
        if not isinstance(motion, ArticulationMotion):
            raise ShapeError(f"got {type(motion).__name__}; expected an ArticulationMotion", item="to_skeleton_motion")
        motion.check_layout(self.layout, what="articulation motion")
        self._refuse_slides("to_skeleton_motion")
        st = self.to_skeleton_state(motion.q)
        return SkeletonMotion(
            self.skeleton_tree,
            st.root_translation,
            st.local_rotation,
            motion.fps(),
            st.local_translation,
            metadata=motion.metadata,
            skip_checks=True,
        )

    def velocities(self, q, fps: float) -> np.ndarray:
        """``qd [frames, nv]`` of a sampled trajectory ``q [frames, nq]`` at ``fps``, in the layout's
        canonical tangent convention (same dtype as ``q``).

        Central differences ``layout.difference(q[t+1], q[t-1], 2 dt)`` inside (scalars and positions:
        ``(q[t+1] - q[t-1]) / 2dt``; quaternions: ``log(q[t+1] q[t-1]^-1) / 2dt``, world/parent frame),
        one-sided ``layout.difference`` at the first and last frame, zeros for a single frame. Rotations
        between ``t-1`` and ``t+1`` must stay below pi (the shortest rotation is taken).
        """
        return self._velocities(q, fps, None, unit=False)

    def _velocities(self, q, fps: float, pre, *, unit: bool) -> np.ndarray:
        """:meth:`velocities`; ``pre`` (or None): ``qd [frames, nv]`` whose hinge columns' inner rows the native
        second pass already holds (:meth:`_place_hinges`), the rest is filled here. ``unit``: the quaternions
        of ``q`` are unit already (the solver's output: normalised, sign-continuous), not normalised again."""
        lay = self.layout
        q = np.asarray(q)
        n = q.shape[0]
        if n < 2:
            return np.zeros((n, lay.nv), dtype=q.dtype)
        dt = 1.0 / float(fps)
        runs, rots = self._tangent_runs
        if pre is not None:
            qd = pre
            hinge_run = (int(self._hinge_q[0]), int(self._hinge_v[0]), len(self._hinge_q))
            runs = tuple(r for r in runs if tuple(map(int, r)) != hinge_run)
        elif self._tangent_covers:
            qd = np.empty((n, lay.nv), dtype=q.dtype)
        else:
            qd = np.zeros((n, lay.nv), dtype=q.dtype)
        if pre is None and n <= _CHUNK and q.dtype.kind == "f":
            return self._velocities_small(q, qd, dt, unit=unit)
        # inside: layout.difference(q[2:], q[:-2], 2 dt) block by block, written in place (no [frames, nv]
        # temporaries); the same operations, so the same values
        for s in range(1, n - 1, _CHUNK):  # frame blocks: the difference is still in cache when divided
            e = min(s + _CHUNK, n - 1)
            for a, v0, k in runs:
                inner = qd[s:e, v0 : v0 + k]
                np.subtract(q[s + 1 : e + 1, a : a + k], q[s - 1 : e - 1, a : a + k], out=inner)
                np.divide(inner, 2.0 * dt, out=inner)
        for s in range(1, n - 1, _ROT_CHUNK):
            e = min(s + _ROT_CHUNK, n - 1)
            for a, v0 in rots:
                q1, q0 = q[s + 1 : e + 1, a : a + 4], q[s - 1 : e - 1, a : a + 4]
                if not unit:
                    q1, q0 = R.quat_normalize(q1), R.quat_normalize(q0)
                rel = R.quat_multiply(q1, R.quat_conjugate(q0))
                qd[s:e, v0 : v0 + 3] = R.quat_to_rotvec(rel) / (2.0 * dt)
        qd[[0, -1]] = lay.difference(q[[1, -1]], q[[0, -2]], dt)  # both ends in one call (rows independent)
        return qd

    def _velocities_small(self, q, qd, dt: float, *, unit: bool) -> np.ndarray:
        """:meth:`_velocities` of a clip of at most ``_CHUNK`` frames (``n >= 2``) into ``qd``, all rows at once:
        row ``t`` is ``(q[hi] - q[lo]) / d`` with ``hi = min(t + 1, n - 1)``, ``lo = max(t - 1, 0)``, ``d = 2 dt``
        inside and ``dt`` at the ends (the ends' quaternions normalised, as ``layout.difference`` does). Each
        element goes through the same operations as the block loop and ``layout.difference``, so the values are
        the same; a handful of calls instead of a loop's and ``difference``'s per-call overhead (short clips)."""
        n = q.shape[0]
        runs, rots = self._tangent_runs
        hi = np.arange(1, n + 1)
        hi[-1] = n - 1
        lo = np.arange(-1, n - 1)
        lo[0] = 0
        div = np.full((n, 1), 2.0 * dt, dtype=q.dtype)
        div[0] = div[-1] = dt
        for a, v0, k in runs:
            np.divide(q[hi, a : a + k] - q[lo, a : a + k], div, out=qd[:, v0 : v0 + k])
        for a, v0 in rots:
            q1, q0 = q[hi, a : a + 4], q[lo, a : a + 4]
            if unit:  # the ends as layout.difference takes them: normalised
                ends = R.quat_normalize(np.stack([q1[[0, -1]], q0[[0, -1]]]))
                q1[[0, -1]], q0[[0, -1]] = ends[0], ends[1]
            else:
                q1, q0 = R.quat_normalize(q1), R.quat_normalize(q0)
            rel = R.quat_multiply(q1, R.quat_conjugate(q0))
            qd[:, v0 : v0 + 3] = R.quat_to_rotvec(rel) / div
        return qd

    # -- helpers ---------------------------------------------------------------------------------------
    @property
    def _needs_local_translation(self) -> bool:
        return any(
            b.joint_type in (JointType.HINGE, JointType.BALL, JointType.SLIDE) and any(b.anchor) and b.body_index != 0
            for b in self.layout.blocks
        )

    def _refuse_slides(self, what: str):
        if self._slides:
            names = ", ".join(b.joint_name for b in self._slides)
            raise MotionError(
                f"the layout has prismatic (slide) joints {names}; a SkeletonState/SkeletonMotion "
                "holds rotations only and cannot represent them",
                path=self.layout.source,
                item=what,
            )

    # -- the solver ------------------------------------------------------------------------------------
    def _solve(self, L: np.ndarray, root_translation: np.ndarray, *, time_axis: bool, clamp: bool, qd_out=None):
        """L ``[N, B, 4]``, root ``[N, 3]`` -> q ``[N, nq]``, residual ``[N, B]``, clamped ``[N, nv]``,
        ``[hinges]`` frames re-wrapped per hinge (:meth:`_rewrap_narrow`), and the path ``qd`` differentiates:
        the unwrapped angles before re-wrapping (same rotations, no 2 pi steps), or the clamped ``q``. ``qd_out``
        (motions): ``{"fps": fps, "qd": None}``; ``"qd"`` is set when the native second pass wrote the hinges'
        velocities (:meth:`_velocities` fills the rest)."""
        lay = self.layout
        N = L.shape[0]
        dt = L.dtype
        q = np.zeros((N, lay.nq), dtype=dt)
        residual = np.zeros((N, lay.num_bodies), dtype=dt)
        for off, ref in self._held:
            q[:, off] = ref
        if self._free is not None:
            b, off = self._free
            q[:, off : off + 3] = root_translation
            q[:, off + 3 : off + 7] = self._continuous(R.quat_normalize(L[:, b]), time_axis)
        if self._ball_bodies:
            J = self._joint_rotation(L, np.array(self._ball_bodies))  # [N, k, 4]
            J = self._continuous(R.quat_normalize(J), time_axis)
            for i, off in enumerate(self._ball_q):
                q[:, off : off + 4] = J[:, i]
        if self._none_bodies:
            idx = np.array(self._none_bodies)
            J = self._joint_rotation(L, idx)
            residual[:, idx] = R.quat_angle(J)
        if len(self._hinge_q):
            self._solve_hinges(L, q, residual, time_axis, qd_out)  # checks every quaternion on the way
        else:
            self._check_nonzero(np.moveaxis(L, -1, 0), 0)
        q_path = q.copy() if time_axis and not clamp and self._hinge_narrow.any() else q
        rewrapped = self._rewrap_narrow(q)  # after this q_path (if a copy) keeps the continuous angles
        clamped = np.zeros((N, lay.nv), dtype=dt)
        if clamp:
            self._clamp(q, clamped, residual, L)
        return q, residual, clamped, rewrapped, q_path

    def _check_nonzero(self, Lt: np.ndarray, frame0: int, bodies=None):
        """:class:`FormatError` for an all-zero quaternion in a block ``Lt [4, m, B]`` (frames from
        ``frame0``; ``bodies [B]`` the body indices of its columns, default all): it has no rotation, and
        every closed form would silently read it as the identity."""
        ok = np.any(Lt, axis=0)
        if not ok.all():
            f, b = np.argwhere(~ok)[0]
            b = b if bodies is None else bodies[b]
            raise FormatError(
                f"the quaternion of frame {frame0 + int(f)}, body {self.layout.body_names[b]!r} is "
                "(0, 0, 0, 0); expected a non-zero WXYZ rotation",
                item="local_rotation",
            )

    def _joint_rotation(self, L, idx):
        """``rest^-1 * local`` for bodies ``idx``: ``[N, k, 4]``."""
        J = L[:, idx]
        if not np.all(self._rest_is_identity[idx]):
            J = R.quat_multiply(self._rest_inv[idx].astype(L.dtype), J)
        return J

    @staticmethod
    def _continuous(quat, time_axis):
        """States: ``w >= 0``. Motions: ``w >= 0`` at frame 0, then sign-continuous along frames."""
        if not time_axis:
            return np.where(quat[..., :1] < 0, -quat, quat)
        first = np.where(quat[:1, ..., :1] < 0, -1.0, 1.0).astype(quat.dtype)
        return R.quat_hemisphere_continuity(quat * first, axis=0)

    def _rest_joint_block(self, Lt: np.ndarray) -> np.ndarray:
        """Joint rotations ``rest^-1 * local`` ``[4, m, U]`` (C-contiguous) of the bodies of every group whose rest
        rotations are not all the identity (``self._rest_union``), from a block ``Lt [4, m, B]``: the same
        products as :meth:`_group_comps` per group, in one call."""
        key = Lt.dtype.str
        r = self._rest_union_inv.get(key)
        if r is None:
            r = self._rest_union_inv[key] = self._rest_inv[self._rest_union].astype(Lt.dtype)  # [U, 4]
        return R.quat_multiply(r, Lt[:, :, self._rest_union].transpose(1, 2, 0)).transpose(2, 0, 1)  # moveaxis views

    def _group_comps(self, g: _Group, Lt: np.ndarray) -> np.ndarray:
        """Joint rotations ``[4, m, k]`` (C-contiguous, so each component ``[m, k]`` is contiguous) of the
        group's bodies, from a block ``Lt [4, m, B]`` of local rotations."""
        Lg = Lt[:, :, g.bodies]
        if not self._group_rest_identity[id(g)]:
            r = self._rest_inv[g.bodies].astype(Lt.dtype)  # [k, 4]
            # quat_multiply keeps the component-major layout of the (m, k, 4) view: no copy either way
            Lg = np.moveaxis(R.quat_multiply(r, np.moveaxis(Lg, 0, -1)), -1, 0)
        return Lg

    def _solve_hinges(self, L: np.ndarray, q: np.ndarray, residual: np.ndarray, time_axis: bool, qd_out=None):
        """Hinge angles of every group into ``q``'s hinge columns (in place).

        Pass 1 (frame blocks): closed forms; the joint angles (in [-pi, pi]) go to ``q``. For complete
        3-hinge groups only branch 0 is computed: branch 1 is ``(t1 + pi, 2 phi - t2, t3 + pi)``, so the
        straight/crossed pairing of consecutive frames reduces to ``crossed < straight`` with
        ``straight = d1^2 + d3^2 + (alpha_t - alpha_t-1)^2`` and ``crossed = (pi - |d1|)^2 + (pi - |d3|)^2
        + (alpha_t + alpha_t-1)^2`` (``d`` the wrapped steps of branch 0, the last term wrapped too).
        Then per body: the parity of crossings gives the branch of each of the two tracks; the track with
        the smaller total cost wins. Pass 2 (frame blocks): the chosen branch, unwrapping with a carry
        across blocks, ``+ ref``; then one constant 2 pi shift per hinge into its limits.
        """
        N = L.shape[0]
        dt = L.dtype
        hq = self._hinge_q
        fast = [g for g in self._groups if g.kind == _HINGE3 and g.complete]
        # two solutions per frame, followed over time: non-complete triplets and chains that reduce to 3+ axes
        slow = [g for g in self._groups if self._two_branch_slow[id(g)]]
        cross = {id(g): np.zeros((N, len(g.bodies)), dtype=bool) for g in fast}
        dcost = {id(g): np.empty((N, len(g.bodies)), dtype=dt) for g in fast}
        both = {
            id(g): (np.empty((2, N) + g.hinge_cols.shape, dtype=dt), np.empty((2, N, len(g.bodies)), dtype=dt))
            for g in slow
        }
        carry: dict = {}
        native = self._native_kernels(dt) if time_axis else {}
        if native:
            L = np.ascontiguousarray(L)
            others = np.setdiff1d(np.arange(L.shape[1]), np.concatenate([g.bodies for g in fast if id(g) in native]))
            bufs = {i: np.zeros((6, len(g.bodies))) for g in fast if (i := id(g)) in native}
        for s in range(0, N, _CHUNK):
            e = min(s + _CHUNK, N)
            Lt = Jr = None
            if native:  # the kernels flag zero quaternions of their bodies; the others are checked here
                self._check_nonzero(np.ascontiguousarray(L[s:e, others].transpose(2, 0, 1)), s, others)
            for g in self._groups:
                kern = native.get(id(g))
                if kern is not None and self._native_block(kern, g, L, q, s, e, cross, dcost, carry, bufs[id(g)]):
                    continue
                if Lt is None:
                    Lt = np.ascontiguousarray(L[s:e].transpose(2, 0, 1))
                    self._check_nonzero(Lt, s)
                if self._group_rest_identity[id(g)]:
                    Lg = Lt[:, :, g.bodies]
                else:  # rest^-1 * local of every such group's bodies in one product per block
                    if Jr is None:
                        Jr = self._rest_joint_block(Lt)
                    Lg = Jr[:, :, self._rest_union_pos[id(g)]]
                comps = tuple(Lg)
                qcols = self._group_qcols[id(g)]
                if g.kind == _HINGE1:
                    t, r = _solve_hinge1(g.axes[0], comps)
                    q[s:e, qcols[:, 0]] = t
                    residual[s:e, g.bodies] = r
                elif g.kind == _HINGE2:
                    t1, t2, r = _solve_hinge2(g.axes, comps)
                    q[s:e, qcols[:, 0]] = t1
                    q[s:e, qcols[:, 1]] = t2
                    residual[s:e, g.bodies] = r
                elif g.kind == _CHAIN:
                    k, n = g.hinge_cols.shape
                    Jn = R.quat_normalize(np.stack(comps, axis=-1).astype(np.float64)).reshape(-1, 4)
                    cands = _solve_chain(Jn, np.array(g.axes, dtype=np.float64))
                    if len(cands) == 1:
                        th, r = cands[0]
                        q[s:e, qcols.reshape(-1)] = th.reshape(e - s, k * n)
                        residual[s:e, g.bodies] = r.reshape(e - s, k)
                    else:
                        th2, res2 = both[id(g)]
                        for br, (th, r) in enumerate(cands):
                            th2[br, s:e] = th.reshape(e - s, k, n)
                            res2[br, s:e] = r.reshape(e - s, k)
                elif g.complete:
                    self._fast_block(g, Lg, q, s, e, cross[id(g)], dcost[id(g)], carry, time_axis)
                    if id(g) in native:  # the native blocks' running track sums, for this numpy block
                        _track_block(bufs[id(g)], cross[id(g)][s:e], dcost[id(g)][s:e])
                else:
                    th, res = both[id(g)]
                    _solve_davenport(self._davenport[g.axes], comps, th[:, s:e], res[:, s:e])
        # branch decisions
        use_b1 = {}
        contiguous = self._hinge_contiguous
        place = self._native_place(dt, fast, contiguous) if native and len(native) == len(fast) and N else None
        if place is not None:  # the second pass follows the tracks itself: only which one is cheaper
            g = fast[0]
            flip = bufs[id(g)][4] - 2.0 * bufs[id(g)][5] < 0  # sum of dc - 2 * (sum where parity) < 0
            use_b1[id(g)] = (cross[id(g)], np.ascontiguousarray(flip))
            fast = []
        for g in fast:
            dc = dcost[id(g)]
            if time_axis and N > 1:
                parity = np.logical_xor.accumulate(cross[id(g)], axis=0)
                diff = dc.sum(axis=0, dtype=np.float64) - 2.0 * np.where(parity, dc, 0).sum(axis=0, dtype=np.float64)
                use_b1[id(g)] = parity ^ (diff < 0)[None, :]  # track 1 cheaper: take the other branch
            else:
                use_b1[id(g)] = dc < 0
        for g in slow:
            th, res = both[id(g)]
            t, r = self._pick_branch(g, th, res, time_axis)
            q[:, hq[g.hinge_cols].reshape(-1)] = t.reshape(N, -1)
            residual[:, g.bodies] = r
        self._place_hinges(q, [g for g in self._groups if id(g) in use_b1], use_b1, time_axis, qd_out)

    def _native_kernels(self, dtype) -> dict:
        """``{id(group): kernel}`` of the complete 3-hinge groups the native Euler kernel handles here
        (:mod:`~kangengine.animation.native_mapper`: axes ``+-e_i, +-e_j, +-e_k``, identity rest rotations,
        limits that never bind); empty when llvmlite is missing or ``use_native`` is off."""
        if not self._native_groups or not self.use_native:
            return {}
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            return {}
        from . import native_mapper

        out = {}
        for g in self._native_groups:
            dv = self._davenport[g.axes]
            key = (id(g), np.dtype(dtype).str)
            if key not in self._native_cache:
                order, signs = dv.euler
                self._native_cache[key] = native_mapper.euler_block_kernel(
                    dtype,
                    self.layout.num_bodies,
                    g.bodies,
                    self._hinge_q[g.hinge_cols],
                    order,
                    signs,
                    dv.phi,
                    _COST_ANGLE_WEIGHT,
                )
            if self._native_cache[key] is not None:
                out[id(g)] = self._native_cache[key]
        return out

    def _native_fused(self, dtype):
        """The fused native pass (:func:`~kangengine.animation.native_mapper.fused_kernel`) for motions of
        ``dtype`` when this layout has one (:meth:`_fused_plan`) and ``use_native`` is on, else None."""
        if self._fused_spec is None or not self.use_native:
            return None
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            return None
        key = ("fused", np.dtype(dtype).str)
        if key not in self._native_cache:
            from . import native_mapper

            self._native_cache[key] = native_mapper.fused_kernel(dtype, **self._fused_spec)
        return self._native_cache[key]

    def _map_fused(self, kern, skeleton_motion: SkeletonMotion, L: np.ndarray, rt: np.ndarray) -> MappingResult:
        """:meth:`to_articulation_motion` (no clamping) by the fused native pass: ``q`` and ``qd`` written once, the
        limit summary from the kernel's counters, the residuals 0 by construction (free root, complete triplets).

        The pass follows both tracks of every triplet with the track choice ``flip`` fixed in advance (none:
        track 0, the one that starts on branch 0); its branch-decision sums say which track the whole clip wants,
        and the rare clip that wants another choice is placed again with it. Frame blocks with a frame near
        gimbal lock or a zero quaternion get their branch-0 angles from numpy (:meth:`_fast_block`) and are
        placed by the kernel's second entry. Hinges whose series needs a 2 pi shift into its limits are shifted
        afterwards (their summary columns counted again)."""
        lay = self.layout
        g = self._groups[0]
        N, dt, fps = L.shape[0], L.dtype, skeleton_motion.fps
        L = np.ascontiguousarray(L)
        if rt.strides[1] != rt.itemsize:
            rt = np.ascontiguousarray(rt)
        # every element written by the pass: memory of dropped results is reused (no fresh pages to zero)
        q = _buffers.empty((N, lay.nq), dt)
        qd = _buffers.empty((N, lay.nv), dt)
        flip = np.zeros(len(g.bodies), dtype=bool)
        redo: set = set()
        scratch: list = []
        for _ in range(2):
            state = kern.new_state()
            redo = self._fused_pass(kern, g, L, rt, q, qd, flip, state, fps, redo, scratch)
            want = kern.body(state, "diff") < 0  # track 1 is cheaper
            if np.array_equal(want, flip):
                break
            flip = want
        step = 1.0 / float(fps)
        qd[[0, -1]] = lay.difference(q[[1, -1]], q[[0, -2]], step)  # both ends in one call (rows independent)
        nh = len(self._hinge_q)
        table = {}
        for name in ("min", "max", "count"):
            table[name] = np.empty(nh)
            table[name][g.hinge_cols] = kern.hinge(state, name)
        # the largest violation of each series follows from its min and max (0 for unlimited hinges)
        worst = np.maximum(np.maximum(self._hinge_lo - table["min"], table["max"] - self._hinge_hi), 0.0)
        shift = self._turn_shift(q[0, self._hinge_q].astype(np.float64), table["min"], table["max"])
        moved = np.flatnonzero(shift != 0)
        if moved.size:
            q[:, self._hinge_q[moved]] += (_TWO_PI * shift[moved]).astype(dt)
        residual = np.zeros((N, lay.num_bodies), dtype=dt)  # free root and complete triplets: 0 by construction
        clamped = np.zeros((N, lay.nv), dtype=dt)
        meta = dict(skeleton_motion.metadata)
        meta["mapper"] = self._mapping_summary(
            q,
            residual,
            clamped,
            np.zeros(nh, dtype=np.int64),
            False,
            hinge_over=(worst, table["count"], shift == 0),
            max_residual=0.0,
        )
        args = (q, qd, fps, lay.model_signature)
        if kern.nonfinite(state):  # refused as ArticulationMotion refuses it, naming the frame and column
            ArticulationMotion(*args, joint_names=self._joint_names, metadata=meta)
        motion = ArticulationMotion(*args, joint_names=self._joint_names, metadata=meta, skip_checks=True)
        return MappingResult(motion=motion, residual_angles=residual, clamped=clamped)

    def _fused_pass(self, kern, g, L, rt, q, qd, flip, state, fps, redo: set, scratch: list) -> set:
        """One pass of the fused kernel over all frames in blocks of ``_FUSED_CHUNK``; the blocks in ``redo`` (and any
        the kernel refuses: gimbal lock, zero quaternions) get their branch-0 angles from numpy. Returns the
        blocks numpy did."""
        N = L.shape[0]
        done = set()
        run = kern.bind(L, rt, q, qd, flip, state, fps)
        placed = None  # the runner of numpy-angle blocks, bound on the first such block
        for s in range(0, N, _FUSED_CHUNK):
            e = min(s + _FUSED_CHUNK, N)
            if s not in redo and run(s, e, 0) == 0:
                continue
            done.add(s)
            Lt = np.ascontiguousarray(L[s:e].transpose(2, 0, 1))
            self._check_nonzero(Lt, s)
            if not scratch:  # rows of the blocks numpy does (untouched pages cost nothing)
                scratch += [np.zeros((N, len(g.bodies)), dtype=L.dtype), np.zeros((N, len(g.bodies)), dtype=bool)]
            dc, cr = scratch
            carry = {id(g): tuple(kern.body(state, x).astype(L.dtype) for x in ("t1", "alpha", "t3"))} if s else {}
            self._fast_block(g, self._group_comps(g, Lt), q, s, e, cr, dc, carry, True)
            placed = placed or kern.bind(L, rt, q, qd, flip, state, fps, dc, cr)
            placed(s, e, 1)
        return done

    def _native_place(self, dtype, fast, contiguous: bool):
        """The native second pass of :meth:`_place_hinges` over time when one native 3-hinge group holds every
        hinge and the hinge columns of q are contiguous (the SMPL humanoid), else None."""
        if not (contiguous and len(fast) == 1 and len(self._groups) == 1 and self._native_kernels(dtype)):
            return None
        g = fast[0]
        key = ("place", np.dtype(dtype).str)
        if key not in self._native_cache:
            from . import native_mapper

            nh = len(self._hinge_q)
            body, kind = np.zeros(nh, dtype=np.int64), np.zeros(nh, dtype=np.int64)
            for j, cols in enumerate(g.hinge_cols):
                body[cols] = j
                kind[cols[1]] = 1
            phi = self._davenport[g.axes].phi
            self._native_cache[key] = native_mapper.place_kernel(
                dtype, len(g.bodies), int(self._hinge_q[0]), body, kind, np.full(nh, phi), self._hinge_ref
            )
        return self._native_cache[key]

    def _native_block(self, kern, g, L, q, s, e, cross, dcost, carry, buf) -> bool:
        """:meth:`_fast_block` (time axis) of frames ``s:e`` by the native kernel; False (nothing kept: the
        carry is untouched) when a frame is near gimbal lock or a quaternion is zero, for numpy to redo."""
        prev = carry.get(id(g))
        if prev is not None:
            for r in range(3):
                buf[r] = prev[r]
        track = buf[3:].copy()  # the running parity and sums, kept if numpy redoes the block
        if kern(L[s:e], q[s:e], dcost[id(g)][s:e], cross[id(g)][s:e], buf, prev is not None):
            buf[3:] = track
            return False
        carry[id(g)] = tuple(buf[:3].astype(q.dtype))
        return True

    def _fast_block(self, g, Lg, q, s, e, cross, dcost, carry, time_axis):
        """Branch 0 of a complete 3-hinge group (joint rotations ``Lg [4, m, k]``) for frames ``s:e`` into
        ``q``, the cost difference of the two branches into ``dcost`` and the crossing flags into ``cross``
        (with a carry across blocks)."""
        dv = self._davenport[g.axes]
        if dv.euler is not None:
            t1, t2, t3 = _euler_angles(dv, Lg)
            alpha = None  # |t2 - phi|: branch 0 keeps t2 on one side of phi; computed when needed
        else:
            ((t1, t2, t3),), alpha = _davenport_core(dv, tuple(Lg), (-1.0,))
            t2 = R.wrap_angle(t2)
        qcols = self._group_qcols[id(g)]
        q[s:e, qcols[:, 0]] = t1
        q[s:e, qcols[:, 1]] = t2
        q[s:e, qcols[:, 2]] = t3
        t2b = R.wrap_angle(2.0 * dv.phi - t2)  # branch 1: (t1 - pi sign(t1), 2 phi - t2, t3 - pi sign(t3))
        if self._group_narrow[id(g)]:
            # the six hinge costs (three per branch) as one [m, 6k] array: the same operations per element
            k = len(g.bodies)
            both = np.concatenate([t1, t2, t3, t1 - np.copysign(np.pi, t1), t2b, t3 - np.copysign(np.pi, t3)], axis=1)
            c = self._angle_cost(self._cost_columns(g), both)
            c0 = c[:, :k] + c[:, k : 2 * k] + c[:, 2 * k : 3 * k]
            c1 = c[:, 3 * k : 4 * k] + c[:, 4 * k : 5 * k]
            c1 += c[:, 5 * k :]
            dcost[s:e] = c1 - c0
        else:  # limits never bind: cost = w * (sum of |angles|), |t - pi sign(t)| = pi - |t|
            dc = np.abs(t1)
            dc += np.abs(t3)
            dc *= -2.0
            dc += np.abs(t2b)
            dc -= np.abs(t2)
            dc += _TWO_PI
            dc *= _COST_ANGLE_WEIGHT
            dcost[s:e] = dc
        if not time_axis:
            return
        prev = carry.get(id(g))
        # pairing: crossed < straight  <=>  |d1| + |d3| > pi + (ga^2 - da^2) / (2 pi), which needs
        # |d1| + |d3| > pi / 2 at least (ga^2 - da^2 >= -pi^2): most blocks skip the rest
        d13 = R.wrap_angle(_step(t1, None if prev is None else prev[0]))
        d3 = R.wrap_angle(_step(t3, None if prev is None else prev[2]))
        np.abs(d13, out=d13)
        np.abs(d3, out=d3)
        d13 += d3
        if prev is None:
            d13[0] = 0.0
        if (d13 > 0.5 * np.pi).any():
            if alpha is None:
                alpha = np.abs(R.wrap_angle(t2 - dv.phi))
            da = _step(alpha, None if prev is None else prev[1])
            ga = 2.0 * alpha - da  # alpha_t + alpha_t-1, wrapped below
            ga = np.minimum(ga, _TWO_PI - ga)
            rhs = ga * ga
            rhs -= da * da
            rhs *= 0.5 / np.pi
            rhs += np.pi
            cross[s:e] = d13 > rhs
        a_last = alpha[-1].copy() if alpha is not None else np.abs(R.wrap_angle(t2[-1] - dv.phi))
        carry[id(g)] = (t1[-1].copy(), a_last, t3[-1].copy())

    def _cost_columns(self, g: _Group) -> tuple:
        """``(True, ref, center, lo, hi)`` ``[6k]`` of a 3-hinge group's hinge-table columns in the order of the
        six costs of :meth:`_fast_block` (hinges 1, 2, 3 of every body, twice); a hinge position none of whose
        columns is narrow gets limits ``(-inf, inf)``, so its violation is exactly 0 (its cost the angle term
        alone, as for a position without narrow columns). Built once per group (layout constants)."""
        out = self._cost_cols.get(id(g))
        if out is None:
            parts = []
            for i in range(g.hinge_cols.shape[1]):
                cols = g.hinge_cols[:, i]
                lo, hi = self._hinge_lo[cols], self._hinge_hi[cols]
                if not self._hinge_narrow[cols].any():
                    lo, hi = np.full_like(lo, -np.inf), np.full_like(hi, np.inf)
                parts.append((self._hinge_ref[cols], self._hinge_center[cols], lo, hi))
            tables = [np.concatenate([p[j] for p in parts] * 2) for j in range(4)]
            out = self._cost_cols[id(g)] = (True, *tables)
        return out

    def _angle_cost(self, consts, theta):
        """Branch cost ``[m, k]`` of one hinge per body: limit violation (the best 2 pi shift) plus a small
        weight on the angle's size; ``consts`` the hinge's columns (:meth:`_cost_columns`), ``theta [m, k]`` in
        [-pi, pi]."""
        cost = _COST_ANGLE_WEIGHT * np.abs(theta)
        narrow, ref, c, lo, hi = consts
        if narrow:
            qv = theta + ref.astype(theta.dtype)
            qv = qv - _TWO_PI * np.rint((qv - c) / _TWO_PI)
            viol = np.maximum(lo - qv, 0.0) + np.maximum(qv - hi, 0.0)
            cost = cost + viol.astype(theta.dtype)
        return cost

    def _branch_cost(self, g: _Group, theta):
        """``[..., k]`` cost of angles ``theta [..., k, 3]``: limit violation (after the best 2 pi shift),
        then a small weight on the angles' size."""
        cols = g.hinge_cols
        qv = theta + self._hinge_ref[cols]
        c = self._hinge_center[cols]
        qv = c + R.wrap_angle(qv - c)
        viol = np.maximum(self._hinge_lo[cols] - qv, 0.0) + np.maximum(qv - self._hinge_hi[cols], 0.0)
        return (viol + _COST_ANGLE_WEIGHT * np.abs(R.wrap_angle(theta))).sum(axis=-1)

    def _pick_branch(self, g: _Group, theta, res, time_axis: bool):
        """Choose per body (and frame) one of the two Davenport branches ``theta [2, N, k, 3]``."""
        cost = self._branch_cost(g, theta)  # [2, N, k]
        if res is not None:
            cost = cost + _COST_RESIDUAL_WEIGHT * res
        N = theta.shape[1]
        if time_axis and N > 1:
            # Two continuous tracks through the two branches: between consecutive frames, pair the
            # branches straight (0-0, 1-1) or crossed (0-1, 1-0), whichever pairing is closer in total;
            # the parity of crossings says which branch each track is on (vectorised, no frame loop).
            def dist(a, b):
                return np.square(R.wrap_angle(a - b)).sum(axis=-1)

            t0, t1 = theta[0], theta[1]
            straight = dist(t0[1:], t0[:-1]) + dist(t1[1:], t1[:-1])
            crossed = dist(t1[1:], t0[:-1]) + dist(t0[1:], t1[:-1])
            cross = crossed < straight
            parity = np.zeros((N,) + cross.shape[1:], dtype=bool)
            np.logical_xor.accumulate(cross, axis=0, out=parity[1:])
            track0 = parity.astype(np.intp)  # branch of track 0 at each frame
            c0 = np.take_along_axis(cost, track0[None], axis=0)[0].sum(axis=0)
            c1 = np.take_along_axis(cost, 1 - track0[None], axis=0)[0].sum(axis=0)
            use = np.where((c1 < c0)[None], 1 - track0, track0).astype(bool)
        else:
            use = cost[1] < cost[0]
        th = np.where(use[..., None], theta[1], theta[0])
        r = None if res is None else np.where(use, res[1], res[0])
        return th, r

    def _place_hinges(self, q: np.ndarray, fast, use_b1: dict, time_axis: bool, qd_out=None):
        """Joint angles in ``q``'s hinge columns (in [-pi, pi]) -> hinge ``q`` (in place): the chosen
        branch of complete 3-hinge groups, then (motions) unwrapped over time and shifted by one multiple
        of 2 pi per hinge, the one that puts the whole series inside the limits or, failing that, overshoots
        them least (unlimited hinges: frame 0 within pi of ``ref``); (states) within pi of the limits'
        middle (unlimited: of ``ref``)."""
        N = q.shape[0]
        hq = self._hinge_q
        contiguous = self._hinge_contiguous
        cols_q = slice(int(hq[0]), int(hq[0]) + len(hq)) if contiguous else hq  # slices: no fancy indexing
        dt = q.dtype
        ref = self._hinge_ref.astype(dt)
        center = self._hinge_center
        nh = len(hq)
        prev_raw = prev_turns = None
        first = None
        qmin = np.full(nh, np.inf)
        qmax = np.full(nh, -np.inf)
        kern = self._native_place(q.dtype, fast, contiguous) if time_axis and N else None
        if kern is not None:  # one machine-code pass over all frames (native_mapper.place_ir)
            state = np.zeros((6, nh))
            qd = None
            hv, runs = self._hinge_v, self._tangent_runs[0]
            hinge_run = (int(hq[0]), int(hv[0]), nh) in [tuple(map(int, r)) for r in runs]
            if qd_out is not None and N >= 3 and hinge_run:  # the hinges' central differences on the way
                lay = self.layout
                qd = np.empty((N, lay.nv), dtype=dt) if self._tangent_covers else np.zeros((N, lay.nv), dtype=dt)
                qd_out["qd"] = qd
            fps = qd_out["fps"] if qd is not None else 1.0
            cross, flip = use_b1[id(fast[0])]
            kern(q, cross, flip, state, False, qd, int(self._hinge_v[0]), fps)
            first, qmin, qmax = state[4], state[2], state[3]
        for s in range(0, N if kern is None else 0, _CHUNK):
            e = min(s + _CHUNK, N)
            T = q[s:e, cols_q].copy() if contiguous else q[s:e][:, hq]
            for g in fast:
                sel = use_b1[id(g)][s:e]
                if not sel.any():
                    continue
                cols = g.hinge_cols
                dv = self._davenport[g.axes]
                for i in (0, 2):
                    t = T[:, cols[:, i]]
                    T[:, cols[:, i]] = np.where(sel, t - np.copysign(np.pi, t), t)
                t = T[:, cols[:, 1]]
                T[:, cols[:, 1]] = np.where(sel, R.wrap_angle(2.0 * dv.phi - t), t)
            if not time_axis:
                qv = T + ref
                q[s:e, cols_q] = qv - _TWO_PI * np.rint((qv - center) / _TWO_PI)
                continue
            jumps = _step(T, prev_raw)
            jumps *= 1.0 / _TWO_PI
            np.rint(jumps, out=jumps)
            if prev_turns is None:
                prev_turns = np.zeros(nh, dtype=dt)
            qv = T + (ref - _TWO_PI * prev_turns)
            cols = np.flatnonzero(jumps.any(axis=0))
            if cols.size:  # a wrap inside the block: count the turns of those columns
                turns = np.cumsum(jumps[:, cols], axis=0)
                qv[:, cols] -= _TWO_PI * turns
                prev_turns[cols] += turns[-1]
            prev_raw = T[-1].copy()
            if first is None:
                first = qv[0].astype(np.float64)
            qmin = np.minimum(qmin, qv.min(axis=0))
            qmax = np.maximum(qmax, qv.max(axis=0))
            q[s:e, cols_q] = qv
        if not time_axis or N == 0:
            return
        shift = self._turn_shift(first, qmin, qmax)
        moved = np.flatnonzero(shift != 0)
        if moved.size:
            q[:, hq[moved]] += (_TWO_PI * shift[moved]).astype(dt)

    def _turn_shift(self, first, qmin, qmax) -> np.ndarray:
        """``[hinges]`` turns to add to each unwrapped hinge series (first value, min and max ``[hinges]``): the
        shift that puts the series inside the limits or overshoots them least; unlimited hinges: frame 0 within
        pi of ``ref``."""
        center = self._hinge_center
        shift = -np.rint((first - center) / _TWO_PI)
        lim, lo, hi, center_lim = self._limited_tables
        if lim is not None:
            mn, mx = qmin[lim], qmax[lim]
            k0 = np.rint((center_lim - 0.5 * (mn + mx)) / _TWO_PI)
            best = k0
            best_v = np.maximum(lo - (mn + _TWO_PI * k0), 0.0) + np.maximum(mx + _TWO_PI * k0 - hi, 0.0)
            for dk in (-1.0, 1.0):
                k = k0 + dk
                v = np.maximum(lo - (mn + _TWO_PI * k), 0.0) + np.maximum(mx + _TWO_PI * k - hi, 0.0)
                take = v < best_v - 1e-9
                best = np.where(take, k, best)
                best_v = np.where(take, v, best_v)
            shift[lim] = best
        return shift

    def _rewrap_narrow(self, q: np.ndarray) -> np.ndarray:
        """A hinge whose limits span less than 2 pi cannot wind: every frame of it that lies more than pi
        from the middle of its limits (already outside them) gets the 2 pi multiple that brings it closest
        to that middle, so a long clip never accumulates turns (one hip wound from -6.9 to 8.0 rad on a
        dance). Returns ``[hinges]`` the number of frames moved per hinge (in place on ``q``)."""
        narrow = np.flatnonzero(self._hinge_narrow)
        moved = np.zeros(len(self._hinge_q), dtype=np.int64)
        if narrow.size == 0 or q.shape[0] == 0:
            return moved
        cols = self._hinge_q[narrow]
        v = q[:, cols]
        turns = np.rint((self._hinge_center[narrow].astype(q.dtype) - v) * (1.0 / _TWO_PI))
        hit = turns != 0
        if hit.any():
            q[:, cols] = v + (_TWO_PI * turns).astype(q.dtype)
            moved[narrow] = hit.sum(axis=0)
        return moved

    def _clamp(self, q, clamped, residual, L):
        lay = self.layout
        lo, hi = lay.dof_lower, lay.dof_upper
        moved_bodies = set()
        for b in lay.blocks:
            if b.joint_type not in (JointType.HINGE, JointType.SLIDE) or b.limits is None:
                continue
            col = q[:, b.q_offset]
            new = np.clip(col, lo[b.qd_offset], hi[b.qd_offset])
            delta = new - col
            if np.any(delta != 0):
                clamped[:, b.qd_offset] = delta
                q[:, b.q_offset] = new
                if b.joint_type is JointType.HINGE:
                    moved_bodies.add(b.body_index)
        for g in self._groups:
            sel = [i for i, b in enumerate(g.bodies) if int(b) in moved_bodies]
            if not sel:
                continue
            axes = np.array(g.axes)
            for i in sel:
                b = int(g.bodies[i])
                qcols = self._hinge_q[g.hinge_cols[i]]
                rows = np.flatnonzero(np.any(clamped[:, self._hinge_v[g.hinge_cols[i]]] != 0, axis=1))
                th = q[rows][:, qcols].astype(np.float64) - self._hinge_ref[g.hinge_cols[i]]
                J = self._joint_rotation(L[rows].astype(np.float64), np.array([b]))[:, 0]
                J /= np.linalg.norm(J, axis=-1, keepdims=True)
                residual[rows, b] = _chain_residual(J, axes, th)


def _mixed_kernel():
    """:func:`~kangengine.animation.native_mapper_mixed.map_motion`, or None where numba does not import."""
    kernels = optional("kangengine.animation.native_mapper_mixed")
    return None if kernels is None else kernels.map_motion


def _euler_code(order: str) -> tuple:
    """The intrinsic Euler constants of the compiled pass (``native_mapper_mixed.euler_code``), computed here so
    that the plan needs no numba: ``(i, j, k, symmetric, parity, keep_sign)``."""
    i, j, k = ("xyz".index(c) for c in order.lower())
    i, k = k, i
    symmetric = i == k
    if symmetric:
        k = 3 - i - j
    s = (i - j) * (j - k) * (k - i) // 2
    return (i, j, k, int(symmetric), s, int(symmetric or s > 0))


def _track_block(buf, cross, dc):
    """The running track parity and sums of the native pass (``buf[3:6]``: parity 0/1, sum of ``dc``, sum of
    ``dc`` where the parity is 1) carried over a block done by numpy (``cross``/``dc [m, k]``)."""
    parity = np.logical_xor.accumulate(cross, axis=0) ^ (buf[3] == 1.0)
    buf[4] += dc.sum(axis=0, dtype=np.float64)
    buf[5] += np.where(parity, dc, 0).sum(axis=0, dtype=np.float64)
    buf[3] = parity[-1] if len(parity) else buf[3]


def _interleave(P, c, s):
    """(p0, p1, p2) with (c, s) -> args of _lin: p0 + c p1 + s p2."""
    return P[0], c, P[1], s, P[2]


def _step(x, prev):
    """``x[t] - x[t-1]`` along axis 0, with ``prev`` the frame before the block (0 at the very start)."""
    d = np.empty_like(x)
    d[0] = 0.0 if prev is None else x[0] - prev
    np.subtract(x[1:], x[:-1], out=d[1:])
    return d

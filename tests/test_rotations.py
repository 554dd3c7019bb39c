"""Tests of kangengine.rotations against scipy.spatial.transform and algebraic identities.

Every maths check runs in float32 and float64, numpy and torch (CPU). scipy works in XYZW; the
helpers below convert. float32 inputs are compared against scipy evaluated on the same float32
numbers widened to float64, so the tolerance measures our arithmetic only.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.spatial.transform import Rotation, Slerp

from kangengine import rotations as rot
from kangengine.errors import FormatError, KangEngineError, ShapeError

SETTINGS = settings(max_examples=30, deadline=None)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


class Backend:
    """One of numpy/torch x float32/float64: converts float64 numpy test data to it."""

    def __init__(self, lib: str, bits: int):
        self.lib, self.bits = lib, bits
        self.np_dtype = np.float32 if bits == 32 else np.float64
        self.torch_dtype = torch.float32 if bits == 32 else torch.float64
        # Absolute tolerance for O(1) results: float64 ~1e-12, float32 ~1e-6.
        self.tol = 2e-6 if bits == 32 else 1e-12

    def __repr__(self) -> str:
        return f"{self.lib}-f{self.bits}"

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64).astype(self.np_dtype)
        return torch.from_numpy(x) if self.lib == "torch" else x

    def exact(self, x):
        """The float64 value of what __call__ feeds in (rounded to the backend dtype)."""
        return np.asarray(x, dtype=np.float64).astype(self.np_dtype).astype(np.float64)

    def check(self, out, ref_input=None):
        """Assert type/dtype (and device) of an output; return it as float64 numpy."""
        if self.lib == "torch":
            assert isinstance(out, torch.Tensor), type(out)
            assert out.dtype == self.torch_dtype, out.dtype
            if ref_input is not None:
                assert out.device == ref_input.device
            return out.detach().cpu().numpy().astype(np.float64)
        assert isinstance(out, np.ndarray), type(out)
        assert out.dtype == self.np_dtype, out.dtype
        return out.astype(np.float64)


BACKENDS = [Backend(lib, bits) for lib in ("numpy", "torch") for bits in (32, 64)]
backends = pytest.mark.parametrize("B", BACKENDS, ids=repr)
F64 = [b for b in BACKENDS if b.bits == 64]


def to_scipy(q_wxyz) -> Rotation:
    return Rotation.from_quat(np.roll(np.asarray(q_wxyz, dtype=np.float64), -1, axis=-1))


def from_scipy(r: Rotation) -> np.ndarray:
    return np.roll(r.as_quat(), 1, axis=-1)


def quat_dist(a, b) -> np.ndarray:
    """Component distance between quaternions up to sign (q and -q are one rotation)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    return np.minimum(np.abs(a - b).max(axis=-1), np.abs(a + b).max(axis=-1))


def wrap(x):
    return (np.asarray(x) + np.pi) % (2 * np.pi) - np.pi


def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def random_quats(seed: int, shape=()) -> np.ndarray:
    return unit(np.random.default_rng(seed).normal(size=tuple(shape) + (4,)))


def _fix_small_rows(q):
    q = np.array(q, dtype=np.float64)
    small = np.linalg.norm(q, axis=-1, keepdims=True) < 0.1
    q = np.where(small, q + np.array([1.0, 0.3, -0.2, 0.1]), q)
    return unit(q)


# Unit quaternions: hypothesis-chosen components (many exact 0, +-1, 0.5: identities, 180 degree
# turns, axis-aligned rotations), or a seeded random batch.
_elements = st.floats(-1, 1, allow_nan=False, allow_subnormal=False)
quat_batches = st.one_of(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.just(4)), elements=_elements).map(_fix_small_rows),
    st.tuples(st.integers(0, 2**31), st.integers(1, 20)).map(lambda s: random_quats(s[0], (s[1],))),
)
vec_batches = hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.just(3)), elements=st.floats(-5, 5))
seeds = st.integers(0, 2**31)


# ----------------------------------------------------------------------------------------------
# Module hygiene
# ----------------------------------------------------------------------------------------------


def test_import_does_not_import_torch():
    code = (
        "import sys, kangengine\n"
        "if 'torch' in sys.modules: print('SKIP'); raise SystemExit\n"
        "import kangengine.rotations as r\n"
        "r.quat_multiply([1.0, 0, 0, 0], [0.0, 1, 0, 0])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    if out.stdout.strip() == "SKIP":
        pytest.skip("the kangengine package itself imports torch")
    assert out.stdout.strip() == "False"


def test_all_names_exist_and_documented():
    for name in rot.__all__:
        obj = getattr(rot, name)
        if callable(obj):
            doc = obj.__doc__ or ""
            assert "Args:" in doc and "Returns:" in doc and "4" in doc, name


# ----------------------------------------------------------------------------------------------
# Algebra
# ----------------------------------------------------------------------------------------------


@backends
@SETTINGS
@given(a=quat_batches, seed=seeds)
def test_multiply_matches_scipy(B, a, seed):
    b = random_quats(seed, a.shape[:-1])
    out = B.check(rot.quat_multiply(B(a), B(b)))
    ref = from_scipy(to_scipy(B.exact(a)) * to_scipy(B.exact(b)))
    assert quat_dist(out, ref).max() <= B.tol
    # Hamilton product composes like matrices: R(a b) = R(a) R(b).
    ma, mb = to_scipy(B.exact(a)).as_matrix(), to_scipy(B.exact(b)).as_matrix()
    np.testing.assert_allclose(to_scipy(out).as_matrix(), ma @ mb, atol=4 * B.tol)


@backends
def test_multiply_broadcasts(B):
    a = random_quats(1, (2, 1))
    b = random_quats(2, (3,))
    out = B.check(rot.quat_multiply(B(a), B(b)))
    assert out.shape == (2, 3, 4)
    ref = from_scipy(to_scipy(B.exact(a)[:, 0][:, None]) * to_scipy(B.exact(b))[None])
    assert quat_dist(out, ref).max() <= B.tol


@backends
@SETTINGS
@given(q=quat_batches, scale=st.floats(0.2, 5.0))
def test_conjugate_inverse_normalize(B, q, scale):
    qs = q * scale
    conj = B.check(rot.quat_conjugate(B(qs)))
    np.testing.assert_array_equal(conj, B.exact(qs) * [1, -1, -1, -1])
    inv = rot.quat_inverse(B(qs))
    ident = B.check(rot.quat_multiply(B(qs), inv))
    np.testing.assert_allclose(ident, np.broadcast_to([1.0, 0, 0, 0], ident.shape), atol=4 * B.tol)
    n = B.check(rot.quat_normalize(B(qs)))
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, atol=B.tol)
    np.testing.assert_allclose(n, B.exact(q) * np.sign(scale), atol=2 * B.tol)


def test_normalize_zero_stays_zero():
    np.testing.assert_array_equal(rot.quat_normalize(np.zeros((2, 4))), np.zeros((2, 4)))


@backends
def test_identity_and_standardize(B):
    like = B(np.zeros((2, 4)))
    ident = rot.quat_identity((2, 3), like=like)
    out = B.check(ident)
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, np.broadcast_to([1.0, 0, 0, 0], (2, 3, 4)))
    q = random_quats(3, (50,))
    s = B.check(rot.quat_standardize(B(q)))
    assert (s[..., 0] >= 0).all()
    assert quat_dist(s, B.exact(q)).max() == 0


def test_identity_defaults():
    q = rot.quat_identity()
    assert q.shape == (4,) and q.dtype == np.float64
    np.testing.assert_array_equal(q, [1, 0, 0, 0])
    assert rot.quat_identity(3, dtype=np.float32).shape == (3, 4)
    assert rot.quat_identity(3, dtype=np.float32).dtype == np.float32
    t = rot.quat_identity((2,), dtype=torch.float32)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32


@backends
@SETTINGS
@given(q=quat_batches, v=vec_batches)
def test_rotate_matches_scipy(B, q, v):
    q_, v_ = q[:, None], v[None]  # broadcast (n, 1, 4) with (1, m, 3)
    out = B.check(rot.quat_rotate(B(q_), B(v_)))
    r = to_scipy(B.exact(q))
    ref = np.stack([r.apply(B.exact(vi)) for vi in B.exact(v)], axis=1)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, atol=10 * B.tol)
    out_inv = B.check(rot.quat_rotate_inverse(B(q_), B(v_)))
    ref_inv = np.stack([r.inv().apply(B.exact(vi)) for vi in B.exact(v)], axis=1)
    np.testing.assert_allclose(out_inv, ref_inv, atol=10 * B.tol)


# ----------------------------------------------------------------------------------------------
# Matrices, rotation vectors, angles
# ----------------------------------------------------------------------------------------------


def _half_turns():
    """180 degree rotations: axis-aligned, on diagonals, random, and near 180 degrees."""
    axes = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, -1], [1, -1, 1], [-1, 0, 1e-9]], float)
    axes = np.concatenate([axes, np.random.default_rng(5).normal(size=(10, 3))])
    axes = unit(axes)
    angles = np.array([np.pi] * len(axes))
    near = np.pi - np.array([1e-7, 1e-12, 1e-4])
    rv = np.concatenate([axes * angles[:, None], axes[:3] * near[:, None]])
    return from_scipy(Rotation.from_rotvec(rv))


@backends
@SETTINGS
@given(q=quat_batches)
def test_matrix_both_ways_match_scipy(B, q):
    m = B.check(rot.quat_to_matrix(B(q)))
    np.testing.assert_allclose(m, to_scipy(B.exact(q)).as_matrix(), atol=4 * B.tol)
    m_in = to_scipy(q).as_matrix()
    back = B.check(rot.quat_from_matrix(B(m_in)))
    assert (back[..., 0] >= 0).all()
    ref = from_scipy(Rotation.from_matrix(B.exact(m_in)))
    assert quat_dist(back, ref).max() <= 4 * B.tol


@backends
def test_matrix_half_turns(B):
    q = _half_turns()
    m = to_scipy(q).as_matrix()
    back = B.check(rot.quat_from_matrix(B(m)))
    assert (back[..., 0] >= 0).all()
    assert quat_dist(back, q).max() <= 4 * B.tol
    np.testing.assert_allclose(np.linalg.norm(back, axis=-1), 1.0, atol=B.tol)
    # And with two batch dims.
    back2 = B.check(rot.quat_from_matrix(B(m.reshape(2, -1, 3, 3))))
    np.testing.assert_array_equal(back2.reshape(-1, 4), back)


@backends
def test_rotvec_special_angles(B):
    rng = np.random.default_rng(7)
    axes = unit(rng.normal(size=(8, 3)))
    angles = np.array([0.0, 1e-12, 1e-8, 1e-4, 1e-3, 1.0, np.pi - 1e-7, np.pi])
    rv = axes * angles[:, None]
    rv_in = B.exact(rv)
    q = B.check(rot.quat_from_rotvec(B(rv)))
    ref = from_scipy(Rotation.from_rotvec(rv_in))
    np.testing.assert_allclose(q, ref, atol=B.tol)
    # Log map: shortest rotation vector, relative accuracy near 0.
    q_in = B.exact(ref)
    out = B.check(rot.quat_to_rotvec(B(q_in)))
    ref_rv = to_scipy(q_in).as_rotvec()
    err = np.abs(out - ref_rv).max(axis=-1)
    err_flip = np.abs(out + ref_rv).max(axis=-1)  # exactly pi: either direction is correct
    err = np.where(np.linalg.norm(ref_rv, axis=-1) > np.pi - 1e-6, np.minimum(err, err_flip), err)
    assert (err <= 4 * B.tol).all(), err
    # relative accuracy of tiny angles
    small = angles[:5] > 0
    rel = np.abs(out[:5] - ref_rv[:5]).max(-1)[small] / angles[:5][small]
    assert (rel <= (1e-12 if B.bits == 64 else 1e-6)).all(), rel
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(ref_rv, axis=-1), atol=B.tol * 4)


@backends
@SETTINGS
@given(q=quat_batches, flip=st.booleans())
def test_rotvec_both_ways_match_scipy(B, q, flip):
    q_in = -q if flip else q
    out = B.check(rot.quat_to_rotvec(B(q_in)))
    ref = to_scipy(B.exact(q_in)).as_rotvec()
    ang = np.linalg.norm(ref, axis=-1)
    err = np.abs(out - ref).max(-1)
    near_pi = ang > np.pi - 1e-6
    err = np.where(near_pi, np.minimum(err, np.abs(out + ref).max(-1)), err)
    assert (err <= 8 * B.tol).all()
    assert (np.linalg.norm(out, axis=-1) <= np.pi + 4 * B.tol).all()
    back = B.check(rot.quat_from_rotvec(B(ref)))
    assert quat_dist(back, from_scipy(Rotation.from_rotvec(B.exact(ref)))).max() <= 2 * B.tol


@backends
@SETTINGS
@given(v=vec_batches, angle=st.floats(-7, 7))
def test_axis_angle(B, v, angle):
    assume((np.linalg.norm(v, axis=-1) > 1e-3).all())
    angles = np.full(v.shape[:-1], angle)
    out = B.check(rot.quat_from_axis_angle(B(v), B(angles)))
    ref = from_scipy(Rotation.from_rotvec(unit(B.exact(v)) * B.exact(angles)[:, None]))
    assert quat_dist(out, ref).max() <= 4 * B.tol
    # scalar angle broadcasts
    out2 = B.check(rot.quat_from_axis_angle(B(v), angle))
    assert quat_dist(out2, ref).max() <= 4 * B.tol


@backends
@SETTINGS
@given(a=quat_batches, seed=seeds)
def test_angle_and_angle_between_match_scipy(B, a, seed):
    b = random_quats(seed, a.shape[:-1])
    ang = B.check(rot.quat_angle(B(a)))
    np.testing.assert_allclose(ang, to_scipy(B.exact(a)).magnitude(), atol=4 * B.tol)
    d = B.check(rot.quat_angle_between(B(a), B(-b)))  # sign of b must not matter
    ra, rb = to_scipy(B.exact(a)), to_scipy(B.exact(b))
    np.testing.assert_allclose(d, (ra.inv() * rb).magnitude(), atol=8 * B.tol)
    assert ((d >= 0) & (d <= np.pi + 8 * B.tol)).all()


@pytest.mark.parametrize("B", F64, ids=repr)
def test_angle_between_accurate_near_zero(B):
    q = random_quats(11, (6,))
    eps = np.array([1e-13, 1e-11, 1e-9, 1e-7, 1e-5, 1e-3])
    axes = unit(np.random.default_rng(12).normal(size=(6, 3)))
    q2 = from_scipy(to_scipy(q) * Rotation.from_rotvec(axes * eps[:, None]))
    d = B.check(rot.quat_angle_between(B(q), B(q2)))
    np.testing.assert_allclose(d, eps, rtol=1e-2, atol=2e-15)


# ----------------------------------------------------------------------------------------------
# Interpolation
# ----------------------------------------------------------------------------------------------


@backends
@settings(max_examples=15, deadline=None)
@given(q0=quat_batches, seed=seeds, flip=st.booleans())
def test_slerp_matches_scipy(B, q0, seed, flip):
    q1 = random_quats(seed, q0.shape[:-1])
    rel = (to_scipy(q0).inv() * to_scipy(q1)).magnitude()
    assume((rel < np.pi - 1e-3).all())  # at exactly 180 degrees the shortest path is not unique
    t = np.linspace(-0.25, 1.25, 7)
    q1_in = -q1 if flip else q1
    out = B.check(rot.quat_slerp(B(q0[:, None]), B(q1_in[:, None]), B(t)))
    assert out.shape == (len(q0), len(t), 4)
    for n in range(len(q0)):
        keys = Rotation.concatenate([to_scipy(B.exact(q0[n])), to_scipy(B.exact(q1[n]))])
        ref = from_scipy(Slerp([0.0, 1.0], keys)(np.clip(t, 0, 1)))
        inside = (t >= 0) & (t <= 1)
        assert quat_dist(out[n][inside], ref[inside]).max() <= 8 * B.tol
    # endpoints and unit norm
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), 1.0, atol=2 * B.tol)
    e0 = B.check(rot.quat_slerp(B(q0), B(q1_in), 0.0))
    e1 = B.check(rot.quat_slerp(B(q0), B(q1_in), 1.0))
    assert quat_dist(e0, B.exact(q0)).max() <= 4 * B.tol
    assert quat_dist(e1, B.exact(q1)).max() <= 4 * B.tol


@backends
def test_slerp_nearly_equal_and_nlerp(B):
    q0 = random_quats(21, (5,))
    rv = np.full((5, 3), 1e-10)
    tiny = from_scipy(to_scipy(q0) * Rotation.from_rotvec(rv))
    tiny_at = from_scipy(to_scipy(q0) * Rotation.from_rotvec(0.3 * rv))
    for q1, expected in ((q0, q0), (-q0, q0), (tiny, tiny_at), (-tiny, tiny_at)):
        out = B.check(rot.quat_slerp(B(q0), B(q1), 0.3))
        assert np.isfinite(out).all()
        assert quat_dist(out, B.exact(expected)).max() <= 4 * B.tol
    q1 = random_quats(22, (5,))
    t = np.array([0.0, 0.2, 0.5, 1.0, 0.7])
    n = B.check(rot.quat_nlerp(B(q0), B(-q1), B(t)))
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, atol=2 * B.tol)
    assert quat_dist(n[0], B.exact(q0[0])).max() <= 2 * B.tol
    assert quat_dist(n[3], B.exact(q1[3])).max() <= 2 * B.tol
    # shortest path: the midpoint lies on the short arc, same as slerp's midpoint
    s = B.check(rot.quat_slerp(B(q0), B(-q1), 0.5))
    assert quat_dist(n[2], s[2]).max() <= 4 * B.tol


# ----------------------------------------------------------------------------------------------
# Euler angles
# ----------------------------------------------------------------------------------------------

ORDERS = rot.EULER_ORDERS
TAIT_BRYAN = ORDERS[:6]


def _scipy_seq(order, extrinsic):
    return order.lower() if extrinsic else order.upper()


def _gimbal_distance(middle, order):
    if order in TAIT_BRYAN:
        return np.pi / 2 - np.abs(middle)
    return np.minimum(middle, np.pi - middle)


@backends
@settings(max_examples=40, deadline=None)
@given(q=quat_batches, order=st.sampled_from(ORDERS), extrinsic=st.booleans(), upper=st.booleans())
def test_to_euler_matches_scipy(B, q, order, extrinsic, upper):
    ord_arg = order.upper() if upper else order
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no gimbal-lock warning from us
        out = B.check(rot.quat_to_euler(B(q), ord_arg, extrinsic=extrinsic))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on gimbal lock
        ref = to_scipy(B.exact(q)).as_euler(_scipy_seq(order, extrinsic))
    # ranges
    slack = 4 * B.tol
    assert ((out[..., [0, 2]] > -np.pi - slack) & (out[..., [0, 2]] <= np.pi + slack)).all()
    if order in TAIT_BRYAN:
        assert (np.abs(out[..., 1]) <= np.pi / 2 + slack).all()
    else:
        assert ((out[..., 1] >= 0) & (out[..., 1] <= np.pi + slack)).all()
    # angles agree with scipy away from gimbal lock (ill-conditioned within ~sqrt(eps) of it)
    far = _gimbal_distance(ref[..., 1], order) > (0.05 if B.bits == 32 else 1e-4)
    tol = 20 * B.tol if B.bits == 32 else 1e-9
    np.testing.assert_allclose(out[..., 1], ref[..., 1], atol=tol)
    assert (np.abs(wrap(out - ref))[far] <= tol).all()
    # the rotation always agrees; within scipy's 1e-7 gimbal-lock threshold the third angle is set to
    # 0, which moves the rotation by up to the distance from the singularity (scipy does the same)
    back = from_scipy(Rotation.from_euler(_scipy_seq(order, extrinsic), out))
    near = _gimbal_distance(ref[..., 1], order) < 1e-6
    limit = np.where(near, 2e-6, 20 * B.tol)
    assert (quat_dist(back, B.exact(q)) <= limit).all()


@backends
@settings(max_examples=40, deadline=None)
@given(seed=seeds, order=st.sampled_from(ORDERS), extrinsic=st.booleans())
def test_from_euler_matches_scipy(B, seed, order, extrinsic):
    angles = np.random.default_rng(seed).uniform(-2 * np.pi, 2 * np.pi, size=(3, 2, 3))
    out = B.check(rot.quat_from_euler(B(angles), order, extrinsic=extrinsic))
    assert out.shape == (3, 2, 4)
    ref = from_scipy(Rotation.from_euler(_scipy_seq(order, extrinsic), B.exact(angles)))
    # same sign too: scipy composes the elementary quaternions in the same order
    np.testing.assert_allclose(out, ref, atol=8 * B.tol)


@backends
@pytest.mark.parametrize("extrinsic", [True, False])
@pytest.mark.parametrize("order", ORDERS)
def test_euler_round_trip_and_gimbal_lock(B, order, extrinsic):
    rng = np.random.default_rng(abs(hash((order, extrinsic))) % 2**32)
    n = 64
    angles = rng.uniform(-np.pi, np.pi, size=(n, 3))
    if order in TAIT_BRYAN:
        angles[:, 1] = rng.uniform(-np.pi / 2, np.pi / 2, size=n)
        gimbal = np.array([np.pi / 2, -np.pi / 2])
    else:
        angles[:, 1] = rng.uniform(0, np.pi, size=n)
        gimbal = np.array([0.0, np.pi])
    locked = rng.uniform(-np.pi, np.pi, size=(8, 3))
    locked[:, 1] = np.tile(gimbal, 4)
    q = from_scipy(Rotation.from_euler(_scipy_seq(order, extrinsic), np.concatenate([angles, locked])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = B.check(rot.quat_to_euler(B(q), order, extrinsic=extrinsic))
        back = B.check(rot.quat_from_euler(B(out), order, extrinsic=extrinsic))
    assert quat_dist(back, B.exact(q)).max() <= 20 * B.tol
    if B.bits == 64:
        # regular inputs come back as they went in (they were drawn in the canonical ranges)
        far = _gimbal_distance(angles[:, 1], order) > 1e-3
        assert (np.abs(wrap(out[:n] - angles))[far] <= 1e-9).all()
        # exact gimbal lock: the third angle is zero, as in scipy
        np.testing.assert_array_equal(out[n:, 2], 0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = to_scipy(q[n:]).as_euler(_scipy_seq(order, extrinsic))
        assert (np.abs(wrap(out[n:] - ref)) <= 1e-9).all()


def test_euler_known_values():
    # 90 degrees about z, extrinsic xyz -> (0, 0, pi/2); intrinsic ZYX -> (pi/2, 0, 0)
    q = np.array([np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)])
    np.testing.assert_allclose(rot.quat_to_euler(q, "xyz", extrinsic=True), [0, 0, np.pi / 2], atol=1e-15)
    np.testing.assert_allclose(rot.quat_to_euler(q, "ZYX", extrinsic=False), [np.pi / 2, 0, 0], atol=1e-15)
    # extrinsic xyz == intrinsic zyx with the angles reversed
    a = np.array([0.1, -0.4, 1.2])
    q1 = rot.quat_from_euler(a, "xyz", extrinsic=True)
    q2 = rot.quat_from_euler(a[::-1], "zyx", extrinsic=False)
    np.testing.assert_allclose(q1, q2, atol=1e-15)


def test_euler_bad_arguments():
    with pytest.raises(FormatError) as info:
        rot.quat_from_euler(np.zeros(3), "xxy", extrinsic=True)
    msg = str(info.value)
    assert "'xxy'" in msg and all(o in msg for o in ORDERS)
    with pytest.raises(KangEngineError):
        rot.quat_to_euler(np.array([1.0, 0, 0, 0]), "xy", extrinsic=False)
    with pytest.raises(ValueError):  # FormatError is a ValueError too
        rot.quat_to_euler(np.array([1.0, 0, 0, 0]), "abc", extrinsic=False)
    with pytest.raises(FormatError):
        rot.quat_from_euler(np.zeros(3), "xyz", extrinsic="yes")
    with pytest.raises(TypeError):
        rot.quat_from_euler(np.zeros(3), "xyz")  # extrinsic is a required keyword
    with pytest.raises(ShapeError):
        rot.quat_from_euler(np.zeros(4), "xyz", extrinsic=True)


# ----------------------------------------------------------------------------------------------
# Swing-twist
# ----------------------------------------------------------------------------------------------


@backends
@SETTINGS
@given(q=quat_batches, seed=seeds, shared_axis=st.booleans())
def test_swing_twist_properties(B, q, seed, shared_axis):
    rng = np.random.default_rng(seed)
    axis = rng.normal(size=(3,) if shared_axis else q.shape[:-1] + (3,)) * rng.uniform(0.5, 3)
    swing, twist = rot.quat_swing_twist(B(q), B(axis))
    swing, twist = B.check(swing), B.check(twist)
    a = unit(B.exact(axis))
    np.testing.assert_allclose(rot.quat_multiply(swing, twist), B.exact(q), atol=8 * B.tol)
    np.testing.assert_allclose(np.linalg.norm(swing, axis=-1), 1, atol=4 * B.tol)
    np.testing.assert_allclose(np.linalg.norm(twist, axis=-1), 1, atol=4 * B.tol)
    np.testing.assert_allclose(np.cross(twist[..., 1:], a), 0, atol=8 * B.tol)  # twist about axis
    np.testing.assert_allclose(np.sum(swing[..., 1:] * a, axis=-1), 0, atol=8 * B.tol)  # swing perp


@backends
@SETTINGS
@given(seed=seeds)
def test_swing_twist_recovers_construction(B, seed):
    rng = np.random.default_rng(seed)
    n = 16
    axis = unit(rng.normal(size=(n, 3)))
    perp = unit(np.cross(axis, rng.normal(size=(n, 3))))
    twist_angle = rng.uniform(-3.0, 3.0, size=n)
    swing_angle = rng.uniform(0.0, 3.0, size=n)
    r_swing = Rotation.from_rotvec(perp * swing_angle[:, None])
    r_twist = Rotation.from_rotvec(axis * twist_angle[:, None])
    q = from_scipy(r_swing * r_twist)  # twist first, about the child axis
    swing, twist = rot.quat_swing_twist(B(q), B(axis))
    swing, twist = B.check(swing), B.check(twist)
    assert quat_dist(swing, from_scipy(r_swing)).max() <= 20 * B.tol
    assert quat_dist(twist, from_scipy(r_twist)).max() <= 20 * B.tol


@backends
def test_swing_twist_degenerate(B):
    axis = np.array([0.0, 0.0, 1.0])
    q = np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.6, 0.8, 0.0]])  # 180 degrees about x, about (.6,.8,0)
    swing, twist = rot.quat_swing_twist(B(q), B(axis))
    np.testing.assert_array_equal(B.check(twist), [[1.0, 0, 0, 0]] * 2)
    np.testing.assert_allclose(B.check(swing), B.exact(q), atol=B.tol)


# ----------------------------------------------------------------------------------------------
# Time series
# ----------------------------------------------------------------------------------------------


def _smooth_track(seed, frames, batch=()):
    rng = np.random.default_rng(seed)
    q0 = random_quats(seed, batch)
    w = rng.normal(size=tuple(batch) + (3,))
    t = np.arange(frames).reshape((frames,) + (1,) * (len(batch) + 1)) * 0.05
    return from_scipy(Rotation.from_rotvec(w * t) * to_scipy(q0))


@backends
@SETTINGS
@given(seed=seeds, frames=st.integers(1, 30), time_axis=st.sampled_from([0, 1, -2]))
def test_hemisphere_continuity(B, seed, frames, time_axis):
    rng = np.random.default_rng(seed)
    q = _smooth_track(seed, frames, (3,))  # [frames, 3, 4]
    flipped = q * rng.choice([-1.0, 1.0], size=q.shape[:-1] + (1,))
    if time_axis == 1 or time_axis == -2:
        flipped = np.swapaxes(flipped, 0, 1)  # [3, frames, 4]
        out = B.check(rot.quat_hemisphere_continuity(B(flipped), axis=time_axis))
        out = np.swapaxes(out, 0, 1)
        src = np.swapaxes(B.exact(flipped), 0, 1)
    else:
        out = B.check(rot.quat_hemisphere_continuity(B(flipped)))
        src = B.exact(flipped)
    assert out.shape == src.shape
    assert (np.sum(out[1:] * out[:-1], axis=-1) >= 0).all()
    np.testing.assert_array_equal(np.abs(out), np.abs(src))  # only signs change
    np.testing.assert_array_equal(out[0], src[0])  # first frame kept
    # a smooth track made continuous is exactly the original up to one global sign per series
    sign = np.sign(np.sum(out[:1] * q[:1], axis=-1, keepdims=True))
    np.testing.assert_allclose(out, B.exact(q) * sign, atol=B.tol)


def test_hemisphere_continuity_bad_axis():
    with pytest.raises(ShapeError):
        rot.quat_hemisphere_continuity(np.zeros((5, 4)), axis=1)


@backends
@SETTINGS
@given(seed=seeds, frames=st.integers(2, 12))
def test_angular_velocity_constant_rate(B, seed, frames):
    rng = np.random.default_rng(seed)
    dt = 1.0 / 30.0
    w = unit(rng.normal(size=(2, 3))) * rng.uniform(0, 40, size=(2, 1))  # rad/s, |w| 2 dt < pi
    q0 = random_quats(seed + 1, (2,))
    t = np.arange(frames)[:, None, None] * dt
    r = Rotation.from_rotvec(w[None] * t) * to_scipy(q0)[None]  # q(t) = exp(w t) q0
    q = from_scipy(r)
    world = B.check(rot.quat_angular_velocity(B(q), dt, frame="world"))
    assert world.shape == (frames, 2, 3)
    tol = 2 * B.tol / dt  # input rounding error (~eps) over the 2 dt of a central difference
    np.testing.assert_allclose(world, np.broadcast_to(w, world.shape), atol=tol)
    body = B.check(rot.quat_angular_velocity(B(q), dt, frame="body"))
    ref_body = r.inv().apply(np.broadcast_to(w, (frames, 2, 3)))  # R(t)^T w
    np.testing.assert_allclose(body, ref_body, atol=tol)


@pytest.mark.parametrize("B", F64, ids=repr)
def test_angular_velocity_analytic(B):
    rng = np.random.default_rng(3)
    frames, dt = 201, 1e-3
    t = (np.arange(frames) * dt)[:, None, None]
    q0 = random_quats(4, (3,))
    a = rng.normal(size=(3, 3))
    # Fixed axis, q(t) = exp(a t^2) q0: w_world = 2 a t; central differences are exact here and
    # the one-sided ends are off by exactly |a| dt.
    r = Rotation.from_rotvec(a[None] * t**2) * to_scipy(q0)[None]
    q = from_scipy(r)
    w_ref = 2 * a[None] * t
    world = B.check(rot.quat_angular_velocity(B(q), dt, frame="world"))
    body = B.check(rot.quat_angular_velocity(B(q), dt, frame="body"))
    body_ref = r.inv().apply(np.broadcast_to(w_ref, world.shape))
    np.testing.assert_allclose(world[1:-1], w_ref[1:-1], atol=1e-9)
    np.testing.assert_allclose(body[1:-1], body_ref[1:-1], atol=1e-9)
    for out, ref in ((world, w_ref), (body, body_ref)):
        end_err = np.linalg.norm(out[[0, -1]] - ref[[0, -1]], axis=-1)
        np.testing.assert_allclose(end_err, np.broadcast_to(np.linalg.norm(a, axis=-1) * dt, (2, 3)), rtol=1e-4)
    # Changing axis, q(t) = exp(c t) exp(a t^2) q0: w_world = c + R(exp(c t)) (2 a t);
    # central differences are second-order accurate.
    c = rng.normal(size=(3, 3))
    r = Rotation.from_rotvec(c[None] * t) * Rotation.from_rotvec(a[None] * t**2) * to_scipy(q0)[None]
    q = from_scipy(r)
    w_ref = c[None] + Rotation.from_rotvec(c[None] * t).apply(2 * a[None] * t)
    world = B.check(rot.quat_angular_velocity(B(q), dt, frame="world"))
    body = B.check(rot.quat_angular_velocity(B(q), dt, frame="body"))
    np.testing.assert_allclose(world[1:-1], w_ref[1:-1], atol=2e-5)
    np.testing.assert_allclose(body[1:-1], r.inv().apply(w_ref)[1:-1], atol=2e-5)
    # per-clip dt
    world2 = B.check(rot.quat_angular_velocity(B(q), B(np.full(3, dt)), frame="world"))
    np.testing.assert_allclose(world2, world, atol=1e-12)


@backends
def test_angular_velocity_edge_cases(B):
    q = random_quats(8, (1, 2))
    out = B.check(rot.quat_angular_velocity(B(q), 0.1, frame="body"))
    np.testing.assert_array_equal(out, np.zeros((1, 2, 3)))
    with pytest.raises(FormatError):
        rot.quat_angular_velocity(B(q), 0.1, frame="local")
    with pytest.raises(FormatError):
        rot.quat_angular_velocity(B(q), 0.0, frame="world")
    with pytest.raises(TypeError):
        rot.quat_angular_velocity(B(q), 0.1)  # frame is a required keyword


# ----------------------------------------------------------------------------------------------
# Types, dtypes, devices, shapes
# ----------------------------------------------------------------------------------------------


def _calls():
    q = random_quats(30, (2, 3))
    q2 = random_quats(31, (2, 3))
    v = np.random.default_rng(32).normal(size=(2, 3, 3))
    m = to_scipy(q).as_matrix()
    return [
        ("quat_multiply", (q, q2), {}),
        ("quat_conjugate", (q,), {}),
        ("quat_inverse", (q,), {}),
        ("quat_normalize", (q,), {}),
        ("quat_standardize", (q,), {}),
        ("quat_rotate", (q, v), {}),
        ("quat_rotate_inverse", (q, v), {}),
        ("quat_to_matrix", (q,), {}),
        ("quat_from_matrix", (m,), {}),
        ("quat_from_rotvec", (v,), {}),
        ("quat_to_rotvec", (q,), {}),
        ("quat_from_axis_angle", (v, v[..., 0]), {}),
        ("quat_angle", (q,), {}),
        ("quat_angle_between", (q, q2), {}),
        ("quat_slerp", (q, q2, v[..., 0]), {}),
        ("quat_nlerp", (q, q2, v[..., 0]), {}),
        ("quat_swing_twist", (q, v), {}),
        ("quat_from_euler", (v, "zyx"), {"extrinsic": False}),
        ("quat_to_euler", (q, "ZXZ"), {"extrinsic": True}),
        ("quat_hemisphere_continuity", (q,), {}),
        ("quat_angular_velocity", (q, 0.1), {"frame": "world"}),
    ]


@backends
@pytest.mark.parametrize("name,args,kwargs", _calls(), ids=[c[0] for c in _calls()])
def test_type_dtype_device_preserved(B, name, args, kwargs):
    conv = [B(a) if isinstance(a, np.ndarray) else a for a in args]
    out = getattr(rot, name)(*conv, **kwargs)
    for o in out if isinstance(out, tuple) else (out,):
        B.check(o, ref_input=conv[0])
        assert np.isfinite(B.check(o)).all()
        assert o.shape[:2] == (2, 3)


def test_torch_gradients_finite_at_zero_rotation():
    rv = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    q = rot.quat_from_rotvec(rv)
    back = rot.quat_to_rotvec(q)
    back.sum().backward()
    assert torch.isfinite(rv.grad).all()
    np.testing.assert_allclose(rv.grad.numpy(), 1.0, atol=1e-12)  # log(exp(v)) = v near 0
    q = torch.tensor([[1.0, 0, 0, 0], [0.0, 1, 0, 0]], dtype=torch.float64, requires_grad=True)
    rot.quat_to_rotvec(q).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_mixed_and_python_inputs():
    q = random_quats(40, (3,))
    t = torch.from_numpy(q.astype(np.float32))
    out = rot.quat_multiply(t, q)  # numpy float64 joins torch float32: torch, promoted
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    out = rot.quat_rotate(t, [1.0, 0.0, 0.0])  # a list takes the tensor's dtype
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    out = rot.quat_rotate(q.astype(np.float32), [1.0, 0.0, 0.0])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    out = rot.quat_from_rotvec([0.0, 0.0, math.pi / 2])
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, [math.sqrt(0.5), 0, 0, math.sqrt(0.5)], atol=1e-15)
    assert rot.quat_to_rotvec(np.array([1, 0, 0, 0])).dtype == np.float64  # ints become float


def test_shape_errors():
    with pytest.raises(ShapeError, match=r"\(\.\.\., 4\)"):
        rot.quat_multiply(np.zeros(3), np.zeros(4))
    with pytest.raises(ShapeError):
        rot.quat_rotate(np.zeros(4), np.zeros(4))
    with pytest.raises(ShapeError):
        rot.quat_from_matrix(np.zeros((3, 4)))
    with pytest.raises(ShapeError):
        rot.quat_angular_velocity(np.zeros(4), 0.1, frame="world")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device_preserved():
    q = torch.from_numpy(random_quats(50, (4,))).cuda()
    v = torch.ones(4, 3, device="cuda")
    assert rot.quat_rotate(q, v).device == q.device
    assert rot.quat_to_euler(q, "xyz", extrinsic=True).device == q.device
    assert rot.quat_angular_velocity(q, 0.1, frame="body").device == q.device
    assert rot.quat_identity(3, like=q).device == q.device


# ----------------------------------------------------------------------------------------------
# The one implementation of each helper that replaced copies elsewhere (mapper, BVH, MJCF/URDF,
# adapters, datasets): wrap_angle, the WXYZ <-> XYZW reorders, quat_to_matrix, Euler fast paths
# ----------------------------------------------------------------------------------------------


def _angle_ref(x) -> np.ndarray:
    """numpy's own wrap, ``np.angle(exp(i x))`` in float64, with the documented end: -pi becomes +pi."""
    ref = np.angle(np.exp(1j * np.asarray(x, dtype=np.float64)))
    return np.where(ref <= -np.pi, ref + 2 * np.pi, ref)


def _pi_of(B) -> float:
    """pi rounded to the backend's dtype (float32 compares against it: its upper end)."""
    return float(B.np_dtype(np.pi))


@backends
def test_wrap_angle_ends_exactly(B):
    pi = np.pi
    x = np.array([pi, -pi, 3 * pi, -3 * pi, 5 * pi, -5 * pi, 0.0, -0.0, 2 * pi, -2 * pi])
    out = B.check(rot.wrap_angle(B(x)))
    pi_b = _pi_of(B)
    assert ((out > -pi_b) & (out <= pi_b)).all()
    assert out[0] == pi_b and out[1] == pi_b  # exactly pi, and -pi becomes +pi
    # odd multiples of pi land next to the end, within the input's rounding (|x| eps), circularly
    eps = np.finfo(B.np_dtype).eps
    np.testing.assert_array_less(np.abs(wrap(out[2:6] - np.pi)), 4 * eps * np.abs(x[2:6]))
    np.testing.assert_allclose(out[6:], 0.0, atol=4 * eps * 2 * pi)
    if B.bits == 64:
        np.testing.assert_array_equal(out[2:4], pi)  # +-3 pi: exactly pi in float64


@backends
@SETTINGS
@given(seed=seeds, scale=st.sampled_from([1.0, 4.0, 50.0, 1e3]))
def test_wrap_angle_matches_numpy_angle(B, seed, scale):
    x = np.random.default_rng(seed).uniform(-scale * np.pi, scale * np.pi, size=(5, 7))
    if B.bits == 64 and scale == 1e3:
        x = x * 1e3  # angles up to ~3e6 rad
    out = B.check(rot.wrap_angle(B(x)))
    xe = B.exact(x)
    pi_b = _pi_of(B)
    assert ((out > -pi_b) & (out <= pi_b)).all()
    # error ~ |x| eps (2 pi rounded to the dtype, times the turns removed): the input's own precision
    eps = np.finfo(B.np_dtype).eps
    tol = 4 * eps * (np.abs(xe) + np.pi)
    d = np.abs(wrap(out - _angle_ref(xe)))  # circular: pi and -pi + tiny are neighbours
    assert (d <= tol).all(), d.max()


def test_wrap_angle_keeps_values_inside_and_types():
    x = np.linspace(-np.pi + 1e-9, np.pi, 1001)
    np.testing.assert_array_equal(rot.wrap_angle(x), x)  # already inside: untouched
    assert rot.wrap_angle(np.float32(-np.pi)).dtype == np.float32
    assert float(rot.wrap_angle(-np.pi)) == np.pi
    assert rot.wrap_angle(np.zeros((0, 3))).shape == (0, 3)
    assert np.isnan(rot.wrap_angle(np.array([np.nan, 1.0]))[0])
    t = torch.tensor([-np.pi, 3 * np.pi, 7.0], dtype=torch.float64)
    np.testing.assert_allclose(rot.wrap_angle(t).numpy(), rot.wrap_angle(t.numpy()), atol=0)


@backends
@pytest.mark.parametrize("shape", [(4,), (6, 4), (2, 3, 4)])
def test_wxyz_xyzw_reorder_matches_scipy(B, shape):
    q = random_quats(60, shape[:-1])
    xyzw = B.check(rot.quat_wxyz_to_xyzw(B(q)))
    assert xyzw.shape == shape
    # scipy reads WXYZ with scalar_first=True and writes XYZW by default (it normalises: same numbers here)
    ref = Rotation.from_quat(B.exact(q).reshape(-1, 4), scalar_first=True).as_quat().reshape(shape)
    np.testing.assert_allclose(xyzw, ref, atol=B.tol)
    back = B.check(rot.quat_xyzw_to_wxyz(B(ref)))
    ref_back = Rotation.from_quat(B.exact(ref).reshape(-1, 4)).as_quat(scalar_first=True).reshape(shape)
    np.testing.assert_allclose(back, ref_back, atol=B.tol)
    # a pure reorder: exact, and the two are inverse
    np.testing.assert_array_equal(B.check(rot.quat_xyzw_to_wxyz(rot.quat_wxyz_to_xyzw(B(q)))), B.exact(q))
    np.testing.assert_array_equal(xyzw[..., 3], B.exact(q)[..., 0])


def test_wxyz_xyzw_reorder_keeps_any_dtype_and_checks_shape():
    idx = rot.quat_wxyz_to_xyzw(np.arange(10, 14))  # column indices of a WXYZ block, in XYZW order
    assert idx.dtype == np.arange(1).dtype and idx.tolist() == [11, 12, 13, 10]
    assert rot.quat_xyzw_to_wxyz([0.1, 0.2, 0.3, 0.9]).tolist() == [0.9, 0.1, 0.2, 0.3]
    t = torch.arange(8).reshape(2, 4)
    assert rot.quat_xyzw_to_wxyz(t).tolist() == [[3, 0, 1, 2], [7, 4, 5, 6]]
    with pytest.raises(ShapeError):
        rot.quat_wxyz_to_xyzw(np.zeros((2, 3)))
    with pytest.raises(ShapeError):
        rot.quat_xyzw_to_wxyz(torch.zeros(5))


@backends
def test_quat_to_matrix_large_batches_match_scipy(B):
    """Across the numpy block boundary, with several batch dims, non-unit and non-contiguous input."""
    n = 2 * rot._MATRIX_BLOCK + 5
    q = random_quats(61, (n,)) * np.random.default_rng(62).uniform(0.5, 2.0, size=(n, 1))
    big = np.zeros((n, 8))
    big[:, ::2] = q  # a strided view of it below
    src = B(big)[:, ::2]
    m = B.check(rot.quat_to_matrix(src))
    ref = Rotation.from_quat(B.exact(q), scalar_first=True).as_matrix()
    np.testing.assert_allclose(m, ref, atol=4 * B.tol)
    m3 = B.check(rot.quat_to_matrix(B(q[: 3 * 5 * 7]).reshape(3, 5, 7, 4)))
    np.testing.assert_array_equal(m3.reshape(-1, 3, 3), m[: 3 * 5 * 7])
    out = rot.quat_to_matrix(B(q[:10]))
    assert out.is_contiguous() if B.lib == "torch" else out.flags.c_contiguous
    # rows are orthonormal with det +1 to the dtype's precision
    np.testing.assert_allclose(m @ np.swapaxes(m, -1, -2), np.broadcast_to(np.eye(3), m.shape), atol=4 * B.tol)
    np.testing.assert_allclose(np.linalg.det(m), 1.0, atol=4 * B.tol)


def test_quat_to_matrix_torch_gradients():
    q = torch.tensor(random_quats(63, (5,)), requires_grad=True)
    rot.quat_to_matrix(q).sum().backward()
    assert torch.isfinite(q.grad).all()
    e = torch.tensor(random_quats(64, (5,)), requires_grad=True)
    rot.quat_to_euler(e, "zyx", extrinsic=False).sum().backward()
    assert torch.isfinite(e.grad).all()


@backends
@pytest.mark.parametrize("extrinsic", [True, False])
@pytest.mark.parametrize("order", ["xyz", "zxy", "zyx", "zxz", "yxy"])
def test_euler_degrees_match_scipy(B, order, extrinsic):
    q = random_quats(65, (40,))
    seq = _scipy_seq(order, extrinsic)
    out = B.check(rot.quat_to_euler(B(q), order, extrinsic=extrinsic, degrees=True))
    ref = to_scipy(B.exact(q)).as_euler(seq, degrees=True)
    assert (np.abs((out - ref + 180.0) % 360.0 - 180.0) <= 2000 * B.tol).all()
    angles = np.random.default_rng(66).uniform(-360, 360, size=(40, 3))
    qe = B.check(rot.quat_from_euler(B(angles), order, extrinsic=extrinsic, degrees=True))
    np.testing.assert_allclose(qe, from_scipy(Rotation.from_euler(seq, B.exact(angles), degrees=True)), atol=8 * B.tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_euler_component_major_layout_kept(dtype):
    """A [4, ...] array seen as (..., 4) is read without a copy and gives component-major angles."""
    q4 = np.ascontiguousarray(np.moveaxis(random_quats(67, (50, 6)), -1, 0)).astype(dtype)
    view = np.moveaxis(q4, 0, -1)
    out = rot.quat_to_euler(view, "xyz", extrinsic=False)
    assert np.moveaxis(out, -1, 0).flags.c_contiguous
    np.testing.assert_array_equal(out, rot.quat_to_euler(np.ascontiguousarray(view), "xyz", extrinsic=False))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_euler_half_turns_give_plus_pi(dtype):
    """Signed zeros in the components never turn a half turn into -pi."""
    q = np.array([[0.0, 0.0, 0.0, 1.0], [0.0, -0.0, -0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [-0.0, 1.0, -0.0, -0.0]], dtype)
    for order in ("xyz", "zyx", "zxz"):
        for extrinsic in (True, False):
            out = rot.quat_to_euler(q, order, extrinsic=extrinsic)
            assert (out[..., [0, 2]] > -np.pi).all(), (order, extrinsic, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multiply_keeps_component_major_layout(dtype):
    """The mapper multiplies [4, frames, bodies] blocks seen as (frames, bodies, 4): no copies."""
    b4 = np.ascontiguousarray(np.moveaxis(random_quats(68, (30, 5)), -1, 0)).astype(dtype)
    a = random_quats(69, (5,)).astype(dtype)
    out = rot.quat_multiply(a, np.moveaxis(b4, 0, -1))
    assert np.moveaxis(out, -1, 0).flags.c_contiguous
    np.testing.assert_array_equal(out, rot.quat_multiply(a, np.ascontiguousarray(np.moveaxis(b4, 0, -1))))
    ref = from_scipy(to_scipy(a) * to_scipy(np.moveaxis(b4, 0, -1).astype(np.float64)))
    assert quat_dist(out, ref).max() <= (2e-6 if dtype == np.float32 else 1e-12)
    assert rot.quat_multiply(random_quats(70, (3, 4)), a[0]).flags.c_contiguous  # plain input: C order

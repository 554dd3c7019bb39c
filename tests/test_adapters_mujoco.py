"""MuJoCo adapter checked against MuJoCo itself: packed qpos/qvel -> mj_kinematics / mj_comVel ->
body poses and velocities (mj_objectVelocity) equal our forward kinematics and finite differences of it."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine import rotations as R
from kangengine.adapters import MotionAdapter
from kangengine.adapters.mujoco import MuJoCoMotionAdapter
from kangengine.animation import ArticulationCoordinateLayout, ArticulationMotion, forward_kinematics
from kangengine.asset import JointType
from kangengine.errors import LayoutMismatch, ShapeError

# A model with ball joints whose bodies have COMs away from their origins, a ball joint with an anchor,
# a slide followed by a hinge on one body, rotated bodies and a hinge with a ref and an anchor.
BALL_COM_MJCF = """
<mujoco model="ball_com">
  <compiler angle="radian"/>
  <worldbody>
    <body name="torso" pos="0 0 1" quat="0.9 0.1 0.3 0.2">
      <freejoint name="root"/>
      <inertial pos="0.05 -0.02 0.03" mass="3" diaginertia="0.1 0.2 0.15"/>
      <geom type="sphere" size="0.1"/>
      <body name="upper" pos="0.1 0.2 -0.1" quat="0.7 0.7 0 0">
        <joint name="shoulder" type="ball" pos="0.02 0 0.01"/>
        <inertial pos="0 0.1 -0.05" mass="1" diaginertia="0.01 0.02 0.03"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.04"/>
        <body name="lower" pos="0 0 -0.3">
          <joint name="elbow_twist" type="hinge" axis="0.3 0.4 0.866" ref="0.2" pos="0 0.01 0.02"/>
          <inertial pos="0.03 0.01 -0.12" mass="0.5" diaginertia="0.005 0.004 0.003"/>
          <geom type="capsule" fromto="0 0 0 0 0 -0.25" size="0.03"/>
        </body>
      </body>
      <body name="slider" pos="-0.1 0 0">
        <joint name="slide" type="slide" axis="0 0.6 0.8"/>
        <joint name="slide_hinge" type="hinge" axis="1 0 0" pos="0 0.05 0"/>
        <inertial pos="0 -0.04 0.02" mass="0.6" diaginertia="0.01 0.01 0.01"/>
        <geom type="box" size="0.05 0.05 0.05"/>
        <body name="tip" pos="0 0 0.2">
          <joint name="tip_ball" type="ball"/>
          <inertial pos="0.01 0.02 0.03" mass="0.4" diaginertia="0.004 0.005 0.006"/>
          <geom type="sphere" size="0.03"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

MODELS = [
    "mjcf/protomotions/smpl_humanoid.xml",
    "mjcf/dm_control/humanoid_CMU.xml",
    "mjcf/unitree/g1_29dof.nomesh.xml",
    "mjcf/dm_control/model_with_ball_joints.xml",
]


@pytest.fixture(scope="module")
def ball_com_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("mjcf") / "ball_com.xml"
    p.write_text(BALL_COM_MJCF)
    return p


def random_state(layout, frames, rng, dtype=np.float64):
    """Random q (unit quaternions, hinges within +-1.2 rad of ref) and qd."""
    q = np.zeros((frames, layout.nq))
    for b in layout.blocks:
        o = b.q_offset
        if b.joint_type is JointType.FREE:
            q[:, o : o + 3] = rng.normal(size=(frames, 3))
            q[:, o + 3 : o + 7] = R.quat_normalize(rng.normal(size=(frames, 4)))
        elif b.joint_type is JointType.BALL:
            q[:, o : o + 4] = R.quat_normalize(rng.normal(size=(frames, 4)))
        elif b.q_dim == 1:
            q[:, o] = b.ref + rng.uniform(-1.2, 1.2, size=frames)
    qd = rng.normal(size=(frames, layout.nv)) * 2.0
    return q.astype(dtype), qd.astype(dtype)


def fd_body_velocities(layout, q, qd, coms, h=1e-6):
    """Our own body velocities by central differences of our FK along layout.integrate: origin linear,
    COM linear and angular, all in world."""
    qp = layout.integrate(q, qd, h)
    qm = layout.integrate(q, qd, -h)
    pp, rp = forward_kinematics(layout, qp)
    pm, rm = forward_kinematics(layout, qm)
    v_origin = (pp - pm) / (2 * h)
    w = R.quat_to_rotvec(R.quat_multiply(rp, R.quat_conjugate(rm))) / (2 * h)
    cp = pp + R.quat_rotate(rp, np.broadcast_to(coms, pp.shape))
    cm = pm + R.quat_rotate(rm, np.broadcast_to(coms, pm.shape))
    v_com = (cp - cm) / (2 * h)
    return v_origin, v_com, w


def body_ids(model, names):
    """MuJoCo body ids of ``names`` (unnamed MuJoCo bodies are ``body{i}``, as the MJCF loader names them)."""
    mj = [model.body(i).name or f"body{i}" for i in range(model.nbody)]
    return [mj.index(n) for n in names]


def mujoco_bodies(model, qpos, qvel, names):
    """Per-frame MuJoCo body poses and world velocities (origin and COM) for bodies ``names``."""
    data = mujoco.MjData(model)
    ids = body_ids(model, names)
    out = {k: [] for k in ("pos", "quat", "v_origin", "w", "v_com", "w_com")}
    res = np.zeros(6)
    for f in range(qpos.shape[0]):
        data.qpos[:] = qpos[f]
        data.qvel[:] = qvel[f]
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_comVel(model, data)
        out["pos"].append(data.xpos[ids].copy())
        out["quat"].append(data.xquat[ids].copy())
        vo, wo, vc, wc = [], [], [], []
        for i in ids:
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_XBODY, i, res, 0)
            wo.append(res[:3].copy())
            vo.append(res[3:].copy())
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_BODY, i, res, 0)
            wc.append(res[:3].copy())
            vc.append(res[3:].copy())
        out["v_origin"].append(vo)
        out["w"].append(wo)
        out["v_com"].append(vc)
        out["w_com"].append(wc)
    return {k: np.asarray(v) for k, v in out.items()}


def _load(path, order="DFS"):
    desc = ke.asset.MJCFLoader.load(path, order=order)
    floating = desc.joints[0].type is JointType.FREE if desc.joints else False
    return desc, ArticulationCoordinateLayout.from_data(data=desc, free_root=floating)


def _check_against_mujoco(path, order, frames=6, seed=0):
    desc, layout = _load(path, order)
    model = mujoco.MjModel.from_xml_path(str(path))
    adapter = MuJoCoMotionAdapter(layout)
    adapter.validate_model(model)
    rng = np.random.default_rng(seed)
    q, qd = random_state(layout, frames, rng)
    buf = adapter.pack_arrays(q, qd)
    assert buf.qpos.dtype == np.float64 and buf.qpos.shape == (frames, model.nq)
    mj = mujoco_bodies(model, buf.qpos, buf.qvel, layout.body_names)
    pos, quat = forward_kinematics(layout, q)
    np.testing.assert_allclose(mj["pos"], pos, atol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(mj["quat"] * quat, axis=-1)), 1.0, atol=1e-9)
    v_origin, v_com, w = fd_body_velocities(layout, q, qd, layout.body_coms)
    np.testing.assert_allclose(mj["w"], w, atol=2e-5)
    np.testing.assert_allclose(mj["w_com"], w, atol=2e-5)
    np.testing.assert_allclose(mj["v_origin"], v_origin, atol=2e-5)
    np.testing.assert_allclose(mj["v_com"], v_com, atol=2e-5)
    # COMs of the layout are MuJoCo's body_ipos
    ids = body_ids(model, layout.body_names)
    np.testing.assert_allclose(layout.body_coms, model.body_ipos[ids], atol=1e-12)
    # round trip
    q2, qd2 = adapter.unpack_arrays(buf.qpos, buf.qvel)
    np.testing.assert_allclose(q2, q, atol=1e-12)
    np.testing.assert_allclose(qd2, qd, atol=1e-9)
    return layout, adapter, model


@pytest.mark.parametrize("rel", MODELS)
def test_pack_matches_mujoco_kinematics_and_velocities(rel):
    _check_against_mujoco(data_file(rel), "DFS")


def test_ball_joints_with_com_offsets(ball_com_path):
    layout, adapter, model = _check_against_mujoco(ball_com_path, "DFS", frames=10, seed=3)
    assert np.linalg.norm(layout.body_coms, axis=1).min() > 0.01  # every COM is away from its origin
    assert adapter.joint_names == ("root", "shoulder", "elbow_twist", "slide", "slide_hinge", "tip_ball")


def test_bfs_layout_is_permuted_into_mujoco_order(ball_com_path):
    layout, adapter, model = _check_against_mujoco(ball_com_path, "BFS", frames=5, seed=4)
    assert not np.array_equal(adapter.qpos_index, np.arange(layout.nq))  # BFS differs from XML order
    # an adapter told the model orders the same way
    other = MuJoCoMotionAdapter(layout, model=model)
    np.testing.assert_array_equal(other.qpos_index, adapter.qpos_index)


def test_bfs_cmu_humanoid():
    _check_against_mujoco(data_file("mjcf/dm_control/humanoid_CMU.xml"), "BFS", frames=3, seed=5)


def test_free_root_angular_velocity_is_local_in_mujoco(ball_com_path):
    """The documented difference, written out: qvel[3:6] = R_root^T w_world; linear velocity unchanged."""
    _, layout = _load(ball_com_path)
    adapter = MuJoCoMotionAdapter(layout)
    q, qd = random_state(layout, 4, np.random.default_rng(9))
    buf = adapter.pack_arrays(q, qd)
    np.testing.assert_allclose(buf.qvel[:, :3], qd[:, :3])
    np.testing.assert_allclose(buf.qvel[:, 3:6], R.quat_rotate_inverse(q[:, 3:7], qd[:, 3:6]), atol=1e-12)
    np.testing.assert_array_equal(buf.qpos, q)


def test_motion_round_trip_float32():
    _, layout = _load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    q, qd = random_state(layout, 20, np.random.default_rng(1))
    motion = ArticulationMotion(q, qd, 30.0, layout.model_signature, joint_names=layout.joint_names)
    adapter = MuJoCoMotionAdapter(layout)
    buf = adapter.pack(motion)
    assert buf.qpos.dtype == np.float32 and buf.qvel.dtype == np.float32
    back = adapter.unpack(buf.qpos, buf.qvel, fps=motion.fps())
    assert back.fps() == 30.0 and back.layout_signature == layout.model_signature
    np.testing.assert_allclose(back.q, motion.q, atol=1e-6)
    np.testing.assert_allclose(back.qd, motion.qd, atol=1e-5)


def test_motion_for_another_layout_is_refused():
    _, layout = _load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    _, other = _load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    q, qd = random_state(other, 2, np.random.default_rng(0))
    motion = ArticulationMotion(q, qd, 30.0, other.model_signature)
    with pytest.raises(LayoutMismatch, match="signature"):
        MuJoCoMotionAdapter(layout).pack(motion)
    with pytest.raises(ShapeError, match="qpos"):
        MuJoCoMotionAdapter(layout).unpack(q, qd, fps=30)


def test_validate_model_lists_every_mismatch(tmp_path, ball_com_path):
    _, layout = _load(ball_com_path)
    text = (
        BALL_COM_MJCF.replace('name="shoulder"', 'name="shoulder2"')
        .replace('axis="1 0 0" pos="0 0.05 0"', 'axis="0 1 0" pos="0 0.05 0"')
        .replace('ref="0.2"', 'ref="0.3"')
        .replace('<joint name="slide" type="slide"', '<joint name="slide" type="hinge"')
    )
    p = tmp_path / "changed.xml"
    p.write_text(text)
    model = mujoco.MjModel.from_xml_path(str(p))
    with pytest.raises(LayoutMismatch) as info:
        MuJoCoMotionAdapter(layout).validate_model(model)
    msg = str(info.value)
    assert "'shoulder' (ball on body 'upper') is missing" in msg
    assert "'slide_hinge': axis [0.0, 1.0, 0.0] in the model" in msg
    assert "'elbow_twist': ref 0.3 in the model, 0.2 in the layout" in msg
    assert "'slide': type hinge in the model, slide in the layout" in msg
    assert "model joints that the layout lacks: 'shoulder2'" in msg
    assert "5 problems" in msg


def test_validate_model_reports_order_and_other_models():
    _, layout = _load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    cmu = mujoco.MjModel.from_xml_path(str(data_file("mjcf/dm_control/humanoid_CMU.xml")))
    with pytest.raises(LayoutMismatch, match="bodies"):
        MuJoCoMotionAdapter(layout).validate_model(cmu)
    _, bfs = _load(data_file("mjcf/protomotions/smpl_humanoid.xml"), order="BFS")
    smpl = mujoco.MjModel.from_xml_path(str(data_file("mjcf/protomotions/smpl_humanoid.xml")))
    MuJoCoMotionAdapter(bfs).validate_model(smpl)  # the adapter packs in MuJoCo's order by default


def test_pack_sample_blends_in_torch(ball_com_path):
    torch = pytest.importorskip("torch")
    _, layout = _load(ball_com_path)
    adapter = MuJoCoMotionAdapter(layout)
    assert isinstance(adapter, MotionAdapter)
    rng = np.random.default_rng(2)
    q, qd = random_state(layout, 2, rng)
    motion = ArticulationMotion(q, qd, 10.0, layout.model_signature)
    frames = adapter.prepare_motion(motion)
    assert set(frames) == {"qpos", "qvel"} and frames["qpos"].shape == (2, layout.nq)
    n = 5
    f0 = {k: torch.as_tensor(v[0]).repeat(n, 1) for k, v in frames.items()}
    f1 = {k: torch.as_tensor(v[1]).repeat(n, 1) for k, v in frames.items()}
    blend = torch.linspace(0, 1, n)
    offset = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    out = adapter.pack_sample(f0, f1, blend, root_offset=offset)
    assert out.qpos.shape == (n, layout.nq) and out.qpos.dtype == torch.float32
    np.testing.assert_allclose(out.qpos[0, :3].numpy(), frames["qpos"][0, :3] + offset[0].numpy(), atol=1e-6)
    last, want_last = out.qpos[-1].numpy(), frames["qpos"][1]
    quat_cols = adapter._quat_cols
    other = np.setdiff1d(np.arange(layout.nq), quat_cols.reshape(-1))
    np.testing.assert_allclose(last[other[3:]], want_last[other[3:]], atol=1e-6)
    for cols in quat_cols:  # the shortest-path slerp may end at -q1, the same rotation
        assert abs(abs(float(last[cols] @ want_last[cols])) - 1) < 1e-6
    np.testing.assert_allclose(out.qvel[2].numpy(), frames["qvel"].mean(0), atol=1e-6)
    # the middle sample's quaternions are the slerp midpoints, and the canonical interpolation agrees
    mid = layout.interpolate(q[0], q[1], 0.5)
    want = adapter.pack_arrays(mid[None], qd[:1]).qpos[0]
    got = out.qpos[2].double().numpy()
    for cols in quat_cols:
        assert abs(abs(float(got[cols] @ want[cols])) - 1) < 1e-6


def test_prepare_motion_maps_a_skeleton_motion():
    """A SkeletonMotion goes through ArticulationMotionMapper: its frames equal those of the mapped motion."""
    from kangengine.animation.mapper import ArticulationMotionMapper

    _, layout = _load(data_file("mjcf/unitree/g1_29dof.nomesh.xml"))
    rng = np.random.default_rng(11)
    q, _ = random_state(layout, 12, rng)
    q[:, 7:] = np.clip(q[:, 7:], layout.dof_lower[6:] + 1e-3, layout.dof_upper[6:] - 1e-3)
    q[:, 3:7] = R.quat_hemisphere_continuity(q[:, 3:7])
    mapper = ArticulationMotionMapper(layout)
    motion = ArticulationMotion(q, np.zeros((12, layout.nv)), 30.0, layout.model_signature)
    skeleton_motion = mapper.to_skeleton_motion(motion)
    mapped = mapper.to_articulation_motion(skeleton_motion).motion
    adapter = MuJoCoMotionAdapter(layout)
    frames = adapter.prepare_motion(skeleton_motion)
    want = adapter.pack(mapped)
    np.testing.assert_allclose(frames["qpos"], want.qpos, atol=1e-6)
    np.testing.assert_allclose(frames["qvel"], want.qvel, atol=1e-5)
    np.testing.assert_allclose(layout.difference(frames["qpos"].astype(np.float64), q)[:, 6:], 0, atol=1e-4)
    # the library hands the canonical skeleton motion alongside anything else
    frames2 = adapter.prepare_motion(object(), skeleton_motion=skeleton_motion)
    np.testing.assert_array_equal(frames2["qpos"], frames["qpos"])
    with pytest.raises(ShapeError, match="ArticulationMotion or a SkeletonMotion"):
        adapter.prepare_motion(object())


def test_motion_library_backend_state():
    """Inside MotionLibrary: stored frames come back as the packed rows; in-between times as the packed
    geodesic interpolation (slerp of quaternions, lerp of the rest)."""
    torch = pytest.importorskip("torch")
    library = pytest.importorskip("kangengine.animation.library")
    _, layout = _load(data_file("mjcf/unitree/g1_29dof.nomesh.xml"))
    rng = np.random.default_rng(12)
    q, qd = random_state(layout, 10, rng)
    q[:, 7:] = np.clip(q[:, 7:], layout.dof_lower[6:] + 1e-3, layout.dof_upper[6:] - 1e-3)
    q[:, 3:7] = R.quat_hemisphere_continuity(q[:, 3:7])
    motion = ArticulationMotion(q, qd, 10.0, layout.model_signature)
    adapter = MuJoCoMotionAdapter(layout)
    lib = library.MotionLibrary(motions=[motion], adapter=adapter, device="cpu")
    packed = adapter.pack(motion)
    exact = lib.sample_frames([0, 0, 0], [0, 4, 9])
    np.testing.assert_allclose(exact.backend_state.qpos.numpy(), packed.qpos[[0, 4, 9]], atol=1e-6)
    np.testing.assert_allclose(exact.backend_state.qvel.numpy(), packed.qvel[[0, 4, 9]], atol=1e-6)
    mid = lib.sample(motion_ids=[0], times=[0.25], loop=False).backend_state
    want = adapter.pack_arrays(layout.interpolate(q[2], q[3], 0.5)[None], qd[2:3]).qpos[0]
    got = mid.qpos[0].double().numpy()
    np.testing.assert_allclose(layout.difference(got, want), 0, atol=1e-5)
    assert isinstance(mid.qpos, torch.Tensor)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shared_blend_helpers_equal_rotations_slerp(dtype):
    """The rotation-vector blend of pack_sample equals rotations.quat_slerp."""
    torch = pytest.importorskip("torch")
    from kangengine.adapters import _common as C

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    n, k = 300, 4
    r0 = torch.randn(n, k, 3, generator=gen, dtype=dt) * 1.2
    r1 = r0 + torch.randn(n, k, 3, generator=gen, dtype=dt) * torch.tensor([0.0, 1e-5, 0.3, 2.0], dtype=dt)[:, None]
    t = torch.rand(n, 1, generator=gen, dtype=dt)
    want = R.quat_slerp(R.quat_from_rotvec(r0), R.quat_from_rotvec(r1), t)
    tol = 1e-5 if dtype == "float32" else 1e-12
    cols = np.arange(k * 3).reshape(k, 3)
    parts = C.slerp_rotvec_columns(r0.reshape(n, -1), r1.reshape(n, -1), t, cols)
    got_rv = torch.stack(parts, dim=-1)
    assert float(R.quat_angle_between(R.quat_from_rotvec(got_rv), want).max()) < 10 * tol
    assert float(got_rv.norm(dim=-1).max()) <= np.pi + 1e-6  # the shortest rotation vector

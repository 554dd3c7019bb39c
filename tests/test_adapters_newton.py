"""Newton adapter checked against Newton itself: models built by Newton's own MJCF importer, packed
joint_q/joint_qd -> newton.eval_fk -> body_q/body_qd equal our forward kinematics and finite differences of it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import data_file
from test_adapters_mujoco import BALL_COM_MJCF, fd_body_velocities, random_state

import kangengine as ke
from kangengine import rotations as R
from kangengine.adapters import MotionAdapter
from kangengine.animation import ArticulationCoordinateLayout, ArticulationMotion, forward_kinematics
from kangengine.asset import JointType
from kangengine.errors import LayoutMismatch, MissingDependencyError

newton = pytest.importorskip("newton", reason="newton is not installed (pip install -e '.[newton]')")
wp = pytest.importorskip("warp")
wp.config.quiet = True

from kangengine.adapters.newton import NewtonMotionAdapter, _body_names  # noqa: E402

MODELS = [
    "mjcf/protomotions/smpl_humanoid.xml",
    "mjcf/dm_control/humanoid_CMU.xml",
    "mjcf/unitree/g1_29dof.nomesh.xml",
    "mjcf/dm_control/model_with_ball_joints.xml",
]


def newton_model(path):
    builder = newton.ModelBuilder()
    builder.add_mjcf(str(path))
    return builder.finalize(device="cpu")


def newton_fk(model, joint_q, joint_qd):
    """Per-frame body_q [frames, bodies, 7] and body_qd [frames, bodies, 6] from newton.eval_fk."""
    state = model.state()
    q_arr = wp.zeros(model.joint_coord_count, dtype=wp.float32, device="cpu")
    qd_arr = wp.zeros(model.joint_dof_count, dtype=wp.float32, device="cpu")
    body_q, body_qd = [], []
    for f in range(joint_q.shape[0]):
        q_arr.assign(joint_q[f].astype(np.float32))
        qd_arr.assign(joint_qd[f].astype(np.float32))
        newton.eval_fk(model, q_arr, qd_arr, state)
        body_q.append(state.body_q.numpy().copy())
        body_qd.append(state.body_qd.numpy().copy())
    return np.asarray(body_q, dtype=np.float64), np.asarray(body_qd, dtype=np.float64)


def _load(path, order="DFS"):
    desc = ke.asset.MJCFLoader.load(path, order=order)
    floating = desc.joints[0].type is JointType.FREE if desc.joints else False
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=floating)


# Newton merges the slide and hinge of body "slider" into one D6 joint with ONE anchor (the first
# joint's), so the Newton variant of the test model keeps the hinge at the slide's anchor.
NEWTON_BALL_COM_MJCF = BALL_COM_MJCF.replace('axis="1 0 0" pos="0 0.05 0"', 'axis="1 0 0"')


@pytest.fixture(scope="module")
def ball_com_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("mjcf") / "ball_com.xml"
    p.write_text(NEWTON_BALL_COM_MJCF)
    return p


def test_merged_d6_with_two_anchors_is_reported(tmp_path):
    p = tmp_path / "two_anchors.xml"
    p.write_text(BALL_COM_MJCF)
    with pytest.raises(LayoutMismatch, match=r"joint 'slide_hinge': anchor \[0.0, 0.0, 0.0\] in Newton"):
        NewtonMotionAdapter(_load(p)).validate_model(newton_model(p))


def _check_against_newton(path, order="DFS", frames=4, seed=0):
    layout = _load(path, order)
    model = newton_model(path)
    adapter = NewtonMotionAdapter(layout)
    match = adapter.validate_model(model)
    rng = np.random.default_rng(seed)
    q, qd = random_state(layout, frames, rng)
    qd *= 0.5
    buf = adapter.pack_arrays(q, qd)
    body_q, body_qd = newton_fk(model, buf.joint_q, buf.joint_qd)
    names = _body_names(model)
    ids = [names.index(n) for n in layout.body_names]
    body_q, body_qd = body_q[:, ids], body_qd[:, ids]
    pos, quat = forward_kinematics(layout, q)
    np.testing.assert_allclose(body_q[..., :3], pos, atol=2e-5)
    quat_newton = body_q[..., [6, 3, 4, 5]]  # Newton stores XYZW
    np.testing.assert_allclose(np.abs(np.sum(quat_newton * quat, axis=-1)), 1.0, atol=2e-6)
    v_origin, v_com, w = fd_body_velocities(layout, q, qd, layout.body_coms)
    np.testing.assert_allclose(body_qd[..., 3:], w, atol=1e-4)  # (v_com_world, omega_world)
    np.testing.assert_allclose(body_qd[..., :3], v_com, atol=1e-4)
    q2, qd2 = adapter.unpack_arrays(buf.joint_q, buf.joint_qd)
    np.testing.assert_allclose(q2, q, atol=1e-12)
    np.testing.assert_allclose(qd2, qd, atol=1e-9)
    return layout, adapter, model, match


@pytest.mark.parametrize("rel", MODELS)
def test_pack_matches_newton_fk(rel):
    _check_against_newton(data_file(rel))


def test_ball_joints_slide_hinge_d6_and_com(ball_com_path):
    layout, adapter, model, match = _check_against_newton(ball_com_path, frames=6, seed=2)
    # the slide and hinge of body "slider" form one Newton D6 joint, linear DOF first
    assert "slider" in adapter.body_order
    k = adapter.body_order.index("slider")
    assert match.joint_labels[k].endswith("/slide_slide_hinge")
    assert int(model.joint_type.numpy()[k]) == int(newton.JointType.D6)
    np.testing.assert_array_equal(model.joint_dof_dim.numpy()[k], [1, 1])


def test_bfs_layout_packs_in_newton_order():
    layout, adapter, model, _ = _check_against_newton(data_file("mjcf/dm_control/humanoid_CMU.xml"), "BFS", 2, 3)
    assert not np.array_equal(adapter.joint_qd_index, np.arange(layout.nv))


def test_free_root_conventions_written_out(ball_com_path):
    """XYZW root quaternion; root linear velocity at the COM: v_com = v_origin + w x (R com)."""
    layout = _load(ball_com_path)
    adapter = NewtonMotionAdapter(layout)
    q, qd = random_state(layout, 3, np.random.default_rng(5))
    buf = adapter.pack_arrays(q, qd)
    np.testing.assert_array_equal(buf.joint_q[:, :3], q[:, :3])
    np.testing.assert_array_equal(buf.joint_q[:, 3:7], q[:, [4, 5, 6, 3]])
    com = R.quat_rotate(q[:, 3:7], layout.body_coms[0])
    np.testing.assert_allclose(buf.joint_qd[:, :3], qd[:, :3] + np.cross(qd[:, 3:6], com), atol=1e-12)
    np.testing.assert_array_equal(buf.joint_qd[:, 3:6], qd[:, 3:6])


def test_hinge_ref_is_subtracted(ball_com_path):
    layout = _load(ball_com_path)
    adapter = NewtonMotionAdapter(layout)
    q = layout.neutral()[None]
    buf = adapter.pack_arrays(q, np.zeros((1, layout.nv)))
    blk = layout.block("elbow_twist")
    assert blk.ref == pytest.approx(0.2)
    assert buf.joint_q[0, list(adapter.joint_q_index).index(blk.q_offset)] == pytest.approx(0.0)


def test_motion_round_trip_and_pack_sample():
    torch = pytest.importorskip("torch")
    layout = _load(data_file("mjcf/unitree/g1_29dof.nomesh.xml"))
    adapter = NewtonMotionAdapter(layout)
    assert isinstance(adapter, MotionAdapter)
    q, qd = random_state(layout, 3, np.random.default_rng(7))
    motion = ArticulationMotion(q, qd, 50.0, layout.model_signature)
    buf = adapter.pack(motion)
    assert buf.joint_q.dtype == np.float32
    back = adapter.unpack(buf.joint_q, buf.joint_qd, fps=50.0)
    np.testing.assert_allclose(back.q, motion.q, atol=1e-6)
    np.testing.assert_allclose(back.qd, motion.qd, atol=1e-5)
    frames = adapter.prepare_motion(motion)
    f0 = {k: torch.as_tensor(v[:2]) for k, v in frames.items()}
    f1 = {k: torch.as_tensor(v[1:]) for k, v in frames.items()}
    out = adapter.pack_sample(f0, f1, torch.tensor([0.0, 0.5]), root_offset=torch.ones(2, 3))
    np.testing.assert_allclose(out.joint_q[0, :3].numpy(), frames["joint_q"][0, :3] + 1, atol=1e-6)
    mid_q = layout.interpolate(motion.q[1], motion.q[2], 0.5)
    want = adapter.pack_arrays(mid_q[None], motion.qd[:1]).joint_q[0]
    got = out.joint_q[1].numpy()
    np.testing.assert_allclose(got[7:], want[7:], atol=1e-5)
    assert abs(abs(float(got[3:7] @ want[3:7])) - 1) < 1e-6


def test_validate_model_lists_every_mismatch(tmp_path, ball_com_path):
    layout = _load(ball_com_path)
    text = (
        NEWTON_BALL_COM_MJCF.replace('axis="1 0 0"', 'axis="0 1 0"')
        .replace('<joint name="slide" type="slide" axis="0 0.6 0.8"/>', "")
        .replace('<inertial pos="0.01 0.02 0.03"', '<inertial pos="0.02 0.02 0.03"')
    )
    p = tmp_path / "changed.xml"
    p.write_text(text)
    with pytest.raises(LayoutMismatch) as info:
        NewtonMotionAdapter(layout).validate_model(newton_model(p))
    msg = str(info.value)
    assert "body 'slider': Newton joint has 0 linear + 1 angular DOFs; the layout has 1 + 1" in msg
    assert "body 'tip': joint_q_start/joint_qd_start" in msg
    assert "body 'tip': body_com [0.02, 0.02, 0.03] in Newton, [0.01, 0.02, 0.03] in the layout" in msg
    assert "3 problems" in msg


def test_validate_model_other_model_and_order():
    layout = _load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    cmu = newton_model(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    with pytest.raises(LayoutMismatch, match="has no joint in Newton articulation 0"):
        NewtonMotionAdapter(layout).validate_model(cmu)


def test_missing_newton_names_the_extra(monkeypatch):
    from kangengine._deps import require

    monkeypatch.setitem(sys.modules, "newton", None)  # import newton now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"\.\[newton\]"):
        require("newton", "newton")
    # kangengine, its adapters and this adapter import and pack without newton installed
    code = (
        "import sys; sys.modules['newton'] = None; sys.modules['warp'] = None\n"
        "import kangengine as ke, numpy as np\n"
        "from kangengine.adapters.newton import NewtonMotionAdapter\n"
        "d = ke.asset.MJCFLoader.load(sys.argv[1])\n"
        "lay = ke.animation.ArticulationCoordinateLayout.from_data(data=d)\n"
        "b = NewtonMotionAdapter(lay).pack_arrays(lay.neutral()[None], np.zeros((1, lay.nv)))\n"
        "print(b.joint_q.shape)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(data_file("mjcf/unitree/g1_29dof.nomesh.xml"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "(1, 36)" in out.stdout


def test_g1_urdf_through_newtons_urdf_importer():
    path = data_file("urdf/unitree/g1_29dof.nomesh.urdf")
    layout = ArticulationCoordinateLayout.from_data(data=ke.asset.URDFLoader.load(path), free_root=True)
    builder = newton.ModelBuilder()
    builder.add_urdf(str(path), floating=True, collapse_fixed_joints=False)
    model = builder.finalize(device="cpu")
    adapter = NewtonMotionAdapter(layout, model=model)  # validated on construction
    q, qd = random_state(layout, 3, np.random.default_rng(13))
    qd *= 0.5
    buf = adapter.pack_arrays(q, qd)
    body_q, body_qd = newton_fk(model, buf.joint_q, buf.joint_qd)
    names = _body_names(model)
    ids = [names.index(n) for n in layout.body_names]
    pos, quat = forward_kinematics(layout, q)
    np.testing.assert_allclose(body_q[:, ids, :3], pos, atol=2e-5)
    np.testing.assert_allclose(np.abs(np.sum(body_q[:, ids][..., [6, 3, 4, 5]] * quat, axis=-1)), 1.0, atol=2e-6)
    _, v_com, w = fd_body_velocities(layout, q, qd, layout.body_coms)
    np.testing.assert_allclose(body_qd[:, ids, 3:], w, atol=1e-4)
    np.testing.assert_allclose(body_qd[:, ids, :3], v_com, atol=1e-4)

"""PhysX adapter checked against PhysX itself (``ovphysx`` in CPU mode): the articulation is authored in USD
from the same ArticulationDesc, the packed root and DOF state is written through PhysX's articulation
views, and the link poses and velocities PhysX computes equal our forward kinematics and finite
differences of it. Covers a floating base, spherical joints, three-hinge D6 joints, revolute joints with a
ref and an anchor, a prismatic joint, COM offsets, and a fixed base."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
from conftest import data_file
from test_adapters_mujoco import fd_body_velocities, random_state

import kangengine as ke
from kangengine import rotations as R
from kangengine.adapters import MotionAdapter
from kangengine.adapters.physx import PhysXMotionAdapter
from kangengine.animation import ArticulationCoordinateLayout, ArticulationMotion, forward_kinematics
from kangengine.asset import JointType
from kangengine.errors import LayoutMismatch, MissingDependencyError, UnsupportedJointError

# Joints PhysX can represent one per link: a free root, balls with anchors, a hinge triplet on a rotated
# frame, a single hinge with ref and anchor, a slide, a body without joints; COMs away from the origins.
PHYSX_MJCF = """
<mujoco model="physx_test">
  <compiler angle="radian"/>
  <worldbody>
    <body name="torso" pos="0 0 1" quat="0.9 0.1 0.3 0.2">
      <freejoint name="root"/>
      <inertial pos="0.05 -0.02 0.03" mass="3" diaginertia="0.1 0.2 0.15"/>
      <body name="upper" pos="0.1 0.2 -0.1" quat="0.7 0.7 0 0">
        <joint name="shoulder" type="ball" pos="0.02 0 0.01"/>
        <inertial pos="0 0.1 -0.05" mass="1" diaginertia="0.01 0.02 0.03"/>
        <body name="lower" pos="0 0 -0.3">
          <joint name="elbow" type="hinge" axis="0.3 0.4 0.866" ref="0.2" pos="0 0.01 0.02"/>
          <inertial pos="0.03 0.01 -0.12" mass="0.5" diaginertia="0.005 0.004 0.003"/>
          <body name="hand" pos="0 0 -0.25">
            <inertial pos="0.01 0 -0.03" mass="0.2" diaginertia="0.001 0.001 0.001"/>
          </body>
        </body>
      </body>
      <body name="hip" pos="-0.1 0 -0.2" quat="0.8 0 0.6 0">
        <joint name="hip_x" type="hinge" axis="0 0.6 0.8" pos="0 0.02 0"/>
        <joint name="hip_y" type="hinge" axis="0 -0.8 0.6" pos="0 0.02 0"/>
        <joint name="hip_z" type="hinge" axis="1 0 0" pos="0 0.02 0" ref="-0.1"/>
        <inertial pos="0 -0.04 -0.1" mass="1.2" diaginertia="0.02 0.01 0.015"/>
        <body name="shin" pos="0 0 -0.4">
          <joint name="knee_slide" type="slide" axis="0 0 1"/>
          <inertial pos="0.02 0 -0.15" mass="0.6" diaginertia="0.01 0.01 0.004"/>
          <body name="foot" pos="0 0 -0.35">
            <joint name="ankle" type="ball"/>
            <inertial pos="0.05 0.01 -0.02" mass="0.3" diaginertia="0.002 0.003 0.002"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

ovphysx = pytest.importorskip("ovphysx", reason="ovphysx is not installed (pip install -e '.[physx]')")
ovstage = pytest.importorskip("ovstage", reason="ovstage (installed with ovphysx) is missing")


def _schema_paths():
    from importlib import metadata
    from pathlib import Path

    try:
        dist = metadata.distribution("physx-usd-schemas")
    except metadata.PackageNotFoundError:
        pytest.skip("physx-usd-schemas is not installed (pip install -e '.[physx]')")
    return [
        Path(dist.locate_file(f"physx_usd_schemas/{m}/resources"))
        for m in ("PhysxSchema", "OmniUsdPhysicsDeformableSchema")
    ]


_REGISTERED = []


# -- USD authoring of an ArticulationDesc (test helper) ------------------------------------------------------


def _f(v) -> str:
    return "(" + ", ".join(f"{float(x):.9g}" for x in np.asarray(v).reshape(-1)) + ")"


def _frame_with_x(axis):
    """WXYZ rotation whose x axis is ``axis``."""
    x = np.asarray(axis, dtype=np.float64)
    x = x / np.linalg.norm(x)
    helper = np.array([0.0, 0.0, 1.0]) if abs(x[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
    y = np.cross(helper, x)
    y /= np.linalg.norm(y)
    return R.quat_from_matrix(np.stack([x, y, np.cross(x, y)], axis=1))


def write_usda(desc, layout, adapter, path):
    """The articulation as PhysX sees it: links at their modelled world pose, one joint per link with the
    joint frames documented in kangengine.adapters.physx, masses/COMs/inertias from the desc, no gravity."""
    pos, rot = forward_kinematics(layout, layout.neutral())
    floating = layout.free_root
    lines = [
        "#usda 1.0",
        "(",
        '    defaultPrim = "World"',
        "    metersPerUnit = 1",
        '    upAxis = "Z"',
        ")",
        'def PhysicsScene "physicsScene"',
        "{",
        "    vector3f physics:gravityDirection = (0, 0, -1)",
        "    float physics:gravityMagnitude = 0",
        "}",
        'def Xform "World"',
        "{",
        '    def Xform "robot"' + ("" if floating else ' (prepend apiSchemas = ["PhysicsArticulationRootAPI"])'),
        "    {",
    ]
    for i, body in enumerate(desc.bodies):
        api = ['"PhysicsRigidBodyAPI"', '"PhysicsMassAPI"'] + (
            ['"PhysicsArticulationRootAPI"'] if floating and i == 0 else []
        )
        evals, evecs = np.linalg.eigh(body.inertia)
        if np.linalg.det(evecs) < 0:
            evecs[:, 2] *= -1
        principal = R.quat_from_matrix(evecs)
        lines += [
            f'        def Xform "{body.name}" (prepend apiSchemas = [{", ".join(api)}])',
            "        {",
            f"            float physics:mass = {max(body.mass, 1e-3):.9g}",
            f"            point3f physics:centerOfMass = {_f(body.com)}",
            f"            float3 physics:diagonalInertia = {_f(np.maximum(evals, 1e-6))}",
            f"            quatf physics:principalAxes = {_f(principal)}",
            f"            double3 xformOp:translate = {_f(pos[i])}",
            f"            quatd xformOp:orient = {_f(rot[i])}",
            '            uniform token[] xformOpOrder = ["xformOp:translate", "xformOp:orient"]',
            "        }",
        ]
    if not floating:
        lines += [
            '        def PhysicsFixedJoint "world_fixed"',
            "        {",
            f"            rel physics:body1 = </World/robot/{desc.bodies[0].name}>",
            f"            point3f physics:localPos0 = {_f(pos[0])}",
            f"            quatf physics:localRot0 = {_f(rot[0])}",
            "            point3f physics:localPos1 = (0, 0, 0)",
            "            quatf physics:localRot1 = (1, 0, 0, 0)",
            "        }",
        ]
    lines += ['        def Scope "joints"', "        {"]
    for g in adapter._groups:
        b = g.body_index
        parent = desc.bodies[b].parent
        blocks = [layout.blocks[i] for i in g.blocks]
        anchor = np.asarray(blocks[0].anchor)
        if g.kind in ("hinge", "slide"):
            kind = "PhysicsRevoluteJoint" if g.kind == "hinge" else "PhysicsPrismaticJoint"
            child_rot = _frame_with_x(blocks[0].axis)
            name, extra = blocks[0].joint_name, ['            uniform token physics:axis = "X"']
        elif g.kind == "ball":
            kind, child_rot, name, extra = "PhysicsSphericalJoint", np.array([1.0, 0, 0, 0]), blocks[0].joint_name, []
        else:  # three hinges: a D6 with the rotations free, translations locked
            kind, name = "PhysicsJoint", g.names[0]
            child_rot = R.quat_from_matrix(np.array([bl.axis for bl in blocks]).T)
            extra = [
                e
                for ax in ("transX", "transY", "transZ")
                for e in (
                    f"            float limit:{ax}:physics:low = 1",
                    f"            float limit:{ax}:physics:high = -1",
                )
            ]
        rest_r = layout.rest_rotations_wxyz[b]
        parent_pos = layout.rest_positions[b] + R.quat_rotate(rest_r, anchor)
        parent_rot = R.quat_multiply(rest_r, child_rot)
        api = (
            (' (prepend apiSchemas = ["PhysicsLimitAPI:transX", "PhysicsLimitAPI:transY", "PhysicsLimitAPI:transZ"])')
            if g.kind == "hinge3"
            else ""
        )
        lines += [
            f'        def {kind} "{name}"{api}',
            "        {",
            f"            rel physics:body0 = </World/robot/{desc.bodies[parent].name}>",
            f"            rel physics:body1 = </World/robot/{desc.bodies[b].name}>",
            f"            point3f physics:localPos0 = {_f(parent_pos)}",
            f"            quatf physics:localRot0 = {_f(parent_rot)}",
            f"            point3f physics:localPos1 = {_f(anchor)}",
            f"            quatf physics:localRot1 = {_f(child_rot)}",
            *extra,
            "        }",
        ]
    moved = {g.body_index for g in adapter._groups}
    for b in range(1, len(desc.bodies)):
        if b not in moved:  # a body welded to its parent
            lines += [
                f'            def PhysicsFixedJoint "{desc.bodies[b].name}_weld"',
                "            {",
                f"                rel physics:body0 = </World/robot/{desc.bodies[desc.bodies[b].parent].name}>",
                f"                rel physics:body1 = </World/robot/{desc.bodies[b].name}>",
                f"                point3f physics:localPos0 = {_f(layout.rest_positions[b])}",
                f"                quatf physics:localRot0 = {_f(layout.rest_rotations_wxyz[b])}",
                "                point3f physics:localPos1 = (0, 0, 0)",
                "                quatf physics:localRot1 = (1, 0, 0, 0)",
                "            }",
            ]
    lines += ["        }", "    }", "}", ""]
    path.write_text("\n".join(lines))
    return path


class PhysXScene:
    """One PhysX instance (CPU) with the articulation of a USD file and its tensor views."""

    def __init__(self, usd_path, root_link):
        from ovphysx import PhysX
        from ovphysx.types import TensorType

        if not _REGISTERED:
            ovstage.population.register_usd_schemas([str(p) for p in _schema_paths()])
            _REGISTERED.append(True)
        PhysX.set_cpu_mode(True)
        self.physx = PhysX()
        self.stage = ovstage.Stage(f"kangengine-{id(self)}")
        ovstage.population.open_usd(self.stage, str(usd_path), ordinal=1, domains=ovstage.PopulationDomain.ALL)
        self.stage.advance_write_floor(ordinal=1).wait()
        self.physx.wait_task(self.physx.attach_ovstage(self.stage, read_ordinal=1))
        self.physx.warmup()
        self.T = TensorType
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.views = {
                t: self.physx.create_tensor_binding(
                    pattern=f"/World/robot/{root_link}", tensor_type=getattr(TensorType, t)
                )
                for t in (
                    "ARTICULATION_ROOT_POSE",
                    "ARTICULATION_ROOT_VELOCITY",
                    "ARTICULATION_DOF_POSITION",
                    "ARTICULATION_DOF_VELOCITY",
                    "ARTICULATION_LINK_POSE",
                    "ARTICULATION_LINK_VELOCITY",
                )
            }
        self.articulation = self.views["ARTICULATION_DOF_POSITION"]

    def set_state_and_read_links(self, buf, frame):
        v = self.views
        if not self.articulation.is_fixed_base:
            v["ARTICULATION_ROOT_POSE"].write(buf.root_pose()[frame : frame + 1].astype(np.float32))
            v["ARTICULATION_ROOT_VELOCITY"].write(buf.root_velocity()[frame : frame + 1].astype(np.float32))
        v["ARTICULATION_DOF_POSITION"].write(buf.joint_positions[frame : frame + 1].astype(np.float32))
        v["ARTICULATION_DOF_VELOCITY"].write(buf.joint_velocities[frame : frame + 1].astype(np.float32))
        self.physx.update_articulations_kinematic()
        pose = np.zeros(v["ARTICULATION_LINK_POSE"].shape, np.float32)
        vel = np.zeros(v["ARTICULATION_LINK_VELOCITY"].shape, np.float32)
        v["ARTICULATION_LINK_POSE"].read(pose)
        v["ARTICULATION_LINK_VELOCITY"].read(vel)
        return pose[0].astype(np.float64), vel[0].astype(np.float64)

    def read_state(self):
        out = {}
        for t in (
            "ARTICULATION_ROOT_POSE",
            "ARTICULATION_ROOT_VELOCITY",
            "ARTICULATION_DOF_POSITION",
            "ARTICULATION_DOF_VELOCITY",
        ):
            a = np.zeros(self.views[t].shape, np.float32)
            self.views[t].read(a)
            out[t] = a[0].astype(np.float64)
        return out

    def close(self):
        for b in self.views.values():
            b.destroy()
        self.physx.wait_task(self.physx.detach_ovstage())
        self.stage.destroy()
        self.physx.destroy()


def _load(path, order="DFS"):
    desc = ke.asset.MJCFLoader.load(path, order=order)
    floating = desc.joints[0].type is JointType.FREE if desc.joints else False
    return desc, ArticulationCoordinateLayout.from_data(data=desc, free_root=floating)


@pytest.fixture(scope="module")
def physx_mjcf(tmp_path_factory):
    p = tmp_path_factory.mktemp("mjcf") / "physx_test.xml"
    p.write_text(PHYSX_MJCF)
    return p


def _check_against_physx(path, tmp_path, frames=4, seed=0, order="DFS", speed=1.0):
    desc, layout = _load(path, order)
    default = PhysXMotionAdapter(layout)
    usd = write_usda(desc, layout, default, tmp_path / "robot.usda")
    scene = PhysXScene(usd, desc.bodies[0].name)
    try:
        art = scene.articulation
        adapter = PhysXMotionAdapter(layout, articulation=art)  # DOF order read from the live articulation
        match = adapter.validate_articulation(art)
        assert list(match.dof_names) == list(art.dof_names)
        rng = np.random.default_rng(seed)
        q, qd = random_state(layout, frames, rng)
        qd *= speed
        buf = adapter.pack_arrays(q, qd)
        link_ids = [list(art.body_names).index(n) for n in layout.body_names]
        pos, quat = forward_kinematics(layout, q)
        _, v_com, w = fd_body_velocities(layout, q, qd, layout.body_coms)
        for f in range(frames):
            pose, vel = scene.set_state_and_read_links(buf, f)
            pose, vel = pose[link_ids], vel[link_ids]
            np.testing.assert_allclose(pose[:, :3], pos[f], atol=5e-5)
            np.testing.assert_allclose(np.abs(np.sum(pose[:, [6, 3, 4, 5]] * quat[f], axis=-1)), 1, atol=1e-5)
            np.testing.assert_allclose(vel[:, 3:], w[f], atol=2e-4)  # angular, world
            np.testing.assert_allclose(vel[:, :3], v_com[f], atol=2e-4)  # COM linear, world
        # PhysX's own state reads back into the same canonical motion
        st = scene.read_state()
        rp, rv = st["ARTICULATION_ROOT_POSE"], st["ARTICULATION_ROOT_VELOCITY"]
        q2, qd2 = adapter.unpack_arrays(
            rp[:3], rp[3:], rv[:3], rv[3:], st["ARTICULATION_DOF_POSITION"], st["ARTICULATION_DOF_VELOCITY"]
        )
        if not layout.free_root:
            q2[:, :0] = 0
        np.testing.assert_allclose(forward_kinematics(layout, q2)[0][0], pos[-1], atol=5e-5)
        np.testing.assert_allclose(qd2[0], qd[-1], atol=5e-4)
        return layout, adapter, tuple(art.dof_names)
    finally:
        scene.close()


def test_floating_base_spherical_d6_revolute_prismatic(physx_mjcf, tmp_path):
    layout, adapter, dof_names = _check_against_physx(physx_mjcf, tmp_path, frames=5, seed=1)
    assert adapter.dof_names == dof_names
    assert "shoulder:0" in dof_names and "hip:2" in dof_names


def test_bfs_layout(physx_mjcf, tmp_path):
    _check_against_physx(physx_mjcf, tmp_path, frames=2, seed=2, order="BFS")


def test_smpl_humanoid(tmp_path):
    _check_against_physx(data_file("mjcf/protomotions/smpl_humanoid.xml"), tmp_path, frames=2, seed=3, speed=0.5)


def test_g1(tmp_path):
    _check_against_physx(data_file("mjcf/unitree/g1_29dof.nomesh.xml"), tmp_path, frames=2, seed=4, speed=0.5)


def test_fixed_base_ball_joints(tmp_path):
    _check_against_physx(data_file("mjcf/dm_control/model_with_ball_joints.xml"), tmp_path, frames=3, seed=5)


def test_conventions_written_out(physx_mjcf):
    """Root: XYZW and COM velocity; ball: rotation vector + child-frame angular velocity; hinge: q - ref."""
    _, layout = _load(physx_mjcf)
    adapter = PhysXMotionAdapter(layout)
    q, qd = random_state(layout, 3, np.random.default_rng(6))
    buf = adapter.pack_arrays(q, qd)
    np.testing.assert_allclose(buf.root_rotations_xyzw, q[:, [4, 5, 6, 3]], atol=1e-15)
    com = R.quat_rotate(q[:, 3:7], layout.body_coms[0])
    np.testing.assert_allclose(buf.root_linear_velocities, qd[:, :3] + np.cross(qd[:, 3:6], com), atol=1e-12)
    sh = layout.block("shoulder")
    k = adapter.dof_names.index("shoulder:0")
    ball = q[:, sh.q_offset : sh.q_offset + 4]
    np.testing.assert_allclose(buf.joint_positions[:, k : k + 3], R.quat_to_rotvec(ball), atol=1e-12)
    np.testing.assert_allclose(
        buf.joint_velocities[:, k : k + 3],
        R.quat_rotate_inverse(ball, qd[:, sh.qd_offset : sh.qd_offset + 3]),
        atol=1e-12,
    )
    el = layout.block("elbow")
    k = adapter.dof_names.index("elbow")
    np.testing.assert_allclose(buf.joint_positions[:, k], q[:, el.q_offset] - 0.2, atol=1e-12)


def test_round_trip_and_pack_sample(physx_mjcf):
    torch = pytest.importorskip("torch")
    _, layout = _load(physx_mjcf)
    adapter = PhysXMotionAdapter(layout)
    assert isinstance(adapter, MotionAdapter)
    q, qd = random_state(layout, 3, np.random.default_rng(8))
    q[:, layout.block("hip_y").q_offset] = np.clip(q[:, layout.block("hip_y").q_offset], -1.3, 1.3)
    motion = ArticulationMotion(q, qd, 30.0, layout.model_signature)
    buf = adapter.pack(motion)
    back = adapter.unpack(
        *(
            getattr(buf, k)
            for k in (
                "root_positions",
                "root_rotations_xyzw",
                "root_linear_velocities",
                "root_angular_velocities",
                "joint_positions",
                "joint_velocities",
            )
        ),
        fps=30.0,
    )
    # quaternions come back in the w >= 0 hemisphere: compare on the manifold
    np.testing.assert_allclose(layout.difference(back.q.astype(np.float64), motion.q.astype(np.float64)), 0, atol=5e-5)
    np.testing.assert_allclose(back.qd, motion.qd, atol=2e-4)
    frames = adapter.prepare_motion(motion)
    f0 = {k: torch.as_tensor(v[:2]) for k, v in frames.items()}
    f1 = {k: torch.as_tensor(v[1:]) for k, v in frames.items()}
    out = adapter.pack_sample(f0, f1, torch.tensor([0.0, 0.5]), root_offset=torch.ones(2, 3))
    np.testing.assert_allclose(out.root_positions[0].numpy(), frames["root_positions"][0] + 1, atol=1e-6)
    np.testing.assert_allclose(out.joint_positions[0].numpy(), frames["joint_positions"][0], atol=1e-5)
    # the middle sample's ball equals the slerp midpoint of the canonical quaternions
    sh = layout.block("shoulder")
    mid = R.quat_slerp(q[1, sh.q_offset : sh.q_offset + 4], q[2, sh.q_offset : sh.q_offset + 4], 0.5)
    k = adapter.dof_names.index("shoulder:0")
    got = R.quat_from_rotvec(out.joint_positions[1, k : k + 3].double().numpy())
    assert abs(abs(float(got @ mid)) - 1) < 1e-6


def test_validate_articulation_lists_every_mismatch(physx_mjcf):
    _, layout = _load(physx_mjcf)
    adapter = PhysXMotionAdapter(layout)

    class View:
        dof_names = ["shoulder:0", "shoulder:1", "hip:0", "hip:1", "hip:2", "knee_slide", "elbow", "wrist"]
        body_names = ["torso", "upper", "hip", "lower", "shin", "foot", "glove"]
        is_fixed_base = True

    with pytest.raises(LayoutMismatch) as info:
        adapter.validate_articulation(View())
    msg = str(info.value)
    assert "articulation has 8 DOFs; the layout gives PhysX 11" in msg
    assert "body 'upper': 2 DOFs in the articulation (shoulder:0, shoulder:1); expected 3" in msg
    assert "ball joint of body 'foot' (ankle): no DOF named 'ankle:0'" in msg
    assert "articulation DOFs that the layout lacks: 'wrist'" in msg
    assert "links missing from the articulation: 'hand'" in msg
    assert "articulation links that the layout lacks: 'glove'" in msg
    assert "fixed-base" in msg
    # a view in another order is followed when given to the constructor
    names = list(adapter.dof_names)
    reordered = names[3:] + names[:3]
    other = PhysXMotionAdapter(layout, dof_names=reordered)
    assert other.dof_names == tuple(reordered)


def test_unsupported_joint_sets_are_named():
    _, layout = _load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    with pytest.raises(UnsupportedJointError, match="lfootrz"):
        PhysXMotionAdapter(layout)


def test_missing_ovphysx_names_the_extra(monkeypatch):
    from kangengine._deps import require

    monkeypatch.setitem(sys.modules, "ovphysx", None)
    with pytest.raises(MissingDependencyError, match=r"\.\[physx\]"):
        require("ovphysx", "physx")

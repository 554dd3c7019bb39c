"""PhysX adapter checked against PhysX itself (``ovphysx`` in CPU mode): the articulation is authored in USD
from MuJoCo's compiled model (link poses at qpos0, joint axes and anchors, masses), the packed root and DOF
state is written through PhysX's articulation views, and the link poses and velocities PhysX computes equal
MuJoCo's, our forward kinematics and finite differences of it. Covers a floating base, spherical joints,
three-hinge D6 joints (right- and left-handed), revolute joints with a ref and an anchor, a prismatic joint,
COM offsets, a fixed base, PhysX's own link order, and why hinge pairs are refused."""

from __future__ import annotations

import sys
import warnings

import mujoco
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


# -- USD authoring from MuJoCo's model (test helper) ---------------------------------------------------------


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


def _mj_body_name(model, i):
    return model.body(i).name or f"body{i}"


def mujoco_links(model):
    """Each MuJoCo body (world excluded) as a PhysX link, read from MuJoCo alone: its world pose at qpos0
    (``mj_kinematics``), its parent, and its inbound PhysX joint as documented in kangengine.adapters.physx
    (kind, child-side joint frame, anchor) with the prim name the adapter's default order assumes: the
    joint name for one hinge/slide/ball, the body name for a three-hinge D6 and for a weld. Two hinges
    become a D6 with the third rotation locked (only the refusal test uses that)."""
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    links = []
    for b in range(1, model.nbody):
        jids = [j for j in range(model.njnt) if model.jnt_bodyid[j] == b]
        types = [int(model.jnt_type[j]) for j in jids]
        axes = [np.array(model.jnt_axis[j], dtype=np.float64) for j in jids]
        name = _mj_body_name(model, b)
        anchor = np.array(model.jnt_pos[jids[0]]) if jids else np.zeros(3)
        if not jids:
            kind, rot, prim = "fixed", np.array([1.0, 0, 0, 0]), name
        elif types == [mujoco.mjtJoint.mjJNT_FREE]:
            kind, rot, prim = "free", np.array([1.0, 0, 0, 0]), model.joint(jids[0]).name
        elif types == [mujoco.mjtJoint.mjJNT_BALL]:
            kind, rot, prim = "ball", np.array([1.0, 0, 0, 0]), model.joint(jids[0]).name
        elif types == [mujoco.mjtJoint.mjJNT_HINGE]:
            kind, rot, prim = "hinge", _frame_with_x(axes[0]), model.joint(jids[0]).name
        elif types == [mujoco.mjtJoint.mjJNT_SLIDE]:
            kind, rot, prim = "slide", _frame_with_x(axes[0]), model.joint(jids[0]).name
        elif all(t == mujoco.mjtJoint.mjJNT_HINGE for t in types) and len(jids) in (2, 3):
            kind, prim = f"hinge{len(jids)}", name
            rot = R.quat_from_matrix(np.stack([axes[0], axes[1], np.cross(axes[0], axes[1])], axis=1))
        else:
            raise AssertionError(f"no PhysX joint for body {name}: {types}")
        links.append(
            {
                "name": name,
                "parent": _mj_body_name(model, model.body_parentid[b]) if model.body_parentid[b] > 0 else None,
                "pos": np.array(data.xpos[b]),
                "quat": np.array(data.xquat[b]),
                "kind": kind,
                "child_rot": rot,
                "anchor": anchor,
                "prim": prim,
                "mass": float(model.body_mass[b]),
                "com": np.array(model.body_ipos[b]),
                "inertia": np.array(model.body_inertia[b]),
                "principal": np.array(model.body_iquat[b]),
            }
        )
    return links


def write_usda(links, path, *, prim_path=None, reverse=False):
    """The articulation as PhysX sees it: links at their world pose, one joint per link, masses/COMs/inertias
    from MuJoCo, no gravity. ``prim_path(link) -> "scope/name"`` chooses each joint prim's path under the
    robot (default ``joints/<prim>``); ``reverse`` authors links and joints in reverse order."""
    by_name = {ln["name"]: ln for ln in links}
    floating = links[0]["kind"] == "free"
    prim_path = prim_path or (lambda ln: f"joints/{ln['prim']}")
    out = [
        "#usda 1.0",
        '(\n    defaultPrim = "World"\n    metersPerUnit = 1\n    upAxis = "Z"\n)',
        'def PhysicsScene "physicsScene"\n{\n    vector3f physics:gravityDirection = (0, 0, -1)',
        "    float physics:gravityMagnitude = 0\n}",
        'def Xform "World"\n{',
        '    def Xform "robot"' + ("" if floating else ' (prepend apiSchemas = ["PhysicsArticulationRootAPI"])'),
        "    {",
    ]
    bodies, scopes = [], {}
    for i, ln in enumerate(links):
        api = ['"PhysicsRigidBodyAPI"', '"PhysicsMassAPI"'] + (
            ['"PhysicsArticulationRootAPI"'] if floating and i == 0 else []
        )
        bodies.append(
            f'        def Xform "{ln["name"]}" (prepend apiSchemas = [{", ".join(api)}])\n        {{\n'
            f"            float physics:mass = {max(ln['mass'], 1e-3):.9g}\n"
            f"            point3f physics:centerOfMass = {_f(ln['com'])}\n"
            f"            float3 physics:diagonalInertia = {_f(np.maximum(ln['inertia'], 1e-6))}\n"
            f"            quatf physics:principalAxes = {_f(ln['principal'])}\n"
            f"            double3 xformOp:translate = {_f(ln['pos'])}\n"
            f"            quatd xformOp:orient = {_f(ln['quat'])}\n"
            '            uniform token[] xformOpOrder = ["xformOp:translate", "xformOp:orient"]\n        }'
        )
        if ln["kind"] == "free":
            continue
        if ln["parent"] is None:  # fixed base: the root welded to the world
            parent_pos, parent_rot, body0 = ln["pos"], ln["quat"], ""
        else:
            par = by_name[ln["parent"]]
            parent_from_child = R.quat_multiply(R.quat_conjugate(par["quat"]), ln["quat"])
            offset = R.quat_rotate(R.quat_conjugate(par["quat"]), ln["pos"] - par["pos"])
            parent_pos = offset + R.quat_rotate(parent_from_child, ln["anchor"])
            parent_rot = R.quat_multiply(parent_from_child, ln["child_rot"])
            body0 = f"            rel physics:body0 = </World/robot/{ln['parent']}>\n"
        kind = {
            "fixed": "PhysicsFixedJoint",
            "hinge": "PhysicsRevoluteJoint",
            "slide": "PhysicsPrismaticJoint",
            "ball": "PhysicsSphericalJoint",
        }.get(ln["kind"], "PhysicsJoint")
        locked = {"hinge3": ["transX", "transY", "transZ"], "hinge2": ["transX", "transY", "transZ", "rotZ"]}.get(
            ln["kind"], []
        )
        schemas = ", ".join(f'"PhysicsLimitAPI:{a}"' for a in locked)
        api = f" (prepend apiSchemas = [{schemas}])" if locked else ""
        extra = "".join(
            f"            float limit:{a}:physics:low = 1\n            float limit:{a}:physics:high = -1\n"
            for a in locked
        )
        if ln["kind"] in ("hinge", "slide"):
            extra += '            uniform token physics:axis = "X"\n'
        scope, _, prim = (prim_path(ln) if ln["parent"] is not None else "joints/world_fixed").rpartition("/")
        scopes.setdefault(scope, []).append(
            f'            def {kind} "{prim}"{api}\n            {{\n{body0}'
            f"            rel physics:body1 = </World/robot/{ln['name']}>\n"
            f"            point3f physics:localPos0 = {_f(parent_pos)}\n"
            f"            quatf physics:localRot0 = {_f(parent_rot)}\n"
            f"            point3f physics:localPos1 = {_f(ln['anchor'])}\n"
            f"            quatf physics:localRot1 = {_f(ln['child_rot'])}\n{extra}            }}"
        )
    step = -1 if reverse else 1
    out += bodies[::step]
    for scope, joints in list(scopes.items())[::step]:
        out += [f'        def Scope "{scope}"', "        {", *joints[::step], "        }"]
    out += ["    }", "}", ""]
    path.write_text("\n".join(out))
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


def physx_scene(path, tmp_path, **usd_options):
    """A PhysX scene with the articulation of the MJCF file ``path``, authored from MuJoCo's model."""
    links = mujoco_links(mujoco.MjModel.from_xml_path(str(path)))
    usd = write_usda(links, tmp_path / "robot.usda", **usd_options)
    return PhysXScene(usd, links[0]["name"])


def _check_against_physx(path, tmp_path, frames=4, seed=0, order="DFS", speed=1.0):
    desc, layout = _load(path, order)
    scene = physx_scene(path, tmp_path)
    try:
        art = scene.articulation
        adapter = PhysXMotionAdapter(layout)  # the default DOF order is PhysX's own
        match = adapter.validate_articulation(art)
        assert list(match.dof_names) == list(art.dof_names) == list(adapter.dof_names)
        assert PhysXMotionAdapter(layout, articulation=art).dof_names == adapter.dof_names
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


# A welded body with a moving child, beside a hinge whose name sorts first: PhysX takes the weld (a fixed
# joint) first, so the weld's child's DOF comes before the hinge's child's, against name order.
WELD_MJCF = """
<mujoco model="weld_order">
  <worldbody>
    <body name="base" pos="0 0 1">
      <freejoint name="root"/>
      <inertial pos="0 0 0" mass="2" diaginertia="0.1 0.1 0.1"/>
      <body name="arm" pos="0.2 0 0">
        <joint name="a_shoulder" axis="0 1 0"/>
        <inertial pos="0.1 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
        <body name="forearm" pos="0.2 0 0">
          <joint name="b_elbow" axis="0 0 1"/>
          <inertial pos="0.1 0 0" mass="0.5" diaginertia="0.01 0.01 0.01"/>
        </body>
      </body>
      <body name="z_mount" pos="0 0.2 0">
        <inertial pos="0 0.05 0" mass="0.3" diaginertia="0.01 0.01 0.01"/>
        <body name="sensor" pos="0 0.1 0">
          <joint name="c_pan" axis="1 0 0"/>
          <inertial pos="0 0.05 0" mass="0.2" diaginertia="0.01 0.01 0.01"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_welded_link_comes_first_among_siblings(tmp_path):
    path = tmp_path / "weld.xml"
    path.write_text(WELD_MJCF)
    _, adapter, dof_names = _check_against_physx(path, tmp_path, frames=2, seed=9)
    assert dof_names == ("a_shoulder", "c_pan", "b_elbow")


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rel", ["smpl", "cmu"])
def test_hinge_triplets_against_scipy(rel, dtype, cmu_without_pairs):
    """Three-hinge D6 DOFs: the rotation vector of Rx(a0) Ry(a1) Rz(a2) (scipy "XYZ", a2 negated for a
    left-handed triplet), and the child-frame angular velocity by finite differences of scipy's rotation."""
    from scipy.spatial.transform import Rotation

    path = data_file("mjcf/protomotions/smpl_humanoid.xml") if rel == "smpl" else cmu_without_pairs
    _, layout = _load(path)
    adapter = PhysXMotionAdapter(layout)
    q, qd = random_state(layout, 5, np.random.default_rng(12))
    buf = adapter.pack_arrays(q.astype(dtype), qd.astype(dtype))
    assert buf.joint_positions.dtype == dtype
    h = 1e-6
    tol = 2e-5 if dtype == np.float32 else 1e-8
    checked = 0
    for g in adapter._groups:
        if g.kind != "hinge3":
            continue
        blocks = [layout.blocks[i] for i in g.blocks]
        axes = np.array([b.axis for b in blocks])
        sign = np.array([1.0, 1.0, np.sign(np.linalg.det(axes))])
        ang = (q[:, [b.q_offset for b in blocks]] - [b.ref for b in blocks]) * sign
        rate = qd[:, [b.qd_offset for b in blocks]] * sign
        k = adapter.dof_names.index(f"{g.names[0]}:0")
        rot = Rotation.from_euler("XYZ", ang)
        np.testing.assert_allclose(buf.joint_positions[:, k : k + 3], rot.as_rotvec(), atol=tol)
        step = Rotation.from_euler("XYZ", ang + h * rate) * Rotation.from_euler("XYZ", ang - h * rate).inv()
        w_parent = step.as_rotvec() / (2 * h)
        np.testing.assert_allclose(buf.joint_velocities[:, k : k + 3], rot.inv().apply(w_parent), atol=tol * 50)
        checked += 1
    assert checked >= 9


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


def test_missing_ovphysx_names_the_extra(monkeypatch):
    from kangengine._deps import require

    monkeypatch.setitem(sys.modules, "ovphysx", None)
    with pytest.raises(MissingDependencyError, match=r"\.\[physx\]"):
        require("ovphysx", "physx")


# -- the reference page's PhysX snippet, run as written, against MuJoCo ---------------------------------------

#: "Backend buffers > PhysX" of the reference page (docs: kangengine_articulation_motion), verbatim
PAGE_SNIPPET = """from kangengine.adapters.physx import PhysXMotionAdapter

adapter = PhysXMotionAdapter(layout)
adapter.validate_articulation(articulation)  # optional compatibility check
buffers = adapter.pack(articulation_motion)
"""


def test_page_snippet_is_the_reference_text():
    from conftest import DATA

    page = DATA.parent / "reference" / "kangengine_articulation_motion.md"
    if not page.is_file():
        pytest.skip(f"{page} is not here")
    text = page.read_text()
    for line in PAGE_SNIPPET.strip().splitlines():
        assert line in text


def _link_poses(scene, buf, frame):
    pose, _ = scene.set_state_and_read_links(buf, frame)
    return pose


@pytest.mark.parametrize(
    "rel",
    ["mjcf/protomotions/amp_humanoid.xml", "mjcf/unitree/g1_29dof.nomesh.xml", "mjcf/protomotions/smpl_humanoid.xml"],
)
def test_reference_page_snippet_matches_mujoco(rel, tmp_path):
    """The page's snippet, as written, on a PhysX articulation of the model: the link poses PhysX computes
    from the packed buffers equal MuJoCo's (mj_kinematics on the same model and q) to 1e-5 m."""
    mjcf_path = data_file(rel)
    data = ke.asset.MJCFLoader.load(mjcf_path, order="DFS")  # the page's "Convert a motion"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=data, free_root=True)
    model = mujoco.MjModel.from_xml_path(str(mjcf_path))
    assert model.nq == layout.nq and model.nv == layout.nv
    q, qd = random_state(layout, 3, np.random.default_rng(11))
    articulation_motion = ArticulationMotion(q, qd * 0.5, 30.0, layout.model_signature)
    scene = physx_scene(mjcf_path, tmp_path)
    try:
        articulation = scene.articulation
        env = {"layout": layout, "articulation": articulation, "articulation_motion": articulation_motion}
        exec(PAGE_SNIPPET, env)
        buffers = env["buffers"]
        mj = mujoco.MjData(model)
        ids = [list(articulation.body_names).index(_mj_body_name(model, b)) for b in range(1, model.nbody)]
        for f in range(articulation_motion.num_frames):
            mj.qpos[:] = articulation_motion.q[f]
            mujoco.mj_kinematics(model, mj)
            pose = _link_poses(scene, buffers, f)[ids]
            np.testing.assert_allclose(pose[:, :3], mj.xpos[1:], atol=1e-5, rtol=0)
            cos_half = np.abs(np.sum(pose[:, [6, 3, 4, 5]] * mj.xquat[1:], axis=-1))
            np.testing.assert_allclose(cos_half, 1, atol=1e-6)
    finally:
        scene.close()


# -- PhysX's link order, observed --------------------------------------------------------------------------


def _expected_physx_order(links, prim_path):
    """Breadth-first from the root; children by joint type (fixed, revolute, prismatic, spherical, D6), then by
    joint prim path: the rule the adapter's default order follows, written out independently."""
    rank = {"fixed": 0, "hinge": 1, "slide": 2, "ball": 3, "hinge3": 4, "hinge2": 4}
    out, queue = [], [links[0]["name"]]
    while queue:
        b = queue.pop(0)
        out.append(b)
        kids = [ln for ln in links if ln["parent"] == b]
        queue += [ln["name"] for ln in sorted(kids, key=lambda ln: (rank[ln["kind"]], prim_path(ln)))]
    return out


def _star_links():
    def link(name, kind, prim):
        ident = np.array([1.0, 0, 0, 0])
        return dict(
            name=name, parent=None if kind == "free" else "root", pos=np.zeros(3), quat=ident, kind=kind,
            child_rot=ident, anchor=np.zeros(3), prim=prim, mass=1.0, com=np.zeros(3), inertia=np.full(3, 0.1),
            principal=ident,
        )  # fmt: skip

    kinds = ["hinge", "slide", "ball", "hinge3", "fixed"] * 2
    prims = [f"{c}_joint" for c in "jfbhdaigce"]  # names against the type order
    return [link("root", "free", "root")] + [link(f"link{i}", k, p) for i, (k, p) in enumerate(zip(kinds, prims))]


@pytest.mark.parametrize("variant", ["star", "amp", "amp_reversed", "amp_renamed", "amp_scoped"])
def test_physx_link_order_rule(variant, tmp_path):
    """PhysX numbers links breadth-first, children by joint type then joint prim path; authoring order, link
    names and link prim order play no part."""
    default = lambda ln: f"joints/{ln['prim']}"  # noqa: E731
    prim_path, reverse = default, False
    if variant == "star":
        links = _star_links()
    else:
        links = mujoco_links(mujoco.MjModel.from_xml_path(str(data_file("mjcf/protomotions/amp_humanoid.xml"))))
    if variant == "amp_reversed":
        reverse = True
    elif variant == "amp_renamed":  # prefixes that sort the other way round
        order = sorted(ln["prim"] for ln in links)
        prim_path = lambda ln: f"joints/J{len(order) - order.index(ln['prim']):02d}_{ln['prim']}"  # noqa: E731
    elif variant == "amp_scoped":  # scopes outrank names
        prim_path = lambda ln: f"{'zz' if 'left' in ln['prim'] else 'aa'}/{ln['prim']}"  # noqa: E731
    scene = PhysXScene(write_usda(links, tmp_path / "robot.usda", prim_path=prim_path, reverse=reverse), "root"
                       if variant == "star" else links[0]["name"])  # fmt: skip
    try:
        assert list(scene.articulation.body_names) == _expected_physx_order(links, prim_path)
    finally:
        scene.close()


def test_validate_reports_a_real_order_mismatch_and_articulation_follows_it(tmp_path):
    """Joints of the left side in another scope: PhysX orders them after the right side. The default adapter
    says so (naming the columns); the adapter built with the articulation packs its order and matches it."""
    path = data_file("mjcf/protomotions/amp_humanoid.xml")
    desc, layout = _load(path)
    scene = physx_scene(path, tmp_path, prim_path=lambda ln: f"{'zz' if 'left' in ln['prim'] else 'aa'}/{ln['prim']}")
    try:
        art = scene.articulation
        with pytest.raises(LayoutMismatch, match="are articulation columns"):
            PhysXMotionAdapter(layout).validate_articulation(art)
        adapter = PhysXMotionAdapter(layout, articulation=art)
        assert adapter.dof_names == tuple(art.dof_names)
        q, qd = random_state(layout, 1, np.random.default_rng(3))
        pose = _link_poses(scene, adapter.pack_arrays(q, qd), 0)
        pos, _ = forward_kinematics(layout, q)
        ids = [list(art.body_names).index(n) for n in layout.body_names]
        np.testing.assert_allclose(pose[ids, :3], pos[0], atol=1e-5)
    finally:
        scene.close()


# -- multi-hinge bodies: the CMU humanoid ------------------------------------------------------------------

CMU = "mjcf/dm_control/humanoid_CMU.xml"
CMU_PAIRS = ["lfoot", "rfoot", "lclavicle", "rclavicle", "lhand", "rhand", "lthumb", "rthumb"]


def test_cmu_hinge_pairs_refused_with_the_reason():
    _, layout = _load(data_file(CMU))
    with pytest.raises(UnsupportedJointError) as info:
        PhysXMotionAdapter(layout)
    msg = str(info.value)
    for body in CMU_PAIRS:
        assert f"'{body}' (hinges" in msg
    assert "exponential coordinates restricted to its free axes" in msg
    for body in ("lfemur", "lhumerus", "thorax", "head"):  # left-handed, skewed triplets map to a D6
        assert f"'{body}'" not in msg


@pytest.fixture(scope="module")
def cmu_without_pairs(tmp_path_factory):
    """The CMU humanoid with each hinge pair cut to its first hinge (everything else as shipped)."""
    spec = mujoco.MjSpec.from_file(str(data_file(CMU)))
    cut = set()
    for body in CMU_PAIRS:
        joints = [j for j in spec.joints if j.parent.name == body]
        cut.add(joints[1].name)
        spec.delete(joints[1])
    for actuator in [a for a in spec.actuators if a.target in cut]:
        spec.delete(actuator)
    path = tmp_path_factory.mktemp("cmu") / "humanoid_CMU_no_pairs.xml"
    path.write_text(spec.to_xml())
    return path


def test_cmu_triplets_in_physx(cmu_without_pairs, tmp_path):
    """The CMU humanoid's rz, ry, rx triplets (left-handed, on rotated body frames) as PhysX D6 joints:
    poses and velocities equal our kinematics, and PhysX's state unpacks to the same motion."""
    _, layout = _load(cmu_without_pairs)
    adapter = PhysXMotionAdapter(layout)
    assert {g.kind for g in adapter._groups} == {"hinge", "hinge3"}
    _check_against_physx(cmu_without_pairs, tmp_path, frames=2, seed=7, speed=0.5)


def test_cmu_hinge_pair_is_not_a_locked_physx_spherical(tmp_path):
    """Why hinge pairs are refused, checked in PhysX: lfoot as a D6 with rotZ locked moves by exp(p0 a0 + p1 a1),
    MuJoCo's two hinges by R(a0, p0) R(a1, p1); the two differ by far more than float noise."""
    path = data_file(CMU)
    model = mujoco.MjModel.from_xml_path(str(path))
    links = mujoco_links(model)
    scene = PhysXScene(write_usda(links, tmp_path / "cmu.usda"), links[0]["name"])
    try:
        art = scene.articulation
        names = list(art.dof_names)
        jp = np.zeros((1, len(names)), np.float32)
        jp[0, names.index("lfoot:0")], jp[0, names.index("lfoot:1")] = 0.6, -0.5
        v = scene.views
        v["ARTICULATION_ROOT_POSE"].write(np.array([[*model.qpos0[:3], *model.qpos0[[4, 5, 6, 3]]]], np.float32))
        v["ARTICULATION_ROOT_VELOCITY"].write(np.zeros((1, 6), np.float32))
        v["ARTICULATION_DOF_POSITION"].write(jp)
        v["ARTICULATION_DOF_VELOCITY"].write(np.zeros_like(jp))
        scene.physx.update_articulations_kinematic()
        pose = np.zeros(v["ARTICULATION_LINK_POSE"].shape, np.float32)
        v["ARTICULATION_LINK_POSE"].read(pose)
        got = pose[0, list(art.body_names).index("lfoot"), [6, 3, 4, 5]].astype(np.float64)
        mj = mujoco.MjData(model)
        mj.qpos[:] = model.qpos0
        mj.qpos[model.joint("lfootrz").qposadr[0]], mj.qpos[model.joint("lfootrx").qposadr[0]] = 0.6, -0.5
        mujoco.mj_kinematics(model, mj)
        b = model.body("lfoot").id
        mj_rot = np.array(mj.xquat[b])
        a0, a1 = model.jnt_axis[model.joint("lfootrz").id], model.jnt_axis[model.joint("lfootrx").id]
        mj.qpos[:] = model.qpos0
        mujoco.mj_kinematics(model, mj)
        exp_rot = R.quat_multiply(mj.xquat[b], R.quat_from_rotvec(0.6 * a0 - 0.5 * a1))
        angle = lambda a, c: 2 * np.arccos(min(1.0, abs(float(a @ c))))  # noqa: E731
        assert angle(got, exp_rot) < 1e-5
        assert angle(got, mj_rot) > 0.1
    finally:
        scene.close()

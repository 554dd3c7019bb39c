""".superdex_bot assets and root selection (issue 15, items 1-2).

Oracles from outside the bot code: the URDF loader's own FK (itself checked against MuJoCo in test_layout.py) and
MuJoCo's ``xpos`` for the bot <-> description conversions; MuJoCo's mesh-inertia compiler and closed-form box
inertias for geometry-derived mass properties; scipy's graph shortest paths and hand-counted graphs for root
selection; the file system itself (listing before and after) for archive safety.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil
import stat
import zipfile
from pathlib import Path

import mujoco
import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine.animation import ArticulationCoordinateLayout, forward_kinematics
from kangengine.asset import (
    ArchiveError,
    BotFormatError,
    BotJointType,
    GraphJoint,
    MassPropertiesError,
    URDFLoader,
    bot_from_desc,
    bot_from_urdf,
    bot_link_transforms,
    bot_pose_joint_values,
    bot_to_desc,
    load_bot,
    reroot,
    save_bot,
    select_root,
)
from kangengine.errors import (
    DuplicateNameError,
    KangEngineError,
    TopologyError,
    UnknownNameError,
    UnsupportedJointError,
)

G1_URDF = "urdf/unitree/g1_29dof.urdf"
G1_MESHES = "mjcf/unitree/meshes"


# -- helpers -------------------------------------------------------------------------------------------------------
def _random_q(layout, rng, n=6):
    q = rng.uniform(-1.2, 1.2, size=(n, layout.nq))
    for b in layout.blocks:
        if b.joint_type.nq == 7:
            q[:, b.q_offset + 3 : b.q_offset + 7] /= np.linalg.norm(q[:, b.q_offset + 3 : b.q_offset + 7], axis=1)[
                :, None
            ]
        elif b.joint_type.nq == 4:
            q[:, b.q_slice] /= np.linalg.norm(q[:, b.q_slice], axis=1)[:, None]
    return q


def _same_rotation(a, b):
    return np.abs(np.abs(np.sum(a * b, axis=-1)) - 1.0).max()


def _arm_dict():
    """A small valid bot: Hard world joint, a revolute and a prismatic joint, one link with a shape."""
    return {
        "name": "arm",
        "joints": [
            {"name": "world_joint", "type": "Hard"},
            {
                "name": "j1",
                "type": "Revolute",
                "axis": [0, 0, 2],
                "parentLinkFromJoint": {"translation": [0, 0, 0.1], "rotation": [0, 0, 0, 1]},
                "minLimit": [0, 0, -1],
                "maxLimit": [0, 0, 1],
                "effortLimit": 40,
            },
            {"name": "j2", "type": "Prismatic", "axis": [1, 0, 0], "parentLinkFromJoint": {"translation": [0.2, 0, 0]}},
        ],
        "links": [
            {"name": "base"},
            {
                "name": "l1",
                "parentLink": 0,
                "mass": 1.5,
                "centerOfMass": [0, 0, 0.05],
                "momentOfInertia": [0.01, 0, 0, 0.01, 0, 0.005],
                "shapeFile": "collision/l1.obj",
            },
            {"name": "l2", "parentLink": 1, "parentJointFromLink": {"translation": [0.1, 0, 0]}},
        ],
        "defaultPose": [0.3, 0.05],
    }


def _write(tmp_path: Path, d, name="arm.superdex_bot") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return p


def _box_obj(path: Path, size=(0.2, 0.1, 0.4), center=(0.0, 0.0, 0.0)) -> None:
    """A cuboid as an OBJ with outward-wound quads."""
    h = np.array(size) / 2
    c = np.array(center)
    v = [c + h * np.array(s) for s in itertools.product((-1, 1), repeat=3)]  # index = 4*x + 2*y + z bits
    faces = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"v {float(x)!r} {float(y)!r} {float(z)!r}" for x, y, z in v]
    lines += ["f " + " ".join(str(i + 1) for i in f) for f in faces]
    path.write_text("\n".join(lines) + "\n")


def _box_inertia(m, size):
    a, b, c = size
    return np.diag([m * (b * b + c * c), m * (a * a + c * c), m * (a * a + b * b)]) / 12.0


# -- G1: URDF -> bot -> file -> bot -> desc ------------------------------------------------------------------------
def test_g1_urdf_to_bot_file_and_back_keeps_forward_kinematics(tmp_path):
    path = data_file(G1_URDF)
    urdf_desc = URDFLoader.load(path)
    bot = bot_from_urdf(path)
    assert bot.joints[0].type is BotJointType.FREE and bot.joints[0].name == "world_joint"
    assert len(bot.joints) == len(bot.links) == len(urdf_desc.bodies)
    assert bot.pose_dof_count == 29  # the 29 hinges; the Free world joint contributes nothing
    assert any("dropped geoms" in n and "sphere" in n for n in bot.notes)  # primitives are said, not silent
    file = save_bot(tmp_path / "g1.superdex_bot", bot)
    again = load_bot(file)
    assert again == bot
    desc = bot_to_desc(again)
    assert desc.body_names == urdf_desc.body_names
    for a, b in zip(desc.bodies, urdf_desc.bodies):
        assert a.mass == pytest.approx(b.mass, rel=1e-12)
        np.testing.assert_allclose(a.inertia, b.inertia, atol=1e-15)
    la = ArticulationCoordinateLayout.from_data(data=urdf_desc)
    lb = ArticulationCoordinateLayout.from_data(data=desc)
    assert (la.nq, la.nv) == (lb.nq, lb.nv)
    q = _random_q(la, np.random.default_rng(7), n=16)
    pa, ra = forward_kinematics(la, q)
    pb, rb = forward_kinematics(lb, q)
    np.testing.assert_allclose(pb, pa, atol=1e-9)
    assert _same_rotation(ra, rb) < 1e-9
    # the limits and efforts survive too
    joints = {j.name: j for j in desc.joints}
    assert set(joints) == {*urdf_desc.joint_names, "world_joint"}
    for ja in urdf_desc.joints:
        jb = joints[ja.name]
        assert jb.type is ja.type
        np.testing.assert_allclose(jb.axis, ja.axis, atol=1e-15)
        if ja.range is not None:
            np.testing.assert_allclose(jb.range, ja.range, atol=1e-12)
        if ja.effort_limit is not None:
            assert jb.effort_limit == pytest.approx(ja.effort_limit)


def test_bot_simulates_like_the_urdf_in_mujoco(tmp_path):
    """The bot's simulator model (mass matrix, bias forces) equals MuJoCo's compile of the same URDF."""
    import torch

    path = data_file("urdf/unitree/g1_29dof.nomesh.urdf")
    bot = load_bot(save_bot(tmp_path / "g1.superdex_bot", bot_from_urdf(path, fixed_base=True)))
    desc = bot_to_desc(bot)
    model = ke.sim.Model.from_desc(desc, free_root=False, dtype=torch.float64)
    spec = mujoco.MjSpec.from_file(str(path))
    spec.compiler.fusestatic = False
    m = spec.compile()
    assert model.layout.nv == m.nv == 29
    assert [b.joint_name for b in model.layout.blocks if b.q_dim] == [m.joint(j).name for j in range(m.njnt)]
    d = mujoco.MjData(m)
    rng = np.random.default_rng(5)
    q, qd = rng.uniform(-0.8, 0.8, (3, m.nq)), rng.normal(size=(3, m.nv))
    mass = ke.sim.mass_matrix(model, torch.as_tensor(q)).numpy()
    bias = ke.sim.bias_forces(model, torch.as_tensor(q), torch.as_tensor(qd)).numpy()
    for i in range(3):
        d.qpos[:], d.qvel[:] = q[i], qd[i]
        mujoco.mj_forward(m, d)
        full = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, full)
        np.testing.assert_allclose(mass[i], full, atol=1e-10 * np.abs(full).max())
        np.testing.assert_allclose(bias[i], d.qfrc_bias, atol=1e-9 * np.abs(d.qfrc_bias).max())


def test_every_field_survives_the_file(tmp_path):
    d = _arm_dict()
    s = math.sqrt(0.5)
    d["joints"][1].update(
        friction={"viscous": 0.5, "coulomb": 0.2, "falloffVel": 0.01, "stictionExtra": 0.1, "stribeckVel": 0.05},
        inertia=0.03,
        limitStiffness=250.0,
        limitDamping=2.0,
    )
    d["links"][1].update(
        layer="arm",
        colliderType="Mesh",
        contact={"friction": 0.8},
        hasGravity=False,
        shapeScale=[1, 2, 3],
        shapeRotation=[0, 0, s, s],
        shapeTranslation=[0.1, 0, 0],
        renderModelFile="render/l1.glb",
        renderModelScale=[0.001, 0.001, 0.001],
        sensors=[{"type": "imu", "name": "imu0", "rate": 200, "noise": [0.1, 0.2]}],
    )
    d["worldFromRoot"] = {"translation": [0, 0, 1], "rotation": [s, 0, 0, s]}
    d["contactOverrides"] = [{"linkA": "base", "linkB": "l1", "enable": True}]
    d["cycles"] = [{"parentLink": 0, "childLink": 2, "stiffness": 1000.0}]
    bot = load_bot(_write(tmp_path, d))
    link = bot.links[1]
    assert (link.layer, link.collider_type, dict(link.contact), link.has_gravity) == (
        "arm",
        "Mesh",
        {"friction": 0.8},
        False,
    )
    np.testing.assert_allclose(link.shape.rotation_wxyz, [s, 0, 0, s])
    assert link.render_model.scale == (0.001, 0.001, 0.001)
    assert link.sensors[0].type == "imu" and dict(link.sensors[0].params) == {"rate": 200, "noise": [0.1, 0.2]}
    assert bot.joints[1].friction.stribeck_vel == 0.05 and bot.joints[1].inertia == 0.03
    written = save_bot(tmp_path / "copy.superdex_bot", bot)
    assert load_bot(written) == bot
    raw = json.loads(written.read_text())
    assert raw["links"][1]["shapeRotation"] == pytest.approx([0, 0, s, s])  # XYZW in the file
    assert raw["links"][1]["sensors"] == [{"type": "imu", "name": "imu0", "rate": 200, "noise": [0.1, 0.2]}]
    desc = bot_to_desc(bot)
    j1 = desc.joints[desc.joint_index("j1")]
    assert (j1.armature, j1.damping, j1.frictionloss) == (0.03, 0.5, 0.2)


def test_unknown_keys_are_noted_not_silently_dropped(tmp_path):
    d = _arm_dict()
    d["links"][2]["colour"] = "red"
    bot = load_bot(_write(tmp_path, d))
    assert any("'l2'" in n and "colour" in n for n in bot.notes)


def test_bot_from_urdf_fixed_base_is_a_hard_weld():
    bot = bot_from_urdf(data_file(G1_URDF), fixed_base=True)
    assert bot.joints[0].type is BotJointType.HARD
    desc = bot_to_desc(bot)
    assert [desc.joints[j].type.value for j in desc.bodies[0].joints] == ["fixed"]
    assert ke.asset.select_root(*ke.asset.desc_graph(desc)).fixed_base


@pytest.mark.parametrize(
    "rel",
    ["mjcf/mujoco/humanoid.xml", "mjcf/dm_control/humanoid_CMU.xml", "mjcf/dm_control/model_with_ball_joints.xml"],
)
def test_mjcf_to_bot_matches_mujoco_positions(rel, tmp_path):
    """Bodies with several hinges become chains of shapeless frames; ball joints become Spherical; the
    positions of the real bodies equal MuJoCo's xpos at random qpos."""
    path = data_file(rel)
    desc = ke.asset.MJCFLoader.load(path)
    bot = load_bot(save_bot(tmp_path / "m.superdex_bot", bot_from_desc(desc)))
    back = bot_to_desc(bot)
    layout = ArticulationCoordinateLayout.from_data(data=back, free_root=back.joints[0].type.value == "free")
    mj_body = {name: k + 1 for k, name in enumerate(desc.body_names)}  # the loader keeps MuJoCo's body order
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    rng = np.random.default_rng(3)
    for _ in range(4):
        d.qpos[:] = m.qpos0
        d.qpos[:] += rng.uniform(-0.6, 0.6, m.nq)
        for j in range(m.njnt):
            a = m.jnt_qposadr[j]
            if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_BALL:
                d.qpos[a : a + 4] /= np.linalg.norm(d.qpos[a : a + 4])
            elif m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
                d.qpos[a + 3 : a + 7] /= np.linalg.norm(d.qpos[a + 3 : a + 7])
        mujoco.mj_kinematics(m, d)
        q = np.zeros(layout.nq)
        for blk in layout.blocks:
            if blk.q_dim == 0:
                continue  # the Hard joints of welded bodies
            # humanoid_CMU's free joint 'root' shares its body's name: the bot renames it 'root_joint'
            a = 0 if blk.q_dim == 7 else m.jnt_qposadr[m.joint(blk.joint_name).id]
            if blk.joint_type.nq == 1:
                q[blk.q_slice] = d.qpos[a] - m.qpos0[a]  # the bot's zero is the model's reference pose
            else:
                q[blk.q_slice] = d.qpos[a : a + blk.joint_type.nq]
        pos, rot = forward_kinematics(layout, q)
        real = [i for i, name in enumerate(layout.body_names) if name in mj_body]
        assert len(real) == m.nbody - 1
        for i in real:
            np.testing.assert_allclose(pos[i], d.xpos[mj_body[layout.body_names[i]]], atol=1e-9)
            assert _same_rotation(rot[i], d.xquat[mj_body[layout.body_names[i]]]) < 1e-9


def test_default_pose_layout_spherical_is_a_rotation_vector(tmp_path):
    """defaultPose: one value per hinge/slide, three (a rotation vector) per Spherical joint, none for Free/Hard;
    the bot's own link transforms at that pose equal the description's FK."""
    desc = ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/model_with_ball_joints.xml"))
    bot = bot_from_desc(desc)
    assert [j.type for j in bot.joints] == [BotJointType.HARD, BotJointType.SPHERICAL, BotJointType.SPHERICAL]
    assert bot.pose_dof_count == 6
    pose = np.array([0.3, -0.2, 0.5, 1.0, 0.4, -0.7])
    bot = dataclasses.replace(bot, default_pose=tuple(pose))
    values = bot_pose_joint_values(bot)
    np.testing.assert_allclose(
        values["joint_1"][1:] / np.sin(np.linalg.norm(pose[:3]) / 2), pose[:3] / np.linalg.norm(pose[:3])
    )
    layout = ArticulationCoordinateLayout.from_data(data=bot_to_desc(bot), free_root=False)
    q = np.concatenate([values.get(b.joint_name, np.zeros(0)) for b in layout.blocks])  # Hard joints: no value
    pos, rot = forward_kinematics(layout, q)
    lp, lr = bot_link_transforms(bot, pose)
    np.testing.assert_allclose(pos, lp, atol=1e-12)
    assert _same_rotation(rot, lr) < 1e-12


def test_reference_fr3_example_loads(tmp_path):
    """The schema page's FR3 excerpt: Hard joints, shape/renderModel spellings, an all-zero shapeless base."""
    text = """{
      "joints": [
        {"maxLimit": [0, 0, 0], "minLimit": [0, 0, 0], "name": "world_joint", "type": "Hard"},
        {"maxLimit": [0, 0, 0], "minLimit": [0, 0, 0], "name": "fr3_base_joint", "type": "Hard"}
      ],
      "links": [
        {"centerOfMass": [0, 0, 0], "mass": 0, "momentOfInertia": [0, 0, 0, 0, 0, 0], "name": "base"},
        {"centerOfMass": [-0.0172, 0.0004, 0.0745], "mass": 2.40,
         "momentOfInertia": [0.009, 0, 0.002, 0.0115, 0, 0.0085], "name": "fr3_link0", "parentLink": 0,
         "renderModel": "render/fr3_link0_render.glb", "shape": "collision/fr3_link0_collision.mochi.h5"}
      ],
      "name": "fr3_v2"
    }"""
    bot = load_bot(_write(tmp_path, text, "fr3_v2.superdex_bot"))
    assert bot.name == "fr3_v2" and bot.pose_dof_count == 0
    assert bot.links[1].shape.file == "collision/fr3_link0_collision.mochi.h5"
    assert bot.links[1].render_model.file == "render/fr3_link0_render.glb"
    desc = bot_to_desc(bot)  # explicit inertia: the .mochi.h5 mesh is never opened
    assert desc.bodies[1].mass == 2.40 and desc.bodies[1].inertia[0, 2] == 0.002
    assert load_bot(save_bot(tmp_path / "out.superdex_bot", bot)) == bot


def test_xyzw_quaternions_and_transforms_at_the_boundary(tmp_path):
    d = _arm_dict()
    s = math.sqrt(0.5)
    d["worldFromRoot"] = {"translation": [1, 2, 3], "rotation": [0, 0, s, s]}  # 90 deg about z, XYZW
    bot = load_bot(_write(tmp_path, d))
    np.testing.assert_allclose(bot.world_from_root.rotation_wxyz, [s, 0, 0, s])
    pos, _ = bot_link_transforms(bot)
    # zero pose: l2 at (0.2 + 0.1, 0, 0.1) in the root frame, turned 90 deg about z and moved by (1, 2, 3)
    np.testing.assert_allclose(pos[2], [1, 2.3, 3.1], atol=1e-12)
    written = json.loads(save_bot(tmp_path / "o.superdex_bot", bot).read_text())
    np.testing.assert_allclose(written["worldFromRoot"]["rotation"], [0, 0, s, s])
    assert bot.joints[1].axis == (0.0, 0.0, 1.0)  # normalised
    assert bot.joints[1].scalar_limits == (-1.0, 1.0)


def test_cycle_pivot_meets_its_parent_point_in_the_zero_pose():
    d = _arm_dict()
    d["cycles"] = [{"parentLink": 0, "childLink": 2, "jointFromChildLink": {"translation": [0.05, 0, 0]}}]
    d["contactOverrides"] = [{"linkA": "base", "linkB": "l2", "enable": False}]
    bot = ke.asset.parse_bot(d)
    desc = bot_to_desc(bot)
    (c,) = desc.cycles
    assert (c.parent, c.child, c.stiffness) == ("base", "l2", 50000.0)
    # zero pose: l2 sits at (0.2 + 0.1, 0, 0.1) in the base; its pivot 0.05 further along x (hand-computed)
    np.testing.assert_allclose(c.parent_pivot, [0.35, 0, 0.1], atol=1e-12)
    assert desc.contact_exclusions == (("base", "l2"),)


def test_cycles_and_contact_exclusions_go_both_ways():
    d = _arm_dict()
    d["cycles"] = [{"parentLink": 0, "childLink": 2, "jointFromChildLink": {"translation": [0.05, 0, 0]}}]
    d["contactOverrides"] = [{"linkA": "base", "linkB": "l2", "enable": False}]
    desc = bot_to_desc(ke.asset.parse_bot(d))
    back = bot_from_desc(desc)
    assert back.cycles == ke.asset.parse_bot(d).cycles and not any("cycle" in n for n in back.notes)
    assert back.contact_overrides == ke.asset.parse_bot(d).contact_overrides
    (c,) = desc.cycles
    moved = dataclasses.replace(desc, cycles=(dataclasses.replace(c, parent_pivot=c.parent_pivot + [0, 0, 0.01]),))
    assert any("cycle 'cycle_0'" in n and "0.01 m" in n for n in bot_from_desc(moved).notes)


# -- every rule has a failing file ---------------------------------------------------------------------------------
def _set(path, value):
    def f(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        if value is _DEL:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value

    return f


_DEL = object()
_RULES = [
    ("counts", lambda d: d["joints"].pop(), TopologyError, ["2 joints and 3 links"]),
    ("no_links", lambda d: (d["joints"].clear(), d["links"].clear()), TopologyError, ["no links"]),
    ("parent_first", _set(["links", 2, "parentLink"], 2), TopologyError, ["'l2'", "parent-first"]),
    ("parent_later", _set(["links", 1, "parentLink"], 2), TopologyError, ["'l1'", "parent-first"]),
    ("second_root", _set(["links", 2, "parentLink"], -1), TopologyError, ["'l2'", "only links[0] is the root"]),
    ("root_with_parent", _set(["links", 0, "parentLink"], 0), TopologyError, ["'base'", "expected -1"]),
    ("dup_joint", _set(["joints", 2, "name"], "j1"), DuplicateNameError, ["'j1'", "unique across"]),
    ("dup_link", _set(["links", 2, "name"], "l1"), DuplicateNameError, ["'l1'", "unique across"]),
    ("joint_link_clash", _set(["joints", 1, "name"], "l1"), DuplicateNameError, ["'l1'", "unique across"]),
    ("slash_link", _set(["links", 1, "name"], "a/b"), DuplicateNameError, ["'a/b'", "'/'"]),
    ("backslash_joint", _set(["joints", 1, "name"], "a\\b"), DuplicateNameError, ["must not contain"]),
    ("nul_link", _set(["links", 2, "name"], "a\x00b"), DuplicateNameError, ["must not contain"]),
    ("zero_axis_revolute", _set(["joints", 1, "axis"], [0, 0, 0]), BotFormatError, ["'j1'", "axis", "non-zero"]),
    ("zero_axis_prismatic", _set(["joints", 2, "axis"], [0, 0, 0]), BotFormatError, ["'j2'", "non-zero"]),
    ("missing_type", _set(["joints", 1, "type"], _DEL), BotFormatError, ["'j1'", "must be set"]),
    ("invalid_type", _set(["joints", 1, "type"], "Invalid"), BotFormatError, ["'j1'", "Revolute"]),
    (
        "link_rotation",
        _set(["links", 2, "parentJointFromLink"], {"rotation": [0, 0, 0.1, 0.995]}),
        BotFormatError,
        ["'l2'", "parentJointFromLink", "identity"],
    ),
    ("mass_negative", _set(["links", 1, "mass"], -1.0), MassPropertiesError, ["'l1'", "mass -1.0 must be positive"]),
    ("mass_zero_with_shape", _set(["links", 1, "mass"], 0), MassPropertiesError, ["'l1'", "positive"]),
    ("mass_infinite", _set(["links", 1, "mass"], "INF"), BotFormatError, ["'l1'", "finite"]),
    ("density_zero", lambda d: _only(d, density=0.0), MassPropertiesError, ["'l1'", "density 0.0 must be positive"]),
    ("density_negative", lambda d: _only(d, density=-3.0), MassPropertiesError, ["'l1'", "positive"]),
    ("mass_and_density", _set(["links", 1, "density"], 500.0), MassPropertiesError, ["'l1'", "accepted combinations"]),
    ("com_without_inertia", lambda d: _only(d, mass=1.0, centerOfMass=[0, 0, 0]), MassPropertiesError, ["'l1'"]),
    ("shapeless_density", _set(["links", 2, "density"], 800.0), MassPropertiesError, ["'l2'", "no shapeFile"]),
    (
        "shapeless_negative_mass",
        lambda d: d["links"][2].update(mass=-1.0, centerOfMass=[0, 0, 0], momentOfInertia=[0] * 6),
        MassPropertiesError,
        ["'l2'", "mass -1.0 must be positive"],
    ),
    (
        "zero_rotation",
        _set(["joints", 2, "parentLinkFromJoint"], {"rotation": [0, 0, 0, 0]}),
        BotFormatError,
        ["'j2'", "zero quaternion"],
    ),
    (
        "inertia_not_physical",
        _set(["links", 1, "momentOfInertia"], [1.0, 0, 0, 0.1, 0, 0.1]),
        MassPropertiesError,
        ["'l1'", "triangle inequality"],
    ),
    ("pose_length", _set(["defaultPose"], [0.1]), BotFormatError, ["defaultPose", "need 2"]),
    ("limit_off_axis", _set(["joints", 1, "maxLimit"], [1, 0, 1]), BotFormatError, ["'j1'", "not along the axis"]),
    ("limit_order", _set(["joints", 1, "minLimit"], [0, 0, 2]), BotFormatError, ["'j1'", "lower limit 2.0 > upper"]),
    ("one_limit", _set(["joints", 1, "minLimit"], _DEL), BotFormatError, ["'j1'", "both or neither"]),
    ("cycle_index", _set(["cycles"], [{"parentLink": 0, "childLink": 7}]), TopologyError, ["cycles[0]"]),
    (
        "override_unknown_link",
        _set(["contactOverrides"], [{"linkA": "base", "linkB": "nope", "enable": False}]),
        BotFormatError,
        ["'nope'", "links are: base, l1, l2"],
    ),
    ("not_an_object", lambda d: d["joints"].__setitem__(1, 5), BotFormatError, ["joints[1]", "JSON object"]),
    ("axis_length", _set(["joints", 1, "axis"], [0, 1]), BotFormatError, ["'j1'", "3 numbers"]),
]


def _only(d, **fields):
    link = d["links"][1]
    for k in ("density", "mass", "centerOfMass", "momentOfInertia"):
        link.pop(k, None)
    link.update(fields)


@pytest.mark.parametrize(("case", "mutate", "error", "words"), _RULES, ids=[r[0] for r in _RULES])
def test_every_rule_refuses_a_small_file(tmp_path, case, mutate, error, words):
    d = _arm_dict()
    mutate(d)
    text = json.dumps(d).replace('"INF"', "1e999")  # 1e999 parses as infinity
    path = _write(tmp_path, text)
    with pytest.raises(error) as info:
        load_bot(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg


def test_the_valid_file_loads(tmp_path):
    bot = load_bot(_write(tmp_path, _arm_dict()))
    assert bot.link_names == ("base", "l1", "l2") and bot.default_pose == (0.3, 0.05)
    assert bot.joints[1].effort_limit == 40 and bot.joints[2].effort_limit == -1.0


def test_bad_json_and_missing_file(tmp_path):
    with pytest.raises(BotFormatError, match="not valid JSON"):
        load_bot(_write(tmp_path, "{"))
    with pytest.raises(BotFormatError, match="NaN is not a finite number"):
        load_bot(_write(tmp_path, '{"joints": [], "links": [], "defaultPose": [NaN]}'))
    with pytest.raises(KangEngineError, match="no such bot file"):
        load_bot(tmp_path / "missing.superdex_bot")


_MASS_FIELDS = {"density": 700.0, "mass": 2.0, "centerOfMass": [0, 0, 0.1], "momentOfInertia": [0.1, 0, 0, 0.1, 0, 0.1]}
_ACCEPTED = {(), ("density",), ("mass",), ("mass", "centerOfMass", "momentOfInertia")}
_ACCEPTED |= {("density", "centerOfMass", "momentOfInertia")}


@pytest.mark.parametrize(
    "fields",
    [c for n in range(5) for c in itertools.combinations(_MASS_FIELDS, n)],
    ids=lambda c: "+".join(c) or "none",
)
def test_exactly_five_mass_property_combinations(tmp_path, fields):
    d = _arm_dict()
    _only(d, **{k: _MASS_FIELDS[k] for k in fields})
    path = _write(tmp_path, d)
    if fields in _ACCEPTED:
        assert load_bot(path).links[1].mass_properties.combination == ("+".join(fields) or "none")
    else:
        with pytest.raises(MassPropertiesError, match="accepted combinations"):
            load_bot(path)


# -- mass properties from geometry ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "mass"),
    [({}, 1000.0 * 0.008), ({"density": 500.0}, 500.0 * 0.008), ({"mass": 3.0}, 3.0)],
    ids=["default_density", "density", "mass"],
)
def test_box_mesh_mass_properties_are_the_closed_form(tmp_path, fields, mass):
    size = (0.2, 0.1, 0.4)
    _box_obj(tmp_path / "collision" / "l1.obj", size, center=(0.01, -0.02, 0.05))
    d = _arm_dict()
    _only(d, **fields)
    desc = bot_to_desc(load_bot(_write(tmp_path, d)))
    body = desc.bodies[1]
    assert body.mass == pytest.approx(mass, rel=1e-12)
    np.testing.assert_allclose(body.com, [0.01, -0.02, 0.05], atol=1e-14)
    np.testing.assert_allclose(body.inertia, _box_inertia(mass, size), atol=1e-14)


def test_mesh_scale_rotation_translation_are_applied(tmp_path):
    _box_obj(tmp_path / "collision" / "l1.obj", (0.2, 0.1, 0.4))
    d = _arm_dict()
    _only(d, density=1000.0)
    s = math.sqrt(0.5)
    d["links"][1].update(shapeScale=[2, 1, 1], shapeRotation=[0, 0, s, s], shapeTranslation=[0.1, 0.2, 0.3])
    body = bot_to_desc(load_bot(_write(tmp_path, d))).bodies[1]
    # scaled to 0.4 x 0.1 x 0.4, then turned 90 deg about z: 0.1 x 0.4 x 0.4
    m = 1000.0 * 0.4 * 0.1 * 0.4
    assert body.mass == pytest.approx(m, rel=1e-12)
    np.testing.assert_allclose(body.com, [0.1, 0.2, 0.3], atol=1e-14)
    np.testing.assert_allclose(body.inertia, _box_inertia(m, (0.1, 0.4, 0.4)), atol=1e-14)


def test_density_with_explicit_inertia_takes_only_the_mass_from_geometry(tmp_path):
    _box_obj(tmp_path / "collision" / "l1.obj", (0.2, 0.1, 0.4))
    d = _arm_dict()
    _only(d, density=250.0, centerOfMass=[0, 0, 0.3], momentOfInertia=[0.2, 0, 0, 0.2, 0, 0.3])
    body = bot_to_desc(load_bot(_write(tmp_path, d))).bodies[1]
    assert body.mass == pytest.approx(250.0 * 0.008, rel=1e-12)
    np.testing.assert_allclose(body.com, [0, 0, 0.3])
    np.testing.assert_allclose(np.diag(body.inertia), [0.2, 0.2, 0.3])


@pytest.mark.parametrize("mesh", ["waist_roll_link.STL", "left_wrist_pitch_link.STL"])
def test_real_stl_mass_properties_match_mujoco(tmp_path, mesh):
    src = data_file(f"{G1_MESHES}/{mesh}")
    shutil.copy(src, tmp_path / mesh)
    d = _arm_dict()
    _only(d, density=700.0)
    d["links"][1]["shapeFile"] = mesh
    body = bot_to_desc(load_bot(_write(tmp_path, d))).bodies[1]
    xml = f"""<mujoco><asset><mesh name="m" file="{src}" inertia="exact"/></asset><worldbody><body name="b">
      <freejoint/><geom type="mesh" mesh="m" density="700"/></body></worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, m.body_iquat[1])
    rot = rot.reshape(3, 3)
    inertia = rot @ np.diag(m.body_inertia[1]) @ rot.T
    assert body.mass == pytest.approx(m.body_mass[1], rel=1e-9)
    np.testing.assert_allclose(body.com, m.body_ipos[1], atol=1e-12)
    np.testing.assert_allclose(body.inertia, inertia, rtol=0, atol=1e-8 * np.abs(inertia).max())


def _write_ply(path: Path, tris: np.ndarray, *, binary: bool) -> None:
    verts, inv = np.unique(tris.reshape(-1, 3), axis=0, return_inverse=True)
    faces = inv.reshape(-1, 3)
    fmt = "binary_big_endian" if binary else "ascii"
    head = f"ply\nformat {fmt} 1.0\ncomment from an STL\nelement vertex {len(verts)}\nproperty double x\n"
    head += f"property double y\nproperty double z\nproperty uchar red\nelement face {len(faces)}\n"
    head += "property list uchar int vertex_indices\nend_header\n"
    if binary:
        rec = np.zeros(len(verts), dtype=[("p", ">f8", 3), ("red", "u1")])
        rec["p"] = verts
        frec = np.zeros(len(faces), dtype=[("n", "u1"), ("v", ">i4", 3)])
        frec["n"], frec["v"] = 3, faces
        path.write_bytes(head.encode() + rec.tobytes() + frec.tobytes())
    else:
        rows = [" ".join(repr(float(x)) for x in v) + " 9" for v in verts]
        path.write_text(head + "\n".join(rows + ["3 " + " ".join(map(str, f)) for f in faces]) + "\n")


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
def test_ply_meshes_integrate_like_mujoco(tmp_path, binary):
    """The same real mesh written as PLY (ASCII, big-endian binary) gives MuJoCo's mass properties of the STL."""
    src = data_file(f"{G1_MESHES}/waist_roll_link.STL")
    _write_ply(tmp_path / "m.ply", ke.asset.load_triangle_mesh(src), binary=binary)
    d = _arm_dict()
    _only(d, density=700.0)
    d["links"][1]["shapeFile"] = "m.ply"
    body = bot_to_desc(load_bot(_write(tmp_path, d))).bodies[1]
    m = mujoco.MjModel.from_xml_string(
        f"""<mujoco><asset><mesh name="m" file="{src}" inertia="exact"/></asset><worldbody><body name="b">
        <freejoint/><geom type="mesh" mesh="m" density="700"/></body></worldbody></mujoco>"""
    )
    assert body.mass == pytest.approx(m.body_mass[1], rel=1e-9)
    np.testing.assert_allclose(body.com, m.body_ipos[1], atol=1e-12)


def test_meshes_that_cannot_be_integrated_are_refused_clearly(tmp_path):
    d = _arm_dict()
    _only(d)
    d["links"][1]["shapeFile"] = "l1.mochi.h5"
    (tmp_path / "l1.mochi.h5").write_bytes(b"\x89HDF")
    with pytest.raises(MassPropertiesError, match=r"'l1'.*cannot be integrated.*\.stl, \.obj, \.off, \.ply"):
        bot_to_desc(load_bot(_write(tmp_path, d)))
    d["links"][1]["shapeFile"] = "broken.ply"
    (tmp_path / "broken.ply").write_text("ply\nformat ascii 1.0\nelement vertex 3\nend_header\n1 2\n")
    with pytest.raises(MassPropertiesError, match="malformed .ply"):
        bot_to_desc(load_bot(_write(tmp_path, d)))
    # MuJoCo refuses this real mesh too ("faces of mesh have inconsistent orientation")
    shutil.copy(data_file(f"{G1_MESHES}/left_hip_pitch_link.STL"), tmp_path / "bad.STL")
    d["links"][1]["shapeFile"] = "bad.STL"
    with pytest.raises(MassPropertiesError, match="inconsistent orientation"):
        bot_to_desc(load_bot(_write(tmp_path, d)))


# -- archives ------------------------------------------------------------------------------------------------------
def _listing(root: Path, skip: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if skip not in (p, *p.parents)}


def _good_archive(path: Path, tmp_path: Path) -> Path:
    _box_obj(tmp_path / "src" / "collision" / "l1.obj", (0.2, 0.1, 0.4))
    d = _arm_dict()
    _only(d)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("arm/arm.superdex_bot", json.dumps(d))
        z.write(tmp_path / "src" / "collision" / "l1.obj", "arm/collision/l1.obj")
    return path


def test_archive_is_extracted_once_into_a_content_addressed_cache(tmp_path):
    archive = _good_archive(tmp_path / "arm.superdex_bot_archive", tmp_path)
    cache = tmp_path / "cache"
    bot = load_bot(archive, cache_dir=cache)
    entries = list(cache.iterdir())
    assert len(entries) == 1 and len(entries[0].name) == 32  # one folder, named by the content hash
    assert Path(bot.source).is_relative_to(entries[0])
    assert bot_to_desc(bot).bodies[1].mass == pytest.approx(8.0)  # the mesh inside the cache was integrated
    assert load_bot(archive, cache_dir=cache) == bot and list(cache.iterdir()) == entries
    assert ke.asset.load(archive, cache_dir=cache).body_names == ("base", "l1", "l2")


def _zip(path: Path, members) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for info, data in members:
            z.writestr(info, data)
    return path


def _symlink(name, target):
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target


_BOT = json.dumps(_arm_dict())
_MALICIOUS = {
    "zip_slip": ([("a.superdex_bot", _BOT), ("../x", "pwned")], {}, "'..'"),
    "zip_slip_nested": ([("a.superdex_bot", _BOT), ("collision/../../x", "pwned")], {}, "'..'"),
    "absolute": ([("a.superdex_bot", _BOT), ("/tmp/kangengine_pwned", "pwned")], {}, "absolute"),
    "drive": ([("a.superdex_bot", _BOT), ("C:/x", "pwned")], {}, "absolute"),
    "backslash": ([("a.superdex_bot", _BOT), ("..\\x", "pwned")], {}, "backslash"),
    "symlink": ([("a.superdex_bot", _BOT), _symlink("collision/l1.obj", "/etc/passwd")], {}, "symlink"),
    "oversized": (
        [("a.superdex_bot", _BOT), ("big.bin", b"\0" * 3_000_000)],
        {"max_unpacked_bytes": 1_000_000},
        "max_",
    ),
    "too_many": ([("a.superdex_bot", _BOT)] + [(f"m{i}", "x") for i in range(20)], {"max_members": 10}, "max_members"),
    "two_bots": ([("a.superdex_bot", _BOT), ("b.superdex_bot", _BOT)], {}, "expected one"),
    "no_bot": ([("readme.txt", "x")], {}, "expected one"),
    "file_and_folder": ([("a.superdex_bot", _BOT), ("x", "1"), ("x/y", "2")], {}, "cannot be written"),
}


@pytest.mark.parametrize("case", sorted(_MALICIOUS))
def test_malicious_archive_is_refused_and_writes_nothing(tmp_path, case):
    members, caps, words = _MALICIOUS[case]
    work = tmp_path / "work"
    work.mkdir()
    archive = _zip(work / "evil.superdex_bot_archive", members)
    cache = work / "deep" / "cache"
    before = _listing(tmp_path, cache)
    with pytest.raises(ArchiveError, match=words) as info:
        load_bot(archive, cache_dir=cache, **caps)
    assert str(archive) in str(info.value)
    assert _listing(tmp_path, cache) == before | ({"work/deep"} if cache.exists() else set())
    assert not cache.exists() or list(cache.iterdir()) == []  # no half-extracted folder, no temp folder
    assert not Path("/tmp/kangengine_pwned").exists()


def test_archive_lying_about_its_size_is_refused(tmp_path):
    """A header that declares 10 bytes for a 1 MB member: the bytes are counted as they come out."""
    archive = _zip(tmp_path / "lie.superdex_bot_archive", [("a.superdex_bot", _BOT), ("big.bin", b"\0" * 1_000_000)])
    raw = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("big.bin")
    size = (1_000_000).to_bytes(4, "little")
    k = raw.find(size, info.header_offset)  # local header, then the central directory entry
    while k >= 0:
        raw[k : k + 4] = (10).to_bytes(4, "little")
        k = raw.find(size, k + 4)
    archive.write_bytes(bytes(raw))
    cache = tmp_path / "cache"
    with pytest.raises(ArchiveError):
        load_bot(archive, cache_dir=cache)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_save_bot_is_atomic_and_checks_the_name(tmp_path):
    bot = load_bot(_write(tmp_path, _arm_dict()))
    out = tmp_path / "out" / "arm.superdex_bot"
    out.parent.mkdir()
    out.write_text("old")
    save_bot(out, bot)
    assert [p.name for p in out.parent.iterdir()] == ["arm.superdex_bot"]  # no temp file left
    assert load_bot(out) == bot
    with pytest.raises(BotFormatError, match=r"ends in \.superdex_bot"):
        save_bot(tmp_path / "arm.json", bot)


# -- root selection ------------------------------------------------------------------------------------------------
def _scrambled(bodies, joints, seed):
    rng = np.random.default_rng(seed)
    b = [bodies[i] for i in rng.permutation(len(bodies))]
    js = []
    for i in rng.permutation(len(joints)):
        name, p, c = joints[i]
        js.append(GraphJoint(name, *((c, p) if rng.random() < 0.5 else (p, c))))
    return b, js


# A humanoid: pelvis - torso - head; pelvis - thigh - shin - foot (x2); torso - upper_arm - forearm - hand (x2).
_HUMANOID = [("torso", "pelvis"), ("head", "torso")]
for _s in "lr":
    _HUMANOID += [(f"{_s}_thigh", "pelvis"), (f"{_s}_shin", f"{_s}_thigh"), (f"{_s}_foot", f"{_s}_shin")]
    _HUMANOID += [(f"{_s}_upper_arm", "torso"), (f"{_s}_forearm", f"{_s}_upper_arm"), (f"{_s}_hand", f"{_s}_forearm")]
_HUMANOID_BODIES = ["pelvis"] + [c for c, _p in _HUMANOID]
_HUMANOID_JOINTS = [(f"{c}_joint", p, c) for c, p in _HUMANOID]
# Hand-counted: e(pelvis) = 4 (to a hand), e(torso) = 4 (to a foot), e(head) = 5, e(thigh) = 5, e(upper_arm) = 5,
# e(shin) = e(forearm) = 6, e(foot) = e(hand) = 7. Tie pelvis/torso; distance sums: pelvis 1 + 2 + 2 * (1 + 2 + 3)
# + 2 * (2 + 3 + 4) = 33, torso 1 + 1 + 2 * (2 + 3 + 4) + 2 * (1 + 2 + 3) = 32: torso.
_HUMANOID_ECC = {"pelvis": 4, "torso": 4, "head": 5, "l_thigh": 5, "l_upper_arm": 5, "l_shin": 6, "l_forearm": 6}
_HUMANOID_ECC |= {"l_foot": 7, "l_hand": 7}


@pytest.mark.parametrize("seed", range(6))
def test_humanoid_in_scrambled_order_roots_at_the_minimal_eccentricity_body(seed):
    bodies, joints = _scrambled(_HUMANOID_BODIES, _HUMANOID_JOINTS, seed)
    sel = select_root(bodies, joints)
    assert sel.root == "torso" and not sel.fixed_base
    for name, e in _HUMANOID_ECC.items():
        assert sel.eccentricity[name] == e
        assert sel.eccentricity[name.replace("l_", "r_")] == e
    assert "distance sum (32)" in sel.reason
    parent = dict(zip(sel.bodies, sel.parents))
    assert parent == {"torso": None, **{c: p for c, p in _HUMANOID if c != "torso"}, "pelvis": "torso"}
    # each tree joint is flagged reversed exactly when it was given as (child, parent)
    given = {j.name: j for j in joints}
    for body, pj, rev in zip(sel.bodies[1:], sel.parent_joints[1:], sel.reversed[1:]):
        assert (given[pj].body0 == body) == rev


@pytest.mark.parametrize(
    ("edges", "root", "ecc"),
    [
        ([("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")], "c", 2),  # chain of 5: the middle
        ([("a", "b"), ("b", "c"), ("c", "d")], "b", 2),  # chain of 4: b and c tie on both counts, name decides
        ([("hub", x) for x in "pqrs"] + [("p", "p2")], "hub", 2),  # a star with one longer arm
        ([("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("c", "x"), ("x", "y"), ("y", "z")], "c", 3),
    ],
)
def test_hand_checked_graphs(edges, root, ecc):
    bodies = sorted({n for e in edges for n in e})
    joints = [(f"j{i}", a, b) for i, (a, b) in enumerate(edges)]
    for seed in range(4):
        sel = select_root(*_scrambled(bodies, joints, seed))
        assert (sel.root, sel.eccentricity[root]) == (root, ecc)


def test_fixed_base_arm_roots_at_the_world_attached_body():
    links = ["base", "link1", "link2", "link3", "link4", "link5", "link6", "hand"]
    joints = [(f"joint{i}", links[i - 1], links[i]) for i in range(1, len(links))] + [("weld", None, "base")]
    for seed in range(4):
        bodies, js = _scrambled(links, joints, seed)
        sel = select_root(bodies, js)
        assert (sel.root, sel.fixed_base, sel.world_joint) == ("base", True, "weld")
        assert sel.bodies == tuple(links) and sel.parents == (None, *links[:-1])
    floating = select_root(links, joints[:-1])
    assert floating.root in ("link3", "link4") and not floating.fixed_base  # without the weld: the middle
    with pytest.raises(TopologyError, match="fixes body 'base' to the world"):
        select_root(links, joints, root="link3")
    assert select_root(links, joints[:-1], root="hand").root == "hand"


def test_eccentricity_agrees_with_scipy_on_g1():
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    desc = URDFLoader.load(data_file(G1_URDF))
    bodies, joints = ke.asset.desc_graph(desc)
    sel = select_root(bodies, joints)
    index = {b: i for i, b in enumerate(bodies)}
    rows = [index[j.body0] for j in joints]
    cols = [index[j.body1] for j in joints]
    dist = shortest_path(csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(bodies),) * 2), directed=False)
    ecc, total = dist.max(axis=1), dist.sum(axis=1)
    assert [sel.eccentricity[b] for b in bodies] == ecc.astype(int).tolist()
    best = min(range(len(bodies)), key=lambda i: (ecc[i], total[i], bodies[i]))
    assert sel.root == bodies[best]


def test_root_selection_errors():
    with pytest.raises(TopologyError, match="several joints attach"):
        select_root(["a", "b"], [("w1", None, "a"), ("w2", None, "b"), ("j", "a", "b")])
    with pytest.raises(TopologyError, match="not connected"):
        select_root(["a", "b", "c"], [("j", "a", "b")])
    with pytest.raises(UnknownNameError, match="bodies are: a, b"):
        select_root(["a", "b"], [("j", "a", "zz")])
    with pytest.raises(UnknownNameError, match="no body 'q'"):
        select_root(["a", "b"], [("j", "a", "b")], root="q")
    loop = select_root(["a", "b", "c", "d"], [("ab", "a", "b"), ("bc", "b", "c"), ("cd", "c", "d"), ("da", "d", "a")])
    assert len(loop.loop_joints) == 1


# -- loaders accept root= ------------------------------------------------------------------------------------------
def _assert_same_shape(orig, rerooted, seed=0):
    """Same relative body poses: drive the re-rooted model's free root to where the original puts that body."""
    la = ArticulationCoordinateLayout.from_data(data=orig)
    lb = ArticulationCoordinateLayout.from_data(data=rerooted)
    q = _random_q(la, np.random.default_rng(seed))
    pa, ra = forward_kinematics(la, q)
    k = la.body_names.index(rerooted.bodies[0].name)
    qb = np.zeros((q.shape[0], lb.nq))
    qb[:, :3], qb[:, 3:7] = pa[:, k], ra[:, k]
    by_name = {b.joint_name: b for b in la.blocks}
    for blk in lb.blocks[1:]:
        qb[:, blk.q_slice] = q[:, by_name[blk.joint_name].q_slice]
    pb, rb = forward_kinematics(lb, qb)
    perm = [lb.body_names.index(n) for n in la.body_names]
    np.testing.assert_allclose(pb[:, perm], pa, atol=1e-9)
    assert _same_rotation(rb[:, perm], ra) < 1e-9


@pytest.mark.parametrize("root", ["left_ankle_roll_link", "auto", "pelvis"])
def test_urdf_loader_root(root):
    path = data_file(G1_URDF)
    orig = URDFLoader.load(path)
    desc = URDFLoader.load(path, root=root)
    assert desc.bodies[0].name == {"auto": "torso_link"}.get(root, root)
    assert ke.asset.load(path, root=root).body_names == desc.body_names
    _assert_same_shape(orig, desc)
    assert desc.total_mass == pytest.approx(orig.total_mass)


def test_mjcf_root_reverses_multi_hinge_bodies():
    path = data_file("mjcf/mujoco/humanoid.xml")
    orig = ke.asset.MJCFLoader.load(path)
    for root in ("auto", "foot_left", orig.bodies[0].name):
        desc = ke.asset.load(path, root=root)
        _assert_same_shape(orig, desc)


def test_fixed_base_and_ball_joints_refuse_another_root(tmp_path):
    cartpole = data_file("mjcf/dm_control/cartpole.xml")
    with pytest.raises(TopologyError, match="fixed-base"):
        ke.asset.load(cartpole, root="pole_1")
    assert ke.asset.load(cartpole, root="auto").bodies[0].name == ke.asset.MJCFLoader.load(cartpole).bodies[0].name
    ball = bot_from_desc(ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/model_with_ball_joints.xml")))
    free = dataclasses.replace(ball.joints[0], type=BotJointType.FREE)
    ball = dataclasses.replace(ball, joints=(free, *ball.joints[1:]))
    path = save_bot(tmp_path / "ball.superdex_bot", ball)
    with pytest.raises(UnsupportedJointError, match="ball joint 'joint_2'"):
        ke.asset.load(path, root=ball.links[-1].name)
    with pytest.raises(UnknownNameError):
        reroot(bot_to_desc(ball), "nope")


def test_bot_files_load_through_the_dispatcher(tmp_path):
    _box_obj(tmp_path / "collision" / "l1.obj")
    desc = ke.asset.load(_write(tmp_path, _arm_dict()))
    assert desc.body_names == ("base", "l1", "l2")
    assert [j.type.value for j in desc.joints] == ["fixed", "hinge", "slide"]
    assert desc.joints[1].range == (-1.0, 1.0) and desc.joints[1].effort_limit == 40
    assert os.fspath(desc.source).endswith("arm.superdex_bot")

"""Asset loaders against MuJoCo's own compiler, plus every loader error path on real or minimally broken
real files."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from conftest import MJCF_BROKEN, MJCF_COMPILABLE, data_file

import kangengine as ke
from kangengine.asset import GeomType, JointType, MJCFLoader, URDFLoader
from kangengine.errors import (
    DuplicateNameError,
    FileMissingError,
    FormatError,
    KangEngineError,
    TopologyError,
    UnsupportedJointError,
)


def _quat_to_matrix(q):
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


@pytest.mark.parametrize("rel", MJCF_COMPILABLE)
def test_mjcf_matches_mujoco_model(rel):
    path = data_file(rel)
    desc = MJCFLoader.load(path)
    m = mujoco.MjModel.from_xml_path(str(path))
    assert len(desc.bodies) == m.nbody - 1
    assert len(desc.joints) == m.njnt
    for i, b in enumerate(desc.bodies, start=1):
        if m.body(i).name:
            assert b.name == m.body(i).name
        assert b.parent == m.body_parentid[i] - 1
        np.testing.assert_allclose(b.pos, m.body_pos[i], atol=1e-12)
        np.testing.assert_allclose(b.quat_wxyz, m.body_quat[i], atol=1e-12)
        assert b.mass == pytest.approx(m.body_mass[i], abs=1e-12)
        np.testing.assert_allclose(b.com, m.body_ipos[i], atol=1e-12)
        # inertia tensor, rotated back to principal axes, equals MuJoCo's diagonal
        rot = _quat_to_matrix(m.body_iquat[i])
        np.testing.assert_allclose(rot.T @ b.inertia @ rot, np.diag(m.body_inertia[i]), atol=1e-10)
    types = {0: JointType.FREE, 1: JointType.BALL, 2: JointType.SLIDE, 3: JointType.HINGE}
    for j, jd in enumerate(desc.joints):
        assert jd.type is types[int(m.jnt_type[j])]
        assert jd.body == m.jnt_bodyid[j] - 1
        np.testing.assert_allclose(jd.anchor, m.jnt_pos[j], atol=1e-12)
        if jd.type in (JointType.HINGE, JointType.SLIDE):
            np.testing.assert_allclose(jd.axis, m.jnt_axis[j], atol=1e-12)
            assert jd.ref == pytest.approx(m.qpos0[m.jnt_qposadr[j]])
        assert (jd.range is not None) == (bool(m.jnt_limited[j]) and jd.type is not JointType.FREE)
        if jd.range is not None:
            np.testing.assert_allclose(jd.range, m.jnt_range[j], atol=1e-12)
        assert jd.armature == pytest.approx(m.dof_armature[m.jnt_dofadr[j]])
        assert jd.damping == pytest.approx(m.dof_damping[m.jnt_dofadr[j]])
    assert desc.source == str(path)


def test_mjcf_units_frames_and_classes():
    """Degrees in the file come out in radians; classes and defaults are applied (MuJoCo humanoid)."""
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    knee = desc.joints[desc.joint_index("knee_right")]
    # <default class="knee"><joint pos="0 0 .02" axis="0 -1 0" range="-160 2"/>
    np.testing.assert_allclose(knee.range, np.deg2rad([-160, 2]))
    np.testing.assert_allclose(knee.axis, [0, -1, 0])
    np.testing.assert_allclose(knee.anchor, [0, 0, 0.02])
    abdomen = desc.joints[desc.joint_index("abdomen_z")]
    assert abdomen.stiffness == pytest.approx(20)  # class joint_big_stiff
    assert abdomen.effort_limit == pytest.approx(40)  # motor gear 40, ctrlrange -1..1
    capsule = [g for g in desc.geoms if g.type is GeomType.CAPSULE]
    assert capsule, "fromto capsules are compiled to pos/quat/size"
    floor = [g for g in desc.geoms if g.body == -1 and g.type is GeomType.PLANE]
    assert len(floor) == 1


def test_mjcf_generated_names_for_unnamed_elements(tmp_path):
    xml = tmp_path / "unnamed.xml"
    xml.write_text("""<mujoco><worldbody><body pos="0 0 1"><freejoint/><geom size=".1"/>
      <body pos="0 0 .2"><joint type="hinge" axis="0 1 0"/><joint type="hinge" axis="1 0 0"/>
      <geom size=".05"/></body></body></worldbody></mujoco>""")
    desc = MJCFLoader.load(xml)
    assert desc.body_names == ("body1", "body2")
    assert desc.joint_names == ("body1_joint0", "body2_joint0", "body2_joint1")
    assert [g.name for g in desc.geoms] == ["body1_geom0", "body2_geom0"]
    # Stable: a second load gives the same names and the same signature.
    lay1 = ke.animation.ArticulationCoordinateLayout.from_data(data=desc)
    lay2 = ke.animation.ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(xml))
    assert lay1.model_signature == lay2.model_signature
    assert lay1.blocks[0].joint_name == "body1_joint0"


def test_mjcf_hinge_triplets_and_several_joints_per_body():
    desc = MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    hip = desc.bodies[desc.body_index("L_Hip")]
    assert [desc.joints[j].name for j in hip.joints] == ["L_Hip_x", "L_Hip_y", "L_Hip_z"]
    cmu = MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    counts = {len(b.joints) for b in cmu.bodies}
    assert counts >= {1, 2, 3}
    assert ("lclavicle", "rclavicle") in cmu.contact_exclusions


def test_mjcf_mesh_geoms_by_reference(tmp_path):
    """Mesh geoms keep their mesh name and file; MuJoCo needs the file to compile."""
    obj = tmp_path / "tet.obj"
    obj.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n")
    xml = tmp_path / "mesh.xml"
    xml.write_text("""<mujoco><asset><mesh name="tet" file="tet.obj"/></asset><worldbody>
      <body name="b"><joint type="hinge"/><geom type="mesh" mesh="tet"/></body></worldbody></mujoco>""")
    desc = MJCFLoader.load(xml)
    (g,) = desc.geoms
    assert g.type is GeomType.MESH and g.mesh == "tet" and g.mesh_file.endswith("tet.obj")


def test_bfs_order_parents_first_and_same_bodies():
    path = data_file("mjcf/dm_control/humanoid_CMU.xml")
    dfs, bfs = MJCFLoader.load(path, order="DFS"), MJCFLoader.load(path, order="BFS")
    assert sorted(dfs.body_names) == sorted(bfs.body_names)
    assert bfs.order == "BFS"
    depth = {}
    for i, b in enumerate(bfs.bodies):
        assert b.parent < i
        depth[i] = 0 if b.parent < 0 else depth[b.parent] + 1
    assert list(depth.values()) == sorted(depth.values())  # breadth first: depth never decreases
    for b in bfs.bodies:  # each body keeps its joints
        j_bfs = [bfs.joints[j].name for j in b.joints]
        j_dfs = [dfs.joints[j].name for j in dfs.bodies[dfs.body_index(b.name)].joints]
        assert j_bfs == j_dfs
    with pytest.raises(FormatError, match="order"):
        MJCFLoader.load(path, order="random")


def test_urdf_g1_matches_mujoco_compile():
    path = data_file("urdf/unitree/g1_29dof.nomesh.urdf")
    desc = URDFLoader.load(path)
    spec = mujoco.MjSpec.from_file(str(path))
    spec.compiler.fusestatic = False  # keep fixed links as bodies, like our loader
    m = spec.compile()
    assert desc.body_names == tuple(m.body(i).name for i in range(1, m.nbody))
    for i, b in enumerate(desc.bodies, start=1):
        np.testing.assert_allclose(b.pos, m.body_pos[i], atol=1e-12)
        assert abs(abs(np.dot(b.quat_wxyz, m.body_quat[i])) - 1) < 1e-12
        assert b.mass == pytest.approx(m.body_mass[i], abs=1e-9)
        if b.mass > 0:
            np.testing.assert_allclose(b.com, m.body_ipos[i], atol=1e-9)
            rot = _quat_to_matrix(m.body_iquat[i])
            np.testing.assert_allclose(rot.T @ b.inertia @ rot, np.diag(m.body_inertia[i]), atol=1e-9)
    hinges = [j for j in desc.joints if j.type is JointType.HINGE]
    assert len(hinges) == m.njnt == 29
    for j in hinges:
        mj = m.joint(j.name)
        np.testing.assert_allclose(j.axis, mj.axis, atol=1e-12)
        np.testing.assert_allclose(j.range, mj.range, atol=1e-12)
        assert j.effort_limit is not None and j.velocity_limit is not None
    assert sum(j.type is JointType.FIXED for j in desc.joints) == 10


def test_urdf_prismatic_continuous_and_strictness():
    path = data_file("urdf/isaacgymenvs/cartpole.urdf")
    with pytest.raises(FormatError, match="inertia"):
        URDFLoader.load(path)  # MuJoCo refuses it too: <inertial> without <inertia>
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_path(str(path))
    with pytest.warns(UserWarning, match="zero inertia"):
        desc = URDFLoader.load(path, strict=False)
    slide, hinge = desc.joints
    assert slide.type is JointType.SLIDE and slide.range == (-4.0, 4.0) and slide.effort_limit == 1000
    assert hinge.type is JointType.HINGE and hinge.range is None and hinge.velocity_limit == 8
    np.testing.assert_allclose(desc.bodies[desc.body_index("pole")].pos, [0.12, 0, 0])


def _urdf(tmp_path, body: str, name="r.urdf"):
    p = tmp_path / name
    p.write_text(f'<?xml version="1.0"?>\n<robot name="r">{body}</robot>')
    return p


LINK = (
    '<link name="{0}"><inertial><mass value="1"/>'
    '<inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial></link>'
)


def _joint(name, parent, child, jtype="revolute", extra='<limit lower="-1" upper="1" effort="5" velocity="3"/>'):
    return (
        f'<joint name="{name}" type="{jtype}"><parent link="{parent}"/><child link="{child}"/>'
        f'<axis xyz="0 0 1"/>{extra}</joint>'
    )


def test_urdf_world_link_floating_and_mimic(tmp_path):
    body = (
        '<link name="world"/>'
        + LINK.format("base")
        + LINK.format("a")
        + LINK.format("b")
        + _joint("float", "world", "base", "floating", "")
        + _joint("ja", "base", "a")
        + _joint(
            "jb",
            "base",
            "b",
            extra='<limit lower="-1" upper="1" effort="5" velocity="3"/>'
            '<mimic joint="ja" multiplier="2" offset="0.1"/>',
        )
    )
    desc = URDFLoader.load(_urdf(tmp_path, body))
    assert desc.body_names == ("base", "a", "b")
    assert desc.joints[0].type is JointType.FREE
    assert desc.mimics[0].joint == "jb" and desc.mimics[0].multiplier == 2 and desc.mimics[0].offset == 0.1
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    assert layout.blocks[0].joint_name == "float" and layout.nq == 9


def test_urdf_free_root_added_when_asked():
    desc = URDFLoader.load(data_file("urdf/unitree/g1_29dof.nomesh.urdf"))
    free = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    fixed = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    assert free.blocks[0].joint_name == "pelvis_free" and free.blocks[0].joint_type is JointType.FREE
    assert (free.nq, free.nv) == (fixed.nq + 7, fixed.nv + 6) == (36, 35)


# -- error paths --------------------------------------------------------------------------------------


def test_missing_file_errors(tmp_path):
    for loader, name in ((MJCFLoader, "nope.xml"), (URDFLoader, "nope.urdf")):
        with pytest.raises(FileMissingError) as e:
            loader.load(tmp_path / name)
        assert name in str(e.value)
        assert isinstance(e.value, KangEngineError)


def test_malformed_xml_is_a_format_error(tmp_path):
    for rel, loader in (("mjcf/mujoco/humanoid.xml", MJCFLoader), ("urdf/unitree/g1_29dof.nomesh.urdf", URDFLoader)):
        text = data_file(rel).read_text()
        broken = tmp_path / ("broken" + data_file(rel).suffix)
        broken.write_text(text[: len(text) // 2])  # truncated real file
        with pytest.raises(FormatError) as e:
            loader.load(broken)
        assert str(broken) in str(e.value)


@pytest.mark.parametrize("rel", MJCF_BROKEN)
def test_mjcf_that_mujoco_refuses(rel):
    with pytest.raises(FormatError) as e:
        MJCFLoader.load(data_file(rel))
    assert rel.split("/")[-1] in str(e.value)


def test_urdf_entities_are_refused(tmp_path):
    p = tmp_path / "lol.urdf"
    p.write_text(
        '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
        '<robot name="&b;"><link name="x"/></robot>'
    )
    with pytest.raises(FormatError, match="DTD|entit|unsafe"):
        URDFLoader.load(p)


def test_urdf_unsupported_joint(tmp_path):
    text = data_file("urdf/isaacgymenvs/cartpole.urdf").read_text().replace('type="continuous"', 'type="planar"')
    p = tmp_path / "planar.urdf"
    p.write_text(text)
    with pytest.raises(UnsupportedJointError) as e:
        URDFLoader.load(p, strict=False)
    assert "planar" in str(e.value) and "cart_to_pole" in str(e.value) and "planar.urdf" in str(e.value)


def test_urdf_cycle_and_two_roots(tmp_path):
    loop = (
        LINK.format("a")
        + LINK.format("b")
        + LINK.format("c")
        + _joint("ab", "a", "b")
        + _joint("bc", "b", "c")
        + _joint("ca", "c", "a")
    )
    with pytest.raises(TopologyError, match="root"):
        URDFLoader.load(_urdf(tmp_path, loop))
    cyc = (
        LINK.format("r")
        + LINK.format("a")
        + LINK.format("b")
        + _joint("ra", "r", "a")
        + _joint("ab", "a", "b")
        + _joint("ba", "b", "a")
    )
    with pytest.raises(TopologyError, match="two parent"):
        URDFLoader.load(_urdf(tmp_path, cyc, "cyc.urdf"))
    # a true cycle with no second parent: b -> c -> b while r is the root
    cyc2 = LINK.format("r") + LINK.format("b") + LINK.format("c") + _joint("bc", "b", "c") + _joint("cb", "c", "b")
    with pytest.raises(TopologyError, match="cycle|not connected|root"):
        URDFLoader.load(_urdf(tmp_path, cyc2, "cyc2.urdf"))


def test_duplicate_names(tmp_path):
    dup = LINK.format("a") + LINK.format("a")
    with pytest.raises(DuplicateNameError, match="'a'"):
        URDFLoader.load(_urdf(tmp_path, dup))
    xml = tmp_path / "dup.xml"
    xml.write_text(
        '<mujoco><worldbody><body name="x"><joint name="j"/><geom size="1"/>'
        '<body name="y"><joint name="k"/><geom size="1"/></body></body></worldbody></mujoco>'
    )
    desc = MJCFLoader.load(xml)
    import dataclasses

    with pytest.raises(DuplicateNameError, match="'x'"):
        dataclasses.replace(desc, bodies=(desc.bodies[0], dataclasses.replace(desc.bodies[1], name="x")))
    slash = tmp_path / "slash.xml"
    slash.write_text('<mujoco><worldbody><body name="a/b"><joint/><geom size="1"/></body></worldbody></mujoco>')
    with pytest.raises(DuplicateNameError, match="reserved"):
        MJCFLoader.load(slash)


def test_urdf_non_numeric_and_nan(tmp_path):
    bad = LINK.format("a") + LINK.format("b") + _joint("ab", "a", "b", extra='<limit lower="x" upper="1"/>')
    with pytest.raises(FormatError, match="lower") as e:
        URDFLoader.load(_urdf(tmp_path, bad))
    assert "ab" in str(e.value)
    nan = LINK.format("a") + LINK.format("b") + _joint("ab", "a", "b", extra='<limit lower="nan" upper="1"/>')
    with pytest.raises(FormatError, match="finite"):
        URDFLoader.load(_urdf(tmp_path, nan, "nan.urdf"))


def test_several_roots_in_mjcf(tmp_path):
    xml = tmp_path / "two.xml"
    xml.write_text(
        '<mujoco><worldbody><body name="a"><joint/><geom size="1"/></body>'
        '<body name="b"><joint/><geom size="1"/></body></worldbody></mujoco>'
    )
    with pytest.raises(TopologyError, match="2 child bodies"):
        MJCFLoader.load(xml)


def test_load_by_extension(tmp_path):
    assert ke.asset.load(data_file("mjcf/dm_control/cartpole.xml")).name == "cart-pole"
    with pytest.raises(FormatError, match="unknown articulation file type"):
        ke.asset.load(tmp_path / "x.obj")


# -- issue 17: non-finite and physically impossible values are refused -----------------------------------

_MJCF_ONE_BODY = (
    '<mujoco model="m"><option gravity="{gravity}"/><worldbody><body name="{name}" pos="{pos}">'
    '<joint name="hinge" type="hinge" axis="{axis}" range="{range}" limited="true"/>'
    '<geom name="ball" type="sphere" size="0.1"/>'
    '<inertial pos="0 0 0" mass="1" fullinertia="{inertia}"/></body></worldbody></mujoco>'
)
_MJCF_OK = dict(gravity="0 0 -9.81", name="b", pos="0 0 1", axis="0 0 1", range="-1 1", inertia="0.1 0.1 0.1 0 0 0")


def _mjcf(tmp_path, **kw) -> object:
    p = tmp_path / "m.xml"
    p.write_text(_MJCF_ONE_BODY.format(**{**_MJCF_OK, **kw}))
    return p


def test_mjcf_one_body_template_loads(tmp_path):
    desc = MJCFLoader.load(_mjcf(tmp_path))
    assert desc.body_names == ("b",) and desc.joints[0].range == pytest.approx((-np.pi / 180, np.pi / 180))


@pytest.mark.parametrize(
    ("field", "value", "item"),
    [
        ("pos", "nan 0 1", "body 'b' pos"),
        ("pos", "0 inf 1", "body 'b' pos"),
        ("axis", "nan 0 1", "joint 'hinge' axis"),
        ("range", "-inf 1", "joint 'hinge' range"),
        ("range", "nan 1", "joint 'hinge' range"),
        ("gravity", "0 0 nan", "option gravity"),
        ("gravity", "0 -inf 0", "option gravity"),
    ],
)
def test_mjcf_non_finite_values_are_refused(tmp_path, field, value, item):
    # MuJoCo itself compiles all of these (printing only "XML contains a 'NaN'").
    path = _mjcf(tmp_path, **{field: value})
    m = mujoco.MjSpec.from_file(str(path)).compile()
    assert not np.isfinite(
        np.concatenate([m.body_pos.ravel(), m.jnt_axis.ravel(), m.jnt_range.ravel(), m.opt.gravity])
    ).all()
    with pytest.raises(FormatError, match="finite") as e:
        MJCFLoader.load(path)
    assert str(path) in str(e.value) and e.value.item == item


@pytest.mark.parametrize(
    ("inertial", "item"),
    [('mass="1" diaginertia="inf inf inf"', "body 'b' inertia"), ('mass="inf" diaginertia="1 1 1"', "body 'b' mass")],
)
def test_mjcf_non_finite_inertia_and_mass_are_refused(tmp_path, inertial, item):
    path = tmp_path / "inertia.xml"
    path.write_text(
        '<mujoco><worldbody><body name="b"><joint type="hinge"/><geom type="sphere" size="0.1"/>'
        f'<inertial pos="0 0 0" {inertial}/></body></worldbody></mujoco>'
    )
    m = mujoco.MjSpec.from_file(str(path)).compile()  # MuJoCo compiles it
    assert not (np.isfinite(m.body_inertia).all() and np.isfinite(m.body_mass).all())
    with pytest.raises(FormatError, match="finite") as e:
        MJCFLoader.load(path)
    assert e.value.item == item


def test_mjcf_invalid_utf8_name_is_a_format_error(tmp_path):
    path = tmp_path / "bad_name.xml"
    text = _MJCF_ONE_BODY.format(**{**_MJCF_OK, "name": "leg\udcff"})
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(UnicodeDecodeError):  # what MuJoCo's own accessor does with it
        _ = mujoco.MjSpec.from_file(str(path)).compile().body(1).name
    with pytest.raises(FormatError, match="not valid UTF-8") as e:
        MJCFLoader.load(path)
    assert str(path) in str(e.value) and e.value.item == "body 1"


def _inertial_link(name, inertia: str) -> str:
    return f'<link name="{name}"><inertial><mass value="1"/><inertia {inertia}/></inertial></link>'


@pytest.mark.parametrize(
    ("inertia", "match"),
    [
        # the tensor whose mass matrix had eigenvalue -0.9 in the issue
        ('ixx="-0.9" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"', "positive semi-definite"),
        # diagonal positive, but an off-diagonal term makes one principal moment negative (eig = 0.1 -/+ 1)
        ('ixx="0.1" iyy="0.1" izz="0.2" ixy="1" ixz="0" iyz="0"', "positive semi-definite"),
        # positive definite, but 0.1 + 0.1 < 1: no rigid body has these moments
        ('ixx="0.1" iyy="0.1" izz="1" ixy="0" ixz="0" iyz="0"', "triangle inequality"),
    ],
)
def test_urdf_impossible_inertia_is_refused(tmp_path, inertia, match):
    moments = None
    vals = dict(kv.split("=") for kv in inertia.split())
    v = {k: float(x.strip('"')) for k, x in vals.items()}
    local = np.array([[v["ixx"], v["ixy"], v["ixz"]], [v["ixy"], v["iyy"], v["iyz"]], [v["ixz"], v["iyz"], v["izz"]]])
    moments = np.linalg.eigvalsh(local)  # numpy's independent view of the same tensor
    assert moments[0] < 0 or moments[0] + moments[1] < moments[2]
    body = LINK.format("a") + _inertial_link("b", inertia) + _joint("ab", "a", "b")
    with pytest.raises(FormatError, match=match) as e:
        URDFLoader.load(_urdf(tmp_path, body))
    assert e.value.item == "link 'b'/inertial/inertia"


def test_urdf_valid_inertia_at_the_triangle_bound_loads(tmp_path):
    # a thin rod about its axis: I1 + I2 == I3 exactly (a flat plate); allowed
    body = (
        LINK.format("a")
        + _inertial_link("b", 'ixx="1" iyy="1" izz="2" ixy="0" ixz="0" iyz="0"')
        + _joint("ab", "a", "b")
    )
    desc = URDFLoader.load(_urdf(tmp_path, body))
    np.testing.assert_allclose(np.linalg.eigvalsh(desc.bodies[1].inertia), [1, 1, 2])


@pytest.mark.parametrize(
    "geometry",
    [
        '<sphere radius="-0.1"/>',
        '<cylinder radius="-0.1" length="1"/>',
        '<capsule radius="0.1" length="-1"/>',
        '<box size="0.1 -0.2 0.3"/>',
    ],
)
def test_urdf_negative_geometry_sizes_are_refused(tmp_path, geometry):
    link = (
        '<link name="b"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/>'
        f"</inertial><collision><geometry>{geometry}</geometry></collision></link>"
    )
    body = LINK.format("a") + link + _joint("ab", "a", "b")
    with pytest.raises(FormatError, match=">= 0") as e:
        URDFLoader.load(_urdf(tmp_path, body))
    assert "link 'b'/collision" in e.value.item


def test_urdf_mimic_of_an_undefined_joint_is_refused(tmp_path):
    body = (
        LINK.format("a")
        + LINK.format("b")
        + _joint("ab", "a", "b", extra='<limit lower="-1" upper="1"/><mimic joint="no_such_joint"/>')
    )
    with pytest.raises(TopologyError, match="no_such_joint.*not defined; joints are: ab") as e:
        URDFLoader.load(_urdf(tmp_path, body))
    assert e.value.item == "joint 'ab'/mimic"


@pytest.mark.parametrize(
    "where",
    [
        '<origin xyz="0 nan 0"/>',
        '<origin rpy="0 0 inf"/>',
        '<origin xyz="1e400 0 0"/>',  # overflows to inf when parsed
    ],
)
def test_urdf_non_finite_origin_is_refused(tmp_path, where):
    joint = (
        f'<joint name="ab" type="revolute"><parent link="a"/><child link="b"/>{where}'
        '<axis xyz="0 0 1"/><limit lower="-1" upper="1"/></joint>'
    )
    with pytest.raises(FormatError, match="not finite") as e:
        URDFLoader.load(_urdf(tmp_path, LINK.format("a") + LINK.format("b") + joint))
    assert e.value.item == "joint 'ab'/origin"

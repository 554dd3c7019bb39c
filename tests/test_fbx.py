"""FBX reading (``kangengine.io.load_fbx``, pyassimp + Debian libassimp) on the shared CMU and Blender files.

Oracles: the raw ``Lcl Translation``/``Lcl Scaling`` properties read by a minimal independent FBX binary
reader written here (zlib + struct, no assimp), poselib's ``cmu_tpose.npy`` (names, tree, bone
directions), and world positions composed independently from pyassimp's own ``load()`` with scipy's
Slerp for the keys.
"""

from __future__ import annotations

import re
import struct
import warnings
import zlib

import numpy as np
import pytest
from conftest import data_file
from scipy.spatial.transform import Rotation, Slerp

import kangengine as ke
from kangengine import conventions as axes
from kangengine.cli import main
from kangengine.errors import FileMissingError, FormatError, UnknownNameError
from kangengine.io import load_fbx

pytest.importorskip("pyassimp", reason="pyassimp (fbx extra) and Debian libassimp5 are needed to read FBX")

# Most tests read the CMU file with its declared (wrong) unit on purpose; the warning is tested once below.
pytestmark = pytest.mark.filterwarnings("ignore::kangengine.errors.UnitsWarning")

CMU = "fbx/07_01_cmu.fbx"
BLENDER = ["fbx/animation_with_skeleton.fbx", "fbx/huesitos.fbx"]


# -- a minimal FBX 7.x binary reader (the oracle for rest transforms) ------------------------------------------


def _read_fbx_nodes(path):
    """Top-level node records of a binary FBX file: (name, properties, children) tuples."""
    data = path.read_bytes()
    assert data[:21] == b"Kaydara FBX Binary  \x00"
    version = struct.unpack_from("<I", data, 23)[0]
    wide = version >= 7500
    head = struct.Struct("<QQQ" if wide else "<III")

    def prop(pos):
        t = chr(data[pos])
        pos += 1
        scalars = {"Y": "<h", "C": "<?", "I": "<i", "F": "<f", "D": "<d", "L": "<q"}
        if t in scalars:
            fmt = scalars[t]
            return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)
        if t in "fdlib":
            n, enc, clen = struct.unpack_from("<III", data, pos)
            raw = data[pos + 12 : pos + 12 + clen]
            raw = zlib.decompress(raw) if enc == 1 else raw
            dt = {"f": "<f4", "d": "<f8", "l": "<i8", "i": "<i4", "b": "?"}[t]
            return np.frombuffer(raw, dtype=dt, count=n), pos + 12 + clen
        if t in "SR":
            n = struct.unpack_from("<I", data, pos)[0]
            return data[pos + 4 : pos + 4 + n], pos + 4 + n
        raise AssertionError(f"unknown FBX property type {t!r}")

    def node(pos):
        end, nprops, _plen = head.unpack_from(data, pos)
        pos += head.size
        if end == 0:
            return None, pos
        name_len = data[pos]
        name = data[pos + 1 : pos + 1 + name_len].decode()
        pos += 1 + name_len
        props = []
        for _ in range(nprops):
            v, pos = prop(pos)
            props.append(v)
        children = []
        while pos < end:
            child, pos = node(pos)
            if child is None:
                break
            children.append(child)
        return (name, props, children), end

    nodes, pos = [], 27
    while pos < len(data) - head.size:
        n, pos = node(pos)
        if n is None:
            break
        nodes.append(n)
    return nodes


def fbx_model_properties(path) -> tuple[dict[str, dict[str, tuple]], dict[str, float]]:
    """{model name: {property name: values}} for every Model, and the GlobalSettings properties."""

    def props70(children):
        out = {}
        for name, _props, grandchildren in children:
            if name == "Properties70":
                for pname, pprops, _ in grandchildren:
                    if pname == "P":
                        out[pprops[0].decode()] = tuple(pprops[4:])
        return out

    models, settings = {}, {}
    for name, _, children in _read_fbx_nodes(path):
        if name == "Objects":
            for cname, cprops, cchildren in children:
                if cname == "Model":
                    models[cprops[1].split(b"\x00\x01")[0].decode()] = props70(cchildren)
        if name == "GlobalSettings":
            settings = props70(children)
    return models, settings


# -- tests ---------------------------------------------------------------------------------------------------


def test_cmu_fbx_frames_fps_and_tree_match_poselib_tpose():
    from kangengine.datasets.arrays import load_poselib

    m = load_fbx(data_file(CMU), dtype=np.float64)
    assert m.num_frames == 317 and m.fps == 120.0  # 317 keys at 120 ticks/s (data/README.md)
    md = m.metadata
    assert md["take"] == "07_01|07_01" and md["ticks_per_second"] == 120.0 and md["key_fps"] == 120.0
    assert md["root"] == "Hips" and md["folded_ancestors"] == ["RootNode", "07_01"] and md["up_axis"] == "y"
    tpose = load_poselib(data_file("motions/amp_poselib/cmu_tpose.npy"))
    assert m.tree.node_names == tpose.tree.node_names  # the 38 nodes, same order
    np.testing.assert_array_equal(m.tree.parent_indices, tpose.tree.parent_indices)
    # rest translations in the nodes' own frames (back to the file's Y-up axes): every bone along +Y,
    # exactly as in poselib's T-pose
    ours = axes.vec_yup_from_zup(m.tree.local_translation[1:])
    ref = np.asarray(tpose.tree.local_translation[1:], dtype=np.float64)
    bones = np.linalg.norm(ref, axis=1) > 1e-3
    assert ((np.linalg.norm(ours, axis=1) > 1e-3) == bones).all()
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)
    np.testing.assert_allclose(unit(ours[bones]), unit(ref[bones]), atol=1e-4)


def test_cmu_fbx_rest_translations_equal_the_files_lcl_translation():
    """The rest offsets are the file's own ``Lcl Translation`` values times the ancestors' ``Lcl Scaling`` and
    ``UnitScaleFactor`` cm, read here without assimp."""
    path = data_file(CMU)
    models, settings = fbx_model_properties(path)
    m = load_fbx(path, units="file", dtype=np.float64)  # the declared unit, as the file says
    metres_per_bone_unit = models["07_01"]["Lcl Scaling"][0] * settings["UnitScaleFactor"][0] / 100.0
    assert metres_per_bone_unit == pytest.approx(1.0, rel=1e-6)  # Blender wrote one mocap unit as one metre
    for i, name in enumerate(m.tree.node_names[1:], start=1):
        raw = np.array(models[name].get("Lcl Translation", (0.0, 0.0, 0.0)))
        np.testing.assert_allclose(
            axes.vec_yup_from_zup(m.tree.local_translation[i]), raw * metres_per_bone_unit, atol=1e-5, err_msg=name
        )


def test_cmu_tpose_is_subject_01_not_07():
    """Why the T-pose's bone lengths differ from the 07_01 FBX's: poselib's ``cmu_tpose.npy`` has the lengths of
    CMU subject 01 (they equal the 01_01 BVH's OFFSETs), while 07_01 is subject 07."""
    from kangengine.datasets.arrays import load_poselib

    tpose = load_poselib(data_file("motions/amp_poselib/cmu_tpose.npy"))
    bvh = load_bvh_raw("bvh/cmu/01_01_cgspeed_hops_long.bvh")
    fbx = load_fbx(data_file(CMU), dtype=np.float64)
    t_len = np.linalg.norm(tpose.tree.local_translation[1:], axis=1)
    np.testing.assert_allclose(np.linalg.norm(bvh.tree.local_translation[1:], axis=1), t_len, atol=1e-4)
    f_len = np.linalg.norm(fbx.tree.local_translation[1:], axis=1)
    assert np.abs(f_len - t_len).max() > 0.2


def load_bvh_raw(rel):
    return ke.io.load_bvh(data_file(rel), up_axis="y", scale=1.0, dtype=np.float64)


def _pyassimp_world_positions(path, frames_ticks):
    """World positions (scene units, file axes) of every node at the given tick times, composed from pyassimp's
    own ``load()`` (its Python objects) with numpy matrices and scipy's Slerp."""
    import pyassimp

    with pyassimp.load(str(path)) as scene:
        anim = scene.animations[0]
        chans = {c.nodename.data.decode(): c for c in anim.channels}
        out = {}

        def local(node, t):
            c = chans.get(node.name)
            if c is None:
                return np.asarray(node.transformation, dtype=np.float64)
            tp = np.array([k.time for k in c.positionkeys])
            pv = np.array([k.value for k in c.positionkeys], dtype=np.float64)
            tr = np.array([k.time for k in c.rotationkeys])
            rv = np.array([k.value for k in c.rotationkeys], dtype=np.float64)  # w, x, y, z
            ts = np.array([k.time for k in c.scalingkeys])
            sv = np.array([k.value for k in c.scalingkeys], dtype=np.float64)
            pos = [np.interp(t, tp, pv[:, k]) for k in range(3)]
            sc = [np.interp(t, ts, sv[:, k]) for k in range(3)]
            rots = Rotation.from_quat(rv[:, [1, 2, 3, 0]])
            rot = rots[0] if len(tr) == 1 else Slerp(tr, rots)(np.clip(t, tr[0], tr[-1]))
            mat = np.eye(4)
            mat[:3, :3] = rot.as_matrix() * np.array(sc)
            mat[:3, 3] = pos
            return mat

        for t in frames_ticks:
            row = {}
            stack = [(scene.rootnode, np.eye(4))]
            while stack:
                node, parent = stack.pop()
                world = parent @ local(node, t)
                row[node.name] = world[:3, 3]
                stack.extend((c, world) for c in node.children)
            out[t] = row
    return out


def test_cmu_fbx_world_positions_equal_pyassimp_composition():
    path = data_file(CMU)
    m = load_fbx(path, dtype=np.float64)
    frames = [0, 57, 158, 271, 316]
    ref = _pyassimp_world_positions(path, [float(f) for f in frames])  # one tick per frame at 120 ticks/s
    gp = m.global_translation
    s = m.metadata["scale"]
    for f in frames:
        for i, name in enumerate(m.tree.node_names):
            np.testing.assert_allclose(
                gp[f, i], axes.vec_zup_from_yup(ref[float(f)][name]) * s, atol=1e-5, err_msg=f"frame {f} {name}"
            )


def test_cmu_fbx_in_metres_with_the_cmu_unit():
    with pytest.warns(ke.errors.UnitsWarning, match=r"25\.5 m tall.*BVH_LENGTH_UNITS\['cmu'\]"):
        load_fbx(data_file(CMU), units="file")  # the file declares centimetres for CMU length units
    with warnings.catch_warnings():
        warnings.simplefilter("error", ke.errors.UnitsWarning)
        m = load_fbx(data_file(CMU), scale=ke.io.BVH_LENGTH_UNITS["cmu"])
    hips = m.root_translation[:, 2]
    assert 0.8 < float(hips.mean()) < 1.0  # hips about 0.9 m above the floor, Z up
    feet = m.global_translation[:, [m.tree.index("LeftToeBase"), m.tree.index("RightToeBase")], 2]
    assert -0.1 < float(feet.min()) < 0.1
    step = np.diff(m.root_translation[:, :2], axis=0)
    speed = np.linalg.norm(step, axis=1).mean() * m.fps
    assert 0.5 < speed < 2.0  # a walk, in m/s


def test_resampling_and_take_selection():
    path = data_file(CMU)
    full = load_fbx(path, dtype=np.float64)
    by_name = load_fbx(path, take="07_01|07_01", fps=30, dtype=np.float64)
    assert by_name.fps == 30 and by_name.num_frames == 80  # 316 ticks / 120 * 30 + 1
    np.testing.assert_allclose(by_name.global_translation, full.global_translation[::4], atol=1e-9)
    assert load_fbx(path, take=0, fps=30).num_frames == 80
    with pytest.raises(UnknownNameError, match="07_01"):
        load_fbx(path, take="walk")
    with pytest.raises(UnknownNameError):
        load_fbx(path, take=3)
    rooted = load_fbx(path, root="07_01")
    assert rooted.tree.node_names[:2] == ("07_01", "Hips") and rooted.tree.num_nodes == 39
    np.testing.assert_allclose(rooted.global_translation[:, 1:], full.global_translation, atol=1e-3)
    with pytest.raises(UnknownNameError, match="Hips"):
        load_fbx(path, root="Pelvis")


@pytest.mark.parametrize(
    ("rel", "fps", "frames", "root", "nodes"),
    [("fbx/animation_with_skeleton.fbx", 24.0, 21, "Armature", 17), ("fbx/huesitos.fbx", 25.0, 40, "Bone", 11)],
    ids=["animation_with_skeleton", "huesitos"],
)
def test_blender_fbx_with_skinned_mesh(rel, fps, frames, root, nodes):
    path = data_file(rel)
    m = load_fbx(path, dtype=np.float64)
    md = m.metadata
    assert m.fps == fps and m.num_frames == frames and md["root"] == root and m.tree.num_nodes == nodes
    assert not any(n in m.tree.node_names for n in ("Cube", "Cylinder", "Camera", "Light", "Lamp"))
    models, settings = fbx_model_properties(path)
    bone_unit = models["Armature"]["Lcl Scaling"][0] * settings["UnitScaleFactor"][0] / 100.0
    for i, name in enumerate(m.tree.node_names[1:], start=1):
        raw = np.array(models[name].get("Lcl Translation", (0.0, 0.0, 0.0)))
        np.testing.assert_allclose(
            axes.vec_yup_from_zup(m.tree.local_translation[i]), raw * bone_unit, atol=1e-5, err_msg=name
        )
    assert np.ptp(m.local_rotation, axis=0).max() > 1e-3  # the bones do move


def test_load_motion_reads_fbx():
    m = ke.pipelines.load_motion(data_file("fbx/huesitos.fbx"), fps=50)
    assert m.metadata["source_format"] == "fbx" and m.fps == 50 and m.num_frames == 79


def test_bad_fbx_files(tmp_path):
    cut = tmp_path / "truncated.fbx"
    cut.write_bytes(data_file(CMU).read_bytes()[:100_000])
    with pytest.raises(FormatError, match=r"truncated.fbx: byte \d+: node 'Objects': .* the file is truncated"):
        load_fbx(cut)
    junk = tmp_path / "junk.fbx"
    junk.write_text("not an fbx file at all\n")
    with pytest.raises(FormatError, match="junk.fbx"):
        load_fbx(junk)
    with pytest.raises(FileMissingError):
        load_fbx(tmp_path / "missing.fbx")
    static = tmp_path / "static.obj"  # a scene assimp reads, with no animation
    static.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(FormatError, match="static.obj: animation: the file has no animation take"):
        load_fbx(static)
    with pytest.raises(FormatError, match="up_axis"):
        load_fbx(data_file(CMU), up_axis="x")
    with pytest.raises(FormatError, match="scale"):
        load_fbx(data_file(CMU), scale=-1)


def test_fbx_to_bvh_round_trip(tmp_path):
    m = load_fbx(data_file(CMU), scale=ke.io.BVH_LENGTH_UNITS["cmu"], dtype=np.float64)
    assert m.local_translation is None  # the FBX keys its bones' translations, but they never move
    out = ke.io.save_bvh(tmp_path / "07_01.bvh", m, units="cmu")
    back = ke.io.load_bvh(out, dtype=np.float64)
    assert back.metadata["source_units"] == "cmu" and back.tree.node_names == m.tree.node_names
    assert back.num_frames == 317 and back.fps == pytest.approx(120.0)
    np.testing.assert_allclose(back.global_translation, m.global_translation, atol=1e-4)


def test_take_names_and_missing_pyassimp_message(monkeypatch):
    import sys

    from kangengine.errors import MissingDependencyError
    from kangengine.io import fbx

    assert ke.io.fbx_take_names(data_file(CMU)) == ["07_01|07_01"]
    monkeypatch.setattr(fbx, "_LIB", None)
    monkeypatch.setitem(sys.modules, "pyassimp", None)  # as if the fbx extra were not installed
    with pytest.raises(MissingDependencyError, match=r"pip install -e \"\.\[fbx\]\""):
        load_fbx(data_file(CMU))


# -- issue 17: implausible units corrected with a reason; headers and counts capped by the file's size ------


@pytest.mark.parametrize(
    ("rel", "travel_m"),
    [("fbx/07_01_cmu.fbx", 3.58), ("fbx/08_02_cmu.fbx", 3.95), ("fbx/01_01_cmu.fbx", 3.15)],
)
def test_cmu_fbx_units_are_corrected_with_a_recorded_reason(rel, travel_m):
    path = data_file(rel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ke.errors.UnitsWarning)  # corrected, not merely warned about
        auto = load_fbx(path, dtype=np.float64)
        given = load_fbx(path, scale=ke.io.BVH_LENGTH_UNITS["cmu"], dtype=np.float64)
    declared = load_fbx(path, units="file", dtype=np.float64)
    fix = auto.metadata["units_corrected"]
    assert fix["unit"] == "cmu" and fix["multiplier"] == ke.io.BVH_LENGTH_UNITS["cmu"]
    assert fix["height_declared_m"] > 20 and "implausible" in fix["reason"]
    assert given.metadata["units_corrected"] is None and declared.metadata["units_corrected"] is None
    assert 1.3 < auto.metadata["height_m"] < 1.6  # the CMU subjects, standing (root left out)
    # the corrected clip is the one read with the CMU unit given explicitly
    np.testing.assert_allclose(auto.global_translation, given.global_translation, atol=1e-9)
    np.testing.assert_allclose(auto.global_translation, declared.global_translation * fix["multiplier"], atol=1e-9)
    root = auto.root_translation[:, :2]
    assert np.linalg.norm(root[-1] - root[0]) == pytest.approx(travel_m, abs=0.01)  # was 63.5 m for 07_01
    assert np.linalg.norm(declared.root_translation[-1, :2] - declared.root_translation[0, :2]) > 50


@pytest.mark.parametrize("rel", ["fbx/animation_with_skeleton.fbx", "fbx/huesitos.fbx"])
def test_blender_fbx_units_are_left_as_declared(rel):
    auto = load_fbx(data_file(rel), dtype=np.float64)
    declared = load_fbx(data_file(rel), units="file", dtype=np.float64)
    assert auto.metadata["units_corrected"] is None and auto.metadata["scale"] == declared.metadata["scale"] == 0.01
    np.testing.assert_array_equal(auto.global_translation, declared.global_translation)


def test_convert_cmu_fbx_with_its_documented_config(tmp_path):
    """The issue's command: the converted AMP clip's root travels the walk's 3.6 m, not 63.5 m."""
    out = tmp_path / "out"
    rc = main(
        ["convert", str(data_file("mjcf/protomotions/amp_humanoid.xml")), str(data_file(CMU)), "--config",
         "cmu_to_amp", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    (npz,) = sorted(out.rglob("*.npz"))
    q = np.load(npz)["q"]
    assert np.linalg.norm(q[-1, :2] - q[0, :2]) == pytest.approx(3.6, abs=0.3)


def _fbx_array_headers(data: bytes):
    """(offset of the array header, type code, count, encoding, stored bytes) of every array property in a binary
    FBX 7.4 file, found by walking the records (independent of the reader's own check)."""
    out = []

    def walk(pos, end):
        while pos < end:
            eo, n_props, props_len = struct.unpack_from("<III", data, pos)
            name_len = data[pos + 12]
            if eo == 0:
                return
            p = pos + 13 + name_len
            for _ in range(n_props):
                code = chr(data[p])
                if code in "fdlib":
                    n, enc, stored = struct.unpack_from("<III", data, p + 1)
                    out.append((p + 1, code, n, enc, stored))
                    p += 13 + stored
                elif code in "SR":
                    p += 5 + struct.unpack_from("<I", data, p + 1)[0]
                else:
                    p += 1 + {"Y": 2, "C": 1, "I": 4, "F": 4, "D": 8, "L": 8}[code]
            if p < eo:
                walk(p, eo)
            pos = eo

    walk(27, len(data))
    return out


@pytest.mark.parametrize("encoding", [0, 1], ids=["raw", "zlib"])
def test_corrupted_array_count_is_refused_before_assimp_allocates(tmp_path, encoding):
    import tracemalloc

    data = bytearray(data_file(CMU).read_bytes())
    off, code, n, enc, stored = next(h for h in _fbx_array_headers(bytes(data)) if h[3] == encoding and h[2] > 4)
    struct.pack_into("<I", data, off, 0x7FFFFFF0)  # the count claims 2^31 values: 8-17 GB
    bad = tmp_path / "count.fbx"
    bad.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="claims 2147483632 values") as e:
            load_fbx(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(bad) in str(e.value) and e.value.item.startswith("byte ")
    assert peak < 20 * len(data)


def test_corrupted_key_time_is_refused_not_resampled_into_gigabytes(tmp_path):
    import tracemalloc

    data = bytearray(data_file(CMU).read_bytes())
    # the last key time (int64 ticks) of an uncompressed two-key curve pushed 1e6 times further: the take would
    # span 3e8 frames to resample (gigabytes) from 317 keys
    off, code, n, enc, stored = next(h for h in _fbx_array_headers(bytes(data)) if h[1] == "l" and h[3] == 0)
    ticks = np.frombuffer(bytes(data[off + 12 : off + 12 + stored]), dtype="<i8").copy()
    assert n == 2 and ticks[-1] > 0
    ticks[-1] *= 10**6
    data[off + 12 : off + 12 + stored] = ticks.tobytes()
    bad = tmp_path / "keytime.fbx"
    bad.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        # either refused naming the span, or read without resampling the corrupt span (the curve may be one
        # libassimp does not use): never gigabytes
        try:
            motion = load_fbx(bad)
        except FormatError as exc:
            assert str(bad) in str(exc)
            assert re.search(r"spans .* frames .* at most 317 keys; expected at most 5072", str(exc))
        else:
            assert motion.num_frames <= 5072
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(data)

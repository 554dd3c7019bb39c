"""BVH reading and writing (``kangengine.io.load_bvh`` / ``save_bvh``), checked against ``bvhio``.

Oracles: bvhio's world joint positions (float32 glm maths, file units, Y up) for every shared BVH file,
scipy's Euler angles for every rotation order, round trips through our writer and through bvhio.
"""

from __future__ import annotations

import json
import re
import warnings

import bvhio
import numpy as np
import pytest
from conftest import data_file
from scipy.spatial.transform import Rotation

import kangengine as ke
from kangengine import conventions as axes
from kangengine.cli import main
from kangengine.errors import FileMissingError, FormatError
from kangengine.io import BVHFrameCountWarning, load_bvh, save_bvh

try:  # PyGLM, which bvhio uses
    from pyglm import glm
except ImportError:  # older PyGLM
    import glm

# file, frames, fps, joints (ROOT + JOINT), channels per frame, unit detected: data/README.md
FILES = [
    ("bvh/cmu/01_01_cgspeed_hops_long.bvh", 2752, 120.0, 31, 96, "cmu"),
    ("bvh/cmu/02_01_cgspeed_walk.bvh", 343, 120.0, 31, 96, "cmu"),
    ("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh", 994, 120.0, 31, 96, "cmu"),
    ("bvh/cmu/002_03_iclone_cc_run.bvh", 86, 60.0, 101, 306, "cm"),
    ("bvh/bandai_namco_ccbync/dataset-1_run_normal_001.bvh", 24, 30.0, 22, 132, "cm"),
    ("bvh/bandai_namco_ccbync/dataset-1_walk_normal_001.bvh", 195, 30.0, 22, 132, "cm"),
    ("bvh/other/mixamo_rig_freebvh.bvh", 69, 30.0, 55, 168, "cm"),
    ("bvh/other/mocapbank_zxy.bvh", 455, 30.0, 19, 60, "cm"),
    ("bvh/other/sinusoidal_xyz_noendsite.bvh", 120, 60.0, 4, 15, None),
    ("bvh/other/bvhio_example.bvh", 2, 30.0, 18, 57, "in"),
    ("bvh/other/arm_3joint.bvh", 1, 1.0, 3, 12, None),
]
IDS = [f[0].rsplit("/", 1)[1] for f in FILES]


def bvhio_world_positions(path, frames) -> dict[int, dict[str, np.ndarray]]:
    """World positions (file units and axes) of every joint, and of every End Site as ``<joint>_end``,
    computed by bvhio at the given frames."""
    root = bvhio.readAsHierarchy(str(path))
    raw = bvhio.readAsBvh(str(path), loadKeyFrames=False)
    end_offsets = {}
    stack = [raw.Root]
    while stack:
        b = stack.pop()
        if not b.Children and b.EndSite is not None:
            end_offsets[b.Name] = b.EndSite
        stack.extend(b.Children)
    joints = [j for j, _, _ in root.layout()]
    out = {}
    for f in frames:
        root.loadPose(int(f), recursive=True)
        row = {}
        for j in joints:
            row[j.Name] = np.array(j.PositionWorld, dtype=np.float64)
            if j.Name in end_offsets and not j.Children:
                # bvhio re-orients each joint's rest frame; undo it to place the End Site OFFSET
                rest = glm.quat()
                k = j
                while k is not None:
                    rest = k.RestPose.Rotation * rest
                    k = k.Parent
                row[j.Name + "_end"] = np.array(j.pointToWorld(glm.inverse(rest) * end_offsets[j.Name]))
        out[int(f)] = row
    return out


def assert_matches_bvhio(motion, path, frames, *, atol=1e-5):
    ref = bvhio_world_positions(path, frames)
    names = list(motion.tree.node_names)
    gp = np.asarray(motion.global_translation, dtype=np.float64)
    s = motion.metadata["scale"]
    compared = 0
    for f, row in ref.items():
        for name, p in row.items():
            if name not in names:
                continue  # bvhio invents an End Site for a leaf joint that has none
            p = axes.vec_zup_from_yup(p) if motion.metadata["up_axis"] == "y" else p
            np.testing.assert_allclose(gp[f, names.index(name)], p * s, atol=atol, err_msg=f"{path} frame {f} {name}")
            compared += 1
    assert compared >= len(ref) * (len(names) - len(motion.metadata["end_sites"]))


@pytest.mark.parametrize(("rel", "frames", "fps", "joints", "channels", "unit"), FILES, ids=IDS)
def test_every_shared_file_matches_bvhio(rel, frames, fps, joints, channels, unit):
    path = data_file(rel)
    m = load_bvh(path, dtype=np.float64)
    md = m.metadata
    assert m.num_frames == frames and abs(m.fps - fps) < 0.01
    assert len(md["end_sites"]) == m.tree.num_nodes - joints
    assert sum(len(c) for c in md["channels"]) == channels
    if unit is not None:
        assert md["source_units"] == unit and md["units_detected"]
        assert md["scale"] == ke.io.BVH_LENGTH_UNITS[unit]
    sample = np.unique(np.linspace(0, frames - 1, 4).round().astype(int))
    assert_matches_bvhio(m, path, sample)


def test_default_float32_matches_float64():
    path = data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh")
    m32, m64 = load_bvh(path), load_bvh(path, dtype=np.float64)
    assert m32.local_rotation.dtype == np.float32 and m32.root_translation.dtype == np.float32
    np.testing.assert_allclose(m32.global_translation, m64.global_translation, atol=1e-5)


def test_mixed_rotation_orders_and_line_endings():
    m = load_bvh(data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"))
    orders = [o for o, end in zip(m.metadata["rotation_orders"], m.metadata["original_names"]) if end != "End Site"]
    assert orders.count("ZYX") == 19 and orders.count("ZXY") == 12
    crlf = load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))  # CRLF throughout
    assert crlf.num_frames == 343
    tabbed = load_bvh(data_file("bvh/other/mocapbank_zxy.bvh"))  # tab after "Frames:", CRLF
    assert tabbed.num_frames == 455 and tabbed.fps == pytest.approx(30.0, abs=1e-3)


def test_names_end_sites_and_leaf_without_end_site():
    mixamo = load_bvh(data_file("bvh/other/mixamo_rig_freebvh.bvh"))
    assert mixamo.tree.node_names[0] == "mixamorig:Hips"
    assert "mixamorig:HeadTop_End_end" in mixamo.tree.node_names
    assert mixamo.metadata["original_names"][mixamo.tree.index("mixamorig:HeadTop_End_end")] == "End Site"
    sinus = load_bvh(data_file("bvh/other/sinusoidal_xyz_noendsite.bvh"))
    assert sinus.tree.node_names == ("base", "child1", "child2", "child3")
    assert sinus.metadata["end_sites"] == []
    walk = load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    end = walk.tree.index("LeftToeBase_end")
    assert walk.tree.parent_indices[end] == walk.tree.index("LeftToeBase")
    np.testing.assert_allclose(walk.local_rotation[:, end], np.tile([1, 0, 0, 0], (walk.num_frames, 1)))


def test_position_channels_on_every_joint_are_kept():
    path = data_file("bvh/bandai_namco_ccbync/dataset-1_walk_normal_001.bvh")
    m = load_bvh(path, dtype=np.float64)
    assert m.local_translation is not None and m.local_translation.shape == (195, 27, 3)
    # Spine's translation channels (columns 13-15 of the file rows: joint_Root 6, Hips 6, then Spine)
    rows = np.loadtxt(path.read_text().splitlines()[-195:])
    spine = m.tree.index("Spine")
    np.testing.assert_allclose(m.local_translation[:, spine], axes.vec_zup_from_yup(rows[:, 12:15]) * 0.01, atol=1e-9)
    assert np.ptp(rows[:, 12:15], axis=0).max() > 0  # they do move, so dropping them would be wrong


def _one_joint_file(order: str, angles, *, extra="") -> str:
    chans = " ".join(f"{a}rotation" for a in order)
    rows = "\n".join(" ".join(f"{v:.9f}" for v in row) for row in angles)
    return (
        f"HIERARCHY\nROOT a\n{{\n  OFFSET 0 0 0\n  CHANNELS {len(order)} {chans}\n{extra}  End Site\n  {{\n"
        f"    OFFSET 0 1 0\n  }}\n}}\nMOTION\nFrames: {len(angles)}\nFrame Time: 0.1\n{rows}\n"
    )


@pytest.mark.parametrize("order", ["XYZ", "XZY", "YXZ", "YZX", "ZXY", "ZYX", "ZX", "Y"])
def test_channel_order_is_intrinsic_like_scipy(tmp_path, order):
    """``Zrotation Xrotation Yrotation`` is R = Rz Rx Ry: scipy's intrinsic (upper-case) "ZXY", degrees."""
    rng = np.random.default_rng(len(order) * 7 + ord(order[0]))
    ang = rng.uniform(-170, 170, size=(6, len(order)))
    p = tmp_path / "one.bvh"
    p.write_text(_one_joint_file(order, ang))
    m = load_bvh(p, up_axis="z", scale=1.0, dtype=np.float64)
    ref = Rotation.from_euler(order, ang, degrees=True).as_quat()  # xyzw
    got = m.local_rotation[:, 0]
    dots = np.abs(np.sum(got * ref[:, [3, 0, 1, 2]], axis=-1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-12)
    y_up = load_bvh(p, up_axis="y", scale=1.0, dtype=np.float64)  # re-expressed: C R C^T
    r_zup = Rotation.from_quat(y_up.local_rotation[:, 0][:, [1, 2, 3, 0]]).as_matrix()
    c = axes.MATRIX_ZUP_FROM_YUP
    np.testing.assert_allclose(r_zup, c @ Rotation.from_quat(ref).as_matrix() @ c.T, atol=1e-12)


def test_partial_position_channels_replace_offset_components(tmp_path):
    text = (
        "HIERARCHY\nROOT r\n{\n OFFSET 1 2 3\n CHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation\n"
        " JOINT c\n {\n  OFFSET 4 5 6\n  CHANNELS 4 Yposition Xrotation Yrotation Zrotation\n"
        "  End Site\n  {\n   OFFSET 0 1 0\n  }\n }\n}\nMOTION\nFrames: 3\nFrame Time: 0.5\n"
        "0 0 0 10 20 30 7 40 50 60\n1 2 3 0 0 0 -2 0 0 0\n0 1 0 5 5 5 0 1 2 3\n"
    )
    p = tmp_path / "partial.bvh"
    p.write_text(text)
    m = load_bvh(p, up_axis="y", scale=1.0, dtype=np.float64)
    assert m.fps == 2.0
    c = m.tree.index("c")
    np.testing.assert_allclose(axes.vec_yup_from_zup(m.local_translation[:, c]), [[4, 7, 6], [4, -2, 6], [4, 0, 6]])
    assert_matches_bvhio(m, p, [0, 1, 2])


def test_units_and_axes_options():
    path = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    auto = load_bvh(path, dtype=np.float64)
    assert auto.metadata["up_axis"] == "y" and auto.metadata["up_axis_detected"]
    assert 0.9 < float(auto.root_translation[:, 2].mean()) < 1.1  # hips about 1 m above the floor, Z up
    cm = load_bvh(path, scale="cm", dtype=np.float64)
    assert cm.metadata["source_units"] == "cm" and not cm.metadata["units_detected"]
    np.testing.assert_allclose(
        cm.global_translation / 0.01, auto.global_translation / auto.metadata["scale"], atol=1e-9
    )
    raw = load_bvh(path, up_axis="z", scale=1.0, dtype=np.float64)  # no conversion at all
    ref = bvhio_world_positions(path, [100])[100]
    np.testing.assert_allclose(raw.global_translation[100, raw.tree.index("Head")], ref["Head"], atol=1e-5)
    with pytest.raises(FormatError, match="up_axis"):
        load_bvh(path, up_axis="x")
    with pytest.raises(FormatError, match="unknown unit"):
        load_bvh(path, scale="furlong")


# -- writing ---------------------------------------------------------------------------------------


ROUND_TRIP = [
    ("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh", "ZYX", "y", "cm"),
    ("bvh/cmu/02_01_cgspeed_walk.bvh", "ZXY", "y", "m"),
    ("bvh/bandai_namco_ccbync/dataset-1_run_normal_001.bvh", "XYZ", "y", "cm"),
    ("bvh/other/sinusoidal_xyz_noendsite.bvh", "YZX", "z", "mm"),
    ("bvh/other/mixamo_rig_freebvh.bvh", "ZYX", "y", "in"),
]


@pytest.mark.parametrize(("rel", "order", "up", "units"), ROUND_TRIP, ids=[r[0].rsplit("/", 1)[1] for r in ROUND_TRIP])
def test_write_read_round_trip_and_bvhio_reads_our_file(tmp_path, rel, order, up, units):
    src = load_bvh(data_file(rel), dtype=np.float64)
    out = tmp_path / "out.bvh"
    save_bvh(out, src, rotation_order=order, up_axis=up, units=units)
    back = load_bvh(out, up_axis=up, scale=units, dtype=np.float64)
    assert back.tree.node_names == src.tree.node_names
    assert back.metadata["end_sites"] == src.metadata["end_sites"]
    assert back.num_frames == src.num_frames and back.fps == pytest.approx(src.fps, rel=1e-9)
    np.testing.assert_allclose(back.global_translation, src.global_translation, atol=1e-4)
    assert (back.local_translation is None) == (src.local_translation is None)
    assert set(back.metadata["rotation_orders"]) <= {order, ""}
    # bvhio reads the file we wrote and finds the same joint positions
    assert_matches_bvhio(back, out, [0, back.num_frames - 1], atol=1e-5)
    np.testing.assert_allclose(back.global_translation[[0, -1]], src.global_translation[[0, -1]], atol=1e-4)


def test_save_is_atomic_and_checks_arguments(tmp_path):
    m = load_bvh(data_file("bvh/other/arm_3joint.bvh"))
    out = tmp_path / "arm.bvh"
    out.write_text("old contents")
    with pytest.raises(FormatError, match="rotation_order"):
        save_bvh(out, m, rotation_order="ZZY")
    with pytest.raises(FormatError, match="up_axis"):
        save_bvh(out, m, up_axis="x")
    assert out.read_text() == "old contents"
    save_bvh(out, m)
    assert out.read_text().startswith("HIERARCHY") and list(tmp_path.iterdir()) == [out]
    text = out.read_text()
    assert (
        "Frame Time: 1\n" in text and "CHANNELS 6 Xposition Yposition Zposition Zrotation Yrotation Xrotation" in text
    )


def test_torch_motion_can_be_written(tmp_path):
    m = load_bvh(data_file("bvh/other/bvhio_example.bvh"), dtype=np.float64)
    save_bvh(tmp_path / "t.bvh", m.torch())
    back = load_bvh(tmp_path / "t.bvh", scale="cm", dtype=np.float64)
    np.testing.assert_allclose(back.global_translation, m.global_translation, atol=1e-4)


# -- header / rows mismatch and bad files ------------------------------------------------------------------


def _copy_with(tmp_path, rel, edit, name="broken.bvh"):
    text = data_file(rel).read_bytes().decode()
    p = tmp_path / name
    p.write_bytes(edit(text).encode())
    return p


def _line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_header_frame_count_mismatch_warns_and_uses_rows(tmp_path):
    rel = "bvh/other/mocapbank_zxy.bvh"
    p = _copy_with(tmp_path, rel, lambda t: t.replace("Frames:\t455", "Frames:\t400"))
    with pytest.warns(BVHFrameCountWarning, match=r"400 frames but the file has 455 rows"):
        m = load_bvh(p)
    assert m.num_frames == 455 and m.metadata["header_frames"] == 400
    # rows missing at the end (cut at a line boundary): warn, keep what is there
    p2 = _copy_with(tmp_path, rel, lambda t: "\r\n".join(t.split("\r\n")[:-11]) + "\r\n", "short.bvh")
    with pytest.warns(BVHFrameCountWarning, match="455 frames but the file has 445 rows"):
        assert load_bvh(p2).num_frames == 445


BAD = "bvh/other/bvhio_example.bvh"


def _bad_cases():
    text = data_file(BAD).read_text()
    motion_at = _line_of(text, "Frame Time")
    first_row = motion_at + 1
    rows = text.split("\n")

    def set_row(i, f):
        def edit(t):
            lines = t.split("\n")
            lines[first_row - 1 + i] = f(lines[first_row - 1 + i])
            return "\n".join(lines)

        return edit

    return [
        ("truncated in a row", lambda t: t[: t.rindex("\t", 0, len(t) - 40)], first_row + 1, "values; expected 57"),
        (
            "truncated in the hierarchy",
            lambda t: t[: t.index("JOINT LeftUpLeg")],
            len(rows[: _line_of(text, "JOINT LeftUpLeg")]),
            "unexpected end of file",
        ),
        ("missing value", set_row(1, lambda r: " ".join(r.split()[:-1])), first_row + 1, "56 values; expected 57"),
        ("extra value", set_row(0, lambda r: r + " 1.0"), first_row, "58 values; expected 57"),
        ("non-numeric", set_row(1, lambda r: r.replace("0.00", "abc", 1)), first_row + 1, "'abc' is not a number"),
        ("NaN", set_row(0, lambda r: r.replace("0.00", "nan", 1)), first_row, "expected finite numbers"),
        (
            "unknown channel",
            lambda t: t.replace("Zrotation Xrotation Yrotation", "Zrotation Wrotation Yrotation", 1),
            _line_of(text, "Zrotation Xrotation Yrotation"),
            "unknown channel 'Wrotation'",
        ),
        (
            "repeated rotation axis",
            lambda t: t.replace("Zrotation Xrotation Yrotation", "Zrotation Xrotation Zrotation", 1),
            _line_of(text, "Zrotation Xrotation Yrotation"),
            "unknown rotation order 'ZXZ'",
        ),
        (
            "channel count",
            lambda t: t.replace("CHANNELS 3 Zrotation", "CHANNELS 4 Zrotation", 1),
            _line_of(text, "CHANNELS 3 Zrotation"),
            "declares 4 channels but lists 3",
        ),
        (
            "zero frames",
            lambda t: t[: t.index("Frame Time")].replace("Frames: 2", "Frames: 0") + "Frame Time: 0.033\n",
            motion_at + 1,
            "zero frames",
        ),
        ("bad frame time", lambda t: t.replace("Frame Time: 0.033333", "Frame Time: -1"), motion_at, "Frame Time"),
        (
            "bad offset",
            lambda t: t.replace("OFFSET\t 0.00\t 5.21", "OFFSET\t 0.00\t five", 1),
            _line_of(text, "OFFSET\t 0.00\t 5.21"),
            "'five' is not a number",
        ),
        ("no MOTION", lambda t: t[: t.index("MOTION")], None, "no MOTION section"),
        # issue 17: refused instead of read as something else
        *[
            (
                f"frame time {ft}",
                lambda t, ft=ft: t.replace("Frame Time: 0.033333", f"Frame Time: {ft}"),
                motion_at,
                "expected seconds per frame in [1e-05, 3600]",
            )
            for ft in ("1e-300", "1e300", "0", "-0.01", "nan", "inf")
        ],
        (
            "negative frame count",
            lambda t: t.replace("Frames:    2", "Frames: -5"),
            _line_of(text, "Frames:"),
            "Frames: -5; expected a frame count >= 0",
        ),
        (
            "second CHANNELS line",
            lambda t: t.replace(
                "\t\tCHANNELS 3 Zrotation Xrotation Yrotation\n",
                "\t\tCHANNELS 3 Zrotation Xrotation Yrotation\n\t\tCHANNELS 3 Xrotation Yrotation Zrotation\n",
                1,
            ),
            _line_of(text, "\t\tCHANNELS 3 Zrotation Xrotation Yrotation\n") + 1,
            "a second CHANNELS line for joint 'Chest' (the first is on line "
            f"{_line_of(text, chr(9) * 2 + 'CHANNELS 3 Zrotation Xrotation Yrotation')})",
        ),
        (
            "second OFFSET line",
            lambda t: t.replace("OFFSET\t 0.00\t 5.21\t 0.00", "OFFSET\t 0.00\t 5.21\t 0.00\n\t\tOFFSET 1 2 3", 1),
            _line_of(text, "OFFSET\t 0.00\t 5.21") + 1,
            "a second OFFSET line for joint 'Chest'",
        ),
        (
            "offset overflowing float32",
            lambda t: t.replace("OFFSET\t 0.00\t 5.21", "OFFSET\t 0.00\t 5.21e300", 1),
            _line_of(text, "OFFSET\t 0.00\t 5.21"),
            "OFFSET of joint 'Chest' reach 5.21e+300 file units",
        ),
        (
            "position channel overflowing float32",
            set_row(0, lambda r: r.replace("35.01", "3e37", 1)),
            _line_of(text, "CHANNELS 6"),
            "position channels of joint 'Hips' reach 3e+37",
        ),
    ]


@pytest.mark.parametrize(("case", "edit", "line", "message"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_files_raise_format_error_naming_file_and_line(tmp_path, case, edit, line, message):
    p = _copy_with(tmp_path, BAD, edit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BVHFrameCountWarning)
        with pytest.raises(FormatError) as info:
            load_bvh(p)
    err = str(info.value)
    assert str(p) in err and message in err, err
    if line is not None:
        assert re.search(rf"\bline {line}\b", err), err


def test_missing_file():
    with pytest.raises(FileMissingError):
        load_bvh("no/such/file.bvh")


def test_a_path_that_is_not_a_regular_file_is_missing(tmp_path):
    """A folder, a path through a file, and a FIFO (never opened for a blocking read) are no BVH file; the error
    names the path."""
    import os

    regular = tmp_path / "walk.bvh"
    regular.write_bytes(data_file("bvh/other/arm_3joint.bvh").read_bytes())
    paths = [tmp_path, regular / "inside.bvh", tmp_path / "missing.bvh"]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.bvh")
        paths.append(tmp_path / "pipe.bvh")
    for path in paths:
        with pytest.raises(FileMissingError, match=re.escape(str(path))):
            load_bvh(path)
    assert load_bvh(regular).num_frames == load_bvh(data_file("bvh/other/arm_3joint.bvh")).num_frames


# -- dispatcher, CLI, axes ---------------------------------------------------------------------------------


def test_load_motion_dispatches_by_extension(tmp_path):
    path = data_file("bvh/other/bvhio_example.bvh")
    m = ke.pipelines.load_motion(path, scale="in")
    assert m.metadata["source_format"] == "bvh" and m.metadata["scale"] == 0.0254
    m.save_npz(tmp_path / "clip.npz")
    again = ke.pipelines.load_motion(tmp_path / "clip.npz")
    np.testing.assert_allclose(again.global_translation, m.global_translation)
    (tmp_path / "clip.xyz").write_text("x")
    with pytest.raises(FormatError, match=r"no motion reader for '.xyz'.*\.bvh"):
        ke.pipelines.load_motion(tmp_path / "clip.xyz")
    with pytest.raises(FileMissingError):
        ke.pipelines.load_motion(tmp_path / "none.bvh")


def test_cli_info_example_reads_the_shipped_bvh(capsys):
    assert main(["info", "--example"]) == 0
    report = json.loads(capsys.readouterr().out)
    (clip,) = report["clips"]
    assert clip["frames"] == 343 and clip["fps"] == pytest.approx(120.0, abs=0.01) and clip["nodes"] == 38
    assert clip["metadata"]["source_units"] == "cmu" and clip["metadata"]["up_axis"] == "y"
    assert 0.85 < clip["root_height_m"]["min"] < clip["root_height_m"]["max"] < 1.2


def test_axes_helpers_numpy_and_torch():
    import torch

    rng = np.random.default_rng(3)
    q = ke.rotations.quat_normalize(rng.normal(size=(5, 4)))
    v = rng.normal(size=(5, 3))
    c = axes.MATRIX_ZUP_FROM_YUP
    np.testing.assert_allclose(axes.vec_zup_from_yup(v), v @ c.T)
    np.testing.assert_allclose(axes.vec_yup_from_zup(axes.vec_zup_from_yup(v)), v)
    r = ke.rotations.quat_to_matrix(q)
    np.testing.assert_allclose(ke.rotations.quat_to_matrix(axes.quat_zup_from_yup(q)), c @ r @ c.T, atol=1e-12)
    np.testing.assert_allclose(axes.quat_yup_from_zup(axes.quat_zup_from_yup(q)), q)
    np.testing.assert_allclose(ke.rotations.quat_to_matrix(axes.QUAT_WXYZ_ZUP_FROM_YUP), c, atol=1e-15)
    np.testing.assert_allclose(axes.vec_zup_from_yup([0.0, 1.0, 0.0]), [0, 0, 1])  # up becomes up
    np.testing.assert_allclose(axes.vec_zup_from_yup([0.0, 0.0, 1.0]), [1, 0, 0])  # BVH facing +Z -> +X
    t = torch.tensor(q, dtype=torch.float32)
    out = axes.quat_zup_from_yup(t)
    assert out.dtype == torch.float32 and torch.allclose(
        out, torch.tensor(axes.quat_zup_from_yup(q), dtype=torch.float32)
    )
    m = load_bvh(data_file("bvh/other/bvhio_example.bvh"), up_axis="y", dtype=np.float64)
    back = ke.animation.motion_yup_from_zup(m)
    np.testing.assert_allclose(back.global_translation, axes.vec_yup_from_zup(m.global_translation), atol=1e-12)


# -- issue 17: frame rates, overflow, huge skeletons --------------------------------------------------------


def test_printed_frame_time_snaps_to_the_rate_it_rounds():
    m = load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))  # "Frame Time: 0.008333"
    assert 1 / 0.008333 == pytest.approx(120.0048, abs=1e-4)  # what the reciprocal alone gives
    assert m.fps == 120.0 and m.metadata["fps_snapped"] is True
    assert m.metadata["frame_time_s"] == 0.008333 and m.metadata["fps_from_frame_time"] == 1 / 0.008333
    # ".0083333" (7 decimals) and "0.016667" snap the same way; 1 s stays 1 fps, exactly, without a snap
    assert load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh")).fps == 120.0
    assert load_bvh(data_file("bvh/cmu/002_03_iclone_cc_run.bvh")).fps == 60.0
    one = load_bvh(data_file("bvh/other/arm_3joint.bvh"))
    assert one.fps == 1.0 and one.metadata["fps_snapped"] is False


@pytest.mark.parametrize(
    ("frame_time", "fps"),
    [
        ("0.0333667", 30000 / 1001),  # NTSC 29.97: 1001/30000 = 0.03336667 rounds to the printed digits
        ("3.3333e-2", 30.0),  # exponent form: the last printed digit is 1e-6
        ("0.00833", 120.0),  # 1/120 = 0.0083333 prints as 0.00833; no other integer rate does
        ("0.0081", 1 / 0.0081),  # 1/123 and 1/124 both print as 0.0081: ambiguous, kept as 123.457
        ("0.0123456", 1 / 0.0123456),  # 81.0001 fps: no integer rate prints as this
    ],
)
def test_frame_time_snapping_follows_the_printed_precision(tmp_path, frame_time, fps):
    p = _copy_with(tmp_path, BAD, lambda t: t.replace("Frame Time: 0.033333", f"Frame Time: {frame_time}"))
    m = load_bvh(p)
    assert m.fps == pytest.approx(fps, rel=1e-12) and m.metadata["frame_time_s"] == float(frame_time)


def test_saved_frame_time_reads_back_the_same_rate(tmp_path):
    src = load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    back = load_bvh(save_bvh(tmp_path / "w.bvh", src))
    assert back.fps == src.fps == 120.0


def test_offsets_overflowing_float64_are_refused(tmp_path):
    # each offset is finite in float64, but the chain's sum is not: positions would be inf
    assert np.isinf(np.float64(1.5e308) + np.float64(1.5e308))
    text = (
        "HIERARCHY\nROOT a\n{\nOFFSET 0 0 0\nCHANNELS 3 Zrotation Xrotation Yrotation\nJOINT b\n{\nOFFSET 0 1.5e308 0\n"
        "CHANNELS 3 Zrotation Xrotation Yrotation\nJOINT c\n{\nOFFSET 0 1.5e308 0\nCHANNELS 3 Zrotation Xrotation "
        "Yrotation\n}\n}\n}\nMOTION\nFrames: 1\nFrame Time: 0.01\n" + " ".join(["0"] * 9) + "\n"
    )
    p = tmp_path / "overflow.bvh"
    p.write_text(text)
    with pytest.raises(FormatError, match="would overflow float64") as e:
        load_bvh(p, dtype=np.float64, scale="m")
    assert str(p) in str(e.value) and e.value.item == "line 8"  # b's OFFSET


def _skeleton_file(path, joints: int, *, deep: bool):
    lines = [
        "HIERARCHY",
        "ROOT j0",
        "{",
        "OFFSET 0 0 0",
        "CHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation",
    ]
    for i in range(1, joints):
        lines += [f"JOINT j{i}", "{", "OFFSET 0 1 0", "CHANNELS 3 Zrotation Xrotation Yrotation"] + (
            [] if deep else ["}"]
        )
    lines += ["}"] * (joints - 1 if deep else 0) + ["}", "MOTION", "Frames: 2", "Frame Time: 0.01"]
    row = " ".join(["0"] * (6 + 3 * (joints - 1)))
    path.write_text("\n".join(lines + [row, row]) + "\n")
    return path


@pytest.mark.parametrize(("joints", "deep"), [(2000, True), (4000, False)], ids=["chain", "flat"])
def test_thousands_of_joints_read_in_memory_linear_in_the_file(tmp_path, joints, deep):
    import tracemalloc

    p = _skeleton_file(tmp_path / "big.bvh", joints, deep=deep)
    size = p.stat().st_size  # 163 KB, 327 KB
    tracemalloc.start()
    try:
        m = load_bvh(p, scale="m")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.tree.num_nodes == joints
    # before issue 17 the unit detection compiled a forward-kinematics program per topology: 1.3 GB for 4000
    assert peak < 200 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e3:.0f} KB file"
    # the unit detection measured the skeleton: a chain 1..3999 units up (the root left out), a flat fan 1 unit
    assert m.metadata["height_file_units"] == (joints - 2.0 if deep else 0.0)


def test_more_nodes_than_the_cap_are_refused(tmp_path):
    p = _skeleton_file(tmp_path / "huge.bvh", ke.io.bvh.MAX_BVH_NODES + 1, deep=False)
    with pytest.raises(FormatError, match=f"more than {ke.io.bvh.MAX_BVH_NODES} nodes") as e:
        load_bvh(p)
    assert str(p) in str(e.value)

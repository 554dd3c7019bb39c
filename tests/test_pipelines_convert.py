"""Dataset conversion: real clips onto the CMU humanoid, bad clips listed, resume, parallel workers, CLI."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine.cli import main
from kangengine.data import data_path
from kangengine.pipelines import ConvertOptions, convert_clips

MODEL = data_path("humanoid_CMU.xml")
OPTS = ConvertOptions(config="cmu_bvh_to_cmu_humanoid")


@pytest.fixture()
def clips(tmp_path):
    good = tmp_path / "walk.bvh"
    shutil.copy(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), good)
    truncated = tmp_path / "truncated.bvh"
    truncated.write_text(good.read_text()[:5000])
    foreign = tmp_path / "arm.bvh"  # a 3-joint arm: the CMU joint map does not apply
    shutil.copy(data_file("bvh/other/arm_3joint.bvh"), foreign)
    return good, truncated, foreign


def test_converts_good_clips_and_lists_bad_ones(clips, tmp_path):
    good, truncated, foreign = clips
    out = tmp_path / "out"
    report = convert_clips([good, truncated, foreign], MODEL, options=OPTS, out_dir=out)
    # sorted by the clips' paths relative to their common folder
    assert [(o.name, o.status) for o in report.outcomes] == [
        ("arm.bvh", "failed"),
        ("truncated.bvh", "failed"),
        ("walk.bvh", "converted"),
    ]
    assert "truncated.bvh" in report.outcomes[1].error and "FormatError" in report.outcomes[1].error
    assert "UnknownNameError" in report.outcomes[0].error
    summary = json.loads((out / "convert_summary.json").read_text())
    assert summary["counts"] == {"converted": 1, "up_to_date": 0, "failed": 2}
    assert summary["totals"] == {"done": 1, "failed": 2} and len(summary["clips"]) == 3
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    motion = ke.animation.load_articulation_motion_npz(out / "walk.npz", layout)
    assert motion.num_frames == 343 and motion.fps() == pytest.approx(120, rel=1e-4)
    assert motion.metadata["residual_max_rad"] < 0.5 and np.isfinite(motion.q).all()
    # the written q is the mapper's own result for the retargeted clip
    src = ke.io.load_bvh(good)
    moved = ke.retarget.retarget_motion(src, OPTS.config, ke.asset.load(MODEL))
    again = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved.motion)
    np.testing.assert_array_equal(motion.q, again.motion.q)


def test_resume_skips_up_to_date_and_redoes_stale(clips, tmp_path):
    good, _, _ = clips
    out = tmp_path / "out"
    convert_clips([good], MODEL, options=OPTS, out_dir=out)
    before = (out / "walk.npz").stat().st_mtime_ns
    again = convert_clips([good], MODEL, options=OPTS, out_dir=out)
    assert again.outcomes[0].status == "up_to_date" and (out / "walk.npz").stat().st_mtime_ns == before
    # other options: stale, converted again
    at60 = convert_clips([good], MODEL, options=ConvertOptions(config=OPTS.config, fps=60.0), out_dir=out)
    assert at60.outcomes[0].status == "converted"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    assert ke.animation.load_articulation_motion_npz(out / "walk.npz", layout).fps() == 60.0
    # a changed source file: stale too
    text = good.read_text().replace("Frame Time: 0.008333", "Frame Time: 0.010000")
    good.write_text(text)
    assert (
        convert_clips([good], MODEL, options=ConvertOptions(config=OPTS.config, fps=60.0), out_dir=out)
        .outcomes[0]
        .status
        == "converted"
    )


def test_parallel_workers_give_the_same_outputs(clips, tmp_path):
    good, truncated, _ = clips
    serial = convert_clips([good, truncated], MODEL, options=OPTS, out_dir=tmp_path / "a")
    parallel = convert_clips([good, truncated], MODEL, options=OPTS, out_dir=tmp_path / "b", jobs=2)
    assert [o.status for o in serial.outcomes] == [o.status for o in parallel.outcomes]
    za, zb = np.load(tmp_path / "a" / "walk.npz"), np.load(tmp_path / "b" / "walk.npz")
    np.testing.assert_array_equal(za["q"], zb["q"])
    np.testing.assert_array_equal(za["qd"], zb["qd"])


def test_cli_convert(clips, tmp_path, capsys):
    good, truncated, _ = clips
    assert main(["convert", "--example", "--out", str(tmp_path / "ex")]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["converted"] == 1
    rc = main(["convert", str(MODEL), str(good), str(truncated), "--config", OPTS.config, "--out", str(tmp_path / "o")])
    assert rc == 1  # a failed clip makes the exit status non-zero, after converting the rest
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 1}
    assert report["failed"][0]["clip"].endswith("truncated.bvh")
    # an unknown configuration is a bad argument: one line, exit 2, nothing written
    assert main(["convert", str(MODEL), str(good), "--config", "no_such_config", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no_such_config" in err and err.count("\n") == 1 and not (tmp_path / "x").exists()


def test_globs_folders_and_output_stems(tmp_path):
    from kangengine.pipelines.batch import collect_clips, output_stems

    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    for rel in ("a/x.bvh", "a/b/y.bvh", "a/b/.hidden.bvh", "c/z.bvh", "c/z.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(walk, tmp_path / rel)
    exts = ke.pipelines.MOTION_LOADERS
    assert [c.rel for c in collect_clips([tmp_path / "a"], extensions=exts)] == ["b/y.bvh", "x.bvh"]
    found = collect_clips([str(tmp_path / "**" / "*.bvh"), tmp_path / "c"], extensions=exts)
    assert [c.rel for c in found] == ["a/b/y.bvh", "a/x.bvh", "c/z.bvh"]  # the overlap is listed once
    with pytest.raises(ke.errors.FileMissingError):
        collect_clips([str(tmp_path / "nothing_*.bvh")], extensions=exts)
    stems = output_stems(["w/a.bvh", "w/a.fbx", "w/b.bvh"])
    assert stems[2] == "w/b" and stems[0].startswith("w/a-") and stems[1].startswith("w/a-") and stems[0] != stems[1]
    assert output_stems(["walk a.npz", "walk_a.npz", "ok.npz"], clean=True)[2] == "ok"
    assert len(set(output_stems(["walk a.npz", "walk_a.npz"], clean=True))) == 2


def test_manifest_skips_a_torn_line_and_keeps_the_latest_entry(tmp_path):
    from kangengine.pipelines.batch import append_manifest, read_manifests

    append_manifest(tmp_path / "manifest.jsonl", {"clip": "a.bvh", "status": "failed", "time": 1.0})
    append_manifest(tmp_path / "manifest.shard-0-of-2.jsonl", {"clip": "a.bvh", "status": "done", "time": 2.0})
    append_manifest(tmp_path / "manifest.jsonl", {"clip": "b.bvh", "status": "done", "time": 3.0})
    with open(tmp_path / "manifest.jsonl", "ab") as f:
        f.write(b'{"clip": "c.bvh", "sta')  # what a kill inside a write would leave
    latest = read_manifests(tmp_path)
    assert sorted(latest) == ["a.bvh", "b.bvh"] and latest["a.bvh"]["status"] == "done"


def test_left_over_temporaries_of_this_run_are_removed_others_kept(clips, tmp_path):
    import tempfile

    good, _, _ = clips
    out = tmp_path / "out"
    out.mkdir()
    fd, mine = tempfile.mkstemp(prefix=".walk.npz.", suffix=".npz.tmp", dir=out)  # atomic_write's name
    os.close(fd)
    fd, other = tempfile.mkstemp(prefix=".other_clip.npz.", suffix=".npz.tmp", dir=out)  # another shard's
    os.close(fd)
    convert_clips([good], MODEL, options=OPTS, out_dir=out)
    assert not os.path.exists(mine) and os.path.exists(other)


def test_reader_options_reach_the_reader_or_are_noted(clips, tmp_path):
    good, _, _ = clips
    desc = ke.asset.load(MODEL)
    mapper = ke.animation.ArticulationMotionMapper(ke.animation.ArticulationCoordinateLayout.from_data(data=desc))
    detected = ke.pipelines.map_clip(good, desc, mapper, OPTS.config)[2].metadata
    given = ke.pipelines.map_clip(good, desc, mapper, OPTS.config, load_options={"units": "cm"})[2].metadata
    assert detected["source_units"] == "cmu" and given["scale"] == ke.io.BVH_LENGTH_UNITS["cm"]
    # a KangEngine skeleton .npz takes no reader options: converted, with a note in its warnings
    npz = tmp_path / "walk_skeleton.npz"
    ke.io.load_bvh(good).save_npz(npz)
    report = convert_clips([npz], MODEL, options=OPTS, out_dir=tmp_path / "o", load_options={"units": "cm"})
    (outcome,) = report.outcomes
    assert outcome.status == "converted" and any("does not apply" in w for w in outcome.warnings)
    line = json.loads((tmp_path / "o" / "manifest.jsonl").read_text())
    assert line["warnings"] == list(outcome.warnings)

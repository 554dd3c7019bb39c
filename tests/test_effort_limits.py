"""Effort limits from a file: the shipped table of dm_control's CMU humanoid tracking walker
(``kangengine.data.CMU_HUMANOID_TRACKING_EFFORT``), ``ke.sim.read_effort_limits``, ``Model.from_desc(effort_limit=)``
and ``kangengine validate --effort-limits``.

The suite CMU humanoid's motors (``humanoid_CMU.xml``: ``gear`` 20-120 at ``ctrlrange`` [-1, 1]) are too weak for a
mocap walk: its ankles' 20 N m is less than the ankles' own joint damping (5 N m s/rad) costs at a walk's push-off
speed (4-6 rad/s). dm_control's tracking walker (``CMUHumanoidPositionControlledV2020``) gives its position
actuators force ranges of 20-300 N m (ankles 120): the shipped table. Checked against MuJoCo's own reading of the
model file: every entry names one of its motors' joints, and each DOF's limit is the table's, others the file's."""

from __future__ import annotations

import json

import mujoco
import numpy as np
import pytest
from conftest import cmu_humanoid, cmu_tracking_efforts, crop_bvh, data_file

import kangengine as ke
from kangengine.cli import main
from kangengine.data import CMU_HUMANOID_MJCF, CMU_HUMANOID_TRACKING_EFFORT, data_path


def test_the_shipped_table_names_every_motor_of_the_suite_model_and_is_stronger():
    table = cmu_tracking_efforts()
    m = mujoco.MjModel.from_xml_path(str(data_path(CMU_HUMANOID_MJCF)))
    motors = {}
    for a in range(m.nu):
        joint = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, int(m.actuator_trnid[a, 0]))
        motors[joint] = float(m.actuator_gear[a, 0]) * float(m.actuator_ctrlrange[a, 1])
    assert sorted(table) == sorted(motors)
    assert all(table[j] >= motors[j] for j in motors)  # never weaker than the suite's motors
    assert table["lfootrx"] == table["rfootrx"] == 120.0 and motors["lfootrx"] == 20.0
    doc = json.loads(data_path(CMU_HUMANOID_TRACKING_EFFORT).read_text())
    assert "dm_control" in doc["source"] and "Apache" in doc["license"]


def test_model_takes_the_table_for_its_dofs_and_keeps_the_rest():
    _, layout, suite = cmu_humanoid()
    _, _, strong = cmu_humanoid(effort_limit=cmu_tracking_efforts())
    table = cmu_tracking_efforts()
    names = layout.dof_names
    got, before = strong.dof_effort_limit.numpy(), suite.dof_effort_limit.numpy()
    for j, name in enumerate(names):
        assert got[j] == (table[name] if name in table else before[j]), name
    assert np.isinf(got[:6]).all()  # the free root is not driven


def test_bad_effort_files_are_refused_naming_the_file_and_the_item(tmp_path):
    with pytest.raises(ke.errors.FileMissingError, match="effort-limit file"):
        ke.sim.read_effort_limits(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"effort_limit": {"lfootrx": -5}}))
    with pytest.raises(ke.errors.FormatError, match="lfootrx") as e:
        ke.sim.read_effort_limits(bad)
    assert "bad.json" in str(e.value) and "> 0" in str(e.value)
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(ke.errors.FormatError, match="mapping"):
        ke.sim.read_effort_limits(bad)
    bad.write_text(json.dumps({"lfootrx": "strong"}))
    with pytest.raises(ke.errors.FormatError, match="'strong'"):
        ke.sim.read_effort_limits(bad)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"lfootrx": 50, "tail": 10}))
    with pytest.raises(ke.errors.UnknownNameError, match="tail"):
        cmu_humanoid(effort_limit=ke.sim.read_effort_limits(unknown))


def test_cli_validate_with_the_tracking_walkers_limits(tmp_path, capsys):
    """``--effort-limits cmu-tracking`` (or a file) replaces the model file's limits: the same clip's reference
    needs the same torques, measured against the stronger limits (the ankles' ratio 6x lower), and the report is
    not taken for up to date from a run with other limits."""
    model = data_path(CMU_HUMANOID_MJCF)
    src = crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "walk.bvh", 40, start=100)
    conv = tmp_path / "conv"
    config = ["--config", "cmu_bvh_to_cmu_humanoid"]
    assert main(["convert", str(model), str(src), *config, "--out", str(conv), "--quiet"]) == 0
    clip = conv / "walk.npz"
    base = ["validate", str(model), str(clip), "--no-plots", "--settings"]
    settings = tmp_path / "s.toml"
    settings.write_text('[tracking]\ncontroller = "pd"\nsampling_fallback = false\n')
    out = tmp_path / "v"
    assert main([*base, str(settings), "--out", str(out / "suite"), "--quiet"]) in (0, 1)
    strong_cmd = [*base, str(settings), "--out", str(out / "strong"), "--effort-limits", "cmu-tracking", "--quiet"]
    assert main(strong_cmd) in (0, 1)
    capsys.readouterr()
    suite = json.loads((out / "suite" / "walk.json").read_text())["metrics"]
    strong = json.loads((out / "strong" / "walk.json").read_text())["metrics"]
    assert suite["feedforward_ratio_p95_by_dof"]["lfootrx"] == pytest.approx(
        6.0 * strong["feedforward_ratio_p95_by_dof"]["lfootrx"], rel=1e-5
    )
    assert strong["feedforward_over_limit_fraction"] < suite["feedforward_over_limit_fraction"]
    # the limits are part of the fingerprint: the stronger run over the suite one validates again
    file = tmp_path / "limits.json"
    file.write_text(json.dumps(cmu_tracking_efforts()))
    again_cmd = [*base, str(settings), "--out", str(out / "suite"), "--effort-limits", str(file), "--quiet"]
    assert main(again_cmd) in (0, 1)
    assert sum(1 for _ in open(out / "suite" / "manifest.jsonl")) == 2  # validated again: a second entry
    assert main(again_cmd) in (0, 1)
    assert sum(1 for _ in open(out / "suite" / "manifest.jsonl")) == 2  # now up to date: nothing appended
    capsys.readouterr()
    again = json.loads((out / "suite" / "walk.json").read_text())["metrics"]
    assert again["feedforward_ratio_p95_by_dof"] == strong["feedforward_ratio_p95_by_dof"]
    # a bad file: an error naming it, nothing validated
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main([*base, str(settings), "--out", str(tmp_path / "b"), "--effort-limits", str(bad)]) != 0
    assert "bad.json" in capsys.readouterr().err

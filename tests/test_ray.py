"""The Ray backend of the batches (``--ray local`` / ``--ray ADDRESS``, issue 14): the same files as one
process, on a local Ray instance the test starts itself (two CPUs, no dashboard, to keep its start cost low).

The oracles are outside the Ray code: the bytes written by ``--workers 1`` on the same folder, the process
ids of the workers (``os.getpid`` run as a task), and the environment the workers see (``os.getenv``).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, crop_bvh, data_file

try:
    import ray
except ImportError:  # CI installs ray (the dev extra); elsewhere say why these tests did not run
    pytest.skip(
        "ray cannot be imported: pip install 'kangengine[ray]' to run the Ray backend tests", allow_module_level=True
    )

from kangengine.cli import main
from kangengine.data import data_path
from kangengine.pipelines.batch import run_tasks

MODEL = str(data_path("humanoid_CMU.xml"))
CONFIG = "cmu_bvh_to_cmu_humanoid"
GOOD = ("hops/hop.bvh", "walks/deep/walk_b.bvh", "walks/walk_a.bvh", "walks/walk_c.bvh")


def _without_times(entries: list[dict]) -> list[dict]:
    """Manifest entries without what depends on the clock or the process (``time``, ``seconds``)."""
    return sorted(({k: v for k, v in e.items() if k not in ("time", "seconds")} for e in entries), key=str)


def _manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Real CMU clips cropped to a few frames, in a nested tree, plus a corrupt file (failed in every run);
    converted and validated once in this process (``--workers 1``): the reference of the Ray runs."""
    root = tmp_path_factory.mktemp("raytree")
    walk, hops = data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh")
    src = root / "src"
    crop_bvh(walk, src / "walks" / "walk_a.bvh", 24, start=10)
    crop_bvh(walk, src / "walks" / "walk_c.bvh", 20, start=200)
    crop_bvh(walk, src / "walks" / "deep" / "walk_b.bvh", 30, start=100)
    crop_bvh(hops, src / "hops" / "hop.bvh", 24)
    (src / "hops" / "corrupt.bvh").write_text("HIERARCHY\nROOT Hips\n{\n  OFFSET 0 0\n")
    assert main(["convert", MODEL, str(src), "--config", CONFIG, "--out", str(root / "c1"), "--quiet"]) == 1
    val = ["validate", MODEL, str(root / "c1"), "--no-plots", "--batch-size", "2", "--quiet"]
    main([*val, "--out", str(root / "v1")])
    return root


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance started by the test (two CPUs, no dashboard), shared by the batch tests."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_local_starts_ray_runs_tasks_in_other_processes_and_stops_it():
    assert not ray.is_initialized()
    pids = []
    run_tasks(os.getpid, [()] * 4, workers=2, ray="local", on_result=pids.append)
    assert len(pids) == 4 and os.getpid() not in pids  # every task ran in a Ray worker process
    assert not ray.is_initialized()  # the instance started for the batch is stopped after it


def test_each_ray_worker_gets_the_thread_count(ray_instance):
    threads = []  # OMP_NUM_THREADS as the workers see it (set there before their first task)
    run_tasks(os.getenv, [("OMP_NUM_THREADS",)] * 3, workers=2, threads=3, ray="local", on_result=threads.append)
    assert threads == ["3", "3", "3"] and ray_instance.is_initialized()


def test_an_unusable_address_is_one_clear_error_before_any_work(tmp_path):
    code = (
        "import os; from kangengine.pipelines.batch import RayBackendError, run_tasks\n"
        "try: run_tasks(os.getpid, [()], ray='nowhere://cluster', on_result=print)\n"
        "except RayBackendError as e: print('refused:', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env).stdout
    assert out.startswith("refused: --ray: cannot start or reach Ray at 'nowhere://cluster'") and out.count("\n") == 1


def test_ray_not_installed_is_named_with_the_extra_to_install(monkeypatch):
    from kangengine.pipelines.batch import RayBackendError

    monkeypatch.setitem(sys.modules, "ray", None)  # what Python does for a package that cannot be imported
    with pytest.raises(RayBackendError, match=r"pip install 'kangengine\[ray\]'"):
        run_tasks(os.getpid, [()], ray="local", on_result=print)


def test_convert_on_ray_writes_the_same_files_as_one_process(tree, ray_instance, capsys):
    src, ref, out = tree / "src", tree / "c1", tree / "c_ray"
    args = ["convert", MODEL, str(src), "--config", CONFIG, "--out", str(out), "--ray", "local", "--workers", "2"]
    assert main([*args, "--quiet"]) == 1  # corrupt.bvh failed, as with --workers 1
    assert ray_instance.is_initialized()  # an instance the caller started is used and left running
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"converted": 4, "up_to_date": 0, "failed": 1}
    for rel in GOOD:
        npz = Path(rel).with_suffix(".npz")
        assert (ref / npz).read_bytes() == (out / npz).read_bytes(), rel
    assert _without_times(_manifest(out / "manifest.jsonl")) == _without_times(_manifest(ref / "manifest.jsonl"))
    summary = {k: json.loads((d / "convert_summary.json").read_text()) for k, d in (("ref", ref), ("ray", out))}
    assert summary["ray"]["totals"] == summary["ref"]["totals"] == {"done": 4, "failed": 1}
    assert _without_times(summary["ray"]["clips"]) == _without_times(summary["ref"]["clips"])
    # a rerun on Ray redoes nothing
    assert main([*args, "--quiet"]) == 1
    assert json.loads(capsys.readouterr().out)["counts"] == {"converted": 0, "up_to_date": 4, "failed": 1}


def test_validate_on_ray_writes_byte_identical_reports_and_summary(tree, ray_instance, capsys):
    ref, out = tree / "v1", tree / "v_ray"
    args = ["validate", MODEL, str(tree / "c1"), "--no-plots", "--batch-size", "2", "--ray", "local"]
    main([*args, "--workers", "2", "--out", str(out), "--quiet"])
    capsys.readouterr()
    reports = sorted(p.relative_to(ref) for p in ref.rglob("*.json"))
    assert len(reports) == 4  # one report per converted clip (the summary JSON files are not reports)
    for rel in reports:
        assert (ref / rel).read_bytes() == (out / rel).read_bytes(), rel
    assert (ref / "summary.csv").read_bytes() == (out / "summary.csv").read_bytes()
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert len(rows) == 4 and {r["verdict"] for r in rows} <= {"ok", "warn", "reject"}

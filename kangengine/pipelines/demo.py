"""``kangengine demo``: the whole pipeline on the example data shipped in the package, ending with a GIF.

:func:`run_demo` takes the shipped CMU walk (``kangengine/data/cmu_02_01_walk.bvh``, CMU motion capture
subject 2 trial 1) and the shipped CMU humanoid (``humanoid_CMU.xml``, from dm_control) through every stage,
with the same functions the subcommands run, into one folder:

1. convert (:func:`~kangengine.pipelines.convert_clips`, configuration ``cmu_bvh_to_cmu_humanoid``) ->
   ``converted/cmu_02_01_walk.npz``;
2. validate (:func:`~kangengine.pipelines.validate_clips`) with the default settings (no root assistance: the
   PD tracker falls on the walk at 1.1 s, so ``validate`` tracks it again with the sampling search,
   ``docs/tracking.md``, which keeps it up to its end at about 5 cm: ``warn``, also for the converted clip's
   joint-limit excess and for the effort the suite model's 20 N m ankle motors cannot give, ``docs/verdicts.md``;
   measured: 5.0 cm, 339k search world-steps, 172 CPU-s) -> ``validation/no_assist/``; only
   when that verdict is ``reject`` (a cropped clip, other settings), validated again with root assistance (a weak
   virtual spring on the root, ``root_assist_frequency_hz``) -> ``validation/root_assist_1hz/``. Both verdicts are
   printed and kept in :class:`DemoResult`; nothing is hidden: an assisted verdict says the clip is trackable
   *with help*;
3. library build (:func:`~kangengine.pipelines.build_library`, clips whose last verdict is ``ok`` or ``warn``)
   -> ``library.safetensors``;
4. export BVH (:func:`~kangengine.pipelines.export_motion`) -> ``export/cmu_02_01_walk.bvh`` (Blender reads it);
5. preview (:func:`~kangengine.pipelines.render_preview`) -> ``preview.gif``: the robot (MuJoCo's renderer,
   or a Pillow stick figure when no OpenGL backend works, said in the output) beside the source skeleton.

A rerun reuses what is done (the batches resume). ``seconds`` crops the clip (its first motion rows, the
BVH text otherwise unchanged) for a quicker run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError, KangEngineError, MissingDependencyError, MotionError

__all__ = ["DemoResult", "run_demo", "add_arguments", "run"]

CONFIG = "cmu_bvh_to_cmu_humanoid"


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` wrote (absolute paths).

    Attributes:
        out_dir: the folder. source: the clip converted (the shipped BVH, or its crop).
        converted: the articulation motion ``.npz``. frames, fps: of the converted motion.
        verdict: the verdict the library used (``ok``/``warn``/``reject``); report: its JSON report;
            plot: its PNG (``None`` without matplotlib).
        root_assist_hz: the root assistance of that verdict (0: none).
        unassisted_verdict, unassisted_reasons: the verdict and reason codes without root assistance;
            unassisted_report: its JSON report.
        library: the ``.safetensors`` library. bvh: the exported BVH.
        preview: the GIF; renderer: ``mujoco-egl``, ``mujoco-osmesa`` or ``pillow``.
        notes: what the run had to do differently, and why (printed too).
    """

    out_dir: str
    source: str
    converted: str
    frames: int
    fps: float
    verdict: str
    report: str
    plot: str | None
    root_assist_hz: float
    unassisted_verdict: str
    unassisted_reasons: tuple[str, ...]
    unassisted_report: str
    library: str
    bvh: str
    preview: str
    renderer: str
    notes: tuple[str, ...]


def _crop_bvh(src: Path, dst: Path, seconds: float) -> Path:
    """The first ``seconds`` of a BVH file: the same header and rows, ``Frames:`` rewritten (atomic)."""
    from .._files import atomic_write

    head, sep, motion = src.read_text(encoding="utf-8").partition("MOTION")
    lines = motion.strip("\n").split("\n")
    if not sep or len(lines) < 3 or not lines[1].strip().lower().startswith("frame time:"):
        raise FormatError("expected a MOTION section with Frames: and Frame Time: lines", path=src)
    frame_time = float(lines[1].split(":", 1)[1])
    rows = lines[2:]
    keep = max(2, min(len(rows), int(math.floor(seconds / frame_time + 1e-9)) + 1))
    text = f"{head}MOTION\nFrames: {keep}\n{lines[1]}\n" + "\n".join(rows[:keep]) + "\n"
    return atomic_write(dst, lambda f: f.write(text.encode("utf-8")))


def _validate(npz: Path, model: Path, out: Path, root_assist_hz: float, plots: bool) -> dict:
    from ..sim import TrackingSettings
    from .validate_files import ValidationOptions, validate_clips

    report = validate_clips(
        [npz],
        model,
        out_dir=out,
        options=ValidationOptions(plots=plots),
        settings=TrackingSettings(root_assist_frequency_hz=float(root_assist_hz)),
    )
    entry = report.entries[0]
    if entry["status"] != "done":
        raise MotionError(f"validation failed: {entry.get('error')}", path=npz)
    return entry


def run_demo(
    out_dir="kangengine_demo",
    *,
    seconds: float | None = None,
    root_assist_hz: float = 1.0,
    renderer: str = "auto",
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run convert -> validate -> library build -> export BVH -> preview on the shipped example data.

    Args:
        out_dir: the output folder (created); a rerun reuses finished stages.
        seconds: keep only the clip's first ``seconds`` (``None``: the whole 2.85 s walk, 343 frames at 120 fps).
        root_assist_hz: root assistance for the second validation, used only when the unassisted verdict is
            ``reject`` (0: never assist; the library then holds the clip only if it passed unassisted).
        renderer: ``"auto"``, ``"mujoco"`` or ``"pillow"`` (:class:`~kangengine.pipelines.preview.PreviewRenderer`).
        echo: called with each line of the account of the run (default :func:`print`).
    Returns:
        :class:`DemoResult`.
    Raises:
        MissingDependencyError: Pillow is missing (the GIF needs it). MotionError: a stage failed (its error).
    """
    from ..data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path
    from .convert import ConvertOptions, convert_clips
    from .export import export_motion
    from .library_build import build_library
    from .preview import render_preview

    if importlib.util.find_spec("PIL") is None:
        raise MissingDependencyError("the preview GIF needs Pillow: pip install pillow", item="PIL")
    out = Path(out_dir).resolve()
    model = data_path(CMU_HUMANOID_MJCF)
    source = data_path(CMU_WALK_BVH)
    notes: list[str] = []
    echo(f"KangEngine demo: the shipped CMU walk ({source.name}) onto the shipped CMU humanoid ({model.name})")
    echo(f"output folder: {out}")
    if seconds is not None:
        if not (seconds > 0 and math.isfinite(seconds)):
            raise FormatError(f"seconds {seconds}; expected a number > 0", item="seconds")
        source = _crop_bvh(source, out / "source" / source.name, seconds)
        notes.append(f"the clip is cropped to its first {seconds:g} s ({source})")
        echo(f"  (cropped to the first {seconds:g} s: {source})")

    # 1. convert
    conv = convert_clips([source], model, options=ConvertOptions(config=CONFIG), out_dir=out / "converted")
    o = conv.outcomes[0]
    if o.status == "failed":
        raise MotionError(f"convert failed: {o.error}", path=source)
    npz = Path(o.output)
    from .export import load_robot_motion

    motion = load_robot_motion(npz, model).motion
    echo(f"1/5 convert   {npz}  ({motion.num_frames} frames at {motion.fps():g} fps, configuration {CONFIG})")
    for w in o.warnings:
        echo(f"    warning: {w}")

    # 2. validate, without help first
    plots = importlib.util.find_spec("matplotlib") is not None
    if not plots:
        notes.append("no validation plots: matplotlib is not installed (pip install 'kangengine[viz]')")
        echo(f"    note: {notes[-1]}")
    vdir = out / "validation"
    free = _validate(npz, model, vdir / "no_assist", 0.0, plots)
    free_reasons = tuple(free.get("reasons", []))
    fell = (free.get("metrics") or {}).get("fell_at_s")
    why = f" ({', '.join(free_reasons)}{f'; fell at {fell:.2f} s' if fell is not None else ''})" if free_reasons else ""
    how = ""
    free_json = json.loads((vdir / "no_assist" / free["report"]).read_text(encoding="utf-8"))
    if free_json.get("metrics", {}).get("controller") == "sampling":
        how = " (the PD tracker fell; tracked by the sampling search)"
    echo(f"2/5 validate  {vdir / 'no_assist' / free['report']}: {free['verdict']}{why}, no root assistance{how}")
    final, final_dir, assist = free, vdir / "no_assist", 0.0
    if free["verdict"] == "reject" and root_assist_hz > 0:
        final_dir = vdir / f"root_assist_{root_assist_hz:g}hz".replace(".", "_")
        final = _validate(npz, model, final_dir, root_assist_hz, plots)
        assist = float(root_assist_hz)
        reasons = f" ({', '.join(final.get('reasons', []))})" if final.get("reasons") else ""
        notes.append(
            f"the walk is rejected without help ({', '.join(free_reasons)}): neither the PD tracker nor the "
            f"sampling search kept it up, so the clip was validated again with root assistance ON ({assist:g} Hz, "
            f"a weak virtual spring on the root, reported in the metrics): verdict {final['verdict']}; the library "
            f"and the rest of the demo use that verdict"
        )
        echo(f"{'':14}{final_dir / final['report']}: {final['verdict']}{reasons}, root assistance ON ({assist:g} Hz)")
        echo(f"    note: {notes[-1]}")
    plot = str(final_dir / final["plot"]) if final.get("plot") else None
    if plot:
        echo(f"    plot: {plot}")

    # 3. library
    lib_path = out / "library.safetensors"
    try:
        lib = build_library(out / "converted", lib_path, verdict_filter={"ok", "warn"}, validation_dir=final_dir)
    except MotionError:
        lib = build_library(out / "converted", lib_path)
        notes.append(
            f"no clip passed validation; library.safetensors holds the clip unfiltered (verdict {final['verdict']})"
        )
        echo(f"    note: {notes[-1]}")
    echo(
        f"3/5 library   {lib.path}  ({len(lib.clip_names)} clip(s), {lib.total_frames} frames, {lib.duration_s:.2f} s)"
    )

    # 4. export BVH
    (out / "export").mkdir(parents=True, exist_ok=True)
    bvh = export_motion(npz, model, out / "export" / f"{npz.stem}.bvh", format="bvh")
    echo(f"4/5 export    {bvh.path}  (BVH of the robot's skeleton, {bvh.frames} frames: open it in Blender)")

    # 5. preview
    prev = render_preview(npz, model, out / "preview.gif", source=source, renderer=renderer)
    label = {"pillow": "Pillow stick figure"}.get(prev.renderer, f"MuJoCo ({prev.renderer})")
    echo(f"5/5 preview   {prev.path}  ({prev.frames} frames, {prev.size[0]}x{prev.size[1]}, robot drawn by {label})")
    if prev.note:
        notes.append(f"the preview is a stick figure: {prev.note}")
        echo(f"    note: {prev.note}")
    echo("")
    echo(f"open this picture: {prev.path}")
    return DemoResult(
        out_dir=str(out),
        source=str(source),
        converted=str(npz),
        frames=int(motion.num_frames),
        fps=float(motion.fps()),
        verdict=str(final["verdict"]),
        report=str(final_dir / final["report"]),
        plot=plot,
        root_assist_hz=assist,
        unassisted_verdict=str(free["verdict"]),
        unassisted_reasons=free_reasons,
        unassisted_report=str(vdir / "no_assist" / free["report"]),
        library=os.fspath(lib.path),
        bvh=os.fspath(bvh.path),
        preview=os.fspath(prev.path),
        renderer=prev.renderer,
        notes=tuple(notes),
    )


# -- command line (wired by kangengine.cli as `kangengine demo`) ---------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kangengine demo [--out DIR] [--seconds S] [--root-assist-hz F] [--renderer auto|mujoco|pillow]``."""
    parser.add_argument(
        "--out", default="kangengine_demo", metavar="DIR", help="output folder (default ./kangengine_demo)"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, metavar="S", help="only the clip's first S seconds (quicker)"
    )
    parser.add_argument(
        "--root-assist-hz",
        type=float,
        default=1.0,
        metavar="HZ",
        help="root assistance of the second validation, run only when the first rejects the clip (default 1; 0: none)",
    )
    parser.add_argument(
        "--renderer", default="auto", choices=["auto", "mujoco", "pillow"], help="how the preview draws the robot"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``kangengine demo``; prints where each output is. Returns 0, or 1 with one line on stderr."""
    import sys

    try:
        run_demo(args.out, seconds=args.seconds, root_assist_hz=args.root_assist_hz, renderer=args.renderer)
    except KangEngineError as exc:
        print(f"kangengine demo: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0

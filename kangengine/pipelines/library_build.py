"""Pack a convert output folder into one :class:`~kangengine.animation.MotionLibrary` file.

:func:`build_library` reads every articulation motion ``.npz`` under a ``kangengine convert`` folder
(recursively, sorted by relative path), optionally keeps only the clips whose validation report (the
``<name>.json`` a ``kangengine validate`` run over that folder wrote, mirrored the same way) has a verdict in
``verdict_filter``, and writes the library with :meth:`MotionLibrary.save` (one ``.safetensors`` file, no
pickle, atomic). Clips left out are listed with the reason; nothing half-written is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FileMissingError, FormatError, KangEngineError, MotionError

__all__ = ["LibraryBuildResult", "LibrarySkip", "build_library", "add_arguments", "run"]

_VERDICTS = ("ok", "warn", "reject")


@dataclass(frozen=True)
class LibrarySkip:
    """A clip left out of the library: ``name`` (its path relative to the folder) and ``reason``."""

    name: str
    reason: str


@dataclass(frozen=True)
class LibraryBuildResult:
    """What :func:`build_library` wrote.

    Attributes:
        path: the library file. clip_names: the packed clips (their paths relative to the folder, without
            ``.npz``), in library order. total_frames: frames packed. duration_s: seconds of motion packed.
        layout_signature: the layout's ``model_signature``. skipped: :class:`LibrarySkip` per clip left out.
    """

    path: str
    clip_names: tuple[str, ...]
    total_frames: int
    duration_s: float
    layout_signature: str
    skipped: tuple[LibrarySkip, ...]


def _layout_from_summary(folder: Path, model):
    """The layout of the folder's clips: from ``model`` when given, else from the model and options
    ``convert_summary.json`` records."""
    from ..animation import ArticulationCoordinateLayout
    from ..asset import load

    order, free_root = "DFS", True
    summary = folder / "convert_summary.json"
    if summary.is_file():
        try:
            doc = json.loads(summary.read_text())
        except ValueError as exc:
            raise FormatError(f"is not JSON ({exc})", path=summary) from None
        opts = doc.get("options") or {}
        order, free_root = str(opts.get("order", order)), bool(opts.get("free_root", free_root))
        model = model if model is not None else doc.get("model")
    if model is None:
        raise FileMissingError("holds no convert_summary.json naming the model; pass layout= or model=", path=folder)
    desc = load(os.fspath(model), order=order)
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=free_root)


def _verdict(report: Path) -> tuple[str | None, str | None]:
    """``(verdict, None)`` from a validation report, or ``(None, reason)``."""
    if not report.is_file():
        return None, f"no validation report {report.name} in the validate folder"
    try:
        verdict = json.loads(report.read_text()).get("verdict")
    except (OSError, ValueError, AttributeError) as exc:
        return None, f"unreadable validation report {report} ({exc})"
    if verdict not in _VERDICTS:
        return None, f"validation report {report} has verdict {verdict!r}; expected one of {_VERDICTS}"
    return verdict, None


def _is_articulation_npz(path: Path) -> bool:
    try:
        with np.load(path, allow_pickle=False) as z:
            return "format" in z.files and str(z["format"]) == "kangengine.articulation_motion"
    except Exception:  # unreadable: reported by the reader below
        return True


def build_library(
    folder,
    out_file,
    *,
    layout=None,
    verdict_filter: Iterable[str] | None = None,
    validation_dir=None,
    model=None,
    weights_by_verdict: dict | None = None,
) -> LibraryBuildResult:
    """Pack every articulation motion ``.npz`` of a convert output folder into one library file.

    Args:
        folder: the ``kangengine convert`` output folder (searched recursively for ``*.npz``; files that
            are not articulation motions are listed as skipped).
        out_file: the library file (``.safetensors``), written atomically.
        layout: the :class:`~kangengine.animation.ArticulationCoordinateLayout` the clips were made for
            (default: built from ``model``, or from the model file and options in the folder's
            ``convert_summary.json``).
        verdict_filter: keep only clips whose validation verdict is in this set (``{"ok"}``,
            ``{"ok", "warn"}``); ``None`` keeps every clip.
        validation_dir: the ``kangengine validate`` output folder of these clips (default: ``folder``):
            clip ``walks/02_01.npz`` is judged by ``validation_dir/walks/02_01.json``'s ``verdict``.
        model: the model file, when ``layout`` is not given and the folder has no summary.
        weights_by_verdict: optional sampling weight per verdict (``{"ok": 1.0, "warn": 0.5}``; 1 otherwise).
    Returns:
        :class:`LibraryBuildResult` (packed clips, skipped clips with their reason).
    Raises:
        FileMissingError: no such folder. FormatError: a bad verdict name. MotionError: no clip is left to
            pack (every reason is listed); nothing is written then.
    """
    from ..animation import MotionLibrary, load_articulation_motion_npz
    from .batch import output_stems

    folder = Path(folder)
    if not folder.is_dir():
        raise FileMissingError("is not a folder; expected a `kangengine convert` output folder", path=folder)
    wanted = None if verdict_filter is None else {str(v) for v in verdict_filter}
    if wanted is not None and not wanted <= set(_VERDICTS):
        raise FormatError(f"verdicts {sorted(wanted - set(_VERDICTS))}; expected some of {_VERDICTS}", item="verdicts")
    if layout is None:
        layout = _layout_from_summary(folder, model)
    files = sorted(p for p in folder.rglob("*.npz") if p.is_file() and not p.name.startswith("."))
    rels = [p.relative_to(folder).as_posix() for p in files]
    stems = output_stems(rels, clean=True)  # the report names `kangengine validate` gives these clips
    vdir = Path(validation_dir) if validation_dir is not None else folder
    motions, names, weights, skipped = [], [], [], []
    for path, rel, stem in zip(files, rels, stems):
        name = rel[: -len(".npz")]
        if not _is_articulation_npz(path):
            skipped.append(LibrarySkip(name, "not an articulation motion (.npz of `kangengine convert`)"))
            continue
        verdict = None
        if wanted is not None:
            verdict, why = _verdict(vdir / f"{stem}.json")
            if why is None and verdict not in wanted:
                why = f"verdict {verdict!r} is not in {sorted(wanted)}"
            if why is not None:
                skipped.append(LibrarySkip(name, why))
                continue
        try:
            motion = load_articulation_motion_npz(path, layout)
        except KangEngineError as exc:
            skipped.append(LibrarySkip(name, f"{type(exc).__name__}: {exc}"))
            continue
        motion.metadata.setdefault("verdict", verdict)
        motions.append(motion)
        names.append(name)
        weights.append(float((weights_by_verdict or {}).get(verdict, 1.0)))
    if not motions:
        reasons = "; ".join(f"{s.name}: {s.reason}" for s in skipped) or "no .npz files"
        raise MotionError(f"no clip to pack ({reasons})", path=folder)
    lib = MotionLibrary(motions, layout=layout, names=names, weights=weights)
    path = lib.save(out_file)
    return LibraryBuildResult(
        path=os.fspath(path),
        clip_names=tuple(names),
        total_frames=int(sum(m.num_frames for m in motions)),
        duration_s=float(sum(m.duration for m in motions)),
        layout_signature=str(layout.model_signature),
        skipped=tuple(skipped),
    )


# -- command line (wired by kangengine.cli as `kangengine library build`) ------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kangengine library build FOLDER --out FILE [--verdicts ok,warn] [--validation DIR] [--model FILE]``."""
    parser.add_argument("folder", help="a `kangengine convert` output folder")
    parser.add_argument("--out", required=True, help="the library file to write (.safetensors)")
    parser.add_argument("--verdicts", default=None, help="keep clips with these verdicts, e.g. ok,warn (default: all)")
    parser.add_argument("--validation", default=None, help="the `kangengine validate` folder (default: FOLDER)")
    parser.add_argument("--model", default=None, help="the model file (default: from convert_summary.json)")


def run(args: argparse.Namespace) -> int:
    """Run ``kangengine library build``; prints the file and the skipped clips. Returns 0, or 1 on an error."""
    verdicts = None if args.verdicts is None else [v.strip() for v in args.verdicts.split(",") if v.strip()]
    try:
        res = build_library(
            args.folder, args.out, verdict_filter=verdicts, validation_dir=args.validation, model=args.model
        )
    except KangEngineError as exc:
        print(f"kangengine library build: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    count = f"{len(res.clip_names)} clip{'s' if len(res.clip_names) != 1 else ''}"
    print(f"library: {res.path} ({count}, {res.total_frames} frames, {res.duration_s:.2f} s)")
    for s in res.skipped:
        print(f"skipped {s.name}: {s.reason}")
    return 0

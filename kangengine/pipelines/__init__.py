"""The workflows users run: load any motion file, convert a dataset onto a robot, validate it in physics,
pack it into a library, export it, preview it.

This is the one layer that may import every other (``io``, ``datasets``, ``retarget``, ``adapters``,
``sim``); only :mod:`kangengine.cli` and user scripts import it.

- :mod:`.load`: :func:`load_motion`, one dispatcher for every motion format.
- :mod:`.convert`: :func:`convert_clips` (load -> retarget -> map -> ``.npz`` per clip, resumable).
- :mod:`.validate`: :func:`validate` (track -> verdict -> report files, fingerprints, resume, summary) and
  :func:`load_for_validation` (an articulation motion from a converted ``.npz`` or any motion file).
- :mod:`.validate_files`: :func:`validate_clips` (the validate workflow on files: folders, manifest, resume,
  workers, shards).
- :mod:`.batch`: what both batches share (:func:`collect_clips`, the manifest, worker processes).
- :mod:`.plots`: the figures (:func:`validation_figure`, :func:`write_plot`).
- :mod:`.library_build`: :func:`build_library` (a convert folder -> one MotionLibrary file, verdict filter).
- :mod:`.export`: :func:`export_motion` (BVH, mjlab / BeyondMimic npz, GMR csv, ProtoMotions ``.motion``).
- :mod:`.preview`: :func:`render_preview` (GIF / MP4, MuJoCo's renderer headless, Pillow fallback).
- :mod:`.demo`: :func:`run_demo` (every stage on the shipped example data: ``kangengine demo``).
"""

from __future__ import annotations

import importlib
import sys
import types

#: public name -> module of this package that defines it (imported on first use: ``convert`` and ``load``
#: need no torch, ``validate`` loads the simulator)
_EXPORTS = {
    "load_motion": "load",
    "load_npz_motion": "load",
    "MOTION_LOADERS": "load",
    "convert_clips": "convert",
    "ConvertOptions": "convert",
    "BatchReport": "convert",
    "ClipOutcome": "convert",
    "map_clip": "convert",
    "clip_names": "convert",
    "merge_manifests": "convert",
    "validate_clips": "validate_files",
    "ValidationOptions": "validate_files",
    "ValidationBatchReport": "validate_files",
    "collect_clips": "batch",
    "ClipSource": "batch",
    "OutputFolderError": "batch",
    "BatchInterrupted": "batch",
    "BatchTerminated": "batch",
    "validate": "validate",
    "load_for_validation": "validate",
    "ValidationResult": "validate",
    "ClipReport": "validate",
    "SkippedClip": "validate",
    "write_plot": "plots",
    "validation_figure": "plots",
    "build_library": "library_build",
    "LibraryBuildResult": "library_build",
    "LibrarySkip": "library_build",
    "export_motion": "export",
    "ExportFormat": "export",
    "ExportResult": "export",
    "RobotMotion": "export",
    "load_robot_motion": "export",
    "render_preview": "preview",
    "PreviewRenderer": "preview",
    "PreviewResult": "preview",
    "run_demo": "demo",
    "DemoResult": "demo",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kangengine.pipelines' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """Importing the submodule ``validate`` binds its name on the package; keep the function there instead
    (the module stays importable as ``kangengine.pipelines.validate``)."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in _EXPORTS and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

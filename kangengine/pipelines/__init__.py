"""The workflows users run: load any motion file, convert a dataset onto a robot, validate it in physics.

This is the one layer that may import every other (``io``, ``datasets``, ``retarget``, ``adapters``,
``sim``); only :mod:`kangengine.cli` and user scripts import it.

- :mod:`.load`: :func:`load_motion`, one dispatcher for every motion format.
- :mod:`.convert`: :func:`convert_clips` (load -> retarget -> map -> ``.npz`` per clip, resumable).
- :mod:`.validate`: :func:`validate` (track -> verdict -> report files, fingerprints, resume, summary) and
  :func:`load_for_validation` (an articulation motion from a converted ``.npz`` or any motion file).
- :mod:`.plots`: the figures (:func:`write_plot`).
"""

from __future__ import annotations

import importlib

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
    "validate": "validate",
    "load_for_validation": "validate",
    "ValidationResult": "validate",
    "ClipReport": "validate",
    "SkippedClip": "validate",
    "write_plot": "plots",
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

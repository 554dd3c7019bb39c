"""The workflows users run: load any motion file, convert a dataset onto a robot, validate it in physics.

This is the one layer that may import every other (``io``, ``datasets``, ``retarget``, ``adapters``,
``sim``); only :mod:`kangengine.cli` and user scripts import it.

- :mod:`.load`: :func:`load_motion`, one dispatcher for every motion format.
- :mod:`.convert`: :func:`convert_clips` (load -> retarget -> map -> ``.npz`` per clip, resumable).
- :mod:`.validate`: :func:`validate` (track -> verdict -> report files, fingerprints, resume, summary) and
  :func:`load_for_validation` (an articulation motion from a converted ``.npz`` or any motion file).
- :mod:`.plots`: the figures (:func:`write_plot`).
"""

from .convert import BatchReport, ClipOutcome, ConvertOptions, clip_names, convert_clips, map_clip
from .load import MOTION_LOADERS, load_motion, load_npz_motion
from .plots import write_plot
from .validate import ClipReport, SkippedClip, ValidationResult, load_for_validation, validate

__all__ = [
    "load_motion",
    "load_npz_motion",
    "MOTION_LOADERS",
    "convert_clips",
    "ConvertOptions",
    "BatchReport",
    "ClipOutcome",
    "map_clip",
    "clip_names",
    "validate",
    "load_for_validation",
    "ValidationResult",
    "ClipReport",
    "SkippedClip",
    "write_plot",
]

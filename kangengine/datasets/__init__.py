"""Motion datasets and arrays: AMASS / SMPL-family npz (:mod:`.amass`) and poselib ``.npy`` files read
without unrestricted pickle (:mod:`.arrays`)."""

from . import amass, arrays, batch
from .arrays import RestrictedUnpickler, load_npy, load_npz_motion, load_pickle, load_poselib, load_poselib_motion
from .batch import ConvertOptions, convert_clips

__all__ = [
    "amass",
    "arrays",
    "batch",
    "convert_clips",
    "ConvertOptions",
    "RestrictedUnpickler",
    "load_npy",
    "load_pickle",
    "load_poselib",
    "load_poselib_motion",
    "load_npz_motion",
]

"""Motion datasets and arrays: AMASS / SMPL-family npz (:mod:`.amass`) and poselib ``.npy`` files read
without unrestricted pickle (:mod:`.arrays`)."""

from . import amass, arrays
from .arrays import RestrictedUnpickler, load_npy, load_npz_motion, load_pickle, load_poselib, load_poselib_motion

__all__ = [
    "amass",
    "arrays",
    "RestrictedUnpickler",
    "load_npy",
    "load_pickle",
    "load_poselib",
    "load_poselib_motion",
    "load_npz_motion",
]

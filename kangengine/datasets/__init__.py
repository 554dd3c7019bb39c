"""Motion datasets and arrays: AMASS / SMPL-family npz (:mod:`.amass`) and poselib ``.npy`` files read
without unrestricted pickle (:mod:`.arrays`, through :class:`RestrictedUnpickler`)."""

from .._files import RestrictedUnpickler, load_npy, load_pickle, loads_restricted
from . import amass, arrays
from .arrays import load_poselib, load_poselib_motion

__all__ = [
    "amass",
    "arrays",
    "RestrictedUnpickler",
    "load_npy",
    "load_pickle",
    "loads_restricted",
    "load_poselib",
    "load_poselib_motion",
]

"""KangEngine: human motion capture to robot and character reference motion, checked in physics.

``import kangengine as ke`` then ``ke.asset``, ``ke.animation``, ``ke.rotations``, ``ke.io``,
``ke.datasets``, ``ke.adapters``, ``ke.sim``. Subpackages with heavy dependencies load on first use, so
``import kangengine`` needs only numpy.
"""

from __future__ import annotations

import importlib

from . import errors
from .errors import KangEngineError

__version__ = "0.1.0"
__all__ = [
    "errors",
    "KangEngineError",
    "asset",
    "animation",
    "rotations",
    "io",
    "datasets",
    "adapters",
    "sim",
    "__version__",
]

_SUBMODULES = {"asset", "animation", "rotations", "io", "datasets", "adapters", "sim", "cli"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'kangengine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)

"""KangEngine: human motion capture to robot and character reference motion, checked in physics.

``import kangengine as ke`` then ``ke.asset``, ``ke.animation``, ``ke.rotations``, ``ke.conventions``,
``ke.io``, ``ke.datasets``, ``ke.retarget``, ``ke.adapters``, ``ke.sim``, ``ke.pipelines`` and ``ke.data``
(the shipped example files). Subpackages load on first use, so ``import kangengine`` needs only numpy.

Layers import downward only: ``errors``, ``rotations``, ``conventions`` and the file helpers -> ``asset`` ->
``animation`` -> ``io``, ``datasets``, ``retarget``, ``adapters``, ``sim`` (siblings) -> ``pipelines`` -> ``cli``.
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
    "conventions",
    "io",
    "datasets",
    "retarget",
    "adapters",
    "sim",
    "pipelines",
    "data",
    "__version__",
]

_SUBMODULES = {
    "asset",
    "animation",
    "rotations",
    "conventions",
    "io",
    "datasets",
    "retarget",
    "adapters",
    "sim",
    "pipelines",
    "data",
    "cli",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'kangengine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)

"""Simulator adapters (MuJoCo, Newton, PhysX) and the :class:`MotionAdapter` protocol.

Each adapter module is imported on first use (``ke.adapters.mujoco``), so optional engines are only
needed when used.
"""

from __future__ import annotations

import importlib

from .base import MotionAdapter

__all__ = [
    "MotionAdapter",
    "mujoco",
    "newton",
    "physx",
    "MuJoCoMotionAdapter",
    "NewtonMotionAdapter",
    "PhysXMotionAdapter",
]

_LAZY = {"mujoco", "newton", "physx"}
# adapter classes, importable as ke.adapters.<Name> (their modules never import the engines themselves)
_CLASSES = {"MuJoCoMotionAdapter": "mujoco", "NewtonMotionAdapter": "newton", "PhysXMotionAdapter": "physx"}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _CLASSES:
        cls = getattr(importlib.import_module(f".{_CLASSES[name]}", __name__), name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'kangengine.adapters' has no attribute {name!r}")

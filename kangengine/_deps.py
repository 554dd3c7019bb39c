"""Optional dependencies, imported on first use."""

from __future__ import annotations

import importlib

from .errors import MissingDependencyError

__all__ = ["optional", "require"]

_OPTIONAL: dict = {}  # module name -> module, or None where it did not import (tried once per process)


def require(module: str, extra: str):
    """Import an optional backend lazily; :class:`~kangengine.errors.MissingDependencyError` naming the
    extra to install otherwise (``pip install -e ".[newton]"``).

    Args:
        module: dotted module name (``"matplotlib"``, ``"newton"``).
        extra: the ``pyproject.toml`` extra that installs it (``"viz"``, ``"newton"``).
    Returns:
        The imported module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"the optional dependency {module!r} is not installed; install KangEngine with the "
            f"'{extra}' extra: pip install -e \".[{extra}]\"",
            item=module,
        ) from exc


def optional(module: str):
    """Import a module that has a fallback (a compiled kernel needing numba) once per process.

    Args:
        module: dotted module name (``"kangengine.retarget._skeleton_kernels"``).
    Returns:
        The module, or ``None`` where it or what it imports is missing or broken (the caller runs its fallback).
    """
    if module not in _OPTIONAL:
        try:
            _OPTIONAL[module] = importlib.import_module(module)
        except Exception:  # numba missing or broken: the caller's fallback
            _OPTIONAL[module] = None
    return _OPTIONAL[module]

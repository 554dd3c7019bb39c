"""Optional dependencies, imported on first use."""

from __future__ import annotations

import importlib

from .errors import MissingDependencyError

__all__ = ["require"]


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

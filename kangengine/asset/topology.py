"""Tree ordering helpers shared by the asset loaders."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import FormatError, TopologyError

__all__ = ["body_order", "check_order", "ORDERS"]

ORDERS = ("DFS", "BFS")


def check_order(order: str, *, path=None) -> str:
    """Normalise an order name; ``FormatError`` unless it is "DFS" or "BFS" (any case)."""
    o = str(order).upper()
    if o not in ORDERS:
        raise FormatError(f"order must be one of {ORDERS}, got {order!r}", path=path, item="order")
    return o


def body_order(parents: Sequence[int], order: str, *, path=None, names: Sequence[str] | None = None) -> list[int]:
    """Permutation (new position -> old index) listing a forest of one tree in ``order``.

    Args:
        parents: parent index per node (-1 for the root), in the file's pre-order or any order.
        order: "DFS" (pre-order, children in their listed order) or "BFS" (level by level, children in
            their listed order).
    Raises:
        TopologyError: a parent index out of range, a cycle, or a node not reachable from the root.
    """
    order = check_order(order, path=path)
    n = len(parents)
    label = (lambda i: repr(names[i])) if names is not None else (lambda i: f"#{i}")
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, p in enumerate(parents):
        if p == -1:
            roots.append(i)
        elif 0 <= p < n:
            children[p].append(i)
        else:
            raise TopologyError(f"node {label(i)} has parent index {p}; expected -1 or 0..{n - 1}", path=path)
    out: list[int] = []
    if order == "DFS":
        stack = list(reversed(roots))
        while stack:
            i = stack.pop()
            out.append(i)
            stack.extend(reversed(children[i]))
    else:
        frontier = list(roots)
        while frontier:
            out.extend(frontier)
            frontier = [c for i in frontier for c in children[i]]
    if len(out) != n:
        missing = sorted(set(range(n)) - set(out))
        raise TopologyError(
            "the kinematic graph is not a tree: nodes "
            + ", ".join(label(i) for i in missing[:10])
            + " are on a cycle or not connected to the root",
            path=path,
        )
    return out

"""Small example files shipped with KangEngine (see ``LICENSES.md`` beside this file)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["data_path", "CMU_HUMANOID_MJCF", "CMU_HUMANOID_TRACKING_EFFORT", "CMU_WALK_BVH", "CMU_WALK_FBX", "G1_MJCF"]

_DATA = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """Absolute path of a shipped example file (``data_path("humanoid_CMU.xml")``, ``data_path(G1_MJCF)``)."""
    from ..errors import FileMissingError

    p = _DATA / name
    if not p.is_file():
        names = sorted(x.relative_to(_DATA).as_posix() for x in _DATA.rglob("*") if x.is_file() and x.suffix != ".py")
        raise FileMissingError(f"no shipped example {name!r}; examples are: {', '.join(names)}", path=p)
    return p


CMU_HUMANOID_MJCF = "humanoid_CMU.xml"
#: effort limits (N m, JSON) of dm_control's CMU humanoid tracking walker (its 2020 position actuators' force
#: ranges) for the joints of ``humanoid_CMU.xml``, whose own motors are too weak for mocap (``docs/verdicts.md``);
#: read with :func:`kangengine.sim.read_effort_limits`. Apache-2.0, the dm_control Authors.
CMU_HUMANOID_TRACKING_EFFORT = "cmu_humanoid_tracking_effort.json"
CMU_WALK_BVH = "cmu_02_01_walk.bvh"
CMU_WALK_FBX = "cmu_07_01_walk.fbx"
#: the Unitree G1 29-DOF MJCF without meshes (primitive collision geoms), BSD-3-Clause (see ``unitree_g1/LICENSE``)
G1_MJCF = "unitree_g1/g1_29dof.nomesh.xml"

"""Reference motion for imitation-learning rewards: a packed MotionLibrary sampled by 4096 environments at once.

    python examples/reward_sampling.py [OUT_DIR] [--envs 4096] [--steps 8] [--device cpu|cuda]

The shipped CMU walk is retargeted onto the shipped CMU humanoid and mapped to its joint coordinates (as
``examples/preprocess_dataset.py`` does for a folder), registered twice (120 fps, weight 3, and 30 fps,
weight 1) in a ``MotionLibrary`` with precomputed body kinematics, and saved to ``OUT_DIR/library.safetensors``.
The training side then loads that file and, every control step, samples the reference state of every
environment (``sample`` + ``sample_kinematics``, no Python loop over environments) and scores a stand-in
"simulated" robot against it with a DeepMimic-style tracking reward. The rewards go to ``OUT_DIR/rewards.npy``
(``[steps, envs] float32``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import kangengine as ke
from kangengine.data import data_path


def build_library(path: Path):
    """Convert the shipped walk onto the CMU humanoid and save a two-clip library to ``path``."""
    desc = ke.asset.MJCFLoader.load(data_path("humanoid_CMU.xml"), order="DFS")
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    mapper = ke.animation.ArticulationMotionMapper(layout)
    walk = ke.io.load_bvh(data_path("cmu_02_01_walk.bvh"))
    on_robot = ke.retarget.retarget_motion(walk, "cmu_bvh_to_cmu_humanoid", desc).motion
    clips = [mapper.to_articulation_motion(m).motion for m in (on_robot, on_robot.resample(30.0))]
    library = ke.animation.MotionLibrary(
        motions=clips,
        layout=layout,
        weights=[3.0, 1.0],
        names=["walk_120fps", "walk_30fps"],
        precompute_kinematics=True,
    )
    return library.save(path), layout


def tracking_reward(body_pos_sim, body_pos_ref, root_quat_sim_wxyz, root_quat_ref_wxyz):
    """Toy DeepMimic-style reward in ``[0, 1]`` per environment.

    Args:
        body_pos_sim, body_pos_ref: ``[envs, bodies, 3]`` m, world.
        root_quat_sim_wxyz, root_quat_ref_wxyz: ``[envs, 4]`` ``world_from_root``, WXYZ.
    Returns:
        ``[envs]``: ``0.7 exp(-10 mean |dp|^2) + 0.3 exp(-2 angle^2)``, ``dp`` the body position errors and
        ``angle`` the root rotation error (rad).
    """
    position_error = ((body_pos_sim - body_pos_ref) ** 2).sum(-1).mean(-1)
    dot = (root_quat_sim_wxyz * root_quat_ref_wxyz).sum(-1).abs().clamp(max=1.0)
    angle = 2.0 * torch.acos(dot)
    return 0.7 * torch.exp(-10.0 * position_error) + 0.3 * torch.exp(-2.0 * angle**2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="output folder (default: a new temporary folder)")
    parser.add_argument("--envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8, help="control steps to simulate")
    parser.add_argument("--control-dt", type=float, default=1.0 / 30.0, help="s per control step")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kangengine_rewards_"))
    out.mkdir(parents=True, exist_ok=True)

    path, layout = build_library(out / "library.safetensors")
    print(f"wrote {path}")

    # --- the training process: load once, then sample every control step ---------------------------------------
    library = ke.animation.MotionLibrary.load(path, device=args.device, layout=layout)
    print(f"loaded {library} on {args.device}")
    gen = torch.Generator(device=args.device).manual_seed(0)
    motion_ids = library.sample_motion_ids(args.envs, generator=gen)  # [envs] int64, by clip weight
    horizon = args.steps * args.control_dt
    start_times = library.sample_times(motion_ids, truncate_time=horizon, generator=gen)  # [envs] float64 s
    lag = torch.rand(args.envs, generator=gen, device=args.device, dtype=torch.float64) * 0.1  # s
    ref = sim = ref_bodies = sim_bodies = None
    rewards = torch.empty(args.steps, args.envs, device=args.device)
    for step in range(args.steps):
        t = start_times + step * args.control_dt
        ref = library.sample(motion_ids, t, out=ref)  # MotionSample: root, joint rotations, velocities
        ref_bodies = library.sample_kinematics(ref, out=ref_bodies)  # BodyState: [envs, 31, 3] positions...
        # A stand-in for the simulator: each environment's robot trails its reference by up to 0.1 s.
        sim = library.sample(motion_ids, (t - lag).clamp(min=0.0), out=sim)
        sim_bodies = library.sample_kinematics(sim, out=sim_bodies)
        rewards[step] = tracking_reward(
            sim_bodies.body_positions, ref_bodies.body_positions, sim.root_rotations_wxyz, ref.root_rotations_wxyz
        )
        print(f"step {step}: mean reward {float(rewards[step].mean()):.3f}, min {float(rewards[step].min()):.3f}")

    print(f"reference bodies per step: {tuple(ref_bodies.body_positions.shape)} (envs, bodies, xyz)")
    reward_path = out / "rewards.npy"
    np.save(reward_path, rewards.cpu().numpy().astype(np.float32))
    print(f"wrote {reward_path}: [{args.steps}, {args.envs}] float32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

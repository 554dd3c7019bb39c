"""Simulator throughput on CPU: the MuJoCo humanoid standing on the ground under joint PD, environment
steps per second of ``ke.sim.Simulator`` at 1, 64 and 1024 worlds, against ``mujoco.rollout`` (one thread)
on the same model with the same PD gains (position servos, implicitfast) measured in the same run.

Ours steps at h = 1/60 s (implicit: stable at control rates); MuJoCo at the model's own 5 ms step and
also at 1/60 s. Two ratios are printed: per environment step against MuJoCo at the same 1/60 s step (the
issue's CPU target: at least 1x at 1024 worlds), and per simulated second against MuJoCo at its 5 ms.

Ours uses ``--threads`` torch threads (default 1, the tracker's default: see docs/sim.md, "Threads");
``--load N`` starts N busy-loop processes for the run (the loaded-machine case: other work holding cores);
the OpenMP wait policy in force is printed (set ``OMP_WAIT_POLICY`` in the environment: it must be set
before torch loads). ``--solver`` picks the Newton solver (default ``auto``: the tree-sparse factorisation
from 256 worlds on CPU, a batched dense Cholesky below).

    python benchmarks/bench_sim.py [--worlds 1,64,1024] [--threads N] [--load N] [--iterations 2] [--solver auto]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import mujoco
import numpy as np
import torch
from _common import DATA
from mujoco import rollout

import kangengine as ke

KP, KD, DT = 2000.0, 100.0, 1 / 60


def mujoco_rate(path, dt: float | None, seconds: float) -> tuple[float, float]:
    """Steps/s of mujoco.rollout (one thread) and the final torso height."""
    spec = mujoco.MjSpec.from_file(str(path))
    for act in spec.actuators:
        act.set_to_position(kp=KP, kv=KD)
        act.gear = [1, 0, 0, 0, 0, 0]
        act.ctrllimited = 0
    model = spec.compile()
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    if dt is not None:
        model.opt.timestep = dt
    data = mujoco.MjData(model)
    nstate = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    state0 = np.zeros(nstate)
    mujoco.mj_getState(model, data, state0, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    targets = model.qpos0[model.actuator_trnid[:, 0] * 0 + model.jnt_qposadr[model.actuator_trnid[:, 0]]]
    nbatch = 8
    nstep = max(10, int(round(1.0 / model.opt.timestep)))
    ctrl = np.tile(targets, (nbatch, nstep, 1))
    rollout.rollout(model, data, np.tile(state0, (nbatch, 1)), ctrl[:, :10])  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        states, _ = rollout.rollout(model, data, np.tile(state0, (nbatch, 1)), ctrl)
        done += nbatch * nstep
    rate = done / (time.perf_counter() - t0)
    return rate, float(states[0, -1, 1 + 2])  # state = (time, qpos, ...): torso z after 1 s


def ours_rate(model, n: int, seconds: float, iterations: int, compile_step: bool, solver: str) -> tuple[float, float]:
    sim = ke.sim.Simulator(model, dt=DT, iterations=iterations, check_inputs=False, solver=solver)
    state = ke.sim.State.neutral(model, n)
    target = state.q.clone()

    def step(q, qd, frozen):
        res = sim.step(ke.sim.State(q=q, qd=qd, frozen=frozen), ke.sim.Control(q_target=target))
        return res.state.q, res.state.qd, res.state.frozen

    q, qd, frozen = step(state.q, state.qd, state.frozen)  # eager first: traces the FK program
    fn = torch.compile(step, dynamic=False) if compile_step else step
    for _ in range(5):
        q, qd, frozen = fn(q, qd, frozen)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or done < 10 * n:
        for _ in range(10):
            q, qd, frozen = fn(q, qd, frozen)
        done += 10 * n
    rate = done / (time.perf_counter() - t0)
    return rate, float(q[:, 2].min())


def busy_processes(count: int) -> list[subprocess.Popen]:
    """``count`` processes that spin on a core each until killed (the loaded-machine case)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="1,64,1024")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch intra-op threads (default 1; the machine has {os.cpu_count()} cores)",
    )
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes to run beside the benchmark")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--solver", default="auto", choices=[x.value for x in ke.sim.LinearSolver])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the step (CPU, opt-in; slow to compile)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = busy_processes(args.load)
    try:
        run(args)
    finally:
        for p in load:
            p.kill()
            p.wait()


def run(args):
    torch.set_flush_denormal(True)
    path = DATA / "mjcf/mujoco/humanoid.xml"
    desc = ke.asset.MJCFLoader.load(path)
    model = ke.sim.Model.from_desc(
        desc, dtype=getattr(torch, args.dtype), drive_stiffness=KP, drive_damping=KD, effort_limit=float("inf")
    )
    mj_rate, mj_z = mujoco_rate(path, None, args.seconds)
    mj60_rate, mj60_z = mujoco_rate(path, DT, args.seconds)
    print(f"MuJoCo humanoid standing under PD (kp {KP:g}, kd {KD:g}), ground contact, {desc.name}")
    print(
        f"  mujoco.rollout 1 thread, dt 5 ms   : {mj_rate:12,.0f} steps/s  ({mj_rate * 0.005:7.1f} sim-s/s, "
        f"torso z {mj_z:.2f} m after 1 s)"
    )
    print(
        f"  mujoco.rollout 1 thread, dt 1/60 s : {mj60_rate:12,.0f} steps/s  ({mj60_rate * DT:7.1f} sim-s/s, "
        f"torso z {mj60_z:.2f} m after 1 s)"
    )
    print(
        f"  kangengine, dt 1/60 s, {args.iterations} Newton iterations, {args.dtype}, {args.threads} torch threads "
        f"(of {os.cpu_count()} cores, {args.load} busy processes beside, OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}), solver {args.solver}"
        f"{', torch.compile' if args.compile else ''}:"
    )
    for n in (int(x) for x in args.worlds.split(",")):
        rate, z = ours_rate(model, n, args.seconds, args.iterations, args.compile, args.solver)
        print(
            f"    {n:5d} worlds : {rate:12,.0f} env-steps/s  {rate / mj60_rate:6.2f}x per step (MuJoCo at 1/60 s), "
            f"{rate * DT / (mj_rate * 0.005):6.2f}x per simulated second (MuJoCo at 5 ms)  (min torso z {z:.2f} m)"
        )


if __name__ == "__main__":
    main()

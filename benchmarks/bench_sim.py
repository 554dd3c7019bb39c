"""Simulator throughput on CPU: the MuJoCo humanoid standing on the ground under joint PD, environment
steps per second of ``ke.sim.Simulator`` at 1, 16, 64, 1024 and 4096 worlds, against ``mujoco.rollout`` (1
and 2 threads) on the same model with the same PD gains (position servos, implicitfast) measured in the same
run; wall time and CPU time (``process_time``) side by side, the first call (warm-up) apart.

Ours steps at h = 1/60 s (implicit: stable at control rates); MuJoCo at 1/60 s (the ratios) and, for
reference, at the model's own 5 ms step. The ratios are per environment step (the issue's CPU target: at
least 1x against one thread at 1024 worlds).

Ours uses ``--threads`` torch threads (default 1, the tracker's default: see docs/sim.md, "Threads");
``--load N`` starts N busy-loop processes for the run (the loaded-machine case: other work holding cores);
the OpenMP wait policy in force is printed (set ``OMP_WAIT_POLICY`` in the environment: it must be set
before torch loads). ``--solver`` picks the Newton solver (default ``auto``: the tree-sparse factorisation
from 256 worlds on CPU, a batched dense Cholesky below).

    python benchmarks/bench_sim.py [--worlds 1,16,64,1024,4096] [--threads N] [--load N] [--iterations 2]
        [--solver auto]
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


def mujoco_rate(path, dt: float | None, seconds: float, nthread: int = 1) -> dict:
    """Steps/s (wall and per CPU-second) of mujoco.rollout on ``nthread`` threads and the final torso height."""
    spec = mujoco.MjSpec.from_file(str(path))
    for act in spec.actuators:
        act.set_to_position(kp=KP, kv=KD)
        act.gear = [1, 0, 0, 0, 0, 0]
        act.ctrllimited = 0
    model = spec.compile()
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    if dt is not None:
        model.opt.timestep = dt
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    data = datas[0] if nthread == 1 else datas
    nstate = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    state0 = np.zeros(nstate)
    mujoco.mj_getState(model, datas[0], state0, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    targets = model.qpos0[model.jnt_qposadr[model.actuator_trnid[:, 0]]]
    nbatch = 8 * nthread
    nstep = max(10, int(round(1.0 / model.opt.timestep)))
    ctrl = np.tile(targets, (nbatch, nstep, 1))
    init = np.tile(state0, (nbatch, 1))
    rollout.rollout(model, data, init, ctrl[:, :10], persistent_pool=nthread > 1)  # warm-up
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        states, _ = rollout.rollout(model, data, init, ctrl, persistent_pool=nthread > 1)
        done += nbatch * nstep
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"rate": done / wall, "cpu_rate": done / cpu, "z": float(states[0, -1, 1 + 2])}  # torso z after 1 s


def ours_rate(
    model, n: int, seconds: float, iterations: int, compile_step: bool, solver: str, fast_path: bool = True
) -> dict:
    """Env-steps/s (wall and per CPU-second) of our step at ``n`` worlds, the first call's time (warm-up:
    the native FK kernel loaded or built, the fast path's kernel loaded or compiled, ``torch.compile`` when
    asked) and the lowest torso height. ``fast_path=False``: the torch step alone."""
    sim = ke.sim.Simulator(
        model, dt=DT, iterations=iterations, check_inputs=False, solver=solver, fast_path=fast_path and not compile_step
    )
    state = ke.sim.State.neutral(model, n)
    target = state.q.clone()

    def step(q, qd, frozen):
        res = sim.step(ke.sim.State(q=q, qd=qd, frozen=frozen), ke.sim.Control(q_target=target))
        return res.state.q, res.state.qd, res.state.frozen

    t0 = time.perf_counter()
    fn, mode = step, "eager"
    if compile_step:
        try:  # inductor needs a C compiler; its compiled graphs are cached on disk (TORCHINDUCTOR_CACHE_DIR)
            fn = torch.compile(step, dynamic=False)
            q, qd, frozen = fn(state.q, state.qd, state.frozen)
            mode = "torch.compile"
        except Exception as exc:  # noqa: BLE001 - any backend failure: measure eager, say so
            print(f"    torch.compile unavailable ({type(exc).__name__}: {exc}); eager instead")
            fn = step
    if mode == "eager":
        q, qd, frozen = fn(state.q, state.qd, state.frozen)
    warmup = time.perf_counter() - t0
    for _ in range(3):
        q, qd, frozen = fn(q, qd, frozen)
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds or done < 10 * n:
        for _ in range(10):
            q, qd, frozen = fn(q, qd, frozen)
        done += 10 * n
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if mode == "eager":
        mode = "fast path" if sim.fast_path and n <= sim.fast_path_max_worlds else "torch"
    return {"rate": done / wall, "cpu_rate": done / cpu, "warmup": warmup, "z": float(q[:, 2].min()), "mode": mode}


def busy_processes(count: int) -> list[subprocess.Popen]:
    """``count`` processes that spin on a core each until killed (the loaded-machine case)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="1,16,64,1024,4096")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch intra-op threads (default 1; the machine has {os.cpu_count()} cores)",
    )
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes to run beside the benchmark")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--solver", default="auto", choices=[x.value for x in ke.sim.LinearSolver])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the step (CPU, opt-in; slow to compile)")
    ap.add_argument("--compare", default="1,16", help="world counts at which the torch step is measured too")
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
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    mj5 = mujoco_rate(path, None, args.seconds)
    mj = {k: mujoco_rate(path, DT, args.seconds, nthread=k) for k in (1, 2)}
    print(f"MuJoCo humanoid standing under PD (kp {KP:g}, kd {KD:g}), ground contact, {desc.name}")
    print(
        f"  mujoco.rollout 1 thread, dt 5 ms   : {mj5['rate']:10,.0f} steps/s wall, {mj5['cpu_rate']:10,.0f} per CPU-s "
        f"({mj5['rate'] * 0.005:6.1f} sim-s/s, torso z {mj5['z']:.2f} m after 1 s)"
    )
    for k, r in mj.items():
        print(
            f"  mujoco.rollout {k} thread{'s' if k > 1 else ' '}, dt 1/60 s : {r['rate']:10,.0f} steps/s wall, "
            f"{r['cpu_rate']:10,.0f} per CPU-s (torso z {r['z']:.2f} m after 1 s)"
        )
    print(
        f"  kangengine, dt 1/60 s, {args.iterations} Newton iterations, {args.dtype}, {args.threads} torch threads "
        f"(of {os.cpu_count()} cores, {args.load} busy processes beside, OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}), solver {args.solver}"
        f"{', torch.compile' if args.compile else ''}; ratios per env-step against mujoco.rollout at 1/60 s "
        "(wall, and CPU time in brackets):"
    )
    compare = {int(x) for x in args.compare.split(",") if x}
    for n in (int(x) for x in args.worlds.split(",")):
        r = ours_rate(model, n, args.seconds, args.iterations, args.compile, args.solver)
        print(
            f"    {n:5d} worlds : {r['rate']:10,.0f} env-steps/s wall, {r['cpu_rate']:10,.0f} per CPU-s; "
            f"vs 1 thread {r['rate'] / mj[1]['rate']:6.2f}x ({r['cpu_rate'] / mj[1]['cpu_rate']:5.2f}x), "
            f"vs 2 threads {r['rate'] / mj[2]['rate']:6.2f}x ({r['cpu_rate'] / mj[2]['cpu_rate']:5.2f}x); "
            f"first call {r['warmup']:6.2f} s ({r['mode']}); min torso z {r['z']:.2f} m"
        )
        if n in compare and r["mode"] == "fast path":
            t = ours_rate(model, n, args.seconds, args.iterations, False, args.solver, fast_path=False)
            print(
                f"          torch step : {t['rate']:10,.0f} env-steps/s wall, {t['cpu_rate']:10,.0f} per CPU-s; "
                f"fast path / torch {r['rate'] / t['rate']:6.1f}x ({r['cpu_rate'] / t['cpu_rate']:5.1f}x)"
            )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()

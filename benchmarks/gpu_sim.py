"""Simulator throughput on CUDA: the MuJoCo humanoid standing on the ground under joint PD at 4096 and
16384 worlds, several steps captured in one CUDA graph (or ``torch.compile``), against ``mujoco.rollout``
(one CPU thread) on the same model with the same PD gains, measured in the same run.

Target on an H200-class GPU: >= 1.5M env-steps/s at 4096 worlds (MJX: 0.78M on the Gymnasium humanoid).
Exits with a message (status 0) when CUDA is absent.

    python benchmarks/gpu_sim.py [--worlds 4096,16384] [--steps-per-graph 10] [--mode graph|compile|eager]
        [--solver auto|dense|tree]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
from _common import DATA

import kangengine as ke

KP, KD, DT = 2000.0, 100.0, 1 / 60
SOLVER = "auto"  # --solver: Newton solver of the step (auto: dense Cholesky on CUDA)


def _make(model, n):
    sim = ke.sim.Simulator(model, dt=DT, check_inputs=False, solver=SOLVER)
    state = ke.sim.State.neutral(model, n)
    control = ke.sim.Control(q_target=state.q.clone())
    return sim, state, control


def run_graph(model, n: int, steps_per_graph: int, seconds: float):
    """Capture ``steps_per_graph`` steps (outputs copied back into the static state) and replay."""
    sim, state, control = _make(model, n)
    q, qd, frozen = state.q.clone(), state.qd.clone(), state.frozen.clone()

    def advance():
        res = sim.step(ke.sim.State(q=q, qd=qd, frozen=frozen), control)
        q.copy_(res.state.q)
        qd.copy_(res.state.qd)
        frozen.copy_(res.state.frozen)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        advance()  # first call: traces the FK program, allocates
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")  # any host synchronisation inside a step warns
            advance()
            torch.cuda.set_sync_debug_mode("default")
        advance()
    torch.cuda.current_stream().wait_stream(side)
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
    print(
        f"  {n:6d} worlds : host synchronisations inside one step: {len(syncs)}" + (f" ({syncs[0]})" if syncs else "")
    )
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps_per_graph):
            advance()
    return _time(lambda: graph.replay(), n * steps_per_graph, seconds, q)


def run_compiled(model, n: int, seconds: float):
    sim, state, control = _make(model, n)

    def step(q, qd, frozen):
        res = sim.step(ke.sim.State(q=q, qd=qd, frozen=frozen), control)
        return res.state.q, res.state.qd, res.state.frozen

    fn = torch.compile(step, mode="reduce-overhead", dynamic=False)
    box = [state.q, state.qd, state.frozen]

    def once():
        out = fn(*box)
        box[:] = [t.clone() for t in out]

    for _ in range(3):
        once()
    return _time(once, n, seconds, None, box)


def run_eager(model, n: int, seconds: float):
    sim, state, control = _make(model, n)
    box = [state]

    def once():
        box[0] = sim.step(box[0], control).state

    for _ in range(3):
        once()
    return _time(once, n, seconds, None, box)


def _time(fn, env_steps_per_call, seconds, q=None, box=None):
    torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if calls % 10 == 0:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 > seconds:
                break
    rate = calls * env_steps_per_call / (time.perf_counter() - t0)
    if q is None:
        last = box[0]
        q = last.q if hasattr(last, "q") else last
    return rate, float(q[:, 2].min())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="4096,16384")
    ap.add_argument("--steps-per-graph", type=int, default=10)
    ap.add_argument("--mode", default="graph", choices=["graph", "compile", "eager"])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-mujoco", action="store_true", help="skip the mujoco.rollout baseline")
    ap.add_argument("--solver", default="auto", choices=[x.value for x in ke.sim.LinearSolver])
    args = ap.parse_args()
    global SOLVER
    SOLVER = args.solver
    if not torch.cuda.is_available():
        print(
            "gpu_sim.py: CUDA is not available on this machine; nothing to measure "
            "(run benchmarks/bench_sim.py for the CPU figures)."
        )
        return 0
    path = DATA / "mjcf/mujoco/humanoid.xml"
    desc = ke.asset.MJCFLoader.load(path)
    model = ke.sim.Model.from_desc(
        desc, device="cuda", dtype=torch.float32, drive_stiffness=KP, drive_damping=KD, effort_limit=float("inf")
    )
    print(
        f"MuJoCo humanoid standing under PD (kp {KP:g}, kd {KD:g}), ground contact, dt 1/60 s, "
        f"{torch.cuda.get_device_name()}, mode {args.mode}, solver {args.solver}"
    )
    mj_rate = None
    if not args.no_mujoco:
        from bench_sim import mujoco_rate

        mj_rate, _ = mujoco_rate(path, None, 2.0)
        print(f"  mujoco.rollout 1 CPU thread, dt 5 ms : {mj_rate:14,.0f} steps/s")
    for n in (int(x) for x in args.worlds.split(",")):
        try:
            if args.mode == "graph":
                rate, z = run_graph(model, n, args.steps_per_graph, args.seconds)
            elif args.mode == "compile":
                rate, z = run_compiled(model, n, args.seconds)
            else:
                rate, z = run_eager(model, n, args.seconds)
        except Exception as exc:  # report and continue with the next size
            print(f"  {n:6d} worlds : failed in mode {args.mode}: {type(exc).__name__}: {exc}")
            continue
        ratio = f"  ratio {rate / mj_rate:8.1f}x vs mujoco.rollout" if mj_rate else ""
        print(f"  {n:6d} worlds : {rate:14,.0f} env-steps/s{ratio}  (min torso z {z:.2f} m)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

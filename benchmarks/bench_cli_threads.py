"""``kangengine validate`` on one clip with 1 and 2 torch threads, passive and spinning OpenMP waits, with and
without a busy loop on another core (issue 14 / 17: the thread defaults of the command).

Each configuration runs the real command in a fresh process (``--no-plots --overwrite``) on the shipped walk
converted once; the wall time and the process's CPU time (user + system, from ``RUSAGE_CHILDREN``) are
printed with the ratio to the default (``--threads 1``, ``OMP_WAIT_POLICY`` unset so the command sets
``PASSIVE``), measured in the same run. Usage::

    python benchmarks/bench_cli_threads.py [--repeats 2] [--busy]   # --busy: a `while 1: pass` process beside
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ((1, None), (2, None), (2, "ACTIVE"))  # (--threads, OMP_WAIT_POLICY given by the user)


def _command(*args: str, env: dict) -> tuple[float, float]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kangengine", *args], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="a busy-loop process runs beside each measurement")
    args = ap.parse_args()
    base_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    base_env["PYTHONPATH"] = str(REPO)
    model = str(REPO / "kangengine" / "data" / "humanoid_CMU.xml")
    with tempfile.TemporaryDirectory() as tmp:
        conv = Path(tmp) / "conv"
        _command("convert", "--example", "--out", str(conv), "--quiet", env=base_env)
        results: dict = {c: [] for c in CONFIGS}
        for _ in range(args.repeats):
            for threads, policy in CONFIGS:
                env = dict(base_env)
                if policy is not None:
                    env["OMP_WAIT_POLICY"] = policy
                busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if args.busy else None
                try:
                    load = os.getloadavg()[0]
                    wall, cpu = _command(
                        "validate", model, str(conv), "--out", str(Path(tmp) / f"val{threads}"), "--no-plots",
                        "--overwrite", "--quiet", "--threads", str(threads), env=env,
                    )  # fmt: skip
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                results[(threads, policy)].append((wall, cpu, load))
    print(f"cores {os.cpu_count()}, busy loop beside: {args.busy}; validate of the shipped walk (343 frames)")
    base_wall = min(w for w, _, _ in results[CONFIGS[0]])
    base_cpu = min(c for _, c, _ in results[CONFIGS[0]])
    for (threads, policy), runs in results.items():
        wall = min(w for w, _, _ in runs)
        cpu = min(c for _, c, _ in runs)
        loads = ", ".join(f"{x:.1f}" for _, _, x in runs)
        print(
            f"--threads {threads}  OMP_WAIT_POLICY={policy or 'PASSIVE (set by kangengine)':28s} wall {wall:7.2f} s "
            f"({wall / base_wall:5.2f}x)  cpu {cpu:7.2f} s ({cpu / base_cpu:5.2f}x)  load1 {loads}"
        )


if __name__ == "__main__":
    main()

"""Mutation fuzzing of the file readers (BVH, FBX, MJCF, URDF) at scale: prints the count of each outcome.

The mutators, the result checks and the memory bound are those of ``tests/test_fuzz_readers.py`` (which runs a
few dozen cases per reader in CI); this script runs many more, from other seeds, and lists every case that is
neither read cleanly nor refused with a ``KangEngineError``.

    .venv/bin/python benchmarks/fuzz_readers.py                 # 500 cases per reader
    .venv/bin/python benchmarks/fuzz_readers.py --cases 3000 --readers fbx --seed 5

Outcomes: ``loaded`` (read, result finite with unit quaternions), ``refused`` (a KangEngineError), ``crashed``
(any other exception), ``bad result`` (NaN, inf or a non-unit quaternion returned), ``memory`` (traced peak over
the bound). Wall and process time per case are printed beside the counts (one thread).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_fuzz_readers as fz  # noqa: E402  (the mutators and checks, one implementation)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500, help="cases per reader (default 500)")
    ap.add_argument("--seed", type=int, default=1, help="first seed (the CI test uses 17)")
    ap.add_argument("--readers", nargs="*", default=sorted(fz.READERS), choices=sorted(fz.READERS))
    ap.add_argument("--show", type=int, default=20, help="failing cases listed per reader")
    args = ap.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.readers:
            reader = fz.READERS[name]
            counts: dict[str, int] = {}
            failures = []
            peak = 0
            wall, cpu = time.perf_counter(), time.process_time()
            for desc, data in fz.cases(reader, seed=args.seed, count=args.cases):
                out = fz.run_case(reader, data, Path(tmp) / f"case{reader.suffix}")
                counts[out.kind] = counts.get(out.kind, 0) + 1
                peak = max(peak, out.peak_bytes)
                if out.kind not in ("loaded", "refused"):
                    failures.append(f"  {desc}: {out.kind}: {out.detail}")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(
                f"{name:5s} {args.cases} cases: {summary}; traced peak {peak / 2**20:.1f} MiB; "
                f"{1e3 * wall / args.cases:.1f} ms wall, {1e3 * cpu / args.cases:.1f} ms process time per case"
            )
            for line in failures[: args.show]:
                print(line)
            failed += len(failures)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"failing cases: {failed}; process max RSS {rss:.0f} MiB (C allocations of libassimp/MuJoCo included)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

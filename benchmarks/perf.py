"""Measure `bsa gen`, `bsa run` (the reference device) and `bsa compare` end to end, their start-up, and the
floor they stand on, before (BASE) and now, side by side in one run; or check the rounding on all 2**32 floats.

Prints, for BASE (default: bc5c210, the last commit before issue 34) and this checkout, each in seconds and
as a share of the floor (floor / time: 1.0 would be a command that does nothing but the floor's work):
  gen       `bsa gen SPEC -j 1` of the case, a fresh process (start-up, inputs, forward, golden, benchmark,
            summary, files)
  run       `bsa run` of the folder gen wrote (the reference device, one worker)
  compare   `bsa compare` of that folder after the run
  start-up  `bsa --help`, and `bsa gen --help` (start-up of a command: its imports)
and the floors, measured in a process of their own in the same round:
  floor     the matmuls and exponentials `bsa gen` must do, done bare with NumPy on the same case and
            mask, block row by block row on gathered blocks (the gathers not timed): the float64 forward
            (Q K^T, exp, P V), the float32 golden (dO V^T, P^T dO, dS^T Q, dS K) and the float32 kernel path
            (Q K^T, exp, dO V^T, P^T dO, dS K, dS^T Q)
  floor run the kernel path's alone: what the reference device must do
gen's and compare's shares are of the floor, run's of the floor run.

Usage: python benchmarks/perf.py [--base REV] [--rounds N] [--quick] [--cpu]
       python benchmarks/perf.py --rounding      (all 2**32 float32 patterns, today's rounding vs bc5c210's)

Case: B 1, N 4, S 8192, D 128, fp16, 128x128 blocks, random density 0.2 (the nightly suite's
nightly-random-8k.fp16); --quick: S 4096. Every process runs with BLAS on one thread (`ONE_THREAD`) and
the environment as it is (say, PYTHONDONTWRITEBYTECODE). Measurements run in rounds, one of each per round,
and each keeps its best round, so a burst of load on the shared machine cannot fall on one side of a ratio
only; the load average is printed before and after. --cpu measures CPU time (user + system: of each child
process, of the floor's calls) instead of wall time, which a machine busy with other work inflates least.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHECKOUT = Path(__file__).resolve().parent.parent

#: BLAS on one thread in every child: the floor is one core's, as bsa's golden is (blas.one_thread_each).
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}

SPEC = """defaults: {{layout: BNSD, head_dim: 128, block_shape: [128, 128], seed: 11}}
cases:
  - name: perf
    dtype: fp16
    batch: 1
    num_heads: 4
    q_seq_len: {seq}
    sparsity: {{pattern: random, density: 0.2}}
"""

FLOOR = r"""
import json, sys, time
import numpy as np
from bsa_cli.inputs import make_mask
from bsa_cli.specs import load_specs

case = load_specs([sys.argv[1]])[0]
mask = np.asarray(make_mask(case))[0] != 0
heads, seq, dim, (x, y) = case.num_heads, case.q_seq_len, case.head_dim, case.block_shape
rng = np.random.default_rng(0)
q32, k32, v32, do32 = (rng.standard_normal((heads, seq, dim), dtype=np.float32) * 0.5 for _ in range(4))
q64, k64, v64 = q32.astype(np.float64), k32.astype(np.float64), v32.astype(np.float64)
spent = {"forward": 0.0, "golden": 0.0, "kernel": 0.0}
clock = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
for h in range(heads):
    for r, row in enumerate(mask[h]):
        sel = np.flatnonzero(row)
        if not sel.size:
            continue
        cols = (sel[:, None] * y + np.arange(y)).reshape(-1)
        K64, V64, K32, V32 = k64[h, cols], v64[h, cols], k32[h, cols], v32[h, cols]
        rows = slice(r * x, (r + 1) * x)
        qa, qb, do = q64[h, rows], q32[h, rows], do32[h, rows]
        start = clock()
        s = qa @ K64.T
        np.exp(s - s.max(axis=1, keepdims=True), out=s)
        out = s @ V64
        middle = clock()
        p = s.astype(np.float32)
        resumed = clock()
        dp = do @ V32.T
        dv, dk, dq = p.T @ do, dp.T @ qb, dp @ K32
        golden = clock()
        s32 = qb @ K32.T
        np.exp(s32, out=s32)
        dp32 = do @ V32.T
        dv, dq, dk = s32.T @ do, dp32 @ K32, dp32.T @ qb
        end = clock()
        spent["forward"] += middle - start
        spent["golden"] += golden - resumed
        spent["kernel"] += end - golden
print(json.dumps({"floor": sum(spent.values()), "floor run": spent["kernel"]}))
"""


def export(rev: str, into: Path) -> Path:
    """Write `rev`'s bsa_cli into `into` with `git archive`; return it."""
    archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", rev, "bsa_cli"], check=True, capture_output=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(code: Path, args: list[str], cpu: bool) -> float:
    """Return the wall (or CPU) time of `python -m bsa_cli ARGS` with the bsa of `code` (exit 0 or 1: a verdict)."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(code)}
    start, start_cpu = time.perf_counter(), children_cpu()
    command = [sys.executable, "-m", "bsa_cli", *args]  # in `code`: `-m` looks in the working folder first
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    seconds = children_cpu() - start_cpu if cpu else time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"bsa {' '.join(args)} ({code}): exit {done.returncode}\n{done.stderr}")
    return seconds


def one_round(codes: dict[str, Path], spec: Path, work: Path, cpu: bool) -> dict[str, float]:
    """Measure every command with every code, and the floors, once; return {what: seconds}."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(CHECKOUT)}
    clock = "cpu" if cpu else "wall"
    floor = subprocess.run([sys.executable, "-c", FLOOR, str(spec), clock], env=env, capture_output=True, text=True)
    if floor.returncode:
        raise SystemExit(floor.stderr)
    times: dict[str, float] = json.loads(floor.stdout)
    for label, code in codes.items():
        out = work / label
        shutil.rmtree(out, ignore_errors=True)
        times[f"{label} gen"] = timed(code, ["gen", str(spec), "-j", "1", "-o", str(out)], cpu)
        times[f"{label} run"] = timed(code, ["run", str(out)], cpu)
        times[f"{label} compare"] = timed(code, ["compare", str(out)], cpu)
        times[f"{label} --help"] = timed(code, ["--help"], cpu)
        times[f"{label} gen --help"] = timed(code, ["gen", "--help"], cpu)
    return times


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def commands(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bsa-perf-") as tmp:
        work = Path(tmp)
        spec = work / "perf.yaml"
        spec.write_text(SPEC.format(seq=4096 if args.quick else 8192))
        codes = {"base": export(args.base, work / "base-code"), "now": CHECKOUT}
        print(f"load average before: {load()} ({os.cpu_count()} CPUs)", flush=True)
        best: dict[str, float] = {}
        for number in range(args.rounds):
            for what, seconds in one_round(codes, spec, work, args.cpu).items():
                best[what] = min(best.get(what, np.inf), seconds)
            print(f"round {number + 1} done, load average {load()}", flush=True)
    clock = "CPU time (user + system)" if args.cpu else "wall time"
    print(f"{clock}, best of {args.rounds} rounds: floor {best['floor']:.2f} s, floor run {best['floor run']:.2f} s")
    print(f"{'':18}{'base ' + args.base:>22}{'now':>22}")
    for what in ("gen", "run", "compare", "--help", "gen --help"):
        floor = best["floor run"] if what == "run" else best["floor"]
        cells = []
        for label in ("base", "now"):
            seconds = best[f"{label} {what}"]
            share = f"{floor / seconds:.0%} of floor" if "--help" not in what else ""
            cells.append(f"{seconds:6.2f} s {share:>13}")
        print(f"{what:18}" + "".join(f"{cell:>22}" for cell in cells))
    print(f"load average after: {load()}")


def rounding_check() -> None:
    """Round every float32 bit pattern to float16 and bfloat16, both tie rules, with today's code and bc5c210's
    (tests/rounding_bc5c210.py); print how many differ (0 is the answer) and each one's time.

    `round_float32` is compared on all 2**32 patterns. `to_dtype` from float32 is that rounding followed by an
    exact conversion of float16-valued (bfloat16-valued) float32s: bc5c210's by NumPy's cast, today's by bit
    operations; that conversion is compared on every one of its 2**16 inputs (every float16 and bfloat16
    value, inf and NaN payloads included), which with the rounding's check covers `to_dtype` on all 2**32.
    """
    sys.path[:0] = [str(CHECKOUT)]
    from bsa_cli.core import rounding
    from tests import rounding_bc5c210 as before

    chunk = 1 << 24
    spent = {"before": 0.0, "now": 0.0}
    differ = 0
    for dtype in (rounding.FLOAT16, rounding.bfloat16()):
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).astype(np.float32)
        with np.errstate(all="ignore"):
            want, got = before.to_dtype(every, dtype), rounding.to_dtype(every, dtype)
        wrong = int(np.count_nonzero(want.view(np.uint16) != got.view(np.uint16)))
        print(f"{dtype.name}: the conversion of all 2**16 {dtype.name} values: {wrong} differences", flush=True)
        differ += wrong
        for ties in ("even", "away"):
            wrong = 0
            for first in range(0, 1 << 32, chunk):
                values = np.arange(first, first + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
                with np.errstate(all="ignore"):
                    start = time.perf_counter()
                    want = before.round_float32(values, dtype, ties)
                    middle = time.perf_counter()
                    got = rounding.round_float32(values, dtype, ties)
                    spent["before"] += middle - start
                    spent["now"] += time.perf_counter() - middle
                wrong += int(np.count_nonzero(want.view(np.uint32) != got.view(np.uint32)))
            print(f"{dtype.name} ties {ties}: all 2**32 float32 patterns, {wrong} differences", flush=True)
            differ += wrong
    print(f"round_float32 on 4 x 2**32 values: bc5c210 {spent['before']:.1f} s, now {spent['now']:.1f} s (wall)")
    sys.exit(1 if differ else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="bc5c210")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="S 4096 instead of 8192")
    parser.add_argument("--cpu", action="store_true", help="CPU time (user + system) instead of wall time")
    parser.add_argument("--rounding", action="store_true", help="check the rounding on all 2**32 float32 patterns")
    args = parser.parse_args()
    if args.rounding:
        rounding_check()
    else:
        commands(args)


if __name__ == "__main__":
    main()

"""Benchmark the golden engine and the comparator, measured side by side in one run.

Prints, each as a ratio against a reference measured in the same run:
  1. golden forward + backward (float32), as `bsa gen` runs it (`golden.forward_backward`), vs NumPy's
     float32 matmul rate: in this process (`-j 1`, BLAS on all cores) and over kv-head groups in
     2 processes with one BLAS thread each (`-j 2`)                          (target >= 0.60)
  2. the same golden vs a dense PyTorch CPU autograd reference             (target >= 15x faster)
  3. kernel-faithful backward and the float64 golden vs the float32 golden  (target <= 2.5x)
  4. peak memory of a 131072-token case vs the bytes of its inputs+outputs (target <= 3x)
  5. `bsa compare` throughput, a fresh process over a suite run by `bsa run` (target >= 200 MB/s)

Usage: python benchmarks/golden_speed.py [--quick] [--skip-long] [--long-causal]
FLOPs follow docs/operator.md section 6: 14 X Y D per selected block pair for forward + backward.
Timings are wall-clock bests of a few runs; the load average is printed because a busy machine slows both
sides of a ratio unevenly (BLAS threads suffer most).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bsa_cli import golden
from bsa_cli.case import Case, Sparsity
from bsa_cli.inputs import make_mask, make_tensors, mask_stats

SINGLE_THREAD = {var: "1" for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def best_of(repeats: int, fn) -> float:
    """Return the fastest wall time of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rate(size: int = 512, repeats: int = 20) -> float:
    """Return NumPy's float32 matmul rate in FLOP/s on size x size matrices (BLAS threads as configured)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    seconds = best_of(5, lambda: [a @ b for _ in range(repeats)])
    return 2 * size**3 * repeats / seconds


def single_thread_matmul_rate() -> float:
    """Return NumPy's float32 matmul rate with one BLAS thread, measured in a child process."""
    here = str(Path(__file__).resolve().parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import golden_speed as g; print(g.matmul_rate())"
    env = dict(os.environ, **SINGLE_THREAD)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(result.stdout.split()[-1])


def make_case(seq: int, heads: int, pattern: str, density: float = 0.2) -> Case:
    return Case(name=f"bench-{seq}", source="benchmark", layout="BNSD", dtype="float16", batch=1, num_heads=heads,
                num_kv_heads=heads, head_dim=128, q_seq_len=seq, kv_seq_len=seq, actual_seq_lengths=None,
                actual_seq_lengths_kv=None, block_shape=(128, 128), scale=128**-0.5, seed=0,
                sparsity=Sparsity(pattern=pattern, density=density))  # fmt: skip


def golden_group(group: tuple[Case, dict[str, np.ndarray]]) -> None:
    """Run the golden forward + backward (float32) of one kv-head group; for the worker pool."""
    case, t = group
    golden.forward_backward(case, t["dout"], t["query"], t["key"], t["value"], t["block_sparse_mask"], np.float32)


def golden_rates(case: Case, tensors: dict[str, np.ndarray], mask: np.ndarray, rounds: int) -> dict[str, float]:
    """Time the matmul reference and the golden (-j 1 and over kv-head groups in 2 processes) in turns.

    Each round measures all three one after another, and each figure keeps its best round, so a burst of
    load on the shared machine cannot fall on one side of a ratio only.
    """
    from bsa_cli.generate import _group_inputs
    from bsa_cli.workers import worker_pool

    inputs = (case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"], mask)
    groups = [_group_inputs(case, dict(tensors, block_sparse_mask=mask), g) for g in range(case.num_kv_heads)]
    best = {"rate": 0.0, "golden": math.inf, "parallel": math.inf}
    with worker_pool(2) as pool:
        list(pool.map(golden_group, groups[:2]))  # start the workers and import NumPy there
        for _ in range(rounds):
            best["rate"] = max(best["rate"], matmul_rate())
            best["golden"] = min(best["golden"], best_of(1, lambda: golden.forward_backward(*inputs, np.float32)))
            best["parallel"] = min(best["parallel"], best_of(1, lambda: list(pool.map(golden_group, groups))))
    return best


def torch_dense_seconds(case: Case, tensors, mask) -> dict[str, float] | None:
    """Time dense PyTorch autograd references (full S x S masked attention) on the same inputs.

    All given their best chance (all cores, the mask built beforehand, no needless S x S passes): the
    explicit formula (scores, in-place mask, softmax, P V, `.backward`) in float32, PyTorch's own fused
    `scaled_dot_product_attention` with the boolean element mask in float32, and the explicit formula in
    float64, the precision of the test suite's oracle (tests/oracle.py).
    """
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    x, y = case.block_shape
    keep = torch.from_numpy(np.repeat(np.repeat(mask[0] != 0, x, axis=1), y, axis=2))
    q, k, v, do = (torch.from_numpy(tensors[n][0].astype(np.float32)) for n in ("query", "key", "value", "dout"))
    empty_rows = not bool(keep.any(dim=-1).all())

    def explicit(dtype: torch.dtype) -> None:
        qq, kk, vv = (t.to(dtype, copy=True).requires_grad_(True) for t in (q, k, v))
        scores = (qq * case.scale) @ kk.transpose(-1, -2)
        scores.masked_fill_(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if empty_rows:
            probs = probs.nan_to_num(0.0)
        (probs @ vv).backward(do.to(dtype))

    def sdpa() -> None:
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        F.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep, scale=case.scale).backward(do)

    times = {"explicit": best_of(1, lambda: explicit(torch.float32))}
    if not empty_rows:  # SDPA gives NaN on fully masked rows; the explicit formula is the reference then
        times["sdpa"] = best_of(1, sdpa)
    times["explicit float64"] = best_of(1, lambda: explicit(torch.float64))  # the test oracle's precision
    return times


def peak_memory_child(seq: int, pattern: str, density: float) -> dict:
    """Generate one long case in a fresh process; return its peak RSS and the bytes it wrote.

    The peak is the process's own high-water mark (VmHWM, reset at exec); `ru_maxrss` is not, on Linux it
    keeps the parent's size at the fork.
    """
    code = f"""
import json, resource, sys, tempfile, pathlib

def peak_rss():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

base = peak_rss()
from bsa_cli.case import Case, Sparsity
from bsa_cli.generate import generate_case
case = Case(name="long", source="benchmark", layout="BNSD", dtype="float16", batch=1, num_heads=1, num_kv_heads=1,
            head_dim=128, q_seq_len={seq}, kv_seq_len={seq}, actual_seq_lengths=None, actual_seq_lengths_kv=None,
            block_shape=(128, 128), scale=128**-0.5, seed=0, sparsity=Sparsity(pattern={pattern!r}, density={density}))
with tempfile.TemporaryDirectory() as out:
    path = generate_case(case, pathlib.Path(out))
    written = sum(p.stat().st_size for p in path.rglob("*.bin"))
print(json.dumps({{"baseline": base, "peak": peak_rss(), "written": written}}))
"""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["seconds"] = time.perf_counter() - start
    return figures


def compare_throughput(seq: int, cases: int) -> dict[str, float]:
    """Time `bsa compare` as users run it, on a suite run on the reference device by `bsa run`.

    The suite is `cases` cases of the benchmark's shape (fp16 and bf16). Each `bsa compare` is a fresh
    process: what it prints ("judged N MB ... in S s") leaves out the interpreter's start, the wall time
    around it does not. Both are measured twice, the better kept.
    """
    import dataclasses

    from bsa_cli.generate import generate_suite

    base = make_case(seq, 4, "random", 0.2)
    suite = [dataclasses.replace(base, name=f"cmp-{i}", seed=i, dtype=("float16", "bfloat16")[i % 2])
             for i in range(cases)]  # fmt: skip
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out:
        generate_suite(suite, Path(out), jobs=os.cpu_count() or 1)
        bsa = [sys.executable, "-m", "bsa_cli"]
        subprocess.run([*bsa, "run", out], capture_output=True, check=True)
        figures["megabytes"] = sum(p.stat().st_size for p in Path(out).glob("*/outputs/d*.bin")) / 1e6
        for _ in range(2):
            start = time.perf_counter()
            result = subprocess.run([*bsa, "compare", out], capture_output=True, text=True)
            wall = time.perf_counter() - start
            judged = [line for line in result.stderr.splitlines() if line.startswith("judged")]
            if result.returncode != 0 or not judged:
                raise RuntimeError(f"bsa compare failed ({result.returncode}): {result.stdout}{result.stderr}")
            seconds = float(judged[-1].split(" in ")[1].split()[0])
            figures["seconds"] = min(figures.get("seconds", seconds), seconds)
            figures["wall"] = min(figures.get("wall", wall), wall)
    return figures


def load() -> str:
    """Return the load averages, with a warning when other work competes for the cores."""
    averages = os.getloadavg()
    text = "load average " + " ".join(f"{x:.2f}" for x in averages)
    if averages[0] > 0.5:
        text += " (other work is running: the matmul reference drops more than the golden, ratios read high)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S=4096 instead of 8192 (a smoke run of this script)")
    parser.add_argument("--skip-long", action="store_true", help="skip the 131072-token memory case")
    parser.add_argument(
        "--long-causal", action="store_true", help="also generate the causal 131072-token case (several minutes)"
    )
    args = parser.parse_args()
    seq = 4096 if args.quick else 8192
    print(f"machine: {os.cpu_count()} cores, numpy {np.__version__}; {load()}")

    case = make_case(seq, 4, "random", 0.2)
    tensors = make_tensors(case)
    mask = make_mask(case)
    stats = mask_stats(case, mask)
    flops = stats["flops_forward"] + stats["flops_backward"]
    inputs = (case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"])

    def fused(precision) -> tuple[np.ndarray, ...]:
        return golden.forward_backward(*inputs, mask, precision=precision)

    out, lse = fused(np.float32)[:2]
    given = (*inputs, out, lse, mask)
    print(f"\ncase B=1 N=4 S={seq} D=128 X=Y=128 random density {stats['density']:.3f}: "
          f"{stats['selected_blocks']} selected blocks, {flops / 1e9:.1f} GFLOP (14 X Y D per block)")  # fmt: skip

    rate_1 = single_thread_matmul_rate()
    timed = golden_rates(case, tensors, mask, rounds=4)
    rate, t_golden, t_parallel = timed["rate"], timed["golden"], timed["parallel"]
    print(f"numpy float32 matmul 512x512: {rate / 1e9:.1f} GFLOP/s ({os.cpu_count()} threads), "
          f"{rate_1 / 1e9:.1f} GFLOP/s (1 thread); {load()}")  # fmt: skip
    for label, seconds in (("one pass, -j 1:", t_golden), ("over kv-head groups in 2 processes, -j 2:", t_parallel)):
        print(f"golden forward (float64) + backward (float32), {label} {seconds:.2f} s = {flops / seconds / 1e9:.1f} "
              f"GFLOP/s = {flops / seconds / rate:.2f} of the matmul rate   (target >= 0.60)")  # fmt: skip

    t_forward = best_of(2, lambda: golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask))
    t_b32 = best_of(2, lambda: golden.backward(*given, precision=np.float32))
    t_kernel = best_of(2, lambda: golden.backward_kernel(*given))
    t_b64 = best_of(2, lambda: golden.backward(*given, precision=np.float64))
    t_f64 = best_of(2, lambda: fused(np.float64))
    print(f"  separately: forward {t_forward:.2f} s + float32 backward {t_b32:.2f} s = {t_forward + t_b32:.2f} s")
    print(f"kernel-faithful backward: {t_kernel:.2f} s = {t_kernel / t_b32:.2f}x the float32 backward, "
          f"{t_kernel / t_golden:.2f}x the one-pass golden   (target <= 2.5)")  # fmt: skip
    print(f"float64 golden: one pass {t_f64:.2f} s = {t_f64 / t_golden:.2f}x the float32 one; backward alone "
          f"{t_b64:.2f} s = {t_b64 / t_b32:.2f}x the float32 backward   (target <= 2.5)")  # fmt: skip

    dense = torch_dense_seconds(case, tensors, mask)
    if dense is None:
        print("dense PyTorch reference: torch not installed (pip install -e '.[test]')")
    else:
        named = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in dense.items())
        fastest = min(seconds for name, seconds in dense.items() if name != "explicit float64")
        slow = dense["explicit float64"]
        print(f"dense PyTorch autograd references: {named}")
        print(f"  against the fastest float32 one the golden is {fastest / t_golden:.1f}x faster with -j 1, "
              f"{fastest / t_parallel:.1f}x with -j 2   (target >= 15); against the float64 formula "
              f"(the test oracle's precision) {slow / t_golden:.1f}x and {slow / t_parallel:.1f}x")  # fmt: skip

    if not args.skip_long:
        long_cases = [("random", 0.05)] + ([("causal", 1.0)] if args.long_causal else [])
        for pattern, density in long_cases:
            fig = peak_memory_child(131072, pattern, density)
            grown = fig["peak"] - fig["baseline"]
            print(f"S=131072 N=1 {pattern} (density {density}): gen {fig['seconds']:.1f} s, peak RSS "
                  f"{fig['peak'] / 2**20:.0f} MiB ({grown / 2**20:.0f} MiB above the bare interpreter's), "
                  f"inputs+outputs {fig['written'] / 2**20:.0f} MiB: ratio {fig['peak'] / fig['written']:.2f}"
                  "   (target <= 3)")  # fmt: skip

    judged = compare_throughput(seq, 4 if args.quick else 8)
    size = judged["megabytes"]
    print(f"bsa compare (fresh process, suite run by bsa run): {size:.0f} MB of outputs judged in "
          f"{judged['seconds']:.2f} s = {size / judged['seconds']:.0f} MB/s   (target >= 200); with the "
          f"interpreter's start {judged['wall']:.2f} s = {size / judged['wall']:.0f} MB/s")  # fmt: skip
    print(load())


if __name__ == "__main__":
    main()

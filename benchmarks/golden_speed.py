"""Benchmark the golden engine and the comparator, measured side by side in one run.

Prints, each as a ratio against a reference measured in the same run:
  1. golden forward + backward (float32) vs NumPy's float32 matmul rate   (target >= 0.60)
  2. golden vs a dense PyTorch CPU autograd reference                      (target >= 15x faster)
  3. kernel-faithful benchmark and float64 backward vs the float32 golden (target <= 2.5x)
  4. peak memory of a 131072-token case vs the bytes of its inputs+outputs (target <= 3x)
  5. bsa compare throughput over device outputs                          (target >= 200 MB/s)

Usage: python benchmarks/golden_speed.py [--quick] [--skip-long]
FLOPs follow DOMAIN.md section 6: 14 X Y D per selected block pair for forward + backward.
"""

from __future__ import annotations

import argparse
import json
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


def best_of(repeats: int, fn) -> float:
    """Return the fastest wall time of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rate(size: int = 512, repeats: int = 20) -> float:
    """Return NumPy's float32 matmul rate in FLOP/s on size x size matrices."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    seconds = best_of(3, lambda: [a @ b for _ in range(repeats)])
    return 2 * size**3 * repeats / seconds


def make_case(seq: int, heads: int, pattern: str, density: float = 0.2) -> Case:
    return Case(name=f"bench-{seq}", source="benchmark", layout="BNSD", dtype="float16", batch=1, num_heads=heads,
                num_kv_heads=heads, head_dim=128, q_seq_len=seq, kv_seq_len=seq, actual_seq_lengths=None,
                actual_seq_lengths_kv=None, block_shape=(128, 128), scale=128**-0.5, seed=0,
                sparsity=Sparsity(pattern=pattern, density=density))  # fmt: skip


def prepared(case: Case):
    tensors = make_tensors(case)
    mask = make_mask(case)
    out, lse = golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
    out = out.astype(np.float16)
    lse = lse.astype(np.float32)
    return tensors, mask, out, lse


def torch_dense_seconds(case: Case, tensors, mask) -> float | None:
    """Time a dense fp32 PyTorch autograd reference (full S x S masked attention) on the same inputs."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    x, y = case.block_shape
    element_mask = torch.from_numpy(np.repeat(np.repeat(mask[0] != 0, x, axis=1), y, axis=2))
    q, k, v, do = (torch.from_numpy(tensors[n][0].astype(np.float32)) for n in ("query", "key", "value", "dout"))

    def run() -> None:
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        scores = (qq @ kk.transpose(-1, -2)) * case.scale
        scores = scores.masked_fill(~element_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out = probs @ vv
        out.backward(do)

    return best_of(1, run)


def peak_memory_child(seq: int, pattern: str, density: float) -> dict:
    """Generate one long case in a fresh process; return its peak RSS and the bytes it wrote."""
    code = f"""
import json, resource, sys, tempfile, pathlib
from bsa_cli.case import Case, Sparsity
from bsa_cli.generate import generate_case
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
case = Case(name="long", source="benchmark", layout="BNSD", dtype="float16", batch=1, num_heads=1, num_kv_heads=1,
            head_dim=128, q_seq_len={seq}, kv_seq_len={seq}, actual_seq_lengths=None, actual_seq_lengths_kv=None,
            block_shape=(128, 128), scale=128**-0.5, seed=0, sparsity=Sparsity(pattern={pattern!r}, density={density}))
with tempfile.TemporaryDirectory() as out:
    path = generate_case(case, pathlib.Path(out))
    written = sum(p.stat().st_size for p in path.rglob("*.bin"))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"baseline": base, "peak": peak, "written": written}}))
"""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["seconds"] = time.perf_counter() - start
    return figures


def compare_throughput(seq: int) -> tuple[float, float] | None:
    """Generate a case, emulate its outputs, and time `bsa compare` on it: (MB of outputs, seconds)."""
    try:
        from bsa_cli import compare, emulator
        from bsa_cli.generate import generate_case
    except ImportError:
        return None
    case = make_case(seq, 4, "random", 0.2)
    with tempfile.TemporaryDirectory() as out:
        case_dir = generate_case(case, Path(out))
        emulator.emulate_case_dir(case_dir, case_dir / "outputs")
        size = sum(p.stat().st_size for p in (case_dir / "outputs").glob("d*.bin"))
        seconds = best_of(2, lambda: compare.compare_case(case_dir))
    return size / 1e6, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S=4096 instead of 8192 (a smoke run of this script)")
    parser.add_argument("--skip-long", action="store_true", help="skip the 131072-token memory case")
    args = parser.parse_args()
    seq = 4096 if args.quick else 8192
    print(f"machine: {os.cpu_count()} cores, numpy {np.__version__}")

    rate = matmul_rate()
    print(f"numpy float32 matmul 512x512: {rate / 1e9:.1f} GFLOP/s")

    case = make_case(seq, 4, "random", 0.2)
    tensors, mask, out, lse = prepared(case)
    stats = mask_stats(case, mask)
    flops = stats["flops_forward"] + stats["flops_backward"]
    args32 = (case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"], out, lse, mask)

    def golden32() -> None:
        golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
        golden.backward(*args32, precision=np.float32)

    t_golden = best_of(2, golden32)
    t_forward = best_of(2, lambda: golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask))
    t_kernel = best_of(2, lambda: golden.backward_kernel(*args32))
    t_f64 = best_of(2, lambda: golden.backward(*args32, precision=np.float64))
    t_b32 = t_golden - t_forward
    print(f"\ncase B=1 N=4 S={seq} D=128 X=Y=128 random density {stats['density']:.3f}: "
          f"{stats['selected_blocks']} selected blocks, {flops / 1e9:.1f} GFLOP")  # fmt: skip
    print(f"golden forward (float64) + backward (float32): {t_golden:.2f} s = {flops / t_golden / 1e9:.1f} GFLOP/s")
    print(f"  ratio to numpy matmul rate: {flops / t_golden / rate:.2f}   (target >= 0.60)")
    print(f"  of which forward {t_forward:.2f} s, backward {t_b32:.2f} s")
    print(f"kernel-faithful backward: {t_kernel:.2f} s = {t_kernel / t_b32:.2f}x the float32 backward   (target <= 2.5)")
    print(f"float64 backward:         {t_f64:.2f} s = {t_f64 / t_b32:.2f}x the float32 backward   (target <= 2.5)")

    t_torch = torch_dense_seconds(case, tensors, mask)
    if t_torch is None:
        print("dense PyTorch reference: torch not installed (pip install -e '.[test]')")
    else:
        print(f"dense PyTorch fp32 autograd reference: {t_torch:.2f} s; golden is {t_torch / t_golden:.1f}x faster"
              "   (target >= 15)")  # fmt: skip

    if not args.skip_long:
        for pattern, density in (("causal", 1.0), ("random", 0.05)):
            fig = peak_memory_child(131072, pattern, density)
            grown = fig["peak"] - fig["baseline"]
            print(f"S=131072 N=1 {pattern} (density {density}): gen {fig['seconds']:.1f} s, peak RSS "
                  f"{fig['peak'] / 2**20:.0f} MiB ({grown / 2**20:.0f} MiB above the interpreter's), "
                  f"inputs+outputs {fig['written'] / 2**20:.0f} MiB: ratio {fig['peak'] / fig['written']:.2f}"
                  "   (target <= 3)")  # fmt: skip

    judged = compare_throughput(seq)
    if judged is None:
        print("bsa compare: not available in this build")
    else:
        size, seconds = judged
        print(f"bsa compare: {size:.0f} MB of outputs in {seconds:.2f} s = {size / seconds:.0f} MB/s   (target >= 200)")


if __name__ == "__main__":
    main()

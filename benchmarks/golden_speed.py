"""Benchmark `bsa gen`, the reference device and the comparator end to end, side by side in one run.

Prints, each as a ratio against a reference measured in the same run:
  1. `bsa gen` as a user runs it (a fresh process: inputs, forward, golden, benchmark, summary, files) vs
     NumPy's float32 matmul rate, counting 14 X Y D FLOPs per selected block pair     (target >= 0.25)
  2. the same `bsa gen` vs a dense PyTorch float32 autograd forward + backward of the case (which computes
     only a golden): the explicit formula, and PyTorch's fused SDPA with the element mask     (target >= 6x)
  3. `bsa emulate` (the reference device `bsa run` uses without a binary) on the case `bsa gen` wrote, vs
     that `bsa gen`                                                       (target: emulate no slower)
  4. peak memory of a 131072-token case vs the bytes of its inputs+outputs               (target <= 3x)
  5. `bsa compare` throughput, a fresh process over a suite run by `bsa run`        (target >= 200 MB/s)

Usage: python benchmarks/golden_speed.py [--rounds N] [--quick] [--skip-long] [--long-causal] [--skip-compare]

Case: B=1, N=4, S=8192, D=128, X=Y=128, random density 0.2 (S=4096 with --quick). Figures 1 to 3 are
measured in rounds, each round running the matmul reference, `bsa gen` (default `-j auto`, then `-j 1`),
`bsa emulate` and the PyTorch references one after another, and each figure keeps its best round, so a
burst of load on the shared machine cannot fall on one side of a ratio only. Every command and every
PyTorch reference runs in a process of its own; the PyTorch time is its computation only (its best
chance: no interpreter start, no import, inputs ready), bsa's is the wall time of the whole command.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bsa_cli.core.case import Case, Sparsity
from bsa_cli.inputs import make_mask, mask_stats

BSA = [sys.executable, "-m", "bsa_cli"]


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


def make_case(seq: int, heads: int, pattern: str, density: float = 0.2) -> Case:
    return Case(
        name=f"bench-{seq}",
        source="benchmark",
        layout="BNSD",
        dtype="float16",
        batch=1,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=128,
        q_seq_len=seq,
        kv_seq_len=seq,
        actual_seq_lengths=None,
        actual_seq_lengths_kv=None,
        block_shape=(128, 128),
        scale=128**-0.5,
        seed=0,
        sparsity=Sparsity(pattern=pattern, density=density),
    )


def single_thread_matmul_rate() -> float:
    """Return NumPy's float32 matmul rate with one BLAS thread, measured in a child process.

    Cores times this rate is the machine's matmul peak as one thread per core reaches it: a steadier
    reference than the all-threads rate when other work competes for the cores (BLAS threads that wait
    for each other slow down the most).
    """
    here = str(Path(__file__).resolve().parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import golden_speed as g; print(g.matmul_rate())"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(result.stdout.split()[-1])


def write_spec(case: Case, path: Path) -> Path:
    """Write `case` as a one-case spec file (the keys `bsa gen` reads)."""
    spec = {
        "cases": [
            {
                "name": case.name,
                "layout": case.layout,
                "dtype": case.dtype,
                "batch": case.batch,
                "num_heads": case.num_heads,
                "num_kv_heads": case.num_kv_heads,
                "head_dim": case.head_dim,
                "q_seq_len": case.q_seq_len,
                "kv_seq_len": case.kv_seq_len,
                "block_shape": list(case.block_shape),
                "scale": case.scale,
                "seed": case.seed,
                "sparsity": {"pattern": case.sparsity.pattern, "density": case.sparsity.density},
            }
        ]
    }
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def timed_command(args: list[str], what: str, bsa_path: Path | None = None) -> float:
    """Run a bsa command in a fresh process; return its wall time (interpreter start included).

    With `bsa_path`, the command runs the bsa of that checkout (a baseline), from a neutral folder.
    """
    env, cwd = None, None
    if bsa_path is not None:
        env, cwd = dict(os.environ, PYTHONPATH=str(bsa_path)), tempfile.gettempdir()
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stdout}{result.stderr}")
    return seconds


TORCH_CHILD = """
import json, sys, time
import numpy as np, torch, torch.nn.functional as F
from bsa_cli.core.case import Case, Sparsity
from bsa_cli.inputs import make_mask, make_tensors
fields = json.loads(sys.argv[1])
fields["block_shape"] = tuple(fields["block_shape"])
case = Case(**fields, sparsity=Sparsity(pattern="random", density=float(sys.argv[2])))
which = sys.argv[3]
tensors, mask = make_tensors(case), make_mask(case)
x, y = case.block_shape
keep = torch.from_numpy(np.repeat(np.repeat(mask[0] != 0, x, axis=1), y, axis=2))
q, k, v, do = (torch.from_numpy(tensors[n][0].astype(np.float32)) for n in ("query", "key", "value", "dout"))
empty_rows = not bool(keep.any(dim=-1).all())
start = time.perf_counter()
if which == "explicit":
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    scores = (qq * case.scale) @ kk.transpose(-1, -2)
    scores.masked_fill_(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if empty_rows:
        probs = probs.nan_to_num(0.0)
    (probs @ vv).backward(do)
else:
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    F.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep, scale=case.scale).backward(do)
print(time.perf_counter() - start)
"""


def torch_seconds(case: Case, which: str) -> float | None:
    """Time a dense PyTorch float32 autograd reference (full S x S masked attention) in a process of its own.

    `explicit`: scores, in-place mask, softmax, P V, `.backward`; `sdpa`: PyTorch's fused
    `scaled_dot_product_attention` with the boolean element mask. All cores; only the computation is timed.
    """
    fields = {
        f: getattr(case, f)
        for f in (
            "name",
            "source",
            "layout",
            "dtype",
            "batch",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "q_seq_len",
            "kv_seq_len",
            "actual_seq_lengths",
            "actual_seq_lengths_kv",
            "scale",
            "seed",
        )
    }
    fields["block_shape"] = list(case.block_shape)
    args = [sys.executable, "-c", TORCH_CHILD, json.dumps(fields), str(case.sparsity.density), which]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        if "No module named 'torch'" in result.stderr:
            return None
        raise RuntimeError(f"PyTorch reference failed: {result.stderr}")
    return float(result.stdout.split()[-1])


def end_to_end(case: Case, rounds: int, with_torch: bool, baseline: Path | None) -> list[dict[str, float]]:
    """Time, in `rounds` rounds, the matmul rates and each command one after another; return each round's figures."""
    measured = []
    with tempfile.TemporaryDirectory() as work:
        spec = write_spec(case, Path(work) / "bench.json")
        out = Path(work) / "out"
        for round_ in range(rounds):
            figures = {"rate": matmul_rate(), "rate 1 thread": single_thread_matmul_rate()}
            figures["gen"] = timed_command([*BSA, "gen", str(spec), "-o", str(out)], "bsa gen")
            case_dir = out / case.name
            figures["emulate"] = timed_command([*BSA, "emulate", str(case_dir), str(case_dir / "outputs")], "emulate")
            shutil.rmtree(out)
            figures["gen -j 1"] = timed_command([*BSA, "gen", str(spec), "-o", str(out), "-j", "1"], "bsa gen -j 1")
            shutil.rmtree(out)
            figures["gen float64"] = timed_command(
                [*BSA, "gen", str(spec), "-o", str(out), "--precision", "float64"], "bsa gen --precision float64"
            )
            shutil.rmtree(out)
            if baseline is not None:
                gen = [*BSA, "gen", str(spec), "-o", str(out)]
                figures["baseline gen"] = timed_command(gen, "the baseline's bsa gen", baseline)
                shutil.rmtree(out)
            if with_torch:
                for which in ("explicit", "sdpa"):
                    seconds = torch_seconds(case, which)
                    if seconds is not None:
                        figures[f"torch {which}"] = seconds
            measured.append(figures)
            print(
                f"  round {round_ + 1}: matmul {figures['rate'] / 1e9:.0f} GFLOP/s "
                f"(1 thread: {figures['rate 1 thread'] / 1e9:.0f}), "
                + ", ".join(f"{name} {value:.2f} s" for name, value in figures.items() if "rate" not in name)
                + f"; {load()}",
                flush=True,
            )
    return measured


def span(values: list[float], digits: int) -> str:
    """Return 'low-high' of the values (or the value, if they agree at `digits` digits)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def peak_memory_child(seq: int, pattern: str, density: float) -> dict:
    """Generate one long case in a fresh process (as `bsa gen` does, `-j auto`); return its peak RSS and bytes.

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
from bsa_cli.core.case import Case, Sparsity
from bsa_cli.gen.generate import generate_case
from bsa_cli.gen.settings import GenSettings
from bsa_cli.gen.schedule import auto_jobs, estimate
case = Case(name="long", source="benchmark", layout="BNSD", dtype="float16", batch=1, num_heads=1, num_kv_heads=1,
            head_dim=128, q_seq_len={seq}, kv_seq_len={seq}, actual_seq_lengths=None, actual_seq_lengths_kv=None,
            block_shape=(128, 128), scale=128**-0.5, seed=0, sparsity=Sparsity(pattern={pattern!r}, density={density}))
with tempfile.TemporaryDirectory() as out:
    path = generate_case(case, pathlib.Path(out), GenSettings(jobs=auto_jobs(None, [estimate(case)])))
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

    from bsa_cli.gen.generate import generate_suite
    from bsa_cli.gen.settings import GenSettings

    base = make_case(seq, 4, "random", 0.2)
    suite = [
        dataclasses.replace(base, name=f"cmp-{i}", seed=i, dtype=("float16", "bfloat16")[i % 2]) for i in range(cases)
    ]
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out:
        generate_suite(suite, Path(out), GenSettings(jobs=os.cpu_count() or 1))
        subprocess.run([*BSA, "run", out], capture_output=True, check=True)
        figures["megabytes"] = sum(p.stat().st_size for p in Path(out).glob("*/outputs/d*.bin")) / 1e6
        for _ in range(2):
            start = time.perf_counter()
            result = subprocess.run([*BSA, "compare", out], capture_output=True, text=True)
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
        text += " (other work is running)"
    return text


def precompile() -> None:
    """Compile bsa_cli's bytecode once, as an installed package has it, so no timed command compiles its
    sources (with PYTHONDONTWRITEBYTECODE set, as on some machines, every fresh process would, for about
    0.15 s: not what a user's `bsa gen` pays)."""
    import bsa_cli

    compileall.compile_dir(str(Path(bsa_cli.__file__).parent), quiet=1)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("bsa_cli's bytecode compiled up front (PYTHONDONTWRITEBYTECODE is set here)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the side-by-side figures (default 3)")
    parser.add_argument("--quick", action="store_true", help="S=4096 instead of 8192 (a smoke run of this script)")
    parser.add_argument("--skip-torch", action="store_true", help="leave out the dense PyTorch references")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another bsa (say `git worktree add /tmp/base 2b40f9e`) whose "
        "`bsa gen` is timed side by side",
    )
    parser.add_argument("--skip-long", action="store_true", help="skip the 131072-token memory case")
    parser.add_argument("--skip-compare", action="store_true", help="skip the `bsa compare` throughput")
    parser.add_argument(
        "--long-causal", action="store_true", help="also generate the causal 131072-token case (minutes)"
    )
    args = parser.parse_args()
    seq = 4096 if args.quick else 8192
    print(f"machine: {os.cpu_count()} cores, numpy {np.__version__}; {load()}")
    precompile()

    case = make_case(seq, 4, "random", 0.2)
    stats = mask_stats(case, make_mask(case))
    flops = stats["flops_forward"] + stats["flops_backward"]
    print(
        f"case B=1 N=4 S={seq} D=128 X=Y=128 random density {stats['density']:.3f}: "
        f"{stats['selected_blocks']} selected block pairs, {flops / 1e9:.1f} GFLOP (14 X Y D per pair)"
    )

    rounds = end_to_end(case, args.rounds, not args.skip_torch, args.baseline)
    best = {name: (max if "rate" in name else min)(r[name] for r in rounds) for name in rounds[0]}
    rate, gen = best["rate"], best["gen"]
    cores = os.cpu_count() or 1
    peak = cores * best["rate 1 thread"]
    print(f"each figure's best round (in brackets: the same ratio within each of the {len(rounds)} rounds)")
    print(
        f"numpy float32 matmul 512x512: {rate / 1e9:.1f} GFLOP/s ({cores} threads); one thread "
        f"{best['rate 1 thread'] / 1e9:.1f} GFLOP/s, times {cores} cores: {peak / 1e9:.1f} GFLOP/s"
    )
    for name in ("gen", "gen -j 1"):
        seconds = best[name]
        within = span([flops / r[name] / r["rate"] for r in rounds], 3)
        target = "   (target >= 0.25)" if name == "gen" else ""
        print(
            f"bsa {name} (fresh process): {seconds:.2f} s = {flops / seconds / 1e9:.1f} GFLOP/s = "
            f"{flops / seconds / rate:.3f} of the matmul rate [{within}]{target}; "
            f"{flops / seconds / peak:.3f} of {cores} x the one-thread rate"
        )
    if "baseline gen" in best:
        within = span([r["baseline gen"] / r["gen"] for r in rounds], 2)
        base = best["baseline gen"]
        print(
            f"the baseline's bsa gen: {base:.2f} s = {flops / base / rate:.3f} of the matmul rate: "
            f"bsa gen is {base / gen:.2f}x [{within}] faster"
        )
    within = span([r["gen float64"] / r["gen"] for r in rounds], 2)
    print(
        f"bsa gen --precision float64: {best['gen float64']:.2f} s = {best['gen float64'] / gen:.2f}x [{within}] "
        "the float32 gen"
    )
    for which in ("explicit", "sdpa"):
        name = f"torch {which}"
        if name in best:
            within = span([r[name] / r["gen"] for r in rounds], 1)
            target = "   (target >= 6)" if which == "explicit" else ""
            print(
                f"dense PyTorch float32 autograd ({which}): {best[name]:.2f} s: bsa gen is "
                f"{best[name] / gen:.1f}x [{within}] faster{target}"
            )
    emulate = best["emulate"]
    within = span([r["gen"] / r["emulate"] for r in rounds], 2)
    print(
        f"bsa emulate (fresh process, same case): {emulate:.2f} s: bsa gen / bsa emulate = {gen / emulate:.2f} "
        f"[{within}]   (target >= 1: emulate no slower than gen)"
    )

    if not args.skip_long:
        long_cases = [("random", 0.05)] + ([("causal", 1.0)] if args.long_causal else [])
        for pattern, density in long_cases:
            fig = peak_memory_child(131072, pattern, density)
            grown = fig["peak"] - fig["baseline"]
            print(
                f"S=131072 N=1 {pattern} (density {density}): gen {fig['seconds']:.1f} s, peak RSS "
                f"{fig['peak'] / 2**20:.0f} MiB ({grown / 2**20:.0f} MiB above the bare interpreter's), "
                f"inputs+outputs {fig['written'] / 2**20:.0f} MiB: ratio {fig['peak'] / fig['written']:.2f}"
                "   (target <= 3)"
            )

    if not args.skip_compare:
        judged = compare_throughput(seq, 4 if args.quick else 8)
        size = judged["megabytes"]
        print(
            f"bsa compare (fresh process, suite run by bsa run): {size:.0f} MB of outputs judged in "
            f"{judged['seconds']:.2f} s = {size / judged['seconds']:.0f} MB/s   (target >= 200); with the "
            f"interpreter's start {judged['wall']:.2f} s = {size / judged['wall']:.0f} MB/s"
        )
    print(load())


if __name__ == "__main__":
    main()

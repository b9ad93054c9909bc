"""Measure what the forward's diagnosis costs within `bsa compare` on failing forward folders (issue 20).

The forward's diagnosis (`compare/diagnose/forward_diagnosis.py`) recomputes out and lse of a few worst query blocks
per hypothesis and scans out's rows for its patterns; compare's metrics scan every element. This script
prints, per suite of forward folders (cases/forward-edge.yaml and cases/chain.yaml generated with
`--ops forward`, and a larger set: S 2048 to 8192, fp16 and bf16, BNSD and TND, GQA), the summed time of
compare without the diagnosis, the diagnosis's own time, and its share of compare's time with it, over
every applicable forward fault of the reference device (`faults.FORWARD_FAULTS`), with how many runs name
their fault's true kind first.

Usage: python benchmarks/forward_diagnosis_cost.py [--rounds N] [--quick]

How: `bsa gen -j 1 --ops forward` writes the folders into a temporary directory; the reference device
(`devices.run.run_case`, what `bsa run` does: run.json records the NaN prefill) writes each fault's
outputs. Each output is judged in this one process by `compare.compare_case` with a pool of 2 hashing
threads, in rounds alternating the two variants: with the diagnosis (`verdict.diagnose_forward` wrapped to
time itself) and without it (replaced by one returning no causes). Each figure keeps its best of `--rounds`
(default 3), CPU time (`time.process_time`). A first judgement of every output warms the page cache.
--quick: forward-edge only, 1 round.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bsa_cli import compare
from bsa_cli.compare import verdict
from bsa_cli.compare.diagnose import Diagnosis
from bsa_cli.devices import faults
from bsa_cli.devices.config import RunOptions
from bsa_cli.devices.reference import ReferenceDevice
from bsa_cli.devices.run import run_case
from bsa_cli.store import load_manifest, read_array

BSA = [sys.executable, "-m", "bsa_cli"]
CASES = Path(__file__).resolve().parent.parent / "cases"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.compare.test_diagnose_forward import TRUE_KIND  # noqa: E402

LARGER = """\
defaults:
  ops: [forward]
  dtype: fp16
  head_dim: 128
  seed: 5
  block_shape: [128, 128]
  sparsity: {pattern: random, density: 0.4}
cases:
  - name: larger-bnsd-2k
    batch: 1
    num_heads: 4
    q_seq_len: 2048
  - name: larger-gqa-4k-bf16
    dtype: bf16
    batch: 1
    num_heads: 8
    num_kv_heads: 2
    q_seq_len: 4096
  - name: larger-tnd-8k
    layout: TND
    num_heads: 2
    actual_seq_lengths: [3000, 5192]
    actual_seq_lengths_kv: [3000, 5192]
"""


def runs(root: Path, spec: Path) -> list[tuple[Path, Path, str]]:
    """Generate a spec's forward folders and run every applicable forward fault: (case dir, output dir, fault)."""
    gen = [*BSA, "gen", str(spec), "--ops", "forward", "-j", "1", "-o", str(root / "cases")]
    subprocess.run(gen, check=True, stdout=subprocess.DEVNULL)
    found = []
    for case_dir in sorted((root / "cases").iterdir()):
        manifest = load_manifest(case_dir)
        if manifest.skip is not None or not manifest.case.expect.ok:
            continue
        mask = read_array(case_dir, manifest.inputs["block_sparse_mask"])
        for fault in faults.FORWARD_FAULTS:
            if faults.fault_applies(fault, manifest.case, mask, "forward"):
                outputs = root / "out" / fault
                run_case(case_dir, RunOptions(device=ReferenceDevice.create(fault), outputs_root=outputs, seed=1))
                found.append((case_dir, outputs / case_dir.name, fault))
    return found


def measure(found: list[tuple[Path, Path, str]], rounds: int) -> tuple[float, float, float, int]:
    """(compare without, compare with, diagnosis alone, runs naming the true kind first), CPU seconds summed."""
    real = verdict.diagnose_forward
    spent = [0.0]

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start

    def none(*args, **kwargs):  # type: ignore[no-untyped-def]
        return Diagnosis((), ())

    best = {"with": [float("inf")] * len(found), "without": [float("inf")] * len(found)}
    diag = [float("inf")] * len(found)
    named = 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        for case_dir, out, _ in found:  # warm the page cache
            compare.compare_case(case_dir, out, pool=pool)
        for r in range(rounds):
            for variant in ("with", "without") if r % 2 == 0 else ("without", "with"):
                verdict.diagnose_forward = timed if variant == "with" else none  # type: ignore[assignment]
                for i, (case_dir, out, fault) in enumerate(found):
                    spent[0] = 0.0
                    start = time.process_time()
                    result = compare.compare_case(case_dir, out, pool=pool)
                    best[variant][i] = min(best[variant][i], time.process_time() - start)
                    if variant == "with":
                        diag[i] = min(diag[i], spent[0])
                        if r == 0:
                            named += bool(result.diagnosis) and result.diagnosis[0].kind == TRUE_KIND[fault]
    verdict.diagnose_forward = real  # type: ignore[assignment]
    return sum(best["without"]), sum(best["with"]), sum(diag), named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    suites = {"forward-edge": CASES / "forward-edge.yaml", "chain": CASES / "chain.yaml"}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:
            larger = Path(tmp) / "larger.yaml"
            larger.write_text(LARGER)
            suites["larger"] = larger
        else:
            suites.pop("chain")
        head = ("suite", "runs", "named", "compare w/o", "with", "diagnosis", "share")
        print(f"{head[0]:14s} {head[1]:>5s} {head[2]:>6s} {head[3]:>12s} {head[4]:>8s} {head[5]:>10s} {head[6]:>6s}")
        for name, spec in suites.items():
            found = runs(Path(tmp) / name, spec)
            without, with_, diag, named = measure(found, rounds)
            share = diag / with_ if with_ else 0.0
            print(f"{name:14s} {len(found):5d} {named:6d} {without:11.2f}s {with_:7.2f}s {diag:9.2f}s {share:6.1%}")


if __name__ == "__main__":
    main()

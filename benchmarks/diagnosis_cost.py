"""Measure what the diagnosis of failing cases costs within `bsa compare`, as cases grow (issue 20).

The diagnosis (`compare/diagnose/`) recomputes a few worst blocks per failing tensor, while compare's
metrics scan every element, so its share of compare's time should fall as cases grow. This script
prints, side by side in one run:
  1. per case and planted fault: compare's time without the diagnosis, the diagnosis's own time, its
     share of compare's time with it, and the top kind it names (with the fault's true kind);
  2. clean runs (PASS): compare's time with and without the diagnosis hook (a PASS is never diagnosed:
     the extra must be ~0);
  3. the share on whole failing suites (sums over their runs): smoke + edge (cases of a few hundred rows)
     and a larger set (S from 512 to 8192; fp16 and bf16, BNSD and TND, GQA);
  4. the share of whole `bsa compare` commands, one per planted fault and suite (its failing cases only),
     as a nightly runs them: every case judged, then the terminal report and --json, --junit and --html
     written (the command run in this process, `-j 1`, so that the diagnosis can be timed inside it).

Usage: python benchmarks/diagnosis_cost.py [--rounds N] [--quick] [--keep DIR] [--tops FILE]

How: `bsa gen -j 1` writes the cases into a temporary folder (smoke.yaml, edge.yaml and a generated
spec of the larger set); the reference device (`devices.reference.emulate_case_dir`, what `bsa emulate`
runs) writes each case's clean outputs and those of five planted faults (dk-no-scale, mask-transposed,
tile-noise, rows-swapped, no-dsum; each where it applies). Each output is then judged in this one
process by `compare.compare_case` with a pool of 2 hashing threads, as `bsa compare -j 1` judges a case
(inputs verified), in rounds that alternate the order of the two variants: with the diagnosis (the
entry point verdict.py calls is wrapped to time itself) and without it (the entry point replaced by one
returning no causes). Each figure keeps its best of `--rounds` (default 3): CPU time and wall time
(`time.perf_counter`). Compare's CPU time is the process's (`time.process_time`, every thread); the
diagnosis's is that of the thread it runs in (`time.thread_time`: the judgement's hashing threads may
still run beside it, and the process's time counted them as the diagnosis's until 2026-12). Its share =
diagnosis / (compare without it + diagnosis). A first judgement of every output
warms the page cache and is not counted.

--quick: smoke only and the larger set's three smallest cases (S <= 2048), 2 rounds: under a minute.
--tops FILE: write every failing run's top kind and its causes (JSON), to compare two versions of the
diagnosis (run this script once with each on PYTHONPATH): a faster diagnosis must conclude the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from bsa_cli import compare
from bsa_cli.cli import main as bsa_main
from bsa_cli.compare import verdict
from bsa_cli.compare.diagnose import Diagnosis
from bsa_cli.devices import faults, reference
from bsa_cli.store import load_manifest, read_array
from bsa_cli.store.manifest import GRAD_NAMES, case_from_manifest

BSA = [sys.executable, "-m", "bsa_cli"]
CASES = Path(__file__).resolve().parent.parent / "cases"

FAULTS = {  # planted fault -> the kind the diagnosis should name first (tests/test_diagnose.py's TRUE_KIND)
    "dk-no-scale": "scale",
    "mask-transposed": "block-selection",
    "tile-noise": "tile-local",
    "rows-swapped": "rows-permuted",
    "no-dsum": "softmax-grad",
}

LARGER = [  # name, spec keys; in order of size. The first three are the --quick set.
    (
        "bnsd-fp16-s512",
        {
            "dtype": "fp16",
            "num_heads": 2,
            "num_kv_heads": 2,
            "q_seq_len": 512,
            "kv_seq_len": 512,
            "sparsity": {"pattern": "random", "density": 0.5},
        },
    ),
    (
        "tnd-bf16-s1024",
        {
            "layout": "TND",
            "dtype": "bf16",
            "num_heads": 2,
            "num_kv_heads": 2,
            "actual_seq_lengths": [700, 324],
            "sparsity": {"pattern": "random", "density": 0.4},
        },
    ),
    (
        "gqa-fp16-s2048",
        {
            "dtype": "fp16",
            "num_heads": 4,
            "num_kv_heads": 2,
            "q_seq_len": 2048,
            "kv_seq_len": 2048,
            "sparsity": {"pattern": "random", "density": 0.3},
        },
    ),
    (
        "gqa-bf16-s4096",
        {
            "dtype": "bf16",
            "num_heads": 4,
            "num_kv_heads": 1,
            "q_seq_len": 4096,
            "kv_seq_len": 4096,
            "sparsity": {"pattern": "random", "density": 0.2},
        },
    ),
    (
        "bnsd-fp16-s8192",
        {
            "dtype": "fp16",
            "num_heads": 2,
            "num_kv_heads": 2,
            "q_seq_len": 8192,
            "kv_seq_len": 8192,
            "sparsity": {"pattern": "random", "density": 0.1},
        },
    ),
    (
        "tnd-gqa-bf16-s8192",
        {
            "layout": "TND",
            "dtype": "bf16",
            "num_heads": 4,
            "num_kv_heads": 2,
            "actual_seq_lengths": [4096, 3000, 1096],
            "sparsity": {"pattern": "random", "density": 0.15},
        },
    ),
]


# ---- the two variants of compare ------------------------------------------------------------------


class DiagnosisClock:
    """Wraps the diagnosis entry point verdict.py calls: timed (`on`) or replaced by one finding nothing."""

    def __init__(self) -> None:
        self.real = verdict.diagnose
        self.on = True
        self.cpu = self.wall = 0.0
        self.calls = 0
        verdict.diagnose = self  # type: ignore[assignment]

    def __call__(self, *args, **kwargs) -> Diagnosis:
        if not self.on:
            return Diagnosis((), ())
        self.calls += 1
        cpu, wall = time.thread_time(), time.perf_counter()  # its thread's: hashing threads run beside it
        try:
            return self.real(*args, **kwargs)
        finally:
            self.cpu += time.thread_time() - cpu
            self.wall += time.perf_counter() - wall


@dataclass
class Run:
    """One device output and its best times (seconds): compare without / with the diagnosis, the diagnosis."""

    suite: str
    case: str
    fault: str | None
    elements: int
    case_dir: Path
    output_dir: Path
    top: str = "-"
    causes: list[str] = field(default_factory=list)
    verdict: str = "-"
    best: dict[str, float] = field(default_factory=dict)

    def keep(self, key: str, value: float) -> None:
        self.best[key] = min(value, self.best.get(key, float("inf")))


def judge(run: Run, clock: DiagnosisClock, pool: ThreadPoolExecutor, with_diagnosis: bool) -> None:
    clock.on = with_diagnosis
    clock.cpu = clock.wall = 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    result = compare.compare_case(run.case_dir, run.output_dir, pool=pool)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tag = "with" if with_diagnosis else "without"
    run.keep(f"{tag}_cpu", cpu)
    run.keep(f"{tag}_wall", wall)
    if with_diagnosis:
        run.keep("diag_cpu", clock.cpu)
        run.keep("diag_wall", clock.wall)
        run.verdict = result.verdict
        run.top = result.diagnosis[0].kind if result.diagnosis else "-"
        run.causes = [f"{c.kind} {c.score:.2f}" for c in result.diagnosis]


# ---- cases and outputs -----------------------------------------------------------------------------


def gen(specs: list[Path], out: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run([*BSA, "gen", *map(str, specs), "-o", str(out), "-j", "1"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"bsa gen failed ({result.returncode}): {result.stdout}{result.stderr}")
    return time.perf_counter() - start


def outputs(suite: str, root: Path, out: Path) -> list[Run]:
    """Emulate each case of `root` clean and with each applicable fault of FAULTS; return the runs."""
    runs = []
    for manifest_path in sorted(root.rglob("case.json")):
        case_dir = manifest_path.parent
        manifest = load_manifest(case_dir)
        case = case_from_manifest(manifest)
        elements = sum(int(_prod(manifest["outputs"][name]["shape"])) for name in GRAD_NAMES)
        mask = read_array(case_dir, manifest["inputs"]["block_sparse_mask"])
        for fault in [None, *(f for f in FAULTS if faults.fault_applies(f, case, mask))]:
            output_dir = out / suite / case_dir.name / (fault or "clean")
            if reference.emulate_case_dir(case_dir, output_dir, fault=fault, order_seed=1) != 0:
                break  # a case the operator rejects: judged on its status, nothing to diagnose
            runs.append(Run(suite, case_dir.name, fault, elements, case_dir, output_dir))
    return runs


def _prod(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def larger_spec(path: Path, quick: bool) -> Path:
    cases = [{"name": name, **keys} for name, keys in (LARGER[:3] if quick else LARGER)]
    spec = {"defaults": {"head_dim": 128, "block_shape": [128, 128], "seed": 3}, "cases": cases}
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


# ---- report ----------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f}"


def print_failing(runs: list[Run]) -> None:
    print(
        f"{'suite':8} {'case':28} {'fault':16} {'elements':>10} | {'w/o diag':>8} {'diag':>8} {'share':>6} |"
        f" {'wall w/o':>8} {'diag':>8} {'share':>6} | top kind (true kind)"
    )
    print(f"{'':8} {'':28} {'':16} {'dq+dk+dv':>10} | {'CPU ms':>8} {'CPU ms':>8} {'':>6} | {'ms':>8} {'ms':>8}")
    for r in runs:
        b = r.best
        share_cpu = b["diag_cpu"] / (b["without_cpu"] + b["diag_cpu"])
        share_wall = b["diag_wall"] / (b["without_wall"] + b["diag_wall"])
        true = FAULTS[r.fault] if r.fault else "-"
        mark = "" if r.top == true and r.verdict == compare.FAIL else f"  <- MISS ({r.verdict})"
        print(
            f"{r.suite:8} {r.case[:28]:28} {r.fault:16} {r.elements:>10} | {ms(b['without_cpu'])} "
            f"{ms(b['diag_cpu'])} {share_cpu:6.1%} | {ms(b['without_wall'])} {ms(b['diag_wall'])} "
            f"{share_wall:6.1%} | {r.top} ({true}){mark}"
        )


def print_totals(label: str, runs: list[Run]) -> None:
    if not runs:
        return
    without = sum(r.best["without_cpu"] for r in runs)
    diag = sum(r.best["diag_cpu"] for r in runs)
    with_ = sum(r.best["with_cpu"] for r in runs)
    wall_without = sum(r.best["without_wall"] for r in runs)
    wall_diag = sum(r.best["diag_wall"] for r in runs)
    print(
        f"{label:44} {len(runs):4} runs | CPU: compare w/o {without:7.2f} s, with {with_:7.2f} s, diagnosis "
        f"{diag:6.2f} s = {diag / (without + diag):5.1%} | wall: w/o {wall_without:7.2f} s, diagnosis "
        f"{wall_diag:6.2f} s = {wall_diag / (wall_without + wall_diag):5.1%}"
    )


def whole_commands(failing: list[Run], work: Path, clock: DiagnosisClock, rounds: int) -> None:
    """Time `bsa compare` of each (suite, fault)'s failing cases with the diagnosis and without it (best of
    `rounds`, alternating), reports and all; print each and the sums."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in failing:
        assert run.fault is not None
        groups.setdefault((run.suite, run.fault), []).append(run)
    rows = []
    for (suite, fault), group in sorted(groups.items()):
        root = work / "commands" / suite / fault
        for run in group:  # --outputs-root reads <root>/<case>
            if not (root / run.case).exists():
                shutil.copytree(run.output_dir, root / run.case)
        args = ["compare", str(work / suite), "--outputs-root", str(root), "-j", "1"]
        args += [a for run in group for a in ("--filter", run.case)]
        args += ["--json", str(root / "r.json"), "--junit", str(root / "r.xml"), "--html", str(root / "r.html")]
        best: dict[str, float] = {}
        for i in range(rounds):
            for with_diagnosis in (True, False) if i % 2 == 0 else (False, True):
                clock.on = with_diagnosis
                clock.cpu = clock.wall = 0.0
                cpu, wall = time.process_time(), time.perf_counter()
                result = CliRunner().invoke(bsa_main, args)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                if result.exit_code != 1:
                    raise RuntimeError(f"bsa {' '.join(args)}: exit {result.exit_code}: {result.output[-2000:]}")
                tag = "with" if with_diagnosis else "without"
                best[f"{tag}_cpu"] = min(cpu, best.get(f"{tag}_cpu", float("inf")))
                best[f"{tag}_wall"] = min(wall, best.get(f"{tag}_wall", float("inf")))
                if with_diagnosis:
                    best["diag_cpu"] = min(clock.cpu, best.get("diag_cpu", float("inf")))
                    best["diag_wall"] = min(clock.wall, best.get("diag_wall", float("inf")))
        rows.append((suite, fault, len(group), best))
        print(
            f"  {suite:6} {fault:16} {len(group):4} cases | CPU w/o {best['without_cpu']:6.2f} s, diagnosis "
            f"{best['diag_cpu']:5.2f} s = {best['diag_cpu'] / (best['without_cpu'] + best['diag_cpu']):5.1%} | wall "
            f"w/o {best['without_wall']:6.2f} s, diagnosis {best['diag_wall']:5.2f} s = "
            f"{best['diag_wall'] / (best['without_wall'] + best['diag_wall']):5.1%}"
        )
    for suite in sorted({r[0] for r in rows}):
        without = sum(b["without_cpu"] for s, _, _, b in rows if s == suite)
        diag = sum(b["diag_cpu"] for s, _, _, b in rows if s == suite)
        wall_without = sum(b["without_wall"] for s, _, _, b in rows if s == suite)
        wall_diag = sum(b["diag_wall"] for s, _, _, b in rows if s == suite)
        print(
            f"  {suite:6} all faults: CPU w/o {without:6.2f} s, diagnosis {diag:5.2f} s = "
            f"{diag / (without + diag):5.1%} | wall w/o {wall_without:6.2f} s, diagnosis {wall_diag:5.2f} s = "
            f"{wall_diag / (wall_without + wall_diag):5.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of judgement (best of N; default 3, 2 quick)")
    parser.add_argument("--quick", action="store_true", help="smoke and the three smallest larger cases (< 1 min)")
    parser.add_argument("--keep", type=Path, default=None, help="write the cases here and keep them")
    parser.add_argument("--tops", type=Path, default=None, help="write each failing run's top kind here (JSON)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bsa-diag-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        small = [CASES / "smoke.yaml"] if args.quick else [CASES / "smoke.yaml", CASES / "edge.yaml"]
        seconds = gen(small, work / "small")
        seconds += gen([larger_spec(work / "larger.yaml", args.quick)], work / "larger")
        start = time.perf_counter()
        runs = outputs("small", work / "small", work / "out") + outputs("larger", work / "larger", work / "out")
        print(
            f"bsa gen -j 1: {seconds:.1f} s; reference device ({len(runs)} outputs): "
            f"{time.perf_counter() - start:.1f} s; {rounds} rounds of judgement\n"
        )

        clock = DiagnosisClock()
        with ThreadPoolExecutor(max_workers=2) as pool:  # as `bsa compare -j 1` hashes (suite.HASH_THREADS)
            for run in runs:  # warm the page cache and the lazy imports; not counted
                judge(run, clock, pool, True)
            for run in runs:
                run.best.clear()
            for i in range(rounds):
                for run in runs:
                    order = (True, False) if (i + runs.index(run)) % 2 == 0 else (False, True)
                    for with_diagnosis in order:
                        judge(run, clock, pool, with_diagnosis)

        failing = [r for r in runs if r.fault]
        if args.tops is not None:
            tops = {f"{r.suite}/{r.case}/{r.fault}": {"top": r.top, "causes": r.causes} for r in failing}
            args.tops.write_text(json.dumps(tops, indent=1, sort_keys=True))
        clean = [r for r in runs if not r.fault]
        print("Failing runs (best of rounds; share = diagnosis / (compare without it + diagnosis)):")
        print_failing(sorted((r for r in failing if r.suite == "larger"), key=lambda r: r.elements))
        print()
        print("Clean runs (PASS, never diagnosed): compare with the diagnosis hook vs without, CPU ms")
        for r in sorted((c for c in clean if c.suite == "larger"), key=lambda r: r.elements):
            b = r.best
            print(
                f"  {r.case:28} {r.elements:>10} elements: {ms(b['without_cpu'])} vs {ms(b['with_cpu'])} "
                f"(diagnosis {ms(b.get('diag_cpu', 0.0))}; verdict {r.verdict}, top {r.top})"
            )
        small_clean = [c for c in clean if c.suite == "small"]
        print(
            f"  smoke+edge: {len(small_clean)} clean runs: {sum(c.best['without_cpu'] for c in small_clean):.2f} s "
            f"vs {sum(c.best['with_cpu'] for c in small_clean):.2f} s; not PASS: "
            f"{sum(c.verdict != compare.PASS for c in clean)} of {len(clean)} clean runs\n"
        )
        small_misses = [r for r in failing if r.suite == "small" and FAULTS[r.fault] != r.top]
        print(
            f"smoke+edge: {sum(r.suite == 'small' for r in failing)} failing runs, top kind not the true one in "
            f"{len(small_misses)}: {[(r.case, r.fault, r.top) for r in small_misses]}"
        )
        print("\nWhole failing suites (sums of the best times):")
        print_totals("smoke+edge" if not args.quick else "smoke", [r for r in failing if r.suite == "small"])
        print_totals("larger set", [r for r in failing if r.suite == "larger"])
        big = [r for r in failing if r.suite == "larger" and r.elements >= 4_000_000]
        print_totals("larger set, cases of >= 4M elements", big)
        print("\nWhole `bsa compare` commands, one per suite and fault (its failing cases; all reports written):")
        whole_commands(failing, work, clock, rounds)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

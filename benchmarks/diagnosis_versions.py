"""Time this checkout's diagnosis against another checkout's, side by side in one process (issue 20).

`diagnosis_cost.py` measures the diagnosis's share of compare's time for one version; on a shared
machine two runs of it minutes apart differ by more than a change to the diagnosis does. This script
loads a second copy of bsa (the `bsa_cli` of `--against DIR`, imported under another name) next to this
one and, for each failing run, judges it with each version's `compare.compare_case` in alternating
order, each timing its own diagnosis (the CPU time of the thread it runs in, best of `--rounds`: the
judgement's hashing threads may still run beside it). It prints each run's diagnosis time
under both, their ratio, and whether the two name the same causes (kind and score, 2 digits), then the
sums over the suites.

Usage: python benchmarks/diagnosis_versions.py --against DIR [--rounds N] [--quick]

The cases and faults are `diagnosis_cost.py`'s (smoke and edge, the larger set; five planted faults),
written by this checkout's `bsa gen -j 1` and reference device; DIR is e.g. a `git worktree` of main.
--quick: smoke and the larger set's three smallest cases.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import diagnosis_cost as cost  # noqa: E402  (this checkout's bsa_cli, the cases and faults)

from bsa_cli import compare


def load_copy(checkout: Path, work: Path) -> ModuleType:
    """Import `checkout`'s bsa_cli as the package `bsa_against` (its imports within are relative)."""
    target = work / "against" / "bsa_against"
    shutil.copytree(checkout / "bsa_cli", target, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(target.parent))
    return importlib.import_module("bsa_against")


class Clock:
    """Wraps a version's diagnosis entry point (its verdict.diagnose) to time itself."""

    def __init__(self, verdict: ModuleType) -> None:
        self.real = verdict.diagnose
        self.cpu = 0.0
        verdict.diagnose = self

    def __call__(self, *args, **kwargs):
        cpu = time.thread_time()  # this thread's: the judgement's hashing threads may still run beside it
        try:
            return self.real(*args, **kwargs)
        finally:
            self.cpu += time.thread_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout (its bsa_cli is timed too)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (best of N, default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke and the three smallest larger cases")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bsa-diag-versions-"))
    try:
        other = load_copy(args.against.resolve(), work)
        versions = {
            "this": (compare, Clock(importlib.import_module("bsa_cli.compare.verdict"))),
            "against": (
                importlib.import_module("bsa_against.compare"),
                Clock(importlib.import_module("bsa_against.compare.verdict")),
            ),
        }
        assert other is not None
        small = [cost.CASES / "smoke.yaml"] if args.quick else [cost.CASES / "smoke.yaml", cost.CASES / "edge.yaml"]
        cost.gen(small, work / "small")
        cost.gen([cost.larger_spec(work / "larger.yaml", args.quick)], work / "larger")
        runs = [r for r in cost.outputs("small", work / "small", work / "out") if r.fault]
        runs += [r for r in cost.outputs("larger", work / "larger", work / "out") if r.fault]
        best: dict[tuple[int, str], float] = {}
        causes: dict[tuple[int, str], list[str]] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            for i in range(args.rounds + 1):  # round 0 warms the page cache and the imports: not counted
                for n, run in enumerate(runs):
                    names = ["this", "against"] if (i + n) % 2 == 0 else ["against", "this"]
                    for name in names:
                        module, clock = versions[name]
                        clock.cpu = 0.0
                        result = module.compare_case(run.case_dir, run.output_dir, pool=pool)
                        causes[n, name] = [f"{c.kind} {c.score:.2f}" for c in result.diagnosis]
                        if i:
                            best[n, name] = min(clock.cpu, best.get((n, name), float("inf")))
        print(f"{'suite':7} {'case':28} {'fault':16} | {'this ms':>8} {'against':>8} {'ratio':>6} | same causes")
        totals: dict[str, list[float]] = {}
        differ = 0
        for n, run in enumerate(runs):
            this, against = best[n, "this"], best[n, "against"]
            same = causes[n, "this"] == causes[n, "against"]
            differ += not same
            totals.setdefault(run.suite, [0.0, 0.0])
            totals[run.suite][0] += this
            totals[run.suite][1] += against
            note = "yes" if same else f"NO: {causes[n, 'this']} vs {causes[n, 'against']}"
            print(
                f"{run.suite:7} {run.case[:28]:28} {run.fault:16} | {this * 1e3:8.1f} {against * 1e3:8.1f} "
                f"{this / max(against, 1e-9):6.2f} | {note}"
            )
        for suite, (this, against) in totals.items():
            print(f"{suite}: diagnosis CPU this {this:.2f} s, against {against:.2f} s, ratio {this / against:.2f}")
        print(f"runs whose causes differ: {differ} of {len(runs)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

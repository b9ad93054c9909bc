"""Measure what one folder per (case, op) costs `bsa gen`: a backward-only suite before and now, and what the
forward and the chain add, side by side in one run.

Prints, each as a ratio measured in the same run:
  1. generating a backward-only suite with this checkout vs with BASE (default: main), the same cases, the
     same bytes written                                                                    (target <= 1.0)
  2. generating the suite with `--ops forward,backward`, and with `--ops forward,backward,chain`, vs the
     backward alone, with this checkout                     (what the forward folder and the chain add)

Usage: python benchmarks/gen_cost.py [--base REV] [--spec FILE]... [--filter GLOB]... [--rounds N] [-j N]

Each measurement is `generate.generate_suite` in a fresh process of its own (the wall and CPU time of the
generation only: no interpreter start, no import, the specs already loaded), into an empty folder, with
BLAS on one thread (`ONE_THREAD`). BASE's
code is `git archive`d into a temporary folder, so its process imports BASE's bsa_cli, and this checkout's
its own. Measurements run in rounds, one of each per round, and each keeps its best round, so a burst of
load on the shared machine cannot fall on one side of a ratio only. Specs that list `ops:` are read with
`ops: [backward]` for figure 1 (BASE knows no ops).
Default: cases/smoke.yaml, 3 rounds, -j 1 (a quiet comparison; -j auto also times the processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent

ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
"""BLAS on one thread in both children: on a shared machine a BLAS thread per core makes times swing several-fold."""

CHILD = r"""
import json, sys, time
from pathlib import Path
from bsa_cli.gen.generate import generate_suite
from bsa_cli.gen.settings import GenSettings
from bsa_cli.specs import load_specs
import fnmatch

specs, filters, ops, out, jobs = json.loads(sys.argv[1])
cases = load_specs(specs) if ops is None else load_specs(specs, ops=tuple(ops))
if filters:
    cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in filters)]
start, cpu = time.perf_counter(), time.process_time()
folders = generate_suite(cases, Path(out), GenSettings(jobs=jobs))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "cases": len(cases), "folders": len(folders)}))
"""


def export(rev: str, into: Path) -> Path:
    """Write the files of `rev` (its bsa_cli and cases) into `into` with `git archive`; return it."""
    archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", rev], check=True, capture_output=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def generate(tree: Path, specs: list[str], filters: list[str], ops: list[str] | None, out: Path, jobs: int) -> dict:
    """Generate the suite with the bsa_cli of `tree` in a fresh process; return its seconds and counts."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", **ONE_THREAD}
    argument = json.dumps([specs, filters, ops, str(out), jobs])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, argument], env=env, cwd=tree, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_bytes(first: Path, second: Path) -> bool:
    """Whether two folders hold the same files with the same bytes."""
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    if files != sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file()):
        return False
    return all((first / f).read_bytes() == (second / f).read_bytes() for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    parser.add_argument("--spec", action="append", help="spec files (repeatable; default cases/smoke.yaml)")
    parser.add_argument("--filter", action="append", default=[], help="only cases matching this glob")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args()
    specs = [str(Path(s).resolve()) for s in (args.spec or [CHECKOUT / "cases" / "smoke.yaml"])]
    work = Path(tempfile.mkdtemp(prefix="bsa-gen-cost-"))
    try:
        base = export(args.base, work / "base")
        runs = {
            "base: backward": (base, None),
            "this: backward": (CHECKOUT, ["backward"]),
            "this: forward,backward": (CHECKOUT, ["forward", "backward"]),
            "this: forward,backward,chain": (CHECKOUT, ["forward", "backward", "chain"]),
        }
        best: dict[str, dict[str, float]] = {"seconds": {}, "cpu": {}}
        counts: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for label, (tree, ops) in runs.items():
                found = generate(tree, specs, args.filter, ops, work / label.replace(" ", "_"), args.jobs)
                for kind, figures in best.items():
                    figures[label] = min(figures.get(label, float("inf")), found[kind])
                counts[label] = found
            shown = ", ".join(f"{k} {v:.2f} s" for k, v in best["seconds"].items())
            print(f"round {round_ + 1} (best wall so far): {shown}", flush=True)
        identical = same_bytes(work / "base:_backward", work / "this:_backward")
        print(f"\ncases: {counts['base: backward']['cases']} of {', '.join(Path(s).name for s in specs)}")
        for kind, figures in best.items():
            plain = figures["this: backward"]
            print(f"{'wall' if kind == 'seconds' else 'CPU'} time, best of {args.rounds} rounds:")
            print(
                f"  backward-only suite, this / {args.base}: {plain / figures['base: backward']:.3f}  "
                f"({figures['base: backward']:.3f} s at {args.base}, {plain:.3f} s here; target <= 1.0)"
            )
            for label in ("this: forward,backward", "this: forward,backward,chain"):
                found = counts[label]
                print(
                    f"  {label.removeprefix('this: ')} / backward: {figures[label] / plain:.3f}  "
                    f"({figures[label]:.3f} s, {found['folders']} folders of {found['cases']} cases)"
                )
        print(f"backward-only folders byte for byte the same as {args.base}'s: {identical}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measure what the backward's tie rule changes: round half away from zero (the kernel's CAST_ROUND, bsa's
rule) against ties to even (NumPy's cast, bsa's rule before), on the cases of the given specs.

Usage: python scripts/tie_rule_effect.py cases/smoke.yaml cases/edge.yaml

For each case it prints how many elements of the benchmark's and of the reference device's dq/dk/dv
differ between the two rules, and the verdict `bsa check` gives under each (they should not differ).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from bsa_cli import golden
from bsa_cli.cli import main
from bsa_cli.devices import reference
from bsa_cli.gen.generate import compute_case
from bsa_cli.inputs import make_mask
from bsa_cli.specs import load_specs


@contextmanager
def ties(rule: str) -> Iterator[None]:
    before = golden.paths.BACKWARD_TIES, reference.BACKWARD_TIES
    golden.paths.BACKWARD_TIES = reference.BACKWARD_TIES = rule  # type: ignore[assignment]
    try:
        yield
    finally:
        golden.paths.BACKWARD_TIES, reference.BACKWARD_TIES = before


def verdicts(specs: list[str], rule: str) -> dict[str, str]:
    with ties(rule), tempfile.TemporaryDirectory() as out:
        report = Path(out) / "r.json"
        CliRunner().invoke(main, ["check", *specs, "-o", f"{out}/suite", "--json", str(report), "-j", "1"])
        import json

        return {c["name"]: c["verdict"] for c in json.loads(report.read_text())["cases"]}


def main_(specs: list[str]) -> int:
    cases = [c for c in load_specs([Path(s) for s in specs]) if c.expect.ok]
    total = changed_bench = changed_device = 0
    print(f"{'case':40} {'elements':>10} {'bench differ':>13} {'device differ':>14}")
    for case in cases:
        results = {}
        for rule in ("even", "away"):
            with ties(rule):
                tensors, _, bench = compute_case(case)
                inputs = {**tensors, "block_sparse_mask": make_mask(case)}
                device = reference.emulate(case, inputs)
            results[rule] = (bench, device)
        count = sum(results["even"][0][g].size for g in ("dq", "dk", "dv"))
        bench_diff = sum(
            int(np.count_nonzero(results["even"][0][g].view(np.uint16) != results["away"][0][g].view(np.uint16)))
            for g in ("dq", "dk", "dv")
        )
        device_diff = sum(
            int(np.count_nonzero(results["even"][1][g].view(np.uint16) != results["away"][1][g].view(np.uint16)))
            for g in ("dq", "dk", "dv")
        )
        total, changed_bench, changed_device = total + count, changed_bench + bench_diff, changed_device + device_diff
        print(f"{case.name:40} {count:>10} {bench_diff:>13} {device_diff:>14}")
    print(f"{'all':40} {total:>10} {changed_bench:>13} {changed_device:>14}")
    even, away = verdicts(specs, "even"), verdicts(specs, "away")
    moved = {name: (even[name], away.get(name)) for name in even if even[name] != away.get(name)}
    print(f"verdicts: {len(even)} cases; {len(moved)} differ between the rules{': ' + str(moved) if moved else ''}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main_(sys.argv[1:]))

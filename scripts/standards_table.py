"""How many results each side-by-side standard passes, and where they disagree, over suites and planted faults.

    python scripts/standards_table.py OUT [--suite smoke --suite edge ...] [--fault NAME ...]

Generates each suite (cases/NAME.yaml, its own ops) into OUT/NAME once, then for the reference device and for
each of its planted faults (`bsa emulate --list-faults`) runs it and judges it by double-benchmark, whose
results carry mixed tolerance's verdict side by side (issue 30). Prints one Markdown row per suite and device:
results judged, how many each standard passes, how many they disagree on and which way, and the failing
checks that make them disagree. CPU-heavy: run it once, with `nice`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bsa_cli import devices, pipeline  # noqa: E402
from bsa_cli.compare import CaseResult, RunSettings, compare_suite  # noqa: E402
from bsa_cli.devices.faults import FAULTS, FORWARD_FAULTS  # noqa: E402
from bsa_cli.gen.generate import generate_suite  # noqa: E402
from bsa_cli.gen.settings import GenSettings  # noqa: E402
from bsa_cli.specs import load_specs  # noqa: E402

#: The suites of issue 30's closing table.
SUITES = ("smoke", "edge", "stress", "forward-edge")
#: The standard that decides; the other side-by-side standard's verdict comes with each result.
DECIDING = "double-benchmark"
OTHER = "mixed-tolerance"


def why_fails(case: CaseResult, label: str | None) -> str:
    """The name of the check furthest over its limit, by the deciding standard (None) or by `label`."""
    if label is None:
        failed = [c for c in case.all_checks if not c.passed]
    else:
        failed = [c for c in case.checks if not c.passed]
        failed += [c for t in case.tensors for c in t.sides.get(label, t.checks) if not c.passed]
    return max(failed, key=lambda c: c.severity).name if failed else "?"


def row(suite: str, device: str, results: list[CaseResult]) -> tuple[str, Counter[str]]:
    """One Markdown row and the reasons of the disagreements."""
    judged = [c for c in results if c.verdict in ("PASS", "FAIL")]
    deciding = sum(c.verdict == "PASS" for c in judged)
    other = sum(c.side_verdicts.get(OTHER) == "PASS" for c in judged)
    reasons: Counter[str] = Counter()
    only_deciding = only_other = 0
    for case in judged:
        theirs = case.side_verdicts.get(OTHER)
        if theirs is None or theirs == case.verdict:
            continue
        if case.verdict == "PASS":
            only_deciding += 1
            reasons[f"{OTHER} fails {why_fails(case, OTHER)}"] += 1
        else:
            only_other += 1
            reasons[f"{DECIDING} fails {why_fails(case, None)}"] += 1
    why = "; ".join(f"{text} x{n}" for text, n in reasons.most_common()) or "-"
    line = f"| {suite} | {device} | {len(judged)} | {deciding} | {other} | {only_deciding} | {only_other} | {why} |"
    return line, reasons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--suite", action="append", choices=SUITES)
    parser.add_argument("--fault", action="append", help="faults to plant (default: every one)")
    args = parser.parse_args()
    faults = args.fault or [*FAULTS, *FORWARD_FAULTS]
    print(
        f"| suite | device | results judged | {DECIDING} passes | {OTHER} passes | only {DECIDING} passes "
        f"| only {OTHER} passes | why they disagree (the check the failing standard fails) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for suite in args.suite or SUITES:
        cases = load_specs([REPO / "cases" / f"{suite}.yaml"])
        case_dirs = generate_suite(cases, args.out / suite, GenSettings(), skip_current=True)
        for fault in [None, *faults]:
            options = devices.RunOptions(device=devices.create(fault=fault))
            pipeline.run_suite(case_dirs, options, pipeline.CheckProgress())
            judged = compare_suite(case_dirs, None, RunSettings(standard=DECIDING), jobs=1)
            line, _ = row(suite, f"fault {fault}" if fault else "reference", list(judged.cases))
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

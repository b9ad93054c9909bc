#!/usr/bin/env python3
"""Same spec, same bytes, same verdicts: list what `bsa gen`, `bsa run` and `bsa compare` make of every spec.

Usage: python scripts/gen_digests.py write LIST [--spec FILE]... [--skip NAME]...
       python scripts/gen_digests.py check LIST [--spec FILE]... [--skip NAME]...
       python scripts/gen_digests.py same BASE_REV [--spec FILE]... [--skip NAME]...

For each spec (default: every cases/*.yaml, and cases/chain.yaml again with every op) bsa generates the
cases into a temporary folder, runs them on the reference device (`--deterministic`: one dK/dV summation
order, where the cases' release has that mode; else their outputs are not listed) and judges them. The
list has one line per .bin written (inputs, golden, benchmark, the reference device's outputs),
`sha256  SPEC/CASE/FILE`, and one per case judged, `verdict  SPEC/CASE  VERDICT`.
- `write` writes LIST with this checkout's bsa; `check` compares this checkout's with LIST (the specs it runs).
- `same` writes the list of BASE_REV's bsa (its files `git archive`d into a temporary folder, run on this
  checkout's specs) and checks this checkout's against it: what CI can run, since a gradient is a float32
  sum of BLAS products whose last bits may differ with the NumPy build (a LIST holds for one environment).
Exit 0 when all agree, 1 with one line per difference, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent

#: A spec run a second time with these ops, so the forward, chain and autograd folders are listed too.
EVERY_OP = {"chain.yaml": "forward,backward,chain,autograd"}


def bsa(code: Path, *args: str, usage_error_ok: bool = False) -> int:
    """Run the bsa of `code` (a checkout) with `args` and return its exit code: 0 and 1 (a case failed) are
    answers, 2 (a usage error) too where `usage_error_ok`."""
    env = dict(os.environ, PYTHONPATH=str(code))
    command = [sys.executable, "-m", "bsa_cli", *args]  # in `code`: `-m` looks in the working folder first
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    if done.returncode not in ((0, 1, 2) if usage_error_ok else (0, 1)):
        raise SystemExit(f"bsa {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.returncode


def spec_lines(code: Path, spec: Path, ops: str | None, work: Path) -> list[str]:
    """Return the list's lines of one spec: gen, run on the reference device, compare."""
    label = spec.name if ops is None else f"{spec.name}+{ops.replace(',', '+')}"
    out = work / label
    bsa(code, "gen", str(spec), "-o", str(out), *(["--ops", ops] if ops else []))
    # A suite of a release without the deterministic mode runs in a random dK/dV order: its outputs are not listed.
    deterministic = bsa(code, "run", str(out), "--deterministic", usage_error_ok=True) != 2
    if not deterministic:
        bsa(code, "run", str(out))
    bsa(code, "compare", str(out), "--json", str(work / f"{label}.json"))
    lines = []
    for path in sorted(out.rglob("*.bin")):
        if not deterministic and path.parent.name == "outputs":
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {label}/{path.relative_to(out).as_posix()}")
    report = json.loads((work / f"{label}.json").read_text())
    for case in sorted(report["cases"], key=lambda c: c["name"]):
        lines.append(f"verdict  {label}/{case['name']}  {case['verdict']}")
    return lines


def digests(code: Path, runs: list[tuple[Path, str | None]]) -> list[str]:
    """Return the list's lines of every (spec, ops) run with the bsa of `code`."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="bsa-digests-") as work:
        for spec, ops in runs:
            print(f"{code.name}: {spec.name} {ops or ''}", file=sys.stderr, flush=True)
            lines += spec_lines(code, spec.resolve(), ops, Path(work))
    return lines


def differences(expected: list[str], lines: list[str]) -> list[str]:
    """Return a line per difference between `expected` (those of the specs in `lines`) and `lines`."""
    labels = {line.split("  ")[1].split("/")[0] for line in lines}
    expected = [line for line in expected if line.split("  ")[1].split("/")[0] in labels]
    problems = [f"missing or changed: {line}" for line in sorted(set(expected) - set(lines))]
    return problems + [f"new or changed:     {line}" for line in sorted(set(lines) - set(expected))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("write", "check", "same"))
    parser.add_argument("target", help="LIST (write, check) or BASE_REV (same)")
    parser.add_argument("--spec", action="append", type=Path, help="only these specs (repeatable)")
    parser.add_argument("--skip", action="append", default=[], help="spec file names to leave out (repeatable)")
    args = parser.parse_args(argv)
    specs = args.spec or sorted((CHECKOUT / "cases").glob("*.yaml"))
    runs: list[tuple[Path, str | None]] = [(s, None) for s in specs if s.name not in args.skip]
    runs += [(s, EVERY_OP[s.name]) for s, _ in list(runs) if s.name in EVERY_OP]
    if args.mode == "write":
        lines = digests(CHECKOUT, runs)
        Path(args.target).write_text("".join(f"{line}\n" for line in lines))
        print(f"wrote {len(lines)} lines to {args.target}")
        return 0
    if args.mode == "check":
        expected = Path(args.target).read_text().splitlines()
    else:
        archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", args.target, "bsa_cli"], capture_output=True)
        if archive.returncode:
            print(f"git archive {args.target}: {archive.stderr.decode().strip()}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="bsa-base-") as base:
            subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
            expected = digests(Path(base), runs)
    lines = digests(CHECKOUT, runs)
    problems = differences(expected, lines)
    for line in problems:
        print(line)
    print(f"{len(lines)} lines checked: {len(problems)} differences")
    return 1 if problems or not lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Show that a change of the code's shape changed nothing bsa writes: every file, report and terminal line.

Usage:
  python scripts/same_tree.py check BASE_REV [--checkout DIR] [--suites LIST] [--keep DIR]
      Write the tree of BASE_REV (a git worktree of it, made and removed here) and the tree of DIR (default:
      this script's checkout, as it is on disk), then diff them. Exit 0 when they agree.
  python scripts/same_tree.py write OUT [--checkout DIR] [--suites LIST]
      Write one tree: what the bsa of DIR writes and prints for the suites (default smoke,edge,negative,stress).
  python scripts/same_tree.py diff A B
      Diff two trees written by `write`, file by file.

A tree holds, for each suite: `bsa gen` (cases/), `bsa run --deterministic` on the reference device (each
case's outputs/; deterministic, so that dK/dV do not take a random accumulation order), `bsa run --fault` of
several planted faults (faulted/), `bsa compare` of both with every report (--json, --junit,
--html, --csv; reports/), `bsa list`, `bsa validate`, `bsa export` (msOpST and ATK) and `bsa trend`, and each
command's stdout, stderr and exit code (terminal/), at 80 and 120 columns; `--help` of every command too.

Two runs of the same code differ only in what a clock, a host or a process says: dates, durations, elapsed
seconds, pids, the temporary folders. `diff` blanks exactly those (VOLATILE below) in both trees before it
compares bytes; every other byte must match. The two trees are written under folders of the same length, so
that paths in terminal tables wrap the same; each tree's own root is replaced by `<ROOT>`.
Exit 0 when the trees agree, 1 with one line per difference, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DEFAULT_SUITES = ("smoke", "edge", "negative", "stress")
FAULTS = ("dk-no-scale", "mask-transposed", "rows-swapped", "nan-row", "no-gqa-sum", "tile-noise")
"""Planted faults whose failing reports (hot blocks, tiles, diagnosis, heat maps) the tree holds (not
race-lost-update: it strikes in the runs whose random order seed is odd)."""
COLUMNS = (80, 120)

VOLATILE = (
    # ISO dates and times (report headers, run.json), with or without a zone or fraction
    (re.compile(rb"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d| UTC)?"), b"<TIME>"),
    (re.compile(rb">\d\d-\d\d \d\d:\d\d<"), b"><TIME><"),  # the short dates on a trend chart's axis
    # durations and rates as bsa prints them: 0.12 s, 3.4s, 12 ms, (1.2 s), 5 min, 0:00:03, eta
    (re.compile(rb"\b\d+(\.\d+)?\s?(s|ms|min|seconds|cases/s|GFLOP/s|MB/s)(?![\w])"), b"<DUR>"),
    (re.compile(rb"\b\d+:\d\d:\d\d\b"), b"<DUR>"),
    # JSON fields that hold a clock's or a process's figures
    (
        re.compile(
            rb'"(seconds|elapsed_s|wall_s|duration_s|duration|elapsed|time|pid|started|ended|'
            rb"started_at|ended_at|finished|timestamp|date|host|hostname|cpu_s|user_s|sys_s|max_rss_kib|"
            rb'peak_rss_mib|rss_mib|gen_seconds|run_seconds|compare_seconds)": ?("[^"]*"|[-\d.eE+]+|null)'
        ),
        rb'"\1": <V>',
    ),
    # JUnit and HTML attributes of time
    (re.compile(rb'\b(time|timestamp|hostname)="[^"]*"'), rb'\1="<V>"'),
)

RUN_RECORD_VOLATILE = (
    # run.json: the random seed of a run's dK/dV accumulation order (the runs are --deterministic: unused)
    (re.compile(rb'"--seed",\s*"\d+"'), b'"--seed", <V>'),
    (re.compile(rb'"(seed|order_seed)": ?(\d+|null)'), rb'"\1": <V>'),
)


def run(argv: list[str], checkout: Path, log: Path, columns: int = 100) -> int:
    """Run `python -m bsa_cli ARGV` from `checkout`; keep its stdout, stderr and exit code under `log`."""
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "COLUMNS": str(columns),
        "NO_COLOR": "1",
        "BSA_SAME_TREE": "1",
        "PYTHONHASHSEED": "0",
    }
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "bsa_cli", *argv], cwd=checkout, env=env, capture_output=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.with_suffix(".out").write_bytes(done.stdout)
    log.with_suffix(".err").write_bytes(done.stderr)
    log.with_suffix(".rc").write_text(f"{done.returncode}\n")
    return done.returncode


def write_tree(out: Path, checkout: Path, suites: tuple[str, ...]) -> None:
    """Write everything bsa of `checkout` writes and prints for `suites` under `out` (created empty)."""
    out.mkdir(parents=True)
    (out / "checkout.txt").write_text(f"{checkout}\n")
    term = out / "terminal"
    for command in ("", "gen", "validate", "list", "run", "emulate", "compare", "export", "trend", "check"):
        for columns in COLUMNS:
            run(
                [*([command] if command else []), "--help"],
                checkout,
                term / f"help-{command or 'bsa'}-{columns}",
                columns,
            )
    for suite in suites:
        spec = f"cases/{suite}.yaml"
        cases, reports = out / "cases" / suite, out / "reports"
        for columns in COLUMNS:
            run(["validate", spec], checkout, term / f"{suite}-validate-{columns}", columns)
            run(["list", spec], checkout, term / f"{suite}-list-{columns}", columns)
        run(["gen", spec, "-o", str(cases), "-j", "1"], checkout, term / f"{suite}-gen")
        run(["run", str(cases), "--deterministic", "--timeout", "600"], checkout, term / f"{suite}-run")
        for columns in COLUMNS:
            run(["compare", str(cases), "-v", "-j", "1"], checkout, term / f"{suite}-compare-{columns}", columns)
        run(
            [
                "compare",
                str(cases),
                "-j",
                "1",
                "--json",
                str(reports / f"{suite}.json"),
                "--junit",
                str(reports / f"{suite}.xml"),
                "--html",
                str(reports / f"{suite}.html"),
                "--csv",
                str(reports / f"{suite}.csv"),
            ],
            checkout,
            term / f"{suite}-compare-reports",
        )
        for fmt in ("msopst", "atk"):
            run(
                ["export", str(cases), "--format", fmt, "-o", str(out / "export" / fmt / suite)],
                checkout,
                term / f"{suite}-export-{fmt}",
            )
        for fault in FAULTS:
            faulted = out / "faulted" / suite / fault
            run(
                [
                    "run",
                    str(cases),
                    "--deterministic",
                    "--fault",
                    fault,
                    "--outputs-root",
                    str(faulted),
                    "--timeout",
                    "600",
                ],
                checkout,
                term / f"{suite}-run-{fault}",
            )
            base = reports / f"{suite}-{fault}"
            for columns in COLUMNS:
                run(
                    ["compare", str(cases), "--outputs-root", str(faulted), "-v", "-j", "1"],
                    checkout,
                    term / f"{suite}-compare-{fault}-{columns}",
                    columns,
                )
            run(
                [
                    "compare",
                    str(cases),
                    "--outputs-root",
                    str(faulted),
                    "-j",
                    "1",
                    "--json",
                    f"{base}.json",
                    "--junit",
                    f"{base}.xml",
                    "--html",
                    f"{base}.html",
                    "--csv",
                    f"{base}.csv",
                    "--baseline",
                    str(reports / f"{suite}.json"),
                ],
                checkout,
                term / f"{suite}-compare-{fault}-reports",
            )
        jsons = [str(reports / f"{suite}.json"), *(str(reports / f"{suite}-{f}.json") for f in FAULTS)]
        run(["trend", *jsons, "--html", str(reports / f"{suite}-trend.html")], checkout, term / f"{suite}-trend")


@functools.cache
def checkout_of(root: Path) -> str | None:
    """Return the checkout whose bsa wrote the tree at `root` (`write` records it), None if unknown."""
    path = root / "checkout.txt"
    return path.read_text().strip() if path.is_file() else None


def normalised(data: bytes, root: Path, name: str) -> bytes:
    """Return a file's bytes with its tree's root, the checkout that wrote it and VOLATILE blanked."""
    checkout = checkout_of(root)
    data = data.replace(str(root).encode(), b"<ROOT>")
    if checkout:
        data = data.replace(checkout.encode(), b"<CHECKOUT>")
    for pattern, replacement in VOLATILE + (RUN_RECORD_VOLATILE if name.endswith("run.json") else ()):
        data = pattern.sub(replacement, data)
    return data


def files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


def diff_trees(a: Path, b: Path) -> int:
    left, right = files(a), files(b)
    left.pop("checkout.txt", None)
    right.pop("checkout.txt", None)
    if not left:
        print(f"{a}: empty", file=sys.stderr)
        return 1
    problems = [f"only in {a}: {name}" for name in sorted(left.keys() - right.keys())]
    problems += [f"only in {b}: {name}" for name in sorted(right.keys() - left.keys())]
    blanked = 0
    for name in sorted(left.keys() & right.keys()):
        x, y = left[name].read_bytes(), right[name].read_bytes()
        if x == y:
            continue
        if normalised(x, a, name) == normalised(y, b, name):
            blanked += 1
        else:
            problems.append(f"differs: {name}")
    for line in problems:
        print(line)
    print(
        f"{len(left.keys() & right.keys())} files compared: {len(problems)} differences; "
        f"{blanked} equal once dates, durations, pids and the tree's root are blanked"
    )
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    check = sub.add_parser("check")
    check.add_argument("base_rev")
    write = sub.add_parser("write")
    write.add_argument("out", type=Path)
    for verb in (check, write):
        verb.add_argument("--checkout", type=Path, default=HERE)
        verb.add_argument("--suites", default=",".join(DEFAULT_SUITES))
    check.add_argument("--keep", type=Path, help="keep the two trees here (as a/ and b/)")
    differ = sub.add_parser("diff")
    differ.add_argument("a", type=Path)
    differ.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "diff":
        return diff_trees(args.a, args.b)
    suites = tuple(s for s in args.suites.split(",") if s)
    checkout = args.checkout.resolve()
    if args.verb == "write":
        write_tree(args.out.resolve(), checkout, suites)
        return 0
    work = Path(tempfile.mkdtemp(prefix="same-tree-")) if args.keep is None else args.keep.resolve()
    base = work / "base-checkout"
    subprocess.run(
        ["git", "-C", str(checkout), "worktree", "add", "--detach", "--force", str(base), args.base_rev],
        check=True,
        capture_output=True,
    )
    try:
        write_tree(work / "a", base, suites)
        write_tree(work / "b", checkout, suites)
    finally:
        subprocess.run(["git", "-C", str(checkout), "worktree", "remove", "--force", str(base)], capture_output=True)
    code = diff_trees(work / "a", work / "b")
    if args.keep is None:
        shutil.rmtree(work)
    else:
        print(f"trees kept in {work}/a and {work}/b")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the `bsa` commands share: exit codes, `UserError` and `user_errors()`, and the helpers several commands
call (cases from specs, folders of cases and suites, report files).

Exit codes: one policy for every command, `core.exit_codes` (0 passed, 1 failed, 2 usage, 3 unjudged,
130 interrupted; 143 SIGTERM, 129 SIGHUP).

The command modules (`gen`, `run`, `compare`, `export`, `trend`) import this module and the library,
never each other nor the group; `bsa_cli/cli/__init__.py` builds the `bsa` group from them. So imports flow
one way. This module imports no other module of the CLI but `output`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..core.case import Case
from ..core.errors import BsaError, DataError, SpecError, filter_hint, plural
from ..core.exit_codes import ExitCode
from ..gen.schedule import Estimate, machine_memory, parse_shard, shard
from ..ops import OPS, Op, folder_name, split_folder_name
from ..specs import MAX_CASES, SpecErrors, load_specs
from ..store import MANIFEST, find_cases, load_manifest, output_problem, select_cases
from . import output

if TYPE_CHECKING:  # the reports' modules load with the commands that write reports (not gen's)
    from .. import report
    from ..compare import SuiteResult
    from ..compare.drift import Drift

#: How deep below a folder without cases `bsa compare` looks for folders of suites.
SUITE_DEPTH = 3


class UserError(click.ClickException):
    """A user mistake (bad spec, bad file, bad option value): `Error: ...` on stderr, exit code 2."""

    exit_code = ExitCode.USAGE


@contextmanager
def user_errors(*also: type[Exception]) -> Iterator[None]:
    """Turn library errors about user files (`BsaError`, and the types `also`: the `ValueError` of a parser,
    say) into `Error:` messages with exit code 2, the one place the CLI does so; several bad cases of a
    spec get a line each."""
    caught: tuple[type[Exception], ...] = (BsaError, *also)
    try:
        yield
    except caught as exc:
        if isinstance(exc, SpecErrors):
            raise UserError("\nError: ".join(SpecError.__str__(e) for e in exc.errors)) from None
        raise UserError(str(exc)) from None


# ---- cases from specs (gen, list, check) ----------------------------------------------------------


def load_cases(
    specs: Sequence[str],
    filters: Sequence[str] = (),
    shard_text: str | None = None,
    max_cases: int = MAX_CASES,
    release: str | None = None,
    ops: Sequence[Op] | None = None,
) -> list[Case]:
    """Load, filter and shard the cases of the given specs (`release` overriding theirs, `ops` their ops:
    `--ops`), turning spec errors into `Error:` messages."""
    if not specs:
        raise UserError("give at least one spec file or folder (for example cases/smoke.yaml)")
    with user_errors():
        cases = load_specs(specs, max_cases, release, None if ops is None else tuple(ops))
    if filters:
        names = [c.name for c in cases]
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in filters)]
        if not cases:
            hint = filter_hint(filters, names)
            raise UserError(f"--filter {' '.join(map(repr, filters))} matches no case{hint}")
    if shard_text:
        with user_errors(ValueError):
            index, count = parse_shard(shard_text)
        cases = shard(cases, index, count)
    return cases


def select_ops(case_dirs: Sequence[Path], ops: Sequence[Op] | None) -> tuple[list[Path], list[str]]:
    """Return the case folders of the ops `ops` (by folder name, `ops.split_folder_name`; None: all) and a
    line for each case that has no folder of a requested op (that op of it is not taken).

    A case is the folders of one name in one folder of cases; the line names the ops it has and the
    `bsa gen --ops` that adds the missing one. An op's folder is looked for on disk, not only among
    `case_dirs`: one that --filter left out is not missing.
    """
    if ops is None:
        return list(case_dirs), []
    by_case: dict[tuple[Path, str], list[Op]] = {}
    for case_dir in case_dirs:
        name, op = split_folder_name(Path(case_dir).name)
        by_case.setdefault((Path(case_dir).parent, name), []).append(op)
    notes = []
    for (parent, name), present in by_case.items():
        present += [o for o in OPS if o not in present and (parent / folder_name(name, o) / MANIFEST).is_file()]
        for op in ops:
            if op not in present:
                has = ", ".join(o for o in OPS if o in present)
                wanted = ",".join(o for o in OPS if o in present or o in ops)
                notes.append(
                    f"case {name} has no {op} folder: its spec lists ops {has}; "
                    f"regenerate with `bsa gen --ops {wanted}`"
                )
    selected = [d for d in case_dirs if split_folder_name(Path(d).name)[1] in ops]
    return selected, notes


def ops_selected(case_dirs: Sequence[Path], ops: Sequence[Op] | None) -> list[Path]:
    """Return the folders of the ops --ops asks for (`select_ops`), naming each case's missing op on stderr.

    Raises:
        UserError: no folder of these ops is left.
    """
    selected, notes = select_ops(case_dirs, ops)
    for note in notes:
        output.warn(note)
    if not selected:
        raise UserError(
            f"--ops {','.join(ops or ())}: none of the {plural(len(case_dirs), 'case folder')} is of these ops"
        )
    return selected


def warn_constraints(cases: Sequence[Case]) -> None:
    """Print on stderr where each case's golden and the A2/A3 kernel part ways."""
    for case in cases:
        for note in case.warnings:
            output.warn(f"{case.name}: {note}")


def show_kernel_path_notes(case_dirs: Sequence[Path]) -> None:
    """Print on stderr what `bsa gen` noted about each case's kernel precision path (manifest `notes`:
    fp16 overflow, values flushed to zero)."""
    for case_dir in case_dirs:
        try:
            manifest = load_manifest(case_dir)
        except (BsaError, OSError):
            continue
        for note in manifest.notes:
            output.warn(f"{case_dir.name}: {note}")


def refuse_oversized(estimates: dict[str, Estimate], force: bool) -> None:
    """Refuse cases whose estimated peak memory exceeds this machine's, unless forced."""
    memory = machine_memory()
    too_big = [(name, e) for name, e in estimates.items() if memory and e.peak_memory > memory]
    if too_big and not force:
        name, e = too_big[0]
        raise UserError(
            f"case '{name}' needs about {e.peak_memory / 2**30:.1f} GiB, more than this machine's "
            f"{memory / 2**30:.1f} GiB ({plural(len(too_big), 'such case')}); use --force to try anyway, "
            "or --filter/--shard to leave them out"
        )


# ---- case folders (compare, export) ---------------------------------------------------------------


def find_suites(root: Path, depth: int = SUITE_DEPTH) -> list[Path]:
    """Return the folders below `root` (down to `depth` levels) that hold case directories, sorted."""
    suites: list[Path] = []
    level = [root]
    for _ in range(depth):
        below = sorted(
            p
            for folder in level
            for p in folder.iterdir()
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
        )
        suites.extend(p for p in below if not (p / MANIFEST).is_file() and find_cases(p))
        level = [p for p in below if not (p / MANIFEST).is_file() and p not in suites]
    return sorted(suites)


def select_cases_or_suites(paths: Sequence[Path], filters: Sequence[str]) -> list[Path]:
    """Return the case directories under `paths`; a folder that holds no case itself but folders of suites
    (OUT/smoke, OUT/edge, ...) stands for all of them, and says so on stderr.

    Raises:
        UserError: a path holds no case at any depth (naming where to look), or no case matches the filter.
    """
    roots: list[Path] = []
    with user_errors():
        for path in paths:
            try:
                if Path(path).is_dir() and not find_cases(Path(path)):
                    suites = find_suites(Path(path))
                    if not suites:
                        raise DataError(
                            str(path),
                            f"no case directories (*/case.json) here or up to {SUITE_DEPTH} folders "
                            "below; write them with `bsa gen SPECS -o OUT` and compare OUT",
                        )
                    counts = ", ".join(f"{s} ({plural(len(find_cases(s)), 'case')})" for s in suites)
                    output.info(f"{path} holds no case itself; comparing the {len(suites)} suites below it: {counts}")
                    roots.extend(suites)
                else:
                    roots.append(Path(path))
            except OSError as exc:
                raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return select_cases(roots, filters)


def folders_of_cases(paths: Sequence[Path]) -> list[Path]:
    """Return the folders of cases that `paths` stand for (as `select_cases_or_suites` reads them): a given
    folder of cases, or the suites below a folder without cases; a case folder given itself is none."""
    roots: list[Path] = []
    for path in map(Path, paths):
        try:
            if path.is_dir() and not (path / MANIFEST).is_file():
                roots.extend([path] if find_cases(path) else find_suites(path))
        except (OSError, BsaError):
            continue
    return roots


# ---- reports (compare, check) ---------------------------------------------------------------------


#: The report options and the names `wrote ... report` gives them.
REPORT_KINDS = {"--json": "JSON", "--junit": "JUnit", "--html": "HTML", "--csv": "CSV"}


def refuse_writing_inputs(
    outputs: Mapping[str, Path | str | None], inputs: Sequence[Path | str | None], *, device_outputs: bool = False
) -> None:
    """Stop the command before anything is read or written when an output option (option -> path; None: not
    given) names an input, or lies in a case folder (`store.output_problem`)."""
    given = [Path(p) for p in inputs if p is not None]
    for option, path in outputs.items():
        if path is not None and (problem := output_problem(Path(path), given, device_outputs=device_outputs)):
            raise UserError(f"{option} {path}: {problem}")


def write_report(kind: str, path: Path, writer: Callable[[Any, Path], None], content: object) -> None:
    """Write one report file (`kind`: its option), an unwritable one a usage error, and say so on stderr."""
    try:
        writer(content, path)
    except OSError as exc:
        raise UserError(f"cannot write {kind} {path}: {exc.strerror or exc}") from None
    output.info(f"wrote {REPORT_KINDS.get(kind, kind)} report {path}")


def prepare_reports(paths: dict[str, Path | None]) -> None:
    """Create the report files' folders and check they can be written, before any case is judged."""
    from .. import report

    with user_errors():  # report.ReportPathError
        report.prepare_report_paths(paths)


def write_reports(
    suite: SuiteResult,
    paths: dict[str, Path | None],
    out: Sequence[Path] = (),
    header: report.ReportHeader | None = None,
    drift: Drift | None = None,
    exit_code: int | None = None,
) -> None:
    """Write the reports asked for by --json, --junit, --html and --csv (with a baseline's `drift` in JSON and
    HTML; `exit_code` replaces the suite's in JSON when --fail-on-regression changed it; `header`: the merged
    shards' date and hosts, default now and here)."""
    from .. import report
    from ..compare.drift import drift_document, regressions_document

    header = header or report.report_header(suite, out)
    additions: dict[str, object] = {}
    if drift is not None:
        additions = {"drift": drift_document(drift), "regressions": regressions_document(drift)}
    if exit_code is not None:
        additions["exit_code"] = exit_code
    writers: dict[str, Callable[[SuiteResult, Path], None]] = {
        "--json": lambda s, p: report.write_json(s, p, header, additions),
        "--junit": report.write_junit,
        "--html": lambda s, p: report.write_html(s, p, header, drift),
        "--csv": report.write_csv,
    }
    for option, path in paths.items():
        if path is not None:
            write_report(option, path, writers[option], suite)

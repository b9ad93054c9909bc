"""`bsa check` as a library function: generate a suite's cases, run a device on them, judge the outputs.

`check_suite` composes the library's three steps (`generate.generate_suite`, `devices.run_cases`,
`compare.compare_suite`) and returns what each gave; `run_suite` is the run step alone (`bsa run`). Nothing
here prints: a `CheckProgress` is told what happens (the CLI shows it), and errors are raised as
`BsaError`s for the caller to turn into messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from . import devices, store
from .compare import CaseResult, RunSettings, SuiteResult, compare_case, compare_suite
from .compare.recheck import bootstrap, fails_narrowly, run_ratio
from .compare.results import Verdict
from .core.case import DEFAULT_PRECISION, Case, Precision
from .core.errors import BsaError, DataError
from .gen.generate import generate_suite
from .gen.schedule import Estimate, auto_jobs, estimate
from .gen.settings import GenSettings
from .ops.interface import DETERMINISTIC_RELEASES
from .store.manifest import Manifest


class CheckProgress:
    """What `check_suite` and `run_suite` report as they go; every method does nothing unless overridden."""

    def generating(self, cases: Sequence[Case], estimates: Mapping[str, Estimate]) -> None:
        """The cases are about to be generated (those current in the folder are left alone)."""

    def generated(self, case: Case, outcome: str) -> None:
        """A case is generated, or found current ("current")."""

    def progress(self, name: str, fraction: float) -> None:
        """Case `name` is this far (0..1) through the current step (generating, or the reference device)."""

    def running(self, case_dirs: Sequence[Path], device: devices.Device, flops: Mapping[str, float] | None) -> None:
        """The device is about to run the cases; `flops` (the reference device only) weighs each case."""

    def on_run_event(self, event: devices.RunEvent) -> None:
        """A case started or ended on the device."""

    def judging(self, case_dirs: Sequence[Path]) -> None:
        """The cases' outputs are about to be judged."""

    def judged(self, result: CaseResult) -> None:
        """A case is judged."""


@dataclass(frozen=True)
class CheckResult:
    """What `check_suite` did: the case directories, the run, and the verdicts (None if the run was
    interrupted: then nothing is judged)."""

    case_dirs: tuple[Path, ...]
    run: devices.RunSummary
    suite: SuiteResult | None

    @property
    def interrupted(self) -> bool:
        return self.suite is None


def check_suite(
    cases: Sequence[Case],
    out: Path,
    options: devices.RunOptions,
    settings: RunSettings,
    precision: Precision = DEFAULT_PRECISION,
    jobs: int | None = None,
    progress: CheckProgress | None = None,
    estimates: Mapping[str, Estimate] | None = None,
) -> CheckResult:
    """Generate `cases` into `out` (reusing those current there), run the device on them, judge the outputs.

    Args:
        cases: the cases to check (`specs.load_specs`).
        out: the folder of the generated cases.
        options: the device and how to run it (`devices.RunOptions`).
        settings: comparison settings given for the whole run (validated).
        precision: precision of the golden.
        jobs: processes generating (None: `schedule.auto_jobs` decides) and judging (None: as
            `compare.suite_jobs` decides) cases side by side.
        progress: told what happens.
        estimates: each case's `schedule.estimate`, if already made.

    Raises:
        BsaError: a case cannot be generated or run, or a run threshold does not apply to a case's standard.
    """
    progress = progress or CheckProgress()
    if options.deterministic:
        refuse_deterministic({case.name: case.release for case in cases})
    estimates = estimates if estimates is not None else {case.name: estimate(case) for case in cases}
    gen_jobs = auto_jobs(jobs, list(estimates.values()))
    progress.generating(cases, estimates)
    case_dirs = generate_suite(
        cases,
        out,
        GenSettings(precision, gen_jobs, on_progress=lambda case, fraction: progress.progress(case.name, fraction)),
        skip_current=True,
        on_done=lambda case, outcome, _path: progress.generated(case, outcome),
    )
    summary = run_suite(case_dirs, options, progress)
    if summary.interrupted:
        return CheckResult(tuple(case_dirs), summary, None)
    progress.judging(case_dirs)
    try:
        # judged and reported in the order `bsa compare OUT` gives them (`store.find_cases`: by folder name)
        judged = sorted(case_dirs, key=lambda case_dir: case_dir.name)
        suite = compare_suite(judged, None, settings, on_case=progress.judged, jobs=jobs)
    except ValueError as exc:  # a run threshold that does not apply to a case's standard
        raise BsaError(str(exc)) from None
    return CheckResult(tuple(case_dirs), summary, suite)


#: The folder of OUT that holds the reseeded cases of `bsa check --recheck` (hidden: `bsa compare OUT` skips it).
RECHECK_FOLDER = ".recheck"


def recheck_suite(
    suite: SuiteResult,
    cases: Sequence[Case],
    out: Path,
    runs: int,
    options: devices.RunOptions,
    settings: RunSettings,
    precision: Precision = DEFAULT_PRECISION,
    jobs: int | None = None,
    progress: CheckProgress | None = None,
) -> SuiteResult:
    """Judge each case of `suite` that fails narrowly (`compare.recheck`) again over `runs` reseeded runs.

    The case, with seed + 1 ... seed + runs and only the op that failed, is generated into OUT/.recheck/
    (reusing runs already there), run and judged; the bootstrap interval of the runs' ratios decides its verdict,
    and its `recheck` holds the interval and the runs.
    """
    progress = progress or CheckProgress()
    by_name = {case.name: case for case in cases}
    results = []
    for result in suite.cases:
        case = by_name.get(result.case_name)
        if case is None or not fails_narrowly(result):
            results.append(result)
            continue
        reseeded = [
            replace(case, name=f"{case.name}.recheck{i}", seed=case.seed + i, ops=(result.op,))
            for i in range(1, runs + 1)
        ]
        gen_jobs = auto_jobs(jobs, [estimate(c) for c in reseeded])
        case_dirs = generate_suite(reseeded, out / RECHECK_FOLDER, GenSettings(precision, gen_jobs), skip_current=True)
        summary = run_suite(case_dirs, options, progress)
        if summary.interrupted:
            raise KeyboardInterrupt
        judged = compare_suite(case_dirs, None, settings, jobs=jobs)
        check = bootstrap([run_ratio(c) for c in judged.cases])
        verdict: Verdict = "PASS" if check.passed else "FAIL"
        results.append(replace(result, verdict=verdict, recheck=check, notes=(*result.notes, check.text)))
    return SuiteResult(tuple(results), suite.seconds)


def run_suite(case_dirs: Sequence[Path], options: devices.RunOptions, progress: CheckProgress) -> devices.RunSummary:
    """Run the device on every case (`devices.run_cases`) but the op folders gen skipped (`skipped_folders`:
    no device runs them; compare reports them SKIP); the reference device also reports progress within a
    case, weighed by backward FLOPs."""
    skipped = {case_dir for case_dir, _ in skipped_folders(case_dirs)}
    case_dirs = [case_dir for case_dir in case_dirs if case_dir not in skipped]
    if options.deterministic:  # a broken manifest is left to the run, which records it as the case's error
        refuse_deterministic({case_dir.name: manifest.release for case_dir, manifest in _readable(case_dirs)})
    options = options if options.judge is not None else replace(options, judge=judge_run)
    flops = backward_flops(case_dirs) if options.device.reports_progress else None
    progress.running(case_dirs, options.device, flops)
    with options.device.reporting(progress.progress):
        return devices.run_cases(case_dirs, options, on_event=progress.on_run_event)


def completed(case_dirs: Sequence[Path], options: devices.RunOptions) -> list[Path]:
    """Return the case folders that hold a complete result of this run as it would be now (`bsa run` leaves
    them be unless --all): a run.json whose outcome is ok (the device's status and outputs checked, the files
    moved into place), whose inputs' sha256 are the manifest's (a case generated again since runs again), whose
    device is this run's (its name and fault, the binary's path and sha256: a rebuilt kernel runs again), with
    the same --repeat and --deterministic, and whose outputs are the manifest's, all there as recorded (bytes
    and sha256). A
    timed run (--time) finds nothing complete. A run Ctrl-C cut short records no such result."""
    from .compare.case_files import RUN_RECORD, RUN_RECORD_MAX_BYTES
    from .core.untrusted import inside, load_json, read_regular

    if options.timing is not None:
        return []
    device = options.device
    done = []
    for case_dir, manifest in _readable(case_dirs):
        output_dir = devices.output_dir_for(case_dir, options.outputs_root)
        try:
            record = load_json(read_regular(inside(output_dir, RUN_RECORD), RUN_RECORD_MAX_BYTES))
        except (BsaError, ValueError, RecursionError):
            continue
        inputs = {name: entry.get("sha256") for name, entry in manifest.entries("inputs") if entry.get("sha256")}
        same_run = isinstance(record, dict) and (
            record.get("outcome") == "ok"
            and record.get("inputs") == inputs
            and isinstance(record.get("device"), dict)
            and record["device"].get("name") == device.name
            and record.get("binary") == device.binary_record
            and record.get("deterministic") == options.deterministic
            and isinstance(record.get("repeat"), dict)
            and record["repeat"].get("count") == options.repeat
        )
        expected = {name: entry.get("file") for name, entry in manifest.entries("outputs")}
        if same_run and _outputs_as_recorded(output_dir, record.get("outputs"), expected):
            done.append(case_dir)
    return done


def _outputs_as_recorded(output_dir: Path, outputs: object, expected: Mapping[str, object]) -> bool:
    """Whether a run record lists the outputs the manifest names now (`expected`: name -> file), each in
    `output_dir` with its recorded size and sha256."""
    if not isinstance(outputs, dict):
        return False
    files = {name: entry.get("file") if isinstance(entry, dict) else None for name, entry in outputs.items()}
    if files and files != expected:  # none: an ok record of a case the op refuses as expected writes none
        return False
    for entry in outputs.values():
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            return False
        path = output_dir / entry["file"]
        try:
            if not path.is_file() or path.stat().st_size != entry.get("bytes"):
                return False
            if store.sha256_file(path) != entry.get("sha256"):
                return False
        except OSError:
            return False
    return True


def failed_in_report(document: object, where: str) -> set[str]:
    """Return the case folders a JSON report (`--json`, schema bsa-compare/1) says FAIL or ERROR.

    Raises:
        DataError: the document is not such a report.
    """
    cases = document.get("cases") if isinstance(document, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in cases):
        raise DataError(where, "not a bsa JSON report (written by --json): no list of cases with names")
    return {c["name"] for c in cases if c.get("verdict") in ("FAIL", "ERROR")}


def judge_run(case_dir: Path, run_dir: Path) -> tuple[str, str] | None:
    """Judge one --repeat run's outputs as `bsa compare` would (`devices.RunOptions.judge`): None when they
    pass, else (verdict, why)."""
    result = compare_case(case_dir, run_dir, workers=1, verify_inputs=False)
    if result.verdict == "PASS":
        return None
    return result.verdict, result.deciding.detail if result.deciding is not None else result.message


def skipped_folders(case_dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    """Return the case folders whose manifest says gen skipped their op (`skip`), with why; a manifest that
    cannot be read is left to the run, which records it as the case's error."""
    return [(case_dir, manifest.skip) for case_dir, manifest in _readable(case_dirs) if manifest.skip is not None]


def _readable(case_dirs: Sequence[Path]) -> Iterator[tuple[Path, Manifest]]:
    """Yield each case folder whose manifest can be read, with that manifest (in order; the others are skipped)."""
    for case_dir in case_dirs:
        try:
            manifest = store.load_manifest(case_dir)
        except BsaError:
            continue
        yield case_dir, manifest


def refuse_deterministic(releases: Mapping[str, str]) -> None:
    """Raise RunConfigError, before anything runs, when --deterministic meets cases of a release without the
    mode (the A2/A3 tiling reads GetDeterministic() only on master, since 8ba7ee217 / e6d22a23e)."""
    without = sorted(name for name, release in releases.items() if release not in DETERMINISTIC_RELEASES)
    if without:
        shown = ", ".join(f"{name} ({releases[name]})" for name in without[:6]) + (" ..." if len(without) > 6 else "")
        raise devices.RunConfigError(
            f"--deterministic: {len(without)} case(s) target a release without the deterministic mode: {shown}; "
            f"it exists on {', '.join(DETERMINISTIC_RELEASES)} (A2/A3; the Ascend 950 tiling refuses it): "
            "drop --deterministic or regenerate with --release master"
        )


def backward_flops(case_dirs: Sequence[Path]) -> dict[str, float]:
    """Return each case's backward FLOPs from its manifest (what the reference device computes)."""
    flops: dict[str, float] = {}
    for case_dir in case_dirs:
        try:
            manifest = store.load_manifest(case_dir)
            flops[manifest.name] = 0.0 if manifest.is_negative else manifest.flops_backward  # refused: no work
        except (BsaError, KeyError, TypeError, ValueError):
            flops[case_dir.name] = 0.0
    return flops


def inapplicable_faults(case_dirs: Sequence[Path], fault: str) -> list[str]:
    """Return a warning for each case that the planted fault cannot change (it runs clean)."""
    from .devices.faults import fault_not_applied

    warnings = []
    for case_dir in case_dirs:
        try:
            manifest = store.load_manifest(case_dir)
            if manifest.is_negative:
                warnings.append(
                    f"{manifest.name}: fault '{fault}' not planted: a negative case is refused before any computation"
                )
                continue
            if manifest.skip is not None:
                continue  # never run
            case = manifest.case
            mask = store.read_array(case_dir, manifest.entry("inputs", "block_sparse_mask"))
            reason = fault_not_applied(fault, case, mask, manifest.op)
        except (BsaError, KeyError, TypeError, ValueError):
            continue  # the run reports a broken case itself
        if reason is not None:
            warnings.append(f"{manifest.name}: {reason}")
    return warnings

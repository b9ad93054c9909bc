"""`bsa fuzz` as a library: draw cases the operator accepts, check each on a device, shrink each failure.

`fuzz(settings, progress)` checks case after case of the sequence its seed gives (`draw.draw`), each through
`pipeline.check_suite` (gen, run, compare: the same verdict `bsa check` gives). A failure is shrunk
(`shrink.candidates`) while it still fails with the same diagnosis, and the smallest is written as
`OUT/repro/NAME.yaml`, a spec `bsa check` reproduces. A failure whose diagnosis and boundary features
(`draw.features`) hold an earlier repro's is counted as a repeat, not shrunk again. The budget only decides
where the sequence stops: the cases, and the order, are the seed's. Nothing here prints: a `FuzzProgress` is
told what happens, and `OUT/fuzz.json` records every case tried.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import devices
from .._version import __version__
from ..compare import CaseResult, RunSettings
from ..core.case import Case
from ..pipeline import check_suite
from ..report.files import write_text_atomic
from . import draw as drawing
from .draw import Bounds, build, features, flops
from .shrink import candidates

#: Cases one failure's shrinking may run at most.
MAX_SHRINK_RUNS = 80
#: The format of OUT/fuzz.json.
FUZZ_FORMAT = "bsa-fuzz/1"


@dataclass(frozen=True)
class FuzzSettings:
    """What a fuzz run is given: the folder, the seed, the budget in seconds (and at most `max_cases` drawn
    cases), the device, the release and ops the rules follow, the bounds drawn within."""

    out: Path
    seed: int
    budget: float
    options: devices.RunOptions
    release: str | None = None
    ops: tuple[Any, ...] | None = None
    bounds: Bounds = Bounds()
    max_cases: int | None = None
    device_words: str = ""
    max_shrink_runs: int = MAX_SHRINK_RUNS


@dataclass
class Tried:
    """One case tried: drawn (`shrinking` None) or a shrinking step of failure `shrinking`."""

    index: int
    name: str
    params: dict[str, Any]
    flops: int
    verdict: str
    diagnosis: str | None
    headline: str
    seconds: float
    shrinking: str | None = None
    repeat_of: str | None = None


@dataclass
class Failure:
    """A distinct failure: its repro, the first failing case, how far it shrank, and how often it was seen."""

    repro: str
    diagnosis: str
    headline: str
    first_case: str
    first_params: dict[str, Any]
    first_flops: int
    repro_params: dict[str, Any]
    repro_flops: int
    shrink_steps: int
    shrink_runs: int
    found_after_s: float
    repro_after_s: float
    features: list[str]
    repeats: int = 0

    @property
    def ratio(self) -> float:
        return self.repro_flops / self.first_flops if self.first_flops else 1.0


@dataclass
class FuzzResult:
    """What a fuzz run did: every case tried and the distinct failures; `return_code` 1 when any failed."""

    tried: list[Tried] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    drawn: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def failed(self) -> int:
        """Drawn cases that failed (repeats included)."""
        return sum(1 for t in self.tried if t.shrinking is None and t.verdict != "PASS")

    @property
    def return_code(self) -> int:
        return 1 if self.failures else 0


class FuzzProgress:
    """What `fuzz` reports as it goes; every method does nothing unless overridden."""

    def tried(self, result: FuzzResult, tried: Tried) -> None:
        """A case was checked (drawn, or a shrinking step)."""

    def found(self, result: FuzzResult, failure: Failure, repeat: bool) -> None:
        """A failure was shrunk and written (or, `repeat`, seen again)."""


def diagnosis_of(result: CaseResult) -> str:
    """The failure's diagnosis as shrinking keeps it: the first cause's kind and the failing tensors, else the
    deciding check (or the first error words of a case that could not be judged)."""
    if result.verdict == "PASS":
        return "pass"
    failing = sorted({t.name for t in result.tensors if not t.passed})
    if result.diagnosis:
        return f"{result.diagnosis[0].kind}:{','.join(failing)}"
    deciding = result.deciding
    if result.verdict == "FAIL" and deciding is not None:
        return f"{deciding.name}:{deciding.tensor or '-'}"
    return f"{result.verdict.lower()}:{(result.errors[0] if result.errors else '').split(':')[0][:40]}"


class _Runner:
    """Checks single cases in OUT/cases, one at a time, and records each."""

    def __init__(self, settings: FuzzSettings, progress: FuzzProgress, result: FuzzResult, deadline: float) -> None:
        self.settings, self.progress, self.result, self.deadline = settings, progress, result, deadline
        self.work = settings.out / "cases"
        self.started = time.monotonic()

    def check(self, raw: dict[str, Any], case: Case, shrinking: str | None = None) -> tuple[Tried, CaseResult]:
        started = time.monotonic()
        checked = check_suite([case], self.work, self.settings.options, RunSettings(), jobs=1)
        if checked.suite is None:
            raise KeyboardInterrupt
        results = [r for r in checked.suite.cases if r.verdict != "SKIP"] or list(checked.suite.cases)
        worst = next((r for r in results if r.verdict != "PASS"), results[0])
        tried = Tried(
            index=len(self.result.tried),
            name=case.name,
            params=raw,
            flops=flops(case),
            verdict=worst.verdict,
            diagnosis=None if worst.verdict == "PASS" else diagnosis_of(worst),
            headline=worst.headline,
            seconds=round(time.monotonic() - started, 3),
            shrinking=shrinking,
        )
        self.result.tried.append(tried)
        if tried.verdict == "PASS":
            for case_dir in checked.case_dirs:
                shutil.rmtree(case_dir, ignore_errors=True)  # a passing case is not kept: the seed draws it again
        self.progress.tried(self.result, tried)
        return tried, worst

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def fuzz(settings: FuzzSettings, progress: FuzzProgress | None = None) -> FuzzResult:
    """Draw and check cases until the budget (or `max_cases`) is spent; shrink and write each distinct failure.

    Raises:
        BsaError: a case cannot be generated or run (the device is misconfigured).
    """
    progress = progress or FuzzProgress()
    result = FuzzResult()
    runner = _Runner(settings, progress, result, time.monotonic() + settings.budget)
    try:
        index = 0
        while time.monotonic() < runner.deadline and (settings.max_cases is None or index < settings.max_cases):
            raw, case = drawing.draw(settings.seed, index, settings.bounds, settings.release, settings.ops)
            index += 1
            result.drawn = index
            tried, judged = runner.check(raw, case)
            if tried.verdict == "PASS":
                continue
            assert tried.diagnosis is not None
            known = _known(result.failures, tried.diagnosis, features(case))
            if known is not None:
                known.repeats += 1
                tried.repeat_of = known.repro
                progress.found(result, known, repeat=True)
                continue
            failure = _shrink(runner, raw, case, tried, judged)
            repeat = _known(result.failures, failure.diagnosis, frozenset(failure.features))
            if repeat is not None:  # shrank to a repro already written
                repeat.repeats += 1
                tried.repeat_of = repeat.repro
                progress.found(result, repeat, repeat=True)
                continue
            wider = _wider(result.failures, failure)
            if wider is not None:  # the same failure with fewer features: the better repro, under the old name
                failure.repro, failure.repeats = wider.repro, wider.repeats + 1
                failure.repro_params["name"] = wider.repro
                # first seen with the earlier one
                failure.first_case, failure.first_params = wider.first_case, wider.first_params
                failure.first_flops, failure.found_after_s = wider.first_flops, wider.found_after_s
                result.failures[result.failures.index(wider)] = failure
                write_repro(settings, failure)
                progress.found(result, failure, repeat=True)
                continue
            result.failures.append(failure)
            write_repro(settings, failure)
            progress.found(result, failure, repeat=False)
    except KeyboardInterrupt:
        result.interrupted = True
    _fold(settings, result)
    result.seconds = runner.elapsed()
    write_record(settings, result)
    return result


def _tensors(diagnosis: str) -> str:
    """The failing tensors of a diagnosis (`not-written:dq` -> `dq`): the part that does not change with the shape
    a fault is met in (one fault reads as not-written on one shape and block-selection on another)."""
    return diagnosis.partition(":")[2]


def _known(failures: list[Failure], diagnosis: str, held: frozenset[str]) -> Failure | None:
    """Return the earlier failure of the same failing tensors whose repro's features the new case holds."""
    for failure in failures:
        if _tensors(failure.diagnosis) == _tensors(diagnosis) and set(failure.features) <= held:
            return failure
    return None


def _fold(settings: FuzzSettings, result: FuzzResult) -> None:
    """Fold each failure into one of the same failing tensors whose repro holds fewer of its features (found after
    it): the later, smaller repro stands for both, and the folded one's repro file goes."""
    for failure in list(result.failures):
        narrower = [
            other
            for other in result.failures
            if other is not failure
            and _tensors(other.diagnosis) == _tensors(failure.diagnosis)
            and set(other.features) < set(failure.features)
        ]
        if narrower:
            narrower[0].repeats += failure.repeats + 1
            result.failures.remove(failure)
            for tried in result.tried:
                if tried.repeat_of == failure.repro:
                    tried.repeat_of = narrower[0].repro
            (settings.out / "repro" / f"{failure.repro}.yaml").unlink(missing_ok=True)


def _wider(failures: list[Failure], failure: Failure) -> Failure | None:
    """Return the earlier failure of the same failing tensors whose repro holds every feature of `failure`'s and
    more."""
    for earlier in failures:
        if _tensors(earlier.diagnosis) == _tensors(failure.diagnosis) and set(failure.features) < set(earlier.features):
            return earlier
    return None


def _shrink(runner: _Runner, raw: dict[str, Any], case: Case, tried: Tried, judged: CaseResult) -> Failure:
    """Shrink a failing case while it fails with the same diagnosis; return the failure with its smallest case."""
    settings = runner.settings
    assert tried.diagnosis is not None
    found_after = runner.elapsed()
    repro = f"repro-{len(runner.result.failures) + 1}-{tried.diagnosis.split(':')[0]}"
    best_raw, best_case, best_flops = raw, case, tried.flops
    steps = runs = 0
    improved = True
    seen: set[str] = {json.dumps(raw, sort_keys=True)}
    while improved and runs < settings.max_shrink_runs:
        improved = False
        for candidate in candidates(best_raw):
            key = json.dumps({**candidate, "name": ""}, sort_keys=True)
            if key in seen or runs >= settings.max_shrink_runs:
                continue
            seen.add(key)
            candidate["name"] = f"{repro}.s{runs + 1:03d}"
            smaller = build(candidate, settings.release, settings.ops)
            if smaller is None or flops(smaller) > best_flops:
                continue
            runs += 1
            step, _ = runner.check(candidate, smaller, shrinking=repro)
            if step.diagnosis == tried.diagnosis:
                best_raw, best_case, best_flops = candidate, smaller, step.flops
                steps += 1
                improved = True
                break
    return Failure(
        repro=repro,
        diagnosis=tried.diagnosis,
        headline=judged.headline,
        first_case=tried.name,
        first_params=raw,
        first_flops=tried.flops,
        repro_params={**best_raw, "name": repro},
        repro_flops=best_flops,
        shrink_steps=steps,
        shrink_runs=runs,
        found_after_s=round(found_after, 2),
        repro_after_s=round(runner.elapsed(), 2),
        features=sorted(features(best_case)),
    )


def write_repro(settings: FuzzSettings, failure: Failure) -> Path:
    """Write OUT/repro/NAME.yaml: the smallest failing case as a spec, with where it came from in comments."""
    path = settings.out / "repro" / f"{failure.repro}.yaml"
    lines = [
        f"# bsa fuzz repro: {failure.diagnosis}: {failure.headline}",
        f"# found by bsa fuzz --seed {settings.seed} on {settings.device_words or 'the device'}",
        f"# first failing case {failure.first_case} ({failure.first_flops} FLOPs): "
        + json.dumps(failure.first_params, sort_keys=True),
        f"# shrunk in {failure.shrink_steps} steps ({failure.shrink_runs} cases run) to {failure.repro_flops} FLOPs "
        f"({failure.ratio:.3g} of the first); reproduce: bsa check {path.name} -o OUT (same device options)",
    ]
    body = yaml.safe_dump({"cases": [failure.repro_params]}, sort_keys=False, default_flow_style=None)
    write_text_atomic(path, "\n".join(lines) + "\n" + body)
    return path


def write_record(settings: FuzzSettings, result: FuzzResult) -> Path:
    """Write OUT/fuzz.json: the run's settings, every case tried, the distinct failures."""
    path = settings.out / "fuzz.json"
    record = {
        "format": FUZZ_FORMAT,
        "tool": {"name": "bsa", "version": __version__},
        "seed": settings.seed,
        "budget_s": settings.budget,
        "device": settings.device_words,
        "drawn": result.drawn,
        "seconds": round(result.seconds, 2),
        "interrupted": result.interrupted,
        "failures": [{**asdict(f), "ratio": f.ratio} for f in result.failures],
        "cases": [asdict(t) for t in result.tried],
    }
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    return path


__all__ = ["Bounds", "Failure", "FuzzProgress", "FuzzResult", "FuzzSettings", "Tried", "fuzz"]

"""The commercial standard's recheck (复检): a case that fails narrowly, judged again over reseeded runs.

opbase docs/zh/ops_precision_standard/commercial_standard.md, last at 56922c3e667df071af471d78d938b6158a012343
(2026-04-21; removed at 8b296c775a379ade0e34f57008e77e8b1e32203a), sections 4.5.2 and 5.3.4: the case is run
again on N inputs drawn with other seeds; the median of its error ratios gets a bootstrap 95% confidence interval
(2000 resamples with replacement, the interval's ends the 2.5% and 97.5% order statistics of the resampled
medians); fewer than 200 runs fail outright, and a lower end above 1.0 fails.

bsa's ratio of a run is its deciding check's severity (`Check.severity`: value / limit of the check nearest to,
or furthest over, its limit; 1 is the limit), so one interval covers every standard. A case fails narrowly
when each of its failed checks is one of its standard's own (a finite severity) and at most
`Standard.recheck_margin` times its limit (docs/compare.md, "The recheck").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..standards import STANDARDS
from .results import FAIL, CaseResult, Recheck

#: Runs below which a recheck fails whatever its interval ("小样本熔断": N < 200).
MIN_RUNS = 200
#: Bootstrap resamples of the runs' ratios (section 5.3.4's loop).
RESAMPLES = 2000
#: The interval's two tails (a 95% interval).
TAIL = 0.025


def fails_narrowly(case: CaseResult) -> bool:
    """Whether a FAIL is narrow: every failed check finite and within its standard's `recheck_margin`."""
    standard = STANDARDS.get(case.standard)
    if case.verdict != FAIL or standard is None or not case.tensors:
        return False
    failed = [c for c in case.all_checks if not c.passed]
    return bool(failed) and all(c.limit is not None and c.severity <= standard.recheck_margin for c in failed)


def run_ratio(case: CaseResult) -> float:
    """A rerun's ratio: its deciding check's severity (inf where it could not be judged)."""
    deciding = case.deciding
    if case.verdict not in ("PASS", FAIL) or deciding is None:
        return math.inf
    return float(deciding.severity)


def bootstrap(ratios: Sequence[float], seed: int = 0, resamples: int = RESAMPLES) -> Recheck:
    """Judge the runs' ratios: the bootstrap interval of their median, by order statistics.

    The lower end is the ceil(0.025 B)-th smallest of the B resampled medians and the upper end the
    (floor(0.975 B) + 1)-th (the 50th and 1951st of 2000; the text's 25th and 976th of 1000).
    """
    values = np.asarray(ratios, dtype=np.float64)
    runs = int(values.size)
    if runs == 0:
        return Recheck(0, math.nan, math.nan, math.nan, False, "no rerun could be judged", ())
    generator = np.random.Generator(np.random.PCG64(seed))
    picks = generator.integers(0, runs, size=(resamples, runs))
    medians = np.sort(np.median(values[picks], axis=1))
    lower = float(medians[math.ceil(TAIL * resamples) - 1])
    upper = float(medians[min(math.floor((1 - TAIL) * resamples), resamples - 1)])
    median = float(np.median(values))
    if runs < MIN_RUNS:
        passed, why = False, f"{runs} runs, fewer than {MIN_RUNS}: fails whatever the interval"
    elif lower > 1.0:
        passed, why = False, f"the interval's lower end {lower:.4g} is above 1"
    else:
        passed, why = True, f"the interval's lower end {lower:.4g} is at most 1"
    return Recheck(runs, median, lower, upper, passed, why, tuple(float(v) for v in values))

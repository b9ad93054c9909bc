"""Kernel times and guard zones as a device child reports them on its stdout (docs/run.md, "Timed runs" and
"Guard zones"), and the summary of the times that run.json records. Pure: lines in, numbers out.

The lines of the binary contract (read from the first `LOG_MAX_BYTES` of the child's stdout log):

    bsa-time-us: STEP MICROSECONDS        one per timed call; STEP is `forward` or `backward`
    bsa-chip: NAME                        the chip the calls ran on, as the device names it (`Ascend910B2`)
    bsa-guard-zones: BYTES                the outputs had guard zones of BYTES before and after them
    bsa-guard-write: TENSOR OFFSET COUNT  the call wrote outside TENSOR: COUNT elements from element OFFSET
                                          (negative: before its first element; its size or more: after it)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The variables `bsa run --time` sets for a device child: how many calls to time, after how many untimed ones.
RUNS_ENV = "BSA_TIME_RUNS"
WARMUP_ENV = "BSA_TIME_WARMUP"

TIME_PREFIX = "bsa-time-us: "
CHIP_PREFIX = "bsa-chip: "
GUARD_ZONES_PREFIX = "bsa-guard-zones: "
GUARD_WRITE_PREFIX = "bsa-guard-write: "

#: Bytes of a child's stdout log read for these lines (a timed run prints one short line per call).
LOG_MAX_BYTES = 1 << 20

#: The operator calls a device times apart (a chain times both).
STEPS = ("forward", "backward")

#: Tukey's fences: a time further than this many interquartile ranges outside the quartiles is an outlier and
#: left out of the median and spread (ascend-forge drops outliers by IQR the same way).
FENCE_IQR = 1.5

#: Most timed calls a run may ask for (the C++ harness refuses more).
MAX_RUNS = 100000

#: What the times measure, as run.json says it.
METHOD = (
    "device events recorded on the stream around the operator's second phase (the kernel launch), one pair per "
    "timed call; the first phase, workspace allocation, copies and filling the outputs are not timed"
)


@dataclass(frozen=True)
class Timing:
    """How `bsa run --time` times each case: `warmup` untimed calls, then `runs` timed ones."""

    runs: int = 20
    warmup: int = 3

    def env(self) -> dict[str, str]:
        """Return the variables that ask a device child for these timed calls."""
        return {RUNS_ENV: str(self.runs), WARMUP_ENV: str(self.warmup)}


def read_lines(text: str) -> tuple[dict[str, list[float]], dict[str, Any] | None]:
    """Return the times per step and the guard-zone record a child's stdout holds (None: no guard zones).

    Lines that do not parse (a step not in `STEPS`, a time that is not a finite non-negative number) are
    ignored: a device that prints none is not timed."""
    times: dict[str, list[float]] = {}
    guards: dict[str, Any] | None = None
    writes: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith(TIME_PREFIX):
            parts = line[len(TIME_PREFIX) :].split()
            value = _number(parts[1]) if len(parts) == 2 and parts[0] in STEPS else None
            if value is not None and value >= 0:
                times.setdefault(parts[0], []).append(value)
        elif line.startswith(GUARD_ZONES_PREFIX):
            size = _integer(line[len(GUARD_ZONES_PREFIX) :].strip())
            if size is not None and size > 0:
                guards = {"bytes": size}
        elif line.startswith(GUARD_WRITE_PREFIX):
            parts = line[len(GUARD_WRITE_PREFIX) :].split()
            numbers = [_integer(p) for p in parts[1:]] if len(parts) == 3 else []
            if len(numbers) == 2 and None not in numbers and parts[0].isidentifier() and len(parts[0]) <= 16:
                writes.append({"tensor": parts[0], "offset": numbers[0], "elements": numbers[1]})
    if guards is not None:
        guards["writes"] = writes[:20]
    return times, guards


def read_chip(text: str) -> str | None:
    """Return the chip a child's stdout names (its first `bsa-chip:` line: a SoC name of letters, digits and
    `_`, at most 32 characters), or None."""
    for line in text.splitlines():
        if line.startswith(CHIP_PREFIX):
            name = line[len(CHIP_PREFIX) :].strip()
            return name if name.isidentifier() and len(name) <= 32 else None
    return None


def summarize(times: list[float]) -> dict[str, Any]:
    """Return one step's record: every time, the median and spread (interquartile range) of those inside
    Tukey's fences (`FENCE_IQR`), and how many were left out."""
    low, high = _quartiles(times)
    fence = FENCE_IQR * (high - low)
    kept = [t for t in times if low - fence <= t <= high + fence]
    kept_low, kept_high = _quartiles(kept)
    return {
        "times_us": [round(t, 3) for t in times],
        "median_us": round(_median(kept), 3),
        "spread_us": round(kept_high - kept_low, 3),
        "min_us": round(min(kept), 3),
        "max_us": round(max(kept), 3),
        "kept": len(kept),
        "outliers_dropped": len(times) - len(kept),
    }


def record(
    timing: Timing, times: Mapping[str, list[float]] | None, not_timed: str | None, chip: str | None = None
) -> dict[str, Any]:
    """Return run.json's `timing`: how the times were taken, the chip they ran on (None: the device did not
    say) and each step's summary; `not_timed` says why there are none (the reference device, a binary that
    printed no time lines)."""
    steps = {step: summarize(list(times[step])) for step in STEPS if times and times.get(step)}
    why = not_timed if not steps else None
    if not steps and why is None:
        why = f"the device printed no `{TIME_PREFIX.strip()}` lines: it was not timed"
    return {
        "method": METHOD if steps else None,
        "warmup": timing.warmup,
        "runs": timing.runs,
        "chip": chip if steps else None,
        "steps": steps,
        "not_timed": why,
    }


def _quartiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return _at(ordered, 0.25), _at(ordered, 0.75)


def _median(values: list[float]) -> float:
    return _at(sorted(values), 0.5)


def _at(ordered: list[float], fraction: float) -> float:
    """Return the linear-interpolated quantile of sorted values (NumPy's default method)."""
    position = fraction * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None

"""--repeat: whether a case's runs agree, and whether each run passes the case's standard.

dQ rows have one owner in the kernel, so dQ must be bitwise identical run to run; dK and dV are summed with
fp32 atomic adds, so their last bits may move (noise: reported, not failed, unless the run asked for the
operator's deterministic mode). The forward's out and lse have one owner per row too: bitwise identical in
every op folder that has them (forward, chain, autograd), except an lse the forward never writes
(softmax_lse_flag 0: whatever the buffer held, not judged). Every repeat is also judged as `bsa compare`
would judge it, so a race that moves the outputs far enough fails the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.case import numpy_dtype
from ..store.manifest import Manifest
from .base import Attempt

#: Judges one run's outputs (the case folder, the run's folder) by the case's standard, as `bsa compare`
#: would: None when they pass, else (verdict, why). The caller passes it (`RunOptions.judge`): judging is a
#: layer above the devices.
RunJudge = Callable[[Path, Path], "tuple[str, str] | None"]

#: Outputs the kernel sums with fp32 atomic adds: not bitwise reproducible run to run (docs/operator.md section 2).
ATOMIC_OUTPUTS = ("dk", "dv")


def differing_elements(first: Path, other: Path, dtype_name: str) -> tuple[int, int, int] | None:
    """Return (elements that differ, elements, largest difference in ULPs) of two output files, or None.

    ULPs count the representable values between the two (across zero too: a near-zero sum whose sign
    flips counts every value between -x and x).
    """
    a, b = first.read_bytes(), other.read_bytes()
    itemsize = numpy_dtype(dtype_name).itemsize
    if len(a) != len(b) or len(a) % itemsize:
        return None
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    x, y = np.frombuffer(a, dtype=view), np.frombuffer(b, dtype=view)
    differ = x != y
    count = int(np.count_nonzero(differ))
    if not count:
        return 0, int(x.size), 0
    return count, int(x.size), max_ulp(x[differ], y[differ], itemsize)


def noise(differences: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Summarize run-to-run differences per output: runs that differed, most elements, most ULPs (an output
    the operator never writes, `unwritten`, is not noise: its differences stay in `differences` only)."""
    noise: dict[str, dict[str, int]] = {}
    for diff in differences:
        if "elements" not in diff or diff.get("unwritten"):
            continue
        entry = noise.setdefault(diff["output"], {"runs": 0, "elements": 0, "total": diff["total"], "max_ulp": 0})
        entry["runs"] += 1
        entry["elements"] = max(entry["elements"], diff["elements"])
        entry["max_ulp"] = max(entry["max_ulp"], diff["max_ulp"])
    return noise


def max_ulp(x: np.ndarray, y: np.ndarray, itemsize: int) -> int:
    """Return the largest ULP distance between bit patterns of floats (sign-magnitude mapped to a line)."""
    bits = itemsize * 8
    sign = np.uint64(1) << np.uint64(bits - 1)

    def ordinal(v: np.ndarray) -> np.ndarray:
        u = v.astype(np.uint64)
        magnitude = (u & (sign - np.uint64(1))).astype(np.int64)
        return np.where((u & sign) != 0, -magnitude, magnitude)

    return int(np.abs(ordinal(x) - ordinal(y)).max())


def differences(manifest: Manifest, first: Attempt, other: Attempt, deterministic: bool) -> list[dict[str, Any]]:
    """Compare a repeat with run 1: the status, and each output element by element.

    dQ (and the forward's out and lse) rows have one owner in the kernel, so they must be bitwise identical;
    dK and dV are summed with fp32 atomic adds, so their last bits may move from run to run (noise,
    reported, not a failure). A differing status, dQ, out or lse (or an output that vanished) is a race that
    matters (`matters`); in deterministic mode every output must be bitwise identical, dK and dV too. An
    lse the forward never writes (softmax_lse_flag 0) may differ (a device's uninitialised memory): reported,
    never a race.
    """
    diffs: list[dict[str, Any]] = []
    # the outputs the operator leaves unwritten: lse with softmax_lse_flag 0
    unwritten = ("lse",) if manifest.op.calls_forward and manifest.forward_params["softmax_lse_flag"] == 0 else ()
    every = "all" if manifest.op.calls_forward else "all three"
    if first.status != other.status:
        message = f"status differs: run 1 {first.status}, run {other.index} {other.status}"
        diffs.append({"run": other.index, "output": "status", "matters": True, "message": message})
    for name, entry in manifest.entries("outputs"):
        a, b = first.outputs.get(name), other.outputs.get(name)
        if (a or {}).get("sha256") == (b or {}).get("sha256"):
            continue
        matters = (name not in ATOMIC_OUTPUTS or deterministic) and name not in unwritten
        diff: dict[str, Any] = {"run": other.index, "output": name, "matters": matters}
        if name in unwritten:
            diff["unwritten"] = True
        counted = None
        if a and b:
            counted = differing_elements(first.staging / entry["file"], other.staging / entry["file"], entry["dtype"])
        if counted is None and name not in unwritten:
            diff["matters"] = True
            diff["message"] = f"{name} not bitwise identical: run {other.index} differs from run 1"
        elif counted is None:
            diff["message"] = f"{name} differs: run {other.index} from run 1 (never written: softmax_lse_flag 0)"
        else:
            diff["elements"], diff["total"], diff["max_ulp"] = counted
            what = (
                "never written with softmax_lse_flag 0: not judged"
                if name in unwritten
                else f"deterministic mode asks {every} outputs bitwise identical"
                if deterministic and name in ATOMIC_OUTPUTS
                else "a race: its rows have one owner"
                if diff["matters"]
                else "fp32 atomic-add noise"
            )
            diff["message"] = (
                f"{name} not bitwise identical: run {other.index} differs from run 1 in {counted[0]} of "
                f"{counted[1]} elements, by at most {counted[2]} ULP ({what})"
            )
        diffs.append(diff)
    return diffs


def judge_repeat(case_dir: Path, manifest: Manifest, attempt: Attempt, judge: RunJudge | None) -> list[dict[str, Any]]:
    """Judge one run's outputs by the case's own standard (`judge`; None: not judged); a failure is a race."""
    if judge is None or attempt.status != 0 or manifest.is_negative or not manifest.has_golden:
        return []
    failed = judge(case_dir, attempt.staging)
    if failed is None:
        return []
    verdict, why = failed
    message = f"run {attempt.index} is {verdict} by the standard: {why}"
    return [{"run": attempt.index, "output": "verdict", "verdict": verdict, "matters": True, "message": message}]

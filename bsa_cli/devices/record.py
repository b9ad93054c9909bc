"""run.json: `bsa run`'s record of running one case (docs/run.md, "run.json"), and what a run left: its
status and output files, checked and hashed.

The record is written last, atomically, once the case is done: an interrupted case never leaves gradients
without a record. `bsa compare` reads it back (`compare.case_files`).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..core.errors import DataError, show
from ..core.untrusted import inside, parse_status, read_regular
from ..store import expected_nbytes, sha256_file
from ..store.manifest import Manifest
from . import timing
from .base import STATUS_FILE, Attempt, Device, Outcome
from .repeat import noise

if TYPE_CHECKING:
    from .run import _CaseRun

RUN_FORMAT = "bsa-run/1"
RUN_RECORD = "run.json"

#: Bytes of status.txt read (its status line and message).
STATUS_MAX_BYTES = 64 << 10


def now() -> str:
    """Return the time now, as records write it (UTC, milliseconds)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def read_status(staging: Path, attempt: Attempt) -> None:
    path = staging / STATUS_FILE
    if not path.exists():
        attempt.problems.append(f"no {STATUS_FILE}: the binary must write the aclnn status there")
        return
    try:
        text = read_regular(path, STATUS_MAX_BYTES, truncate=True).decode("utf-8", errors="replace")
    except DataError as exc:
        attempt.problems.append(f"{STATUS_FILE}: {exc.message}")
        return
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    try:
        attempt.status = parse_status(first)
    except ValueError:
        attempt.problems.append(f"{STATUS_FILE}: first line {show(first)} is not a decimal aclnn status")
        return
    attempt.status_message = "\n".join(lines[1:]).strip() or None


def check_outputs(staging: Path, manifest: Manifest, attempt: Attempt) -> None:
    """Record size and sha256 of each output of the op folder (the backward's dq, dk, dv; the forward's out,
    lse; the chain's five); note missing or wrong-size ones when the status is 0. With another status,
    whatever the device left is recorded, and nothing is missing (a chain whose backward refused the
    forward's outputs may leave out and lse)."""
    for name, entry in manifest.entries("outputs"):
        try:
            path = inside(staging, entry["file"])
        except DataError as exc:
            attempt.problems.append(str(exc))
            continue
        expected, shape = expected_nbytes(entry), f"shape {list(entry['shape'])} {entry['dtype']}"
        if not path.is_file() or path.is_symlink():
            if attempt.status == 0:
                kind = "missing" if not (path.exists() or path.is_symlink()) else "not a regular file"
                attempt.problems.append(f"{entry['file']} {kind} (status 0 promises {expected} bytes, {shape})")
            continue
        size = path.stat().st_size
        digest = sha256_file(path) if size == expected else None  # an oversized file is not read
        attempt.outputs[name] = {"file": entry["file"], "bytes": size, "sha256": digest}
        if size != expected and attempt.status == 0:
            kind = "truncated" if size < expected else "oversized"
            attempt.problems.append(f"{entry['file']} {kind}: {size} bytes, expected {expected} ({shape})")


RUN_KEYS: tuple[str, ...] = ("started", "finished", "duration_s", "exit_code", "signal", "timed_out", "outcome")
#: The fields of an `Attempt` that run.json's `runs` entries hold after `run`, `command` and `output_dir`, in order.
RUN_KEYS += ("status", "status_message", "outputs", "stdout_log", "stderr_log", "problems", "order_seed")


def run_entry(attempt: Attempt) -> dict[str, Any]:
    """Return the entry of one run in run.json's `runs`."""
    entry = {"run": attempt.index, "command": attempt.argv, "output_dir": str(attempt.staging)}
    entry.update((key, getattr(attempt, key)) for key in RUN_KEYS)
    entry["duration_s"] = round(attempt.duration_s, 4)  # keeps its place among the keys
    return entry


def case_record(
    run: _CaseRun,
    manifest: Manifest | None,
    outcome: Outcome,
    problems: list[str],
    started: str,
    duration: float,
    skipped: str | None = None,
) -> dict[str, Any]:
    """Return the run.json of a case `run` ran (its attempts and differences), without `inputs`, which the
    caller adds.

    `skipped` is why a case was not run (outcome "skipped"); `device.prefilled_outputs` appears only when
    the device pre-filled its output buffers (the reference device's forward: "nan")."""
    attempts, differences, options = run.attempts, run.differences, run.options
    output_dir, device_id = run.output_dir, run.device_id
    first = attempts[0] if attempts else None
    device: Device = options.device
    expect = None if manifest is None else {"status": manifest.expect_status, "name": manifest.expect_name}
    runs = [run_entry(a) for a in attempts]
    if runs:
        runs[0]["output_dir"] = str(output_dir)  # its files were moved up there
    env = options.env(device_id)
    device_record = {"name": device.name, "kind": device.kind, "id": device_id, "fault": device.fault}
    device_record["fault_not_applied"] = first.fault_not_applied if first else None
    if first and first.prefilled_outputs:
        device_record["prefilled_outputs"] = first.prefilled_outputs
    extra: dict[str, Any] = {}  # what only some runs record: the guard zones kept, the times of a timed run
    if first and first.guards is not None:
        extra["guards"] = first.guards
    if options.timing is not None and outcome != "skipped":
        chip = first.chip if first else None
        extra["timing"] = timing.record(options.timing, first.times if first else None, device.untimed, chip)
    return {
        "format": RUN_FORMAT,
        "tool": {"name": "bsa", "version": __version__},
        "case": run.name,
        "case_dir": str(run.case_dir),
        "output_dir": str(output_dir),
        "device": device_record,
        "binary": device.binary_record,
        "command": first.argv if first else None,
        "env": env,
        "timeout_s": device.time_limit(options.timeout),
        "started": started,
        "finished": now(),
        "duration_s": round(duration, 4),
        "outcome": outcome,
        **({"skipped": skipped} if outcome == "skipped" else {}),
        "problems": problems,
        **{key: getattr(first, key, None) for key in ("exit_code", "signal", "status", "status_message")},
        "expect": expect,
        "outputs": first.outputs if first else {},
        **{key: getattr(first, key, None) for key in ("stdout_log", "stderr_log")},
        "deterministic": options.deterministic,
        "device_software": device.software(output_dir / first.stdout_log if first else None, env),
        "repeat": {
            "count": options.repeat,
            "completed": sum(a.outcome == "ok" for a in attempts),
            "identical": not differences,
            "differences": [{k: v for k, v in d.items() if k != "message"} for d in differences],
            "noise": noise(differences),
            "seed": options.seed if device.seeded else None,
        },
        "runs": runs,
        **extra,
    }

"""Cost estimates for cases, and balanced shards of a suite for CI matrices.

Costs come from the exact FLOP count of a case's selected blocks (DOMAIN.md section 6) and the byte size
of its arrays; the time rate is a conservative figure for the 2-core development machine, measured with
`benchmarks/golden_speed.py`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from .case import Case, numpy_dtype
from .inputs import make_mask, mask_stats
from .workers import cpu_count

GOLDEN_FLOPS_PER_SECOND = 40e9
"""Effective rate of `bsa gen` (forward, golden and benchmark backward) on the 2-core development machine."""

SHARD_RE = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True)
class Estimate:
    """What generating one case costs: FLOPs, bytes on disk, peak memory and seconds."""

    flops: int
    density: float
    input_bytes: int
    output_bytes: int
    peak_memory: int
    seconds: float


def estimate(case: Case) -> Estimate:
    """Estimate the cost of generating `case` (its mask is drawn: cheap next to the golden)."""
    stats = mask_stats(case, make_mask(case))
    itemsize = numpy_dtype(case.dtype).itemsize if case.dtype in ("float16", "bfloat16") else 4
    q_elems = int(np.prod(case.q_shape))
    kv_elems = int(np.prod(case.kv_shape))
    mask_bytes = int(np.prod(case.mask_shape))
    input_bytes = (3 * q_elems + 2 * kv_elems) * itemsize + (q_elems // max(case.head_dim, 1)) * 4 + mask_bytes
    grad_elems = q_elems + 2 * kv_elems
    output_bytes = grad_elems * (4 + itemsize)  # golden float32 and benchmark in the case dtype
    # Working set: float64 forward copies of q, k, v, out, the float32 backward's upcast inputs and its
    # accumulators, plus one query-block row of scores (X by selected columns) per head at a time.
    working = 8 * (2 * q_elems + 2 * kv_elems) + 4 * (3 * q_elems + 2 * kv_elems) + 4 * grad_elems
    x, y = case.mask_block_shape
    row_scores = 8 * x * case.kv_seq_len * 4
    flops = int(stats["flops_forward"] + stats["flops_backward"])
    return Estimate(
        flops=flops,
        density=float(stats["density"]),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        peak_memory=input_bytes + output_bytes + working + row_scores,
        seconds=flops * 1.4 / GOLDEN_FLOPS_PER_SECOND,  # the benchmark backward repeats the golden's work
    )


AUTO_JOBS_MIN_SECONDS = 3.0
"""Estimated work from which `-j auto` starts worker processes for several cases (each takes about half a
second to start)."""

AUTO_THREADS_MIN_SECONDS = 0.2
"""Estimated work of a single case from which `-j auto` runs its walks in threads (they start at once)."""


def auto_jobs(jobs: int | None, estimates: list[Estimate]) -> int:
    """Return `jobs` if given, else one process (or, for a single case, thread) per CPU for work estimated at
    `AUTO_JOBS_MIN_SECONDS` (a single case: `AUTO_THREADS_MIN_SECONDS`) or more, else 1."""
    if jobs is not None:
        return jobs
    least = AUTO_THREADS_MIN_SECONDS if len(estimates) == 1 else AUTO_JOBS_MIN_SECONDS
    if sum(e.seconds for e in estimates) < least:
        return 1
    return cpu_count()


def machine_memory() -> int:
    """Return the memory this process may use in bytes: the physical memory, or a smaller cgroup (container)
    limit; 0 when it cannot be told."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 0
    limit = _cgroup_value("memory.max")
    return min(physical, limit) if physical and limit else physical or limit


def available_memory() -> int:
    """Return the memory available to new work now (MemAvailable, within a cgroup limit), else
    `machine_memory()`; 0 if unknown."""
    available = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _cgroup_value("memory.max"), _cgroup_value("memory.current")
    if limit:
        available = min(available, limit - used) if available else limit - used
    return max(available, 0) or machine_memory()


def _cgroup_value(name: str) -> int:
    """Return a number from this process's cgroup v2 memory controller (0 if absent or "max")."""
    try:
        with open("/proc/self/cgroup") as groups:
            path = next((line.split(":", 2)[2].strip() for line in groups if line.startswith("0::")), "/")
        with open(f"/sys/fs/cgroup{path.rstrip('/')}/{name}") as value:
            text = value.read().strip()
        return int(text) if text.isdigit() else 0
    except (OSError, ValueError, IndexError):
        return 0


def parse_shard(text: str) -> tuple[int, int]:
    """Parse `I/N` (1-based shard I of N) or raise ValueError saying what is allowed."""
    match = SHARD_RE.match(text.strip())
    if not match:
        raise ValueError(f"--shard {text!r} is not I/N (for example 2/4)")
    index, count = int(match[1]), int(match[2])
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def shard(cases: list[Case], index: int, count: int, costs: list[float] | None = None) -> list[Case]:
    """Return shard `index` (1-based) of `count`: a deterministic share balanced by cost.

    Cases go, largest first (ties by name), to the shard with the least cost so far (ties to the lowest
    shard), so every case lands in exactly one shard whatever the order of the suite. The share keeps the
    suite's order.
    """
    if costs is None:
        costs = [float(estimate(c).flops) for c in cases]
    order = sorted(range(len(cases)), key=lambda i: (-costs[i], cases[i].name))
    loads = [0.0] * count
    owner = [0] * len(cases)
    for i in order:
        target = min(range(count), key=lambda s: (loads[s], s))
        owner[i] = target
        loads[target] += costs[i] + 1.0  # +1: cases of no cost (negative) still spread out
    return [c for i, c in enumerate(cases) if owner[i] == index - 1]

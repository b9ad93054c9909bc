"""Cost estimates for cases, and balanced shards of a suite for CI matrices.

Costs come from the exact FLOP count of a case's selected blocks (docs/operator.md section 6) and the byte size
of its arrays; the time rate is a conservative figure for the 2-core development machine, measured with
`benchmarks/golden_speed.py`.
"""

from __future__ import annotations

import collections
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ..core.case import Case, numpy_dtype
from ..core.workers import cpu_count
from ..inputs import DIAGONAL_PATTERNS, MaskCounts, diagonal_blocks, make_mask, mask_counts

#: Effective rate of `bsa gen` (forward, golden and benchmark backward) on the 2-core development machine.
GOLDEN_FLOPS_PER_SECOND = 40e9

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
    selected_blocks: int = 0  # (query head, query block, kv block) pairs the mask selects


#: Masks up to this many elements are drawn to count what they select; larger ones are counted from
#: their pattern (`pattern_counts`), so estimating never costs memory in proportion to the case.
EXACT_MASK_ELEMENTS = 1 << 22

#: Resident memory of a `bsa gen` process before it holds any case (interpreter, NumPy, bsa).
BASE_MEMORY = 64 << 20

#: Memory per (kv-head group, non-empty batch entry): the views and partial results its walks keep.
GROUP_SPAN_MEMORY = 5 << 10

#: Memory per batch entry (its span, lengths and per-sequence views), held for the whole case.
SPAN_MEMORY = 3 << 10

SECONDS_PER_CASE = 0.02
#: Time per (kv-head group, non-empty batch entry): the set-up of each walk over one sequence.
SECONDS_PER_GROUP_SPAN = 1e-4
#: Time per non-empty batch entry: its views and lengths, whatever its heads.
SECONDS_PER_SPAN = 1e-4
#: Time per (batch entry, query head, query block) row that selects a block: the per-row NumPy calls.
SECONDS_PER_ROW = 1.2e-4
SECONDS_PER_BLOCK = 3e-7
#: Time per selected block: sliced when a row's blocks are consecutive (dense, causal, sliding window),
#: gathered and scattered one by one otherwise (random, strided, explicit).
SECONDS_PER_GATHERED_BLOCK = 2e-6


def estimate(case: Case) -> Estimate:
    """Estimate the cost of generating `case` (time and peak memory on the 2-core development machine).

    Small masks are drawn and counted exactly; large ones are counted from their pattern. Beyond the
    FLOPs, the time counts the Python work per batch entry, per row and per block that dominates cases
    of many heads, many short sequences or tiny blocks; the memory counts the arrays, the per-sequence
    working buffers, and what every kv-head group and batch entry holds.
    """
    mask_elements = math.prod(case.mask_shape)
    counts = mask_counts(case, make_mask(case)) if mask_elements <= EXACT_MASK_ELEMENTS else pattern_counts(case)
    itemsize = numpy_dtype(case.dtype).itemsize if case.dtype in ("float16", "bfloat16") else 4
    q_elems = math.prod(case.q_shape)
    kv_elems = math.prod(case.kv_shape)
    input_bytes = (3 * q_elems + 2 * kv_elems) * itemsize + (q_elems // max(case.head_dim, 1)) * 4 + mask_elements
    grad_elems = q_elems + 2 * kv_elems
    output_bytes = grad_elems * (4 + itemsize)  # golden float32 and benchmark in the case dtype
    density = counts.selected_blocks / counts.total_blocks if counts.total_blocks else 0.0
    spans = sum(count for (q_len, kv_len), count in _distinct_lengths(case) if q_len and kv_len)  # non-empty
    peak_memory = (
        BASE_MEMORY
        + input_bytes
        + output_bytes
        + _working_memory(case, q_elems, kv_elems, itemsize, density)
        + mask_elements * (13 if case.sparsity.pattern == "random" else 5)  # drawn, copied, written, checked
        + 8 * counts.selected_blocks // max(case.num_heads, 1)  # one head's selected block indices
        + GROUP_SPAN_MEMORY * spans * case.num_kv_heads
        + SPAN_MEMORY * case.batch
    )
    flops = 14 * counts.cells * case.head_dim
    consecutive = case.sparsity.pattern in ("dense", "causal", "sliding_window")
    seconds = (
        SECONDS_PER_CASE
        + flops * 1.4 / GOLDEN_FLOPS_PER_SECOND  # the benchmark backward repeats the golden's work
        + SECONDS_PER_GROUP_SPAN * spans * case.num_kv_heads
        + SECONDS_PER_SPAN * spans
        + SECONDS_PER_ROW * counts.active_rows
        + (SECONDS_PER_BLOCK if consecutive else SECONDS_PER_GATHERED_BLOCK) * counts.selected_blocks
    )
    if not case.expect.ok:
        seconds = SECONDS_PER_CASE
    return Estimate(flops, density, input_bytes, output_bytes, int(peak_memory), seconds, int(counts.selected_blocks))


def _working_memory(case: Case, q_elems: int, kv_elems: int, itemsize: int, density: float) -> int:
    """Bytes the golden works in besides inputs and outputs: the float32 upcasts of the largest sequence
    of one group, and one query-block row of scores per head."""
    longest_q = max(_distinct_lengths(case), key=lambda pair: pair[0][0], default=((0, 0), 0))[0][0]
    longest_kv = max(_distinct_lengths(case), key=lambda pair: pair[0][1], default=((0, 0), 0))[0][1]
    span_q = longest_q * case.group_size * case.head_dim
    span_kv = longest_kv * case.head_dim
    x, _ = case.mask_block_shape
    row_scores = 8 * x * case.kv_seq_len * 4 * max(density, 1.0 / max(case.num_kv_blocks, 1))
    return int(4 * (3 * span_q + 2 * span_kv) + row_scores)


def _distinct_lengths(case: Case) -> list[tuple[tuple[int, int], int]]:
    """Return each distinct (q length, kv length) of the batch entries and how many entries have it,
    without building a list of `batch` entries when the lengths are all the same."""
    honored = case.layout == "TND" or case.bnsd_lengths == "honored"
    if case.actual_seq_lengths is None or case.actual_seq_lengths_kv is None or not honored:
        q = case.actual_seq_lengths if honored and case.actual_seq_lengths is not None else None
        kv = case.actual_seq_lengths_kv if honored and case.actual_seq_lengths_kv is not None else None
        if q is None and kv is None:
            return [((case.q_seq_len, case.kv_seq_len), case.batch)]
    q_lengths, kv_lengths = case.q_lengths(), case.kv_lengths()
    for known_q, known_kv, counted in _COUNTED:
        if known_q is q_lengths and known_kv is kv_lengths:
            return counted
    counted = sorted(collections.Counter(zip(q_lengths, kv_lengths, strict=True)).items())
    _COUNTED.append((q_lengths, kv_lengths, counted))
    return counted


#: The last distinct-length counts, by the identity of the length tuples (cases of a matrix share them).
_COUNTED: collections.deque[tuple[tuple[int, ...], tuple[int, ...], list[tuple[tuple[int, int], int]]]] = (
    collections.deque(maxlen=4)
)


def pattern_counts(case: Case) -> MaskCounts:
    """Count what the sparsity pattern selects without drawing the mask (random: the expected counts).

    Block rows are summed in closed form per distinct pair of lengths, so the cost does not grow with the
    mask; partial tail blocks are counted whole, which is close enough for an estimate.
    """
    sparsity = case.sparsity
    x, y = case.mask_block_shape
    heads = case.num_heads
    n_q = case.num_q_blocks
    empty = sparsity.empty_rows
    empty_count = round(empty * n_q) if isinstance(empty, float) else len({r for r in empty if r < n_q})
    kept = 1.0 - (empty_count / n_q if n_q else 0.0)
    explicit_density = 0.0
    if sparsity.pattern == "explicit" and sparsity.explicit is not None:
        explicit_density = float(np.count_nonzero(sparsity.explicit)) / max(sparsity.explicit.size, 1)
    selected = total = cells = rows = 0.0
    for (q_len, kv_len), count in _distinct_lengths(case):
        if not q_len or not kv_len:
            continue
        nq, nk = math.ceil(q_len / x), math.ceil(kv_len / y)
        total += nq * nk * heads * count
        if sparsity.pattern in DIAGONAL_PATTERNS and sparsity.causal_alignment != "top_left":
            blocks, area, active = _diagonal_rows(case, q_len, kv_len)
        elif sparsity.pattern in ("dense", "random", "explicit"):
            share = {"dense": 1.0, "random": sparsity.density, "explicit": explicit_density}[sparsity.pattern]
            blocks, area = share * nq * nk, share * q_len * kv_len
            active = nq * (1.0 - (1.0 - share) ** nk)
        else:
            window = sparsity.window
            blocks = _blocks_up_to_diagonal(nq, nk, 0) - _blocks_up_to_diagonal(nq, nk, window)
            area = x * (_columns(nq, kv_len, y, 0) - _columns(nq, kv_len, y, window))
            active = min(nq, nk + window - 1)
            if sparsity.pattern == "causal":
                blocks = _blocks_up_to_diagonal(nq, nk, 0)
                area = x * _columns(nq, kv_len, y, 0)
                active = nq
            elif sparsity.pattern == "strided":
                left = _blocks_up_to_diagonal(nq, nk, window) / sparsity.stride
                blocks += left
                area += x * y * left
                active = nq if nk >= sparsity.stride else active
            area *= q_len / (x * nq)  # a partial last query block holds fewer rows
        selected += blocks * kept * heads * count
        cells += max(area, 0.0) * kept * heads * count
        rows += active * kept * heads * count
    return MaskCounts(selected_blocks=int(selected), total_blocks=int(total), cells=int(cells), active_rows=int(rows))


#: Query-block rows of one batch entry counted one by one in `_diagonal_rows`; more are sampled evenly.
_SAMPLED_ROWS = 4096


def _diagonal_rows(case: Case, q_len: int, kv_len: int) -> tuple[float, float, float]:
    """Return (selected blocks, query x key cells, active rows) of a diagonal pattern in one batch entry, from
    its per-row diagonals (`inputs.diagonal_blocks`); beyond `_SAMPLED_ROWS` rows, from an even sample."""
    x, y = case.mask_block_shape
    sparsity = case.sparsity
    nq, nk = math.ceil(q_len / x), math.ceil(kv_len / y)
    rows = np.unique(np.linspace(0, nq - 1, min(nq, _SAMPLED_ROWS)).astype(np.int64))
    diagonal = np.minimum(diagonal_blocks(case, q_len, kv_len, rows), nk - 1)
    upto = np.clip(diagonal + 1, 0, nk)  # blocks j <= d
    keys = np.minimum(upto * y, kv_len)
    if sparsity.pattern == "causal":
        blocks, columns = upto, keys
    else:
        left = np.clip(diagonal + 1 - sparsity.window, 0, nk)  # blocks j <= d - window
        blocks, columns = upto - left, keys - np.minimum(left * y, kv_len)
        if sparsity.pattern == "strided":
            extra = left // sparsity.stride
            blocks, columns = blocks + extra, columns + extra * y
    row_tokens = np.minimum(q_len - rows * x, x)
    weight = nq / len(rows)
    return (
        float(blocks.sum()) * weight,
        float((columns * row_tokens).sum()) * weight,
        float(np.count_nonzero(blocks)) * weight,
    )


def _blocks_up_to_diagonal(n_q: int, n_kv: int, shift: int) -> float:
    """Return sum over query blocks i < n_q of min(n_kv, max(0, i + 1 - shift)): kv blocks j <= i - shift."""
    n = max(0, n_q - shift)
    m = min(n, n_kv)
    return m * (m + 1) / 2 + (n - m) * n_kv


def _columns(n_q: int, kv_len: int, y: int, shift: int) -> float:
    """Return sum over query blocks i < n_q of min(kv_len, max(0, i + 1 - shift) * y): the kv tokens of
    blocks j <= i - shift."""
    n = max(0, n_q - shift)
    m = min(n, kv_len // y)
    return y * m * (m + 1) / 2 + (n - m) * kv_len


#: Estimated work from which `-j auto` starts worker processes for several cases (each takes about half a
#: second to start).
AUTO_JOBS_MIN_SECONDS = 3.0

#: Estimated work of a single case from which `-j auto` runs its walks in threads (they start at once).
AUTO_THREADS_MIN_SECONDS = 0.2


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

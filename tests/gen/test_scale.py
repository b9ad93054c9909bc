"""Scale features of `bsa gen`: -j bit-identical to -j 1, balanced shards, memory refusal."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bsa_cli import golden
from bsa_cli.cli import common as cli_common
from bsa_cli.cli import gen as cli_gen
from bsa_cli.cli import main
from bsa_cli.core.case import Case
from bsa_cli.gen import generate, schedule
from bsa_cli.gen.generate import compute_case
from bsa_cli.gen.schedule import estimate, parse_shard, shard
from bsa_cli.gen.settings import GenSettings
from bsa_cli.specs import load_specs
from tests.helpers import REPO

CASES = [
    {
        "name": "mha",
        "num_heads": 2,
        "q_seq_len": 160,
        "head_dim": 32,
        "block_shape": [32, 32],
        "sparsity": {"pattern": "random", "density": 0.5},
    },
    {
        "name": "gqa",
        "num_heads": 4,
        "num_kv_heads": 2,
        "q_seq_len": 200,
        "head_dim": 32,
        "block_shape": [64, 48],
        "dtype": "bf16",
        "sparsity": {"pattern": "causal"},
    },
    {
        "name": "tnd",
        "layout": "TND",
        "num_heads": 4,
        "num_kv_heads": 4,
        "head_dim": 32,
        "block_shape": [32, 32],
        "actual_seq_lengths": [0, 90, 33],
        "sparsity": {"pattern": "random", "density": 0.7},
    },
]


def spec(tmp_path: Path, cases: list[dict]) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"cases": cases}))
    return str(path)


def hashes(case_dir: Path) -> dict[str, str]:
    manifest = json.loads((case_dir / "case.json").read_text())
    return {
        f"{section}/{name}": entry["sha256"]
        for section in ("inputs", "golden", "benchmark")
        for name, entry in manifest[section].items()
    }


@pytest.mark.parametrize(
    "which", [["mha", "gqa", "tnd"], ["gqa"], ["tnd"]], ids=["across-cases", "heads-gqa", "heads-tnd"]
)
def test_parallel_gen_is_bit_identical_to_one_process(tmp_path: Path, which: list[str]) -> None:
    path = spec(tmp_path, [c for c in CASES if c["name"] in which])
    runner = CliRunner()
    assert runner.invoke(main, ["gen", path, "-o", str(tmp_path / "one")]).exit_code == 0
    result = runner.invoke(main, ["gen", path, "-o", str(tmp_path / "many"), "-j", "2"])
    assert result.exit_code == 0, result.output
    for name in which:
        assert hashes(tmp_path / "one" / name) == hashes(tmp_path / "many" / name), name


def test_shards_cover_the_suite_exactly_once_and_balance_flops() -> None:
    cases = load_specs([REPO / "cases" / "edge.yaml", REPO / "cases" / "negative.yaml"])
    costs = [float(estimate(c).flops) for c in cases]
    shards = [shard(cases, i, 3, costs) for i in (1, 2, 3)]
    names = [c.name for s in shards for c in s]
    assert sorted(names) == sorted(c.name for c in cases)
    loads = [sum(estimate(c).flops for c in s) for s in shards]
    assert max(loads) - min(loads) <= max(costs)  # greedy largest-first bound
    reversed_shards = [shard(cases[::-1], i, 3) for i in (1, 2, 3)]
    assert [{c.name for c in s} for s in reversed_shards] == [{c.name for c in s} for s in shards]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shard_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


def test_gen_refuses_a_case_bigger_than_memory_unless_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_common, "machine_memory", lambda: 1000)
    path = spec(tmp_path, CASES[:1])
    result = CliRunner().invoke(main, ["gen", path, "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "case 'mha' needs about" in result.stderr and "--force" in result.stderr
    assert not (tmp_path / "o").exists()
    assert CliRunner().invoke(main, ["gen", path, "-o", str(tmp_path / "o"), "--force"]).exit_code == 0


def test_list_and_gen_take_a_shard(tmp_path: Path) -> None:
    path = spec(tmp_path, CASES)
    listed = [CliRunner().invoke(main, ["list", path, "--shard", f"{i}/2"]).stdout for i in (1, 2)]
    for case in CASES:
        assert sum(case["name"] in text for text in listed) == 1


def test_estimate_grows_with_the_sequence_not_its_square() -> None:
    (case,) = load_specs([REPO / "cases" / "nightly.yaml"])[4:5]  # strided 32k, one head
    small = dataclasses.replace(case, q_seq_len=case.q_seq_len // 4, kv_seq_len=case.kv_seq_len // 4)
    assert estimate(case).peak_memory < 5 * estimate(small).peak_memory


def test_progress_within_a_case_rises_row_by_row_to_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (case,) = load_specs([spec(tmp_path, CASES[1:2])])  # gqa: 2 kv-head groups
    seen: list[float] = []
    compute_case(case, GenSettings(on_progress=lambda _case, fraction: seen.append(fraction)))
    assert len(seen) > 4 and seen == sorted(seen) and seen[-1] == 1.0  # one step per block row
    in_threads: list[float] = []
    monkeypatch.setattr(golden.compute, "_THREADS_MIN_ROW_FLOPS", 0)  # these rows are too small for threads
    compute_case(case, GenSettings(jobs=2, on_progress=lambda _case, fraction: in_threads.append(fraction)))
    # every row of both walks (on one thread the golden and benchmark share a walk, a row counting for both)
    assert len(in_threads) == 2 * len(seen) and in_threads == sorted(in_threads) and in_threads[-1] == 1.0


def test_parallel_cases_stay_within_the_memory_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cases run side by side only while their estimated peaks fit the budget; one too big runs alone."""
    cases = load_specs([spec(tmp_path, CASES)])
    peaks = {c.name: estimate(c).peak_memory for c in cases}
    running: list[str] = []
    overlaps: list[set[str]] = []
    lock = threading.Lock()

    started: list[str] = []

    def fake_generate(case: Case, out_root: Path, settings: GenSettings) -> list[Path]:
        with lock:
            started.append(case.name)
            running.append(case.name)
            overlaps.append(set(running))
        time.sleep(0.2)
        with lock:
            running.remove(case.name)
        return [Path(out_root) / case.name]  # generate_case_ops: the case's folders

    @contextlib.contextmanager
    def threads(jobs: int, **start: object) -> Iterator[ThreadPoolExecutor]:
        with ThreadPoolExecutor(jobs) as pool:
            yield pool

    monkeypatch.setattr(generate, "generate_case_ops", fake_generate)
    monkeypatch.setattr(generate, "worker_pool", threads)
    done: list[str] = []
    budget = sorted(peaks.values())[-1] + sorted(peaks.values())[0]  # the largest fits only with the smallest
    generate.generate_suite(
        cases, tmp_path, GenSettings(jobs=3), memory_budget=budget, on_done=lambda c, o, p: done.append(c.name)
    )
    assert sorted(done) == sorted(peaks)
    assert started[0] == max(peaks, key=lambda n: peaks[n])  # largest first
    assert all(sum(peaks[n] for n in group) <= budget for group in overlaps)
    assert max(len(group) for group in overlaps) == 2
    overlaps.clear()
    # nothing fits: one at a time, all run
    generate.generate_suite(cases, tmp_path, GenSettings(jobs=3), memory_budget=1)
    assert max(len(group) for group in overlaps) == 1 and len(overlaps) == 3


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_job_counts_are_refused(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(main, ["gen", spec(tmp_path, CASES[:1]), "-o", str(tmp_path / "o"), "-j", value])
    assert result.exit_code == 2 and f"{value!r} is not a positive whole number or 'auto'" in result.stderr


def test_auto_jobs_start_processes_for_seconds_of_work_and_threads_for_a_fraction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedule, "cpu_count", lambda: 8)

    def work(seconds: float) -> schedule.Estimate:
        return schedule.Estimate(flops=1, density=1.0, input_bytes=0, output_bytes=0, peak_memory=0, seconds=seconds)

    assert schedule.auto_jobs(None, [work(0.5)] * 2) == 1  # processes for a second of work: not worth starting
    assert schedule.auto_jobs(None, [work(0.5)] * 10) == 8
    assert schedule.auto_jobs(None, [work(0.5)]) == 8  # one case: threads, which start at once
    assert schedule.auto_jobs(None, [work(0.05)]) == 1
    assert schedule.auto_jobs(3, [work(0.5)] * 2) == 3


def test_a_container_memory_limit_bounds_the_memory_estimates(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"memory.max": 2 << 30, "memory.current": 1 << 30}
    monkeypatch.setattr(schedule, "_cgroup_value", lambda name: values[name])
    assert schedule.machine_memory() == 2 << 30  # the limit, below this machine's physical memory
    assert schedule.available_memory() <= 1 << 30  # the limit less what the container uses
    values.update({"memory.max": 0, "memory.current": 0})  # no limit ("max")
    assert schedule.machine_memory() > 0 and schedule.available_memory() > 0


def test_ctrl_c_ends_any_command_with_130_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_gen, "generate_suite", interrupted)
    result = CliRunner().invoke(main, ["gen", spec(tmp_path, CASES[:1]), "-o", str(tmp_path / "o")])
    assert result.exit_code == 130
    last = result.stderr.splitlines()[-1:]
    assert last == ["interrupted: finished work is complete, unfinished work was not written"]
    assert "Traceback" not in result.stderr


def test_cases_in_worker_processes_report_progress_before_they_end(tmp_path: Path) -> None:
    big = [
        dict(CASES[0], name=f"big{i}", q_seq_len=4096, head_dim=128, block_shape=[128, 128], seed=i) for i in range(2)
    ]
    cases = load_specs([spec(tmp_path, big)])
    events: list[tuple[str, str, float]] = []
    generate.generate_suite(
        cases,
        tmp_path / "o",
        GenSettings(jobs=2, on_progress=lambda case, fraction: events.append(("progress", case.name, fraction))),
        on_done=lambda case, outcome, path: events.append(("done", case.name, 1.0)),
    )
    for name in ("big0", "big1"):
        mine = [(kind, fraction) for kind, case, fraction in events if case == name]
        assert mine[-1] == ("done", 1.0) and [k for k, _ in mine].count("done") == 1  # nothing after the end
        fractions = [f for k, f in mine if k == "progress"]
        assert fractions == sorted(fractions) and all(0 < f <= 1 for f in fractions)
    assert any(kind == "progress" for kind, _, _ in events)

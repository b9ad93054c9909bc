"""How close `bsa list`'s `ref s` is to the reference device's measured time, case by case.

    python benchmarks/reference_estimate.py OUT [OUT ...]     # folders written by `bsa gen`
    python benchmarks/reference_estimate.py --beside-busy OUT  # the same beside one busy loop (item 4)

Runs the reference device (what `bsa run` runs without a binary) once on every valid case under OUT, in this
process, and prints per case the estimate (`reference.estimate_seconds` of `bsa list`), the measured wall
time, the CPU time (user + system, all threads) and their ratios, with the load average before and after:
on a shared machine the wall time grows with the other processes, the CPU time much less. Keep it cheap:
cases of a few seconds to a minute (`bsa gen` a few of them, of different sizes, GQA and TND). With
`--beside-busy`, a second process spins on one core for the whole measurement: the reference device
should take at most 2.5x its quiet time there (its BLAS calls run on one thread, so nothing of it spins).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bsa_cli import store
from bsa_cli.devices import reference

ROUNDS = int(os.environ.get("BSA_ROUNDS", "3"))
"""Runs per case; each figure keeps its best (the least disturbed by other processes)."""


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(roots: list[str]) -> None:
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; CPUs {os.cpu_count()}")
    print(
        f"{'case':<28} {'pairs':>6} {'GFLOP bwd':>9} {'est s':>7} {'wall s':>7} {'cpu s':>7} {'est/wall':>8} "
        f"{'est/cpu':>7}"
    )
    for case_dir in store.select_cases([Path(r) for r in roots]):
        manifest = store.load_manifest(case_dir)
        if (manifest.get("expect") or {}).get("status", 0) != 0:
            continue
        stats = manifest["stats"]
        params = manifest["params"]
        group = params["num_heads"] // max(params["num_kv_heads"], 1)
        guess = reference.estimate_seconds(stats["flops_backward"], stats["selected_blocks"], group)  # bsa list's
        walls, cpus = [], []
        for round_ in range(ROUNDS):
            with tempfile.TemporaryDirectory() as out:
                wall, cpu = time.perf_counter(), cpu_seconds()
                reference.emulate_case_dir(case_dir, Path(out), order_seed=round_)
                walls.append(time.perf_counter() - wall)
                cpus.append(cpu_seconds() - cpu)
        wall, cpu = min(walls), min(cpus)  # the best round: the machine is shared
        print(
            f"{case_dir.name:<28} {stats['selected_blocks']:>6} {stats['flops_backward'] / 1e9:>9.3g} {guess:>7.3g} "
            f"{wall:>7.3g} {cpu:>7.3g} {guess / wall:>8.2f} {guess / cpu:>7.2f}"
        )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    busy = None
    if arguments[:1] == ["--beside-busy"]:
        arguments = arguments[1:]
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print(f"beside one busy loop (pid {busy.pid})")
    try:
        main(arguments or ["out"])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()

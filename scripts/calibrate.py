"""Measure how close clean reference-device outputs come to each check's limit, over many seeds.

Usage: python scripts/calibrate.py [--seeds N] [--spec cases/edge.yaml]

Every case of the spec is generated with each seed, run on the reference device with that seed as its
run seed (dK/dV partials summed in another order each time, as a device's atomic adds do) and judged
under the default standard. Prints, per check, the largest value seen as a fraction of its limit, and
for the bias check the largest z scores against the benchmark and against zero, and the largest
|bias| / bias_floor: the figures docs/compare.md ("Calibration") quotes.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from bsa_cli import compare, standards
from bsa_cli.devices import reference
from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--spec", default=str(Path(__file__).parent.parent / "cases" / "edge.yaml"))
    args = parser.parse_args()
    cases = load_specs([Path(args.spec)])
    worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    bias_worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    failures, judged, tensors, over = [], 0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for case in cases:
                case = dataclasses.replace(case, seed=seed, name=f"{case.name}.s{seed}")
                case_dir = generate_case(case, Path(tmp))
                reference.emulate_case_dir(case_dir, case_dir / "outputs", order_seed=seed)
                result = compare.compare_case(case_dir)
                judged += 1
                if result.verdict != compare.PASS:
                    failures.append(f"{result.name}: {result.message}")
                for check in result.all_checks:
                    if check.limit and check.limit > 0 and check.name != "status":
                        fraction = check.value / check.limit
                        if fraction > worst[check.name][0]:
                            worst[check.name] = (fraction, f"{result.name} {check.detail}")
                for tensor in result.tensors:
                    estimate = tensor.bias
                    if estimate is None or not estimate.judgeable():
                        continue
                    tensors += 1
                    over += estimate.benchmark_z > standards.bias.PATH_Z
                    where = f"{result.name} {tensor.name}"
                    floor = standards.bias.BIAS_FLOOR
                    for key, value in (
                        ("z against the benchmark", estimate.z),
                        (
                            "z against zero (benchmark z <= PATH_Z)",
                            estimate.device_z if estimate.benchmark_z <= standards.bias.PATH_Z else 0.0,
                        ),
                        ("benchmark z", estimate.benchmark_z),
                        ("|bias| / floor", abs(estimate.device) / floor),
                        ("|difference| / floor", abs(estimate.difference) / floor),
                    ):
                        if value > bias_worst[key][0]:
                            bias_worst[key] = (value, where)
                shutil.rmtree(case_dir)
    print(f"{judged} cases judged ({args.seeds} seeds of {args.spec}); {len(failures)} not passing")
    for line in failures:
        print("  ", line)
    print("largest value / limit per check:")
    for name, (fraction, where) in sorted(worst.items()):
        print(f"  {name:18s} {fraction:.3f}   {where[:150]}")
    print(f"bias check, {tensors} judged tensors, {over} with a benchmark z over PATH_Z (largest values):")
    for name, (value, where) in bias_worst.items():
        print(f"  {name:34s} {value:.3g}   {where}")


if __name__ == "__main__":
    main()

"""First-choice accuracy of the diagnosis on planted faults, this checkout's against another's (issue 31, item 3).

Every fault of the reference device (`devices.faults.FAULTS`, this checkout's: the faults added for issue 31
included) is planted on every case it applies to, in two sets: the smoke suite (`tuned`: the diagnosis was
built and tuned on it) and `held-out`, shapes no shipped suite holds and the diagnosis was not tuned on
(zero-length sequences between others, a tail of one row, GQA 8:1, non-square blocks with D 64, a third
batch entry). Each failing run is judged by this checkout's `compare.compare_case` and, with `--against
DIR`, by DIR's (its `bsa_cli` imported under another name, as `diagnosis_versions.py` does). A run counts
as right when the first cause is the fault's true kind, or when the first cause says the evidence cannot
tell it from the true kind ("not told apart from ..." naming it). It prints each run's first causes and
the counts per fault and set.

Usage: python benchmarks/diagnosis_accuracy.py [--against DIR] [--held-out-only | --fresh]

--fresh: four more shapes, seed 77, written once the work was done and run once: the unseen set.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnosis_versions import load_copy  # noqa: E402

from bsa_cli import compare  # noqa: E402
from bsa_cli.devices import faults, reference  # noqa: E402
from bsa_cli.store import load_manifest, read_array  # noqa: E402
from bsa_cli.store.manifest import case_from_manifest  # noqa: E402

BSA = [sys.executable, "-m", "bsa_cli"]
CASES = Path(__file__).resolve().parent.parent / "cases"

TRUE_KIND = {
    "drop-tail-block": "tail-block",
    "no-gqa-sum": "gqa-group-sum",
    "dk-no-scale": "scale",
    "mask-transposed": "block-selection",
    "block-shift": "block-selection",
    "lse-base2": "softmax-lse",
    "no-dsum": "softmax-grad",
    "nan-row": "non-finite",
    "stale-output": "not-written",
    "race-lost-update": "accumulation-race",
    "scale-rounded": "scale",
    "tile-noise": "tile-local",
    "rows-swapped": "rows-permuted",
    "heads-interleaved": "gqa-head-mapping",
    "dq-scaled-twice": "scale",
    "lse-row-max": "softmax-lse",
    "dv-slightly-scaled": "scale",
    "dk-missing-q-block": "partial-missing",
}
"""Each planted fault's true kind (tests/compare/test_diagnose.py's TRUE_KIND and the faults of issue 31)."""

#: Shapes no shipped suite holds (issue 31's list), the diagnosis not tuned on them.
HELD_OUT = [
    {"name": "held-tnd-zero-len", "layout": "TND", "dtype": "fp16", "num_heads": 4, "num_kv_heads": 2,
     "head_dim": 64, "actual_seq_lengths": [100, 0, 130, 0, 64], "block_shape": [32, 32],
     "sparsity": {"pattern": "random", "density": 0.6}},
    {"name": "held-tnd-zero-len-bf16", "layout": "TND", "dtype": "bf16", "num_heads": 2, "head_dim": 128,
     "actual_seq_lengths": [0, 129, 0, 65], "block_shape": [64, 64], "sparsity": {"pattern": "causal"}},
    {"name": "held-gqa8", "dtype": "bf16", "batch": 2, "num_heads": 8, "num_kv_heads": 1, "head_dim": 64,
     "q_seq_len": 160, "block_shape": [32, 64], "sparsity": {"pattern": "random", "density": 0.5}},
    {"name": "held-tail-one", "dtype": "fp16", "num_heads": 2, "head_dim": 128, "q_seq_len": 129,
     "block_shape": [64, 128], "sparsity": {"pattern": "causal"}},
    {"name": "held-batch3", "dtype": "fp16", "batch": 3, "num_heads": 3, "head_dim": 64, "q_seq_len": 96,
     "block_shape": [16, 48], "sparsity": {"pattern": "random", "density": 0.4}},
    {"name": "held-gqa8-d64", "dtype": "fp16", "num_heads": 8, "num_kv_heads": 2, "head_dim": 64,
     "q_seq_len": 200, "kv_seq_len": 170, "block_shape": [48, 32], "sparsity": {"pattern": "random", "density": 0.5}},
]  # fmt: skip

#: Shapes and seeds written after the diagnosis of issue 31 was finished and run once (`--fresh`): faults and
#: cases it has never been looked at on.
FRESH = [
    {"name": "fresh-tnd-gqa3", "layout": "TND", "dtype": "bf16", "num_heads": 6, "num_kv_heads": 3, "head_dim": 64,
     "actual_seq_lengths": [1, 0, 77, 200], "block_shape": [16, 32], "sparsity": {"pattern": "random", "density": 0.5}},
    {"name": "fresh-bnsd-b4", "dtype": "fp16", "batch": 4, "num_heads": 2, "head_dim": 32, "q_seq_len": 63,
     "kv_seq_len": 65, "block_shape": [32, 16], "sparsity": {"pattern": "random", "density": 0.7}},
    {"name": "fresh-gqa4-causal", "dtype": "bf16", "num_heads": 4, "num_kv_heads": 1, "head_dim": 128,
     "q_seq_len": 257, "block_shape": [128, 64], "sparsity": {"pattern": "causal"}},
    {"name": "fresh-tnd-window", "layout": "TND", "dtype": "fp16", "num_heads": 2, "head_dim": 128,
     "actual_seq_lengths": [64, 0, 64, 64], "block_shape": [64, 64],
     "sparsity": {"pattern": "sliding_window", "window": 2}},
]  # fmt: skip


def gen(spec: Path, out: Path) -> None:
    result = subprocess.run([*BSA, "gen", str(spec), "-o", str(out), "-j", "1"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"bsa gen failed ({result.returncode}): {result.stdout}{result.stderr}")


def runs(root: Path, out: Path) -> list[tuple[str, str, Path, Path]]:
    """(case, fault, case folder, output folder) of every applicable fault on every backward case of `root`."""
    found = []
    for manifest_path in sorted(root.rglob("case.json")):
        case_dir = manifest_path.parent
        manifest = load_manifest(case_dir)
        case = case_from_manifest(manifest)
        if "block_sparse_mask" not in manifest["inputs"]:
            continue
        mask = read_array(case_dir, manifest["inputs"]["block_sparse_mask"])
        for fault in (f for f in faults.FAULTS if faults.fault_applies(f, case, mask)):
            output_dir = out / case_dir.name / fault
            if reference.emulate_case_dir(case_dir, output_dir, fault=fault, order_seed=1) != 0:
                break  # a case the operator rejects: judged on its status, nothing to diagnose
            found.append((case_dir.name, fault, case_dir, output_dir))
    return found


def right(result: compare.CaseResult, kind: str) -> bool:
    """The first cause is `kind`, or says it cannot be told apart from `kind`."""
    if result.verdict != compare.FAIL or not result.diagnosis:
        return False
    first = result.diagnosis[0]
    undecided = "not told apart from" in first.evidence and (kind in first.evidence or _said(first.evidence, kind))
    return first.kind == kind or undecided


def _said(evidence: str, kind: str) -> bool:
    """Whether an evidence names `kind` in words (a constant factor: scale; a lost update: accumulation-race)."""
    words = {"scale": "constant factor", "accumulation-race": "lost update", "not-written": "left zero"}
    return words.get(kind, kind) in evidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout whose diagnosis is judged too")
    parser.add_argument("--held-out-only", action="store_true", help="the held-out set only")
    parser.add_argument("--fresh", action="store_true", help="the fresh set only (seed 77)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bsa-diag-accuracy-"))
    try:
        versions: dict[str, ModuleType] = {"this": compare}
        if args.against is not None:
            load_copy(args.against.resolve(), work)
            versions["against"] = importlib.import_module("bsa_against.compare")
        held = work / "held-out.yaml"
        held.write_text(json.dumps({"defaults": {"seed": 21}, "cases": HELD_OUT}))  # JSON is YAML
        sets = {"held-out": held} if args.held_out_only else {"tuned": CASES / "smoke.yaml", "held-out": held}
        if args.fresh:
            fresh = work / "fresh.yaml"
            fresh.write_text(json.dumps({"defaults": {"seed": 77}, "cases": FRESH}))
            sets = {"fresh": fresh}
        counts: dict[tuple[str, str, str], list[int]] = {}
        for label, spec in sets.items():
            gen(spec, work / label)
            for case, fault, case_dir, output_dir in runs(work / label, work / "out" / label):
                line = f"{label:8} {case[:26]:26} {fault:19}"
                for name, module in versions.items():
                    result = module.compare_case(case_dir, output_dir, workers=1)
                    ok = right(result, TRUE_KIND[fault])
                    tally = counts.setdefault((label, fault, name), [0, 0])
                    tally[0] += ok
                    tally[1] += 1
                    first = f"{result.diagnosis[0].kind} {result.diagnosis[0].score:.2f}" if result.diagnosis else "-"
                    line += (
                        f" | {name}: {'ok ' if ok else 'MISS'} {first if result.verdict == 'FAIL' else result.verdict}"
                    )
                print(line, flush=True)
        print()
        names = list(versions)
        print(f"{'set':8} {'fault':19} {'true kind':17} | " + " | ".join(f"{n:>8}" for n in names))
        totals: dict[tuple[str, str], list[int]] = {}
        for label, fault, name in sorted(counts):
            if name != names[0]:
                continue
            cells = []
            for n in names:
                good, all_ = counts[label, fault, n]
                cells.append(f"{good:>3} of {all_:<2}")
                totals.setdefault((label, n), [0, 0])
                totals[label, n][0] += good
                totals[label, n][1] += all_
            print(f"{label:8} {fault:19} {TRUE_KIND[fault]:17} | " + " | ".join(cells))
        for (label, name), (good, all_) in sorted(totals.items()):
            print(f"{label}: {name} right first in {good} of {all_} failing runs ({good / max(all_, 1):.0%})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

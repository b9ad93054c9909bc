"""scripts/gen_digests.py's comparison, which CI runs (`same bc5c210` on the small specs): a changed, missing
or new file digest or verdict is a difference; specs the new list does not hold are not compared."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("gen_digests", REPO / "scripts" / "gen_digests.py")
assert spec is not None and spec.loader is not None
gen_digests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_digests)

BEFORE = [
    "aa  smoke.yaml/c1/inputs/query.bin",
    "bb  smoke.yaml/c1/outputs/dq.bin",
    "verdict  smoke.yaml/c1  PASS",
    "cc  edge.yaml/e1/inputs/query.bin",
]


def test_the_same_lines_agree() -> None:
    assert gen_digests.differences(BEFORE, list(reversed(BEFORE))) == []


def test_a_changed_output_digest_is_a_difference() -> None:
    after = [line.replace("bb  ", "bd  ") for line in BEFORE]
    assert gen_digests.differences(BEFORE, after) == [
        "missing or changed: bb  smoke.yaml/c1/outputs/dq.bin",
        "new or changed:     bd  smoke.yaml/c1/outputs/dq.bin",
    ]


def test_a_changed_verdict_and_a_missing_file_are_differences() -> None:
    after = [BEFORE[0], "verdict  smoke.yaml/c1  FAIL", BEFORE[3]]
    problems = gen_digests.differences(BEFORE, after)
    assert "missing or changed: bb  smoke.yaml/c1/outputs/dq.bin" in problems
    assert "new or changed:     verdict  smoke.yaml/c1  FAIL" in problems
    assert len(problems) == 3


def test_only_the_specs_run_are_compared() -> None:
    assert gen_digests.differences(BEFORE, BEFORE[:3]) == []  # edge.yaml not run this time

"""cases/negative-forward.yaml and cases/chain.yaml: the forward's negative suite and the pair's pitfalls.

The negative suite holds one case per rule of the forward (bsa_cli/ops/forward_interface.py), in the order the
forward checks them; chain.yaml names each pitfall of the pair with the verdict it must give. Running them
end to end needs the forward's golden and devices; here they load, build and say what each op expects.
"""

from __future__ import annotations

from bsa_cli import ops
from bsa_cli.ops import OPS, forward_interface
from bsa_cli.specs import load_specs
from tests.helpers import REPO

NEGATIVE = REPO / "cases" / "negative-forward.yaml"
CHAIN = REPO / "cases" / "chain.yaml"


def test_the_negative_forward_suite_follows_the_forward_order() -> None:
    """Cases appear in the order of the rules: aclnn, then infershape, then the tiling."""
    order = {"aclnn": 0, "infershape": 1, "tiling": 2}
    stages = [order[forward_interface.STAGES[case.expect.status]] for case in load_specs([NEGATIVE])]
    assert stages == sorted(stages)
    assert set(stages) == {0, 1, 2}


def test_the_negative_forward_suite_covers_every_status_of_the_forward() -> None:
    statuses = {case.expect.status for case in load_specs([NEGATIVE])}
    assert statuses == {161001, 161002, 561103, 561002}


def test_the_new_suites_load_with_every_other_suite() -> None:
    """No case name of the new files clashes with another suite's (one folder per case)."""
    cases = load_specs([REPO / "cases"])
    names = {case.name for case in cases}
    assert {"chain-plain", "fwd-null-query"} <= names


def test_chain_cases_expect_a_verdict_only_of_the_pair() -> None:
    for case in load_specs([CHAIN], ops=OPS):
        for op in ("forward", "backward"):
            assert case.expect_of(op).verdict == "PASS" and case.expect_of(op).cause is None, (case.name, op)
        if case.skip_reason("chain") is None:
            status, _ = ops.get("chain").status(case)
            assert status == case.expect_of("chain").status, case.name


def test_every_chain_pitfall_is_a_named_case() -> None:
    names = {case.name for case in load_specs([CHAIN])}
    assert {
        "chain-lse-flag-0",
        "chain-mask-int8-into-backward",
        "chain-bnsd-padding-rows-read",
        "chain-rows-without-blocks",
        "chain-inner-precise-1-fp16",
        "chain-y64-backward-only",
        "chain-mask-bool",
        "chain-scale-forward-default",
        "chain-scale-both-explicit",
    } <= names

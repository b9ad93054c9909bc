"""Every shipped suite with every op generates, runs and is judged without a traceback (issue 32 item 1).

`bsa gen cases/negative.yaml --ops forward` crashed on a null blockShape (the forward accepts one, its golden
did not) and `cases/negative-forward.yaml --ops backward` on a blockShape of three values (the backward reads
the first two). All of each negative suite runs here (status only: cheap), and of every other suite the cases
estimated under `SMALL` seconds of gen plus its cheapest one, so that each suite is in it with each op.
cases/nightly.yaml's cheapest case alone takes seconds of gen per op: it is marked slow.
"""

from __future__ import annotations

import pytest

from bsa_cli.gen.schedule import estimate
from bsa_cli.ops import OPS
from bsa_cli.specs import load_specs
from tests.helpers import CASES, invoke

#: Cases of a suite estimated under this many seconds of `bsa gen` are all checked, with each op.
SMALL = 0.025

SUITES = [
    pytest.param(spec, id=spec.stem, marks=[pytest.mark.slow] if spec.stem == "nightly" else [])
    for spec in sorted(CASES.glob("*.yaml"))
]


def _subset(spec) -> list[str]:
    cases = load_specs([spec], ops=OPS)
    positive = sorted((c for c in cases if c.expect.ok), key=lambda c: estimate(c).seconds)
    chosen = [c for c in cases if not c.expect.ok] + positive[:1]
    chosen += [c for c in positive[1:] if estimate(c).seconds < SMALL]
    return [c.name for c in chosen]


@pytest.mark.parametrize("spec", SUITES)
def test_each_suite_with_every_op_runs_without_a_traceback(tmp_path, spec) -> None:
    filters = [arg for name in _subset(spec) for arg in ("--filter", name)]
    out = tmp_path / "out"

    result = invoke("check", spec, "--ops", ",".join(OPS), "-o", out, "-j", "1", *filters)

    assert result.exit_code in (0, 1, 3), result.output[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "crashed" not in result.output, result.output[-3000:]
    logs = {log: log.read_text() for log in out.glob("*/outputs/stderr.log")}
    assert not [log for log, text in logs.items() if "Traceback" in text], sorted(logs)

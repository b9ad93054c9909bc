"""Shared fixtures and options of bsa's tests (the helpers themselves are in tests/helpers/).

`--update-snapshots` (or BSA_UPDATE_SNAPSHOTS=1) writes the snapshots under tests/snapshots/ instead of
comparing with them; without it a missing snapshot fails.

Suites that many tests read are generated once per session (once per xdist worker) by `generated_suite`
(cases/NAME.yaml), `generated_spec` (`bsa gen` of a spec written in a test file) and `emulated_cases`
(cases with the reference device's outputs). They are shared: a test reads them, and one that writes into a
case folder (outputs, a planted change) copies it first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from bsa_cli.core.case import Case
from tests.helpers import CASES, assert_snapshot, invoke

# The tests assume no terminal width in the environment (a CI log), as a plain `python -m pytest` gives.
# pytest imports readline in its main process, and GNU readline with no terminal sets COLUMNS=80 and
# LINES=24 in the C environment (not in os.environ), which xdist's workers and the tests' child processes
# inherit: bsa_cli/cli/output.py would read COLUMNS as the person's width and wrap at 80. This conftest is
# loaded after that and before the workers start. Tests that need a width set COLUMNS themselves.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
    os.unsetenv(_name)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots",
        action="store_true",
        help="write tests/snapshots/ from this run (also BSA_UPDATE_SNAPSHOTS=1); without it a missing snapshot fails",
    )


@pytest.fixture
def snapshot(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Return `check(name, text)`: `text` must equal tests/snapshots/`name` (written on --update-snapshots)."""
    update = bool(request.config.getoption("--update-snapshots") or os.environ.get("BSA_UPDATE_SNAPSHOTS"))

    def check(name: str, text: str) -> None:
        assert_snapshot(name, text, update=update)

    return check


def _once(tmp_path_factory: pytest.TempPathFactory, build: Callable[..., Path]) -> Callable[..., Path]:
    """Return `build` memoized by its arguments' text, each call given a fresh session folder first."""
    made: dict[str, Path] = {}

    def get(*args: object, **options: object) -> Path:
        key = repr((args, sorted(options.items())))
        if key not in made:
            made[key] = build(tmp_path_factory.mktemp("suite"), *args, **options)
        return made[key]

    return get


@pytest.fixture(scope="session")
def generated_suite(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Return `suite(name)`: the folder of cases/NAME.yaml's cases, each by `generate_case`, made once."""
    from bsa_cli.gen.generate import generate_case
    from bsa_cli.specs import load_specs

    def build(root: Path, name: str) -> Path:
        for case in load_specs([CASES / f"{name}.yaml"]):
            generate_case(case, root)
        return root

    return _once(tmp_path_factory, build)


@pytest.fixture(scope="session")
def generated_spec(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return `gen(spec, *options)`: the folder `bsa gen SPEC -o OUT OPTIONS` writes for a spec given as a dict
    (written as tiny.yaml), made once per spec and options."""

    def build(root: Path, spec: Mapping[str, object], *options: str) -> Path:
        (root / "tiny.yaml").write_text(yaml.safe_dump(dict(spec), sort_keys=False))
        result = invoke("gen", root / "tiny.yaml", "-o", root / "out", *options)
        assert result.exit_code == 0, result.output
        return root / "out"

    return _once(tmp_path_factory, build)


@pytest.fixture(scope="session")
def emulated_cases(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return `cases(cases, order_seed=None)`: a folder of the cases generated (`generate_case`), each with
    the reference device's outputs in its outputs/ (`order_seed`: the order dK/dV partials are summed in)."""
    from bsa_cli.devices import reference
    from bsa_cli.gen.generate import generate_case

    def build(root: Path, cases: Sequence[Case], order_seed: int | None = None) -> Path:
        for case in cases:
            case_dir = generate_case(case, root)
            reference.emulate_case_dir(case_dir, case_dir / "outputs", order_seed=order_seed)
        return root

    return _once(tmp_path_factory, build)

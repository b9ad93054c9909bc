"""The pytest plugin of bsa: run a test once per generated case (`pytest --bsa-cases OUT test_mine.py`).

Installing bsa registers it (entry point `pytest11`); docs/api.md documents it. A test that asks for
the `bsa_case` fixture is parametrized over the case directories under `--bsa-cases` (every case, or
those matching `--bsa-filter`), with the case names as test ids, and receives each case loaded
(`bsa_cli.api.load_case`). Without `--bsa-cases` such a test is skipped. A failing verdict fails the
test through `bsa_cli.assert_passed(result)`, whose message starts with the deciding check; JUnit XML
comes from pytest itself (`--junitxml`).

Nothing but pytest is imported when pytest starts: bsa's modules (NumPy) load once `--bsa-cases` is
given, torch only in the tests that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .api import LoadedCase

_CASE_DIRS = pytest.StashKey[list[Path]]()

SKIP_REASON = "no cases: run pytest with --bsa-cases OUT (a folder of cases written by `bsa gen`)"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add --bsa-cases and --bsa-filter."""
    group = parser.getgroup("bsa", "bsa: generated cases of aclnnBlockSparseAttentionGrad")
    group.addoption(
        "--bsa-cases",
        action="append",
        default=[],
        metavar="OUT",
        help="run tests that use the bsa_case fixture once per case directory under OUT (written by "
        "`bsa gen`); may be repeated",
    )
    group.addoption(
        "--bsa-filter",
        action="append",
        default=[],
        metavar="GLOB",
        help="only the cases whose names match GLOB (e.g. 'smoke-*'); may be repeated",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Find the cases once, before collection; a bad folder or a filter matching nothing is a usage error."""
    roots = config.getoption("bsa_cases")
    patterns = config.getoption("bsa_filter")
    if not roots:
        if patterns:
            raise pytest.UsageError("--bsa-filter needs --bsa-cases OUT")
        return
    from .errors import DataError
    from .store import select_cases

    try:
        config.stash[_CASE_DIRS] = select_cases([Path(r) for r in roots], patterns, option="--bsa-filter")
    except DataError as exc:
        raise pytest.UsageError(f"--bsa-cases: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `bsa_case` over the selected cases, with their names as ids."""
    if "bsa_case" not in metafunc.fixturenames:
        return
    case_dirs = metafunc.config.stash.get(_CASE_DIRS, None)
    if case_dirs:
        metafunc.parametrize("bsa_case", case_dirs, ids=[d.name for d in case_dirs], indirect=True)


@pytest.fixture
def bsa_case(request: pytest.FixtureRequest) -> LoadedCase:
    """One generated case, loaded: `inputs`, `params`, `op_args`, `expect`, `name`, `dir` (bsa_cli.api.LoadedCase).

    Skipped when pytest runs without --bsa-cases.
    """
    case_dir = getattr(request, "param", None)
    if case_dir is None:
        pytest.skip(SKIP_REASON)
    assert case_dir is not None  # pytest.skip raises
    from .api import load_case

    return load_case(case_dir)

"""Shared fixtures and options of bsa's tests (the helpers themselves are in tests/helpers.py).

`--update-snapshots` (or BSA_UPDATE_SNAPSHOTS=1) writes the snapshots under tests/snapshots/ instead of
comparing with them; without it a missing snapshot fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.helpers import assert_snapshot


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

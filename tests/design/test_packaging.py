"""The distribution: a name of its own on the package index, the command still `bsa` (issue 32 item 8).

`pip install bsa` installs Bind Status Analyzer 0.1.0, another project. .ci/run builds the wheel and sdist
and runs the smoke suite from each, installed alone.
"""

from __future__ import annotations

import pytest

from tests.helpers import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_the_distribution_is_not_named_bsa_and_installs_the_bsa_command():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "bsa-aclnn"
    assert project["scripts"] == {"bsa": "bsa_cli.__main__:run"}
    assert project["entry-points"]["pytest11"] == {"bsa": "bsa_cli.pytest_plugin"}
    assert "python -m build" in (REPO / ".ci" / "run").read_text()

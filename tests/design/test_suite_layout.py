"""The shape of the tests: they share code through tests/helpers/ and conftest.py, never through each other.

A test file that imports another runs that file's module-level code twice under some import modes, and
breaks collection under `--import-mode=importlib` where the tests folder is not on sys.path. Test files live
in folders named for what they test (tests/golden/, tests/cli/, ...), each a package that says so in one line;
tests/ itself keeps only what they share and the data folders. tests/helpers/ is a module per job whose
package re-exports every name, so that `from tests.helpers import X` works whichever module X lives in.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

import tests.helpers
from tests.helpers import REPO, TESTS


def imported_test_modules(source: str) -> set[str]:
    """Return the test modules (`test_*`) a source imports, as written (`test_x`, `tests.test_x`, `tests.test_x.y`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base, *(f"{base}.{alias.name}" if base else alias.name for alias in node.names)]
        else:
            continue
        found.update(name for name in names if any(part.startswith("test_") for part in name.split(".")))
    return found


def test_no_test_file_imports_another_test_file() -> None:
    offenders = {
        str(path.relative_to(TESTS)): sorted(imported_test_modules(path.read_text()))
        for path in sorted(TESTS.rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


@pytest.mark.parametrize(
    "line",
    [
        "from test_compare import build_case",
        "import test_runner",
        "from tests.test_report import case",
        "from tests import test_cli_run",
        "def f():\n    from test_compare import make_case",
        "from tests.compare.test_compare import build_case",
        "from tests.cli import test_cli_run",
    ],
)
def test_a_planted_cross_test_import_is_caught(line: str) -> None:
    assert imported_test_modules(line)


def test_helpers_and_oracles_are_not_test_modules() -> None:
    assert not imported_test_modules("from tests.helpers import make_case\nfrom tests import oracle\nimport pytest")


def test_the_helpers_package_reexports_every_name_of_its_modules() -> None:
    defined = set()
    for path in sorted((TESTS / "helpers").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                defined.update([target.id] if isinstance(target, ast.Name) and target.id != "__all__" else [])
    assert sorted(defined - set(tests.helpers.__all__)) == []
    assert all(hasattr(tests.helpers, name) for name in tests.helpers.__all__)


def test_test_files_live_in_folders_that_say_what_they_test() -> None:
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == []
    folders = sorted({path.parent for path in TESTS.rglob("test_*.py")})
    assert folders and all(folder.parent == TESTS for folder in folders), folders
    undocumented = [
        folder.name
        for folder in folders
        if not (folder / "__init__.py").is_file()
        or not ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    ]
    assert undocumented == []


def test_ci_runs_the_readmes_test_command_verbatim_in_a_worker_per_core() -> None:
    readme = (REPO / "README.md").read_text().split("Run the tests (this is what `.ci/run` runs):", 1)[1]
    command = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()[-1]
    assert (REPO / ".ci" / "run").read_text().splitlines()[-1] == command
    assert command.startswith("python -m pytest -n ") and '"pytest-xdist' in (REPO / "pyproject.toml").read_text()


@pytest.mark.slow
def test_the_suite_collects_under_importlib_mode_too() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            str(TESTS),
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " tests collected" in result.stdout.splitlines()[-1], result.stdout[-500:]

"""The pytest plugin of bsa: run a test once per generated case (`pytest --bsa-cases OUT test_mine.py`).

Installing bsa registers it (entry point `pytest11`); docs/api.md documents it. A test that asks for
the `bsa_case` fixture is parametrized over the case folders under `--bsa-cases` (every case, or
those matching `--bsa-filter`), one per (case, op): a case's ops side by side in `OPS` order, with test
ids `NAME` for the backward and `NAME[op]` for the others (`--bsa-ops LIST` keeps some ops; a test marked
`@pytest.mark.bsa_ops("forward", ...)` gets only the folders of those ops, an unmarked one only the backward's).
`--bsa-cases OUT` and `--bsa-cases=OUT` give the same test ids. It receives each folder loaded
(`bsa_cli.api.load_case`; its op is `bsa_case.op`); a folder that gen wrote for an op its operator
refuses (the manifest's `skip`) is skipped with the reason. Without `--bsa-cases` such a test is skipped.
A failing verdict fails the test through `bsa_cli.assert_passed(result)`, whose message starts with the
deciding check; JUnit XML comes from pytest itself (`--junitxml`).

Nothing but pytest is imported when pytest starts: bsa's modules (NumPy) load once `--bsa-cases` is
given, torch only in the tests that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .api import LoadedCase

#: The selected case folders, each with its op, a case's ops side by side.
_CASE_DIRS = pytest.StashKey[list[tuple[Path, str]]]()

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
    group.addoption(
        "--bsa-ops",
        default=None,
        metavar="LIST",
        help="only the folders of these ops (comma list of forward, backward, chain, autograd; default: every "
        "op the cases were generated with)",
    )


MARKER = (
    "bsa_ops(*ops): run this test only on the case folders of these ops (forward, backward, chain, autograd); "
    "a test without it runs on the backward's folders only"
)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Root `--bsa-cases OUT` (a space) where `--bsa-cases=OUT` is rooted.

    pytest fixes its rootdir before it loads this plugin, so it took OUT for a test path and rooted the run
    at the common folder of OUT and the tests (ids `../bsa::test[...]`, JUnit classnames empty). Its
    arguments are parsed again now that the option is known: the rootdir and ini file are found anew from
    the test paths alone, unless --rootdir was given. pytest offers no public way to do this
    (`determine_setup`, pytest 8 and 9): with another signature the rootdir stays as it was.
    """
    ns = early_config.known_args_namespace
    if not getattr(ns, "bsa_cases", None) or getattr(ns, "rootdir", None):
        return
    from _pytest.config.findpaths import determine_setup

    try:
        rootpath, inipath, inicfg, *_ = determine_setup(
            inifile=ns.inifilename,
            override_ini=ns.override_ini,
            args=ns.file_or_dir,
            rootdir_cmd_arg=None,
            invocation_dir=early_config.invocation_params.dir,
        )
    except TypeError:
        return
    if rootpath != early_config.rootpath:
        early_config._rootpath, early_config._inipath, early_config._inicfg = rootpath, inipath, inicfg


def pytest_configure(config: pytest.Config) -> None:
    """Find the cases once, before collection; a bad folder, a filter matching nothing or an unknown op is a
    usage error."""
    config.addinivalue_line("markers", MARKER)
    roots, patterns, ops_text = (config.getoption(name) for name in ("bsa_cases", "bsa_filter", "bsa_ops"))
    if not roots:
        for given, option in ((patterns, "--bsa-filter"), (ops_text, "--bsa-ops")):
            if given:
                raise pytest.UsageError(f"{option} needs --bsa-cases OUT")
        return
    from .core.errors import DataError
    from .ops import OPS, parse_ops, split_folder_name
    from .store import select_cases

    try:
        wanted = parse_ops(ops_text) if ops_text is not None else OPS
    except ValueError as exc:
        raise pytest.UsageError(f"--bsa-ops: {exc}") from None
    try:
        case_dirs = select_cases([Path(r) for r in roots], patterns, option="--bsa-filter")
    except DataError as exc:
        raise pytest.UsageError(f"--bsa-cases: {exc}") from None
    folders = [(d, *split_folder_name(d.name)) for d in case_dirs]
    first = {name: index for index, name in enumerate(dict.fromkeys(name for _, name, _ in folders))}
    folders.sort(key=lambda f: (first[f[1]], OPS.index(f[2])))  # a case's ops side by side, in OPS order
    selected: list[tuple[Path, str]] = [(d, op) for d, _, op in folders if op in wanted]
    if not selected:
        raise pytest.UsageError(
            f"--bsa-ops: none of the {len(folders)} case folders is of {ops_text}: generate them with "
            f"`bsa gen --ops {ops_text}`"
        )
    config.stash[_CASE_DIRS] = selected


def folder_id(case_dir: Path, op: str) -> str:
    """A folder's test id: the case's name, with the op in brackets for an op other than the backward."""
    from .ops import split_folder_name
    from .report.formatting import op_test_name

    return op_test_name(split_folder_name(case_dir.name)[0], op)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `bsa_case` over the selected (case, op) folders (those of the test's `bsa_ops` marker),
    with ids `NAME` and `NAME[op]`."""
    if "bsa_case" not in metafunc.fixturenames:
        return
    folders = metafunc.config.stash.get(_CASE_DIRS, None)
    if not folders:
        return
    marker = metafunc.definition.get_closest_marker("bsa_ops")
    if marker is None:  # a backward test would fail on a forward folder (no dout): the others are asked for
        from .ops import DEFAULT_OPS

        folders = [(d, op) for d, op in folders if op in DEFAULT_OPS]
    else:
        from .ops import OPS
        from .report.formatting import is_op

        unknown = [str(op) for op in marker.args if not is_op(op)]
        if unknown or not marker.args:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: @pytest.mark.bsa_ops({', '.join(map(repr, marker.args))}): "
                f"give one or more of {', '.join(OPS)}"
            )
        folders = [(d, op) for d, op in folders if op in marker.args]
    if not folders:
        metafunc.parametrize("bsa_case", [None], ids=["no-folder"], indirect=True)
        return
    metafunc.parametrize(
        "bsa_case", [d for d, _ in folders], ids=[folder_id(d, op) for d, op in folders], indirect=True
    )


NO_FOLDER = (
    "no case folder of this test's ops under --bsa-cases (without a marker: the backward's; mark a test "
    "@pytest.mark.bsa_ops('forward', 'chain', ...) to run it on other ops' folders)"
)


@pytest.fixture
def bsa_case(request: pytest.FixtureRequest) -> LoadedCase:
    """One generated case folder, loaded: `inputs`, `params`, `op_args`, `expect`, `name`, `dir`, `op`
    (bsa_cli.api.LoadedCase).

    Skipped when pytest runs without --bsa-cases, when the test's `bsa_ops` marker names no op of the
    folders found, and for a folder gen wrote for an op its operator refuses (the manifest says why).
    """
    case_dir = getattr(request, "param", None)
    if case_dir is None:
        pytest.skip(NO_FOLDER if request.config.stash.get(_CASE_DIRS, None) else SKIP_REASON)
    assert case_dir is not None  # pytest.skip raises
    from .api import load_case
    from .store import load_manifest

    skip = load_manifest(case_dir).skip
    if skip:
        pytest.skip(f"{Path(case_dir).name}: not judged: {skip}")
    return load_case(case_dir)

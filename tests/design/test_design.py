"""The shape of the code (docs/design.md): imports flow one way, and no module outgrows one job.

Imports are read from the source (every `import`, also those inside functions), so a lazy import cannot
bring a circle back unseen.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "bsa_cli"

CLI = "bsa_cli.cli"
"""The command line: the `bsa` group (bsa_cli/cli/__init__.py) and, below it, the command modules and the
modules they share (common, options, output, progress)."""

COMMAND_MODULES = {f"{CLI}.{name}" for name in ("compare", "export", "fuzz", "gen", "run", "trend")}
"""Modules that define click commands; the group, `bsa_cli.cli`, adds them to `bsa`."""

COMPARE_ORDER = (
    "results",
    "geometry",
    "buffers",
    "ulp",
    "metrics",
    "locate",
    "structural",
    "summary",
    "judge",
    "forward",
    "pair",
    "views",
    "hypotheses",
    "findings",
    "scoring",
    "patterns",
    "placement",
    "contributions",
    "forward_hypotheses",
    "forward_patterns",
    "diagnose",
    "forward_diagnosis",
    "chain",
    "case_files",
    "verdict",
    "suite",
    "drift",
    "recheck",
)
"""The modules of bsa_cli/compare, from the pure core outwards: each imports only modules before it."""

LAYERS = (
    "_version",
    "core",
    "inputs",
    "golden",
    "standards",
    "ops",
    "specs",
    "store",
    "devices",
    "compare",
    "gen",
    "report",
    "pipeline",
    "fuzz",
    "api",
    "pytest_plugin",
    "cli",
    "__main__",
)
"""The packages (and top-level modules) of bsa_cli from the bottom up (docs/design.md): each imports only
those before it. The package `bsa_cli` itself (its `__init__`, the public API's face) imports lazily."""

MAX_LINES = 600
"""No module of bsa_cli is longer unless LONG_MODULES names it: past this, it holds more than one job."""

LONG_MODULES = {
    "bsa_cli.store": 650,  # the files of a case folder: made, found and checked in one place
    "bsa_cli.specs.fields": 650,  # one reader per spec key: splitting them would split the key table
    "bsa_cli.compare.diagnose.patterns": 700,  # the causes scored from the error's shape, one function each
}
"""Modules that may pass MAX_LINES, with their own bound, each for the reason docs/design.md gives."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether `name` (bsa_cli.x.y) is a module or package of bsa_cli, not a name one defines."""
    where = PACKAGE.parent.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """Return the bsa_cli modules a source file imports (absolute names; `from . import x` names x, and the
    package too where x is a name its __init__ defines: `from . import main` inside bsa_cli/cli imports the
    group, `from . import output` does not)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("bsa_cli"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("bsa_cli"):
                module = node.module
            else:
                continue
            names = {f"{module}.{alias.name}" for alias in node.names}
            found.update(names)  # `from . import report`
            if not all(map(is_module, names)):
                found.add(module)
    return found


@functools.cache
def _parsed_imports() -> Mapping[str, frozenset[str]]:
    """Every bsa_cli module with the bsa_cli modules it imports, parsed once per session."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in files}
    return {module_name(path): frozenset(imported_modules(path) & modules) for path in files}


def source_imports() -> dict[str, set[str]]:
    """Return every bsa_cli module with the bsa_cli modules it imports (a fresh copy: tests plant imports)."""
    return {module: set(targets) for module, targets in _parsed_imports().items()}


def is_cli(module: str) -> bool:
    return module == CLI or module.startswith(f"{CLI}.")


def _layer(module: str) -> str:
    """The layer of a module of bsa_cli: its package below bsa_cli, or its own name at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "_version"  # the face of bsa_cli is no layer: it imports lazily


def import_violations(imports: Mapping[str, Iterable[str]]) -> list[str]:
    """Return each import that breaks the one-way flow of docs/design.md.

    * Each layer imports only the layers before it in `LAYERS`.
    * Only `bsa_cli.__main__` imports the group, `bsa_cli.cli`; only the group imports the command
      modules; the command modules import the modules they share (`bsa_cli.cli.common`, `.options`,
      `.output`, `.progress`) and the library, never each other; the library imports no module of the CLI.
    * `bsa_cli.compare` imports neither the CLI nor `bsa_cli.report` (reports render its results) nor
      `bsa_cli.pipeline`; inside it, each module imports only those before it in `COMPARE_ORDER`.
    """
    problems = []
    for module, targets in sorted(imports.items()):
        for target in sorted(targets):
            if target == module:
                continue
            if module != "bsa_cli" and _layer(target) in LAYERS[LAYERS.index(_layer(module)) + 1 :]:
                problems.append(f"{module} imports {target}: a layer above it (LAYERS)")
                continue
            if target == CLI and module != "bsa_cli.__main__":
                problems.append(f"{module} imports {target}: only `python -m bsa_cli` starts the group")
            elif target in COMMAND_MODULES and module != CLI:
                problems.append(f"{module} imports {target}: a command module is imported by bsa_cli.cli only")
            elif is_cli(target) and target != CLI and not is_cli(module):
                problems.append(f"{module} imports {target}: the library does not know the CLI")
            if module.startswith("bsa_cli.compare"):
                if target.startswith(("bsa_cli.report", "bsa_cli.pipeline")) or is_cli(target):
                    problems.append(f"{module} imports {target}: judging knows nothing of reports or the CLI")
                inner, target_inner = module.rpartition(".")[2], target.rpartition(".")[2]
                if (
                    module.startswith("bsa_cli.compare.")
                    and target.startswith("bsa_cli.compare.")
                    and COMPARE_ORDER.index(target_inner) >= COMPARE_ORDER.index(inner)
                ):
                    problems.append(f"{module} imports {target}: later in COMPARE_ORDER (a circle in the making)")
    return problems


def test_imports_flow_one_way() -> None:
    assert import_violations(source_imports()) == []


def test_judging_never_imports_a_device() -> None:
    """compare reads what a device recorded (run.json), never the device: not even lazily."""
    found = {
        module: sorted(t for t in targets if t == "bsa_cli.devices" or t.startswith("bsa_cli.devices."))
        for module, targets in source_imports().items()
        if module.startswith("bsa_cli.compare")
    }
    assert {module: targets for module, targets in found.items() if targets} == {}


INNER_ORDERS = {
    "bsa_cli.specs": ("safe_yaml", "fields", "ops_fields", "expand", "build", "load"),
    "bsa_cli.golden": ("numerics", "paths", "walk", "compute", "forward_op"),
}
"""The modules of other packages, in the order data flows through them: each imports only those before it
(the package's `__init__`, its face, hands on names and imports any of them)."""


def inner_order_violations(imports: Mapping[str, Iterable[str]]) -> list[str]:
    problems = []
    for package, order in INNER_ORDERS.items():
        for module, targets in sorted(imports.items()):
            if not module.startswith(f"{package}."):
                continue
            for target in sorted(t for t in targets if t.startswith(f"{package}.") and t != module):
                inner, target_inner = module.rpartition(".")[2], target.rpartition(".")[2]
                if target_inner in order and order.index(target_inner) >= order.index(inner):
                    problems.append(f"{module} imports {target}: later in {package}'s order")
    return problems


def test_packages_keep_their_inner_order() -> None:
    for package, order in INNER_ORDERS.items():
        folder = PACKAGE / package.split(".", 1)[1]
        assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(order), package
    assert inner_order_violations(source_imports()) == []
    planted = {"bsa_cli.golden.numerics": {"bsa_cli.golden.walk"}}
    assert inner_order_violations(planted) == [
        "bsa_cli.golden.numerics imports bsa_cli.golden.walk: later in bsa_cli.golden's order"
    ]


def test_every_module_of_compare_has_its_place_in_the_order() -> None:
    compare = PACKAGE / "compare"
    packages = {p.parent.name for p in compare.glob("*/__init__.py")}
    names = {p.stem for p in compare.rglob("*.py")} - {"__init__"} | packages
    assert names == set(COMPARE_ORDER)


def test_the_import_reader_sees_relative_and_lazy_imports() -> None:
    imports = source_imports()
    assert "bsa_cli.cli.common" in imports["bsa_cli.cli.run"]
    assert "bsa_cli.cli.output" in imports["bsa_cli.cli.gen"] and CLI not in imports["bsa_cli.cli.gen"]
    assert "bsa_cli.devices.reference" in imports["bsa_cli.cli.gen"]  # `from ..devices.reference import` in a function
    assert "bsa_cli.compare.metrics" in imports["bsa_cli.compare.judge"]


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("bsa_cli.cli.compare", "bsa_cli.cli"),  # a command module importing the group: the old circle
        ("bsa_cli.cli.run", "bsa_cli.cli.gen"),  # a command reaching into another
        ("bsa_cli.cli.common", "bsa_cli.cli.run"),  # a shared module reaching up into a command
        ("bsa_cli.pipeline", "bsa_cli.cli.common"),  # the library knowing the CLI
        ("bsa_cli.report.terminal", "bsa_cli.cli.output"),  # the library writing to the CLI's consoles
        ("bsa_cli.compare.judge", "bsa_cli.report"),
        ("bsa_cli.compare.judge", "bsa_cli.report.formatting"),
        ("bsa_cli.compare.metrics", "bsa_cli.compare.judge"),  # the core importing outwards
        ("bsa_cli.standards", "bsa_cli.compare.results"),
        ("bsa_cli.core.case", "bsa_cli.ops"),  # a leaf knowing the ops
        ("bsa_cli.specs.fields", "bsa_cli.compare"),  # spec loading importing judging
        ("bsa_cli.devices.repeat", "bsa_cli.compare"),
        ("bsa_cli.golden.walk", "bsa_cli.store"),
    ],
)
def test_a_planted_backward_import_is_caught(module: str, target: str) -> None:
    imports = source_imports()
    imports[module] = {*imports[module], target}
    problems = import_violations(imports)
    assert len(problems) == 1 and problems[0].startswith(f"{module} imports {target}:")


def module_lengths(root: Path = PACKAGE) -> dict[str, int]:
    return {module_name(path): len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}


def too_long(lengths: Mapping[str, int], limit: int = MAX_LINES) -> list[str]:
    bounds = {module: LONG_MODULES.get(module, limit) for module in lengths}
    return [f"{module}: {n} lines (at most {bounds[module]})" for module, n in lengths.items() if n > bounds[module]]


def test_no_module_outgrows_one_job() -> None:
    assert too_long(module_lengths()) == []


def test_a_module_too_long_is_caught() -> None:
    lengths = module_lengths()
    planted = {**lengths, "bsa_cli.runner": MAX_LINES + 1}
    assert too_long(planted) == [f"bsa_cli.runner: {MAX_LINES + 1} lines (at most {MAX_LINES})"]


MANIFEST_WRITERS = {"bsa_cli/store/manifest.py", "bsa_cli/store/__init__.py", "bsa_cli/gen/generate.py"}
"""Where case.json is built and checked as JSON (`manifest.build_manifest`, `store.check_manifest`, gen's
additions); every other module asks a `manifest.Manifest` its questions."""


def test_readers_ask_the_manifest_instead_of_digging_in_its_json() -> None:
    import re

    digging = re.compile(r"\bmanifest(\.get\(|\[)")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE.parent)) not in MANIFEST_WRITERS
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if digging.search(line)
    ]
    assert not found, "ask manifest.Manifest (name, params, is_negative, entries, ...) instead:\n" + "\n".join(found)


def test_every_package_has_its_layer() -> None:
    layers = {_layer(module_name(path)) for path in PACKAGE.rglob("*.py")} - {"_version"}
    assert layers <= set(LAYERS)
    assert {p.parent.name for p in PACKAGE.glob("*/__init__.py")} | {p.stem for p in PACKAGE.glob("*.py")} == set(
        LAYERS
    ) | {"__init__"}


def test_loading_a_spec_imports_nothing_of_judging_golden_store_devices_or_reports() -> None:
    import subprocess
    import sys

    program = (
        "import sys; from bsa_cli.specs import load_specs; load_specs(['cases/smoke.yaml']); "
        "print(' '.join(m for m in sys.modules if m.startswith('bsa_cli')))"
    )
    loaded = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True)
    heavy = ("compare", "golden", "store", "devices", "report", "gen", "cli")
    assert [m for m in loaded.stdout.split() if _layer(m) in heavy] == []


OP_NAMES = {"forward", "backward", "chain", "autograd"}
STANDARD_NAMES = {"double-benchmark", "single", "allclose", "fa-ratio"}


def name_comparisons(names: set[str], root: Path = PACKAGE, skip: tuple[str, ...] = ()) -> list[str]:
    """Return file:line of each comparison (==, !=, in, not in) of a value with one of `names` written as a
    string, or with a tuple holding one, in the package at `root` outside the folders `skip` names."""

    def strings(node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(strings(e) for e in node.elts)) if node.elts else set()
        return set()

    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root)
        if where.parts[0] in skip:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in node.ops
            ):
                if any(strings(side) & names for side in (node.left, *node.comparators)):
                    found.append(f"{where}:{node.lineno}")
    return found


def test_only_the_ops_compare_an_op_name() -> None:
    """Everything outside bsa_cli/ops asks the `Op` (its attributes), never compares its name."""
    assert name_comparisons(OP_NAMES, skip=("ops",)) == []


def test_a_planted_op_name_comparison_is_caught(tmp_path: Path) -> None:
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "x.py").write_text('if op in ("chain", "x"):\n    pass\n')
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "y.py").write_text('ok = op == "forward"\n')
    assert name_comparisons(OP_NAMES, tmp_path, skip=("ops",)) == ["devices/x.py:1"]
    assert name_comparisons({"allclose"}, tmp_path) == []


def test_no_standard_is_chosen_by_its_name() -> None:
    """A standard's behaviour is its class's: no `if standard == "..."` anywhere, standards/ included."""
    assert name_comparisons(STANDARD_NAMES) == []

"""Start-up: each command loads what it uses. `bsa --help` loads no command and no NumPy, a command's start-up
loads no module of the table below, and ml_dtypes (most of a second to import, 0.7) loads at the first bfloat16.

Each check runs in a fresh interpreter and reads its `sys.modules`, so a module-level import added anywhere
on a command's path (the fault this guards against) fails it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from bsa_cli.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]

#: What no command loads at start-up, and what each command module must not load besides (its `--help`).
NEVER = ("ml_dtypes",)
NOT_NEEDED = {
    "gen": ("bsa_cli.report",),  # validate, list, gen: no report is written
    "trend": ("bsa_cli.devices",),  # reads JSON reports: no device
    "compare": (),
    "run": (),  # run reads a report (--failed), check writes them
    "export": (),
    "fuzz": (),
}

PROBE = """
import json, sys
from bsa_cli.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded(*args: str) -> list[str]:
    """Return the modules a fresh `bsa ARGS` has loaded when it is done."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.splitlines()[-1])


def matching(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_the_command_list_loads_no_command_and_no_numpy() -> None:
    modules = loaded("--help")
    assert not matching(modules, ("numpy", *NEVER)), matching(modules, ("numpy", *NEVER))
    commands = [f"bsa_cli.cli.{module}" for module, _, _ in COMMANDS.values()]
    assert not matching(modules, tuple(commands)), matching(modules, tuple(commands))


@pytest.mark.parametrize("module", sorted(NOT_NEEDED))
def test_a_command_loads_only_what_it_uses(module: str) -> None:
    name = next(name for name, (where, _, _) in COMMANDS.items() if where == module)
    modules = loaded(name, "--help")
    assert f"bsa_cli.cli.{module}" in modules  # the probe reached the command
    unwanted = matching(modules, (*NEVER, *NOT_NEEDED[module]))
    assert not unwanted, f"bsa {name} loads at start-up what it does not use: {unwanted}"


def test_ml_dtypes_loads_for_a_bfloat16_case_only(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "defaults: {batch: 1, num_heads: 1, q_seq_len: 64, head_dim: 16, block_shape: [32, 32], seed: 1}\n"
        "cases:\n  - name: tiny\n    matrix:\n      dtype: [fp16, bf16]\n"
    )
    half = loaded("gen", str(spec), "--filter", "tiny.fp16", "-j", "1", "-o", str(tmp_path / "half"))
    assert (tmp_path / "half" / "tiny.fp16" / "case.json").is_file() and not matching(half, NEVER)
    brain = loaded("gen", str(spec), "--filter", "tiny.bf16", "-j", "1", "-o", str(tmp_path / "brain"))
    assert (tmp_path / "brain" / "tiny.bf16" / "case.json").is_file() and matching(brain, NEVER)


def test_each_command_s_line_in_the_list_is_its_own_help() -> None:
    context = click.Context(main)
    for name, (_, _, line) in COMMANDS.items():
        command = main.get_command(context, name)
        assert command is not None and command.name == name
        for width in (30, 45, 74, 200):
            assert click.Command(name, help=line).get_short_help_str(width) == command.get_short_help_str(width)

"""Tests of the options several commands share (bsa_cli/cli/options.py): defined once, gathered into one value."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bsa_cli.cli import main
from bsa_cli.cli.options import DeviceOptions, SettingsOptions, device_options, report_options, settings_options


def test_gathered_options_reach_the_command_as_one_value_each() -> None:
    seen: dict[str, object] = {}

    @click.command()
    @device_options
    @settings_options(standard="s", threshold="t", padding="p")
    @report_options
    @click.option("--last")
    def command(device: DeviceOptions, settings: SettingsOptions, reports: dict[str, Path | None], last: str) -> None:
        seen.update(device=device, settings=settings, reports=reports, last=last)

    args = [
        "--binary",
        "b",
        "--devices",
        "0,1",
        "--repeat",
        "2",
        "--threshold",
        "rmse_ratio=2",
        "--html",
        "r.html",
        "--last",
        "x",
    ]
    result = CliRunner().invoke(command, args)

    assert result.exit_code == 0, result.output
    assert seen == {
        "device": DeviceOptions(None, "b", None, None, "0,1", 2, False, 600.0),
        "settings": SettingsOptions(None, ("rmse_ratio=2",), None),
        "reports": {"--json": None, "--junit": None, "--html": Path("r.html"), "--csv": None},
        "last": "x",
    }


def test_gathered_options_keep_their_order_in_help() -> None:
    check = main.commands["check"]
    names = [param.opts[-1] for param in check.params if isinstance(param, click.Option)]
    assert names[names.index("--device") : names.index("--timeout") + 1] == [
        "--device",
        "--binary",
        "--cmd",
        "--fault",
        "--devices",
        "--repeat",
        "--deterministic",
        "--timeout",
    ]
    assert names[names.index("--standard") :] == [
        "--standard",
        "--threshold",
        "--padding",
        "--json",
        "--junit",
        "--html",
        "--csv",
        "--baseline",
        "--fail-on-regression",
        "--regression-margin",
        "--time-threshold",
        "--verbose",
        "--recheck",
    ]


@pytest.mark.parametrize("command", ["list", "gen", "run", "check", "compare", "export"])
def test_every_filter_option_hands_its_globs_to_the_command_as_filters(command: str) -> None:
    (option,) = [param for param in main.commands[command].params if "--filter" in param.opts]
    assert option.name == "filters" and option.multiple

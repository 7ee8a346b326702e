"""`toolbox --help` and every subcommand's help (and sub-subcommand's) show examples."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from toolbox.cli import SUBCOMMANDS, main

OWNED_BY_OTHERS = {"check", "test", "bench", "site", "engine"}


def test_top_level_help_has_examples() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    for name in SUBCOMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_subcommand_help_has_examples(name: str) -> None:
    try:
        module = importlib.import_module(f"toolbox.commands.{name}")
    except ModuleNotFoundError as error:
        if name in OWNED_BY_OTHERS and error.name == f"toolbox.commands.{name}":
            pytest.skip(f"toolbox/commands/{name}.py is not written yet (another helper owns it)")
        raise
    command = module.command
    paths = [[name]]
    if isinstance(command, click.Group):
        paths += [[name, sub] for sub in command.list_commands(click.Context(command))]
    for path in paths:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Examples:" in result.output, f"`toolbox {' '.join(path)} --help` shows no example"
        assert "toolbox " in result.output.split("Examples:", 1)[1], path


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2

"""The CLI's table of commands: `treadle --help` lists them without importing their modules."""

from __future__ import annotations

import importlib
import pkgutil

import click
from click.testing import CliRunner

import treadle.cli
from treadle.cli.main import COMMANDS, cli


def _load_every_command_module() -> None:
    for info in pkgutil.iter_modules(treadle.cli.__path__):
        if info.name == "__main__":
            continue
        importlib.import_module(f"treadle.cli.{info.name}")


def test_every_registered_command_is_in_the_table_with_its_module_and_help() -> None:
    _load_every_command_module()
    assert set(cli.commands) == set(COMMANDS)
    for name, command in cli.commands.items():
        module, short_help = COMMANDS[name]
        assert command.callback is not None
        assert command.callback.__module__ == f"treadle.cli.{module}", name
        from_table = click.Command(name, help=short_help).get_short_help_str(200)
        assert from_table == command.get_short_help_str(200), name


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)


def test_an_unknown_command_is_named_in_the_error() -> None:
    result = CliRunner().invoke(cli, ["nosuch"])
    assert result.exit_code == 2
    assert "No such command 'nosuch'" in result.output


def test_every_subcommand_is_registered_by_its_groups_own_module() -> None:
    """A command's module is the only one loaded when it runs: a subcommand that another module
    adds to its group (`@runs_group.command` outside runs.py) would be missing then."""
    _load_every_command_module()
    for name, command in cli.commands.items():
        if not isinstance(command, click.Group):
            continue
        home = f"treadle.cli.{COMMANDS[name][0]}"
        for sub_name, sub in command.commands.items():
            assert sub.callback is not None
            assert sub.callback.__module__ == home, f"treadle {name} {sub_name} is defined outside {home}"

"""The ``refimpl`` dispatcher: built-in and entry-point subcommands, and resilience to a broken
entry point."""

import argparse
from importlib.metadata import EntryPoint

import pytest

from refimpl import cli


def test_every_subcommand_is_registered():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"report", "train", "eval", "check"} <= set(sub.choices)


def test_missing_entry_point_is_reported_not_fatal(monkeypatch, capsys):
    broken = EntryPoint(name="ghost", value="no_such_module_xyz:register", group="refimpl.commands")
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    parser = cli.build_parser()
    assert "ghost" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["ghost"])
    assert parser.parse_args(["check", "--list-conventions"]).command == "check"

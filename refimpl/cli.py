"""The ``refimpl`` command line.

Subcommands come from two places:
* ``refimpl`` itself (``BUILTIN_COMMANDS``: module paths inside this package), and
* the ``refimpl.commands`` entry-point group, through which layers that ``refimpl`` must not
  import (``tabular`` provides ``report``) contribute their own subcommands. This keeps the
  import rule of docs/architecture.md while giving users one command.

Each provider exposes ``register(subparsers) -> None`` that adds a parser whose ``func``
default takes the parsed ``argparse.Namespace`` and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

# Modules inside refimpl that provide subcommands (added as the layers grow).
BUILTIN_COMMANDS: tuple[str, ...] = (
    "refimpl.lm.cli", "refimpl.conformance.cli", "refimpl.conformance.frameworks.install",
)


def _providers() -> list[Callable[[argparse._SubParsersAction], None]]:
    providers = [importlib.import_module(name).register for name in BUILTIN_COMMANDS]
    for ep in sorted(entry_points(group="refimpl.commands"), key=lambda e: e.name):
        try:
            providers.append(ep.load())
        except (ImportError, AttributeError) as exc:
            # A stale or partial install must not take the other subcommands down with it.
            print(f"refimpl: subcommand {ep.name!r} unavailable ({ep.value}: {exc})", file=sys.stderr)
    return providers


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="refimpl",
        description="Exact ground truth and verified reference implementations for RL-for-LLM.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in _providers():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run a subcommand; a Ctrl-C anywhere (also while the providers import) ends with one
    line and exit status 130, as a shell reports an interrupted command."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("refimpl: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())

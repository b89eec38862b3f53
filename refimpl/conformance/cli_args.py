"""Command-line plumbing of ``refimpl check`` / ``conventions`` / ``matrix``: one-line user errors,
``MODULE:NAME`` loading, ``FIELD=VALUE`` parsing, and printing that survives a closed pipe
(``refimpl conventions | head``)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable

__all__ = ["UserError", "load_object", "one_line", "parse_assignments", "replace_fields", "one_line_errors",
           "emit_text"]


class UserError(Exception):
    """A mistake in the command line or in the user's module: printed as one line, exit 2."""


def load_object(spec: str, what: str) -> Callable:
    """Import ``MODULE:NAME`` (NAME may be dotted, e.g. ``pkg.mod:Class.method``); every failure
    is a one-line ``UserError`` naming ``what``."""
    if not isinstance(spec, str) or ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise UserError(f"{what} must be MODULE:NAME, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(f"{what}: cannot import module {module_name!r} ({exc})") from None
    except Exception as exc:  # the module itself raised while importing
        raise UserError(
            f"{what}: importing {module_name!r} raised {type(exc).__name__}: {one_line(exc)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{what}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{what} {spec!r} is not callable (a {type(obj).__name__})")
    return obj


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _parse_value(text: str, current: object, field: str, owner: str) -> object:
    """``text`` as the type of ``current`` (None / bool / int / float / str)."""
    low = text.strip().lower()
    if isinstance(current, str):
        return text.strip()
    if low in ("none", "null"):
        return None
    if isinstance(current, bool) or low in ("true", "false"):
        if low not in ("true", "false"):
            raise UserError(f"{owner} {field}={text!r}: expected true or false")
        return low == "true"
    if (
        isinstance(current, int)
        and not isinstance(current, bool)
        or (current is None and field in ("max_length", "group_size"))
    ):
        try:
            return int(text)
        except ValueError:
            raise UserError(f"{owner} {field}={text!r}: expected an integer") from None
    if isinstance(current, float) or current is None:
        try:
            return float(text)
        except ValueError:
            raise UserError(f"{owner} {field}={text!r}: expected a number or none") from None
    return text.strip()


def parse_assignments(items: list[str] | None, target: object, owner: str) -> dict[str, object]:
    """``["field=value", ...]`` -> ``{field: typed value}`` for the dataclass ``target`` (its field
    types taken from its current values); unknown fields and malformed items are UserErrors."""
    if hasattr(target, "flags"):  # a Convention: its flat flags
        fields = set(target.flags())
    else:
        fields = {f.name for f in dataclasses.fields(target)} - {"name"}
    out: dict[str, object] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{owner} must be FIELD=VALUE, got {item!r}")
        field, _, text = item.partition("=")
        field = field.strip()
        if field not in fields:
            raise UserError(f"{owner}: unknown field {field!r}; valid: {', '.join(sorted(fields))}")
        out[field] = _parse_value(text, getattr(target, field), field, owner)
    return out


def replace_fields(target: object, overrides: dict[str, object], owner: str) -> object:
    try:
        return dataclasses.replace(target, **overrides)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{owner}: {one_line(exc)}") from None



def emit_text(text: str) -> None:
    """Print ``text``; a reader that closed the pipe early (``| head``) ends the output quietly
    instead of a BrokenPipeError traceback."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again


def one_line_errors(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """Make argparse's usage errors one line on stderr (exit 2)."""

    def error(message: str):
        print(f"{prog}: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    parse_known = parser.parse_known_args

    def strict(args=None, namespace=None):  # unknown options: this parser's one-line error, not the caller's
        namespace, extras = parse_known(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.parse_known_args = strict  # type: ignore[method-assign]
    return parser


"""Command-line plumbing of ``refimpl check`` / ``conventions`` / ``matrix``: one-line user errors,
``MODULE:NAME`` (or path) loading, framework drivers and their modes, ``FIELD=VALUE`` parsing, the
parsers of the ``check`` subcommands (each with only its options), the earlier spellings, and
printing that survives a closed pipe (``refimpl conventions | head``)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import sys
from collections.abc import Callable

__all__ = ["UserError", "FrameworkMissing", "REQUIRE_FRAMEWORKS_ENV", "load_object", "load_framework",
           "select_mode", "mode_kind", "one_line", "parse_assignments", "replace_fields", "one_line_errors",
           "emit_text", "KIND_WORDS", "CHECK_SUBCOMMANDS", "add_check_subcommands", "earlier_spelling"]


class UserError(Exception):
    """A mistake in the command line or in the user's module: printed as one line, exit 2."""


def load_object(spec: str, what: str) -> Callable:
    """Import ``MODULE:NAME`` (NAME may be dotted, e.g. ``pkg.mod:Class.method``); MODULE may also
    be a file path (``../myloss:fn``, ``src/losses.py:fn``), imported as python imports a script
    (its folder first on ``sys.path``, so it can import its siblings). Every failure is a one-line
    ``UserError`` naming ``what``."""
    if not isinstance(spec, str) or ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise UserError(f"{what} must be MODULE:NAME, got {spec!r}")
    module_name, _, attr = spec.rpartition(":")  # rpartition: a Windows path has a colon of its own
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from .user_code import UserCodeFailure, guarded

    try:  # the module's own code runs at import: as user code (sys.exit, prints, a hang)
        obj = guarded(lambda: _import_module_or_file(module_name, what), f"importing {module_name!r}")
    except UserError:
        raise
    except UserCodeFailure as exc:
        raise UserError(f"{what}: {exc}") from None
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


def _is_path(module_name: str) -> bool:
    return "/" in module_name or os.sep in module_name or module_name.endswith(".py")


def _import_module_or_file(module_name: str, what: str):
    """The module ``module_name``: a dotted name, or a file path (``.py`` optional; a folder with an
    ``__init__.py`` is a package)."""
    if not _is_path(module_name):
        if module_name.startswith("."):
            path = "./" + module_name.lstrip(".")
            raise UserError(f"{what}: {module_name!r} is a relative module name; give a path ({path}) "
                            "or the module's full name")
        return importlib.import_module(module_name)
    path = pathlib.Path(module_name).expanduser()
    candidates = [path] if path.suffix == ".py" else [path.with_name(path.name + ".py"), path / "__init__.py"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise UserError(f"{what}: no file {' or '.join(str(p) for p in candidates)}")
    found = found.resolve()
    is_package = found.name == "__init__.py"
    name = found.parent.name if is_package else found.stem
    folder = str(found.parent.parent if is_package else found.parent)
    if not name.isidentifier():
        raise UserError(f"{what}: {found} cannot be imported: {name!r} is not a Python module name")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if pathlib.Path(getattr(loaded, "__file__", None) or "").resolve() == found:
            return loaded
        where = getattr(loaded, "__file__", None) or "built in"
        raise UserError(f"{what}: {found} cannot be imported as {name!r}: a module of that name is already "
                        f"loaded (from {where}); rename the file")
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as ``python path/to/script.py``: its siblings are importable
    from refimpl.conformance.frameworks.sources import load_source

    return load_source(name, found, package=is_package)


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



# ----------------------------------------------------------------------------------------------
# framework drivers and their modes, each failure one line

#: the variable that makes a framework that is not installed a failure (CI; exit 1)
REQUIRE_FRAMEWORKS_ENV = "RL_ORACLE_REQUIRE_FRAMEWORKS"


def load_framework(name: str):
    """The driver of an installed framework; a UserError (exit 2) when unknown or not installed,
    or a failure (exit 1) when ``RL_ORACLE_REQUIRE_FRAMEWORKS=1`` (CI: a skip is a failure)."""
    from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver

    if name not in FRAMEWORKS + EXTRA_FRAMEWORKS:
        raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS + EXTRA_FRAMEWORKS)}, "
                        f"got {name!r}")
    try:
        driver = load_driver(name)
    except ImportError as exc:
        raise UserError(f"--framework {name}: no driver ({one_line(exc)})") from None
    reason = driver.availability()
    if reason is not None:
        if os.environ.get(REQUIRE_FRAMEWORKS_ENV) == "1":
            raise FrameworkMissing(
                f"framework {name} is required ({REQUIRE_FRAMEWORKS_ENV}=1) but unavailable: {reason}"
            )
        raise UserError(f"framework {name} is not available, skipped: {reason}")
    return driver


class FrameworkMissing(Exception):
    """A required framework is not installed (exit 1)."""


def select_mode(driver, kind: str, mode_name: str | None, preset: str | None):
    """The driver's mode named ``mode_name``, or the mode of ``preset`` (``Driver.preset_mode``);
    every failure a one-line UserError."""
    try:
        if mode_name is not None:
            return driver.mode(kind, mode_name)
        if preset is None:
            modes = driver.modes(kind)
            if kind == "policy_loss" or len(modes) != 1:
                raise UserError(f"--framework needs --mode (one of {', '.join(modes)}) or --preset")
            return next(iter(modes.values()))
        return driver.preset_mode(kind, preset)
    except ValueError as exc:
        text = one_line(exc)
        raise UserError(text if "not supported" in text else f"--mode: {text}") from None


def mode_kind(driver, mode_name: str | None) -> str:
    """The kind of ``--mode`` when ``--kind`` is not given: the one kind that has a mode (or an
    unsupported mode) of that name; policy_loss without ``--mode``."""
    from refimpl.conformance.frameworks import KINDS

    if mode_name is None:
        return "policy_loss"
    kinds = [k for k in KINDS if mode_name in driver.modes(k) or mode_name in driver.unsupported_modes(k)]
    if len(kinds) > 1:
        raise UserError(f"{driver.name} has a mode {mode_name!r} of kinds {', '.join(kinds)}: give --kind")
    if not kinds:
        listing = "; ".join(f"{k}: {', '.join(driver.modes(k))}" for k in KINDS if driver.modes(k))
        raise UserError(f"--mode: {driver.name} has no policy_loss mode {mode_name!r} (nor one of another "
                        f"kind); modes: {listing}")
    return kinds[0]


# ----------------------------------------------------------------------------------------------
# the parsers of ``refimpl check WHAT``: each subcommand carries only the options that fit it


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


#: ``refimpl check WORD``: the kind of function each word checks
KIND_WORDS = {
    "loss": "policy_loss", "kl": "kl", "advantages": "group_advantages", "logprobs": "token_logprobs"
}
_PRESETS = "ppo, grpo, dr_grpo, dapo, bnpo, gspo, gspo_token, sapo, cispo"


def _options(profile_names: tuple[str, ...], kinds: tuple[str, ...]) -> dict[str, tuple[str, dict]]:
    """Every option of the check subcommands, once: ``name -> (--option, add_argument keywords)``."""
    assignment = {"action": "append", "metavar": "FIELD=VALUE"}
    return {
        "preset": ("--preset", {"help": f"policy-loss preset ({_PRESETS})"}),
        "variant": ("--variant", {**assignment, "help": "change a PolicyLossVariant field of the preset "
                                  "(repeatable), e.g. aggregation=seq_sum"}),
        "convention": ("--convention", {"choices": profile_names,
                                        "help": "numerical convention profile (default: the spec)"}),
        "flag": ("--flag", {**assignment, "help": "change a Convention flag of the profile (repeatable), "
                            "e.g. adv_leave_one_out=true"}),
        "scale_rewards": ("--scale-rewards", {"choices": ("group", "batch", "none"),
                                              "help": "with --convention trl: TRL's scale_rewards"}),
        "adapter": ("--adapter", {"metavar": "MODULE:NAME",
                                  "help": "adapter(fn, ...) mapping the kit's call to your signature"}),
        "kl_coef": ("--kl-coef", {"type": positive_float, "help": "KL weight (adds the kl_penalty class)"}),
        "estimator": ("--estimator", {"choices": ("k1", "k2", "k3"), "default": "k3",
                                      "help": "the KL estimator (default k3)"}),
        "device": ("--device", {"help": "device the check runs on (e.g. cuda; default cpu): the inputs are "
                                "moved there and the expected values are computed in float64 on the same "
                                "device"}),
        "rtol": ("--rtol", {"type": positive_float, "help": "float64 tolerance (default 1e-8)"}),
        "timeout": ("--timeout", {"type": positive_float, "metavar": "SECONDS",
                                  "help": "time limit of one call of the checked code: a call past it fails "
                                  "its case (default 60)"}),
        "json": ("--json", {"action": "store_true", "help": "print the report as JSON"}),
        "mode": ("--mode", {"help": "the framework's loss mode (refimpl matrix lists them)"}),
        "kind": ("--kind", {"choices": kinds, "help": "the mode's kind, where its name alone is ambiguous"}),
        "repro": ("--repro", {"metavar": "DIR", "help": "write a standalone script per bug finding of the "
                              "framework into DIR (imports only the framework and torch, or JAX and "
                              "numpy); run no check"}),
    }


_FUNCTION = "MODULE:FUNCTION"
_CHECKED = ("adapter", "device", "rtol", "timeout", "json")
#: subcommand -> (help, positional, options); a trailing "!" marks a required option
CHECK_SUBCOMMANDS = {
    "loss": ("a policy loss fn(logp, old_logp, advantages, mask, *, normalizer=None) -> scalar", _FUNCTION,
             ("preset!", "variant", "convention", "flag", "scale_rewards", "kl_coef", *_CHECKED)),
    "kl": ("a per-token KL estimator fn(logp, ref_logp) -> [N, T]", _FUNCTION,
           ("estimator", "convention", "flag", *_CHECKED)),
    "advantages": ("group advantages fn(rewards, group_ids) -> [N]", _FUNCTION,
                   ("preset", "convention", "flag", "scale_rewards", *_CHECKED)),
    "logprobs": ("token log-probabilities fn(logits, tokens) -> [N, T]", _FUNCTION, _CHECKED),
    "kind": ("a function of a kind of the registry (gae, value_loss, whitening, ...: refimpl/conformance/"
             "kinds); --flag sets the kind's flags", "KIND", ("flag", *_CHECKED)),
    "framework": ("an installed framework's own code (its mode, or the mode of --preset)", "FRAMEWORK",
                  ("mode", "kind", "preset", "convention", "variant", "flag", "device", "rtol", "timeout",
                   "json", "repro")),
    "differences": ("where a convention's numerics differ from the spec for --preset", None,
                    ("preset!", "convention", "variant", "flag", "scale_rewards", "kl_coef", "rtol", "json")),
}


def add_check_subcommands(check: argparse.ArgumentParser, funcs: dict[str, Callable], prog: str) -> None:
    """``refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION``, ``check framework F`` and
    ``check differences``, each with its own options (``CHECK_SUBCOMMANDS``; its errors begin with
    ``prog WORD:``); ``funcs``: subcommand -> the function run on the parsed arguments."""
    from refimpl.conformance.frameworks import FRAMEWORKS, KINDS
    from refimpl.conformance.profiles import PROFILE_NAMES

    options = _options(PROFILE_NAMES, KINDS)
    sub = check.add_subparsers(dest="what", metavar="{" + ",".join(CHECK_SUBCOMMANDS) + "}")
    for word, (help_text, positional, names) in CHECK_SUBCOMMANDS.items():
        parser = sub.add_parser(word, help=help_text, description=f"Check {help_text}.")
        one_line_errors(parser, f"{prog} {word}")
        if positional == "FRAMEWORK":
            parser.add_argument("framework", metavar="FRAMEWORK", help=f"one of {', '.join(FRAMEWORKS)}")
        elif positional == "KIND":  # refimpl check kind NAME MODULE:FUNCTION
            from refimpl.conformance.kinds import REGISTRY_KINDS

            parser.add_argument("registry_kind", metavar="KIND", choices=REGISTRY_KINDS,
                                help=f"one of {', '.join(REGISTRY_KINDS)}")
            parser.add_argument("target", metavar=_FUNCTION, help="the function (MODULE may be a file path)")
        elif positional:
            parser.add_argument("target", metavar=positional, help="the function (MODULE may be a file path)")
        for name in names:
            option, keywords = options[name.rstrip("!")]
            parser.add_argument(option, **keywords, **({"required": True} if name.endswith("!") else {}))
        parser.set_defaults(func=funcs[word], kind=KIND_WORDS.get(word))
    # ``refimpl check conventions``: ``refimpl conventions`` (where ``check --list-conventions`` goes)
    conventions = sub.add_parser("conventions")
    one_line_errors(conventions, f"{prog} conventions")
    conventions.add_argument("--json", action="store_true")
    conventions.set_defaults(func=funcs["conventions"], preset="grpo")


def earlier_spelling(argv: list[str]) -> tuple[list[str], str | None]:
    """``refimpl check`` arguments in an earlier spelling -> (the current spelling, a one-line note;
    None when nothing changed): ``MODULE:FUNCTION [--kind K]`` -> ``WORD MODULE:FUNCTION``,
    ``--framework F`` -> ``framework F``, ``--differences`` -> ``differences``,
    ``--list-conventions`` -> ``refimpl conventions``."""
    argv = list(argv)
    current = (*CHECK_SUBCOMMANDS, "conventions", "-h", "--help")
    if not argv or any(a in current and argv[i - 1:i] != ["--kind"] for i, a in enumerate(argv)):
        return argv, None  # the current spelling (or a mistake in it, which the parser names)
    if "--framework" in argv:  # a current spelling too (``check --framework F``): no note
        i = argv.index("--framework")
        return ["framework", *argv[i + 1:i + 2], *argv[:i], *argv[i + 2:]], None
    for old, new, word in (("--list-conventions", "conventions", "conventions"),
                           ("--differences", "differences", "check differences")):
        if old in argv:
            argv.remove(old)
            return [new, *argv], f"'{old}' is an earlier spelling of 'refimpl {word}'"
    kind_word = "loss"
    if "--kind" in argv:
        i = argv.index("--kind")
        kind = argv[i + 1] if i + 1 < len(argv) else ""
        words = {k: w for w, k in KIND_WORDS.items()}
        if kind not in words:
            return argv, None  # the parser names the bad --kind
        kind_word = words[kind]
        del argv[i:i + 2]
    # the target comes first, or after options: a typo of a subcommand word stays the parser's error
    first = argv[0] if argv else ""
    if ":" not in first if not first.startswith("-") else not any(":" in a for a in argv):
        return argv, None
    note = f"'refimpl check MODULE:FUNCTION [--kind K]' is an earlier spelling of 'refimpl check {kind_word}'"
    return [kind_word, *argv], note

"""``refimpl check`` and ``refimpl matrix``: run the conformance kit from the command line.

    refimpl check MODULE:FUNCTION --preset dapo [--convention reference|trl|verl] [--adapter MODULE:NAME]
    refimpl check MODULE:FUNCTION --preset grpo --variant aggregation=seq_sum --variant max_length=1
    refimpl check MODULE:FUNCTION --kind kl --estimator k3
    refimpl check MODULE:FUNCTION --kind group_advantages --convention trl [--preset dr_grpo]
    refimpl check MODULE:FUNCTION --kind group_advantages --flag adv_leave_one_out=true --flag adv_scale=none
    refimpl check MODULE:FUNCTION --kind token_logprobs
    refimpl check --framework verl --preset dapo [--convention reference]   (the installed framework)
    refimpl check --framework verl --mode vanilla/token-mean --kind policy_loss
    refimpl check --differences --preset grpo --convention verl     (spec vs a framework's numerics)
    refimpl check --list-conventions                                  (every flag, per profile, and why)
    refimpl matrix [--json PATH] [--out docs/conformance-matrix.md] [--check]

``check`` prints the table (case class, value ok, gradient ok, max error, departure) and the most
diagnostic failing case in full (``--json``: the same report as JSON); exits 0 when every case
passes, 1 when a case fails, 2 on a user error (one line on stderr, no traceback). The adapter
module is imported before the target, so an adapter can stub import-only dependencies of the
target's package. The current directory is put on ``sys.path`` (as ``python -m`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import types
from collections.abc import Callable

__all__ = [
    "register",
    "load_object",
    "run_check",
    "run_matrix",
    "conventions_text",
    "conventions_data",
    "parse_assignments",
    "UserError",
    "main",
]

_KINDS = ("policy_loss", "group_advantages", "kl", "token_logprobs")
#: exit code of a framework that is not installed, and the variable that makes it a failure (CI)
REQUIRE_FRAMEWORKS_ENV = "RL_ORACLE_REQUIRE_FRAMEWORKS"


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
            f"{what}: importing {module_name!r} raised {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{what}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{what} {spec!r} is not callable (a {type(obj).__name__})")
    return obj


def _one_line(exc: BaseException) -> str:
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


def _replace(target: object, overrides: dict[str, object], owner: str) -> object:
    try:
        return dataclasses.replace(target, **overrides)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{owner}: {_one_line(exc)}") from None


def conventions_text() -> str:
    """Every flag with its value in each shipped profile (for the grpo preset) and the reason."""
    from refimpl.conformance.conventions import FLAG_REASONS, PROFILE_NAMES, profile

    profiles = [profile(name, "grpo") for name in PROFILE_NAMES]
    lines = []
    for field in dataclasses.fields(profiles[0]):
        if field.name == "name":
            continue
        values = ", ".join(f"{p.name}={getattr(p, field.name)!r}" for p in profiles)
        lines.append(f"{field.name}: {values}\n    {FLAG_REASONS.get(field.name, '')}")
    return "\n".join(lines)


def conventions_data() -> dict[str, dict]:
    """``{flag: {"reason": ..., profile: value, ...}}`` (``--list-conventions --json``)."""
    from refimpl.conformance.conventions import FLAG_REASONS, PROFILE_NAMES, profile

    profiles = [profile(name, "grpo") for name in PROFILE_NAMES]
    return {
        f.name: {"reason": FLAG_REASONS.get(f.name, ""), **{p.name: getattr(p, f.name) for p in profiles}}
        for f in dataclasses.fields(profiles[0])
        if f.name != "name"
    }


# ----------------------------------------------------------------------------------------------
# framework drivers


def framework_header(driver: types.ModuleType, mode) -> tuple[str, ...]:
    """Lines naming the framework, its installed version (a warning when it is not the pinned one),
    the hash of the source files the driver runs, and the mode."""
    from refimpl.conformance.frameworks import source_hash

    version = driver.installed_version()
    lines = [
        f"framework {driver.NAME} {version} (source sha256 {source_hash(driver.source_files())}), "
        f"mode {mode.name}" + (f": {mode.description}" if mode.description else "")
    ]
    if version != driver.PINNED_VERSION:
        lines.append(
            f"warning: {driver.NAME} {version} is installed; the profiles describe {driver.PINNED_VERSION}"
        )
    return tuple(lines)


def load_framework(name: str) -> types.ModuleType:
    """The driver of an installed framework; a UserError (exit 2) when unknown or not installed,
    or a failure (exit 1) when ``RL_ORACLE_REQUIRE_FRAMEWORKS=1`` (CI: a skip is a failure)."""
    from refimpl.conformance.frameworks import FRAMEWORKS, load_driver

    if name not in FRAMEWORKS:
        raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {name!r}")
    try:
        driver = load_driver(name)
    except ImportError as exc:
        raise UserError(f"--framework {name}: no driver ({_one_line(exc)})") from None
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


def select_mode(driver: types.ModuleType, kind: str, mode_name: str | None, preset: str | None):
    """The driver's mode named ``mode_name``, or the mode of ``preset``: the one ``profile(framework,
    preset)`` is built from (``conventions.PROFILE_MODES``), else the first implementing ``preset``."""
    from refimpl.conformance.conventions import PROFILE_MODES

    modes = driver.modes(kind)
    unsupported = driver.unsupported_modes(kind)
    if mode_name is not None:
        if mode_name in modes:
            return modes[mode_name]
        if mode_name in unsupported:
            raise UserError(f"{driver.NAME} mode {mode_name!r} is not supported: {unsupported[mode_name]}")
        raise UserError(f"--mode: {driver.NAME} has no {kind} mode {mode_name!r}; modes: {', '.join(modes)}")
    if preset is None:
        if kind == "policy_loss" or len(modes) != 1:
            raise UserError(f"--framework needs --mode (one of {', '.join(modes)}) or --preset")
        return next(iter(modes.values()))
    key = preset.strip().lower().replace("-", "_")
    profiled = dict(PROFILE_MODES.get(driver.NAME, {}).get(key, ())).get(kind)
    if profiled in modes:  # the mode whose flags are profile(framework, preset), run on that preset
        mode = modes[profiled]
        return mode if mode.preset == key else dataclasses.replace(mode, preset=key)
    matching = [m for m in modes.values() if (m.preset or "").replace("-", "_") == key]
    if not matching:
        raise UserError(
            f"{driver.NAME} has no {kind} mode for preset {preset!r}; modes: "
            + ", ".join(f"{m.name} ({m.preset})" for m in modes.values())
        )
    return matching[0]


def mode_variant(mode, overrides: dict[str, object] | None = None):
    """The PolicyLossVariant a mode runs: its preset (default variant for kinds without one) with
    the mode's ``variant_overrides`` (PolicyLossVariant fields only) and ``overrides``."""
    from refimpl.conformance.checks import resolve_preset
    from refimpl.losses import PolicyLossVariant

    variant = resolve_preset(mode.preset)[1] if mode.preset else PolicyLossVariant()
    names = {f.name for f in dataclasses.fields(PolicyLossVariant)}
    fields = {k: v for k, v in mode.variant_overrides.items() if k in names}
    variant = dataclasses.replace(variant, **fields, **(overrides or {}))
    if variant.aggregation == "seq_sum" and variant.max_length is None:
        variant = dataclasses.replace(variant, max_length=16)
    return variant


def mode_convention(mode, framework: str):
    """The profile of a mode: ``convention_from_flags`` of ``mode.convention``, named ``framework:mode``."""
    from refimpl.conformance.conventions import convention_from_flags

    return convention_from_flags(f"{framework}:{mode.name}", mode.convention)


def check_framework_mode(
    driver, mode, *, reference: bool, variant_overrides=None, flag_overrides=None, rtol=None
):
    """Run the kit on one framework mode under its profile (or the reference, with every departure
    explained by the mode's flags or ``unexplained``). Returns the CheckReport."""
    from refimpl.conformance import checks
    from refimpl.conformance.cases import POLICY_CASE_CLASSES
    from refimpl.conformance.conventions import Convention

    rtol = checks.DEFAULT_RTOL if rtol is None else rtol
    variant = mode_variant(mode, variant_overrides)
    conv = Convention() if reference else mode_convention(mode, driver.NAME)
    if flag_overrides:
        conv = dataclasses.replace(conv, **flag_overrides)
    fn, adapter = driver.target(mode.kind, mode, variant)
    header = framework_header(driver, mode)
    if mode.kind == "policy_loss":
        return checks.check_policy_loss(
            fn,
            variant,
            convention=conv,
            adapter=adapter,
            rtol=rtol,
            explain=dict(mode.convention) if reference else None,
            # under the reference, departures are named on the generated classes (the golden vectors
            # repeat them with 1e12 magnitudes and a normaliser of their own)
            classes=tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors") if reference else None,
            framework_config=dict(mode.framework_config),
            header=header,
        )
    if mode.kind == "kl":

        def run(c):
            return checks.check_kl(
                fn, variant.kl_estimator, convention=c, adapter=adapter, rtol=rtol, header=header
            )

    elif mode.kind == "group_advantages":

        def run(c):
            return checks.check_group_advantages(fn, convention=c, adapter=adapter, rtol=rtol, header=header)

    else:
        raise UserError(f"mode {mode.name!r} has kind {mode.kind!r}, which no checker takes")
    report = run(conv)
    if reference and not report.ok and not flag_overrides:
        report = explained_by_rerun(report, conv, dict(mode.convention), run)
    return report


def explained_by_rerun(report, conv, flags: dict, run):
    """Name, for each failing class of ``report``, the first of ``flags`` (one at a time, then all
    together) under which ``run(conv + flag)`` passes that class, or ``unexplained``; the report then
    lists every departure (for the kinds whose values carry no per-case diagnosis)."""
    trials = [{k: v} for k, v in flags.items()] + ([flags] if len(flags) > 1 else [])
    passing = []
    for trial in trials:
        try:
            candidate = dataclasses.replace(conv, **trial)
        except (TypeError, ValueError):
            continue
        label = ("flag " if len(trial) == 1 else "flags ") + ", ".join(f"{k}={v!r}" for k, v in trial.items())
        passing.append((label, {c.case_class for c in run(candidate).by_class() if c.ok}))
    why = {
        name: next((label for label, ok in passing if name in ok), "unexplained")
        for name in report.failing_classes()
    }
    results = tuple(
        dataclasses.replace(r, explanation=why[r.case_class]) if not r.ok and r.case_class in why else r
        for r in report.results
    )
    return dataclasses.replace(report, results=results, list_departures=True)


# ----------------------------------------------------------------------------------------------
# refimpl check


def _validate(args: argparse.Namespace) -> None:
    """Argument combinations that make no sense: UserError naming the argument."""
    if args.kind != "kl" and args.estimator is not None and args.framework is None:
        raise UserError(f"--estimator applies to --kind kl, not --kind {args.kind}")
    if args.kind != "policy_loss":
        for name, value in (
            ("--kl-coef", args.kl_coef),
            ("--variant", args.variant),
            ("--device", args.device),
        ):
            if value not in (None, []):
                raise UserError(f"{name} applies to --kind policy_loss, not --kind {args.kind}")
    if args.kind in ("kl", "token_logprobs") and args.preset is not None and args.framework is None:
        raise UserError(f"--preset does not apply to --kind {args.kind}")
    if args.kind == "token_logprobs" and (args.convention is not None or args.flag):
        raise UserError("--convention / --flag do not apply to --kind token_logprobs")
    if args.scale_rewards is not None and args.kind not in ("policy_loss", "group_advantages"):
        raise UserError(f"--scale-rewards does not apply to --kind {args.kind}")
    if args.rtol is not None and not args.rtol > 0:
        raise UserError(f"--rtol must be > 0, got {args.rtol}")
    if args.framework is not None and (args.target is not None or args.adapter is not None):
        raise UserError(
            "--framework runs the installed framework's own code: give no MODULE:FUNCTION / --adapter"
        )
    if args.mode is not None and args.framework is None:
        raise UserError("--mode needs --framework")


def _convention(args: argparse.Namespace):
    """The Convention of a check: the profile (with --scale-rewards) and the --flag overrides."""
    from refimpl.conformance.checks import advantage_convention
    from refimpl.conformance.conventions import profile

    name = args.convention or "reference"
    try:
        if args.kind == "group_advantages":
            conv = advantage_convention(name, args.preset)
            if args.scale_rewards is not None:
                conv = profile(name, args.preset or "grpo", scale_rewards=args.scale_rewards)
        else:
            conv = profile(name, args.preset or "grpo", scale_rewards=args.scale_rewards)
    except ValueError as exc:
        raise UserError(_one_line(exc)) from None
    flags = parse_assignments(args.flag, conv, "--flag")
    return _replace(conv, flags, "--flag") if flags else conv


def _variant(args: argparse.Namespace):
    from refimpl.conformance.checks import resolve_preset

    try:
        name, variant = resolve_preset(args.preset, kl_coef=args.kl_coef)
    except (ValueError, TypeError) as exc:
        raise UserError(f"--preset: {_one_line(exc)}") from None
    overrides = parse_assignments(args.variant, variant, "--variant")
    if overrides:
        variant = _replace(variant, overrides, "--variant")
    return name, variant


def _emit(report, as_json: bool) -> int:
    print(json.dumps(report.to_dict(), indent=1) if as_json else report.render())
    return 0 if report.ok else 1


def _run_framework(args: argparse.Namespace) -> int:
    driver = load_framework(args.framework)
    mode = select_mode(driver, args.kind, args.mode, args.preset)
    if args.convention not in (None, "reference"):
        raise UserError(
            "with --framework the convention is the mode's own profile, or --convention reference"
        )
    from refimpl.losses import PolicyLossVariant

    overrides = parse_assignments(args.variant, PolicyLossVariant(), "--variant")
    base = mode_convention(mode, driver.NAME)
    flags = parse_assignments(args.flag, base, "--flag")
    try:
        report = check_framework_mode(
            driver,
            mode,
            reference=args.convention == "reference",
            variant_overrides=overrides,
            flag_overrides=flags,
            rtol=args.rtol,
        )
    except UserError:
        raise
    except Exception as exc:  # the driver could not build or run the framework's code: one line
        raise UserError(f"{driver.NAME} mode {mode.name}: {type(exc).__name__}: {_one_line(exc)}") from None
    return _emit(report, args.json)


def _run(args: argparse.Namespace) -> int:
    from refimpl.conformance import checks

    if args.list_conventions:
        print(json.dumps(conventions_data(), indent=1) if args.json else conventions_text())
        return 0
    _validate(args)
    if args.framework is not None:
        return _run_framework(args)
    rtol = checks.DEFAULT_RTOL if args.rtol is None else args.rtol
    if args.differences:
        if args.preset is None:
            raise UserError("--differences needs --preset")
        _, variant = _variant(args)
        return _emit_differences(checks, variant, _convention(args), args.json)
    if args.target is None:
        raise UserError("give MODULE:FUNCTION (or --framework, --differences, --list-conventions)")
    # the adapter first: it may stub import-only dependencies of the target's package
    adapter = load_object(args.adapter, "--adapter") if args.adapter else None
    fn = load_object(args.target, "FUNCTION")
    conv = _convention(args)
    if args.kind == "policy_loss":
        if args.preset is None:
            raise UserError("--preset is required for --kind policy_loss")
        _, variant = _variant(args)
        report = checks.check_policy_loss(
            fn, variant, convention=conv, adapter=adapter, rtol=rtol, device=args.device or "cpu"
        )
    elif args.kind == "group_advantages":
        report = checks.check_group_advantages(fn, convention=conv, adapter=adapter, rtol=rtol)
    elif args.kind == "kl":
        report = checks.check_kl(fn, args.estimator or "k3", convention=conv, adapter=adapter, rtol=rtol)
    else:
        report = checks.check_token_logprobs(fn, adapter=adapter, rtol=rtol)
    return _emit(report, args.json)


def _emit_differences(checks, variant, conv, as_json: bool) -> int:
    report = checks.convention_differences(variant, conv)
    print(json.dumps(report.to_dict(), indent=1) if as_json else report.render())
    return 0


def run_check(args: argparse.Namespace) -> int:
    """The ``func`` of the ``check`` subcommand: the exit code (user errors: one line, 2)."""
    from refimpl.conformance.checks import SignatureError

    try:
        return _run(args)
    except UserError as exc:
        print(f"refimpl check: {exc}", file=sys.stderr)
        return 2
    except SignatureError as exc:
        print(f"refimpl check: {_one_line(exc)}", file=sys.stderr)
        return 2
    except FrameworkMissing as exc:
        print(f"refimpl check: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, KeyError) as exc:  # a bad value that slipped past validation
        print(f"refimpl check: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 2


def run_matrix(args: argparse.Namespace) -> int:
    """The ``func`` of the ``matrix`` subcommand."""
    from refimpl.conformance.matrix import build_matrix, matrix_markdown

    try:
        frameworks = args.framework or None
        matrix = build_matrix(frameworks)
    except (UserError, ValueError) as exc:
        print(f"refimpl matrix: {exc}", file=sys.stderr)
        return 2
    text = matrix_markdown(matrix)
    if args.check:
        if not args.out:
            print("refimpl matrix: --check needs --out (the committed matrix to compare)", file=sys.stderr)
            return 2
        try:
            with open(args.out) as handle:
                committed = handle.read()
        except OSError as exc:
            print(f"refimpl matrix: cannot read --out: {exc}", file=sys.stderr)
            return 2
        if committed != text:
            print(
                f"refimpl matrix: {args.out} is out of date; regenerate: refimpl matrix --out {args.out}",
                file=sys.stderr,
            )
            return 1
        print(f"{args.out} is up to date")
        return 0
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    else:
        print(text)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(matrix, handle, indent=1)
            handle.write("\n")
    missing = [f["framework"] for f in matrix["frameworks"] if not f["available"]]
    if missing and os.environ.get(REQUIRE_FRAMEWORKS_ENV) == "1":
        print(f"refimpl matrix: required frameworks not installed: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def _one_line_errors(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``check`` and ``matrix`` subcommands (refimpl.cli provider protocol)."""
    from refimpl.conformance.conventions import PROFILE_NAMES

    parser = subparsers.add_parser(
        "check",
        help="check a framework's loss / advantages / KL / log-probs against the reference",
        description="Run the conformance kit on MODULE:FUNCTION (or an installed framework) and print "
        "a table per case class.",
    )
    _one_line_errors(parser, "refimpl check")
    parser.add_argument("target", nargs="?", metavar="MODULE:FUNCTION", help="the function to check")
    parser.add_argument("--kind", choices=_KINDS, default="policy_loss", help="what the function computes")
    parser.add_argument(
        "--preset", help="policy-loss preset (ppo, grpo, dr_grpo, dapo, bnpo, gspo, gspo_token, sapo, cispo)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        metavar="FIELD=VALUE",
        help="override a PolicyLossVariant field of the preset (repeatable), e.g. aggregation=seq_sum",
    )
    parser.add_argument(
        "--convention",
        choices=PROFILE_NAMES,
        default=None,
        help="numerical convention profile (default: the spec; with --framework: the mode's profile)",
    )
    parser.add_argument(
        "--flag",
        action="append",
        metavar="FIELD=VALUE",
        help="override a Convention flag of the profile (repeatable), e.g. adv_leave_one_out=true",
    )
    parser.add_argument(
        "--scale-rewards",
        choices=("group", "batch", "none"),
        default=None,
        help="with --convention trl: TRL's GRPOConfig.scale_rewards (default: TRL's value for the preset)",
    )
    parser.add_argument(
        "--adapter", metavar="MODULE:NAME", help="adapter(fn, ...) mapping the kit's call to your signature"
    )
    parser.add_argument("--framework", help="check the installed framework's own code (trl, verl, openrlhf)")
    parser.add_argument("--mode", help="with --framework: the framework's loss mode (see refimpl matrix)")
    parser.add_argument("--estimator", choices=("k1", "k2", "k3"), default=None, help="for --kind kl (k3)")
    parser.add_argument("--kl-coef", type=float, default=None, help="KL weight (adds the kl_penalty class)")
    parser.add_argument("--device", default=None, help="device the policy loss runs on (e.g. cuda)")
    parser.add_argument("--rtol", type=float, default=None, help="float64 tolerance (default 1e-8)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--differences",
        action="store_true",
        help="print where the convention's numerics differ from the spec for --preset",
    )
    parser.add_argument(
        "--list-conventions",
        action="store_true",
        help="print every convention flag, its value per profile and why",
    )
    parser.set_defaults(func=run_check)

    matrix = subparsers.add_parser(
        "matrix",
        help="framework x mode x case class under each framework's profile and the reference",
        description="Run every installed framework driver's modes and write the conformance matrix.",
    )
    _one_line_errors(matrix, "refimpl matrix")
    matrix.add_argument("--out", help="write the Markdown matrix here (default: stdout)")
    matrix.add_argument("--json", metavar="PATH", help="also write the matrix as JSON")
    matrix.add_argument("--framework", action="append", help="only these frameworks (repeatable)")
    matrix.add_argument(
        "--check", action="store_true", help="compare with --out instead of writing it (CI: exit 1 on drift)"
    )
    matrix.set_defaults(func=run_matrix)


def main(argv: list[str] | None = None) -> int:
    """``python -m refimpl.conformance.cli check ...``: the same subcommands without the other
    providers of ``refimpl`` (useful when a provider of another layer is not installed)."""
    parser = argparse.ArgumentParser(prog="python -m refimpl.conformance.cli")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

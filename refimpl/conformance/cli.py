"""``refimpl check``, ``refimpl conventions`` and ``refimpl matrix``: the kit from the command line.

    refimpl check loss MODULE:FUNCTION --preset dapo [--convention reference|trl|verl|openrlhf]
    refimpl check loss MODULE:FUNCTION --preset grpo --variant aggregation=seq_sum --variant max_length=1
    refimpl check kl MODULE:FUNCTION [--estimator k3]
    refimpl check advantages MODULE:FUNCTION --convention trl [--preset dr_grpo]
    refimpl check advantages MODULE:FUNCTION --flag adv_leave_one_out=true --flag adv_scale=none
    refimpl check logprobs MODULE:FUNCTION
    refimpl check --framework verl --preset dapo [--convention reference]   (the installed framework)
    refimpl check --framework verl --mode vanilla/token-mean [--kind policy_loss]
    refimpl check --differences --preset grpo --convention verl     (spec vs a framework's numerics)
    refimpl conventions [--json]                                    (every flag, per profile, and why)
    refimpl matrix [--json PATH] [--out docs/conformance-matrix.md] [--check]

The earlier spelling ``refimpl check MODULE:FUNCTION --kind KIND`` and ``--list-conventions`` work too.

``check`` prints the table (case class, value ok, gradient ok, max error, departure) and the most
diagnostic failing case in full (``--json``: the same report as JSON); exits 0 when every case
passes, 1 when a case fails, 2 on a user error (one line on stderr, no traceback). The adapter
module is imported before the target, so an adapter can stub import-only dependencies of the
target's package. The current directory is put on ``sys.path`` (as ``python -m`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .cli_args import (
    UserError,
    emit_text,
    load_object,
    one_line,
    one_line_errors,
    parse_assignments,
    replace_fields,
)

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
#: ``refimpl check WORD MODULE:FUNCTION``: the word of each kind
_WORDS = {"loss": "policy_loss", "kl": "kl", "advantages": "group_advantages", "logprobs": "token_logprobs"}
#: exit code of a framework that is not installed, and the variable that makes it a failure (CI)
REQUIRE_FRAMEWORKS_ENV = "RL_ORACLE_REQUIRE_FRAMEWORKS"



def conventions_text() -> str:
    """Every flag with its value in each shipped profile (for the grpo preset, or the framework's
    first where it has none) and the reason."""
    from refimpl.conformance.conventions import FLAG_REASONS, FLAGS
    from refimpl.conformance.profiles import PROFILE_NAMES, listing_profile

    profiles = [listing_profile(name) for name in PROFILE_NAMES]
    lines = []
    for flag in FLAGS:
        values = ", ".join(f"{p.name}={getattr(p, flag)!r}" for p in profiles)
        lines.append(f"{flag}: {values}\n    {FLAG_REASONS.get(flag, '')}")
    return "\n".join(lines)


def conventions_data() -> dict[str, dict]:
    """``{flag: {"reason": ..., profile: value, ...}}`` (``--list-conventions --json``)."""
    from refimpl.conformance.conventions import FLAG_REASONS, FLAGS
    from refimpl.conformance.profiles import PROFILE_NAMES, listing_profile

    profiles = [listing_profile(name) for name in PROFILE_NAMES]
    return {flag: {"reason": FLAG_REASONS.get(flag, ""), **{p.name: getattr(p, flag) for p in profiles}}
            for flag in FLAGS}


# ----------------------------------------------------------------------------------------------
# framework drivers


def load_framework(name: str):
    """The driver of an installed framework; a UserError (exit 2) when unknown or not installed,
    or a failure (exit 1) when ``RL_ORACLE_REQUIRE_FRAMEWORKS=1`` (CI: a skip is a failure)."""
    from refimpl.conformance.frameworks import FRAMEWORKS, load_driver

    if name not in FRAMEWORKS:
        raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {name!r}")
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
    from refimpl.conformance.profiles import advantage_convention, profile

    name = args.convention or "reference"
    try:
        if args.kind == "group_advantages":
            conv = advantage_convention(name, args.preset)
            if args.scale_rewards is not None:
                conv = profile(name, args.preset or "grpo", scale_rewards=args.scale_rewards)
        else:
            conv = profile(name, args.preset or "grpo", scale_rewards=args.scale_rewards)
    except ValueError as exc:
        raise UserError(one_line(exc)) from None
    flags = parse_assignments(args.flag, conv, "--flag")
    return replace_fields(conv, flags, "--flag") if flags else conv


def _variant(args: argparse.Namespace):
    from refimpl.conformance.presets import resolve_preset

    try:
        name, variant = resolve_preset(args.preset, kl_coef=args.kl_coef)
    except (ValueError, TypeError) as exc:
        raise UserError(f"--preset: {one_line(exc)}") from None
    overrides = parse_assignments(args.variant, variant, "--variant")
    if overrides:
        variant = replace_fields(variant, overrides, "--variant")
    return name, variant


def _emit(report, as_json: bool) -> int:
    emit_text(json.dumps(report.to_dict(), indent=1) if as_json else report.render())
    return 0 if report.ok else 1


def _run_framework(args: argparse.Namespace) -> int:
    driver = load_framework(args.framework)
    mode = select_mode(driver, args.kind, args.mode, args.preset)
    if args.convention not in (None, "reference"):
        raise UserError(
            "with --framework the convention is the mode's own profile, or --convention reference"
        )
    from refimpl.conformance.checks import check_framework_mode
    from refimpl.conformance.frameworks import VariantRefused
    from refimpl.conformance.profiles import mode_convention
    from refimpl.losses import PolicyLossVariant

    overrides = parse_assignments(args.variant, PolicyLossVariant(), "--variant")
    base = mode_convention(mode, driver.name)
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
    except (UserError, VariantRefused) as exc:
        raise UserError(one_line(exc)) from None
    except Exception as exc:  # the driver could not build or run the framework's code: one line
        raise UserError(f"{driver.NAME} mode {mode.name}: {type(exc).__name__}: {one_line(exc)}") from None
    return _emit(report, args.json)


def _run(args: argparse.Namespace) -> int:
    from refimpl.conformance import checks

    if args.list_conventions:
        return run_conventions(args)
    _target_words(args)
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


def _target_words(args: argparse.Namespace) -> None:
    """``[WORD] MODULE:FUNCTION`` -> ``args.kind`` and ``args.target`` (WORD: loss, kl, advantages,
    logprobs; without a word, ``--kind`` says which, policy_loss by default)."""
    words = list(args.words or [])
    if words and words[0] in _WORDS:
        kind = _WORDS[words.pop(0)]
        if args.kind not in (None, kind):
            raise UserError(f"--kind {args.kind} contradicts 'refimpl check {words and words[0] or ''}'")
        args.kind = kind
    args.kind = args.kind or "policy_loss"
    if len(words) > 1:
        raise UserError(f"give one MODULE:FUNCTION, got {' '.join(words)}")
    args.target = words[0] if words else None


def run_conventions(args: argparse.Namespace) -> int:
    """``refimpl conventions``: every flag, its value under each profile (grpo preset) and why."""
    emit_text(json.dumps(conventions_data(), indent=1) if args.json else conventions_text())
    return 0


def _emit_differences(checks, variant, conv, as_json: bool) -> int:
    """The spec vs a convention; exits 1 when it prints FAIL (a case class where they differ)."""
    return _emit(checks.convention_differences(variant, conv), as_json)


def run_check(args: argparse.Namespace) -> int:
    """The ``func`` of the ``check`` subcommand: the exit code (user errors: one line, 2)."""
    from refimpl.conformance.checks import SignatureError

    try:
        return _run(args)
    except UserError as exc:
        print(f"refimpl check: {exc}", file=sys.stderr)
        return 2
    except SignatureError as exc:
        print(f"refimpl check: {one_line(exc)}", file=sys.stderr)
        return 2
    except FrameworkMissing as exc:
        print(f"refimpl check: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, KeyError) as exc:  # a bad value that slipped past validation
        print(f"refimpl check: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 2


def _json_text(data) -> str:
    """The normalised JSON text compared by ``refimpl matrix --check`` (NaN equals NaN there)."""
    from refimpl.conformance.matrix import normalised

    return json.dumps(normalised(data), sort_keys=True)


def run_matrix(args: argparse.Namespace) -> int:
    """The ``func`` of the ``matrix`` subcommand."""
    from refimpl.conformance.matrix import build_matrix, matrix_markdown, normalised

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
        regenerate = f"refimpl matrix --out {args.out}" + (f" --json {args.json}" if args.json else "")
        try:
            with open(args.out) as handle:
                committed = handle.read()
            committed_json = None
            if args.json:
                with open(args.json) as handle:
                    committed_json = json.load(handle)
        except (OSError, ValueError) as exc:
            print(f"refimpl matrix: cannot read the committed matrix: {one_line(exc)}", file=sys.stderr)
            return 2
        stale = [args.out] if normalised(committed) != normalised(text) else []
        if args.json and _json_text(committed_json) != _json_text(json.loads(json.dumps(matrix))):
            stale.append(args.json)
        if stale:
            stale_text = " and ".join(stale)
            print(f"refimpl matrix: {stale_text} out of date; regenerate: {regenerate}", file=sys.stderr)
            return 1
        print(f"{' and '.join([args.out] + ([args.json] if args.json else []))} up to date")
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



def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``check``, ``conventions`` and ``matrix`` subcommands (refimpl.cli provider protocol)."""
    from refimpl.conformance.profiles import PROFILE_NAMES

    parser = subparsers.add_parser(
        "check",
        help="check a framework's loss / advantages / KL / log-probs against the reference",
        description="Run the conformance kit on MODULE:FUNCTION (or an installed framework) and print "
        "a table per case class.",
    )
    one_line_errors(parser, "refimpl check")
    parser.add_argument(
        "words",
        nargs="*",
        metavar="{loss,kl,advantages,logprobs} MODULE:FUNCTION",
        help="what the function computes and the function to check",
    )
    parser.add_argument("--kind", choices=_KINDS, default=None, help="(earlier spelling of the word)")
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

    conventions = subparsers.add_parser(
        "conventions",
        help="every convention flag, its value per profile and why",
        description="Print every Convention flag, its value under each shipped profile (grpo) and why.",
    )
    one_line_errors(conventions, "refimpl conventions")
    conventions.add_argument("--json", action="store_true", help="print as JSON")
    conventions.set_defaults(func=run_conventions)

    matrix = subparsers.add_parser(
        "matrix",
        help="framework x mode x case class under each framework's profile and the reference",
        description="Run every installed framework driver's modes and write the conformance matrix.",
    )
    one_line_errors(matrix, "refimpl matrix")
    matrix.add_argument("--out", help="write the Markdown matrix here (default: stdout)")
    matrix.add_argument(
        "--json", metavar="PATH", help="also write the matrix as JSON (with --check: compare it too)"
    )
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

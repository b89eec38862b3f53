"""``refimpl check``, ``refimpl conventions`` and ``refimpl matrix``: the kit from the command line.

    refimpl check loss MODULE:FUNCTION --preset dapo [--convention reference|trl|verl|openrlhf|...]
    refimpl check loss MODULE:FUNCTION --preset grpo --variant aggregation=seq_mean_token_sum
    refimpl check loss ../elsewhere/losses.py:dapo_loss --preset dapo     (MODULE may be a file path)
    refimpl check kl MODULE:FUNCTION [--estimator k3]
    refimpl check advantages MODULE:FUNCTION --convention trl [--preset dr_grpo]
    refimpl check advantages MODULE:FUNCTION --flag adv_leave_one_out=true --flag adv_scale=none
    refimpl check logprobs MODULE:FUNCTION
    refimpl check framework verl [--kind kl] [--device cuda]       (every mode of the installed verl)
    refimpl check framework verl --preset dapo [--convention reference]   (the mode of a preset)
    refimpl check --framework verl --mode vanilla/token-mean [--device cuda]   (the same, other spelling)
    refimpl check differences --preset grpo --convention verl       (spec vs a framework's numerics)
    refimpl conventions [--preset P] [--json]                       (every flag, per profile, and why)
    refimpl matrix [--out docs/conformance-matrix.md] [--json docs/conformance-matrix.json] [--check]

Each ``check`` subcommand takes only the options that fit it (``cli_args.CHECK_SUBCOMMANDS``). The
earlier spellings ``refimpl check MODULE:FUNCTION [--kind KIND]``, ``check --differences`` and
``check --list-conventions`` still work, with a one-line note naming the current one.

``check`` prints the table (case class, value ok, gradient ok, max error, departure) and the most
diagnostic failing case in full (``--json``: the same report as JSON); exits 0 when every case
passes, 1 when a case fails, 2 on a user error (one line on stderr, no traceback). The adapter
module is imported before the target, so an adapter can stub import-only dependencies of the
target's package. The current directory is put on ``sys.path`` (as ``python -m`` does).
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli_args import (
    KIND_WORDS,
    FrameworkMissing,
    UserError,
    add_check_subcommands,
    earlier_spelling,
    emit_text,
    load_framework,
    load_object,
    mode_kind,
    one_line,
    one_line_errors,
    parse_assignments,
    replace_fields,
    select_mode,
)
from .matrix_check import run_matrix

__all__ = [
    "register",
    "load_object",
    "run_function",
    "run_framework",
    "run_differences",
    "run_conventions",
    "run_matrix",
    "conventions_text",
    "conventions_data",
    "parse_assignments",
    "UserError",
    "main",
]




def _profiles(preset: str) -> list:
    """The shipped profiles for ``preset`` (a framework without an equivalent of it is left out)."""
    from refimpl.conformance.profiles import PROFILE_NAMES, profile

    out = []
    for name in PROFILE_NAMES:
        try:
            out.append(profile(name, preset))
        except ValueError:
            continue
    return out


def conventions_text(preset: str = "grpo") -> str:
    """Every flag with its value in each shipped profile (for ``preset``) and the reason."""
    from refimpl.conformance.conventions import FLAG_REASONS, FLAGS

    profiles = _profiles(preset)
    lines = []
    for flag in FLAGS:
        values = ", ".join(f"{p.name}={getattr(p, flag)!r}" for p in profiles)
        lines.append(f"{flag}: {values}\n    {FLAG_REASONS.get(flag, '')}")
    return "\n".join(lines)


def conventions_data(preset: str = "grpo") -> dict[str, dict]:
    """``{flag: {"reason": ..., profile: value, ...}}`` (``refimpl conventions --json``)."""
    from refimpl.conformance.conventions import FLAG_REASONS, FLAGS

    profiles = _profiles(preset)
    return {flag: {"reason": FLAG_REASONS.get(flag, ""), **{p.name: getattr(p, flag) for p in profiles}}
            for flag in FLAGS}


# ----------------------------------------------------------------------------------------------
# refimpl check WHAT


def _convention(args: argparse.Namespace):
    """The Convention of a check: the profile (with --scale-rewards) and the --flag overrides."""
    from refimpl.conformance.profiles import advantage_convention, profile

    name, preset = args.convention or "reference", getattr(args, "preset", None)
    scale_rewards = getattr(args, "scale_rewards", None)
    try:
        if args.kind == "group_advantages" and scale_rewards is None:
            conv = advantage_convention(name, preset)
        else:
            conv = profile(name, preset or "grpo", scale_rewards=scale_rewards)
    except ValueError as exc:
        raise UserError(one_line(exc)) from None
    flags = parse_assignments(args.flag, conv, "--flag")
    return replace_fields(conv, flags, "--flag") if flags else conv


def _variant(args: argparse.Namespace):
    from refimpl.conformance.presets import resolve_preset

    try:
        name, variant = resolve_preset(args.preset, kl_coef=getattr(args, "kl_coef", None))
    except (ValueError, TypeError) as exc:
        raise UserError(f"--preset: {one_line(exc)}") from None
    overrides = parse_assignments(args.variant, variant, "--variant")
    if overrides:
        variant = replace_fields(variant, overrides, "--variant")
    return name, variant


def _device(args: argparse.Namespace):
    """``--device`` as a torch.device (default cpu); one line when torch cannot use it here."""
    import torch

    text = getattr(args, "device", None) or "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"--device {text!r}: {one_line(exc)}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {text}: CUDA is not available here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _emit(report, as_json: bool) -> int:
    emit_text(json.dumps(report.to_dict(), indent=1) if as_json else report.render())
    return 0 if report.ok else 1


def run_function(args: argparse.Namespace) -> int:
    """``refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION``."""
    from refimpl.conformance import checks

    rtol = checks.DEFAULT_RTOL if args.rtol is None else args.rtol
    # the adapter first: it may stub import-only dependencies of the target's package
    adapter = load_object(args.adapter, "--adapter") if args.adapter else None
    fn = load_object(args.target, "FUNCTION")
    common = {"adapter": adapter, "rtol": rtol, "device": _device(args)}
    if args.kind == "token_logprobs":
        report = checks.check_token_logprobs(fn, **common)
    elif args.kind == "kl":
        report = checks.check_kl(fn, args.estimator, convention=_convention(args), **common)
    elif args.kind == "group_advantages":
        report = checks.check_group_advantages(fn, convention=_convention(args), **common)
    else:
        conv, (_, variant) = _convention(args), _variant(args)
        report = checks.check_policy_loss(fn, variant, convention=conv, **common)
    return _emit(report, args.json)


def run_kind_function(args: argparse.Namespace) -> int:
    """``refimpl check kind KIND MODULE:FUNCTION [--flag F=V]``: a function of a registry kind
    (``kinds.KIND_REGISTRY``) against the spec, or the spec with the kind's flags changed."""
    from refimpl.conformance import checks
    from refimpl.conformance.kinds import get_kind, run_kind_check

    kind = get_kind(args.registry_kind)
    adapter = load_object(args.adapter, "--adapter") if args.adapter else None
    fn = load_object(args.target, "FUNCTION")
    flags = parse_assignments(args.flag, kind.flags(), "--flag")
    try:
        flags = kind.make_flags(flags)
    except (TypeError, ValueError) as exc:
        raise UserError(f"--flag: {one_line(exc)}") from None
    rtol = checks.DEFAULT_RTOL if args.rtol is None else args.rtol
    return _emit(run_kind_check(kind, fn, flags, adapter=adapter, rtol=rtol, device=_device(args)), args.json)


def run_framework(args: argparse.Namespace) -> int:
    """``refimpl check framework F [--mode M | --preset P]`` (also ``check --framework F``); without
    either, every mode of the framework (of ``--kind``)."""
    if getattr(args, "repro", None):
        return _write_repros(args.framework, args.repro)
    driver = load_framework(args.framework)
    if args.convention not in (None, "reference", driver.name):
        raise UserError("with --framework the convention is the mode's own profile, or --convention "
                        "reference")
    device = _device(args)
    if args.mode is None and args.preset is None and not (
        args.kind not in (None, "policy_loss") and len(driver.modes(args.kind)) == 1
    ):
        return _run_every_mode(driver, args, device)
    mode = select_mode(driver, args.kind or mode_kind(driver, args.mode), args.mode, args.preset)
    return _emit(_framework_report(driver, mode, args, device), args.json)


def _write_repros(framework: str, directory: str) -> int:
    """``refimpl check framework F --repro DIR``: one standalone script per bug finding of F (they
    need the framework only when run, not to be written)."""
    from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS
    from refimpl.conformance.frameworks.repro import unscripted, write_repros

    names = FRAMEWORKS + EXTRA_FRAMEWORKS
    if framework not in names:
        raise UserError(f"framework must be one of {', '.join(names)}, got {framework!r}")
    try:
        paths = write_repros(framework, directory)
    except (FileExistsError, OSError) as exc:
        raise UserError(one_line(exc)) from None
    for path in paths:
        print(path)
    if not paths:
        print(f"{framework}: no bug finding to reproduce (refimpl matrix lists every finding)")
    missing = unscripted(framework)
    if missing:
        print(f"{framework}: no script yet for {', '.join(missing)} (refimpl matrix describes them)",
              file=sys.stderr)
    return 0


def _framework_report(driver, mode, args: argparse.Namespace, device):
    from refimpl.conformance.checks import check_framework_mode
    from refimpl.conformance.frameworks import VariantRefused
    from refimpl.conformance.kinds import KIND_REGISTRY
    from refimpl.conformance.profiles import mode_convention
    from refimpl.losses import PolicyLossVariant

    overrides = parse_assignments(args.variant, PolicyLossVariant(), "--variant")
    if mode.kind in KIND_REGISTRY:  # a registry kind: its own flags
        if overrides:
            raise UserError(f"--variant: a {mode.kind} mode has no PolicyLossVariant; use --flag")
        own = KIND_REGISTRY[mode.kind].make_flags(dict(mode.convention))
        flags = parse_assignments(args.flag, own, "--flag")
    else:
        flags = parse_assignments(args.flag, mode_convention(mode, driver.name), "--flag")
    try:
        return check_framework_mode(
            driver, mode, reference=args.convention == "reference", variant_overrides=overrides,
            flag_overrides=flags, rtol=args.rtol, device=device,
        )
    except (UserError, VariantRefused) as exc:
        raise UserError(one_line(exc)) from None
    except Exception as exc:  # the driver could not build or run the framework's code: one line
        raise UserError(f"{driver.name} mode {mode.name}: {type(exc).__name__}: {one_line(exc)}") from None


def _run_every_mode(driver, args: argparse.Namespace, device) -> int:
    """Every mode in scope, one line each, then each failing mode's report in full; exit 1 when one
    fails (``--json``: every mode's report)."""
    if args.variant or args.flag:
        raise UserError("--variant / --flag change one mode: give --mode or --preset")
    modes = [m for m in driver.all_modes() if args.kind in (None, m.kind)]
    reports = [(m, _framework_report(driver, m, args, device)) for m in modes]
    ok = all(r.ok for _, r in reports)
    if args.json:
        emit_text(json.dumps({"framework": driver.name, "version": driver.installed_version(), "ok": ok,
                              "modes": [{"kind": m.kind, "mode": m.name, "report": r.to_dict()}
                                        for m, r in reports]}, indent=1))
        return 0 if ok else 1
    where = "" if device.type == "cpu" else f", on {device}"
    lines = [f"framework {driver.name} {driver.installed_version()} (source sha256 {driver.source_hash()}): "
             f"{len(reports)} modes{where}, " + ("under the reference" if args.convention == "reference"
                                                  else "each under its own profile"), ""]
    kinds = max((len(m.kind) for m in modes), default=0)
    names = max((len(m.name) for m in modes), default=0)
    lines += [f"{'ok  ' if r.ok else 'FAIL'}  {m.kind:{kinds}}  {m.name:{names}}  {len(r.results)} cases"
              for m, r in reports]
    lines += [text for _, r in reports if not r.ok for text in ("", r.render())]
    failing = [m.name for m, r in reports if not r.ok]
    lines += ["", f"FAIL: modes {', '.join(failing)}" if failing else f"PASS: {len(reports)} modes"]
    emit_text("\n".join(lines))
    return 0 if ok else 1


def run_differences(args: argparse.Namespace) -> int:
    """``refimpl check differences --preset P --convention C``: the spec vs a convention; exits 1
    when it prints FAIL (a case class where they differ)."""
    from refimpl.conformance.checks import DEFAULT_RTOL, convention_differences

    args.kind = "policy_loss"
    _, variant = _variant(args)
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    return _emit(convention_differences(variant, _convention(args), rtol=rtol), args.json)


def run_conventions(args: argparse.Namespace) -> int:
    """``refimpl conventions``: every flag, its value under each profile (for --preset) and why."""
    preset = getattr(args, "preset", None) or "grpo"
    emit_text(json.dumps(conventions_data(preset), indent=1) if args.json else conventions_text(preset))
    return 0


def _no_subcommand(args: argparse.Namespace) -> int:
    raise UserError("say what to check: refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION, "
                    "refimpl check framework FRAMEWORK, or refimpl check differences (--help for more)")


def guarded(func, prog: str):
    """``func`` returning its exit code, with a user error as one line on stderr (exit 2), a
    required framework that is missing as one line (exit 1) and a Ctrl-C as one line (exit 130).
    The checked code runs under ``user_code``'s settings: ``--timeout`` per call, the hard stop of
    a call stuck in compiled code, and a progress line per case class on stderr when stderr is a
    terminal and ``--json`` is off."""

    def run(args: argparse.Namespace) -> int:
        from refimpl.conformance import user_code
        from refimpl.conformance.checks import SignatureError

        def note(line: str) -> None:
            print(f"{prog}: {line}", file=sys.stderr, flush=True)

        show = sys.stderr.isatty() and not getattr(args, "json", False)
        timeout = getattr(args, "timeout", None) or user_code.DEFAULT_TIMEOUT
        try:
            with user_code.settings(timeout=timeout, hard_stop=True, progress=note if show else None):
                return func(args)
        except KeyboardInterrupt:  # Ctrl-C (a KeyboardInterrupt of the checked code fails its case)
            print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            return 130
        except (UserError, SignatureError) as exc:
            print(f"{prog}: {one_line(exc)}", file=sys.stderr)
            return 2
        except FrameworkMissing as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
        except (ValueError, TypeError, KeyError) as exc:  # a bad value that slipped past the parsers
            print(f"{prog}: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
            return 2

    return run


def _check_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``refimpl check``: a subcommand per thing to check; earlier spellings are rewritten to the
    current ones before parsing, with a one-line note on stderr (``cli_args.earlier_spelling``)."""
    prog = "refimpl check"
    parser = subparsers.add_parser(
        "check",
        help="check a loss / KL / advantages / log-probs, or an installed framework, against the reference",
        description="Run the conformance kit and print a table per case class: "
        "refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION, refimpl check kind KIND MODULE:FUNCTION "
        "(gae, value_loss, whitening), refimpl check framework FRAMEWORK "
        "(or --framework FRAMEWORK), refimpl check differences --preset P --convention C.",
    )
    one_line_errors(parser, prog)
    funcs = {word: guarded(run_function, f"{prog} {word}") for word in KIND_WORDS}
    funcs.update(kind=guarded(run_kind_function, f"{prog} kind"),
                 framework=guarded(run_framework, f"{prog} framework"),
                 differences=guarded(run_differences, f"{prog} differences"),
                 conventions=guarded(run_conventions, "refimpl conventions"))
    add_check_subcommands(parser, funcs, prog)
    parser.set_defaults(func=guarded(_no_subcommand, prog))
    parse_known = parser.parse_known_args

    def parse_current_spelling(args=None, namespace=None):
        args, note = earlier_spelling(list(sys.argv[1:] if args is None else args))
        if note is not None:
            print(f"{prog}: note: {note}", file=sys.stderr)
        return parse_known(args, namespace)

    parser.parse_known_args = parse_current_spelling  # type: ignore[method-assign]
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``check``, ``conventions`` and ``matrix`` subcommands (refimpl.cli provider protocol)."""
    _check_parser(subparsers)

    conventions = subparsers.add_parser(
        "conventions",
        help="every convention flag, its value per profile and why",
        description="Print every Convention flag, its value under each shipped profile and why.",
    )
    one_line_errors(conventions, "refimpl conventions")
    conventions.add_argument("--preset", default="grpo", help="the profiles of this preset (default grpo)")
    conventions.add_argument("--json", action="store_true", help="print as JSON")
    conventions.set_defaults(func=guarded(run_conventions, "refimpl conventions"))

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
    matrix.add_argument(
        "--partial", action="store_true",
        help="write what was measured even where a framework is not installed or --out holds more",
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

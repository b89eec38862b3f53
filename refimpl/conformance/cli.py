"""``refimpl check``: run the conformance kit on a user's function from the command line.

    refimpl check MODULE:FUNCTION --preset dapo [--convention reference|trl|verl] [--adapter MODULE:NAME]
    refimpl check MODULE:FUNCTION --kind kl --estimator k3
    refimpl check MODULE:FUNCTION --kind group_advantages --convention trl
    refimpl check MODULE:FUNCTION --kind token_logprobs
    refimpl check --differences --preset grpo --convention verl     (spec vs a framework's numerics)
    refimpl check --list-conventions                                  (every flag, per profile, and why)

Prints the table (case class, value ok, gradient ok, max error) and the smallest failing case in
full; exits 0 when every case passes, 1 when a case fails, 2 on usage errors (argparse).
The current directory is put on ``sys.path`` (as ``python -m`` does) so local modules import.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

__all__ = ["register", "load_object", "run_check", "conventions_text", "main"]

_KINDS = ("policy_loss", "group_advantages", "kl", "token_logprobs")


def load_object(spec: str, what: str) -> Callable:
    """Import ``MODULE:NAME`` (NAME may be dotted, e.g. ``pkg.mod:Class.method``)."""
    if ":" not in spec:
        raise ValueError(f"{what} must be MODULE:NAME, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{what} {spec!r} is not callable")
    return obj


def conventions_text() -> str:
    """Every flag with its value in each shipped profile (for the grpo preset) and the reason."""
    import dataclasses

    from refimpl.conformance.conventions import FLAG_REASONS, PROFILE_NAMES, profile

    profiles = [profile(name, "grpo") for name in PROFILE_NAMES]
    lines = []
    for field in dataclasses.fields(profiles[0]):
        if field.name == "name":
            continue
        values = ", ".join(f"{p.name}={getattr(p, field.name)!r}" for p in profiles)
        lines.append(f"{field.name}: {values}\n    {FLAG_REASONS[field.name]}")
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    """The ``func`` of the ``check`` subcommand: returns the exit code."""
    from refimpl.conformance import checks

    if args.list_conventions:
        print(conventions_text())
        return 0
    if args.scale_rewards is not None:  # TRL's GRPOConfig.scale_rewards refines the trl profile
        from refimpl.conformance.conventions import profile

        try:
            args.convention = profile(
                args.convention, args.preset or "grpo", scale_rewards=args.scale_rewards
            )
        except ValueError as exc:
            print(f"refimpl check: {exc}", file=sys.stderr)
            return 2
    if args.differences:
        if args.preset is None:
            print("refimpl check: --differences needs --preset", file=sys.stderr)
            return 2
        report = checks.convention_differences(args.preset, args.convention, kl_coef=args.kl_coef)
        print(report.render())
        return 0
    if args.target is None:
        print("refimpl check: give MODULE:FUNCTION (or --differences)", file=sys.stderr)
        return 2
    try:
        fn = load_object(args.target, "FUNCTION")
        adapter = load_object(args.adapter, "--adapter") if args.adapter else None
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        print(f"refimpl check: cannot load: {exc}", file=sys.stderr)
        return 2
    if args.kind == "policy_loss":
        if args.preset is None:
            print("refimpl check: --preset is required for --kind policy_loss", file=sys.stderr)
            return 2
        report = checks.check_policy_loss(
            fn,
            args.preset,
            convention=args.convention,
            adapter=adapter,
            kl_coef=args.kl_coef,
            rtol=args.rtol,
            device=args.device,
        )
    elif args.kind == "group_advantages":
        report = checks.check_group_advantages(
            fn, convention=args.convention, adapter=adapter, rtol=args.rtol
        )
    elif args.kind == "kl":
        report = checks.check_kl(
            fn, args.estimator, convention=args.convention, adapter=adapter, rtol=args.rtol
        )
    else:
        report = checks.check_token_logprobs(fn, rtol=args.rtol)
    print(report.render())
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``check`` subcommand (refimpl.cli provider protocol)."""
    from refimpl.conformance.checks import DEFAULT_RTOL
    from refimpl.conformance.conventions import PROFILE_NAMES

    parser = subparsers.add_parser(
        "check",
        help="check a framework's loss / advantages / KL / log-probs against the reference",
        description="Run the conformance kit on MODULE:FUNCTION and print a table per case class.",
    )
    parser.add_argument("target", nargs="?", metavar="MODULE:FUNCTION", help="the function to check")
    parser.add_argument("--kind", choices=_KINDS, default="policy_loss", help="what the function computes")
    parser.add_argument(
        "--preset", help="policy-loss preset (ppo, grpo, dr_grpo, dapo, bnpo, gspo, gspo_token, sapo, cispo)"
    )
    parser.add_argument(
        "--convention",
        choices=PROFILE_NAMES,
        default="reference",
        help="numerical convention profile (default: the spec)",
    )
    parser.add_argument(
        "--scale-rewards",
        choices=("group", "batch", "none"),
        default=None,
        help="with --convention trl: TRL's GRPOConfig.scale_rewards (default: TRL's value for the preset)",
    )
    parser.add_argument(
        "--adapter", metavar="MODULE:NAME", help="adapter(fn, call) mapping the kit's call to your signature"
    )
    parser.add_argument("--estimator", choices=("k1", "k2", "k3"), default="k3", help="for --kind kl")
    parser.add_argument("--kl-coef", type=float, default=None, help="KL weight (adds the kl_penalty class)")
    parser.add_argument("--device", default="cpu", help="device the policy loss runs on (e.g. cuda)")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="float64 tolerance")
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


def main(argv: list[str] | None = None) -> int:
    """``python -m refimpl.conformance.cli check ...``: the same subcommand without the other
    providers of ``refimpl`` (useful when a provider of another layer is not installed)."""
    parser = argparse.ArgumentParser(prog="python -m refimpl.conformance.cli")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

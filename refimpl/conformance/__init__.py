"""The conformance kit: check another framework's RL-for-LLM losses against the reference.

In the spirit of Wycheproof: every edge case named (case classes), every expected value from the
verified reference (itself pinned to 50-digit golden vectors generated from the sympy specs), and
the numerical choices on which frameworks legitimately differ written as data (``Convention``
flags; each framework's profile kept with its driver). See docs/conformance.md.

    from refimpl.conformance import check_loss
    report = check_loss(my_loss, "dapo")                 # or convention="trl" / "verl" / "openrlhf"
    print(report)                                        # table + smallest failing case
    assert report.ok
    report.case_class("empty_rows").ok                   # one case class; classes=(...) runs only those

The layers, each importing only those below it: cases, conventions, presets, report (data) ->
expected (the one interpreter of a convention) and tolerance -> engine (the one check loop),
policy_check, simple_checks, diagnosis -> frameworks (drivers) and profiles -> checks (this API)
-> matrix -> cli. Command line: ``refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION``,
``refimpl check --framework F [--mode M]``, ``refimpl conventions``, ``refimpl matrix``.
"""

from refimpl.conformance.cases import CASE_CLASSES, POLICY_CASE_CLASSES, clip_bounds, policy_loss_cases
from refimpl.conformance.checks import (
    DEFAULT_RTOL,
    PolicyLossCall,
    SignatureError,
    case_classes,
    check_advantages,
    check_framework,
    check_group_advantages,
    check_kl,
    check_logprobs,
    check_loss,
    check_policy_loss,
    check_token_logprobs,
    contract_adapter,
    convention_differences,
    reference_policy_loss_fn,
    resolve_preset,
)
from refimpl.conformance.conventions import FLAG_REASONS, FLAGS, Convention, convention_from_flags
from refimpl.conformance.expected import effective_variant, expected_policy_loss
from refimpl.conformance.profiles import PROFILE_NAMES, framework_config, profile, unsupported_flags
from refimpl.conformance.report import CaseResult, CheckReport, ClassResult
from refimpl.conformance.tolerance import half_tolerance

__all__ = [
    "CASE_CLASSES",
    "POLICY_CASE_CLASSES",
    "clip_bounds",
    "policy_loss_cases",
    "DEFAULT_RTOL",
    "PolicyLossCall",
    "SignatureError",
    "half_tolerance",
    "case_classes",
    "check_loss",
    "check_kl",
    "check_advantages",
    "check_logprobs",
    "check_framework",
    "check_group_advantages",
    "check_policy_loss",
    "check_token_logprobs",
    "contract_adapter",
    "convention_differences",
    "reference_policy_loss_fn",
    "resolve_preset",
    "FLAG_REASONS",
    "FLAGS",
    "PROFILE_NAMES",
    "Convention",
    "convention_from_flags",
    "framework_config",
    "profile",
    "unsupported_flags",
    "effective_variant",
    "expected_policy_loss",
    "CaseResult",
    "CheckReport",
    "ClassResult",
]

"""The conformance kit: check another framework's RL-for-LLM losses against the reference.

In the spirit of Wycheproof: every edge case named (case classes), every expected value from the
verified reference (itself pinned to 50-digit golden vectors generated from the sympy specs), and
the numerical choices on which frameworks legitimately differ written as data (``Convention``
flags, with shipped ``trl`` and ``verl`` profiles). See docs/conformance.md.

    from refimpl.conformance import check_policy_loss
    report = check_policy_loss(my_loss, "dapo")          # or convention="trl" / "verl"
    print(report)                                        # table + smallest failing case
    assert report.ok

Command line: ``refimpl check MODULE:FUNCTION --preset dapo [--convention trl] [--adapter M:NAME]``
(``--variant``, ``--flag``, ``--json``; ``--framework trl|verl|openrlhf`` for the installed
frameworks) and ``refimpl matrix`` (framework x mode x case class, ``refimpl.conformance.matrix``).
Half-precision cases are judged with a bound from the compute dtype's unit roundoff
(``half_tolerance``); a function that cannot be called raises ``SignatureError`` before any case.
"""

from refimpl.conformance.cases import POLICY_CASE_CLASSES, clip_bounds, policy_loss_cases
from refimpl.conformance.checks import (
    DEFAULT_RTOL,
    PolicyLossCall,
    SignatureError,
    check_group_advantages,
    check_kl,
    check_policy_loss,
    check_token_logprobs,
    contract_adapter,
    convention_differences,
    half_tolerance,
    reference_policy_loss_fn,
    resolve_preset,
)
from refimpl.conformance.conventions import (
    FLAG_REASONS,
    PROFILE_NAMES,
    Convention,
    framework_config,
    profile,
    unsupported_flags,
)
from refimpl.conformance.expected import effective_variant, expected_policy_loss
from refimpl.conformance.report import CheckReport

__all__ = [
    "POLICY_CASE_CLASSES",
    "clip_bounds",
    "policy_loss_cases",
    "DEFAULT_RTOL",
    "PolicyLossCall",
    "SignatureError",
    "half_tolerance",
    "check_group_advantages",
    "check_kl",
    "check_policy_loss",
    "check_token_logprobs",
    "contract_adapter",
    "convention_differences",
    "reference_policy_loss_fn",
    "resolve_preset",
    "FLAG_REASONS",
    "PROFILE_NAMES",
    "Convention",
    "framework_config",
    "profile",
    "unsupported_flags",
    "effective_variant",
    "expected_policy_loss",
    "CheckReport",
]

"""The pytest plugin of rl-oracle: the conformance kit inside a framework's own test suite.

One line per function in the framework's tests expands into one pytest test per case class:

    # tests/test_conformance.py of your project
    from refimpl.pytest_plugin import advantage_tests, kl_tests, logprob_tests, loss_tests

    test_dapo_loss = loss_tests("mypkg.losses:dapo_loss", preset="dapo")
    test_grpo_advantages = advantage_tests("mypkg.advantages:grpo_advantages")

collects ``test_dapo_loss[inside_clip]``, ``test_dapo_loss[on_boundary]``, ... (select them with
``-k`` or ``-m rl_oracle``). A failing case class fails its test with an ``AssertionError`` whose
message names the smallest failing case, the expected and obtained values, the case in full and
as one line of Python (``CheckReport.failure_message``); the other classes still pass.

Each helper returns an ordinary test function parametrised by ``case_class``, so pytest's marks,
``-k`` and plugins apply as to any test, and it runs even where the plugin is not loaded. The
plugin (entry point ``pytest11`` named ``rl_oracle``, loaded by every pytest run in an environment
where rl-oracle is installed) only registers the ``rl_oracle`` marker and prints these failures as
their message, without a traceback into the kit. This module imports nothing but pytest, so a test
run that does not use it pays nothing; the kit (and torch) is imported when a test module calls a
helper, and so is a target (or adapter) given as ``"module:function"``: one that cannot be imported
or has no such attribute is one collection error of the test module naming it (the reason in one
line), not a failure of every case class. The import and every call of the checked code go through
the kit's ``refimpl.conformance.user_code`` (``sys.exit`` or a hang in it fails a case, never the
run).
"""

from __future__ import annotations

import dataclasses
import pkgutil
from collections.abc import Callable, Sequence

import pytest

__all__ = ["ConformanceFailure", "loss_tests", "kl_tests", "advantage_tests", "logprob_tests"]

MARKER = "rl_oracle"


class ConformanceFailure(AssertionError):
    """A case class of the conformance kit failed (or the function does not fit the contract); the
    message says why (``CheckReport.failure_message``)."""


# ------------------------------------------------------------------------------------------------
# the plugin's hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: one case class of the rl-oracle conformance kit (refimpl.pytest_plugin)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A ``ConformanceFailure`` is shown as its message (what ``pytest.fail(..., pytrace=False)``
    shows), unless ``--full-trace`` or ``--tb=native`` asks for the traceback."""
    outcome = yield
    if call.excinfo is None or not isinstance(call.excinfo.value, ConformanceFailure):
        return
    if item.config.getoption("fulltrace", False) or item.config.getoption("tbstyle", "auto") == "native":
        return
    longrepr = call.excinfo.getrepr(style="value", tbfilter=False, chain=False)
    if getattr(longrepr, "reprcrash", None) is not None:  # the summary line: the message's first line
        first = str(call.excinfo.value).split("\n", 1)[0]
        longrepr.reprcrash = dataclasses.replace(longrepr.reprcrash, message=first)
    outcome.get_result().longrepr = longrepr


# ------------------------------------------------------------------------------------------------
# the helpers a test module calls


def loss_tests(
    target: str | Callable,
    preset,
    *,
    convention="reference",
    adapter: str | Callable | None = None,
    classes: Sequence[str] | None = None,
    kl_coef: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Callable:
    """Tests of a policy loss, one per case class (``refimpl.conformance.check_loss``).

    Args:
        target: the loss, or ``"module:function"`` (imported when the tests run), with the contract
            signature ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None)``
            unless ``adapter`` maps the kit's call to it.
        preset: a preset name ("dapo", "grpo", ...) or a ``PolicyLossVariant``.
        convention: "reference" (the spec), "trl", "verl", "openrlhf" or a ``Convention``.
        adapter: ``adapter(fn, call: PolicyLossCall) -> loss``, or ``"module:name"``.
        classes: the case classes to test (default: those that have a case for the preset under
            the convention, ``applicable_case_classes``: e.g. ``kl_penalty`` with a KL term,
            ``golden_vectors`` under the reference convention).
        kl_coef, rtol, seed, device: as ``check_loss`` (``rtol`` None: the kit's default).
    Returns:
        a test function parametrised by ``case_class``: assign it to a ``test_*`` name.
    """
    from refimpl.conformance import check_loss
    from refimpl.conformance.checks import applicable_case_classes

    # a bad preset or convention fails here, at collection
    applicable = applicable_case_classes(preset, convention=convention, kl_coef=kl_coef, seed=seed)

    def run(fn, adapter_fn, case_class):
        return check_loss(
            fn, preset, convention=convention, adapter=adapter_fn, classes=(case_class,),
            kl_coef=kl_coef, rtol=_rtol(rtol), seed=seed, device=device,
        )

    return _case_class_tests(target, adapter, _chosen(classes, applicable, "policy_loss"), run)


def kl_tests(
    target: str | Callable,
    estimator: str = "k3",
    *,
    convention="reference",
    adapter: str | Callable | None = None,
    classes: Sequence[str] | None = None,
    rtol: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Callable:
    """Tests of a per-token KL estimator ``fn(logp, ref_logp) -> [N, T]`` (k1 / k2 / k3), one per
    case class (``refimpl.conformance.check_kl``); arguments as ``loss_tests``."""
    from refimpl.conformance import case_classes, check_kl, profile

    if estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    profile(convention)  # an unknown convention fails at collection

    def run(fn, adapter_fn, case_class):
        return check_kl(
            fn, estimator, convention=convention, adapter=adapter_fn, rtol=_rtol(rtol), seed=seed,
            classes=(case_class,), device=device,
        )

    return _case_class_tests(target, adapter, _chosen(classes, case_classes("kl"), "kl"), run)


def advantage_tests(
    target: str | Callable,
    *,
    convention="reference",
    preset: str | None = None,
    adapter: str | Callable | None = None,
    classes: Sequence[str] | None = None,
    rtol: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Callable:
    """Tests of group advantages ``fn(rewards [N], group_ids [N]) -> [N]``, one per case class
    (``refimpl.conformance.check_advantages``; ``preset`` picks the convention's advantage flags
    for that preset, e.g. "dr_grpo"); other arguments as ``loss_tests``."""
    from refimpl.conformance import case_classes, check_advantages
    from refimpl.conformance.profiles import advantage_convention

    advantage_convention(convention, preset)  # an unknown convention or preset fails at collection

    def run(fn, adapter_fn, case_class):
        return check_advantages(
            fn, convention=convention, preset=preset, adapter=adapter_fn, rtol=_rtol(rtol), seed=seed,
            classes=(case_class,), device=device,
        )

    kind = "group_advantages"
    return _case_class_tests(target, adapter, _chosen(classes, case_classes(kind), kind), run)


def logprob_tests(
    target: str | Callable,
    *,
    adapter: str | Callable | None = None,
    classes: Sequence[str] | None = None,
    rtol: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Callable:
    """Tests of token log-probs ``fn(logits [N, T, V], tokens [N, T]) -> [N, T]``, one per case
    class (``refimpl.conformance.check_logprobs``); arguments as ``loss_tests``."""
    from refimpl.conformance import case_classes, check_logprobs

    def run(fn, adapter_fn, case_class):
        return check_logprobs(
            fn, adapter=adapter_fn, rtol=_rtol(rtol), seed=seed, classes=(case_class,), device=device
        )

    kind = "token_logprobs"
    return _case_class_tests(target, adapter, _chosen(classes, case_classes(kind), kind), run)


# ------------------------------------------------------------------------------------------------


def _rtol(rtol: float | None) -> float:
    from refimpl.conformance import DEFAULT_RTOL

    return DEFAULT_RTOL if rtol is None else rtol


def _chosen(classes: Sequence[str] | None, applicable: Sequence[str], kind: str) -> list[str]:
    """``applicable`` (kit order), or ``classes`` when given (ValueError naming unknown ones)."""
    from refimpl.conformance import case_classes

    if classes is None:
        return list(applicable)
    if isinstance(classes, str):
        raise TypeError(f"classes must be a sequence of case class names, got the string {classes!r}")
    unknown = [c for c in classes if c not in case_classes(kind)]
    if unknown or not classes:
        raise ValueError(f"classes: unknown case classes {unknown}; valid: {', '.join(case_classes(kind))}")
    return list(dict.fromkeys(classes))


def _label(target: str | Callable) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__name__)}"


def _resolve(target: str | Callable, what: str) -> Callable:
    """The function of ``"module:function"`` (``pkgutil.resolve_name``, its import run as user code),
    or ``target`` itself. One that cannot be imported or resolved fails the collection of the test
    module in one line naming it (``pytest.fail(..., pytrace=False)``)."""
    if not isinstance(target, str):
        return target
    from refimpl.conformance.user_code import UserCodeFailure, guarded

    reason = None
    try:
        found = guarded(lambda: pkgutil.resolve_name(target), "its import")
    except UserCodeFailure as exc:  # sys.exit, a hang...
        reason = str(exc)
    except Exception as exc:  # ImportError, AttributeError, ValueError (a malformed name)...
        reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if reason is not None:  # outside the except clause: no chained traceback in pytest's report
        pytest.fail(f"rl-oracle: the {what} {target!r} cannot be resolved: {reason}", pytrace=False)
    if not callable(found):
        pytest.fail(f"rl-oracle: the {what} {target!r} is not callable (a {type(found).__name__})",
                    pytrace=False)
    return found


def _hidden_unless_skipped(excinfo: pytest.ExceptionInfo) -> bool:
    return not excinfo.errisinstance(pytest.skip.Exception)


def _case_class_tests(target, adapter, classes: list[str], run: Callable) -> Callable:
    """The test function: ``run(fn, adapter, case_class)`` gives the class's ``CheckReport``; a
    failing class raises ``ConformanceFailure`` with the report's failure message, a class without
    a case is skipped (never passed empty)."""
    for value, what in ((target, "target"), (adapter, "adapter")):
        if not (value is None and what == "adapter") and not (isinstance(value, str) or callable(value)):
            raise TypeError(f"{what} must be a callable or 'module:function', got {type(value).__name__}")
    label = _label(target)
    fn, adapter_fn = _resolve(target, "target"), None if adapter is None else _resolve(adapter, "adapter")

    @pytest.mark.rl_oracle
    @pytest.mark.parametrize("case_class", classes)
    def conformance_test(case_class: str) -> None:
        __tracebackhide__ = _hidden_unless_skipped  # a skip is located here, not in pytest
        from refimpl import __version__
        from refimpl.conformance import SignatureError

        try:
            report = run(fn, adapter_fn, case_class)
        except SignatureError as exc:
            raise ConformanceFailure(f"{label} does not fit the contract: {exc}") from None
        if not any(r.case_class == case_class for r in report.results):
            pytest.skip(f"no case of class {case_class} applies to {label} ({report.title})")
        if not report.case_class(case_class).ok:
            raise ConformanceFailure(
                f"{report.failure_message(case_class)}\nchecked: {label} with rl-oracle {__version__} "
                f"(tolerances: refimpl.conformance.tolerance)"
            )

    conformance_test.__doc__ = f"rl-oracle conformance of {label}, one case class per test."
    return conformance_test

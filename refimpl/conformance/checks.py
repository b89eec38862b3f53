"""The checks, as a Python API: each returns a ``CheckReport`` (what ``refimpl check`` prints is its
rendering; ``report.ok``, ``report.by_class()``, ``report.case_class(name)``, ``report.to_dict()``).

    from refimpl.conformance import check_loss
    report = check_loss(my_loss, "dapo")                 # convention="trl", classes=("empty_rows",), ...
    assert report.ok, report.render()

``check_loss`` (= ``check_policy_loss``), ``check_kl``, ``check_advantages`` (=
``check_group_advantages``), ``check_logprobs`` (= ``check_token_logprobs``) check a function
(through an optional adapter: ``contract.SIGNATURES``); ``check_framework`` checks an installed
framework's own code through its driver; ``convention_differences`` shows where a convention's
numerics depart from the spec. Every check can be restricted to some case classes (``classes=``,
names in ``case_classes(kind)``): one class is cheap to run on its own. Names of conventions
("reference", "trl", "verl", "openrlhf") are resolved here (``profiles.profile``); the loops live in
``policy_check`` and ``simple_checks``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from refimpl.losses import PolicyLossVariant, policy_loss

from .cases import CASE_CLASSES, policy_loss_cases
from .contract import PolicyLossCall, SignatureError, contract_adapter
from .conventions import Convention
from .diagnosis import explained_by_rerun
from .expected import convention_loss, convention_normalizer, effective_variant
from .frameworks import FRAMEWORKS, Driver, Mode, load_driver
from .golden import golden_cases
from .kinds import KIND_REGISTRY, attribute, run_kind_check
from .policy_check import differences_report, run_policy_check
from .presets import resolve_preset
from .profiles import advantage_convention, mode_convention, profile
from .profiles import framework_config as _framework_config
from .report import CheckReport
from .simple_checks import run_advantage_check, run_kl_check, run_logprob_check
from .tolerance import DEFAULT_RTOL

__all__ = [
    "DEFAULT_RTOL",
    "PolicyLossCall",
    "SignatureError",
    "contract_adapter",
    "case_classes",
    "applicable_case_classes",
    "check_loss",
    "check_policy_loss",
    "check_kl",
    "check_advantages",
    "check_group_advantages",
    "check_logprobs",
    "check_token_logprobs",
    "check_framework",
    "check_framework_mode",
    "framework_header",
    "convention_differences",
    "reference_policy_loss_fn",
    "resolve_preset",
]


def case_classes(kind: str = "policy_loss") -> tuple[str, ...]:
    """The case classes of ``kind`` ("policy_loss", "kl", "group_advantages", "token_logprobs"), in
    report order (for a policy loss, ``kl_penalty`` runs only with a KL term), or of a registry kind
    ("gae", "value_loss", "whitening", ...: ``kinds.KIND_REGISTRY``)."""
    if kind in KIND_REGISTRY:
        return KIND_REGISTRY[kind].case_classes()
    if kind not in CASE_CLASSES:
        raise ValueError(f"kind must be one of {tuple(CASE_CLASSES) + tuple(KIND_REGISTRY)}, got {kind!r}")
    return CASE_CLASSES[kind]


def applicable_case_classes(
    preset: str | PolicyLossVariant,
    *,
    convention: str | Convention = "reference",
    kl_coef: float | None = None,
    seed: int = 0,
) -> tuple[str, ...]:
    """The policy-loss case classes that have a case for ``preset`` under ``convention``, in report
    order: those ``check_policy_loss`` runs by default (e.g. ``kl_penalty`` only with a KL term,
    ``golden_vectors`` only under the reference convention and when a vector has the variant)."""
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    v = effective_variant(variant, conv)
    present = {case.case_class for case in policy_loss_cases(v, conv, seed=seed)}
    if conv == Convention() and golden_cases(v):
        present.add("golden_vectors")
    return tuple(c for c in CASE_CLASSES["policy_loss"] if c in present)


def check_policy_loss(
    fn: Callable,
    preset: str | PolicyLossVariant,
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    classes: tuple[str, ...] | None = None,
    kl_coef: float | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    device: torch.device | str = "cpu",
    explain: dict | None = None,
    framework_config: dict | None = None,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """Check a user's policy loss against ``preset`` under ``convention`` on every case class.

    Args:
        fn: the user's loss function (called through ``adapter``).
        preset: a preset name ("dapo", "grpo", ...) or a ``PolicyLossVariant``.
        convention: "reference" (the spec), a framework's name ("trl", "verl", "openrlhf") or a
            ``Convention``.
        adapter: ``adapter(fn, call: PolicyLossCall) -> scalar loss``; default ``contract_adapter``.
        classes: restrict to these case classes (default: all that apply; ``case_classes()``).
        kl_coef: override the preset's KL weight (> 0 adds the ``kl_penalty`` class).
        rtol: float64 tolerance (``refimpl.conformance.tolerance``).
        device: where the check runs (e.g. "cuda"): the function's inputs are moved there, and the
            expected values are computed in float64 on the same device (its ``exp`` and ``log``,
            so that a ratio it rounds off a clip bound is off it in the reference too); both are
            judged on the CPU.
        explain: convention flags ({flag: value}, e.g. a framework mode's profile) tried first on
            each failing class's smallest case: a flag (or all of them together) that reproduces
            the function's loss and gradient is named in ``CaseResult.explanation``; None tries
            the other aggregations, common flags and the shipped profiles ("diagnosis").
        framework_config: ``call.config["framework_config"]`` (default: the trl / verl keys
            under those profiles, else ``{}``).
        header: lines printed above the report (e.g. the framework's version and source hash).

    Under the reference convention the class ``golden_vectors`` adds the 50-digit vectors of
    ``specs/vectors/policy_loss.json`` whose variant equals the checked one (when the file exists).

    Raises:
        SignatureError (a TypeError): the function cannot be called on the plainest case or does
            not return a scalar tensor (the expected signature is in the message).
    Returns:
        a ``CheckReport``; ``report.ok`` is True when every case passed.
    """
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    v = effective_variant(variant, conv)
    if framework_config is None:
        framework_config = {}
        if conv.name in ("trl", "verl"):
            try:
                framework_config = _framework_config(conv.name, name, v)
            except (KeyError, ValueError):
                framework_config = {}
    candidates = ()
    if explain is None:
        shipped = []
        for framework in FRAMEWORKS:
            try:
                shipped.append((f"the {framework!r} profile", v, profile(framework, name)))
            except ValueError:
                continue
        candidates = tuple(shipped)
    return run_policy_check(
        fn, name, v, conv, adapter=adapter, classes=classes, rtol=rtol, seed=seed, device=device,
        explain=explain, candidates=candidates, framework_config=framework_config, header=header,
    )


def check_group_advantages(
    fn: Callable,
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    preset: str | None = None,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """Check ``fn(rewards [N], group_ids [N]) -> advantages [N]`` (or ``adapter(fn, rewards,
    group_ids)``) against ``group_advantages`` with the convention's advantage flags. ``preset``
    selects the profile's flags for that preset (under the reference ``dr_grpo`` sets
    ``adv_scale="none"``). A case where the convention raises (e.g. TRL's singleton groups) expects
    the function to raise too. Values only. ``device`` as in ``check_policy_loss``. Raises
    SignatureError as ``check_policy_loss``."""
    conv = advantage_convention(convention, preset)
    return run_advantage_check(
        fn, conv, adapter=adapter, rtol=rtol, seed=seed, classes=classes, header=header, device=device
    )


def check_kl(
    fn: Callable,
    estimator: str = "k3",
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """Check a per-token KL estimator ``fn(logp, ref_logp) -> [N, T]`` (or ``adapter(fn, logp,
    ref_logp)``; k1 / k2 / k3 of kl.md with ``log r = ref_logp - logp``; the convention's KL flags)
    by value and by its gradient in logp. ``device`` as in ``check_policy_loss``. Raises
    SignatureError as ``check_policy_loss``."""
    if estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    conv = profile(convention)
    return run_kl_check(
        fn, estimator, conv, adapter=adapter, rtol=rtol, seed=seed, classes=classes, header=header,
        device=device,
    )


def check_token_logprobs(
    fn: Callable,
    *,
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """Check ``fn(logits [N, T, V], tokens [N, T]) -> [N, T]`` (or ``adapter(fn, logits, tokens)``)
    against the float64 ``log_softmax(logits).gather(tokens)`` and its gradient in the logits (for a
    fixed cotangent). ``device`` as in ``check_policy_loss``. Raises SignatureError as
    ``check_policy_loss``."""
    return run_logprob_check(
        fn, adapter=adapter, rtol=rtol, seed=seed, classes=classes, header=header, device=device
    )


check_loss = check_policy_loss
check_advantages = check_group_advantages
check_logprobs = check_token_logprobs


def convention_differences(
    preset: str | PolicyLossVariant,
    convention: str | Convention,
    *,
    kl_coef: float | None = None,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
) -> CheckReport:
    """Where and by how much ``convention`` departs from the spec for ``preset``: for every case,
    the expected loss and gradient under the convention compared with those of the reference
    convention (same inputs; errors normalised as in the checks). A "FAIL" row is a case class on
    which the framework's numerics differ from the spec by more than ``rtol``."""
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    v_conv, v_ref = effective_variant(variant, conv), effective_variant(variant, Convention())
    return differences_report(name, v_conv, v_ref, conv, seed=seed, rtol=rtol)


def reference_policy_loss_fn(
    variant: PolicyLossVariant, convention: Convention | str = "reference", preset: str = "grpo"
) -> Callable:
    """Our own implementation of ``variant`` under ``convention`` with the contract signature
    ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None) -> loss``: plain
    ``policy_loss`` for the reference convention, the flag interpreter otherwise."""
    conv = profile(convention, preset)
    v = effective_variant(variant, conv)
    if conv == Convention():

        def reference(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
            kwargs = {"ref_logp": ref_logp} if ref_logp is not None and v.kl_coef > 0 else {}
            return policy_loss(logp, old_logp, advantages, mask, v, normalizer=normalizer, **kwargs)[0]

        return reference

    def with_convention(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
        mask = mask.bool()
        denominator = normalizer if normalizer is not None else convention_normalizer(mask, v, conv)
        # refimpl refuses an inf term (a ratio past float32 under a KL importance weight): evaluate in
        # float64 there, the exact values whose non-finite counterparts the flag names
        if conv.ratio_overflow == "nan" and logp.dtype != torch.float64:
            ref_logp = None if ref_logp is None else ref_logp.double()
            logp, old_logp, advantages = logp.double(), old_logp.double(), advantages.double()
        return convention_loss(logp, old_logp, advantages, mask, ref_logp, v, conv, denominator)

    return with_convention


# ------------------------------------------------------------------------------------------------
# installed frameworks


_GENERATED_CLASSES = tuple(c for c in CASE_CLASSES["policy_loss"] if c != "golden_vectors")


def framework_header(driver: Driver, mode: Mode) -> tuple[str, ...]:
    """Lines naming the framework, its installed version (a warning when it is not the pinned one),
    the hash of the source files the driver runs, and the mode."""
    version = driver.installed_version()
    lines = [
        f"framework {driver.name} {version} (source sha256 {driver.source_hash()}), "
        f"mode {mode.name}" + (f": {mode.description}" if mode.description else "")
    ]
    if version != driver.pinned_version:
        lines.append(
            f"warning: {driver.name} {version} is installed; the profiles describe {driver.pinned_version}"
        )
    return tuple(lines)


def check_framework_mode(
    driver: Driver, mode: Mode, *, reference: bool, variant_overrides=None, flag_overrides=None, rtol=None,
    device: torch.device | str = "cpu", classes: tuple[str, ...] | None = None,
) -> CheckReport:
    """Run the kit on one framework mode under its profile (or the reference, with every departure
    explained by the mode's flags or ``unexplained``). ``variant_overrides`` go through
    ``Driver.variant`` (a field the mode fixes is refused: ``VariantRefused``). ``device``: where the
    mode runs and its expected values are computed (``check_policy_loss``); ``classes``: only these
    case classes (default: all; under the reference never the golden vectors)."""
    rtol = DEFAULT_RTOL if rtol is None else rtol
    if mode.kind in KIND_REGISTRY:
        return check_kind_mode(driver, mode, reference=reference, flag_overrides=flag_overrides, rtol=rtol,
                               device=device, classes=classes)
    variant = driver.variant(mode, variant_overrides)
    conv = Convention() if reference else mode_convention(mode, driver.name)
    if flag_overrides:
        conv = dataclasses.replace(conv, **flag_overrides)
    fn, adapter = driver.target(mode.kind, mode, variant)
    header = framework_header(driver, mode)
    if reference and mode.kind == "policy_loss":  # departures are named on the generated classes (the
        # golden vectors repeat them with 1e12 magnitudes and a normaliser of their own)
        classes = tuple(c for c in (classes or _GENERATED_CLASSES) if c != "golden_vectors")
    if mode.kind == "policy_loss":
        return check_policy_loss(
            fn,
            variant,
            convention=conv,
            adapter=adapter,
            rtol=rtol,
            device=device,
            explain=dict(mode.convention) if reference else None,
            classes=classes,
            framework_config=dict(mode.framework_config),
            header=header,
        )
    if mode.kind == "kl":

        def run(c):
            return run_kl_check(
                fn, variant.kl_estimator, c, adapter=adapter, rtol=rtol, header=header, device=device,
                classes=classes,
            )

    elif mode.kind == "group_advantages":

        def run(c):
            return run_advantage_check(
                fn, c, adapter=adapter, rtol=rtol, header=header, device=device, classes=classes
            )

    else:
        raise ValueError(f"mode {mode.name!r} has kind {mode.kind!r}, which no checker takes")
    report = run(conv)
    if reference and not report.ok and not flag_overrides:
        report = explained_by_rerun(report, conv, dict(mode.convention), run)
    return report


def check_kind_mode(driver: Driver, mode: Mode, *, reference: bool, flag_overrides=None, rtol=DEFAULT_RTOL,
                    device: torch.device | str = "cpu", classes: tuple[str, ...] | None = None
                    ) -> CheckReport:
    """A mode of a registry kind (kinds/): under its profile (the mode's flags), or under the spec
    with each failing class attributed to the smallest set of the mode's flags that reproduces it."""
    kind = KIND_REGISTRY[mode.kind]
    fn, adapter = driver.target(mode.kind, mode)
    header = framework_header(driver, mode)

    def run(flags: dict) -> CheckReport:
        return run_kind_check(kind, fn, {**flags, **(flag_overrides or {})}, adapter=adapter, rtol=rtol,
                              header=header, device=device, classes=classes)

    if not reference:
        return run(dict(mode.convention))
    report = run({})
    return report if report.ok or flag_overrides else attribute(report, dict(mode.convention), run)


def check_framework(
    framework: str,
    mode: str | None = None,
    *,
    kind: str = "policy_loss",
    preset: str | None = None,
    reference: bool = False,
    variant: dict | None = None,
    flags: dict | None = None,
    rtol: float | None = None,
    device: torch.device | str = "cpu",
) -> CheckReport:
    """Check an installed framework's own code (``refimpl check --framework``): ``mode`` of
    ``kind`` (or the mode of ``preset``) under its own profile, or under the spec with each
    departure named (``reference=True``). ``variant``: PolicyLossVariant fields to change (those
    the mode fixes are refused); ``flags``: Convention flags to change; ``device``: where the mode
    runs (e.g. "cuda"; the expected values are computed in float64 on the same device). Raises
    ValueError (one line) when the framework is unknown or not drivable here, or the mode is out of
    scope."""
    driver = load_driver(framework)
    reason = driver.availability()
    if reason is not None:
        raise ValueError(f"framework {framework} is not available: {reason}")
    if mode is not None:
        chosen = driver.mode(kind, mode)
    elif preset is not None:
        chosen = driver.preset_mode(kind, preset)
    else:
        modes = driver.modes(kind)
        if kind == "policy_loss" or len(modes) != 1:
            raise ValueError(f"check_framework needs mode (one of {', '.join(modes)}) or preset")
        chosen = next(iter(modes.values()))
    return check_framework_mode(
        driver, chosen, reference=reference, variant_overrides=variant, flag_overrides=flags, rtol=rtol,
        device=device,
    )

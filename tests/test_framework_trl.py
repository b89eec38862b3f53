"""The TRL driver and the TRL profile, against the installed TRL (``GRPOTrainer._compute_loss``).

Expected values come from our reference implementation with the profile's flags applied
(``refimpl.conformance.expected``), never from TRL. Each mode passes every case class under its own
profile; each TRL-specific flag is necessary (dropping it fails the classes it explains) and
sufficient to float64 rounding (it reproduces TRL's value, not just within the kit's 1e-8);
micro-batches use TRL's own gradient-accumulation normalisation; a NaN at a masked position
reaches TRL's loss in every mode. Skipped with a message when TRL cannot be imported.
"""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch

from refimpl.conformance import POLICY_CASE_CLASSES, Convention, check_policy_loss, convention_differences
from refimpl.conformance.cases import policy_loss_cases
from refimpl.conformance.checks import resolve_preset
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.expected import convention_normalizer, effective_variant, expected_policy_loss
from refimpl.conformance.frameworks import Mode, load_driver, source_hash
from refimpl.conformance.kinks import TIE_NOTE
from refimpl.conformance.profiles import framework_config, profile
from refimpl.losses import PRESETS, policy_loss

trl = load_driver("trl")
pytestmark = pytest.mark.framework

MODES = sorted(trl.modes())
# checked to the half-precision bound (compute_dtype); dual_clip_tie's inputs are float32 and judged as
# computed in float32 (a class only with a dual clip, GRPOConfig.delta)
HALF_CLASSES = ("bf16", "fp16", "half_overflow", "dual_clip_tie", "ratio_overflow")
CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors")
# float64 classes with finite inputs: TRL reproduces the profile there to float64 rounding. The
# masked_nonfinite class (NaN / inf at masked positions) passes only as the named departure
# masked_nonfinite='propagate' (TRL's loss is NaN there; see test_nonfinite_at_masked_positions...).
# zero_rows: a batch of 0 rows, TRL's mean over rows is NaN there (the named departure zero_rows='nan')
FLOAT64_CLASSES = tuple(c for c in CLASSES
                        if c not in HALF_CLASSES and c not in ("masked_nonfinite", "zero_rows"))
EPS64 = torch.finfo(torch.float64).eps
# float64 agreement that counts as "reproduces exactly": each loss is a sum of <= 30 terms of a few
# rounded operations (exp, clamp, products), so a few hundred ulps at most; TRL's largest measured
# departure from the profile is 1.2e-14, and the smallest departure a flag explains is 1.3e-8 (sapo).
EXACT = 1e-12


@pytest.fixture(scope="module")
def installed():
    reason = trl.availability()
    if reason is not None:
        pytest.skip(f"TRL is not drivable here: {reason}")
    return trl


def variant_of(mode: str, kl: float | None = None):
    return resolve_preset(trl.mode_variant(mode), kl_coef=kl)[1]


def check_mode(mode: str, *, kl: float | None = None, drop: tuple[str, ...] = (), classes=CLASSES, rtol=1e-8):
    """check_policy_loss of TRL's own loss in ``mode`` under the mode's profile less ``drop``."""
    flags = {k: v for k, v in trl.modes()[mode].convention.items() if k not in drop}
    variant = variant_of(mode, kl)
    fn, adapter = trl.target("policy_loss", mode, variant)
    conv = convention_from_flags("trl", flags)
    return check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=classes, rtol=rtol)


def max_errors(report, classes=FLOAT64_CLASSES) -> tuple[float, float]:
    rows = [r for r in report.results if r.case_class in classes]
    assert rows and not any(r.departure for r in rows), [r.case_id for r in rows if r.departure]
    return max(r.value_error for r in rows), max(r.grad_error for r in rows)


def departures(report) -> dict[str, str]:
    """case id -> the named departure under which it passed."""
    return {r.case_id: r.departure for r in report.departures()}


# ----------------------------------------------------------------------------------------------
# every mode passes every case class under its own profile


@pytest.mark.parametrize("mode", MODES)
def test_trl_passes_every_case_class_under_its_profile(installed, mode):
    report = check_mode(mode)
    assert report.ok, report.render()
    # no TRL mode has a dual clip (delta None): the dual_clip_tie class is empty
    assert {c.case_class for c in report.by_class()} == set(CLASSES) - {"kl_penalty", "dual_clip_tie"}
    # and reproduces the profile to float64 rounding, far inside the kit's 1e-8
    assert max(max_errors(report)) <= EXACT, max_errors(report)
    # the only departures are the NaN losses of masked_nonfinite (every case of the class), fp16
    # overflow under compute_dtype='input', the NaN gradient of a closed gate on an inf ratio
    # (ratio_overflow) and the NaN mean over a batch without rows (zero_rows)
    named = departures(report)
    nonfinite = {r.case_id for r in report.results if r.case_class == "masked_nonfinite"}
    assert nonfinite and {k for k, v in named.items() if v == "masked_nonfinite='propagate'"} == nonfinite
    assert set(named.values()) <= {"masked_nonfinite='propagate'", "compute_dtype='input' (overflow)",
                                   "ratio_overflow='nan'", "zero_rows='nan'"}
    assert all(k.startswith(("half_overflow/", "ratio_overflow/"))
               for k, v in named.items() if v.startswith("compute_dtype"))
    assert all(k.startswith(v.split("=")[0]) for k, v in named.items() if v.startswith(("ratio_", "zero_")))


@pytest.mark.parametrize("mode", MODES)
def test_trl_with_beta_passes_under_its_profile(installed, mode):
    """beta > 0 adds TRL's k3 term weighted by the importance ratio (use_bias_correction_kl)."""
    report = check_mode(mode, kl=0.1, classes=tuple(c for c in CLASSES if c != "kl_penalty"))
    assert report.ok, report.render()
    assert max(max_errors(report)) <= EXACT, max_errors(report)


def _kl_rounding_floor(case, variant, conv) -> float:
    """Rounding bound of d(beta r k3)/d logp in float64: the product rule adds r k3 and r k3', which
    cancel to O(r |log r|) when |log r| is large (k3 ~ e^|log r|), so each float64 gradient carries an
    absolute error of a few eps times beta r (k3 + |k3'|) weighted as the loss weights that token
    (the weight is d loss / d kl of policy_loss(kl=...)); 16 eps covers exp, the two products and the
    sum, summed over the tokens (a row's sequence ratio spreads over the row)."""
    mask = case.mask
    zero = torch.zeros((), dtype=torch.float64)
    log_r = torch.where(mask, case.ref_logp - case.logp, zero)
    log_ratio = torch.where(mask, case.logp - case.old_logp, zero)
    if variant.ratio == "sequence_mean":
        log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1).expand_as(log_r)
    k3, dk3 = torch.expm1(log_r) - log_r, torch.expm1(log_r)
    terms = variant.kl_coef * torch.exp(log_ratio) * (k3.abs() + dk3.abs())
    kl = torch.zeros_like(case.logp, requires_grad=True)
    unit_kl = dataclasses.replace(variant, kl_coef=1.0)
    denominator = max(convention_normalizer(mask, variant, conv), 1.0)
    loss, _ = policy_loss(case.logp, case.old_logp, case.advantages, mask, unit_kl, kl=kl,
                          normalizer=denominator)
    (weight,) = torch.autograd.grad(loss, kl)
    return 16 * EPS64 * float((torch.where(mask, terms, zero) * weight.abs()).sum())


def test_trls_k3_term_is_the_naive_form(installed):
    """TRL's per-token KL is exp(log r) - log r - 1 evaluated directly (flag kl_k3_form='naive'): with
    A = 0 and logp = old_logp (ratio 1) the dapo loss is beta times the token mean of k3, which at
    |log r| <= 1e-6 (float64) is off the accurate k3's mean by more than 1e-5 relative (cancellation),
    yet within 4 u beta mean(e^|log r| + |log r| + 1) (u = 2^-53: the roundings near 1) of it and of
    the kit's expected value under the profile."""
    assert all(m.convention["kl_k3_form"] == "naive" for m in trl.modes().values())
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5
    log_r = (torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5) * 2e-6
    variant = variant_of("dapo", 1.0)
    fn, adapter = trl.target("policy_loss", "dapo", variant)
    mask = torch.ones_like(logp, dtype=torch.bool)
    call = SimpleNamespace(logp=logp.clone().requires_grad_(True), old_logp=logp.clone(),
                           advantages=torch.zeros(4, dtype=torch.float64), mask=mask, ref_logp=logp + log_r,
                           normalizer=None)
    got = float(adapter(fn, call).detach())
    accurate = float((torch.expm1(log_r) - log_r).mean())
    case = policy_loss_cases(variant, Convention(), classes=("inside_clip",))[0]
    case = dataclasses.replace(case, logp=logp, old_logp=logp.clone(), ref_logp=logp + log_r, mask=mask,
                               advantages=torch.zeros(4, dtype=torch.float64), micro_batches=None)
    conv = convention_from_flags("trl", trl.modes()["dapo"].convention)
    expected, _ = expected_policy_loss(case, effective_variant(variant, conv), conv)
    bound = 4 * EPS64 / 2 * float((torch.exp(log_r.abs()) + log_r.abs() + 1).mean())
    assert abs(got - accurate) > 1e-5 * accurate
    assert abs(got - accurate) <= bound and abs(got - float(expected)) <= bound


@pytest.mark.parametrize("mode", MODES)
def test_trl_kl_penalty_class_within_its_rounding(installed, mode):
    """The kl_penalty class (|log r| up to 24) under the profile, to the bound of ``_kl_rounding_floor``:
    TRL and the float64 reference both round terms of size beta e^24 r / D whose sum is O(1)."""
    conv = convention_from_flags("trl", trl.modes()[mode].convention)
    variant = effective_variant(variant_of(mode, 0.1), conv)
    fn, adapter = trl.target("policy_loss", mode, variant)
    for case in policy_loss_cases(variant, conv, classes=("kl_penalty",)):
        exp_loss, exp_grad = expected_policy_loss(case, variant, conv)
        logp = case.logp.clone().requires_grad_(True)
        call = SimpleNamespace(logp=logp, old_logp=case.old_logp, advantages=case.advantages, mask=case.mask,
                               ref_logp=case.ref_logp, normalizer=None)
        loss = adapter(fn, call)
        (grad,) = torch.autograd.grad(loss, logp)
        assert abs(float(loss.detach()) - float(exp_loss)) <= EXACT * abs(float(exp_loss))
        floor = _kl_rounding_floor(case, variant, conv)
        assert float((grad - exp_grad).abs().max()) <= EXACT * float(exp_grad.abs().max()) + floor
        assert floor < 1e-5 * float(exp_grad.abs().max())  # the bound is a check, not a pass


# ----------------------------------------------------------------------------------------------
# each flag is needed (dropping it fails what it explains) and explains exactly


@pytest.mark.parametrize(
    ("mode", "kl", "flag", "classes"),
    [
        ("sapo", None, "sapo_tau_float32", {"inside_clip", "outside_clip", "extreme_log_ratio", "ragged"}),
        # an empty step has no token, hence no KL term to weight
        ("grpo", 0.1, "kl_importance_weight", set(FLOAT64_CLASSES) - {"kl_penalty", "empty_step"}),
        ("gspo", 0.1, "kl_importance_weight", set(FLOAT64_CLASSES) - {"kl_penalty", "empty_step"}),
        ("grpo", None, "empty_rows", {"empty_rows", "micro_batch"}),
        ("sapo", None, "empty_rows", {"empty_rows", "micro_batch"}),
        ("gspo", None, "empty_rows", {"empty_rows", "micro_batch"}),
        ("dr_grpo", None, "token_sum_rows", {"empty_rows", "micro_batch"}),
        ("bnpo", None, "micro_batch", {"micro_batch"}),
        ("luspo", None, "token_sum_rows", {"empty_rows", "micro_batch"}),
    ],
)
def test_each_trl_flag_is_needed(installed, mode, kl, flag, classes):
    report = check_mode(mode, kl=kl, drop=(flag,), classes=FLOAT64_CLASSES)
    assert classes <= set(report.failing_classes()), report.failing_classes()


@pytest.mark.parametrize("mode", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_trl_delta_is_the_dual_clip(installed, mode):
    """GRPOConfig.delta (INTELLECT-2: coef_1 clamped above at delta) is refimpl's dual clip: with
    variant.dual_clip = delta TRL passes every float64 class, on_boundary at delta included."""
    variant = dataclasses.replace(variant_of(mode), dual_clip=1.01 if mode == "gspo" else 3.0)
    assert trl.grpo_config_kwargs(mode, variant)["delta"] == variant.dual_clip
    conv = convention_from_flags("trl", trl.modes()[mode].convention)
    fn, adapter = trl.target("policy_loss", mode, variant)
    report = check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=FLOAT64_CLASSES)
    assert report.ok, report.render()
    assert max(max_errors(report)) <= EXACT
    # the extreme class reaches ratios beyond delta with A < 0: expecting no dual clip fails there
    loose = dataclasses.replace(variant, dual_clip=None)
    report = check_policy_loss(fn, loose, convention=conv, adapter=adapter, classes=("extreme_log_ratio",))
    assert not report.ok
    if variant.ratio == "token":
        # float32 r exactly delta (A < 0): torch.clamp passes the whole gradient at its bound, as the
        # spec's inclusive gate does (dual_clip_tie='inclusive', TRL's profile leaves it unset)
        report = check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=("dual_clip_tie",))
        assert report.ok and report.by_class() and not report.departures(), report.render()
        # expecting the tie's midpoint, TRL's whole gradient is the other end of the kink's
        # subdifferential (policy_losses.md section 3): it passes, noted as a subgradient
        half = dataclasses.replace(conv, dual_clip_tie="half")
        report = check_policy_loss(fn, variant, convention=half, adapter=adapter, classes=("dual_clip_tie",))
        noted = [r for r in report.results if r.departure == TIE_NOTE]
        assert report.ok and noted and all(r.grad_error > 0.1 for r in noted), report.render()


def test_sapo_float32_temperature_is_the_whole_departure(installed):
    """TRL's sapo departs from the float64 spec by 1e-8 .. 1e-5 (temperatures built as a float32
    tensor by torch.where from Python floats: tau_neg = 1.05 -> 1.0499999523); rounding tau to
    float32 in the reference reproduces TRL to float64 rounding."""
    without = max_errors(check_mode("sapo", drop=("sapo_tau_float32",), classes=FLOAT64_CLASSES))
    with_flag = max_errors(check_mode("sapo", classes=FLOAT64_CLASSES))
    assert 1e-8 < without[0] < 1e-5
    assert max(with_flag) <= EXACT
    assert effective_variant(variant_of("sapo"), profile("trl", "sapo")).tau_neg == float(
        torch.tensor(1.05, dtype=torch.float32)
    )


@pytest.mark.parametrize("mode", MODES)
def test_trl_departs_from_the_spec_exactly_where_the_differences_report_says(installed, mode):
    """Under the reference convention TRL fails precisely the float64 classes on which the profile
    departs from the spec (``convention_differences``)."""
    variant = variant_of(mode)
    conv = convention_from_flags("trl", trl.modes()[mode].convention)
    expected = convention_differences(variant, conv, seed=0).failing_classes()
    fn, adapter = trl.target("policy_loss", mode, variant)
    report = check_policy_loss(fn, variant, convention="reference", adapter=adapter, classes=FLOAT64_CLASSES)
    assert report.failing_classes() == [c for c in expected if c in FLOAT64_CLASSES]


# ----------------------------------------------------------------------------------------------
# micro-batches: TRL's gradient accumulation (current_gradient_accumulation_steps, num_items_in_batch)


def _micro_batch_calls(case, logp):
    """One call per micro-batch with the issue-10 fields (index, count, global counts)."""
    parts = case.micro_batches
    for k, rows in enumerate(parts):
        i = torch.tensor(rows)
        yield SimpleNamespace(
            logp=logp[i], old_logp=case.old_logp[i], advantages=case.advantages[i], mask=case.mask[i],
            ref_logp=None if case.ref_logp is None else case.ref_logp[i], normalizer=None,
            micro_batch_index=k, micro_batch_count=len(parts), global_tokens=int(case.mask.sum()),
            global_sequences=int(case.mask.any(-1).sum()), global_rows=int(case.mask.shape[0]),
        )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kl", [None, 0.1])
def test_micro_batches_use_trls_gradient_accumulation(installed, mode, kl):
    """TRL's micro-batch losses (divided by the accumulation steps, or by num_items_in_batch for
    dapo / cispo) summed equal the profile's micro-batch loss and gradient; grpo / sapo / gspo /
    bnpo differ from the spec's global normaliser on these cases (so the comparison can fail)."""
    conv = convention_from_flags("trl", trl.modes()[mode].convention)
    variant = effective_variant(variant_of(mode, kl), conv)
    fn, adapter = trl.target("policy_loss", mode, variant)
    for case in policy_loss_cases(variant, conv, classes=("micro_batch",)):
        exp_loss, exp_grad = expected_policy_loss(case, variant, conv)
        logp = case.logp.clone().requires_grad_(True)
        loss = sum(adapter(fn, call) for call in _micro_batch_calls(case, logp))
        (grad,) = torch.autograd.grad(loss, logp)
        assert abs(float(loss.detach()) - float(exp_loss)) <= EXACT * abs(float(exp_loss))
        assert float((grad - exp_grad).abs().max()) <= EXACT * float(exp_grad.abs().max())
    if conv.micro_batch == "local_mean" and mode != "dr_grpo":
        first = policy_loss_cases(variant, conv, classes=("micro_batch",))[0]
        spec_loss, _ = expected_policy_loss(first, effective_variant(variant_of(mode, kl), Convention()),
                                            Convention())
        logp = first.logp.clone().requires_grad_(True)
        trl_loss = sum(adapter(fn, call) for call in _micro_batch_calls(first, logp)).detach()
        assert abs(float(trl_loss) - float(spec_loss)) > 1e-3 * abs(float(spec_loss))


# ----------------------------------------------------------------------------------------------
# non-finite values at masked positions reach TRL's loss (masked_nonfinite="propagate")


@pytest.mark.parametrize("mode", MODES)
def test_nonfinite_at_masked_positions_reaches_trls_loss(installed, mode):
    variant = variant_of(mode, 0.1)
    conv = convention_from_flags("trl", trl.modes()[mode].convention)
    fn, adapter = trl.target("policy_loss", mode, variant)
    case = policy_loss_cases(variant, conv, classes=("ragged",))[0]
    assert not bool(case.mask.all())

    def trl_loss(**junk):
        fields = {name: getattr(case, name).clone() for name in ("logp", "old_logp", "ref_logp")}
        for name, value in junk.items():
            fields[name][~case.mask] = value
        logp = fields["logp"].requires_grad_(True)
        call = SimpleNamespace(logp=logp, old_logp=fields["old_logp"], advantages=case.advantages,
                               mask=case.mask, ref_logp=fields["ref_logp"], normalizer=None)
        loss = adapter(fn, call)
        (grad,) = torch.autograd.grad(loss, logp)
        return float(loss.detach()), grad

    finite_loss, finite_grad = trl_loss()
    assert math.isfinite(finite_loss) and bool(torch.isfinite(finite_grad).all())
    for junk in ({"logp": math.nan}, {"old_logp": math.nan}, {"ref_logp": math.inf}, {"logp": -math.inf}):
        loss, grad = trl_loss(**junk)
        assert math.isnan(loss), junk
        assert not bool(torch.isfinite(grad).all()), junk
    assert trl.modes()[mode].convention["masked_nonfinite"] == "propagate"


# ----------------------------------------------------------------------------------------------
# the driver: modes, profile data, metadata, errors


def test_every_loss_type_of_the_installed_grpo_config_is_a_mode_or_unsupported(installed):
    _, config_class = trl._trl()
    help_text = next(f for f in dataclasses.fields(config_class) if f.name == "loss_type").metadata["help"]
    listed = re.search(r"Supported values are (.*?)\. ", help_text)
    assert listed, help_text
    loss_types = set(re.findall(r"'([a-z_]+)'", listed.group(1)))
    assert {"grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"} <= loss_types
    covered = {m.framework_config["loss_type"] for m in trl.modes().values()} | set(trl.unsupported_modes())
    assert loss_types <= covered, loss_types - covered


def test_modes_cover_the_scope_and_the_profile_is_their_data():
    modes = trl.modes()
    assert set(modes) == {"grpo", "dr_grpo", "dapo", "bnpo", "sapo", "sapo/sequence", "cispo", "gspo",
                          "luspo"}
    assert modes["gspo"].framework_config["importance_sampling_level"] == "sequence"
    assert modes["sapo/sequence"].framework_config["importance_sampling_level"] == "sequence"
    for name, mode in modes.items():
        assert isinstance(mode, Mode) and mode.kind == "policy_loss" and mode.preset in PRESETS
        if name == "luspo":  # a variant of the gspo preset, not a preset's own mode
            continue
        assert profile("trl", mode.preset) == convention_from_flags("trl", mode.convention), name
        assert framework_config("trl", mode.preset)["loss_type"] == mode.framework_config["loss_type"]
    assert profile("trl", "ppo") == profile("trl", "bnpo")
    assert profile("trl", "grpo", scale_rewards="batch").adv_scale == "batch_rewards"
    assert trl.modes("kl") == {} and trl.modes("group_advantages") == {}
    assert "group" in trl.unsupported_modes("group_advantages")
    with pytest.raises(ValueError, match="has no trl equivalent"):
        profile("trl", "gspo_token")
    with pytest.raises(ValueError, match="kind must be one of"):
        trl.modes("value")


def test_framework_config_is_accepted_by_trls_grpo_config(installed, tmp_path):
    """The driver's config namespace equals a real GRPOConfig on every field _compute_loss reads
    (a real one is built here only: it initialises accelerate's process state, reset afterwards)."""
    from accelerate.state import PartialState

    _, config_class = trl._trl()
    read = (
        "loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "beta",
        "max_completion_length", "sapo_temperature_pos", "sapo_temperature_neg", "use_bias_correction_kl",
        "top_entropy_quantile", "off_policy_mask_threshold", "use_vllm",
        "vllm_importance_sampling_correction",
        "entropy_coef", "use_adaptive_entropy", "steps_per_generation", "gradient_accumulation_steps",
    )
    fresh = not PartialState._shared_state
    try:
        for mode in trl.modes().values():
            keys = trl.grpo_config_kwargs(mode, variant_of(mode.name, 0.04))
            args = trl._grpo_config(tuple(sorted(keys.items())), 3)
            real = config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=2,
                                per_device_train_batch_size=2, gradient_accumulation_steps=3, **keys)
            assert {k: getattr(args, k) for k in read} == {k: getattr(real, k) for k in read}, mode.name
            assert args.loss_type == mode.framework_config["loss_type"] and args.beta == 0.04
    finally:
        if fresh:
            PartialState._reset_state()
    assert trl.grpo_config_kwargs("cispo", variant_of("cispo"))["epsilon_high"] == 1.28
    with pytest.raises(ValueError, match="not GRPOConfig fields"):
        trl._grpo_config((("clip_ratio_c", 3.0),), 1)


def test_driver_reports_version_and_source_hash(installed):
    assert trl.installed_version() == trl.PINNED_VERSION
    files = trl.source_files()
    assert files and all(f.is_file() for f in files)
    assert any(f.name == "grpo_trainer.py" for f in files)
    assert re.fullmatch(r"[0-9a-f]{12}", source_hash(files))


def test_another_installed_version_gives_a_warning(installed, monkeypatch):
    """One warning, the driver layer's (frameworks/driver.py), names both versions."""
    monkeypatch.setattr(trl.module, "installed_version", lambda: "9.9.9")
    with pytest.warns(UserWarning, match="trl 9.9.9 is installed; the trl profiles describe 1.16.0") as seen:
        trl.target("policy_loss", "grpo", variant_of("grpo"))
    assert len(seen) == 1, [str(w.message) for w in seen]


def test_target_refuses_what_trl_cannot_run(installed):
    with pytest.raises(ValueError, match="trl mode 'k3' is not supported: TRL has no standalone KL"):
        trl.target("kl", "k3", None)
    with pytest.raises(ValueError, match="trl has no policy_loss mode 'ppo_clip'; modes: grpo"):
        trl.target("policy_loss", "ppo_clip", variant_of("grpo"))
    with pytest.raises(ValueError, match="kl_estimator must be 'k3'"):
        k1 = dataclasses.replace(variant_of("grpo"), kl_coef=0.1, kl_estimator="k1")
        trl.target("policy_loss", "grpo", k1)
    with pytest.raises(ValueError, match="TRL mode 'grpo' runs ratio='token'"):
        trl.target("policy_loss", "grpo", PRESETS["gspo_token"])
    with pytest.raises(ValueError, match="cispo clamps only above"):
        trl.target("policy_loss", "cispo", dataclasses.replace(PRESETS["cispo"], eps_low=0.2))


def test_time_loss_times_trls_loss(installed):
    case = policy_loss_cases(variant_of("dapo"), profile("trl", "dapo"), classes=("ragged",))[0]
    seconds = trl.time_loss("dapo", variant_of("dapo"), case.logp, case.old_logp, case.advantages, case.mask,
                            repeats=3)
    assert 0.0 < seconds < 10.0


# ----------------------------------------------------------------------------------------------
# the claims of TRL's findings that the modes do not drive (audit 14)


def test_delta_at_one_plus_epsilon_high_is_the_exact_dual_clip(installed):
    """Finding config:delta is about delta *below* 1 + epsilon_high: at exactly 1 + epsilon_high TRL's loss
    is eq. (7)'s dual clip with c = 1 + eps_high, every float64 class to float64 rounding."""
    variant = dataclasses.replace(variant_of("grpo"), dual_clip=1.2)  # eps_high 0.2
    conv = convention_from_flags("trl", trl.modes()["grpo"].convention)
    fn, adapter = trl.target("policy_loss", "grpo", variant)
    report = check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=FLOAT64_CLASSES)
    assert report.ok, report.render()
    assert max(max_errors(report)) <= EXACT


def test_a_negative_sapo_temperature_has_the_gradient_of_its_absolute_value(installed):
    """Finding config:sapo_temperature_neg: tau = 0 is inf / NaN, but a negative tau is harmless for
    training: the gate's derivative 4 sigma(z) (1 - sigma(z)) is even in z = tau (r - 1), so TRL's gradient
    is that of |tau|, and the loss moves by the constant 4 A / |tau| (TRL's float32 temperature)."""
    fields = dataclasses.asdict(variant_of("sapo"))
    logp = torch.tensor([[-0.5, -1.5, -1.0]], dtype=torch.float64)
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    adv = torch.tensor([-1.0], dtype=torch.float64)  # A <= 0: tau_neg
    got = {}
    for tau in (1.05, -1.05):  # a namespace: refimpl's variant refuses tau <= 0, TRL's config does not
        variant = SimpleNamespace(**{**fields, "tau_neg": tau})
        leaf = logp.clone().requires_grad_(True)
        call = SimpleNamespace(logp=leaf, old_logp=old, advantages=adv, normalizer=None, ref_logp=None,
                               mask=torch.ones(1, 3, dtype=torch.bool))
        loss = trl.trl_policy_loss(call, mode="sapo", variant=variant)
        got[tau] = (loss.item(), torch.autograd.grad(loss, leaf)[0])
    assert torch.allclose(got[1.05][1], got[-1.05][1], rtol=1e-12, atol=0.0)
    shift = 4.0 * adv.item() / float(torch.tensor(1.05, dtype=torch.float32))
    assert got[-1.05][0] - got[1.05][0] == pytest.approx(shift, rel=1e-12, abs=0.0)


def test_dapo_with_fewer_steps_per_generation_than_accumulation_steps(installed):
    """Finding generation_batch_normalizer, spg < GA: each micro-batch is a generation batch of its own
    and is divided by its own token count x GA / spg: micro-batches of 1 and 3 tokens, GA 2, spg 1, A = 1,
    ratio 1: -1/2 and -1/6 per token where the step's token mean gives -1/4 (spg = GA is exact)."""
    from refimpl.conformance.frameworks.trl.adapters import _stand_in_trainer

    trainer_class, _ = trl._trl()
    keys = trl.grpo_config_kwargs("dapo", variant_of("dapo"))
    grads = {}
    for spg in (1, 2):
        args = SimpleNamespace(**vars(trl._grpo_config(tuple(sorted(keys.items())), 2)))  # GA 2
        args.steps_per_generation = spg
        for width in (1, 3):
            leaf = torch.full((1, width), -1.0, dtype=torch.float64, requires_grad=True)
            trainer = _stand_in_trainer(args, leaf, 2)
            tokens = width if spg == 1 else 4  # num_items_in_batch: the generation batch's tokens
            inputs = {"prompt_ids": torch.zeros((1, 0), dtype=torch.long),
                      "prompt_mask": torch.zeros((1, 0), dtype=torch.long),
                      "completion_ids": torch.zeros((1, width), dtype=torch.long),
                      "completion_mask": torch.ones((1, width), dtype=torch.long),
                      "advantages": torch.tensor([1.0], dtype=torch.float64),
                      "old_per_token_logps": leaf.detach().clone(),
                      "num_items_in_batch": torch.tensor(tokens)}
            loss = trainer_class._compute_loss(trainer, trainer.model, inputs)
            grads[spg, width] = torch.autograd.grad(loss, leaf)[0].flatten().tolist()
    # float64 log-probs, a few roundings of values below 1
    assert grads[2, 1] == pytest.approx([-0.25], abs=1e-12)
    assert grads[2, 3] == pytest.approx([-0.25] * 3, abs=1e-12)
    assert grads[1, 1] == pytest.approx([-0.5], abs=1e-12)
    assert grads[1, 3] == pytest.approx([-1 / 6] * 3, abs=1e-12)


#: findings no mode shows, by the audit that found them: each has its class, and an unsupported mode's
#: reason names it (GMPOTrainer's and AsyncGRPOTrainer's; the cispo cap's documented form, delta with the
#: loss types that ignore it, the sequence-level metrics' rows; the settings sweep: beta, the off-policy
#: mask's threshold, VESPO's lambda, the adaptive entropy band, RLOO's reward clip, the vLLM weight's cap,
#: A*-PO's beta1, the logged metrics and the experimental trainers' rewards)
_UNSHOWN = {
    "experimental trainers": {
        "gmpo_vllm_is": "bug", "async_grpo_normalizer": "bug", "async_grpo_ratio_overflow": "bug",
        "config:entropy_coef": "validation", "config:top_entropy_quantile": "validation",
        "config:multi_objective_aggregation": "validation", "vllm_is_clip_min": "documented_default"},
    "audit 14b": {"cispo_cap": "documented_default", "config:loss_type": "validation",
                  "sequence_metrics_rows": "value_only"},
    "sweep 15": {
        "config:beta": "validation", "config:off_policy_mask_threshold": "validation",
        "config:vespo_lambda_neg": "validation", "config:entropy_coef_min": "validation",
        "config:reward_clip_range": "validation", "config:ref_model_mixup_alpha": "validation",
        "config:vllm_importance_sampling_clip_max": "validation", "config:beta1": "validation",
        "frac_reward_zero_std": "value_only", "vllm_is_metrics": "value_only",
        "sdpo_unscorable_rewards": "bug", "a2po_all_incorrect": "bug"},
}


@pytest.mark.parametrize("audit", sorted(_UNSHOWN))
def test_findings_no_mode_shows_are_classified_and_named_by_an_unsupported_mode(audit):
    kinds = _UNSHOWN[audit]
    findings = {f.key: f.kind for f in trl.findings()}
    assert {key: findings.get(key) for key in kinds} == kinds
    reasons = " ".join([*trl.unsupported_modes().values(),
                        *trl.unsupported_modes("group_advantages").values()])
    for key in kinds:
        assert f"finding {key}" in reasons, key

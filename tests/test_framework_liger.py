"""The Liger driver against the installed Liger-Kernel (0.8.5): every mode of its fused-linear
chunked GRPO loss passes every case class under its own profile (compute_dtype="float32": Liger
computes in float32 whatever the inputs; ratio_dtype="float32_gate": its ratio and clip bounds in
float32); each flag is needed (the float32 arithmetic, the delta tie, the row counts); the loading
leaves no stand-in and no patch behind.

Expected values come from our reference with the profile's flags, never from running Liger.
Skipped with a message when Liger-Kernel is not installed.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from refimpl.conformance import POLICY_CASE_CLASSES, Convention, check_policy_loss, policy_loss_cases
from refimpl.conformance.checks import DEFAULT_RTOL, resolve_preset
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.frameworks import load_driver, source_hash
from refimpl.conformance.kinks import TIE_NOTE

pytestmark = pytest.mark.framework

driver = load_driver("liger")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"Liger driver unavailable: {_WHY}", allow_module_level=True)

_MODES = sorted(driver.modes("policy_loss"))
_CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors")
_HALF = ("bf16", "fp16", "half_overflow")


def _conv(mode) -> Convention:
    return convention_from_flags("liger", mode.convention)


def _variant(mode):
    return resolve_preset(driver.mode_variant(mode))[1]


def _check(name, *, classes=_CLASSES, rtol=DEFAULT_RTOL, **flags):
    mode = driver.modes()[name]
    fn, adapter = driver.target("policy_loss", name)
    conv = dataclasses.replace(_conv(mode), **flags)
    return check_policy_loss(fn, _variant(mode), convention=conv, adapter=adapter, classes=classes, rtol=rtol)


def test_driver_loads_the_installed_sources_and_restores_what_it_patches():
    files = driver.source_files()
    assert [f.name for f in files] == ["fused_linear_ppo.py", "grpo_loss.py"]
    assert all(f.is_file() for f in files)
    assert len(source_hash(files)) == 12
    fn, adapter = driver.target("policy_loss", "dapo")
    assert type(fn).__name__ == "LigerFusedLinearGRPOLoss"
    assert sys.modules[type(fn).__module__].__file__ == str(files[1])
    base = sys.modules[type(fn).__module__].LigerFusedLinearPPOBase
    before = base.__dict__["chunk_forward"]
    case = policy_loss_cases(_variant(driver.modes()["dapo"]), Convention(), classes=("inside_clip",))[0]
    call = type("Call", (), dict(logp=case.logp.requires_grad_(True), old_logp=case.old_logp,
                                 advantages=case.advantages, mask=case.mask, ref_logp=None, normalizer=None))
    loss = adapter(fn, call)
    assert loss.dtype == torch.float32  # Liger's float32 accumulator, whatever the inputs
    assert base.__dict__["chunk_forward"] is before
    # no stand-in for the liger_kernel package is left (triton is never imported by the driver)
    assert "liger_kernel.chunked_loss.fused_linear_ppo" not in sys.modules or "liger_kernel" in sys.modules


@pytest.mark.parametrize("name", _MODES)
def test_mode_passes_every_case_class_under_its_profile(name):
    report = _check(name)
    assert report.ok, report.render()
    variant = driver.mode_variant(driver.modes()[name])
    absent = {"kl_penalty"} if variant.kl_coef == 0 else set()
    absent |= {"dual_clip_tie"} if variant.dual_clip is None else set()
    assert {r.case_class for r in report.results} == set(_CLASSES) - absent


@pytest.mark.parametrize("name", ["grpo", "dapo", "sapo", "cispo", "gspo"])
def test_half_precision_is_computed_in_float32_and_float64_is_rounded_to_it(name):
    # bf16 / fp16 inputs pass the spec's compute_dtype="float32_min" bound; float64 inputs do not pass
    # float64's: Liger rounds them to float32 (compute_dtype="float32")
    assert _check(name, classes=_HALF, compute_dtype="float32_min").ok
    failing = _check(name, classes=("inside_clip", "ragged"), compute_dtype="float32_min").failing_classes()
    assert {"inside_clip", "ragged"} <= set(failing)


@pytest.mark.parametrize(("name", "flag", "failing"), [
    ("grpo", {"empty_rows": "drop"}, {"empty_rows"}),
    ("sapo", {"empty_rows": "drop"}, {"empty_rows"}),
    ("dr_grpo", {"token_sum_rows": "nonempty"}, {"empty_rows"}),
    ("luspo", {"token_sum_rows": "nonempty"}, {"empty_rows"}),
    ("bnpo", {"micro_batch": "global"}, {"micro_batch"}),
    ("dapo", {"masked_nonfinite": "ignore"}, {"masked_nonfinite"}),
])
def test_each_flag_is_needed(name, flag, failing):
    classes = ("inside_clip", *sorted(failing))
    assert set(_check(name, classes=classes, **flag).failing_classes()) == failing


def test_delta_tie_the_float32_ratio_lands_exactly_on_delta():
    # the on_boundary case puts a ratio exactly at the dual-clip constant 3 (log-ratio = log 3): in
    # float32 exp(log 3) rounds to 3.0 = delta, where clamp(coef_1, max=delta) passes the gradient;
    # in float64 it is 3.0000000000000004 (clipped, gradient 0, the spec's inclusive gate)
    assert torch.exp(torch.tensor(math.log(3.0), dtype=torch.float32)).item() == 3.0
    assert torch.exp(torch.tensor(math.log(3.0), dtype=torch.float64)).item() > 3.0
    # without the float32 gate the float64 expected value is the closed side, and Liger's whole gradient
    # the open side of the kink: a subgradient, accepted with a note (policy_losses.md section 3)
    report = _check("dapo/delta", classes=("on_boundary",), ratio_dtype="input")
    noted = [r for r in report.results if r.departure == TIE_NOTE]
    assert report.ok and noted and all(r.grad_error > 0.5 for r in noted)
    exact = _check("dapo/delta", classes=("on_boundary",))  # ratio_dtype="float32_gate": the tie, exactly
    assert exact.ok and not [r for r in exact.results if r.departure]


def test_bias_corrected_kl_gradient_is_lost_in_float32():
    # d/dlogp [k3(ref - logp) exp(logp - old)] subtracts two terms of size exp(ref - old): with
    # |ref - logp| up to 24 in the kl_penalty case their float32 difference keeps no correct digit: the
    # float32 bound covers it through those terms' size (tolerance.kl_gradient_slack)
    report = _check("dapo+kl/bias-correction", classes=("kl_penalty",))
    (case,) = report.results
    assert report.ok and case.grad_error > 0.5
    # without the importance weight the same KL term is fine to float32's own bound
    (plain,) = _check("dapo+kl", classes=("kl_penalty",)).results
    assert plain.ok and plain.grad_error < 1e-4


def test_variants_liger_cannot_express_are_refused_in_one_line():
    with pytest.raises(ValueError, match="variant.aggregation"):
        driver.loss_kwargs("dapo", resolve_preset("grpo")[1])
    with pytest.raises(ValueError, match="variant.kl_estimator"):
        k2 = dataclasses.replace(resolve_preset("dapo")[1], kl_coef=0.1, kl_estimator="k2")
        driver.loss_kwargs("dapo", k2)
    assert driver.loss_kwargs("cispo", resolve_preset("cispo")[1])["epsilon_high"] == 1.28
    assert {"vespo", "compiled=True"} <= set(driver.unsupported_modes("policy_loss"))
    assert driver.modes("kl") == {} and driver.unsupported_modes("kl")


def _signature_defaults(path, name):
    """The literal defaults of ``def name`` in the installed file ``path`` (parsed, not imported: the Triton
    path's module imports triton)."""
    import ast

    tree = ast.parse(path.read_text())
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
    return {a.arg: ast.literal_eval(d) for a, d in zip(args, fn.args.defaults, strict=True)}


def _pinned_root():
    """The installed liger_kernel folder, the findings' release only (else the test skips)."""
    if driver.installed_version() != driver.pinned_version:
        pytest.skip(f"liger-kernel {driver.installed_version()}: the findings cite {driver.pinned_version}")
    return driver.source_files()[1].parents[1]


def test_the_defaults_findings_read_the_installed_signatures():
    root = _pinned_root()
    chunked = _signature_defaults(root / "chunked_loss" / "grpo_loss.py", "__init__")
    assert {k: chunked[k] for k in ("loss_type", "beta", "use_ref_model", "epsilon_low", "epsilon_high")} == {
        "loss_type": "dapo", "beta": 0.04, "use_ref_model": True, "epsilon_low": 0.2, "epsilon_high": 0.2}
    triton = _signature_defaults(root / "transformers" / "grpo_loss.py", "triton_grpo_loss")
    assert {k: triton[k] for k in ("temperature", "beta", "eps_low", "eps_high", "loss_type")} == {
        "temperature": 0.9, "beta": 0.04, "eps_low": 0.2, "eps_high": 0.4, "loss_type": "dapo"}
    # "a user who sets beta=0 and epsilon_high=0.28 gets DAPO's loss": the mode dapo is those settings
    kwargs = driver.loss_kwargs("dapo", _variant(driver.modes()["dapo"]))
    assert (kwargs["beta"], kwargs["epsilon_low"], kwargs["epsilon_high"]) == (0.0, 0.2, 0.28)


@pytest.mark.parametrize(("path", "line", "quote"), [  # the lines the findings' texts cite besides `where`
    ("ops/grpo_loss.py", 176, "if DELTA != 0.0:"),
    ("ops/grpo_loss.py", 187, "is_clipped = (coef_1 > EPS_HIGH) & (advantage > 0)"),
    ("ops/grpo_loss.py", 642, 'if delta is not None and loss_type in ("cispo", "sapo", "vespo"):'),
    ("ops/grpo_loss.py", 646, "delta_val = 0.0 if delta is None else float(delta)"),
    ("ops/grpo_loss.py", 729, "coef_1_for_loss = torch.clamp(coef_1, max=delta)"),
    ("chunked_loss/fused_linear_ppo.py", 385, "_advantages_chunks = torch.chunk(advantages, chunks=chunks"),
    ("chunked_loss/grpo_loss.py", 166, "advantages_expanded = advantages.unsqueeze(1).expand_as(coef_1)"),
    ("chunked_loss/grpo_loss.py", 312, "advantages (torch.Tensor): Advantages tensor. Shape: (batch_size,)"),
])
def test_the_lines_the_findings_cite_hold_the_code(path, line, quote):
    assert quote in (_pinned_root() / path).read_text().splitlines()[line - 1]


def test_cispo_clip_fraction_counts_only_positive_advantages():
    # finding cispo_clip_ratio (value only): two tokens at ratio 2 above the cap 1.5, A = +1 and -1; both
    # weights are capped (gradient -1.5 A / 2 tokens, exact in float32), the metric counts one of the two
    grpo = sys.modules[type(driver.target("policy_loss", "cispo")[0]).__module__]
    logp = torch.full((2, 1), -1.0 + math.log(2.0), requires_grad=True)
    one = torch.ones(2, 1)
    loss, metrics = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(
        logp, one, torch.tensor([1.0, -1.0]), one, old_per_token_logps=torch.full((2, 1), -1.0), beta=0.0,
        epsilon_high=1.5, loss_type="cispo")
    assert torch.autograd.grad(loss, logp)[0].flatten().tolist() == [-0.75, 0.75]
    assert metrics[-1].item() == 0.5  # the spec's clip fraction of this batch is 1.0

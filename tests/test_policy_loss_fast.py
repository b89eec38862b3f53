"""The fused fast path (``refimpl.losses.fused_policy``) against the eager reference ``policy_loss``.

Both compute md eq. (12) (specs/policy_losses.md) from the same inputs in the same dtype; they
differ only in the order of their roundings (a closed-form gradient instead of autograd's chain,
fused loops instead of separate passes, and on the compiled path inductor's vectorised exp /
expm1, within an ulp or two of ATen's). So the loss, every metric and every gradient agree to a
few units of the compute dtype's roundoff ``u`` on the scale of the result (plus as many subnormal
spacings of the result's dtype: in gradual underflow a rounding's error is absolute): with ``K`` rounded
elementwise operations per term and sums of ``n`` terms (n <= 48 here) the bound is
``(K + n) u`` relative to the largest magnitude (``_TOLERANCE_ULPS`` = 64 units covers K <= 16; for
the loss, the larger of its value and its terms' magnitude, ``_terms_magnitude``: advantages of both
signs cancel, e.g. a group's advantages summing to 0 at ratio 1, and a KL term against an entropy
bonus; for a gradient, the sum of its policy and KL terms' magnitudes at a token,
``_gradient_terms_magnitude``),
plus one rounding of the gradient to the input dtype ``u_in`` (bf16 / fp16 inputs). Errors must be
the same ValueError / TypeError with the same message.

Cases: every case class of the conformance kit (``policy_loss_cases``, micro-batches with the
global normaliser, the golden vectors) for every preset, the kit's own checker on the fast path,
and hypothesis batches for every part of the family (tests/test_policy_loss's variants, plus an
exact per-token KL and an entropy bonus). The compiled path (``torch.compile``, inductor's C++
backend on a CPU) runs every case class for GRPO with a KL term in CI (one compilation per dtype
and normaliser kind: about 20-40 s on two cores) and for every preset under the thorough profile
(HYPOTHESIS_PROFILE=thorough), and as AOTInductor packages (``compile="aot"``) for four presets there;
it skips, saying so, where no C++ compiler is found.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.conformance.cases import POLICY_CASE_CLASSES, policy_loss_cases
from refimpl.conformance.checks import check_policy_loss, resolve_preset
from refimpl.conformance.conventions import Convention
from refimpl.conformance.golden import golden_cases
from refimpl.losses import GRPO, PRESETS, loss_normalizer, policy_loss, reference_policy_loss
from refimpl.losses.fused_policy import fused_policy_loss
from tests.test_policy_loss import BOUNDARY_SAFE, loss_batches

_TOLERANCE_ULPS = 64
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
HAS_CXX = any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


def _outcome(fn, logp, old, adv, mask, v, **kwargs):
    """(loss, {input: gradient}, metrics) of one call, or ("raises", type, message)."""
    leaves = {"logp": logp.detach().clone().requires_grad_(True)}
    for name in ("entropy", "kl"):
        if kwargs.get(name) is not None:
            leaves[name] = kwargs[name].detach().clone().requires_grad_(True)
            kwargs[name] = leaves[name]
    try:
        loss, metrics = fn(leaves["logp"], old, adv, mask, v, **kwargs)
    except (ValueError, TypeError) as error:
        return ("raises", type(error), str(error))
    (2.5 * loss).backward()  # a cotangent other than 1 reaches the backward pass
    grads = {name: leaf.grad for name, leaf in leaves.items()}
    return loss.detach(), grads, {k: m.detach() for k, m in metrics.items()}


def _close(got: torch.Tensor, expected: torch.Tensor, u: float, what: str, terms=None) -> None:
    """``got`` within ``_TOLERANCE_ULPS`` units ``u`` of ``expected`` on the scale of ``expected``, or,
    where that fails and ``terms`` is given, on the scale of ``terms()`` (the magnitude of the terms
    summed into it, which may cancel) when it is the larger."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    g, e = got.double(), expected.double()
    assert torch.equal(torch.isfinite(g), torch.isfinite(e)), f"{what}: {got} vs {expected}"
    finite = torch.isfinite(e)
    assert torch.equal(g[~finite], e[~finite]), f"{what}: {got} vs {expected}"
    if finite.any():
        scale = float(e[finite].abs().max()) + 1e-300
        error = float((g[finite] - e[finite]).abs().max())
        # below the smallest normal number a rounding's error is absolute: at most the subnormal spacing
        # of the result's dtype (float32: 2**-149), so tiny results carry as many of those as units
        info = torch.finfo(got.dtype)
        underflow = _TOLERANCE_ULPS * info.smallest_normal * info.eps
        if error > _TOLERANCE_ULPS * u * scale + underflow and terms is not None:
            scale = max(scale, terms())
        assert error <= _TOLERANCE_ULPS * u * scale + underflow, (
            f"{what}: error {error / scale:.3g} x max |expected|")


def _part_outcomes(v, logp, old, adv, mask, magnitudes: bool, **kwargs) -> list:
    """The reference's outcome for each part of the loss alone: the policy terms (no regulariser),
    the KL term, the entropy bonus (those given and weighted). With ``magnitudes`` each part's terms
    have one sign: every advantage's magnitude (a gate that depends on A's sign bounds the same ratio
    from the other side), |k1| (reference log-probs moved to ``logp - |logp - ref_logp|``; k2 and k3
    are >= 0) or |kl|, |entropy|. Parts that raise or are not finite are left out."""
    none = {"ref_logp": None, "kl": None, "entropy": None}
    given = {**none, **kwargs}
    parts = [(dataclasses.replace(v, kl_coef=0.0, entropy_coef=0.0), adv.abs() if magnitudes else adv,
              {**given, **none})]
    zero = torch.zeros_like(adv)
    if v.kl_coef > 0 and (given["ref_logp"] is not None or given["kl"] is not None):
        kl = {**given, "entropy": None}
        if magnitudes and given["ref_logp"] is not None and v.kl_estimator == "k1":
            kl["ref_logp"] = logp.detach() - (logp.detach() - given["ref_logp"]).abs()
        if magnitudes and given["kl"] is not None:
            kl["kl"] = given["kl"].detach().abs()
        parts.append((dataclasses.replace(v, entropy_coef=0.0), zero, kl))
    if v.entropy_coef > 0 and given["entropy"] is not None:
        entropy = {**given, "ref_logp": None, "kl": None}
        if magnitudes:
            entropy["entropy"] = given["entropy"].detach().abs()
        parts.append((dataclasses.replace(v, kl_coef=0.0), zero, entropy))
    outcomes = []
    for variant, a, keywords in parts:
        keywords = {k: x for k, x in keywords.items() if x is not None or k not in none}
        outcome = _outcome(reference_policy_loss, logp, old, a, mask, variant, **keywords)
        if outcome[0] != "raises" and bool(torch.isfinite(outcome[0])):
            outcomes.append(outcome)
    return outcomes


def _terms_magnitude(v, logp, old, adv, mask, **kwargs) -> float:
    """The scale of the loss's terms where they may cancel (advantages of both signs; a KL term, whose
    k1 estimate has both signs, against an entropy bonus): the sum of the parts' losses, each with
    terms of one sign (``_part_outcomes``)."""
    return sum(abs(float(outcome[0])) for outcome in _part_outcomes(v, logp, old, adv, mask, True, **kwargs))


def _gradient_terms_magnitude(v, logp, old, adv, mask, name: str, **kwargs) -> float:
    """The scale of ``d loss / d name``'s terms where a token's policy and KL terms may cancel: the
    largest sum over the parts (``_part_outcomes``, the given advantages) of their gradients' magnitudes
    at a token."""
    total = None
    for outcome in _part_outcomes(v, logp, old, adv, mask, False, **kwargs):
        grad = outcome[1].get(name)
        if grad is not None:
            part = grad.double().abs().nan_to_num(posinf=0.0)
            total = part if total is None else total + part
    return 0.0 if total is None else float(total.max())


def _k3_terms_magnitude(logp, old, mask) -> float:
    """The scale of ``approx_kl``'s terms: the token mean of |expm1(l)| + |l|. The reference forms k3 as
    ``expm1(l) - l``, which cancels for small |l| (an error of about u |l| on a k3 of l^2 / 2), where
    the fast paths' series does not; the comparison allows the reference's own error."""
    dtype = torch.promote_types(logp.dtype, torch.float32)
    l = (logp.detach().to(dtype) - old.to(dtype)).double()
    m = mask.bool()  # (padding may hold NaN: where, not a product)
    terms = torch.where(m, torch.expm1(l).abs() + l.abs(), 0.0)
    return float(terms.sum() / m.sum().clamp(min=1))


def _kl_terms_magnitude(logp, mask, kwargs) -> float:
    """The scale of the ``kl`` metric's terms: the token mean of |d| + |expm1(-d)| + d^2 / 2 with
    d = logp - ref_logp (k1 has both signs, k3 is formed as a difference), or of |kl| where the per-token
    KL is given; 0 without either."""
    m = mask.bool()  # (padding may hold NaN: where, not a product)
    if kwargs.get("ref_logp") is not None:
        d = logp.detach().double() - kwargs["ref_logp"].double()
        terms = d.abs() + torch.expm1(-d).abs() + d * d / 2
    elif kwargs.get("kl") is not None:
        terms = kwargs["kl"].detach().double().abs()
    else:
        return 0.0
    return float(torch.where(m, terms, 0.0).sum() / m.sum().clamp(min=1))


def assert_same_as_reference(v, logp, old, adv, mask, *, compile=False, fast=None, **kwargs) -> None:
    """``fast`` (default: ``fused_policy_loss`` with ``compile``) equal to ``reference_policy_loss``
    within the bound of the module docstring, or raising the same error."""
    expected = _outcome(reference_policy_loss, logp, old, adv, mask, v, **kwargs)
    if fast is None:
        fast = lambda *a, **k: fused_policy_loss(*a, compile=compile, **k)  # noqa: E731
    got = _outcome(fast, logp, old, adv, mask, v, **kwargs)
    if expected[0] == "raises" or got[0] == "raises":
        assert got == expected
        return
    u = torch.finfo(expected[0].dtype).eps  # the compute dtype, promote_types(logp.dtype, float32)
    # the policy terms' scale, computed once and only where a comparison on the value's scale fails
    terms = functools.cache(lambda: _terms_magnitude(v, logp, old, adv, mask, **kwargs))
    _close(got[0], expected[0], u, "loss", terms)
    assert got[1].keys() == expected[1].keys()
    for name, grad in expected[1].items():
        if grad is None:
            assert got[1][name] is None, f"d loss / d {name} should not exist"
            continue
        u_in = torch.finfo(grad.dtype).eps
        grad_terms = functools.partial(_gradient_terms_magnitude, v, logp, old, adv, mask, name, **kwargs)
        _close(got[1][name], grad, u + u_in / _TOLERANCE_ULPS, f"d loss / d {name}", grad_terms)
    assert got[2].keys() == expected[2].keys()
    k3_terms = functools.cache(lambda: _k3_terms_magnitude(logp, old, mask))
    # ratio_mean is 1 + mean(r - 1): its rounding is relative to 1 + max |r - 1|, not to the mean
    spread = max(float(expected[2]["ratio_max"]) - 1.0, 1.0 - float(expected[2]["ratio_min"]), 0.0)
    scales = {"policy_objective": terms, "approx_kl": k3_terms,  # sums whose terms may cancel
              "ratio_mean": lambda: 1.0 + spread if math.isfinite(spread) else 0.0,
              "kl": functools.cache(lambda: _kl_terms_magnitude(logp, mask, kwargs))}
    for name, metric in expected[2].items():  # policy_objective: the policy terms' sum, as the loss
        _close(got[2][name], metric, u, f"metric {name}", scales.get(name))


def _kit_calls(v, golden_inputs_only: bool = False):
    """(class, inputs, keywords) for every case of every class of the kit: micro-batch cases as
    their parts with the full batch's normaliser, golden vectors with theirs (with
    ``golden_inputs_only``, the inputs of the vectors of v without its KL term, plus reference
    log-probs: the kit has vectors for variants without a KL term only)."""
    for case in policy_loss_cases(v, Convention()):
        ref = {"ref_logp": case.ref_logp} if case.ref_logp is not None and v.kl_coef > 0 else {}
        parts = case.micro_batches or (tuple(range(case.logp.shape[0])),)
        normalizer = None if case.micro_batches is None else loss_normalizer(case.mask, v)
        for rows in parts:
            r = list(rows)
            yield case.case_class, (case.logp[r], case.old_logp[r], case.advantages[r], case.mask[r]), {
                **{k: x[r] for k, x in ref.items()}, "normalizer": normalizer}
    for golden in golden_cases(dataclasses.replace(v, kl_coef=0.0) if golden_inputs_only else v):
        c = golden.case
        ref = {"ref_logp": c.old_logp - 0.25} if v.kl_coef > 0 else {}
        inputs = (c.logp, c.old_logp, c.advantages, c.mask)
        yield "golden_vectors", inputs, {"normalizer": golden.normalizer, **ref}


def _kit_variants(name: str):
    """The preset as the kit runs it (with the golden vectors), and with a KL term (the kl_penalty
    class; reference log-probs in every case); for ppo also with a dual clip c = 3 (the
    dual_clip_tie class, which exists only where a token-level clip has a dual clip)."""
    variants = [resolve_preset(name)[1], resolve_preset(name, kl_coef=0.1)[1]]
    if name == "ppo":
        variants.append(dataclasses.replace(variants[0], dual_clip=3.0))
    return variants


def _expected_classes(variants) -> set[str]:
    """Every case class of the kit, less dual_clip_tie where no variant has a dual clip."""
    classes = set(POLICY_CASE_CLASSES)
    if all(v.dual_clip is None for v in variants):
        classes.discard("dual_clip_tie")
    return classes


@pytest.mark.parametrize("name", list(PRESETS))
def test_fast_path_equals_the_reference_on_every_case_class(name):
    seen = set()
    for v in _kit_variants(name):
        for case_class, inputs, kwargs in _kit_calls(v):
            assert_same_as_reference(v, *inputs, **kwargs)
            seen.add(case_class)
    assert seen == _expected_classes(_kit_variants(name))


@pytest.mark.parametrize("name", list(PRESETS))
def test_fast_path_passes_the_conformance_kit(name):
    _, v = resolve_preset(name, kl_coef=0.1)
    report = check_policy_loss(lambda *a, **k: fused_policy_loss(*a, v, compile=False, **k), v)
    assert report.ok, report.render()


def _extras(v, logp: torch.Tensor, seed: int, exact_kl: bool) -> dict:
    """Reference or behaviour log-probs, an exact per-token KL, an entropy, as v needs (entropy and
    a KL given with a zero coefficient too: they enter the metrics only)."""
    g = torch.Generator().manual_seed(seed)
    noise = lambda: torch.randn(logp.shape, generator=g, dtype=torch.float64)  # noqa: E731
    extras = {"entropy": torch.rand(logp.shape, generator=g, dtype=torch.float64)}
    if exact_kl:
        extras["kl"] = torch.rand(logp.shape, generator=g, dtype=torch.float64)
    else:
        extras["ref_logp"] = logp.nan_to_num(0.0) + 0.3 * noise()
    if v.behavior_correction != "none":
        extras["behavior_logp"] = -1.0 + 0.3 * noise()
    return extras


@pytest.mark.parametrize("name", sorted(BOUNDARY_SAFE))
@given(data=st.data())
def test_fast_path_equals_the_reference_on_every_part_of_the_family(name, data):
    v = BOUNDARY_SAFE[name]
    if data.draw(st.booleans()):
        v = dataclasses.replace(v, entropy_coef=0.25, kl_coef=max(v.kl_coef, 0.125))
    logp, old, adv, mask, _ = data.draw(loss_batches(v))
    extras = _extras(v, logp, data.draw(st.integers(0, 2**16)), exact_kl=data.draw(st.booleans()))
    if data.draw(st.booleans()) and not (v.kl_scale == "sequence" and v.aggregation == "token_mean"):
        extras["normalizer"] = data.draw(st.sampled_from([3.0, 7.5, torch.tensor(11.0)]))
    assert_same_as_reference(v, logp, old, adv, mask, **extras)


@settings(max_examples=10)
@given(data=st.data())
def test_fast_path_raises_what_the_reference_raises(data):
    """The guards: a non-0/1 mask, NaN / inf at an unmasked position of each input, a normaliser
    that is not > 0, an overflowing loss, and the argument checks."""
    v = dataclasses.replace(GRPO, kl_coef=0.5, entropy_coef=0.5)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    inputs = {"logp": old + 0.1, "old_logp": old, "advantages": f64([1.0, -1.0, 0.5]),
              "mask": f64([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
              "ref_logp": old - 0.2, "entropy": torch.ones(3, 4, dtype=torch.float64), "normalizer": None}
    broken = data.draw(st.sampled_from(["mask", "logp", "old_logp", "advantages", "ref_logp", "entropy",
                                        "normalizer", "overflow", "shape", "type"]))
    bad = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    if broken == "mask":
        inputs["mask"][1, 2] = 0.5
    elif broken == "normalizer":
        inputs["normalizer"] = data.draw(st.sampled_from([0.0, -1.0, bad, torch.tensor(0.0)]))
    elif broken == "overflow":
        inputs["logp"] = old + torch.tensor([[0.0, 800.0, 0.0, 0.0]] * 3, dtype=torch.float64)
        inputs["advantages"] = -inputs["advantages"].abs()  # A <= 0: the open gate carries the ratio
    elif broken == "shape":
        inputs["ref_logp"] = inputs["ref_logp"][:, :3]
    elif broken == "type":
        inputs["normalizer"] = "7"
    else:
        x = inputs[broken].clone()
        x.view(-1)[1] = bad  # row 0, token 1: unmasked
        inputs[broken] = x
    logp, old, adv, mask = (inputs.pop(k) for k in ("logp", "old_logp", "advantages", "mask"))
    assert_same_as_reference(v, logp, old, adv, mask, **inputs)
    assert _outcome(policy_loss, logp, old, adv, mask, v, **inputs)[0] == "raises"


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)])
def test_an_empty_batch_gives_what_the_reference_gives(shape):
    for v in (GRPO, PRESETS["gspo"]):
        x = torch.zeros(shape, dtype=torch.float64)
        adv = torch.zeros(shape[:1], dtype=torch.float64)
        assert_same_as_reference(v, x, x, adv, torch.zeros(shape, dtype=torch.bool))


def test_entropy_and_kl_get_a_gradient_only_when_their_coefficient_is_positive():
    logp = -torch.rand(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    extras = {"entropy": torch.rand(2, 3, dtype=torch.float64), "kl": torch.rand(2, 3, dtype=torch.float64)}
    for v in (GRPO, dataclasses.replace(GRPO, kl_coef=0.5, entropy_coef=0.25)):
        assert_same_as_reference(v, logp, logp - 0.1, adv, mask, **extras)  # None where the reference's is


def test_results_stay_on_the_inputs_device_whatever_the_default_device():
    """As tests/test_default_device.py for the public functions: under ``torch.device("meta")`` every
    allocation that names no device goes to meta; the results must stay on the CPU and be equal."""
    v = dataclasses.replace(GRPO, kl_coef=0.5)
    logp = -torch.rand(3, 4, dtype=torch.float64)
    mask = torch.rand(3, 4) > 0.3
    args = (logp, logp - 0.1, torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), mask, v)

    def run():
        x = args[0].clone().requires_grad_(True)
        loss, metrics = fused_policy_loss(x, *args[1:], ref_logp=logp + 0.2, normalizer=4.0, compile=False)
        loss.backward()
        return [loss, x.grad, *metrics.values()]

    plain = run()
    with torch.device("meta"):
        under_meta = run()
    assert all(a.device.type == "cpu" and torch.equal(a, b) for a, b in zip(plain, under_meta, strict=True))


# ---------------------------------------------------------------------------------------------
# the compiled path (inductor: C++ loops on a CPU)

# AOTInductor (compile="aot") compiles the same fused function another way, about 10 minutes a preset
# on the loaded development machine: the presets whose graphs differ most (token and sequence level,
# a runtime L_max, CISPO's weight) under the thorough profile
_AOT_PRESETS = ("grpo", "dr_grpo", "gspo", "cispo")


@pytest.mark.skipif(not HAS_CXX, reason="torch.compile on a CPU needs a C++ compiler (g++, c++ or clang++)")
@pytest.mark.parametrize("compile", [True, "aot"])
@pytest.mark.parametrize("name", list(PRESETS) if THOROUGH else ["grpo"])
def test_compiled_fast_path_equals_the_reference_on_every_case_class(name, compile):
    """Two graphs per variant in CI (float64, and float32 for the bf16 / fp16 classes): GRPO with a
    KL term on the inputs of every class, through ``torch.compile``; every preset with and without
    it when thorough, and ``_AOT_PRESETS`` as AOTInductor packages (``compile="aot"``)."""
    if compile == "aot" and not (THOROUGH and name in _AOT_PRESETS):
        pytest.skip("AOTInductor compiles for minutes: thorough profile, _AOT_PRESETS")
    seen = set()
    variants = _kit_variants(name)[0 if THOROUGH else 1:]
    for v in variants:
        for case_class, inputs, kwargs in _kit_calls(v, golden_inputs_only=not THOROUGH):
            assert_same_as_reference(v, *inputs, compile=compile, **kwargs)
            seen.add(case_class)
    assert seen == _expected_classes(variants)


def test_each_plan_compiles_a_copy_named_for_it():
    """Plans that differ in a float alone (PPO's and DAPO's eps_high) compile copies of the fused
    function under different names: with copies alike in name, file and line, torch 2.13's on-disk
    FX-graph cache held PPO's code under DAPO's key, and the thorough profile's compiled-path test
    got PPO's loss for DAPO. The name is the same for an equal plan (so inductor's caches on disk
    serve later processes) and holds no address."""
    from refimpl.losses.fused_policy import _code_name, _Compiled, _plan

    def plan(v):
        return _plan(v, False, False, False, False, False, True, False)

    ppo, dapo = plan(PRESETS["ppo"]), plan(PRESETS["dapo"])
    assert ppo.variant.eps_high != dapo.variant.eps_high
    assert _code_name(ppo) != _code_name(dapo)
    assert _code_name(ppo) == _code_name(plan(dataclasses.replace(PRESETS["ppo"])))
    assert " at 0x" not in repr(ppo)
    copy = _Compiled(dapo, "cpu").fn._torchdynamo_orig_callable  # (compiles nothing until called)
    assert copy.__code__.co_name == _code_name(dapo)


def test_compile_takes_true_false_or_aot():
    logp = -torch.rand(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^compile must be True, False or 'aot', got 'fast'$"):
        fused_policy_loss(logp, logp, torch.ones(2, dtype=torch.float64), torch.ones(2, 3), GRPO,
                          compile="fast")


def test_an_aot_package_is_named_by_everything_its_code_depends_on(monkeypatch):
    """The package's cache key (refimpl.losses.fused_aot._key) is the same for the same plan,
    dtypes and device in any process (no address or random part), and differs when any of them,
    the torch version, the vector instruction set or the source of a module in the graph differs."""
    from refimpl.losses import fused_aot, fused_policy

    monkeypatch.setattr(fused_aot, "_isa", lambda device: "avx2")  # probing the CPU takes seconds
    plan = fused_policy._plan(GRPO, False, False, False, False, False, True, False)
    dtypes = (torch.float32,) * 4
    cpu = torch.device("cpu")
    key = fused_aot._key(plan, dtypes, cpu)
    assert len(key) == 32 and key == fused_aot._key(fused_policy._plan(
        dataclasses.replace(GRPO), False, False, False, False, False, True, False), dtypes, cpu)
    cispo = fused_policy._plan(PRESETS["cispo"], False, False, False, False, False, True, False)
    others = {fused_aot._key(plan._replace(ref=True), dtypes, cpu),
              fused_aot._key(plan, (torch.float64,) * 4, cpu), fused_aot._key(cispo, dtypes, cpu)}
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "0.0.0")
        others.add(fused_aot._key(plan, dtypes, cpu))
    with monkeypatch.context() as patch:
        patch.setattr(fused_aot, "_isa", lambda device: "avx512")
        others.add(fused_aot._key(plan, dtypes, cpu))
    real = fused_aot.inspect.getsource
    monkeypatch.setattr(fused_aot.inspect, "getsource",
                        lambda m: real(m) + "#" if m is fused_aot.fused_kernel else real(m))
    others.add(fused_aot._key(plan, dtypes, cpu))
    assert key not in others and len(others) == 6


def test_the_aot_kernel_passes_the_present_inputs_and_restores_the_absent_outputs(monkeypatch, tmp_path):
    """``compile="aot"`` without compiling: the package replaced by the exported module run op by op
    (what AOTInductor compiles), so the flat-list plumbing (inputs left out where None, outputs put
    back where None) is held to the reference for every pattern of optional inputs, in CI."""
    from refimpl.losses import fused_aot, fused_policy

    packages = {}

    def compile_to(plan, inputs, path, options):
        packages[path] = fused_aot._Exported(plan, tuple(x is not None for x in inputs))

    def runner(path, device_index):
        return types.SimpleNamespace(run=lambda tensors: list(packages[path](*tensors)))

    monkeypatch.setattr(fused_aot, "_package_dir", lambda: str(tmp_path))  # no inductor import (seconds)
    monkeypatch.setattr(fused_aot, "_compile", compile_to)
    monkeypatch.setattr(fused_aot, "_runner", runner)
    monkeypatch.setattr(fused_aot, "_isa", lambda device: "avx2")  # probing the CPU takes seconds
    monkeypatch.setattr(fused_policy, "_inductor_options", lambda device_type: None)  # the same
    fused_policy._entry.cache_clear()
    fused_policy._kernel.cache_clear()
    try:
        g = torch.Generator().manual_seed(5)
        old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
        batch = (old + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64), old,
                 torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.rand(3, 4, generator=g) > 0.3)
        regularised = dataclasses.replace(GRPO, kl_coef=0.5, entropy_coef=0.25)
        for v, extras in ((GRPO, {}), (regularised, {"ref_logp": old - 0.2, "entropy": old.exp()}),
                          (regularised, {"kl": old.exp(), "entropy": old.exp(), "normalizer": 7.0}),
                          (PRESETS["cispo"], {"entropy": old.exp()})):
            assert_same_as_reference(v, *batch, compile="aot", **extras)
        assert len(packages) == 4
    finally:
        fused_policy._entry.cache_clear()
        fused_policy._kernel.cache_clear()


@pytest.mark.skipif(not THOROUGH or not HAS_CXX, reason="compiles (thorough profile, a C++ compiler)")
def test_an_aot_package_is_loaded_not_compiled_the_second_time(monkeypatch):
    """What a second process does: a new kernel for the same plan finds the package on disk."""
    from refimpl.losses import fused_aot, fused_policy

    old = -torch.rand(3, 5, dtype=torch.float64)
    batch = (old + 0.1, old, torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.rand(3, 5) > 0.3)
    assert_same_as_reference(PRESETS["cispo"], *batch, compile="aot")  # compiles, or loads
    fused_policy._entry.cache_clear()
    fused_policy._kernel.cache_clear()
    monkeypatch.setattr(fused_aot, "_compile", lambda *a: pytest.fail("compiled again"))
    assert_same_as_reference(PRESETS["cispo"], *batch, compile="aot")


def test_a_seq_sum_max_length_below_a_sequence_length_raises():
    """Dr. GRPO's L_max bounds every length (md eq. (11)), 1 included; the token sum without L_max is
    seq_mean_token_sum."""
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    for max_length in (1, 2):
        short = dataclasses.replace(PRESETS["dr_grpo"], max_length=max_length)
        message = rf"^variant.max_length \(L_max = {max_length}\) must be >= every sequence's length"
        with pytest.raises(ValueError, match=message):
            fused_policy_loss(old, old, adv, mask, short, compile=False)
        assert_same_as_reference(short, old + 0.1, old, adv, mask)  # the same error
    for v in (dataclasses.replace(PRESETS["dr_grpo"], max_length=3),
              dataclasses.replace(PRESETS["dr_grpo"], aggregation="seq_mean_token_sum")):
        assert_same_as_reference(v, old + 0.1, old, adv, mask)


def _dr_grpo_batch():
    g = torch.Generator().manual_seed(3)
    mask = torch.arange(9) < torch.tensor([9, 1, 0, 6, 2, 9])[:, None]
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64)
    logp = old + 0.1 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    return logp, old, torch.randn(6, generator=g, dtype=torch.float64), mask


def test_dr_grpo_l_max_is_a_runtime_input_of_one_kernel():
    """Dr. GRPO's L_max enters the fused function as a tensor, not as a constant of its plan: every
    L_max (and the sequence KL's weight L_max) shares one plan, hence one compiled graph, with the
    reference's values and its error message naming the L_max given."""
    from refimpl.losses import fused_policy

    logp, old, adv, mask = _dr_grpo_batch()
    plans = set()
    for max_length in (9, 12, 40):
        for kl_scale in ("token", "sequence"):
            v = dataclasses.replace(PRESETS["dr_grpo"], max_length=max_length, kl_coef=0.1, kl_scale=kl_scale)
            assert_same_as_reference(v, logp, old, adv, mask, ref_logp=old - 0.2)
            plans.add(fused_policy._plan(v, False, True, False, False, False, True, False))
    assert len({(p.variant.kl_scale, p.variant.max_length) for p in plans}) == 2 == len(plans)
    short = dataclasses.replace(PRESETS["dr_grpo"], max_length=7)
    with pytest.raises(ValueError, match=r"^variant.max_length \(L_max = 7\) must be >= every sequence's"):
        fused_policy_loss(logp, old, adv, mask, short, compile=False)


@pytest.mark.skipif(not THOROUGH or not HAS_CXX, reason="compiles (thorough profile, a C++ compiler)")
def test_a_new_dr_grpo_l_max_compiles_nothing():
    from torch._dynamo.utils import counters

    logp, old, adv, mask = _dr_grpo_batch()
    assert_same_as_reference(dataclasses.replace(PRESETS["dr_grpo"], max_length=9), logp, old, adv, mask,
                             compile=True)
    graphs = dict(counters["stats"])
    assert graphs.get("unique_graphs", 0) >= 1  # the first L_max compiled (or was traced) here
    for max_length in (10, 33):
        v = dataclasses.replace(PRESETS["dr_grpo"], max_length=max_length)
        assert_same_as_reference(v, logp, old, adv, mask, compile=True)
    assert dict(counters["stats"]) == graphs


def test_inductor_runs_scalar_loops_on_a_cpu_without_a_vector_instruction_set(monkeypatch):
    """Where inductor finds no vector ISA (``ATEN_CPU_CAPABILITY=default``, as ``make test-portable``
    runs) its C++ backend emitted vector reductions that did not compile: the fast path asks for
    scalar loops there (``cpp.simdlen`` 1), and for inductor's defaults elsewhere."""
    from torch._inductor import cpu_vec_isa

    from refimpl.losses import fused_policy

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", cpu_vec_isa.InvalidVecISA)
    assert fused_policy._inductor_options("cpu") == {"cpp.simdlen": 1}
    assert fused_policy._inductor_options("cuda") is None

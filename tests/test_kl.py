"""refimpl.kl against the exact spec (specs/kl.py, correctly rounded to float64), and against exact
enumeration on token trees (tabular.sequences): which estimator is unbiased for which KL and which
gradient it follows (specs/kl.md sections 2-3), plus the errata of kl.md section 4."""

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.kl import categorical_kl, kl_k1, kl_k2, kl_k3, kl_log_ratio
from specs.kl import (
    categorical_kl_float64,
    estimator_float64,
    prove_k3_nonnegative,
    verify_erratum_000_sign,
    verify_loss_gradients,
    verify_unbiasedness,
)
from tabular.sequences import (
    make_token_tree,
    path_kl,
    path_kl_gradient,
    per_state_kl,
    sequence_kl,
    sequence_kl_gradient,
    sequence_probabilities,
    softmax_policy,
)
from tests.strategies import token_tree_shapes, tree_logits

ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
F64 = torch.float64


def tree_path_logprobs(tree, logits: torch.Tensor):
    """``[Y, L]`` log pi(y_t | s_t) of every response of ``tree`` under ``softmax(logits)`` (torch,
    differentiable in ``logits``), and the ``[Y, L]`` bool mask of real tokens."""
    valid = torch.as_tensor(tree.seq_states >= 0)
    states = torch.as_tensor(np.where(tree.seq_states >= 0, tree.seq_states, 0))
    tokens = torch.as_tensor(np.where(tree.seq_tokens >= 0, tree.seq_tokens, 0))
    logp = torch.log_softmax(logits, dim=-1)[states, tokens]
    return torch.where(valid, logp, torch.zeros_like(logp)), valid


# ------------------------------------------------------------------ values against the exact spec
# The spec value is the exact one correctly rounded to float64 (specs._exact); the implementation
# may differ by its rounding errors: relative 1e-10 (a few ulp times the conditioning of the
# formulas, ~1 here), plus 4 units of the subnormal spacing 2^-1074 for results in the gradual
# underflow range, where each rounding adds up to half such a unit (IEEE 754's error model).
SUBNORMAL_FLOOR = 4 * 2.0**-1074
log_ratios = st.one_of(
    st.floats(-50, 50),
    st.floats(-1e-2, 1e-2),  # the series branch of k3
    st.sampled_from([0.0, 1e-12, -1e-12, 1e-8, -1e-8, 0.00999, -0.01, 0.01, 50.0, -50.0]),
)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@given(logp=st.floats(-30, 0), log_ratio=log_ratios)
# thorough profile (issue 11): a fixed 50-digit evaluation gave k3 = 2.85e-160 here; the exact
# value is 4.9e-353, below float64's range, so 0.0 is right
@example(logp=0.0, log_ratio=9.867920525191241e-177)
@example(logp=0.0, log_ratio=2.7472836393042783e-180)  # thorough, --hypothesis-seed=1 (the same)
@example(logp=0.0, log_ratio=1.2731430436264315e-275)  # thorough, --hypothesis-seed=2 (the same)
@example(logp=0.0, log_ratio=6.848809340911959e-197)  # thorough, --hypothesis-seed=3 (the same)
@example(logp=-1.0, log_ratio=2.0**-1074)  # the smallest subnormal log-ratio
def test_estimators_match_50_digit_spec(name, logp, log_ratio):
    ref = logp + log_ratio
    x = torch.tensor([logp], dtype=F64, requires_grad=True)
    value = ESTIMATORS[name](x, torch.tensor([ref], dtype=F64))
    (grad,) = torch.autograd.grad(value.sum(), x)
    exact_value, exact_grad = estimator_float64(name, logp, ref)
    assert value.item() == pytest.approx(exact_value, rel=1e-10, abs=SUBNORMAL_FLOOR)
    assert grad.item() == pytest.approx(exact_grad, rel=1e-10, abs=SUBNORMAL_FLOOR)


def test_k3_has_no_cancellation_near_one():
    # exp(x) - 1 - x in float64 would return 0 or garbage for |x| ~ 1e-9; the spec says x^2 / 2
    x = torch.tensor([1e-9, -1e-9, 1e-5], dtype=F64)
    k3 = kl_k3(torch.zeros(3, dtype=F64), x)
    expected = [estimator_float64("k3", 0.0, float(v))[0] for v in x]
    np.testing.assert_allclose(k3.numpy(), expected, rtol=1e-12)
    assert prove_k3_nonnegative()


@given(st.lists(st.floats(-20, 20), min_size=1, max_size=5).flatmap(
    lambda a: st.tuples(st.just(a), st.lists(st.floats(-20, 20), min_size=len(a), max_size=len(a)))))
def test_categorical_kl_matches_spec_both_directions(pair):
    a, b = pair
    p, q = torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64)
    for x, y in ((a, b), (b, a)):
        exact = categorical_kl_float64(x, y)
        got = categorical_kl(torch.tensor(x, dtype=F64), torch.tensor(y, dtype=F64)).item()
        assert got == pytest.approx(exact, rel=1e-10, abs=1e-12 * (1 + abs(exact)))
    # gradient against autograd of the plain formula
    p.requires_grad_(True)
    (g,) = torch.autograd.grad(categorical_kl(p, q), p)
    p2 = p.detach().clone().requires_grad_(True)
    naive = (torch.softmax(p2, -1) * (torch.log_softmax(p2, -1) - torch.log_softmax(q, -1))).sum()
    (g2,) = torch.autograd.grad(naive, p2)
    # dKL/dp_i = p_i (d_i - KL), d = log_softmax(p) - log_softmax(q): a difference of terms up to
    # max|logits| + log n, rounded a few times (a near-0 entry keeps only this absolute accuracy)
    floor = 8 * 2.0**-53 * (2 * max(map(abs, a + b)) + math.log(len(a)) + 1)
    np.testing.assert_allclose(g.numpy(), g2.numpy(), rtol=1e-9, atol=floor)


def test_categorical_kl_masked_vocabulary():
    p = torch.tensor([[0.0, 1.0, -math.inf]], dtype=F64, requires_grad=True)
    q = torch.tensor([[1.0, 0.0, 2.0]], dtype=F64)
    kl = categorical_kl(p, q)
    exact = categorical_kl_float64([0.0, 1.0, -1e6], [1.0, 0.0, 2.0])
    assert kl.item() == pytest.approx(exact, rel=1e-12, abs=0.0)
    (g,) = torch.autograd.grad(kl.sum(), p)
    assert torch.isfinite(g).all() and g[0, 2] == 0
    assert categorical_kl(q, p.detach()).item() == math.inf  # q puts mass where p has none
    assert categorical_kl(p.detach(), p.detach()).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_low_precision_inputs_and_extreme_log_ratios(dtype, name):
    gen = torch.Generator().manual_seed(3)
    logp = (-5 * torch.rand(64, generator=gen)).to(dtype)
    log_ratio = torch.cat([torch.linspace(-50, 50, 32), 1e-3 * torch.randn(32, generator=gen)])
    ref = (logp.float() + log_ratio).to(dtype)
    x = logp.clone().requires_grad_(True)
    value = ESTIMATORS[name](x, ref)
    assert value.dtype == torch.float32
    (grad,) = torch.autograd.grad(value.sum(), x)
    assert torch.isfinite(value).all()
    # the gradient has the dtype of logp; k3's true gradient -expm1(log r) is -5e21 at log r = 50,
    # beyond float16's range (65504): kl.md section 1 states the limit log r < 11.09 for float16
    representable = torch.full_like(log_ratio, True, dtype=torch.bool)
    if dtype == torch.float16 and name == "k3":
        representable = log_ratio < 11.0
        assert torch.isinf(grad[log_ratio > 11.2]).all()
    assert torch.isfinite(grad[representable]).all()
    # equals the float64 result on the same (rounded) inputs within float32 accuracy
    exact = ESTIMATORS[name](logp.double(), ref.double())
    np.testing.assert_allclose(value.detach().double().numpy(), exact.numpy(), rtol=2e-6, atol=1e-6)


def test_bad_inputs_raise():
    a = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="same shape"):
        kl_k3(a, torch.zeros(1, 3, dtype=F64))
    with pytest.raises(ValueError, match="ref_logp contains NaN"):
        kl_k1(a, torch.tensor([0.0, math.nan, 0.0], dtype=F64))
    with pytest.raises(TypeError, match="logp"):
        kl_k2(torch.zeros(3, dtype=torch.long), a)
    with pytest.raises(ValueError, match="logits_q contains NaN"):
        categorical_kl(a, torch.tensor([0.0, math.nan, 0.0], dtype=F64))
    with pytest.raises(ValueError, match="all -inf"):
        categorical_kl(a, torch.full((3,), -math.inf, dtype=F64))
    assert kl_log_ratio(torch.tensor([1.0]), torch.tensor([3.0], dtype=torch.bfloat16)).item() == 2.0


def test_symbolic_facts_of_the_spec():
    assert verify_unbiasedness(3)
    assert verify_loss_gradients(3)
    assert verify_erratum_000_sign(3)


# --------------------------------------------------------------- exact enumeration on token trees
@st.composite
def tree_and_two_policies(draw):
    v, length, eos = draw(token_tree_shapes(15))
    tree = make_token_tree(v, length, eos)
    return tree, draw(tree_logits(tree.num_states, v)), draw(tree_logits(tree.num_states, v))


@given(tree_and_two_policies())
def test_k1_and_k3_unbiased_for_per_state_and_sequence_kl(case):
    tree, logits, ref_logits = case
    pi, ref = softmax_policy(logits), softmax_policy(ref_logits)
    # per state: E_{a ~ pi(.|s)}[k(a)] over the whole vocabulary, all states at once
    logp_all = torch.log(torch.as_tensor(pi))
    ref_all = torch.log(torch.as_tensor(ref))
    kl_s = per_state_kl(pi, ref)
    for name in ("k1", "k3"):
        expectation = (torch.as_tensor(pi) * ESTIMATORS[name](logp_all, ref_all)).sum(-1).numpy()
        np.testing.assert_allclose(expectation, kl_s, rtol=1e-10, atol=1e-12)
    # along sampled paths: E_y[sum_t k_t] = sequence KL = path KL
    probs = torch.as_tensor(sequence_probabilities(tree, pi))
    logp, mask = tree_path_logprobs(tree, torch.as_tensor(logits))
    ref_logp, _ = tree_path_logprobs(tree, torch.as_tensor(ref_logits))
    seq_kl = sequence_kl(tree, pi, ref)
    assert seq_kl == pytest.approx(path_kl(tree, pi, ref), rel=1e-10, abs=1e-13)
    for name in ("k1", "k3"):
        per_sequence = (ESTIMATORS[name](logp, ref_logp) * mask).sum(-1)
        assert (probs * per_sequence).sum().item() == pytest.approx(seq_kl, rel=1e-10, abs=1e-12)


def test_k2_is_biased_for_the_kl_value():
    pi = torch.tensor([0.7, 0.2, 0.1], dtype=F64)
    ref = torch.tensor([0.1, 0.3, 0.6], dtype=F64)
    kl = float((pi * (pi.log() - ref.log())).sum())
    k2 = float((pi * kl_k2(pi.log(), ref.log())).sum())
    assert abs(k2 - kl) > 0.1


def expected_loss_gradients(tree, logits, ref_logits):
    """[S, V] exact E_y[grad sum_t k_t] for each estimator, with y ~ pi_theta not differentiated,
    plus the score-function gradients of k used as a (detached) sequence reward."""
    z = torch.tensor(logits, dtype=F64, requires_grad=True)
    probs = torch.as_tensor(sequence_probabilities(tree, softmax_policy(logits)))
    ref_logp, _ = tree_path_logprobs(tree, torch.as_tensor(ref_logits))
    out = {}
    for name, fn in ESTIMATORS.items():
        logp, mask = tree_path_logprobs(tree, z)
        k_sum = (fn(logp, ref_logp) * mask).sum(-1)
        (loss_grad,) = torch.autograd.grad((probs * k_sum).sum(), z, retain_graph=True)
        score = (logp * mask).sum(-1)  # log pi_theta(y)
        (score_grad,) = torch.autograd.grad((probs * score * k_sum.detach()).sum(), z)
        out[name] = (loss_grad.numpy(), score_grad.numpy())
    return out


@given(tree_and_two_policies())
def test_which_estimator_follows_which_gradient(case):
    """specs/kl.md eq. (7)-(8), exactly: k1 -> 0, k2 -> path-fixed forward KL, k3 -> path-fixed
    reverse KL as loss terms; k1 as reward with the score function -> sequence KL gradient, and
    k3 as reward -> sequence KL gradient once its pathwise term is added."""
    tree, logits, ref_logits = case
    ref = softmax_policy(ref_logits)
    grads = expected_loss_gradients(tree, logits, ref_logits)
    tol = dict(rtol=1e-9, atol=1e-12)
    # sum_y p(y) grad log p(y) = 0 exactly; in float64 each logit's entry sums <= Y terms of size <= p(y)
    # (Y = tree.num_sequences), and softmax's backward re-reads exp(logp), |logp| <= 2 * 2 + log V
    zero_floor = 4 * 2.0**-53 * (tree.num_sequences + 4 + math.log(logits.shape[-1]) + 1)
    np.testing.assert_allclose(grads["k1"][0], 0.0, atol=zero_floor)
    np.testing.assert_allclose(grads["k2"][0], path_kl_gradient(tree, logits, ref), **tol)
    np.testing.assert_allclose(grads["k3"][0], path_kl_gradient(tree, logits, ref, reverse=True), **tol)
    seq_grad = sequence_kl_gradient(tree, logits, ref)
    np.testing.assert_allclose(grads["k1"][1], seq_grad, **tol)
    np.testing.assert_allclose(grads["k3"][1] + grads["k3"][0], seq_grad, **tol)


def test_path_fixed_and_sequence_gradients_differ_beyond_one_step():
    """On a tree with two decisions the k2 loss gradient (8a) is not the sequence-KL gradient (8b),
    and neither k2 nor k3 is the other direction's gradient; on a bandit (8a) = (8b)."""
    rng = np.random.default_rng(7)
    for max_len, differ in ((2, True), (1, False)):
        tree = make_token_tree(3, max_len)
        logits, ref_logits = rng.normal(size=(2, tree.num_states, 3))
        ref = softmax_policy(ref_logits)
        grads = expected_loss_gradients(tree, logits, ref_logits)
        gap = np.abs(grads["k2"][0] - sequence_kl_gradient(tree, logits, ref)).max()
        assert (gap > 1e-3) if differ else (gap < 1e-12)
        assert np.abs(grads["k3"][0] - grads["k2"][0]).max() > 1e-3


def test_erratum_000_behaviour_policy_in_the_ratio():
    """kl.md section 4: samples from pi_old. k3 with pi_theta in the ratio is unbiased for
    KL(pi_theta || ref) only with the importance weight pi_theta / pi_old; with pi_old in the ratio
    (errata.md entry 12) it has no gradient in theta and estimates KL(pi_old || ref)."""
    old = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=F64)
    z = torch.tensor([2.0, -1.0, 0.0], dtype=F64, requires_grad=True)
    pi = torch.softmax(z, -1)
    kl_theta = categorical_kl(z, ref.log())
    naive = (old * kl_k3(pi.log(), ref.log())).sum()
    weighted = (old * (pi / old) * kl_k3(pi.log(), ref.log())).sum()
    assert abs(naive.item() - kl_theta.item()) > 1e-2
    assert weighted.item() == pytest.approx(kl_theta.item(), rel=1e-12, abs=0.0)
    as_in_000 = (old * kl_k3(old.log(), ref.log())).sum()
    assert not as_in_000.requires_grad
    assert as_in_000.item() == pytest.approx(categorical_kl(old.log(), ref.log()).item(), rel=1e-12, abs=0.0)


def test_erratum_000_kl_sign():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    as_written = float((p * (q.log() - p.log())).sum())  # errata.md entry 5: E_pi[log pi'/pi]
    kl = categorical_kl(p.log(), q.log()).item()
    assert kl > 0 and as_written == pytest.approx(-kl, rel=1e-14, abs=0.0)


@pytest.mark.parametrize("dtype, log_ratio", [(torch.float32, 100.0), (torch.float32, 88.75),
                                              (torch.float64, 710.0)])
def test_k3_beyond_the_dtypes_range_raises_instead_of_returning_inf(dtype, log_ratio):
    """kl.md, Range: kl_k3(logp=-100, ref_logp=0) in float32 is exactly e^100 - 101 = 2.7e43, beyond
    float32's 3.4e38: a one-line ValueError naming the arguments (not a silent inf). Just inside
    the range (log r = 88.7 in float32, 709.7 in float64) the value is finite; with
    check_finite=False (policy_loss's path, which checks the loss itself) IEEE inf is returned."""
    logp, ref = torch.tensor([-log_ratio], dtype=dtype), torch.tensor([0.0], dtype=dtype)
    hint = "; pass float64 log-probabilities" if dtype != torch.float64 else ""
    message = rf"^logp, ref_logp: k3 overflows {dtype} at ref_logp - logp = {log_ratio:.6g} .*range\){hint}$"
    with pytest.raises(ValueError, match=message):
        kl_k3(logp, ref)
    assert float(kl_k3(logp, ref, check_finite=False)) == math.inf
    inside = torch.tensor([88.7 if dtype == torch.float32 else 709.7], dtype=dtype)
    assert math.isfinite(float(kl_k3(-inside, torch.zeros_like(inside))))
    if dtype == torch.float32:  # the same tokens in float64: the exact value, no error
        exact = math.exp(log_ratio) - 1 - log_ratio  # 100 and 88.75 are exact in float32
        assert math.isclose(float(kl_k3(logp.double(), ref.double())), exact, rel_tol=1e-15)


def test_k3_at_an_infinite_log_ratio_is_its_limit_without_check():
    """log r = +inf (ref_logp finite, logp = -inf) and -inf: k3 = exp(x) - 1 - x tends to +inf at
    both ends; with check_finite=False both are +inf (inf - inf gave NaN at +inf), and the slope
    d k3 / d logp = 1 - r its limit too (-inf at r = +inf, 1 at r = 0); with the check the infinite
    log-probability is refused."""
    logp = torch.tensor([-math.inf, 0.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([0.0, -math.inf], dtype=F64)
    k3 = kl_k3(logp, ref, check_finite=False)
    assert k3.tolist() == [math.inf, math.inf]
    (grad,) = torch.autograd.grad(k3.sum(), logp)
    assert grad.tolist() == [-math.inf, 1.0]
    with pytest.raises(ValueError):
        kl_k3(logp, ref)


def test_k1_k2_raise_where_their_exact_value_overflows():
    big = torch.tensor([3e38], dtype=torch.float32)  # log r = -6e38 overflows float32 itself
    for estimator, name in ((kl_k1, "k1"), (kl_k2, "k2")):
        with pytest.raises(ValueError, match=rf"^logp, ref_logp: {name} overflows torch.float32 at "):
            estimator(big, -big)
    message = r"^logp, ref_logp: k2 overflows torch.float32 at ref_logp - logp = -3e\+19"
    with pytest.raises(ValueError, match=message):
        kl_k2(torch.tensor([3e19]), torch.tensor([0.0]))  # (3e19)^2 / 2 = 4.5e38 > 3.4e38
    assert float(kl_k2(torch.tensor([1e19]), torch.tensor([0.0]))) == pytest.approx(5e37, rel=1e-6, abs=0.0)

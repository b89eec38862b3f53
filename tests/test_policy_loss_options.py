"""Options of the policy loss from the source documents (spec: specs/policy_losses.md eq. (19),
(25)-(27); specs/advantages.md eq. (16)):

* the KL term's scale (Ouyang et al. 2022, eq. (2); Shao et al. 2024, eq. (3)): ``kl_scale="sequence"``
  penalises beta
  times the sequence KL (a sum over tokens, averaged over sequences) under every aggregation;
  ``"token"`` averages it per token inside the aggregation. Exact expectations on a token tree
  (every group of G i.i.d. responses enumerated, tabular's exact KLs), the sympy spec with a global
  normaliser, micro-batch additivity, and the errors;
* the "divide by sqrt(G)" aggregation (policy_losses.md eq. (10), (27)) (its normaliser and value by hand; its
  expected
  gradient is pinned in tests/test_group_expectations.py);
* ``upweighted_normalizer``, dynamic sampling's 1 / (1 - f) (exact values; its expected gradient
  is pinned in tests/test_group_expectations.py).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.advantages import dynamic_sampling_mask, dynamic_sampling_weights, group_advantages
from refimpl.losses import (
    AGGREGATIONS,
    PolicyLossVariant,
    get_preset,
    loss_normalizer,
    policy_loss,
    upweighted_normalizer,
)
from tabular.sequences import (
    chain_token_gradients,
    group_expectation,
    make_token_tree,
    path_kl_gradient,
    sequence_kl,
    sequence_probabilities,
    softmax_policy,
)
from tests.strategies import policy_loss_batches
from tests.test_policy_loss_reference import assert_close, loop_reference, spec_loss_and_grad

F64 = torch.float64
L_MAX = 5
BETA = 0.375
TOL = dict(rtol=1e-10, atol=1e-13)  # sums of a few hundred float64 terms of size ~1


def kl_variant(preset: str, kl_scale: str, estimator: str = "k3") -> PolicyLossVariant:
    v = get_preset(preset) if preset != "sqrt_g" else dataclasses.replace(
        get_preset("grpo"), aggregation="seq_sqrt_token_mean", group_size=3)
    return dataclasses.replace(v, kl_coef=BETA, kl_scale=kl_scale, kl_estimator=estimator,
                               max_length=L_MAX if v.aggregation == "seq_sum" else None)


def tree_case(seed: int, vocab: int = 3, max_len: int = 3):
    tree = make_token_tree(vocab, max_len)
    rng = np.random.default_rng(seed)
    return tree, rng.normal(size=(tree.num_states, vocab)), rng.normal(size=(tree.num_states, vocab))


def expected_kl_loss(tree, logits, ref_logits, group_size, v, source):
    """(E[loss], E[grad_logits loss]) over groups of G i.i.d. responses from pi = softmax(logits)
    at theta = theta_old with zero advantages (only the KL term), the graph built from the logits:
    ``source`` "ref" (v.kl_estimator on ref_logp) or "exact" (per-state KL(pi || ref) as ``kl=``)."""
    pi = softmax_policy(logits)
    valid = tree.seq_states >= 0
    states = np.where(valid, tree.seq_states, 0)
    tokens = np.where(valid, tree.seq_tokens, 0)
    ref_log = torch.log_softmax(torch.tensor(ref_logits, dtype=F64), dim=-1)

    def one_group(group):
        z = torch.tensor(logits, dtype=F64, requires_grad=True)
        log_pi = torch.log_softmax(z, dim=-1)
        s, a = torch.as_tensor(states[group]), torch.as_tensor(tokens[group])
        logp = log_pi[s, a]
        mask = torch.as_tensor(valid[group])
        kwargs = {"ref_logp": ref_log[s, a]} if source == "ref" else {
            "kl": (log_pi.exp() * (log_pi - ref_log)).sum(-1)[s]}
        zeros = torch.zeros(len(group), dtype=F64)
        loss, _ = policy_loss(logp, logp.detach(), zeros, mask, v, **kwargs)
        (grad,) = torch.autograd.grad(loss, z)
        return np.concatenate([[float(loss.detach())], grad.numpy().ravel()])

    out = group_expectation(sequence_probabilities(tree, pi), group_size, one_group)
    return out[0], out[1:].reshape(logits.shape)


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "sqrt_g"])
@pytest.mark.parametrize("estimator,source", [("k1", "ref"), ("k3", "ref"), ("k3", "exact")])
def test_sequence_scale_penalises_beta_times_the_sequence_kl_under_every_aggregation(preset, estimator,
                                                                                      source):
    """eq. (25), (26): E[KL part] = beta KL(pi(.|x) || pi_ref(.|x)) (Ouyang et al. 2022, eq. (2);
    Shao et al. 2024, eq. (3)); the
    expected gradient at theta = theta_old keeps the path distribution fixed: k3 gives
    beta sum_s d(s) (pi_s - ref_s), the exact per-state KL beta sum_s d(s) grad KL_s, k1 zero."""
    tree, logits, ref_logits = tree_case(1)
    pi, ref = softmax_policy(logits), softmax_policy(ref_logits)
    value, grad = expected_kl_loss(tree, logits, ref_logits, 2, kl_variant(preset, "sequence", estimator),
                                   source)
    assert value == pytest.approx(BETA * sequence_kl(tree, pi, ref), rel=1e-10, abs=0.0)
    if source == "exact":
        expected = BETA * path_kl_gradient(tree, logits, ref)
    elif estimator == "k3":
        expected = BETA * path_kl_gradient(tree, logits, ref, reverse=True)
    else:
        expected = np.zeros_like(logits)  # E[grad log pi(y)] = 0
    np.testing.assert_allclose(grad, expected, **TOL)


def test_token_scale_divides_the_kl_by_each_length_l_max_or_the_token_count():
    """eq. (25), "token": GRPO's per-sequence token mean gives beta E[log(pi(y) / ref(y)) / T(y)]
    (k1), Dr. GRPO beta KL / L_max, GSPO's seq_mean the sequence KL itself, and DAPO's token mean
    beta E[sum_i log(pi / ref)(y_i) / sum_i T_i] (a ratio over the group, enumerated here)."""
    tree, logits, ref_logits = tree_case(2)
    pi, ref = softmax_policy(logits), softmax_policy(ref_logits)
    probs, ref_probs = sequence_probabilities(tree, pi), sequence_probabilities(tree, ref)
    log_ratio = np.log(probs) - np.log(ref_probs)
    kl = sequence_kl(tree, pi, ref)
    group = 2
    values = {p: expected_kl_loss(tree, logits, ref_logits, group, kl_variant(p, "token", "k1"), "ref")[0]
              for p in ("grpo", "dr_grpo", "gspo", "dapo")}
    assert values["grpo"] == pytest.approx(BETA * probs @ (log_ratio / tree.lengths), rel=1e-10, abs=0.0)
    assert values["dr_grpo"] == pytest.approx(BETA * kl / L_MAX, rel=1e-10, abs=0.0)
    assert values["gspo"] == pytest.approx(BETA * kl, rel=1e-10, abs=0.0)
    token_mean = sum(np.prod(probs[list(d)]) * log_ratio[list(d)].sum() / tree.lengths[list(d)].sum()
                     for d in itertools.product(range(tree.num_sequences), repeat=group))
    assert values["dapo"] == pytest.approx(BETA * token_mean, rel=1e-10, abs=0.0)
    assert abs(values["grpo"] - BETA * kl) > 1e-2 * BETA * kl  # the scales differ on this tree


def test_token_scale_gradient_under_grpo_weights_each_response_by_one_over_its_length():
    """eq. (26), "token" with GRPO and k3: E[grad] = beta sum_y pi(y) / T(y) sum_t (1 - ref/pi)(y_t)
    grad log pi(y_t | s_t): each response's path KL gradient divided by its length."""
    tree, logits, ref_logits = tree_case(3)
    pi, ref = softmax_policy(logits), softmax_policy(ref_logits)
    probs = sequence_probabilities(tree, pi)
    expected = np.zeros_like(logits)
    for k in range(tree.num_sequences):
        n = tree.lengths[k]
        s, a = tree.seq_states[k, :n], tree.seq_tokens[k, :n]
        token_grads = np.zeros((1, tree.max_len))
        token_grads[0, :n] = (1 - ref[s, a] / pi[s, a]) / n
        expected += probs[k] * chain_token_gradients(tree, pi, [k], token_grads)
    _, grad = expected_kl_loss(tree, logits, ref_logits, 2, kl_variant("grpo", "token"), "ref")
    np.testing.assert_allclose(grad, BETA * expected, **TOL)
    sequence = BETA * path_kl_gradient(tree, logits, ref, reverse=True)
    assert np.abs(grad - sequence).max() > 1e-3 * np.abs(sequence).max()


def _batch(seed: int, n: int = 5, t: int = 4):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, t, generator=g) < 0.75
    mask[:, 0] = True
    mask[2] = False  # an empty row: not a sequence
    old = -torch.rand(n, t, generator=g, dtype=F64)
    logp = old + 0.2 * torch.randn(n, t, generator=g, dtype=F64)
    return {"logp": logp, "old_logp": old, "advantages": torch.randn(n, generator=g, dtype=F64), "mask": mask,
            "ref_logp": old + 0.3 * torch.randn(n, t, generator=g, dtype=F64)}


SEQUENCE_COUNTING = [a for a in AGGREGATIONS if a != "token_mean"]


def _sequence_kl_variant(aggregation: str) -> PolicyLossVariant:
    return dataclasses.replace(get_preset("grpo"), aggregation=aggregation, kl_coef=0.5, kl_scale="sequence",
                               max_length=6 if aggregation == "seq_sum" else None,
                               group_size=3 if aggregation == "seq_sqrt_token_mean" else None)


@pytest.mark.parametrize("aggregation", SEQUENCE_COUNTING)
@pytest.mark.parametrize("seed", [0, 1])
def test_sequence_scale_with_a_global_normalizer_matches_the_spec_and_micro_batches_sum(aggregation, seed):
    """The global normaliser carries the sequence count (D, D / L_max, D sqrt(G)): the spec with the
    symbol D, the loop reference, and micro-batches summing to the full batch."""
    v = _sequence_kl_variant(aggregation)
    b = _batch(seed)
    d = float(loss_normalizer(b["mask"], v)) * 1.5  # a larger global batch
    x = b["logp"].clone().requires_grad_(True)
    common = dict(ref_logp=b["ref_logp"], normalizer=d)
    loss, _ = policy_loss(x, b["old_logp"], b["advantages"], b["mask"], v, **common)
    (grad,) = torch.autograd.grad(loss, x)
    spec_loss, spec_grad, scale = spec_loss_and_grad(v, b["logp"], b["old_logp"], b["advantages"], b["mask"],
                                                     ref_logp=b["ref_logp"], normalizer=d)
    assert_close(loss.detach(), spec_loss, scale, "loss")
    assert_close(grad, spec_grad, scale + float(spec_grad.abs().sum()), "gradient")
    y = b["logp"].clone().requires_grad_(True)
    loop = loop_reference(y, b["old_logp"], b["advantages"], b["mask"], v, **common)
    assert_close(loss.detach(), loop.detach(), scale, "loss vs loop")
    full_d = loss_normalizer(b["mask"], v)
    z = b["logp"].clone().requires_grad_(True)
    parts = sum(policy_loss(z[r], b["old_logp"][r], b["advantages"][r], b["mask"][r], v,
                            ref_logp=b["ref_logp"][r], normalizer=full_d)[0]
                for r in (slice(0, 2), slice(2, 5)))
    whole, _ = policy_loss(z, b["old_logp"], b["advantages"], b["mask"], v, ref_logp=b["ref_logp"])
    assert float(parts.detach()) == pytest.approx(float(whole.detach()), rel=1e-13, abs=0.0)
    parts_grad, whole_grad = (torch.autograd.grad(x_, z)[0] for x_ in (parts, whole))
    assert torch.allclose(parts_grad, whole_grad, rtol=1e-13, atol=1e-16)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sequence_scale_is_beta_times_the_mean_sequence_kl_whatever_the_aggregation(aggregation):
    """eq. (19) by hand: zero advantages, so the loss is beta (1/S) sum_i sum_t k1_{i,t} with S the
    non-empty rows (4 of 5), for every aggregation."""
    v = dataclasses.replace(_sequence_kl_variant(aggregation), kl_estimator="k1")
    b = _batch(2)
    zeros = torch.zeros(5, dtype=F64)
    loss, _ = policy_loss(b["logp"], b["old_logp"], zeros, b["mask"], v, ref_logp=b["ref_logp"])
    by_hand = 0.5 * float(((b["logp"] - b["ref_logp"]) * b["mask"]).sum()) / 4
    assert float(loss) == pytest.approx(by_hand, rel=1e-13, abs=0.0)


def test_token_mean_with_a_global_normalizer_and_a_sequence_kl_is_an_error():
    v = dataclasses.replace(get_preset("dapo"), kl_coef=0.5, kl_scale="sequence")
    b = _batch(3)
    with pytest.raises(ValueError, match="normalizer: variant.kl_scale='sequence'"):
        policy_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"], v, ref_logp=b["ref_logp"],
                    normalizer=9.0)


@pytest.mark.parametrize("fields,message", [
    ({"kl_scale": "tokens"}, r"variant.kl_scale must be one of \('token', 'sequence'\)"),
    ({"group_size": 0}, "variant.group_size must be a positive int or None"),
    ({"group_size": 2.0}, "variant.group_size must be a positive int or None"),
    ({"group_size": True}, "variant.group_size must be a positive int or None"),
])
def test_variant_rejects_bad_kl_scale_and_group_size(fields, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossVariant(**fields)


def test_sqrt_g_aggregation_needs_group_size_counts_sequences_and_multiplies_by_sqrt_g():
    """md eq. (10)-(11): D counts the non-empty sequences (a float32 count, additive over
    micro-batches), and each contribution carries sqrt(G): 6 one-token sequences (3 groups of G = 2)
    with A = 1 at ratio 1 give -sqrt(2) (= (1/3) sum_b (1/sqrt(2)) (1 + 1))."""
    mask = torch.ones(6, 1, dtype=torch.bool)
    v = dataclasses.replace(get_preset("grpo"), aggregation="seq_sqrt_token_mean")
    with pytest.raises(ValueError, match=r"variant.group_size \(G\) is required"):
        loss_normalizer(mask, v)
    v = dataclasses.replace(v, group_size=2)
    d = loss_normalizer(mask, v)
    assert d.dtype == torch.float32 and float(d) == 6.0
    zeros = torch.zeros(6, 1, dtype=F64)
    loss, _ = policy_loss(zeros, zeros, torch.ones(6, dtype=F64), mask, v)
    assert float(loss) == pytest.approx(-(2**0.5), rel=1e-15, abs=0.0)


# each sequence's token sum averaged over the sequences (md eqs. (10)-(11)), by hand: rows of 2, 0
# and 3 tokens, eps 0.25 (bounds 0.75 and 1.25), every unit either at ratio 1 (its term A, slope A)
# or far outside the band on its clipped side (its term the bound times A, slope 0), KL k1 values
# k = logp - ref: every number is dyadic, so the float64 results are exact.
_TOKEN_SUM_OLD = [[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [-1.5, -1.0, -2.0]]
_TOKEN_SUM_MASK = [[True, True, False], [False, False, False], [True, True, True]]
_TOKEN_SUM_K1 = [[0.25, -0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 0.5, 0.25]]  # sum 1.5
# (ratio, log-ratios, advantages, loss without KL, gradient without KL)
_TOKEN_SUM_CASES = {
    # token ratio: row 0 terms 1.5 (r = 1) + 1.25 x 1.5 (r = e, A > 0), row 2 -0.5 + 0.75 x (-0.5)
    # (r = 1/e, A < 0) - 0.5: loss -(3.375 - 1.375) / 2 sequences; slope A / 2 at ratio 1, 0 if clipped
    "token": ([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, -1.0, 0.0]], [1.5, 7.0, -0.5], -1.0,
              [[-0.75, 0.0, 0.0], [0.0, 0.0, 0.0], [0.25, 0.0, 0.25]]),
    # GSPO's sequence ratio counted once per token: row 0 s = exp(0) = 1, c = -2 x 1.5; row 2
    # s = e > 1.25 with A > 0, c = -3 x 1.25 x 0.5: loss (-3 - 1.875) / 2; row 0's slope
    # -T s A / (T D) = -0.75 per token, row 2 clipped
    "sequence_mean": ([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], [1.5, 7.0, 0.5], -2.4375,
                      [[-0.75, -0.75, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
}


@pytest.mark.parametrize("kl_scale", [None, "token", "sequence"])
@pytest.mark.parametrize("ratio", sorted(_TOKEN_SUM_CASES))
def test_seq_mean_token_sum_by_hand(ratio, kl_scale):
    """The KL under either scale adds beta (1/S) sum_i sum_t k1 = 0.5 x 1.5 / 2 = 0.375 and beta / S
    = 0.25 to every token's gradient (md eq. (19) with u = D / S = 1: the two scales coincide); the
    reference, the fast path and the normaliser (2 sequences) agree exactly."""
    from refimpl.losses.fused_policy import fused_policy_loss

    x, adv, loss_by_hand, grad_by_hand = _TOKEN_SUM_CASES[ratio]
    base = get_preset("dr_grpo" if ratio == "token" else "gspo")
    v = dataclasses.replace(base, eps_low=0.25, eps_high=0.25, aggregation="seq_mean_token_sum")
    mask = torch.tensor(_TOKEN_SUM_MASK)
    old = torch.tensor(_TOKEN_SUM_OLD, dtype=F64)
    logp = old + torch.tensor(x, dtype=F64)
    kwargs = {}
    if kl_scale is not None:
        v = dataclasses.replace(v, kl_coef=0.5, kl_estimator="k1", kl_scale=kl_scale)
        kwargs["ref_logp"] = logp - torch.tensor(_TOKEN_SUM_K1, dtype=F64)
        loss_by_hand += 0.375
        grad_by_hand = [[g + 0.25 if m else 0.0 for g, m in zip(gr, mr, strict=True)]
                        for gr, mr in zip(grad_by_hand, _TOKEN_SUM_MASK, strict=True)]
    assert float(loss_normalizer(mask, v)) == 2.0
    for fn in (policy_loss, lambda *a, **k: fused_policy_loss(*a, compile=False, **k)):
        leaf = logp.clone().requires_grad_(True)
        loss, _ = fn(leaf, old, torch.tensor(adv, dtype=F64), mask, v, **kwargs)
        (grad,) = torch.autograd.grad(loss, leaf)
        assert float(loss.detach()) == loss_by_hand
        assert grad.tolist() == grad_by_hand


@pytest.mark.parametrize("preset,total", [("grpo", 5.0), ("dr_grpo", 5.0 * L_MAX), ("dapo", 13.0),
                                          ("gspo", 5.0), ("token_sum", 5.0)])
def test_upweighted_normalizer_is_1_minus_f_times_the_whole_batch_s(preset, total):
    """advantages.md eq. (16): (1 - f) D over the non-empty rows of the mask (an empty row is no
    sequence, whatever keep says); D itself when every row is dropped."""
    if preset == "token_sum":
        v = dataclasses.replace(get_preset("dr_grpo"), aggregation="seq_mean_token_sum")
    else:
        v = dataclasses.replace(get_preset(preset), max_length=L_MAX if preset == "dr_grpo" else None)
    mask = torch.zeros(6, 4, dtype=torch.bool)
    for i, n in enumerate([4, 1, 0, 3, 2, 3]):  # 13 tokens in 5 non-empty rows
        mask[i, :n] = True
    keep = torch.tensor([True, False, True, True, False, True])  # drops 2 of the 5 sequences
    d = upweighted_normalizer(mask, v, keep)
    assert d.dtype == torch.float64 and d.shape == ()
    assert float(d) == pytest.approx(total * 3 / 5, rel=1e-15, abs=0.0)
    assert float(upweighted_normalizer(mask, v, torch.zeros(6, dtype=torch.bool))) == total
    assert float(upweighted_normalizer(mask, v, torch.ones(6, dtype=torch.bool))) == total
    if preset != "dapo":  # sequence counts: the kept rows' own denominator
        assert float(d) == float(loss_normalizer(mask & keep[:, None], v))


def _dynamic_sampling_variant(preset: str) -> PolicyLossVariant:
    return dataclasses.replace(get_preset(preset), max_length=L_MAX if preset == "dr_grpo" else None)


def _both_forms(logp, old_logp, rewards, group_ids, mask, v):
    """(loss, grad) of dynamic sampling's two forms (advantages.md eq. (16)): the advantages
    weighted by ``dynamic_sampling_weights(..., mask=mask)``, and the filtered rows over
    ``upweighted_normalizer``."""
    advantages = group_advantages(rewards, group_ids, scale="none", singleton="zero")
    keep = dynamic_sampling_mask(rewards, group_ids)
    weights = dynamic_sampling_weights(rewards, group_ids, mask=mask)
    out = []
    for adv, rows, normalizer in ((advantages * weights, mask, None),
                                  (advantages, mask & keep[:, None], upweighted_normalizer(mask, v, keep))):
        x = logp.clone().requires_grad_(True)
        loss, _ = policy_loss(x, old_logp, adv, rows, v, normalizer=normalizer)
        out.append((loss.detach(), torch.autograd.grad(loss, x)[0]))
    return out


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo"])
def test_dynamic_sampling_forms_agree_when_a_row_is_empty(preset):
    """The issue's case: rewards (0, 1, 1, 1), groups (0, 0, 1, 1), row 3 empty, mean-centred
    advantages (-1/2, 1/2, 0, 0). Group 1 is dropped; of the 3 non-empty rows 1 is, so f = 1/3 and
    the kept rows are upweighted by 3/2 in both forms (f over all 4 rows gave 2 to the weights).
    At ratio 1 row i's gradient, summed over its tokens, is -A_i (its token count) / ((1 - f) D):
    GRPO (D = 3 rows, per-row means) +-1/4, DAPO (D = 9 tokens) +-1/4, Dr. GRPO (D = 3 L_max)
    +-3 / (4 L_max), i.e. +-1/4 times 3 / L_max."""
    v = _dynamic_sampling_variant(preset)
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=F64)
    group_ids = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[3] = False
    assert dynamic_sampling_weights(rewards, group_ids, mask=mask).tolist() == [1.5, 1.5, 0.0, 0.0]
    assert dynamic_sampling_weights(rewards, group_ids).tolist() == [2.0, 2.0, 0.0, 0.0]  # no mask: all N
    zeros = torch.zeros(4, 3, dtype=F64)
    (loss_w, grad_w), (loss_n, grad_n) = _both_forms(zeros, zeros, rewards, group_ids, mask, v)
    scale = L_MAX / 3 if preset == "dr_grpo" else 1.0
    expected = torch.tensor([0.25, -0.25, 0.0, 0.0], dtype=F64)
    for grad in (grad_w, grad_n):
        assert torch.allclose(grad.sum(dim=-1) * scale, expected, rtol=1e-15, atol=0.0)
    assert float(loss_w) == float(loss_n) == 0.0  # the centred advantages sum to 0 at ratio 1


@given(batch=policy_loss_batches(boundaries=(0.8, 1.2)), data=st.data())
@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_dynamic_sampling_weights_equal_the_upweighted_normalizer_on_every_mask(preset, batch, data):
    """advantages.md eq. (16) as a property: random masks with empty rows (and all-empty batches),
    random groups with and without signal; both forms give the same loss and gradient (float64,
    the same terms summed in another order: 1e-12 relative). f counts only non-empty rows."""
    v = _dynamic_sampling_variant(preset)
    n = batch["mask"].shape[0]
    rewards = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)),
                           dtype=F64)
    group_ids = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    mask = torch.as_tensor(batch["mask"])
    logp, old = torch.tensor(batch["logp"], dtype=F64), torch.tensor(batch["old_logp"], dtype=F64)
    (loss_w, grad_w), (loss_n, grad_n) = _both_forms(logp, old, rewards, group_ids, mask, v)
    scale = float(grad_w.abs().sum()) + 1.0
    assert abs(float(loss_w) - float(loss_n)) <= 1e-12 * scale
    assert torch.allclose(grad_w, grad_n, rtol=1e-12, atol=1e-12 * scale)
    if not bool(mask.any()):  # an all-empty batch: loss 0 with zero gradient in both forms
        assert float(loss_n) == 0.0 and not bool(grad_n.any())


def test_an_all_empty_batch_gives_loss_0_with_zero_gradient_through_the_upweighted_normalizer():
    """upweighted_normalizer of an empty mask is 1, not 0 (which policy_loss rejects as a
    normaliser): no row counts, the loss is 0 with zero gradient, as with normalizer=None."""
    for preset in ("grpo", "dapo", "dr_grpo"):
        v = _dynamic_sampling_variant(preset)
        mask = torch.zeros(3, 2, dtype=torch.bool)
        for keep in (torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)):
            d = upweighted_normalizer(mask, v, keep)
            assert float(d) == 1.0 and d.dtype == F64
            x = torch.randn(3, 2, dtype=F64, requires_grad=True)
            loss, _ = policy_loss(x, x.detach(), torch.ones(3, dtype=F64), mask & keep[:, None], v,
                                  normalizer=d)
            (grad,) = torch.autograd.grad(loss, x)
            assert float(loss.detach()) == 0.0 and not bool(grad.any())


def test_dynamic_sampling_weights_reject_a_bad_mask_by_name():
    rewards, ids = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    prefix = r"^mask must be a \[N, T\] tensor with N = 2 rows, got "
    for mask, message in [(torch.ones(3, 2, dtype=torch.bool), prefix + r"\(3, 2\)$"),
                          (torch.ones(2, dtype=torch.bool), prefix + r"\(2,\)$"),
                          ([[1, 0], [1, 1]], prefix + r"list$"),
                          (torch.tensor([[2, 0], [1, 1]]), r"^mask must be bool or contain only 0 and 1$")]:
        with pytest.raises(ValueError, match=message):
            dynamic_sampling_weights(rewards, ids, mask=mask)
    assert dynamic_sampling_weights(rewards, ids, mask=torch.tensor([[1, 0], [0, 0]])).tolist() == [1.0, 0.0]


def test_upweighted_normalizer_rejects_bad_input():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="keep must be a bool torch.Tensor, got dtype torch.float32"):
        upweighted_normalizer(mask, get_preset("grpo"), torch.ones(2))
    with pytest.raises(TypeError, match="keep must be a bool torch.Tensor, got list"):
        upweighted_normalizer(mask, get_preset("grpo"), [True, True])
    with pytest.raises(ValueError, match=r"keep must have shape \(2,\) on cpu, got \(3,\) on cpu"):
        upweighted_normalizer(mask, get_preset("grpo"), torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="variant must be a PolicyLossVariant"):
        upweighted_normalizer(mask, "grpo", torch.ones(2, dtype=torch.bool))


def test_the_two_kl_scales_coincide_under_seq_mean_and_differ_elsewhere():
    """md eq. (12) vs (19): GSPO's seq_mean and seq_mean_token_sum already sum the KL over each
    sequence and average over sequences; the other aggregations divide it by T_i, L_max or the mean
    length."""
    b = _batch(4)
    x = b["logp"].clone().requires_grad_(True)
    for aggregation in AGGREGATIONS:
        token, sequence = (dataclasses.replace(_sequence_kl_variant(aggregation), kl_scale=scale)
                           for scale in ("token", "sequence"))
        losses = [policy_loss(x, b["old_logp"], b["advantages"], b["mask"], v, ref_logp=b["ref_logp"])[0]
                  for v in (token, sequence)]
        grads = [torch.autograd.grad(loss, x)[0] for loss in losses]
        same = aggregation in ("seq_mean", "seq_mean_token_sum")
        assert (abs(float(losses[0].detach()) - float(losses[1].detach())) <= 1e-15) == same, aggregation
        assert torch.allclose(grads[0], grads[1], rtol=1e-14, atol=1e-16) == same, aggregation


@pytest.mark.parametrize("ratio", ["token", "sequence_mean", "gspo_token"])
def test_sqrt_g_gradient_at_ratio_one_is_sqrt_g_times_grpo_s(ratio):
    """md eq. (17) for seq_sqrt_token_mean (sympy): -A_i sqrt(G) / (T_i N) per token at ratio 1."""
    import specs.policy_losses as spec

    assert spec.prove_gradient_at_ratio_one(spec.LossSpec(ratio=ratio, aggregation="seq_sqrt_token_mean",
                                                          group_size=3), (2, 1, 0, 3))


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo"])
def test_upweighted_dynamic_sampling_loss_matches_the_spec(preset):
    """advantages.md eq. (16) through md eq. (12): the kept rows with D = (1 - f) D_all, against the
    sympy spec with that global denominator (float64, correctly rounded)."""
    v = dataclasses.replace(get_preset(preset), max_length=L_MAX if preset == "dr_grpo" else None)
    b = _batch(5, n=6)
    keep = torch.tensor([True, False, True, True, False, True])
    d = upweighted_normalizer(b["mask"], v, keep)
    kept = b["mask"] & keep[:, None]
    x = b["logp"].clone().requires_grad_(True)
    loss, _ = policy_loss(x, b["old_logp"], b["advantages"], kept, v, normalizer=d)
    (grad,) = torch.autograd.grad(loss, x)
    spec_loss, spec_grad, scale = spec_loss_and_grad(v, b["logp"], b["old_logp"], b["advantages"], kept,
                                                     normalizer=float(d))
    assert_close(loss.detach(), spec_loss, scale, "loss")
    assert_close(grad, spec_grad, scale + float(spec_grad.abs().sum()), "gradient")

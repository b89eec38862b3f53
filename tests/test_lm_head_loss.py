"""refimpl.losses.lm_head_loss.lm_head_policy_loss: ``policy_loss(lm_head_logprobs(...))`` with each
chunk's logits formed once (policy_losses.md eqs. (10)-(12), (19) and "Global normaliser"; kl.md eqs.
(14')-(15')). Against the two-step code on the same chunks: the loss and metrics bitwise (the same
log-probabilities into the same ``policy_loss``), the gradients w.r.t. hidden and weight within the
rounding of the per-token factors; the number of ``[N, d] x [d, V]`` products (three, not four)
counted at torch's dispatch; the two-step fallback where a chunk cannot hold whole sequences;
micro-batches; the peak memory; errors by name."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refimpl.losses.lm_head import LM_HEAD_TEMPORARIES, lm_head_chunk_rows, lm_head_logprobs
from refimpl.losses.lm_head_loss import fused_chunk_tokens, lm_head_policy_loss
from refimpl.losses.policy import GRPO, GSPO, PRESETS, loss_normalizer, policy_loss
from tests.test_logprobs_chunks import PER_TOKEN, measured

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
U = 2.0**-53


def batch(n=3, t=5, d=4, v=7, *, seed=0, dtype=torch.float64, per_token=False):
    """Hidden states, a weight, tokens, old / reference / behaviour log-probs near the policy's,
    advantages of both signs and a mask with an empty row and rows of unequal lengths."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, t, d, generator=gen, dtype=torch.float64).to(dtype)
    weight = (2 * torch.randn(v, d, generator=gen, dtype=torch.float64)).to(dtype)
    tokens = torch.randint(0, v, (n, t), generator=gen)
    with torch.no_grad():
        logp = lm_head_logprobs(hidden, weight, tokens).double()
    near = {name: (logp + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)).float()
            for name in ("old_logp", "ref_logp", "behavior_logp")}
    advantages = torch.randn(*((n, t) if per_token else (n,)), generator=gen, dtype=torch.float64).float()
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    lengths[n // 2] = 0
    mask = torch.arange(t) < lengths.unsqueeze(1)
    return hidden, weight, tokens, near, advantages, mask


def two_step(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows, **extra):
    """(loss, metrics, grad hidden, grad weight, d loss / d logp) of the two-step code."""
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp = lm_head_logprobs(h, w, tokens, chunk_rows=chunk_rows)
    logp.retain_grad()
    loss, metrics = policy_loss(logp, near["old_logp"], advantages, mask, variant, **extra)
    loss.backward()
    return loss.detach(), metrics, h.grad, w.grad, logp.grad


def fused(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows, **extra):
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, metrics = lm_head_policy_loss(h, w, tokens, near["old_logp"], advantages, mask, variant,
                                        chunk_rows=chunk_rows, **extra)
    loss.backward()
    return loss.detach(), metrics, h.grad, w.grad


class _Products(TorchDispatchMode):
    """The multiply-adds of every matrix product torch runs while it is active, forward and backward
    (``mm``, ``addmm``, in place or into ``out=``: torch's FlopCounterMode skips ``addmm_``)."""

    def __init__(self):
        super().__init__()
        self.multiply_adds = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "addmm_"):
            a, b = args[1:3] if name.startswith("addmm") else args[:2]
            self.multiply_adds += a.numel() * b.shape[-1]
        return func(*args, **(kwargs or {}))


def products(fn) -> int:
    with _Products() as counter:
        fn()
    return counter.multiply_adds


def assert_equal_to_the_two_step_code(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows,
                                      counts: list | None = None, **extra):
    """The loss and metrics bitwise (the chunks' log-probabilities are the same numbers, fed to the
    same policy_loss); the gradients within the rounding of the per-token factor g = d loss / d log p
    (the same formulas on the chunk's rows, a few u |g| per entry: 16 u max|g|), carried through
    dlogits = g (onehot - p) (|entries| <= |g|) into products of V (hidden) or N T (weight) terms,
    each term rounded once more (u |g| max|w| or max|h|). (On the development machine they are
    bitwise equal: the same g, the same operations.) ``counts``: where given, gets the two-step code's
    and the fused path's multiply-adds in products."""
    args = (hidden, weight, tokens, near, advantages, mask, variant, chunk_rows)
    with _Products() as two_step_products:
        want_loss, want_metrics, want_h, want_w, g = two_step(*args, **extra)
    with _Products() as fused_products:
        loss, metrics, got_h, got_w = fused(*args, **extra)
    if counts is not None:
        counts += [two_step_products.multiply_adds, fused_products.multiply_adds]
    assert torch.equal(loss, want_loss)
    assert metrics.keys() == want_metrics.keys()
    for name, value in metrics.items():
        assert torch.equal(value, want_metrics[name]), name
    u = U if hidden.dtype == torch.float64 else 2.0**-24
    slack = 20 * u * float(g.abs().max())  # 16 u |g| from g, u |g| from a product's term's rounding
    n_tokens, vocab = tokens.numel(), weight.shape[0]
    torch.testing.assert_close(got_h, want_h, rtol=0.0, atol=vocab * slack * float(weight.abs().max()))
    torch.testing.assert_close(got_w, want_w, rtol=0.0, atol=n_tokens * slack * float(hidden.abs().max()))


def preset(name):
    """The preset with a KL term on ``ref_logp`` (Dr. GRPO with L_max = T)."""
    variant = dataclasses.replace(PRESETS[name], kl_coef=0.04)
    return dataclasses.replace(variant, max_length=5) if variant.aggregation == "seq_sum" else variant


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_equals_the_two_step_code_with_three_products(name):
    """N = 3, T = 5, d = 4, V = 7, float64: token-level presets in chunks of 4 tokens (cutting rows),
    sequence-level ones (GSPO, GSPO-token) in chunks of 2 whole rows; each forms its logits once:
    3 products of N T d V multiply-adds each, where the two-step code forms them twice (4)."""
    hidden, weight, tokens, near, advantages, mask = batch()
    variant = preset(name)
    chunk_rows = 4 if variant.ratio == "token" else 10
    assert fused_chunk_tokens(variant, 5, chunk_rows) == chunk_rows
    counts = []
    assert_equal_to_the_two_step_code(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows,
                                      counts, ref_logp=near["ref_logp"])
    unit = tokens.numel() * hidden.shape[-1] * weight.shape[0]
    assert counts == [4 * unit, 3 * unit]


VARIANTS = {
    "per-token advantages, dual clip": (dataclasses.replace(GRPO, dual_clip=3.0), True, {}),
    "behaviour truncation, k2": (dataclasses.replace(GRPO, behavior_correction="truncate", kl_coef=0.1,
                                                     kl_estimator="k2"), False, {"behavior": True}),
    "token log-clip (reference path)": (dataclasses.replace(GRPO, gate="log_clip", eps_low=0.1,
                                                            eps_high=0.1), False, {}),
    "sqrt(G) aggregation, sequence KL": (dataclasses.replace(GRPO, aggregation="seq_sqrt_token_mean",
                                                             group_size=3, kl_coef=0.2, kl_scale="sequence"),
                                         False, {}),
    "GSPO with k1 in one chunk": (dataclasses.replace(GSPO, kl_coef=0.1, kl_estimator="k1"), False, {}),
    "seq_mean_token_sum, one token a chunk": (dataclasses.replace(GRPO, aggregation="seq_mean_token_sum"),
                                              True, {"chunk_rows": 1}),
}


@pytest.mark.parametrize("label", list(VARIANTS))
def test_variants_beyond_the_presets(label):
    variant, per_token, options = VARIANTS[label]
    hidden, weight, tokens, near, advantages, mask = batch(seed=1, per_token=per_token)
    extra = {"ref_logp": near["ref_logp"]} if variant.kl_coef > 0 else {}
    if options.get("behavior"):
        extra["behavior_logp"] = near["behavior_logp"]
    chunk_rows = options.get("chunk_rows", 15 if variant.sequence_level else 6)
    assert fused_chunk_tokens(variant, 5, chunk_rows) == chunk_rows
    assert_equal_to_the_two_step_code(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows,
                                      **extra)


def test_micro_batches_with_the_global_normaliser_sum_to_the_batch():
    """policy_losses.md "Global normaliser": two micro-batches of the rows, each with
    normalizer = loss_normalizer(whole mask), give losses and gradients that sum to the whole
    batch's (DAPO's token_mean: the parts' token counts differ)."""
    hidden, weight, tokens, near, advantages, mask = batch(n=4, seed=2)
    variant = PRESETS["dapo"]
    whole = fused(hidden, weight, tokens, near, advantages, mask, variant, 3)
    total = loss_normalizer(mask, variant)
    parts = [fused(hidden[rows], weight, tokens[rows], {k: x[rows] for k, x in near.items()},
                   advantages[rows], mask[rows], variant, 3, normalizer=total)
             for rows in (slice(0, 1), slice(1, 4))]
    torch.testing.assert_close(parts[0][0] + parts[1][0], whole[0], rtol=4 * U, atol=0.0)
    torch.testing.assert_close(torch.cat([parts[0][2], parts[1][2]]), whole[2], rtol=0.0, atol=64 * U)
    torch.testing.assert_close(parts[0][3] + parts[1][3], whole[3], rtol=0.0, atol=64 * U)


def test_the_two_step_path_where_a_chunk_cannot_hold_whole_sequences():
    """GSPO (a sequence ratio, md eq. (3)) with chunks of 3 tokens and responses of 5, and
    kl_scale="sequence" under token_mean (md eq. (19): its weight reads the batch's sequence count)
    run the two-step code: its results, 4 products; without a wanted gradient, one."""
    hidden, weight, tokens, near, advantages, mask = batch(seed=3)
    token_mean_sequence_kl = dataclasses.replace(PRESETS["dapo"], kl_coef=0.1, kl_scale="sequence")
    unit = tokens.numel() * hidden.shape[-1] * weight.shape[0]
    for variant in (GSPO, token_mean_sequence_kl):
        assert fused_chunk_tokens(variant, 5, 3) is None
        extra = {"ref_logp": near["ref_logp"]} if variant.kl_coef > 0 else {}
        assert products(lambda v=variant, e=extra: fused(hidden, weight, tokens, near, advantages, mask, v, 3,
                                                         **e)) == 4 * unit
        want = two_step(hidden, weight, tokens, near, advantages, mask, variant, 3, **extra)
        got = fused(hidden, weight, tokens, near, advantages, mask, variant, 3, **extra)
        for a, b in zip(got, want[:4], strict=True):
            assert (a == b) if isinstance(a, dict) else torch.equal(a, b)
    assert fused_chunk_tokens(GSPO, 5, 14) == 10 and fused_chunk_tokens(GSPO, 5, 4) is None
    with torch.no_grad():
        assert products(lambda: lm_head_policy_loss(hidden.requires_grad_(True), weight, tokens,
                                                    near["old_logp"], advantages, mask, GRPO)) == unit


def test_the_incoming_gradient_scales_the_saved_ones_and_only_those_asked_for_are_formed():
    """3 loss: every gradient times 3 (exactly: a power of two times 1.5 rounds once); only weight
    asks: no hidden gradient; a second backward through the same loss raises (the gradients are
    handed over on the first)."""
    hidden, weight, tokens, near, advantages, mask = batch(seed=4)
    _, _, want_h, want_w = fused(hidden, weight, tokens, near, advantages, mask, GRPO, 4)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = lm_head_policy_loss(h, w, tokens, near["old_logp"], advantages, mask, GRPO, chunk_rows=4)[0]
    (3 * loss).backward(retain_graph=True)
    assert torch.equal(h.grad, 3 * want_h) and torch.equal(w.grad, 3 * want_w)
    with pytest.raises(RuntimeError, match=r"^lm_head_policy_loss: backward through the same loss twice"):
        loss.backward()
    w = weight.clone().requires_grad_(True)
    loss = lm_head_policy_loss(hidden, w, tokens, near["old_logp"], advantages, mask, GRPO, chunk_rows=4)[0]
    loss.backward()
    assert torch.equal(w.grad, want_w)


def test_half_precision_inputs():
    """bfloat16 hidden and weight: the logits in bfloat16 (as hidden @ weight.T), their statistics in
    float32 (the in-place path is for float32 / float64 logits only), the loss in float32 and bitwise
    the two-step code's; gradients in bfloat16 within a few of its roundings (tests/test_lm_head.py)."""
    hidden, weight, tokens, near, advantages, mask = batch(n=3, t=6, d=8, v=20, seed=6, dtype=torch.bfloat16)
    loss, _, got_h, got_w = fused(hidden, weight, tokens, near, advantages, mask, GRPO, 4)
    want_loss, _, want_h, want_w, _ = two_step(hidden, weight, tokens, near, advantages, mask, GRPO, 4)
    assert loss.dtype == torch.float32 and torch.equal(loss, want_loss)
    assert got_h.dtype == got_w.dtype == torch.bfloat16
    torch.testing.assert_close(got_h.float(), want_h.float(), rtol=2**-7, atol=2**-7)
    torch.testing.assert_close(got_w.float(), want_w.float(), rtol=2**-6, atol=2**-6)


def test_the_peak_memory_is_the_chunk_s_and_at_most_a_tenth_of_the_naive_code_s():
    """N = 2 x 128 tokens, d = 64, V = 2048, float32, on CPU: beyond the inputs and their gradients the
    fused loss holds at most LM_HEAD_TEMPORARIES chunks of lm_head_chunk_rows rows plus O(N + V)
    (its gradients formed in the forward are the gradients themselves), and at most 0.1x what
    log_softmax(hidden @ weight.T) followed by the same loss holds (issue 29)."""
    n, t, d, v = 2, 128, 64, 2048
    hidden, weight, tokens, near, advantages, mask = batch(n, t, d, v, seed=7, dtype=torch.float32)
    grads = (n * t * d + v * d) * 4

    def naive():
        h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
        logp = torch.log_softmax(h @ w.T, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        policy_loss(logp, near["old_logp"], advantages, mask, GRPO)[0].backward()
        return h.grad, w.grad

    def ours():
        h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
        lm_head_policy_loss(h, w, tokens, near["old_logp"], advantages, mask, GRPO)[0].backward()
        return h.grad, w.grad

    cpu = torch.device("cpu")
    chunk = lm_head_chunk_rows(n * t, v, torch.float32, device=cpu) * v * 4
    fused_peak, naive_peak = measured(ours, cpu, grads), measured(naive, cpu, grads)
    assert fused_peak <= LM_HEAD_TEMPORARIES * chunk + PER_TOKEN * (n * t + v)
    assert fused_peak <= 0.1 * naive_peak


def test_bad_inputs_raise_one_line_errors_naming_the_argument():
    hidden, weight, tokens, near, advantages, mask = batch(seed=8)
    old = near["old_logp"]
    with pytest.raises(ValueError, match=r"^tokens must be 2-D \[N, T\], got shape \(15,\)$"):
        lm_head_policy_loss(hidden.reshape(15, 4), weight, tokens.reshape(15), old, advantages, mask, GRPO)
    with pytest.raises(ValueError, match=r"^weight must be \[V, d=4\], got \(7, 3\)$"):
        lm_head_policy_loss(hidden, weight[:, :3], tokens, old, advantages, mask, GRPO)
    with pytest.raises(ValueError, match=r"^tokens must lie in \[0, V=7\)$"):
        lm_head_policy_loss(hidden, weight, tokens + 7, old, advantages, mask, GRPO)
    shape_error = r"^old_logp must have shape \(3, 5\) \(no broadcasting\), got \(3, 4\)$"
    with pytest.raises(ValueError, match=shape_error):
        lm_head_policy_loss(hidden, weight, tokens, old[:, :4], advantages, mask, GRPO)
    with pytest.raises(TypeError, match=r"^variant must be a PolicyLossVariant"):
        lm_head_policy_loss(hidden, weight, tokens, old, advantages, mask, "grpo")
    with pytest.raises(ValueError, match=r"^variant.entropy_coef=0.01 > 0: lm_head_policy_loss has no"):
        lm_head_policy_loss(hidden, weight, tokens, old, advantages, mask,
                            dataclasses.replace(GRPO, entropy_coef=0.01))
    with pytest.raises(ValueError, match=r"^variant.kl_coef=0.1 > 0 needs ref_logp or kl$"):
        lm_head_policy_loss(hidden, weight, tokens, old, advantages, mask,
                            dataclasses.replace(GRPO, kl_coef=0.1))
    with pytest.raises(ValueError, match=r"^chunk_rows must be a positive int"):
        lm_head_policy_loss(hidden, weight, tokens, old, advantages, mask, GRPO, chunk_rows=0)
    bad = weight.clone()
    bad[2, 1] = math.inf
    with pytest.raises(ValueError, match=r"^logits contains NaN or \+inf"):
        lm_head_policy_loss(hidden.requires_grad_(True), bad, tokens, old, advantages, mask, GRPO)
    with pytest.raises(ValueError, match=r"^mask must contain only 0 and 1$"):
        lm_head_policy_loss(hidden.requires_grad_(True), weight, tokens, old, advantages, 2 * mask.float(),
                            GRPO)


@pytest.mark.skipif(not THOROUGH, reason="thorough profile (HYPOTHESIS_PROFILE=thorough): every preset at a "
                                         "larger size in float32, several chunk sizes")
@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_at_a_larger_size_in_float32(name):
    """N = 6, T = 40, d = 32, V = 300, float32, chunks of 7, 40 and 120 tokens (sequence levels: the
    whole rows that fit, or the two-step code): equal to the two-step code as above."""
    hidden, weight, tokens, near, advantages, mask = batch(6, 40, 32, 300, seed=9, dtype=torch.float32)
    seq_sum = PRESETS[name].aggregation == "seq_sum"
    variant = dataclasses.replace(preset(name), max_length=40 if seq_sum else None)
    for chunk_rows in (7, 40, 120):
        assert_equal_to_the_two_step_code(hidden, weight, tokens, near, advantages, mask, variant, chunk_rows,
                                          ref_logp=near["ref_logp"])


"""refimpl.losses.lm_head.lm_head_logprobs: the log-probabilities of token_logprobs(hidden @ weight.T)
and their gradients w.r.t. hidden and weight, chunked over the tokens (kl.md section 6 through the
output layer); relative accuracy on confident rows (exact logits through an identity weight,
60-digit references); errors by name. Memory: tests/test_logprobs_chunks.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from refimpl.losses.lm_head import lm_head_logprobs
from refimpl.losses.logprobs import token_logprobs
from tests.test_logprobs import LOGPROB_ROWS, exact_logprobs

U = 2.0**-53


def plain(hidden, weight, tokens):
    return token_logprobs(hidden @ weight.T, tokens)


@pytest.mark.parametrize("chunk_rows", [1, 2, 5, None, 100])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 5), ((2, 3), 4, 9)])
def test_values_and_gradients_equal_token_logprobs_of_the_product(shape, chunk_rows):
    """float64. The chunked products hidden[rows] @ weight.T may round differently from the whole one:
    each logit by at most d u max|h| max|w| (eps); log p moves by at most 2 eps, the softmax's
    gradient entries by eps relatively (on top of token_logprobs's own rounding, tested elsewhere),
    and the products with weight / hidden by d or N such errors: tolerances from eps."""
    rows, d, v = shape
    rows = rows if isinstance(rows, tuple) else (rows,)
    gen = torch.Generator().manual_seed(d * v)
    hidden = torch.randn(*rows, d, generator=gen, dtype=torch.float64)
    weight = 2 * torch.randn(v, d, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, v, rows, generator=gen)
    weights = torch.randn(*rows, generator=gen, dtype=torch.float64)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    got = lm_head_logprobs(h1, w1, tokens, chunk_rows=chunk_rows)
    want = plain(h2, w2, tokens)
    assert got.shape == tokens.shape and got.dtype == torch.float64
    eps = (4 * d * U * float(hidden.abs().max() * weight.abs().max())
           + 16 * U * (1 + float(want.detach().abs().max())))
    torch.testing.assert_close(got, want, rtol=0.0, atol=2 * eps)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    n = math.prod(rows)
    scale = 4 * eps * float(weights.abs().max())
    torch.testing.assert_close(h1.grad, h2.grad, rtol=0.0, atol=v * scale * float(weight.abs().max()))
    torch.testing.assert_close(w1.grad, w2.grad, rtol=0.0, atol=n * scale * float(hidden.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("row", [r for r in LOGPROB_ROWS if all(v > -math.inf for v in r)])
def test_confident_rows_keep_their_relative_accuracy_through_the_layer(row, dtype):
    """weight = I (V = d): the logits are the hidden states exactly, so the 60-digit references of
    tests/test_logprobs.py apply (to its finite rows: -inf * 0 is NaN): log p of every token,
    d/dhidden = (onehot - p) * g, relative with no absolute slack (4 u (V + max gap), twice that
    for gradients); and d/dweight of a single token, (onehot - p) x hidden, each entry one product
    more (+ 2 u relative)."""
    vocab = len(row)
    u = U if dtype == torch.float64 else 2.0**-24
    row = torch.tensor(row, dtype=dtype).tolist()
    hidden = torch.tensor([row] * vocab, dtype=dtype, requires_grad=True)
    weight = torch.eye(vocab, dtype=dtype, requires_grad=True)
    weights = torch.tensor([2.0 ** (k % 3) for k in range(vocab)], dtype=dtype)
    got = lm_head_logprobs(hidden, weight, torch.arange(vocab), chunk_rows=2)
    (got * weights).sum().backward()
    rel = 4 * u * (vocab + max(max(row) - v for v in row if v > -math.inf))
    for y in range(vocab):
        want, want_grad = exact_logprobs(row, y)
        assert got[y].item() == pytest.approx(want, rel=rel, abs=0.0), (row, y)
        np.testing.assert_allclose(hidden.grad[y].numpy(), float(weights[y]) * want_grad, rtol=2 * rel,
                                   atol=0.0)
    y = int(np.argmax(row))
    single = torch.tensor([row], dtype=dtype)
    weight.grad = None
    lm_head_logprobs(single, weight, torch.tensor([y])).sum().backward()
    _, want_grad = exact_logprobs(row, y)
    np.testing.assert_allclose(weight.grad.numpy(), np.outer(want_grad, row), rtol=2 * rel + 2 * u, atol=0.0)


def test_only_the_gradients_asked_for_are_formed():
    gen = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(4, 3, generator=gen), torch.randn(6, 3, generator=gen)
    tokens = torch.tensor([0, 5, 2, 2])
    h = hidden.clone().requires_grad_(True)
    lm_head_logprobs(h, weight, tokens).sum().backward()
    ref = hidden.clone().requires_grad_(True)
    plain(ref, weight, tokens).sum().backward()
    torch.testing.assert_close(h.grad, ref.grad, rtol=1e-5, atol=1e-6)
    w = weight.clone().requires_grad_(True)
    lm_head_logprobs(hidden, w, tokens).sum().backward()
    assert w.grad is not None and w.grad.shape == weight.shape
    out = lm_head_logprobs(hidden, weight, tokens)
    assert not out.requires_grad


def test_half_precision_inputs():
    """bfloat16 hidden and weight: logits in bfloat16 as hidden @ weight.T, statistics and the result
    in float32, gradients in bfloat16 (grad_weight accumulated over 3 chunks: a few bf16 roundings)."""
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(9, 8, generator=gen).bfloat16()
    weight = torch.randn(20, 8, generator=gen).bfloat16()
    tokens = torch.randint(0, 20, (9,), generator=gen)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    got = lm_head_logprobs(h1, w1, tokens, chunk_rows=4)
    assert got.dtype == torch.float32
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    want = plain(h2, w2, tokens)
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)
    got.sum().backward()
    want.sum().backward()
    assert h1.grad.dtype == w1.grad.dtype == torch.bfloat16
    torch.testing.assert_close(h1.grad.float(), h2.grad.float(), rtol=2**-7, atol=2**-7)
    torch.testing.assert_close(w1.grad.float(), w2.grad.float(), rtol=2**-6, atol=2**-6)


def test_bad_inputs_raise_naming_the_argument():
    hidden, weight, tokens = torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=r"^hidden must be a floating-point"):
        lm_head_logprobs(hidden.long(), weight, tokens)
    with pytest.raises(ValueError, match=r"^weight must be \[V, d=3\], got \(4, 2\)$"):
        lm_head_logprobs(hidden, torch.zeros(4, 2), tokens)
    with pytest.raises(ValueError, match=r"^weight must have the dtype and device of hidden"):
        lm_head_logprobs(hidden, weight.double(), tokens)
    with pytest.raises(ValueError, match=r"^weight must have V >= 1 rows$"):
        lm_head_logprobs(hidden, torch.zeros(0, 3), tokens)
    with pytest.raises(TypeError, match=r"^tokens must be an integer torch.Tensor$"):
        lm_head_logprobs(hidden, weight, tokens.float())
    with pytest.raises(ValueError, match=r"^tokens must have shape \(2,\) \(hidden without d\), got \(3,\)$"):
        lm_head_logprobs(hidden, weight, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^tokens must lie in \[0, V=4\)$"):
        lm_head_logprobs(hidden, weight, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"^tokens must be on the device of hidden \(cpu\), got meta$"):
        lm_head_logprobs(hidden, weight, tokens.to("meta"))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"^chunk_rows must be a positive int"):
            lm_head_logprobs(hidden, weight, tokens, chunk_rows=bad)
    with pytest.raises(ValueError, match=r"^backend must be one of"):
        lm_head_logprobs(hidden, weight, tokens, backend="fast")
    bad = weight.clone()
    bad[1, 0] = math.nan
    with pytest.raises(ValueError, match=r"^logits contains NaN or \+inf"):
        lm_head_logprobs(hidden + 1, bad, tokens)


def test_more_bad_inputs_and_a_single_token():
    """A non-tensor weight and a 0-d hidden are refused by name; one token ([d] hidden, 0-d token) is
    a batch like any other; the weight's expected d is hidden's last dimension (not its second)."""
    hidden, tokens = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=r"^hidden must be a floating-point torch.Tensor \[\.\.\., d\]$"):
        lm_head_logprobs(torch.tensor(1.0), torch.zeros(4, 1), torch.tensor(0))
    with pytest.raises(ValueError, match=r"^weight must be \[V, d=3\], got list$"):
        lm_head_logprobs(hidden, [[0.0] * 3] * 4, tokens)
    with pytest.raises(ValueError, match=r"^weight must be \[V, d=5\], got \(4, 2\)$"):
        lm_head_logprobs(torch.zeros(2, 3, 5), torch.zeros(4, 2), torch.zeros(2, 3, dtype=torch.long))
    gen = torch.Generator().manual_seed(5)
    one, weight = torch.randn(3, generator=gen, dtype=torch.float64), torch.randn(4, 3, generator=gen,
                                                                                  dtype=torch.float64)
    got = lm_head_logprobs(one, weight, torch.tensor(2))
    assert got.shape == () and torch.equal(got, plain(one[None], weight, torch.tensor([2]))[0])


def test_the_backend_reaches_the_kernel_choice():
    """backend='triton' on CPU tensors: refused for the device (triton installed, not interpreting)
    or for the missing package, the same message as token_logprobs's."""
    hidden, weight, tokens = torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError) as raised:
        lm_head_logprobs(hidden, weight, tokens, backend="triton")
    with pytest.raises(ValueError) as same:
        token_logprobs(hidden @ weight.T, tokens, backend="triton")
    assert str(raised.value) == str(same.value)
    assert "runs on CUDA tensors" in str(raised.value) or "needs the triton package" in str(raised.value)


def test_the_chunk_rules(monkeypatch):
    """Tokens per chunk (``lm_head_chunk_rows``) from the token count (not d), the bound's arithmetic
    with V = 1; the eager statistics' sub-chunks (``_stats_rows``: the chunk's own size as the memory
    bound, at least one row); the forward forms ceil(N / chunk_rows) chunks."""
    from refimpl.losses import lm_head

    assert lm_head.lm_head_chunk_rows(8, 1, torch.float32, budget_bytes=64) == 8  # 64 // (2 * 1 * 4)
    assert lm_head.lm_head_chunk_rows(8, 1, torch.float32, budget_bytes=32) == 4
    # one [64, 1000] float32 chunk: its 256000 bytes over 4 temporaries of 4 bytes -> 16000 elements
    assert lm_head._stats_rows(torch.empty(64, 1000)) == 16
    assert lm_head._stats_rows(torch.empty(1, 1000)) == 1
    seen = []
    real_apply = lm_head._LMHeadLogprobs.apply

    def spy(*args):
        seen.append(args[3])
        return real_apply(*args)

    monkeypatch.setattr(lm_head._LMHeadLogprobs, "apply", spy)
    gen = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(64, 4, generator=gen), torch.randn(6, 4, generator=gen)
    lm_head_logprobs(hidden, weight, torch.zeros(64, dtype=torch.long))
    assert seen == [lm_head.lm_head_chunk_rows(64, 6, torch.float32)] == [8]
    calls = []
    real_stats = lm_head.chunk_logits_stats
    monkeypatch.setattr(lm_head, "chunk_logits_stats", lambda *a, **k: calls.append(1) or real_stats(*a, **k))
    lm_head_logprobs(hidden[:10], weight, torch.zeros(10, dtype=torch.long), chunk_rows=3)
    assert len(calls) == 4


def test_the_device_s_chunk_changes_no_result_beyond_the_rounding_of_its_products():
    """N = 16 DEVICE_LM_HEAD_ROWS["cpu"] + 3 tokens on CPU, float64: the default chunk is the device's
    (the memory bound, N / 8, is larger), so the tokens are taken in 17 chunks, the last of 3 rows; the
    values and gradients equal one chunk of all N rows within the products' rounding (the tolerances
    of test_values_and_gradients_equal_token_logprobs_of_the_product, from eps = d u max|h| max|w|):
    the chunk the rule picks moves no result beyond roundoff."""
    from refimpl.losses import lm_head

    rows = 16 * lm_head.DEVICE_LM_HEAD_ROWS["cpu"] + 3
    d, v = 3, 5
    assert lm_head.lm_head_chunk_rows(rows, v, torch.float64, device="cpu") == rows // 16
    gen = torch.Generator().manual_seed(29)
    hidden = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    weight = 2 * torch.randn(v, d, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, v, (rows,), generator=gen)
    weights = torch.randn(rows, generator=gen, dtype=torch.float64)
    results = []
    for chunk_rows in (None, rows):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        got = lm_head_logprobs(h, w, tokens, chunk_rows=chunk_rows)
        (got * weights).sum().backward()
        results.append((got.detach(), h.grad, w.grad))
    (got, h_grad, w_grad), (want, h_want, w_want) = results
    eps = (4 * d * U * float(hidden.abs().max() * weight.abs().max())
           + 16 * U * (1 + float(want.abs().max())))
    torch.testing.assert_close(got, want, rtol=0.0, atol=2 * eps)
    scale = 4 * eps * float(weights.abs().max())
    torch.testing.assert_close(h_grad, h_want, rtol=0.0, atol=v * scale * float(weight.abs().max()))
    torch.testing.assert_close(w_grad, w_want, rtol=0.0, atol=rows * scale * float(hidden.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_in_place_statistics_are_those_of_logprob_stats_bitwise(dtype):
    """chunk_logits_stats on float32 / float64 logits (``_exp_stats_``) overwrites the chunk with
    exp(z - m) and returns logprob_stats's (m, rest, z_y) bitwise (the same exp(z - m) = exp(-(m - z)),
    the same sum with one maximal entry's 1 left out), on rows with -inf logits, ties at the maximum
    and a confident row; chunk_gradient from there equals its gradient from the logits bitwise, and
    the confident token's entry keeps its relative accuracy (others / total g, kl.md eq. (15'))."""
    from refimpl.losses import lm_head
    from refimpl.losses.logprobs import _logprob_parts, logprob_stats

    gen = torch.Generator().manual_seed(12)
    hidden = torch.randn(9, 3, generator=gen, dtype=dtype)
    weight = 3 * torch.randn(50, 3, generator=gen, dtype=dtype)
    tokens = torch.randint(0, 50, (9,), generator=gen)
    logits = hidden @ weight.T
    logits[0, 5] = logits[1, :7] = -math.inf
    logits[2, 3] = logits[2, 4] = logits[2].max() + 1  # a tie at the maximum
    logits[3] = 0.0
    logits[3, 7] = 60.0  # confident
    tokens[3] = 7
    chunk = logits.clone()
    top, rest, picked = lm_head._exp_stats_(chunk, tokens)  # what chunk_logits_stats runs here
    want = logprob_stats(logits, tokens, rows_per_chunk=lm_head._stats_rows(logits), kernel=False)
    for got, expected in zip((top, rest, picked), want, strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(chunk, torch.exp(logits - top.unsqueeze(1)))
    assert lm_head.chunk_logits_stats(hidden, weight, tokens, kernel=False)[-1]
    _, others = _logprob_parts(top, rest, picked)
    grad = torch.randn(9, generator=gen, dtype=dtype)
    from_exp = lm_head.chunk_gradient(chunk, tokens, top, others, grad, kernel=False, picked=picked)
    from_logits = lm_head.chunk_gradient(logits.clone(), tokens, top, others, grad, kernel=False)
    assert torch.equal(from_exp, from_logits)
    assert torch.isfinite(from_exp).all() and from_exp[3, 7] == others[3] / (others[3] + 1) * grad[3]

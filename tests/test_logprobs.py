"""refimpl.losses.logprobs: token_logprobs / token_entropy equal the plain log_softmax formulas
(values and gradients), and autograd keeps O(N T) bytes beyond the logits whatever V is."""

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.losses.logprobs import token_entropy, token_logprobs

U = 2.0**-53  # float64 unit roundoff


def log_softmax_rounding(logits) -> float:
    """Absolute rounding of x_t - logsumexp(x) in float64: both terms are up to max|x| + log V in
    size, and the subtraction, the shift by the maximum and exp / log1p add a few roundings of them."""
    return 8 * U * (2 * float(logits.abs().max()) + math.log(logits.shape[-1]) + 1)


def plain_logprobs(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def plain_entropy(logits):
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * torch.where(logp > -math.inf, logp, torch.zeros_like(logp))).sum(-1)


@st.composite
def logits_and_tokens(draw):
    n, t, v = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 3.0, 30.0]))
    logits = scale * torch.randn(n, t, v, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, v, (n, t), generator=gen)
    chunk = draw(st.one_of(st.none(), st.integers(1, 3 * v)))
    return logits, tokens, chunk, torch.randn(n, t, generator=gen, dtype=torch.float64)


@given(logits_and_tokens())
def test_logprobs_and_gradient_equal_log_softmax_gather(case):
    logits, tokens, chunk, weights = case
    x = logits.clone().requires_grad_(True)
    y = logits.clone().requires_grad_(True)
    ours = token_logprobs(x, tokens, chunk_elements=chunk)
    plain = plain_logprobs(y, tokens)
    # a log-probability near 0 is a difference of two terms of size max|x|: absolute rounding only
    floor = log_softmax_rounding(logits)
    np.testing.assert_allclose(ours.detach().numpy(), plain.detach().numpy(), rtol=1e-12, atol=floor)
    (g1,) = torch.autograd.grad((ours * weights).sum(), x)
    (g2,) = torch.autograd.grad((plain * weights).sum(), y)
    # w (onehot - p): p = exp(logp) carries logp's absolute error as a relative one
    g_floor = float(weights.abs().max()) * floor
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), rtol=1e-10, atol=g_floor)


@given(logits_and_tokens())
def test_entropy_and_gradient_equal_plain_formula(case):
    logits, _, chunk, weights = case
    x = logits.clone().requires_grad_(True)
    y = logits.clone().requires_grad_(True)
    ours = token_entropy(x, chunk_elements=chunk)
    plain = plain_entropy(y)
    # H = -sum_v p_v logp_v: each logp_v carries log_softmax_rounding, weighted by p_v (sum 1), and the
    # V-term sum adds V roundings of terms up to max|x| + log V
    floor = log_softmax_rounding(logits) * (1 + logits.shape[-1])
    np.testing.assert_allclose(ours.detach().numpy(), plain.detach().numpy(), rtol=1e-10, atol=floor)
    (g1,) = torch.autograd.grad((ours * weights).sum(), x)
    (g2,) = torch.autograd.grad((plain * weights).sum(), y)
    # dH/dx_v = -p_v (logp_v + H): the same absolute errors, times |w| and p_v <= 1
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), rtol=1e-9, atol=2 * float(weights.abs().max()) * floor)


def test_every_row_is_computed_when_rows_outnumber_the_vocabulary_and_chunks_hold_one_row():
    """Chunks walk the N T rows, not the V columns: 6 rows of a 2-token vocabulary, one row per
    chunk (the hypothesis cases above rarely draw chunk < V < rows)."""
    logits = torch.arange(12, dtype=torch.float64).reshape(2, 3, 2)
    logits[..., 1] *= -0.5
    tokens = torch.tensor([[0, 1, 0], [1, 0, 1]])
    lp = token_logprobs(logits, tokens, chunk_elements=2)
    ent = token_entropy(logits, chunk_elements=2)
    # the same element-wise operations on the same rows: equal to the last bit
    assert torch.equal(lp, token_logprobs(logits, tokens))
    assert torch.equal(ent, token_entropy(logits))
    # and right: a handful of float64 roundings of values below 20 in size
    floor = log_softmax_rounding(logits)
    torch.testing.assert_close(lp, plain_logprobs(logits, tokens), rtol=0.0, atol=floor)
    torch.testing.assert_close(ent, plain_entropy(logits), rtol=0.0, atol=3 * floor)


def test_float32_matches_to_1e_6_and_entropy_of_uniform():
    gen = torch.Generator().manual_seed(0)
    logits = 5 * torch.randn(4, 16, 1000, generator=gen)
    tokens = torch.randint(0, 1000, (4, 16), generator=gen)
    plain = plain_logprobs(logits, tokens)
    # 1e-6 relative to max(1, |log p|): values reach -60 here, where one float32 ulp is 3.8e-6
    assert ((token_logprobs(logits, tokens) - plain).abs() / plain.abs().clamp(min=1)).max() < 1e-6
    assert torch.allclose(token_entropy(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype):
    gen = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(3, 8, 50, generator=gen)).to(dtype).requires_grad_(True)
    tokens = torch.randint(0, 50, (3, 8), generator=gen)
    out = token_logprobs(logits, tokens)
    assert out.dtype == torch.float32
    upcast = logits.detach().float().requires_grad_(True)
    ref = plain_logprobs(upcast, tokens)
    assert (out - ref).abs().max() < 1e-5
    (g,) = torch.autograd.grad(out.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), upcast)
    assert g.dtype == dtype and torch.isfinite(g).all()
    assert (g.float() - g_ref).abs().max() < 1e-2  # one rounding to the half dtype
    ent = token_entropy(logits)
    assert ent.dtype == torch.float32 and (ent - plain_entropy(upcast)).abs().max() < 1e-5


def test_masked_vocabulary_entries():
    logits = torch.tensor([[[0.0, -math.inf, 1.0], [2.0, 0.5, -math.inf]]], dtype=torch.float64,
                          requires_grad=True)
    tokens = torch.tensor([[1, 0]])
    lp = token_logprobs(logits, tokens)
    assert lp[0, 0].item() == -math.inf
    assert lp[0, 1].item() == pytest.approx(2.0 - math.log(math.exp(2.0) + math.exp(0.5)), rel=1e-14, abs=0.0)
    (g,) = torch.autograd.grad(lp[0, 1], logits)
    assert torch.isfinite(g).all() and g[0, 1, 2] == 0
    ent = token_entropy(logits)
    p = 1 / (1 + math.e)
    assert ent[0, 0].item() == pytest.approx(
        -(p * math.log(p) + (1 - p) * math.log(1 - p)), rel=1e-13, abs=0.0
    )
    (g,) = torch.autograd.grad(ent.sum(), logits)
    assert torch.isfinite(g).all() and g[0, 0, 1] == 0


def exact_entropy(row: list[float]) -> tuple[float, np.ndarray, np.ndarray]:
    """H = -sum_v p_v log p_v of softmax(row), dH/dx_v = p_v (s_v - H) and p_v (s_v + H), with the surprisal
    s_v = -log p_v = log1p(rest) + m - x_v (m = max, rest = the sum of exp(x_v - m) over all entries
    but one maximal one): H's terms are all >= 0, so a 60-digit evaluation has no cancellation to
    lose digits to; s_v - H to at most 60 - 20 digits here. -inf entries have p_v = 0 and add nothing."""
    with mpmath.workdps(60):
        x = [mpmath.mpf(v) for v in row]
        finite = sorted((v for v in x if v > -mpmath.inf), reverse=True)
        m = finite[0]
        log_sum = mpmath.log1p(sum(mpmath.exp(v - m) for v in finite[1:]))
        surprisal = [log_sum + m - v for v in x]
        p = [mpmath.exp(-s) for s in surprisal]
        H = sum(pv * s for pv, s in zip(p, surprisal, strict=True) if pv > 0)
        live = [(pv, s) if pv > 0 else (0, 0) for pv, s in zip(p, surprisal, strict=True)]
        grad = np.array([float(pv * (s - H)) for pv, s in live])
        return float(H), grad, np.array([float(pv * (s + H)) for pv, s in live])


CONFIDENT_ROWS = [[30.0, 0.0], [40.0, 0.0], [700.0, 650.0], [20.0, 0.0, -3.0], [5.0, 5.0, -40.0],
                  [3.0, -math.inf, 0.0], [0.0], [36.0193, 25.4188, -12.0465]]


@pytest.mark.parametrize("row", CONFIDENT_ROWS)
def test_entropy_of_a_confident_row_keeps_its_relative_accuracy(row):
    """H of a near-deterministic row is tiny (1.7e-16 at (40, 0)); x_v - logsumexp(x) loses the
    digits of the confident token's log p below u |max x| (it gave H 2 % wrong at (40, 0), 4e-4 at
    (30, 0), and the gradient as wrong). Tolerance: p_v = exp(-s_v) inherits the surprisal s_v's
    absolute rounding (~u s_v) as a relative error, the V-term sums and exp / log1p add a few
    roundings: 4 u (V + max finite s_v) for H. The gradient p_v (s_v - H) carries twice that times
    p_v (s_v + H): relative where s_v and H differ in size (the confident rows), absolute where they
    cancel (the tied rows (5, 5, -40): there the inputs' own rounding moves it as much)."""
    logits = torch.tensor([row], dtype=torch.float64, requires_grad=True)
    got = token_entropy(logits)
    want, want_grad, grad_scale = exact_entropy(row)
    rel = 4 * U * (len(row) + max(max(row) - v for v in row if v > -math.inf))
    assert got.item() == pytest.approx(want, rel=rel, abs=0.0)
    (grad,) = torch.autograd.grad(got.sum(), logits)
    assert np.all(np.abs(grad[0].numpy() - want_grad) <= 2 * rel * grad_scale), (grad, want_grad)


def exact_logprobs(row: list[float], token: int) -> tuple[float, np.ndarray]:
    """log p_y = -(log1p(rest) + m - x_y) and its gradient [v = y] - p_v at 60 digits; the token's
    entry 1 - p_y is summed as sum_{v != y} exp(x_v - m) / sum_v exp(x_v - m), so no digit cancels.
    -inf entries have p_v = 0."""
    with mpmath.workdps(60):
        x = [mpmath.mpf(v) for v in row]
        m = max(x)
        scaled = [mpmath.exp(v - m) for v in x]
        total = sum(scaled)
        grad = [-s / total for s in scaled]
        grad[token] = sum(s for v, s in enumerate(scaled) if v != token) / total
        return float(mpmath.log(scaled[token] / total)), np.array([float(g) for g in grad])


LOGPROB_ROWS = [[40.0, 0.0], [0.0, 40.0], [30.0, 0.0], [700.0, 650.0], [20.0, 0.0, -3.0],
                [5.0, 5.0, -40.0], [-40.0, 5.0, 5.0], [7.0, 7.0], [3.0, -math.inf, 0.0],
                [-math.inf, 2.0, 2.0], [0.0], [36.0193, 25.4188, -12.0465], [50.0] + [0.0] * 9]


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 3, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("row", LOGPROB_ROWS)
def test_logprob_of_every_token_of_a_confident_row_keeps_its_relative_accuracy(row, dtype, rows_per_chunk):
    """x_y - logsumexp(x) keeps only u max|x| of log p_y: at (40, 0) it returns 0 for -4.25e-18, and
    its gradient 1 - p_y of the top token has an absolute error u (not 4e-18 * u). Every token of the
    row is chosen once ([V, V] batch, chunks of 1, 2, 3 rows or the default). Tolerance, relative and
    with no absolute slack: the gaps m - x_v are rounded once (relative u), exp turns that into a
    relative u (m - x_v) of each term, the V-term sums, log1p, the division and the final sum of two
    non-negative terms add a few u: 4 u (V + max finite gap), twice that for the gradient. The
    inputs are the dtype's own values (the row rounded to the dtype), so the reference is exact."""
    vocab = len(row)
    u = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    row = torch.tensor(row, dtype=dtype).tolist()  # the values the dtype holds
    logits = torch.tensor([row] * vocab, dtype=dtype, requires_grad=True)
    tokens = torch.arange(vocab)
    chunk = None if rows_per_chunk is None else rows_per_chunk * vocab
    got = token_logprobs(logits, tokens, chunk_elements=chunk)
    assert got.dtype == dtype
    weights = torch.tensor([2.0 ** (k % 3) for k in range(vocab)], dtype=dtype)  # exact scalings
    (grad,) = torch.autograd.grad((got * weights).sum(), logits)
    rel = 4 * u * (vocab + max(max(row) - v for v in row if v > -math.inf))
    for y in range(vocab):
        want, want_grad = exact_logprobs(row, y)
        assert got[y].item() == pytest.approx(want, rel=rel, abs=0.0), (row, y)
        np.testing.assert_allclose(grad[y].numpy(), float(weights[y]) * want_grad, rtol=2 * rel, atol=0.0)


def chunk_sizes(monkeypatch) -> list[int]:
    """The list to which every later eager chunk of token_logprobs appends its row count."""
    import refimpl.losses.logprobs as module

    seen = []
    inner = module._row_stats

    def spy(chunk, tokens):
        seen.append(chunk.shape[0])
        return inner(chunk, tokens)

    monkeypatch.setattr(module, "_row_stats", spy)
    return seen


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 3, 7])
def test_the_forward_works_in_chunks_of_at_most_the_rows_asked(monkeypatch, rows_per_chunk):
    """The [rows, V] temporaries are bounded by chunk_elements: the forward hands _row_stats
    consecutive chunks of exactly rows_per_chunk rows (the last one shorter) covering each row once."""
    seen = chunk_sizes(monkeypatch)
    vocab, rows = 5, 7
    logits = torch.arange(rows * vocab, dtype=torch.float64).reshape(rows, vocab).sin()
    tokens = torch.arange(rows) % vocab
    got = token_logprobs(logits, tokens, chunk_elements=rows_per_chunk * vocab, backend="eager")
    full, rest = divmod(rows, rows_per_chunk)
    assert seen == [rows_per_chunk] * full + ([rest] if rest else [])
    torch.testing.assert_close(got, plain_logprobs(logits, tokens), rtol=4 * U * (vocab + 2), atol=0.0)


def test_rows_without_a_distribution_give_what_log_softmax_gives_when_unchecked():
    """check_finite=False: a row with a NaN, a +inf or only -inf gives x_y - logsumexp(x) (NaN, or
    -inf for a finite or -inf token beside a +inf logit), as before the cancellation-free form
    (log_softmax itself gives NaN on the whole of a +inf row)."""
    inf, nan = math.inf, math.nan
    logits = torch.tensor([[0.0, inf, 1.0], [inf, inf, 0.0], [-inf, inf, 0.0], [nan, 0.0, 1.0],
                           [-inf, -inf, -inf], [0.0, 1.0, -inf]], dtype=torch.float64)
    for token in range(3):
        tokens = torch.full((logits.shape[0],), token)
        got = token_logprobs(logits, tokens, check_finite=False)
        want = logits.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(logits, -1)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (got, want)
        assert torch.equal(got[want.isinf()], want[want.isinf()])


def saved_bytes_beyond(logits, fn):
    """Total bytes autograd saves for backward in ``fn(logits)``, excluding the logits' storage."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(logits)
    own = logits.untyped_storage().data_ptr()
    extra = sum(t.untyped_storage().nbytes() for t in saved if t.untyped_storage().data_ptr() != own)
    return extra, out


@pytest.mark.parametrize("vocab", [16, 1024, 8192])
def test_saved_bytes_are_o_of_tokens_whatever_the_vocabulary(vocab):
    n, t = 4, 32
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(n, t, vocab, generator=gen).requires_grad_(True)
    tokens = torch.randint(0, vocab, (n, t), generator=gen)
    for fn in (lambda z: token_logprobs(z, tokens), token_entropy):
        extra, out = saved_bytes_beyond(logits, fn)
        assert extra <= 64 * n * t, (vocab, extra)
        out.sum().backward()  # the saved tensors suffice for backward
    # the hook does see a second [N, T, V] tensor in the plain formula (the check can fail)
    extra, _ = saved_bytes_beyond(logits, lambda z: plain_logprobs(z, tokens))
    assert extra >= 4 * n * t * vocab


def test_bad_inputs_raise():
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match=r"\[0, V=5\)"):
        token_logprobs(logits, torch.full((2, 3), 5))
    with pytest.raises(ValueError, match="shape"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens"):
        token_logprobs(logits, torch.zeros(2, 3))
    bad = logits.clone()
    bad[1, 2, 3] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        token_logprobs(bad, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        token_entropy(bad)
    with pytest.raises(ValueError, match="chunk_elements"):
        token_entropy(logits, chunk_elements=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rows_without_a_distribution_raise_whichever_token_is_chosen(dtype):
    """A +inf logit on a token other than the chosen one gives the chosen token log p = -inf, which
    looks like a zero-probability token; the row has no distribution, so it must raise (the check
    reads the row's maximum: NaN, +inf or -inf). The -inf of a finite row's -inf logit stays."""
    tokens = torch.tensor([[0, 2]])
    for position, value in ((1, math.inf), (0, math.inf), (1, math.nan)):
        logits = torch.zeros(1, 2, 3, dtype=dtype)
        logits[0, 0, position] = value
        with pytest.raises(ValueError, match=r"^logits contains NaN or \+inf"):
            token_logprobs(logits, tokens)
    all_neg_inf = torch.zeros(1, 2, 3, dtype=dtype)
    all_neg_inf[0, 1] = -math.inf
    with pytest.raises(ValueError, match=r"all -inf"):
        token_logprobs(all_neg_inf, tokens)
    zero_probability = torch.zeros(1, 2, 3, dtype=dtype)
    zero_probability[0, 0, 0] = -math.inf
    out = token_logprobs(zero_probability, tokens)
    assert out[0, 0].item() == -math.inf and out[0, 1].item() == pytest.approx(
        -math.log(3), rel=1e-2, abs=0.0
    )
    # check_finite=False leaves the caller the raw values (no host synchronisation)
    logits = torch.zeros(1, 2, 3, dtype=dtype)
    logits[0, 0, 1] = math.inf
    assert token_logprobs(logits, tokens, check_finite=False)[0, 0].item() == -math.inf

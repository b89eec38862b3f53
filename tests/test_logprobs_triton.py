"""refimpl.losses.logprobs_triton: the Triton kernels of ``token_logprobs`` give what its eager path
gives (value and gradient, float32 / bfloat16 / float16 logits), keep the relative accuracy of kl.md
eq. (14') and (15') against 60-digit references on confident rows, and treat rows without a
distribution as the eager path does.

Where the kernels run: compiled, in this process, on CUDA tensors when a GPU is visible; without
one, ``test_the_kernels_in_triton_s_interpreter`` runs this file again in a subprocess with
``TRITON_INTERPRET=1`` (Triton's numpy interpreter, CPU tensors; the mode is fixed when triton is
imported, so it cannot be switched on in this process). Every test skips when triton is not
installed (CI's CPU-only venv has no triton; ``pip install triton`` to run them)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels of token_logprobs are not "
                                     "tested here")

from refimpl.losses import logprobs_triton  # noqa: E402
from refimpl.losses.logprobs import token_logprobs  # noqa: E402
from tests.test_logprobs import LOGPROB_ROWS, exact_logprobs  # noqa: E402

if logprobs_triton.INTERPRETED:
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    DEVICE = None
kernels = pytest.mark.skipif(DEVICE is None, reason="no CUDA: these run in Triton's interpreter, through "
                                                    "test_the_kernels_in_triton_s_interpreter")
U32 = 2.0**-24  # the kernels' float32 arithmetic


def both(logits: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor):
    """(kernel, eager) log-probabilities and gradients of sum(weights * log p) on DEVICE."""
    out = []
    for backend in ("triton", "eager"):
        x = logits.detach().to(DEVICE).requires_grad_(True)
        lp = token_logprobs(x, tokens.to(DEVICE), backend=backend, check_finite=False)
        (grad,) = torch.autograd.grad((lp * weights.to(DEVICE)).sum(), x)
        out.append((lp.detach().cpu().double(), grad.cpu().double()))
    return out


def relative_rounding(logits: torch.Tensor, block: int) -> float:
    """Relative error of the float32 sums both paths form, to a few units: each term exp(x_v - m) of
    a rounded gap carries u (m - x_v) and u per rescaling by a later maximum (at most V / BLOCK in a
    kernel lane), the sums add u per level (log2 V pairwise, V / BLOCK sequential in a lane), and
    log1p, the division and the last addition a few u."""
    row = logits.float()
    finite = row[torch.isfinite(row)]
    gap = float(finite.max() - finite.min()) if finite.numel() else 0.0
    vocab = logits.shape[-1]
    return 4 * U32 * (gap + 2 * math.ceil(vocab / block) + math.log2(vocab) + 4)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 7, 4099])
def test_the_kernels_equal_the_eager_path(dtype, vocab):
    """Random rows of scale 5 with -inf entries, a maximum tied within a row and one tied across the
    kernel's blocks (at V = 4099, two blocks of 4096), and
    a maximum that arrives in a later block than a smaller earlier one (the lanes' rescaling).
    Values: relative to log p, no absolute slack (both are sums of non-negative terms). Gradients:
    relative, plus one rounding of each path's result to the logits' dtype and its subnormal spacing."""
    gen = torch.Generator().manual_seed(vocab)
    rows = 6
    logits = (5 * torch.randn(rows, vocab, generator=gen)).to(dtype)
    if vocab > 1:
        logits[0, 1] = -math.inf
        logits[1, : vocab // 2] = -math.inf  # a block of -inf before the finite ones
        logits[2, 0] = logits[2, -1] = logits[2].max() + 1  # a tie, across blocks at V = 4099
        logits[3, 0] = 20.0
        logits[3, -1] = 30.0  # the maximum in the last block, after a large earlier one
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    tokens[2] = vocab - 1  # the tied maximum that is not the first
    tokens[3] = vocab - 1  # the maximum: log p_y ~ -exp(-10), relative
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0, 0.25])
    (lp, grad), (lp_ref, grad_ref) = both(logits, tokens, weights)
    block, _ = logprobs_triton.launch_config(vocab, logits.element_size())
    for r in range(rows):
        rel = relative_rounding(logits[r], block)
        if math.isinf(lp_ref[r]):  # the token's logit is -inf
            assert lp[r] == lp_ref[r]
        else:
            assert abs(lp[r] - lp_ref[r]) <= 2 * rel * abs(lp_ref[r]), (r, lp[r], lp_ref[r])
        info = torch.finfo(dtype)
        tol = (2 * rel + 2 * info.eps) * grad_ref[r].abs() + info.tiny * info.eps
        assert torch.all((grad[r] - grad_ref[r]).abs() <= tol), (r, (grad[r] - grad_ref[r]).abs().max())


@kernels
@pytest.mark.parametrize("row", LOGPROB_ROWS)
def test_the_kernels_keep_the_relative_accuracy_of_confident_rows(row):
    """tests/test_logprobs.py's 60-digit check, through the kernels in float32: every token of the
    row chosen once; relative, no absolute slack, 4 u (V + max finite gap), twice that for the
    gradient (see there)."""
    vocab = len(row)
    row = torch.tensor(row, dtype=torch.float32).tolist()
    logits = torch.tensor([row] * vocab, dtype=torch.float32)
    weights = torch.tensor([2.0 ** (k % 3) for k in range(vocab)])
    (got, grad), _ = both(logits, torch.arange(vocab), weights)
    rel = 4 * U32 * (vocab + max(max(row) - v for v in row if v > -math.inf))
    for y in range(vocab):
        want, want_grad = exact_logprobs(row, y)
        assert got[y].item() == pytest.approx(want, rel=rel, abs=0.0), (row, y)
        np.testing.assert_allclose(grad[y].numpy(), float(weights[y]) * want_grad, rtol=2 * rel, atol=0.0)


@kernels
def test_maxima_that_move_between_blocks_keep_the_relative_accuracy():
    """V = 8195: three blocks of 4096. Row A: 20, 10 and 30 at entries 2, 4098 and 8194, one
    lane in three blocks (its sum exp(10 - 20) must be rescaled and its old maximum's 1 join it when
    the 30 arrives: log p of the 30 is -4.54e-5, relative); row B: 30 at entries 1 and 8193 (a tie
    across blocks in one lane). Tolerance: relative_rounding, no absolute slack."""
    vocab = 8195
    logits = torch.zeros(4, vocab)
    logits[:2, 2], logits[:2, 4098], logits[:2, 8194] = 20.0, 10.0, 30.0
    logits[2:, 1], logits[2:, 8193] = 30.0, 30.0
    tokens = torch.tensor([8194, 2, 8193, 0])
    weights = torch.tensor([1.0, 2.0, 0.5, 4.0])
    (got, grad), _ = both(logits, tokens, weights)
    rel = relative_rounding(logits[0], logprobs_triton.launch_config(vocab, 4)[0])
    for r in range(4):
        want, want_grad = exact_logprobs(logits[r].tolist(), int(tokens[r]))
        assert got[r].item() == pytest.approx(want, rel=rel, abs=0.0), r
        np.testing.assert_allclose(grad[r].numpy(), float(weights[r]) * want_grad, rtol=2 * rel, atol=0.0)


@kernels
def test_rows_without_a_distribution_give_what_the_eager_path_gives():
    """A NaN (the compiled kernel's max ignores NaN, the interpreter's propagates it: the kernel sets
    NaN aside and reports a NaN maximum, as torch.max), a +inf, only -inf; unchecked they give the
    eager path's NaN / -inf, checked they raise."""
    inf, nan = math.inf, math.nan
    logits = torch.tensor([[0.0, inf, 1.0], [inf, inf, 0.0], [-inf, inf, 0.0], [nan, 0.0, 1.0],
                           [0.0, 1.0, nan], [-inf, -inf, -inf], [0.0, 1.0, -inf]])
    for token in range(3):
        tokens = torch.full((logits.shape[0],), token)
        (got, _), (want, _) = both(logits, tokens, torch.ones(logits.shape[0]))
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (got, want)
        assert torch.equal(got[want.isinf()], want[want.isinf()])
        for bad in range(6):
            with pytest.raises(ValueError, match=r"^logits contains NaN or \+inf"):
                token_logprobs(logits[bad:bad + 1].to(DEVICE), tokens[:1].to(DEVICE), backend="triton")


@kernels
def test_the_gradient_kernel_may_write_over_its_input():
    """logprob_grad(..., out=flat) (the lm-head path's in-place use) equals a fresh output."""
    gen = torch.Generator().manual_seed(3)
    flat = torch.randn(3, 37, generator=gen).to(DEVICE)
    tokens = torch.tensor([0, 36, 5], device=DEVICE)
    top, rest, _ = logprobs_triton.row_stats(flat, tokens)
    coef, on_token = torch.rand(3, device=DEVICE), torch.rand(3, device=DEVICE)
    fresh = logprobs_triton.logprob_grad(flat, tokens, top, coef, on_token)
    logprobs_triton.logprob_grad(flat, tokens, top, coef, on_token, out=flat)
    assert torch.equal(flat, fresh)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_lm_head_through_the_kernels_equals_its_eager_path(dtype):
    """lm_head_logprobs with backend='triton' (statistics and the gradient written over each chunk's
    logits by the kernels) against backend='eager', chunks of 3 tokens: the same float32 arithmetic
    up to summation order, so relative_rounding on the values and on the logits' gradient, which the
    two products with weight and hidden carry into sums of V or N terms of either sign."""
    from refimpl.losses.lm_head import lm_head_logprobs

    gen = torch.Generator().manual_seed(4)
    n, d, v = 7, 8, 37
    hidden = torch.randn(n, d, generator=gen).to(dtype)
    weight = torch.randn(v, d, generator=gen).to(dtype)
    tokens = torch.randint(0, v, (n,), generator=gen)
    out = []
    for backend in ("triton", "eager"):
        h = hidden.detach().to(DEVICE).requires_grad_(True)
        w = weight.detach().to(DEVICE).requires_grad_(True)
        logp = lm_head_logprobs(h, w, tokens.to(DEVICE), chunk_rows=3, backend=backend)
        logp.sum().backward()
        out.append((logp.detach().cpu().double(), h.grad.cpu().double(), w.grad.cpu().double()))
    (lp, gh, gw), (lp_ref, gh_ref, gw_ref) = out
    rel = relative_rounding((hidden.float() @ weight.float().T)[0], 64)
    assert torch.all((lp - lp_ref).abs() <= 2 * rel * lp_ref.abs())
    eps = torch.finfo(dtype).eps
    for got, want, terms, other in ((gh, gh_ref, v, weight), (gw, gw_ref, n, hidden)):
        bound = terms * (2 * rel + 2 * eps) * float(other.float().abs().max())
        assert float((got - want).abs().max()) <= bound


def test_launch_config_blocks_are_powers_of_two_of_at_most_4096():
    for vocab, size, block in ((1, 4, 1), (7, 2, 8), (4096, 4, 4096), (4099, 4, 4096), (128000, 2, 4096)):
        got, warps = logprobs_triton.launch_config(vocab, size)
        assert got == block and warps == (8 if block >= 2048 else 4)


@pytest.mark.skipif(DEVICE is not None, reason="the kernels ran in this process")
def test_the_kernels_in_triton_s_interpreter():
    """Runs this file's kernel tests on CPU tensors in a subprocess with TRITON_INTERPRET=1; every one
    of them must pass there (none skipped)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                             "-k", "not triton_s_interpreter", str(Path(__file__))],
                            cwd=root, env=env, capture_output=True, text=True, timeout=600)
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    last = result.stdout.strip().splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "deselected" in last, tail

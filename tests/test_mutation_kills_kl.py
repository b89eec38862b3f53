"""refimpl.kl: checks that mutation testing (tools/mutation.py) showed missing. Errors name the
argument (the contract), the finiteness checks are on by default and off when asked, dtypes are
promoted before computing, batch dims are kept, and k3's series is accurate to float64 roundoff
just below its threshold."""

import math

import mpmath
import pytest
import torch

from refimpl.kl import categorical_kl, kl_k1, kl_k2, kl_k3, kl_log_ratio

F64 = torch.float64
EPS64 = torch.finfo(F64).eps
PER_TOKEN = {"log_ratio": kl_log_ratio, "k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def exact_k3(x: float) -> float:
    """exp(x) - 1 - x at 50 digits, correctly rounded to float64 for the |x| used here."""
    with mpmath.workdps(50):
        return float(mpmath.expm1(mpmath.mpf(x)) - mpmath.mpf(x))


@pytest.mark.parametrize("name", list(PER_TOKEN))
def test_per_token_estimators_check_finiteness_by_default_naming_the_argument(name):
    f = PER_TOKEN[name]
    ok = torch.zeros(2, dtype=F64)
    bad = torch.tensor([0.0, math.nan], dtype=F64)
    with pytest.raises(ValueError, match=r"^logp contains NaN or inf"):
        f(bad, ok)
    with pytest.raises(ValueError, match=r"^ref_logp contains NaN or inf"):
        f(ok, torch.tensor([-math.inf, 0.0], dtype=F64))


def test_check_finite_false_passes_non_finite_values_through():
    logp = torch.tensor([0.0, math.nan, 0.0], dtype=F64)
    ref = torch.tensor([-1.0, 0.0, -math.inf], dtype=F64)
    log_r = kl_log_ratio(logp, ref, check_finite=False)
    assert log_r[0].item() == -1.0 and math.isnan(log_r[1]) and log_r[2].item() == -math.inf
    k1 = kl_k1(logp, ref, check_finite=False)
    assert k1[0].item() == 1.0 and math.isnan(k1[1]) and k1[2].item() == math.inf
    k2 = kl_k2(logp, ref, check_finite=False)
    assert k2[0].item() == 0.5 and math.isnan(k2[1]) and k2[2].item() == math.inf
    k3 = kl_k3(logp, ref, check_finite=False)
    # k3(-1) = e^-1 - 1 + 1; k3(-inf) = expm1(-inf) + inf = +inf
    assert k3[0].item() == pytest.approx(math.exp(-1.0), rel=4 * EPS64, abs=0.0)
    assert math.isnan(k3[1]) and k3[2].item() == math.inf


@pytest.mark.parametrize("name", list(PER_TOKEN))
def test_per_token_type_errors_name_the_argument(name):
    f = PER_TOKEN[name]
    x = torch.zeros(3, dtype=F64)
    with pytest.raises(TypeError, match=r"^logp must be a floating-point tensor"):
        f(torch.zeros(3, dtype=torch.long), x)
    with pytest.raises(TypeError, match=r"^ref_logp must be a floating-point tensor"):
        f(x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^ref_logp must be a torch.Tensor"):
        f(x, [0.0, 0.0, 0.0])


def test_device_mismatch_is_an_error_naming_both_arguments():
    # the "meta" device exists on every build, so a second device needs no accelerator
    cpu, meta = torch.zeros(3, dtype=F64), torch.zeros(3, dtype=F64, device="meta")
    with pytest.raises(ValueError, match=r"^logp and ref_logp must be on the same device"):
        kl_log_ratio(cpu, meta)
    with pytest.raises(ValueError, match=r"^logits_p and logits_q must be on the same device"):
        categorical_kl(meta, cpu)


DTYPE_PAIRS = [
    (torch.float64, torch.float16),
    (torch.float16, torch.float64),
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.bfloat16, torch.float16),
    (torch.float16, torch.float16),
]


@pytest.mark.parametrize(("dtype_p", "dtype_q"), DTYPE_PAIRS)
def test_per_token_estimators_promote_before_computing(dtype_p, dtype_q):
    # kl.md: computed in promote_types(dtypes, float32). Up-casting is exact, so the result must be
    # bit-identical to the one on inputs cast to that dtype first.
    gen = torch.Generator().manual_seed(0)
    logp = (-3 * torch.rand(16, generator=gen, dtype=F64)).to(dtype_p)
    ref = (-3 * torch.rand(16, generator=gen, dtype=F64)).to(dtype_q)
    want = torch.promote_types(torch.promote_types(dtype_p, dtype_q), torch.float32)
    for name, f in PER_TOKEN.items():
        got = f(logp, ref)
        assert got.dtype == want, name
        assert torch.equal(got, f(logp.to(want), ref.to(want))), name


@pytest.mark.parametrize(("dtype_p", "dtype_q"), DTYPE_PAIRS)
def test_categorical_kl_promotes_before_computing(dtype_p, dtype_q):
    gen = torch.Generator().manual_seed(1)
    logits_p = (3 * torch.randn(4, 6, generator=gen, dtype=F64)).to(dtype_p)
    logits_q = (3 * torch.randn(4, 6, generator=gen, dtype=F64)).to(dtype_q)
    want = torch.promote_types(torch.promote_types(dtype_p, dtype_q), torch.float32)
    got = categorical_kl(logits_p, logits_q)
    assert got.dtype == want
    assert torch.equal(got, categorical_kl(logits_p.to(want), logits_q.to(want)))


def test_categorical_kl_keeps_the_batch_dims():
    gen = torch.Generator().manual_seed(2)
    logits_p = torch.randn(2, 3, 5, generator=gen, dtype=F64)
    logits_q = torch.randn(2, 3, 5, generator=gen, dtype=F64)
    kl = categorical_kl(logits_p, logits_q)
    assert kl.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            p, q = logits_p[i, j].softmax(-1), logits_q[i, j].softmax(-1)
            row = float((p * (p.log() - q.log())).sum())
            # 5 terms of size <= ~|log p - log q| ~ 10: a few eps of the sum of absolute terms
            assert kl[i, j].item() == pytest.approx(row, rel=0, abs=64 * EPS64 * 10)


def test_categorical_kl_errors_name_the_argument():
    a = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(TypeError, match=r"^logits_p must be a floating-point tensor"):
        categorical_kl(torch.zeros(2, 3, dtype=torch.long), a)
    with pytest.raises(TypeError, match=r"^logits_q must be a floating-point tensor"):
        categorical_kl(a, torch.zeros(2, 3, dtype=torch.long))
    same_shape = r"^logits_p and logits_q must have the same shape, got \(2, 3\) and \(3,\)"
    with pytest.raises(ValueError, match=same_shape):
        categorical_kl(a, torch.zeros(3, dtype=F64))
    for shape in [(2, 0), (0,), ()]:
        empty = torch.zeros(shape, dtype=F64)
        with pytest.raises(ValueError, match=r"^logits must have a non-empty last \(vocabulary\) dim, got"):
            categorical_kl(empty, empty)
    plus_inf = torch.tensor([[0.0, math.inf, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    with pytest.raises(ValueError, match=r"^logits_p contains NaN or \+inf"):
        categorical_kl(plus_inf, a)
    with pytest.raises(ValueError, match=r"^logits_q contains NaN or \+inf"):
        categorical_kl(a, plus_inf)
    # one all -inf row among finite rows (no distribution in that row)
    dead_row = torch.tensor([[0.0, 1.0, 2.0], [-math.inf] * 3], dtype=F64)
    with pytest.raises(ValueError, match=r"^logits_p has a row whose logits are all -inf"):
        categorical_kl(dead_row, a)
    with pytest.raises(ValueError, match=r"^logits_q has a row whose logits are all -inf"):
        categorical_kl(a, dead_row)


def test_categorical_kl_check_finite_false_skips_the_checks():
    p = torch.tensor([[0.0, math.inf]], dtype=F64)
    assert torch.isnan(categorical_kl(p, torch.zeros(1, 2, dtype=F64), check_finite=False)).all()


@pytest.mark.parametrize("x", [0.0099, -0.0099, 0.009999999999, -0.009999999999, 0.005, -0.003, 1e-4])
def test_k3_series_is_accurate_to_roundoff_just_below_its_threshold(x):
    # The series branch (|log r| < 1e-2): truncation after x^7 leaves < 5e-17 relative and Horner's
    # evaluation ~4 roundings, so 4 eps relative. logp = 0 makes log r = ref_logp exactly.
    got = kl_k3(torch.zeros(1, dtype=F64), torch.tensor([x], dtype=F64)).item()
    assert got == pytest.approx(exact_k3(x), rel=4 * EPS64, abs=0)


@pytest.mark.parametrize("x", [0.01, -0.01, 0.0101, -0.0101, 0.02])
def test_k3_direct_branch_at_and_above_the_threshold(x):
    # expm1(x) - x: expm1 within ~1 ulp of ~|x|, the subtraction exact (Sterbenz), so the absolute
    # error is ~eps |x| and the relative error ~2 eps / |x|; allow 4 eps / |x|.
    got = kl_k3(torch.zeros(1, dtype=F64), torch.tensor([x], dtype=F64)).item()
    assert got == pytest.approx(exact_k3(x), rel=4 * EPS64 / abs(x), abs=0)

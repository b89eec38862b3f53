"""refimpl.estimators: checks that mutation testing (tools/mutation.py) showed missing. Every
argument check names its argument (the contract; `match=` anchored at the start of the message),
0/1 numeric flags and masks equal bool ones, +inf and -inf are caught on their own, empty batches
work, dtypes follow the module's rule (float16/bfloat16 -> float32, float32 and float64 kept),
and the sample dimension of the IS estimators is honoured."""

import math

import numpy as np
import pytest
import torch

from refimpl.estimators import (
    discounted_returns,
    gae_advantages,
    importance_weights,
    is_estimate,
    lambda_returns,
    n_step_returns,
    per_decision_is,
    snis_estimate,
    td_errors,
    trajectory_importance_weights,
    trajectory_is,
)

F64 = torch.float64
N, T = 2, 4


def valid_args():
    """A 2-row batch: row 0 terminates after step 1 and is truncated after step 3 (so next_values is
    needed), row 1 runs to the end of the row."""
    return dict(
        rewards=torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0]], dtype=F64),
        values=torch.tensor([[0.5, 1.5, -0.5, 2.0], [1.0, 0.0, 0.75, -1.0]], dtype=F64),
        next_values=torch.tensor([[1.5, 9.0, 2.0, 4.0], [0.0, 0.75, -1.0, 3.0]], dtype=F64),
        terminated=torch.tensor([[False, True, False, False], [False, False, False, False]]),
        truncated=torch.tensor([[False, False, False, True], [False, False, False, False]]),
        target_logp=torch.tensor([[-0.5, -1.0, -2.0, -0.1], [-0.3, -0.7, -1.2, -0.9]], dtype=F64),
        behavior_logp=torch.tensor([[-0.7, -0.4, -1.5, -0.2], [-0.6, -0.5, -1.0, -1.1]], dtype=F64),
        mask=torch.tensor([[True, True, True, False], [True, True, True, True]]),
        gamma=0.9,
        lam=0.8,
        n=2,
    )


FUNCTIONS = {
    "discounted_returns": (discounted_returns,
                           ["rewards", "terminated", "truncated", "gamma", "next_values"]),
    "n_step_returns": (n_step_returns, ["rewards", "next_values", "terminated", "truncated", "gamma", "n"]),
    "td_errors": (td_errors, ["rewards", "values", "next_values", "terminated", "gamma"]),
    "lambda_returns": (lambda_returns,
                       ["rewards", "next_values", "terminated", "truncated", "gamma", "lam"]),
    "gae_advantages": (gae_advantages,
                       ["rewards", "values", "next_values", "terminated", "truncated", "gamma", "lam"]),
    "trajectory_is": (trajectory_is, ["rewards", "target_logp", "behavior_logp", "mask", "gamma"]),
    "per_decision_is": (per_decision_is, ["rewards", "target_logp", "behavior_logp", "mask", "gamma"]),
    "trajectory_importance_weights": (trajectory_importance_weights,
                                      ["target_logp", "behavior_logp", "mask"]),
}
FLOATS = ("rewards", "values", "next_values", "target_logp", "behavior_logp")
FLAGS = ("terminated", "truncated", "mask")


def call(name, **overrides):
    f, params = FUNCTIONS[name]
    args = valid_args()
    args.update(overrides)
    out = f(**{p: args[p] for p in params})
    return out.advantages if name == "gae_advantages" else out


def cases(kinds):
    return [(f, p) for f, (_, params) in FUNCTIONS.items() for p in params if p in kinds]


@pytest.mark.parametrize(("fname", "arg"), cases(FLOATS))
def test_float_argument_errors_name_the_argument(fname, arg):
    good = valid_args()[arg]
    with pytest.raises(TypeError, match=rf"^{arg} must be a torch.Tensor, got list"):
        call(fname, **{arg: good.tolist()})
    with pytest.raises(TypeError, match=rf"^{arg} must be a floating tensor, got dtype torch.int64"):
        call(fname, **{arg: good.long()})
    with pytest.raises(ValueError, match=rf"^{arg} must be \[N, T\], got shape \(8,\)"):
        call(fname, **{arg: good.reshape(-1)})
    first = FUNCTIONS[fname][1][0]
    if arg != first:
        like = rf"^{arg} must have shape \(2, 4\) \(like rewards\), got \(2, 3\)"
        with pytest.raises(ValueError, match=like):
            call(fname, **{arg: good[:, :3]})
    for bad in (math.nan, math.inf, -math.inf):  # each alone: aminmax must see +inf and -inf
        x = good.clone()
        x[1, 2] = bad
        with pytest.raises(ValueError, match=rf"^{arg} contains NaN or inf"):
            call(fname, **{arg: x})


@pytest.mark.parametrize(("fname", "arg"), cases(FLAGS))
def test_flag_argument_errors_name_the_argument(fname, arg):
    good = valid_args()[arg]
    with pytest.raises(TypeError, match=rf"^{arg} must be a torch.Tensor, got list"):
        call(fname, **{arg: good.tolist()})
    with pytest.raises(ValueError, match=rf"^{arg} must have shape \(2, 4\) \(like rewards\), got \(2, 3\)"):
        call(fname, **{arg: good[:, :3]})
    with pytest.raises(ValueError, match=rf"^{arg} must be bool or 0/1"):
        call(fname, **{arg: good.double() * 2})


@pytest.mark.parametrize(("fname", "arg"), cases(FLAGS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.uint8])
def test_numeric_zero_one_flags_equal_bool_flags(fname, arg, dtype):
    expected = call(fname)
    got = call(fname, **{arg: valid_args()[arg].to(dtype)})
    assert torch.equal(got, expected)


@pytest.mark.parametrize("fname", [f for f, (_, p) in FUNCTIONS.items() if "truncated" in p])
def test_a_step_both_terminated_and_truncated_is_rejected(fname):
    both = valid_args()["terminated"].clone()
    both[0, 3] = True  # also truncated there
    with pytest.raises(ValueError, match=r"^a step cannot be both terminated and truncated"):
        call(fname, terminated=both)


def test_discounted_returns_needs_next_values_only_when_something_is_bootstrapped():
    with pytest.raises(ValueError, match=r"^next_values is required: some steps are truncated"):
        call("discounted_returns", next_values=None)
    # every row terminates at its last column: no bootstrap, and None equals explicit zeros
    term = torch.tensor([[False, True, False, True], [False, False, False, True]])
    trunc = torch.zeros(N, T, dtype=torch.bool)
    got = call("discounted_returns", terminated=term, truncated=trunc, next_values=None)
    zeros = call("discounted_returns", terminated=term, truncated=trunc,
                 next_values=torch.zeros(N, T, dtype=F64))
    assert torch.equal(got, zeros)
    # row 1 ends mid-episode: a bootstrap is needed again
    term_mid = term.clone()
    term_mid[1, 3] = False
    with pytest.raises(ValueError, match=r"^next_values is required"):
        call("discounted_returns", terminated=term_mid, truncated=trunc, next_values=None)


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "2"])
def test_n_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match=r"^n must be an integer >= 1, got"):
        call("n_step_returns", n=n)


@pytest.mark.parametrize("fname", [f for f, (_, p) in FUNCTIONS.items() if "gamma" in p])
def test_gamma_errors_name_gamma(fname):
    with pytest.raises(ValueError, match=r"^gamma must lie in \[0, 1\], got 1.5"):
        call(fname, gamma=1.5)


@pytest.mark.parametrize("fname", ["lambda_returns", "gae_advantages"])
def test_lam_errors_name_lam(fname):
    with pytest.raises(ValueError, match=r"^lam must lie in \[0, 1\], got -0.1"):
        call(fname, lam=-0.1)
    with pytest.raises(TypeError, match=r"^lam must be a real number, got str"):
        call(fname, lam="0.5")


@pytest.mark.parametrize("fname", list(FUNCTIONS))
def test_empty_batch_gives_an_empty_result(fname):
    args = {k: (v[:0] if isinstance(v, torch.Tensor) else v) for k, v in valid_args().items()}
    out = call(fname, **args)
    assert out.shape[0] == 0


DTYPE_RULE = [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
              (torch.float32, torch.float32), (torch.float64, torch.float64)]


@pytest.mark.parametrize("fname", list(FUNCTIONS))
@pytest.mark.parametrize(("dtype", "want"), DTYPE_RULE)
def test_compute_dtype(fname, dtype, want):
    args = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in valid_args().items()}
    out = call(fname, **args)
    assert out.dtype == want
    # computed in `want` from the (exactly up-cast) inputs: bit-identical
    up = {k: (v.to(want) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in args.items()}
    assert torch.equal(out, call(fname, **up))


# ------------------------------------------------------------------------------ importance sampling


def test_importance_weights_errors_name_the_argument():
    ok = torch.zeros(3, dtype=F64)
    for name in ("target_logp", "behavior_logp"):
        def iw(x, name=name):
            return importance_weights(x, ok) if name == "target_logp" else importance_weights(ok, x)
        with pytest.raises(TypeError, match=rf"^{name} must be a floating torch.Tensor"):
            iw(torch.zeros(3, dtype=torch.long))
        with pytest.raises(TypeError, match=rf"^{name} must be a floating torch.Tensor"):
            iw([0.0, 0.0, 0.0])
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf \(a zero-probability"):
                iw(torch.tensor([0.0, bad, 0.0], dtype=F64))
    same = r"^target_logp \(3,\) and behavior_logp \(4,\) must have the same shape"
    with pytest.raises(ValueError, match=same):
        importance_weights(ok, torch.zeros(4, dtype=F64))


@pytest.mark.parametrize(("dtype", "want"), DTYPE_RULE)
def test_importance_weights_dtype(dtype, want):
    a = torch.tensor([-0.5, 0.25, -2.0]).to(dtype)
    b = torch.tensor([-1.0, 0.5, -0.125]).to(dtype)
    w = importance_weights(a, b)
    assert w.dtype == want
    assert torch.equal(w, torch.exp(a.to(want) - b.to(want)))


def test_sample_checks_name_the_argument():
    f = torch.tensor([1.0, 2.0], dtype=F64)
    w = torch.tensor([0.5, 1.5], dtype=F64)
    for est in (is_estimate, snis_estimate):
        with pytest.raises(TypeError, match=r"^f must be a floating torch.Tensor"):
            est(f.long(), w)
        with pytest.raises(TypeError, match=r"^weights must be a floating torch.Tensor"):
            est(f, [0.5, 1.5])
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=r"^f contains NaN or inf"):
                est(torch.tensor([1.0, bad], dtype=F64), w)
            with pytest.raises(ValueError, match=r"^weights contains NaN or inf"):
                est(f, torch.tensor([bad, 1.0], dtype=F64))
        with pytest.raises(ValueError, match=r"^f \(2,\) and weights \(3,\) must have the same shape"):
            est(f, torch.ones(3, dtype=F64))
        with pytest.raises(ValueError, match=r"^f must have at least one dimension \(the samples\)"):
            est(torch.tensor(1.0, dtype=F64), torch.tensor(1.0, dtype=F64))
        with pytest.raises(ValueError, match=r"^weights must be non-negative"):
            est(f, torch.tensor([0.5, -1e-300], dtype=F64))
    with pytest.raises(ValueError, match=r"^snis_estimate: the weights of a sample set sum to zero"):
        snis_estimate(torch.ones(2, 2, dtype=F64), torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=F64))


def test_is_and_snis_reduce_over_the_given_dim():
    f = torch.tensor([[1.0, 2.0, 4.0], [3.0, -1.0, 0.5]], dtype=F64)
    w = torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.25, 1.0]], dtype=F64)
    # dim=0: two samples per column; dim=-1 (default): three samples per row. Sums of <= 3 products
    # of dyadic numbers are exact in float64.
    def t(*v):
        return torch.tensor(v, dtype=F64)

    assert torch.equal(is_estimate(f, w, dim=0), t((0.5 + 4.5) / 2, (2.0 - 0.25) / 2, (8.0 + 0.5) / 2))
    assert torch.equal(is_estimate(f, w), t((0.5 + 2.0 + 8.0) / 3, (4.5 - 0.25 + 0.5) / 3))
    assert torch.equal(snis_estimate(f, w, dim=0), t(5.0 / 2.0, 1.75 / 1.25, 8.5 / 3.0))
    assert torch.equal(snis_estimate(f, w), t(10.5 / 3.5, 4.75 / 2.75))


@pytest.mark.parametrize(("dtype", "want"), [(torch.float16, torch.float32), (torch.float32, torch.float32),
                                             (torch.float64, torch.float64)])
def test_is_estimators_dtype(dtype, want):
    f = torch.tensor([1.0, 2.0, 4.0]).to(dtype)
    w = torch.tensor([0.5, 1.0, 2.0]).to(dtype)
    assert is_estimate(f, w).dtype == want and snis_estimate(f, w).dtype == want
    # products and sums of these dyadic numbers are exact in every dtype: (0.5 + 2 + 8) / 3, 10.5 / 3.5
    assert is_estimate(f, w).item() == 3.5 and snis_estimate(f, w).item() == 3.0


def test_trajectory_weights_use_the_behaviour_policy_and_mask_by_hand():
    a = valid_args()
    w = trajectory_importance_weights(a["target_logp"], a["behavior_logp"], a["mask"])
    d = (a["target_logp"] - a["behavior_logp"]) * a["mask"]
    np.testing.assert_allclose(w.numpy(), np.exp(d.sum(1).numpy()), rtol=4 * np.finfo(float).eps)


@pytest.mark.parametrize("fname", list(FUNCTIONS))
@pytest.mark.parametrize(("first", "others"), [(torch.float32, torch.float64), (torch.float64, torch.float16),
                                               (torch.float16, torch.float64)])
def test_the_first_argument_decides_the_compute_dtype(fname, first, others):
    # the module computes in the dtype rule of its first per-step argument (rewards, or target_logp)
    # and casts every other input to it first
    # (values with full float64 mantissas: computing before rounding to `want` would differ in the last bit)
    lead = FUNCTIONS[fname][1][0]
    want = torch.float64 if first == torch.float64 else torch.float32
    gen = torch.Generator().manual_seed(7)
    args = {k: ((v + torch.rand(N, T, generator=gen, dtype=F64) / 3).to(first if k == lead else others)
                if k in FLOATS else v) for k, v in valid_args().items()}
    out = call(fname, **args)
    assert out.dtype == want
    cast = {k: (v.to(want) if k in FLOATS else v) for k, v in args.items()}
    assert torch.equal(out, call(fname, **cast))
    if fname == "gae_advantages":
        params = FUNCTIONS[fname][1]
        returns = gae_advantages(**{p: args[p] for p in params}).returns
        assert returns.dtype == want
        assert torch.equal(returns, gae_advantages(**{p: cast[p] for p in params}).returns)


def test_is_estimators_compute_in_the_dtype_of_f():
    f = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float16)
    w = torch.tensor([0.1, 1.0 / 3.0, 2.0], dtype=F64)  # not representable in float32
    for est in (is_estimate, snis_estimate):
        out = est(f, w)
        assert out.dtype == torch.float32
        assert torch.equal(out, est(f.float(), w.float()))


@pytest.mark.parametrize("fname", list(FUNCTIONS))
def test_float32_stays_float32_under_a_float64_default_dtype(fname):
    # code that sets torch's default dtype (e.g. for LM experiments) must not change the result dtype
    args = {k: (v.float() if k in FLOATS else v) for k, v in valid_args().items()}
    expected = call(fname, **args)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = call(fname, **args)
        if fname == "discounted_returns":  # also the path without next_values (no bootstrap)
            term = torch.tensor([[False, True, False, True], [False, False, False, True]])
            no_boot = call(fname, **{**args, "terminated": term,
                                     "truncated": torch.zeros(N, T, dtype=torch.bool), "next_values": None})
            assert no_boot.dtype == torch.float32
    finally:
        torch.set_default_dtype(old)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_full_messages():
    both = valid_args()["terminated"].clone()
    both[0, 3] = True
    flags = (r"^a step cannot be both terminated and truncated \(terminated takes precedence in the "
             r"environment; fix the flags\)$")
    with pytest.raises(ValueError, match=flags):
        call("gae_advantages", terminated=both)
    zero_prob = (r"^behavior_logp contains NaN or inf \(a zero-probability action under the behaviour "
                 r"policy breaks importance sampling, Sutton & Barto 2018, section 5\.5\)$")
    with pytest.raises(ValueError, match=zero_prob):
        importance_weights(torch.zeros(1, dtype=F64), torch.tensor([-math.inf], dtype=F64))


def test_next_values_required_full_message():
    message = (r"^next_values is required: some steps are truncated or the rollout ends mid-episode, and "
               r"their returns must be bootstrapped$")
    with pytest.raises(ValueError, match=message):
        call("discounted_returns", next_values=None)


MIXED = [(torch.float32, torch.float64), (torch.float16, torch.float64), (torch.float64, torch.float32)]


@pytest.mark.parametrize(("target", "behavior"), MIXED)
def test_importance_weights_compute_in_the_dtype_of_target_logp(target, behavior):
    a = torch.tensor([-0.5, 0.1, -2.0], dtype=F64)
    b = torch.tensor([-1.0, 1.0 / 3.0, -0.2], dtype=F64)  # not representable in float32
    want = torch.float64 if target == torch.float64 else torch.float32
    w = importance_weights(a.to(target), b.to(behavior))
    assert w.dtype == want
    assert torch.equal(w, torch.exp(a.to(target).to(want) - b.to(behavior).to(want)))

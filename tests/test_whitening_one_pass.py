"""The whitening flag ``whiten_one_pass_dtype="float64"`` (AReaL's ``masked_normalization``): on the
kit's float32-exact cases it is the spec's two-pass whitening (advantages.md eq. (20)-(22)) to float64
rounding; on float64 inputs with a large offset it is the literal one-pass form E[x^2] - E[x]^2, which
cancels where the two-pass form is exact."""

from __future__ import annotations

import torch

from refimpl.conformance.kinds import get_kind
from refimpl.conformance.kinds.base import KindCase
from refimpl.conformance.kinds.whitening import WhiteningFlags, expected_whitening
from refimpl.whitening import masked_whiten_reference

FLAGS = WhiteningFlags(whiten_one_pass=True, whiten_one_pass_dtype="float64")


def test_on_float32_exact_cases_it_is_the_two_pass_spec():
    # inputs of <= 24 significant bits: float64 squares and their sums of <= 24 terms are exact; the mean's
    # rounding enters E[x]^2 and E[x^2] - E[x]^2 loses up to ~4 max|x|^2 2^-52 of the variance, so the
    # whitened values move by that over 2 var, times their size (1e-7 on large_offset, 1000 +- 0.1)
    for case in get_kind("whitening").cases(0):
        if case.case_class in ("masked_nonfinite", "single_token", "empty_rows"):
            continue  # NaN padding (flag whiten_masked_nonfinite), 0 / 0 of one entry
        # masked_normalization's eps, outside the square root: 0 / eps on a constant batch
        eps = {"whiten_eps": 1e-5, "whiten_eps_placement": "std"}
        got = expected_whitening(case, WhiteningFlags(**FLAGS.__dict__ | eps))["advantages"]
        spec = expected_whitening(case, WhiteningFlags(**eps))["advantages"]
        mask = case.inputs["mask"]
        x = case.inputs["advantages"][mask]
        var = float(x.var(unbiased=False))
        tol = 1e-13 if var == 0 else 4 * float(x.abs().max()) ** 2 * 2.0**-52 / (2 * var) * 4.0 + 1e-13
        assert torch.allclose(got.values[mask], spec.values[mask], rtol=0, atol=tol), case.case_id


def test_on_a_float64_offset_the_one_pass_variance_cancels():
    x = torch.tensor([[1e8 + 1.0, 1e8 - 1.0, 1e8 + 1.0, 1e8 - 1.0]], dtype=torch.float64)
    mask = torch.ones_like(x, dtype=torch.bool)
    case = KindCase("float64_offset", 0, {"advantages": x, "mask": mask})
    spec = masked_whiten_reference(x, mask, mean="masked", std="population", weighting="token", eps=0.0,
                                   eps_placement="variance", count_eps=0.0)
    assert spec.tolist() == [[1.0, -1.0, 1.0, -1.0]]
    # sum(x^2) / 4 = 1e16 + 1 rounds to 1e16 (ulp 2), as does mean^2: var 0, so x - mean over sqrt(0) + eps
    got = expected_whitening(case, FLAGS)["advantages"].values
    assert got.tolist() == [[float("inf"), float("-inf"), float("inf"), float("-inf")]]
    eps = expected_whitening(case, WhiteningFlags(whiten_one_pass=True, whiten_one_pass_dtype="float64",
                                                  whiten_eps=1e-5, whiten_eps_placement="std"))
    # 1 / 1e-5 in float64 (1e-5 is not a binary fraction): 1e5 to a float64 ulp
    exact = torch.tensor([[1e5, -1e5, 1e5, -1e5]], dtype=torch.float64)
    assert torch.allclose(eps["advantages"].values, exact, rtol=0, atol=1e-9)

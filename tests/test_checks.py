"""The shared input checks of refimpl (refimpl._checks): each mistake raises the documented
error type with the argument's name, and legal input passes."""

import pytest
import torch

from refimpl._checks import check_discount, check_float_tensor, check_rows_stochastic


def test_check_float_tensor():
    check_float_tensor(torch.zeros(2, 3), "x", ndim=2)
    check_float_tensor(torch.tensor([float("nan")]), "x", finite=False)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        check_float_tensor([1.0], "x")
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        check_float_tensor(torch.zeros(2, dtype=torch.int64), "x")
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        check_float_tensor(torch.zeros(2), "x", ndim=2)
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        check_float_tensor(torch.tensor([0.0, float("inf")]), "x")


def test_check_rows_stochastic():
    check_rows_stochastic(torch.tensor([[0.25, 0.75], [1.0, 0.0]]), "P", 1e-9)
    check_rows_stochastic(torch.tensor([0.5, 0.5 + 1e-10]), "rho0", 1e-9)
    with pytest.raises(ValueError, match="P has negative probabilities"):
        check_rows_stochastic(torch.tensor([[1.5, -0.5]]), "P", 1e-9)
    with pytest.raises(ValueError, match="P rows must sum to 1"):
        check_rows_stochastic(torch.tensor([[0.5, 0.5], [0.5, 0.5 + 1e-6]]), "P", 1e-9)


def test_check_discount():
    assert check_discount(1) == 1.0 and check_discount(0.0) == 0.0
    assert check_discount(0.99, allow_one=False) == 0.99
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\) \(because\)"):
        check_discount(1.0, allow_one=False, why="because")
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]"):
        check_discount(-0.1, "lam")
    with pytest.raises(TypeError, match="gamma must be a real number"):
        check_discount(True)

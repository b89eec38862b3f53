"""Bad inputs to the public API that used to give a silent or unclear result: each now raises a
one-line error naming the argument, or returns a documented result (empty time axes).

refimpl.losses.policy_loss (L_max below a length), refimpl.estimators (no samples, empty time
axis), tabular.MDP (strings, complex numbers), tabular.control (out-of-range ``current``,
``max_iterations`` below 1). kl_k3 beyond the dtype's range is in tests/test_kl.py.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import torch

import tabular
from refimpl import estimators
from refimpl.losses import get_preset, loss_normalizer, policy_loss
from tabular.control import greedy_policy, policy_iteration, value_iteration
from tabular.examples import random_mdp

ONE_LINE = r"[^\n]*$"


# ----------------------------------------------------------------------------- policy_loss
@pytest.mark.parametrize("max_length", [1, 2, 4])
def test_dr_grpo_max_length_below_a_sequence_s_length_raises(max_length):
    # Dr. GRPO divides by sequences x L_max, L_max the bound on every length: rows of 5 tokens
    # with L_max = 2 used to give a finite loss normalised by N x 2, and L_max = 1 was exempt (it
    # stood for the token sum averaged over sequences, now aggregation 'seq_mean_token_sum').
    variant = dataclasses.replace(get_preset("dr_grpo"), max_length=max_length)
    logp = torch.zeros(3, 5, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 1:] = False  # one row of 1 token: only the longest row decides
    message = (rf"^variant\.max_length \(L_max = {max_length}\) must be >= every sequence's length .*"
               r"use aggregation='seq_mean_token_sum'" + ONE_LINE)
    with pytest.raises(ValueError, match=message):
        policy_loss(logp, logp, torch.ones(3, dtype=torch.float64), mask, variant)
    with pytest.raises(ValueError, match=message):
        loss_normalizer(mask, variant)


def test_dr_grpo_max_length_at_or_above_the_lengths_and_the_token_sum_are_defined():
    variant = dataclasses.replace(get_preset("dr_grpo"), max_length=2)
    logp = torch.zeros(3, 5, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    # At the bound (and for padding beyond it) the loss is defined: L_max = 5, rows of 5 tokens.
    at_bound = dataclasses.replace(variant, max_length=5)
    loss, _ = policy_loss(logp, logp, torch.ones(3, dtype=torch.float64), mask, at_bound)
    assert float(loss) == -1.0  # 3 rows x 5 tokens x A = 1 at ratio 1, over 3 x 5
    short = mask.clone()
    short[:, 2:] = False  # rows of 2 tokens in a padded width of 5: L_max = 2 is fine
    loss, _ = policy_loss(logp, logp, torch.ones(3, dtype=torch.float64), short, variant)
    assert float(loss) == -1.0
    one = mask.clone()
    one[:, 1:] = False  # L_max = 1 on one-token rows
    one_token = dataclasses.replace(variant, max_length=1)
    loss, _ = policy_loss(logp, logp, torch.ones(3, dtype=torch.float64), one, one_token)
    assert float(loss) == -1.0
    empty = torch.zeros(3, 5, dtype=torch.bool)
    assert float(loss_normalizer(empty, variant)) == 0.0
    # the token sum averaged over the sequences, at any length (verl's seq-mean-token-sum)
    token_sum = dataclasses.replace(variant, aggregation="seq_mean_token_sum", max_length=None)
    loss, _ = policy_loss(logp, logp, torch.ones(3, dtype=torch.float64), mask, token_sum)
    assert float(loss) == -5.0  # 15 tokens x A = 1 over 3 sequences


# ----------------------------------------------------------------------------- estimators
@pytest.mark.parametrize("estimator", [estimators.is_estimate, estimators.snis_estimate])
def test_is_estimates_of_no_samples_raise(estimator):
    # (1/N) sum_i w_i f_i with N = 0 used to return NaN (a mean over nothing).
    message = r"^f, weights: no samples along dim -1 \(shape \(0,\)\)" + ONE_LINE
    with pytest.raises(ValueError, match=message):
        estimator(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match=r"^f, weights: no samples along dim 1 \(shape \(3, 0\)\)"):
        estimator(torch.zeros(3, 0), torch.zeros(3, 0), dim=1)
    with pytest.raises(ValueError, match=r"^dim must be an int in \[-2, 2\) for f of shape \(3, 4\), got 2$"):
        estimator(torch.ones(3, 4), torch.ones(3, 4), dim=2)
    # No sample *sets* (an empty batch) with samples along dim is an empty result, not an error.
    out = estimator(torch.zeros(0, 4), torch.ones(0, 4))
    assert out.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [0, 3])
def test_an_empty_time_axis_gives_empty_results_of_the_right_shape(rows, dtype):
    # T = 0 used to raise a raw IndexError (index -1 of an empty time axis).
    z = torch.zeros(rows, 0, dtype=dtype)
    flags = torch.zeros(rows, 0, dtype=torch.bool)
    results = {
        "discounted_returns": estimators.discounted_returns(z, flags, flags, 0.9),
        "discounted_returns(next_values)": estimators.discounted_returns(z, flags, flags, 0.9, z),
        "n_step_returns": estimators.n_step_returns(z, z, flags, flags, 0.9, 3),
        "lambda_returns": estimators.lambda_returns(z, z, flags, flags, 0.9, 0.5),
        "td_errors": estimators.td_errors(z, z, z, flags, 0.9),
    }
    gae = estimators.gae_advantages(z, z, z, flags, flags, 0.9, 0.95)
    results |= {"gae.advantages": gae.advantages, "gae.returns": gae.returns}
    for name, out in results.items():
        assert out.shape == (rows, 0) and out.dtype == dtype, name
    # Episodes of no steps: their return is 0 and their trajectory weight the empty product, 1.
    assert estimators.trajectory_is(z, z, z, flags, 0.9).tolist() == [0.0] * rows
    assert estimators.trajectory_importance_weights(z, z, flags).tolist() == [1.0] * rows


# ----------------------------------------------------------------------------- tabular
def one_state(P=None, r=None, rho0=None):
    return tabular.MDP([[[1.0]]] if P is None else P, [[0.5]] if r is None else r,
                       [1.0] if rho0 is None else rho0, 0.5)


@pytest.mark.parametrize("argument", ["P", "r", "rho0"])
def test_mdp_rejects_strings_and_complex_numbers_naming_the_argument(argument):
    valid = {"P": [[[1.0]]], "r": [[0.5]], "rho0": [1.0]}
    strings = {"P": [[["1"]]], "r": [["0.5"]], "rho0": ["1"]}
    complex_ = {"P": np.array([[[1.0 + 0.5j]]]), "r": np.array([[0.5 + 0.0j]]), "rho0": np.array([1.0 + 0j])}
    not_real = rf"^{argument} must be a numeric array, got dtype "
    with pytest.raises(TypeError, match=not_real + r"<U\d \(strings are not parsed\)$"):
        one_state(**(valid | {argument: strings[argument]}))
    with pytest.raises(TypeError, match=not_real + r"object \(strings are not parsed\)$"):
        one_state(**(valid | {argument: np.array(strings[argument], dtype=object)}))
    # Even a zero imaginary part: numpy would drop it with only a ComplexWarning.
    with pytest.raises(TypeError, match=rf"^{argument} must be real, got complex numbers$"):
        one_state(**(valid | {argument: complex_[argument]}))
    with pytest.raises(TypeError, match=rf"^{argument} must be real, got complex numbers$"):
        one_state(**(valid | {argument: np.array(complex_[argument], dtype=object)}))


def test_mdp_still_takes_every_real_number_type():
    for P in ([[[1]]], [[[True]]], [[[Fraction(1)]]], np.ones((1, 1, 1), dtype=np.float32),
              np.array([[[1]]], dtype=object), np.array([[[np.int8(1)]]])):
        assert one_state(P=P).P.tolist() == [[[1.0]]]
    assert one_state(r=[[Fraction(1, 4)]]).r.tolist() == [[0.25]]


def test_greedy_policy_rejects_an_out_of_range_current_naming_it():
    # A negative action used to wrap (-1 is the last action), one beyond A to raise a raw IndexError.
    q = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]])
    prefix = r"^current must hold actions in \[0, A\) = \[0, 3\), "
    for current, message in [(np.array([-1, 0]), r"got current\[0\] = -1$"),
                             (np.array([0, 3]), r"got current\[1\] = 3$"),
                             (np.array([5, 1]), r"got current\[0\] = 5$")]:
        with pytest.raises(ValueError, match=prefix + message):
            greedy_policy(q, current=current)
    message = r"^current must hold actions in \[0, A\) = \[0, 1\), got current\[0\] = 5$"
    with pytest.raises(ValueError, match=message):
        greedy_policy(np.zeros((1, 1)), current=[5])
    # In range, ties still go to current.
    assert greedy_policy(q, current=np.array([1, 2])).tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


@pytest.mark.parametrize("solver", [value_iteration, policy_iteration])
def test_max_iterations_below_one_raises_naming_it(solver):
    # value_iteration(max_iterations=0) used to raise RuntimeError "did not reach tol within 0 backups".
    mdp = random_mdp(0, 3, 2, gamma=0.5)
    with pytest.raises(ValueError, match=r"^max_iterations must be >= 1, got 0$"):
        solver(mdp, max_iterations=0)
    with pytest.raises(ValueError, match=r"^max_iterations must be >= 1, got -3$"):
        solver(mdp, max_iterations=-3)
    for bad, kind in ((2.0, "float"), (True, "bool"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"^max_iterations must be an int, got {kind}$"):
            solver(mdp, max_iterations=bad)
    assert solver(mdp, max_iterations=np.int64(1000)).iterations >= 1

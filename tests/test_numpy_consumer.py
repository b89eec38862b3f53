"""The numpy reference consumer (specs/numpy_consumer.py; tools/consumers/numpy_consumer.py runs it
from a checkout): refimpl, wrapped as plain numpy functions, passes every golden vector of every
family (valid ones match, invalid ones raise ValueError, acceptable ones match either side), and a
planted bug in each family fails the vectors that name its edge. The tabular family is the
project's ``tabular/`` package (numpy, float64) wrapped the same way. Stubs pass nothing they
should not; the command line (``--only``, ``--help``, exit codes, messages) is checked through
the checkout's launcher. The consumer itself imports only numpy and the standard library."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import tabular as T
from refimpl import estimators
from refimpl.advantages import group_advantages
from refimpl.conformance import expected_policy_loss, profile
from refimpl.conformance.cases import PolicyLossCase
from refimpl.kl import kl_k1, kl_k2, kl_k3
from refimpl.losses import PolicyLossVariant, policy_loss, token_logprobs
from specs import numpy_consumer as consumer

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "specs" / "vectors"
FILES = sorted(p.name for p in VECTORS.glob("*.json"))


def _t(x, dtype=torch.float64):
    return None if x is None else torch.as_tensor(np.asarray(x), dtype=dtype)


def _policy_loss(logp, old_logp, advantages, mask, variant, *, ref_logp=None, normalizer=None):
    lp = _t(logp).requires_grad_(True)
    kwargs = {} if ref_logp is None else {"ref_logp": _t(ref_logp)}
    loss, _ = policy_loss(
        lp,
        _t(old_logp),
        _t(advantages),
        torch.as_tensor(mask),
        PolicyLossVariant(**variant),
        normalizer=normalizer,
        **kwargs,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    return float(loss.detach()), grad.numpy()


def _policy_loss_conventions(logp, old_logp, advantages, mask, variant, convention, flags, *, ref_logp=None):
    """The kit's flag interpreter under the framework's profile (its flags equal the vector's:
    tests/test_conformance_golden.py)."""
    conv = profile(convention, "grpo")  # replaced field by field below
    conv = dataclasses.replace(conv, **flags)
    adv = _t(advantages)
    case = PolicyLossCase(
        "vector",
        0,
        _t(logp),
        _t(old_logp),
        adv,
        torch.as_tensor(mask),
        adv,
        torch.zeros(len(adv), dtype=torch.long),
        _t(ref_logp),
    )
    loss, grad = expected_policy_loss(case, PolicyLossVariant(**variant), conv)
    return float(loss), grad.numpy()


def _kl(estimator, logp, ref_logp):
    lp = _t(logp).requires_grad_(True)
    value = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](lp, _t(ref_logp))
    (grad,) = torch.autograd.grad(value.sum(), lp)
    return value.detach().numpy(), grad.numpy()


def _token_logprobs(logits, tokens):
    z = _t(logits).requires_grad_(True)
    logp = token_logprobs(z, torch.as_tensor(tokens))
    (grad,) = torch.autograd.grad(logp.sum(), z)
    return logp.detach().numpy(), grad.numpy()


def _numpy(fn):
    """A refimpl function on numpy arrays: floats and bools become tensors, the result numpy."""

    def wrapped(*args, **kwargs):
        def convert(x):
            if isinstance(x, np.ndarray):
                return torch.as_tensor(x)
            return x

        out = fn(*map(convert, args), **{k: convert(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(o.numpy() for o in out)
        return out.numpy()

    return wrapped


def _mdp(P, R, gamma, rho0, terminal) -> T.MDP:
    return T.MDP(P, R, rho0, gamma, terminal=terminal)


def _tabular_values(P, R, gamma, rho0, terminal, pi):
    mdp = _mdp(P, R, gamma, rho0, terminal)
    return T.policy_evaluation(mdp, pi), T.expected_return(mdp, pi)


def _tabular_occupancy(fn):
    def wrapped(P, R, gamma, rho0, terminal, pi):
        mdp = _mdp(P, R, gamma, rho0, terminal)
        return fn(mdp, pi, normalized=False), fn(mdp, pi, normalized=True)

    return wrapped


def _tabular_optimal(P, R, gamma, rho0, terminal):
    result = T.policy_iteration(_mdp(P, R, gamma, rho0, terminal))
    return result.V, result.Q, np.argmax(result.policy, axis=1)


def _tabular_performance_difference(P, R, gamma, rho0, terminal, pi, pi_new):
    mdp = _mdp(P, R, gamma, rho0, terminal)
    J_pi, J_pi_new = T.expected_return(mdp, pi), T.expected_return(mdp, pi_new)
    return {
        "J_pi": J_pi,
        "J_pi_new": J_pi_new,
        "difference": J_pi_new - J_pi,
        "expected_advantage": T.expected_advantage(mdp, pi, pi_new),
        "rho_pi": T.state_occupancy(mdp, pi, normalized=False),
        "rho_pi_new": T.state_occupancy(mdp, pi_new, normalized=False),
        "pdl_sum": T.performance_difference(mdp, pi, pi_new),
        "surrogate": T.surrogate(mdp, pi, pi_new),
        "distribution_shift_penalty": T.distribution_shift_penalty(mdp, pi, pi_new),
    }


TABULAR = {
    "tabular_values": _tabular_values,
    "tabular_q_values": lambda P, R, gamma, rho0, terminal, pi: T.q_values(
        _mdp(P, R, gamma, rho0, terminal), pi
    ),
    "tabular_advantages": lambda P, R, gamma, rho0, terminal, pi: T.advantages(
        _mdp(P, R, gamma, rho0, terminal), pi
    ),
    "tabular_state_occupancy": _tabular_occupancy(T.state_occupancy),
    "tabular_state_action_occupancy": _tabular_occupancy(T.state_action_occupancy),
    "tabular_optimal": _tabular_optimal,
    "tabular_performance_difference": _tabular_performance_difference,
}


REFIMPL = {
    **TABULAR,
    "policy_loss": _policy_loss,
    "policy_loss_conventions": _policy_loss_conventions,
    "kl": _kl,
    "group_advantages": _numpy(group_advantages),
    "token_logprobs": _token_logprobs,
    **{
        name: _numpy(getattr(estimators, name))
        for name in (
            "discounted_returns",
            "n_step_returns",
            "td_errors",
            "lambda_returns",
            "gae_advantages",
            "importance_weights",
            "is_estimate",
            "snis_estimate",
            "trajectory_importance_weights",
            "trajectory_is",
            "per_decision_is",
        )
    },
}
assert set(REFIMPL) == set(consumer.FUNCTIONS)


#: Vectors refimpl fails (none: the one this suite found, a +inf logit on a token other than the
#: chosen one accepted by token_logprobs, is fixed and pinned in tests/test_logprobs.py).
KNOWN_REFIMPL_FAILURES: set[str] = set()


@pytest.mark.parametrize("name", FILES)
def test_refimpl_passes_every_vector(name):
    report = consumer.check_file(VECTORS / name, REFIMPL)
    document = json.loads((VECTORS / name).read_text())
    failing = {f.id for f in report.failures}
    assert failing == {i for i in KNOWN_REFIMPL_FAILURES if i.startswith(document["kind"] + "/")}, (
        report.summary()
    )
    assert report.checked == len(document["vectors"]) and report.skipped == 0


def _leaves(x):
    if isinstance(x, list):
        for item in x:
            yield from _leaves(item)
    else:
        yield x


def check(name: str, **bugs) -> consumer.Report:
    return consumer.check_file(VECTORS / name, {**REFIMPL, **bugs})


# --------------------------------------------------------------------------------- one planted bug each


def test_planted_bug_policy_loss_upper_clip_uses_eps_low():
    """The classic DAPO slip: clip-higher forgotten (1 + eps_low as the upper bound)."""

    def buggy(logp, old, adv, mask, variant, **kwargs):
        return _policy_loss(logp, old, adv, mask, {**variant, "eps_high": variant["eps_low"]}, **kwargs)

    report = check("policy_loss.json", policy_loss=buggy)
    failing = {f.id.split("/")[1] for f in report.failures}
    # the presets with eps_high != eps_low (CISPO has no eps_low: its weight loses its upper clip)
    assert failing == {"dapo", "cispo", "gspo", "gspo_token", "gspo+token_sum"}
    assert "ratio_above_upper_clip" in report.failing_flags()


def test_planted_bug_convention_drops_empty_rows():
    """verl / TRL count an empty row in GRPO's sequence mean; dropping it changes the loss."""

    def buggy(logp, old, adv, mask, variant, convention, flags, **kwargs):
        return _policy_loss_conventions(
            logp, old, adv, mask, variant, convention, {**flags, "empty_rows": "drop"}, **kwargs
        )

    report = check("policy_loss_conventions.json", policy_loss_conventions=buggy)
    assert report.failures and {"empty_row"} <= report.failing_flags()
    assert all("empty_row" in f.flags for f in report.failures)


def test_planted_bug_kl_k3_without_expm1():
    """k3 as exp(x) - 1 - x cancels for tiny log-ratios: the log_ratio_tiny vectors catch it."""

    def buggy(estimator, logp, ref_logp):
        if estimator != "k3":
            return _kl(estimator, logp, ref_logp)
        x = ref_logp - logp
        return np.exp(x) - 1 - x, 1 - np.exp(x)

    report = check("kl.json", kl=buggy)
    assert report.failures and all(f.id.startswith("kl/k3/") for f in report.failures)
    assert "log_ratio_tiny" in report.failing_flags()


def test_planted_bug_advantages_population_std_for_sample():
    def buggy(rewards, group_ids, **arguments):
        if arguments.get("std") == "sample":
            arguments = {**arguments, "std": "population"}
        return _numpy(group_advantages)(rewards, group_ids, **arguments)

    report = check("advantages.json", group_advantages=buggy)
    assert {f.id.split("/")[1] for f in report.failures} == {"trl", "trl_batch", "verl"}


def test_planted_bug_logprobs_without_max_shift():
    """log softmax as z - log(sum(exp(z))) overflows for large logits."""

    def buggy(logits, tokens):
        logits = np.asarray(logits, dtype=np.float64)
        if not np.isfinite(logits[logits != -np.inf]).all() or logits.shape[0] != len(tokens):
            raise ValueError("bad logits")
        lse = np.log(np.exp(logits).sum(-1))
        logp = logits[np.arange(len(tokens)), tokens] - lse
        p = np.exp(logits - lse[:, None])
        grad = -p
        grad[np.arange(len(tokens)), tokens] += 1
        return logp, grad

    report = check("logprobs.json", token_logprobs=buggy)
    assert "large_logits" in report.failing_flags()


def test_planted_bug_returns_truncation_as_termination():
    """CleanRL's classic: a truncated step treated as terminal (no bootstrap)."""

    def treat_truncation_as_termination(fn, term_index, trunc_index):
        def buggy(*args):
            args = list(args)
            args[term_index] = args[term_index] | args[trunc_index]
            args[trunc_index] = np.zeros_like(args[trunc_index])
            return REFIMPL[fn](*args)

        return buggy

    report = check(
        "returns.json",
        gae_advantages=treat_truncation_as_termination("gae_advantages", 3, 4),
        discounted_returns=treat_truncation_as_termination("discounted_returns", 1, 2),
    )
    assert report.failures and "truncated_step" in report.failing_flags()
    assert {f.id.split("/")[1] for f in report.failures} == {"gae_advantages", "discounted_returns"}
    assert all({"truncated_step", "conflicting_flags"} & set(f.flags) for f in report.failures)


def test_planted_bug_per_decision_is_uses_the_trajectory_weight():
    def buggy(rewards, target_logp, behavior_logp, mask, gamma):
        return REFIMPL["trajectory_is"](rewards, target_logp, behavior_logp, mask, gamma)

    report = check("importance.json", per_decision_is=buggy)
    failing = {f.id for f in report.failures}
    assert failing and all(i.startswith("importance/per_decision_is/") for i in failing)
    assert "importance/per_decision_is/equal_policies/1" not in failing  # all weights 1: no difference


def _tabular_vectors(quantity: str) -> list[dict]:
    vectors = json.loads((VECTORS / "tabular.json").read_text())["vectors"]
    return [v for v in vectors if v["quantity"] == quantity and v["result"] == "valid"]


def test_planted_bug_tabular_advantages_against_the_best_action():
    """A = Q - max_a Q instead of Q - V: wrong wherever V(s) < max_a Q(s, a) for some state, i.e.
    wherever the vector's exact A has a row whose maximum is not exactly 0."""

    def buggy(P, R, gamma, rho0, terminal, pi):
        Q = T.q_values(_mdp(P, R, gamma, rho0, terminal), pi)
        return Q - Q.max(axis=1, keepdims=True)

    report = check("tabular.json", tabular_advantages=buggy)
    should_fail = {
        v["id"]
        for v in _tabular_vectors("advantages")
        if any(max(Fraction(a) for a in row) != 0 for row in v["expected"]["A"])
    }
    assert should_fail and {f.id for f in report.failures} == should_fail
    assert len(should_fail) < len(_tabular_vectors("advantages"))  # a one-action MDP has A = 0


def test_planted_bug_tabular_occupancy_normalised():
    """The normalised d_pi returned as the unnormalised rho_pi (mdp.md eq. (12): the factor
    1/(1 - gamma) dropped): wrong wherever sum_s rho(s) != 1, i.e. every occupancy vector but gamma = 0."""

    def normalised(fn):
        def buggy(P, R, gamma, rho0, terminal, pi):
            _, d = TABULAR[fn](P, R, gamma, rho0, terminal, pi)
            return d, d

        return buggy

    report = check(
        "tabular.json",
        tabular_state_occupancy=normalised("tabular_state_occupancy"),
        tabular_state_action_occupancy=normalised("tabular_state_action_occupancy"),
    )
    occupancy = _tabular_vectors("state_occupancy") + _tabular_vectors("state_action_occupancy")
    should_fail = {v["id"] for v in occupancy if sum(map(Fraction, _leaves(v["expected"]["rho"]))) != 1}
    assert should_fail and {f.id for f in report.failures} == should_fail
    assert {v["id"] for v in occupancy} - should_fail == {
        f"tabular/gamma_zero/{q}" for q in ("state_occupancy", "state_action_occupancy")
    }
    assert all(f.message.startswith("rho[") for f in report.failures)


def test_planted_bug_tabular_unchecked_solve():
    """Policy evaluation by a least-squares solve with no input checks fails every invalid tabular
    vector, and the valid gamma = 1 one: there I - P_pi is singular (a terminal state's row is 0)
    and lstsq's minimum-norm solution does not pin V(terminal) = 0."""

    def unchecked(P, R, gamma, rho0, terminal, pi):
        R = np.einsum("sat,sat->sa", P, R) if R.ndim == 3 else R
        P_pi, r_pi = np.einsum("sa,sat->st", pi, P), np.einsum("sa,sa->s", pi, R)
        V = np.linalg.lstsq(np.eye(len(r_pi)) - gamma * P_pi, r_pi, rcond=None)[0]
        return V, float(rho0[: len(V)] @ V)

    report = check("tabular.json", tabular_values=unchecked)
    vectors = json.loads((VECTORS / "tabular.json").read_text())["vectors"]
    invalid = {v["id"] for v in vectors if v["result"] == "invalid"}
    failing = {f.id for f in report.failures}
    assert failing == invalid | {"tabular/gamma_one_episodic/values"}, report.summary()
    assert all("accepted invalid input" in f.message for f in report.failures if f.id in invalid)


def test_tabular_tolerance_is_not_vacuous():
    """V off by 2^-36 max|R| (a wrong 11th digit, far above the roundoff): caught at every gamma
    with kappa <= 16 (eV = 16 (S + A) u kappa (kappa + 1) max|R| < 2^-36 max|R| there)."""

    def off(P, R, gamma, rho0, terminal, pi):
        V, J = _tabular_values(P, R, gamma, rho0, terminal, pi)
        return V + 2.0**-36 * np.max(np.abs(R)), J

    report = check("tabular.json", tabular_values=off)
    failing = {f.id for f in report.failures}
    caught = {f"tabular/{case}/values" for case in ("random_s3_a2", "gamma_zero", "single_state")}
    assert caught <= failing


def test_planted_bug_accepting_nan_is_caught_by_invalid_vectors():
    """An implementation that never validates its input fails the invalid vectors."""

    def buggy(estimator, logp, ref_logp):
        return (
            _kl(estimator, logp, ref_logp)
            if np.isfinite(logp).all() and np.isfinite(ref_logp).all()
            else (np.full(1, np.nan), np.full(1, np.nan))
        )

    report = check("kl.json", kl=buggy)
    assert report.failures and {f.id for f in report.failures} == {
        v["id"] for v in json.loads((VECTORS / "kl.json").read_text())["vectors"] if v["result"] == "invalid"
    }
    assert all("accepted invalid input" in f.message for f in report.failures)


# --------------------------------------------------------------------------------- the consumer itself


def test_a_version_1_file_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "kl.json"
    path.write_text(json.dumps({"schema": "rl-oracle-golden-vectors", "schema_version": 1, "vectors": []}))
    with pytest.raises(
        consumer.SchemaError, match=r"unsupported schema_version 1 \(this consumer reads version 2"
    ):
        consumer.load(path)
    assert consumer.main([str(path), "json"]) == 2


def test_float32_tolerance_and_unknown_dtype():
    float32 = {name: fn for name, fn in REFIMPL.items() if name in ("kl",)}
    report = consumer.check_file(VECTORS / "kl.json", float32, dtype="float32")
    assert report.ok and report.skipped > 0  # the subnormal vectors are out of float32's range
    with pytest.raises(ValueError, match="dtype must be one of"):
        consumer.check_file(VECTORS / "kl.json", float32, dtype="float16")


def test_the_consumer_imports_only_numpy_and_the_standard_library():
    tree = ast.parse(Path(consumer.__file__).read_text())
    modules = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    modules |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert modules - {"numpy"} <= sys.stdlib_module_names, modules


# ----------------------------------------------------------------------------- stubs and the command line

ALL_VECTORS = [v for name in FILES for v in json.loads((VECTORS / name).read_text())["vectors"]]
INVALID = {v["id"] for v in ALL_VECTORS if v["result"] == "invalid"}
LAUNCHER = ROOT / "tools" / "consumers" / "numpy_consumer.py"


def _raising(error: type[Exception]) -> dict:
    def raise_(*args, **kwargs):
        raise error("stub")

    return dict.fromkeys(consumer.FUNCTIONS, raise_)


def test_a_stub_that_raises_not_implemented_error_passes_no_vector():
    """Counting any exception as a rejection let such a stub pass every invalid vector."""
    report = consumer.check_directory(VECTORS, _raising(NotImplementedError))
    assert report.checked == len(ALL_VECTORS) and report.skipped == 0
    assert len(report.failures) == report.checked
    invalid = [f for f in report.failures if f.id in INVALID]
    assert invalid and all("raised NotImplementedError: stub, not ValueError (" in f.message for f in invalid)


@pytest.mark.parametrize("error", [TypeError, IndexError, ZeroDivisionError, RuntimeError])
def test_only_value_error_rejects_an_invalid_vector(error):
    report = consumer.check_file(VECTORS / "logprobs.json", _raising(error))
    assert len(report.failures) == report.checked == 14


def test_a_stub_that_raises_value_error_passes_exactly_the_invalid_vectors():
    report = consumer.check_directory(VECTORS, _raising(ValueError))
    passed = {v["id"] for v in ALL_VECTORS} - {f.id for f in report.failures}
    assert report.checked == len(ALL_VECTORS)
    assert passed == INVALID and report.checked - len(report.failures) == len(INVALID) == 142
    assert all(f.message == "raised ValueError: stub" for f in report.failures)


def test_a_value_error_subclass_rejects():
    class InvalidInput(ValueError):
        pass

    report = consumer.check_file(VECTORS / "kl.json", _raising(InvalidInput))
    assert report.checked - len(report.failures) == sum(i.startswith("kl/") for i in INVALID) == 12


def test_messages_print_plain_numbers_with_position_and_tolerance():
    def off(logp, old_logp, advantages, mask, variant, **kwargs):
        loss, grad = _policy_loss(logp, old_logp, advantages, mask, variant, **kwargs)
        grad[mask] += 1e-3  # np.float64 entries, off everywhere
        return np.float64(loss), grad

    only = ["policy_loss/ppo/mixed"]
    report = consumer.check_file(VECTORS / "policy_loss.json", {"policy_loss": off}, only=only)
    (failure,) = report.failures  # policy_loss/ppo/mixed/0
    assert "np." not in failure.message and "float64" not in failure.message, failure.message
    assert failure.message.startswith("grad_logp[0][0]: got "), failure.message
    assert ", tolerance " in failure.message
    report = consumer.check_file(VECTORS / "kl.json", {"kl": lambda e, lp, ref: (np.zeros(1), np.zeros(1))})
    message = next(f.message for f in report.failures if f.id == "kl/k1/1")
    assert message.startswith("value: got 0.0, expected ") and "np." not in message, message


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        (["kl"], lambda kind, v: kind == "kl"),
        (["dapo"], lambda kind, v: v.get("preset") == "dapo"),
        (["gae_advantages", "k3"], lambda kind, v: v.get("estimator") in ("gae_advantages", "k3")),
        (["policy_loss/dapo"], lambda kind, v: v["id"].startswith("policy_loss/dapo/")),
        (["kl/k3/11"], lambda kind, v: v["id"] == "kl/k3/11"),
        (["policy_loss/*/dapo/*"], lambda kind, v: kind.endswith("conventions") and v["preset"] == "dapo"),
        (["tabular_values"], lambda kind, v: kind == "tabular" and v["quantity"] == "values"),
        (["ragged_empty_row"], lambda kind, v: v.get("case_class") == "ragged_empty_row"),
    ],
)
def test_only_selects_families_presets_and_ids(selectors, expected):
    documents = [json.loads((VECTORS / name).read_text()) for name in FILES]
    want = {v["id"] for d in documents for v in d["vectors"] if expected(d["kind"], v)}
    report = consumer.check_directory(VECTORS, _raising(ValueError), only=selectors)
    assert want and report.checked == len(want)
    assert {f.id for f in report.failures} == want - INVALID  # the selected valid ones fail


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The checkout's launcher, as a user runs it (another directory, its own module)."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


EXAMPLE = ROOT / "tools" / "consumers" / "example_kl.py"  # the README's example implementation
MY_KL = EXAMPLE.read_text()


def test_the_command_line_from_another_directory(tmp_path):
    (tmp_path / "my_kl.py").write_text(MY_KL)
    result = launch("my_kl", cwd=tmp_path)  # the shipped vectors by default, a module from the cwd
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("PASS: 159 vectors checked, 1077 skipped, 0 failed")
    result = launch(str(VECTORS), str(tmp_path / "my_kl.py"), "--only", "k3,k2", cwd=ROOT)  # a file path
    assert result.returncode == 0 and result.stdout.startswith("PASS: 106 vectors checked, 0 skipped")
    naive = MY_KL.replace("small = np.abs(x) < 1e-2", "small = np.abs(x) < 0")
    assert naive != MY_KL
    (tmp_path / "naive.py").write_text(naive)
    result = launch(str(VECTORS / "kl.json"), "naive", "--only=kl/k3", cwd=tmp_path)
    assert result.returncode == 1 and "[log_ratio_tiny]: value: got " in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("my_kl", "--only", "no_such_preset"), "error: --only no_such_preset selects no vector"),
        (("no_such_module",), "error: No module named 'no_such_module'"),
        (("empty",), "error: empty defines none of the functions policy_loss, policy_loss_conventions"),
        (("my_kl", "--only", "tabular"), "error: no vector checked"),
        (("/no/such/dir", "my_kl"), "error: no vector files at /no/such/dir"),
    ],
)
def test_command_line_mistakes_are_one_line_and_exit_2(tmp_path, args, error):
    (tmp_path / "my_kl.py").write_text(MY_KL)
    (tmp_path / "empty.py").write_text("")
    result = launch(*args, cwd=tmp_path)
    assert result.returncode == 2 and error in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_every_function_selectors_and_exit_codes(tmp_path):
    result = launch("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert all(f"  {name}(" in result.stdout for name in consumer.FUNCTIONS)
    assert "exit status: 0 every checked vector passes, 1 one fails, 2 " in result.stdout
    assert "--only SELECTOR" in result.stdout and "raises ValueError" in result.stdout
    assert list(consumer.SIGNATURES) == list(consumer.FUNCTIONS) and len(consumer.FUNCTIONS) == 23


def test_the_refimpl_vectors_subcommand_is_the_same_command(tmp_path, capsys):
    import argparse

    (tmp_path / "my_kl.py").write_text(MY_KL)
    parser = argparse.ArgumentParser(prog="refimpl")
    consumer.register(parser.add_subparsers())
    args = parser.parse_args(["vectors", str(tmp_path / "my_kl.py"), "--only", "k1"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.startswith("PASS: 53 vectors checked, 0 skipped, 0 failed")


def test_the_readme_names_every_function_and_its_first_example_runs():
    readme = (ROOT / "tools" / "consumers" / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in consumer.FUNCTIONS)
    command, output = readme.split("```console\n$ ", 1)[1].split("\n")[:2]
    assert command == "python tools/consumers/numpy_consumer.py tools/consumers/example_kl.py --only kl"
    result = subprocess.run([sys.executable, *command.split()[1:]], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == output, result.stdout + result.stderr


def test_the_checkout_launcher_re_exports_the_consumer():
    """docs/conformance.md's ``from tools.consumers.numpy_consumer import check_file`` keeps working."""
    from tools.consumers import numpy_consumer as launcher

    assert launcher.check_file is consumer.check_file and launcher.FUNCTIONS == consumer.FUNCTIONS
    assert set(consumer.__all__) <= set(vars(launcher))

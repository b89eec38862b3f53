"""A reference consumer of the golden vectors (specs/vectors/*.json, schema version 2) that needs
only numpy: it checks an implementation given as plain functions, in any framework (JAX, CuPy,
a C extension...) that can take and return numpy arrays. It imports nothing from this project.

    python tools/consumers/numpy_consumer.py specs/vectors my_module

checks the functions that ``my_module`` defines under the names of ``FUNCTIONS`` (a missing one
skips its vectors) and exits 0 when every checked vector passes, 1 when one fails, 2 on a usage or
schema error. From Python: ``check_directory(path, {"kl": my_kl, ...}).summary()``.

Each vector's ``result`` says what to check (SCHEMA.md): ``valid``: the values match ``expected``
within the tolerance of the compute dtype; ``invalid``: the call must raise; ``acceptable``: each
gradient entry may match either ``grad_logp`` or ``grad_logp_other_side`` (a ratio within one
rounding of a clip bound). Tolerance: ``|got - want| <= rtol |want| + atol abs_scale + floor``
(``TOLERANCES``). The signatures (arrays are numpy float arrays of the compute dtype; per-token
ones ``[N, T]`` padded with ``mask``):

- ``policy_loss(logp, old_logp, advantages, mask, variant, *, ref_logp=None, normalizer=None)
  -> (loss, grad_logp)``; ``variant`` is the vector's dict of variant fields.
- ``policy_loss_conventions(logp, old_logp, advantages, mask, variant, convention, flags, *,
  ref_logp=None) -> (loss, grad_logp)``.
- ``kl(estimator, logp, ref_logp) -> (value, d_value_d_logp)`` on arrays of shape ``[1]``.
- ``group_advantages(rewards, group_ids, **arguments) -> advantages``.
- ``token_logprobs(logits, tokens) -> (logp, grad_logits)`` (``grad_logits``: of ``logp.sum()``).
- ``discounted_returns(rewards, terminated, truncated, gamma, next_values)``,
  ``n_step_returns(rewards, next_values, terminated, truncated, gamma, n)``,
  ``td_errors(rewards, values, next_values, terminated, gamma)``,
  ``lambda_returns(rewards, next_values, terminated, truncated, gamma, lam)`` -> ``[N, T]``;
  ``gae_advantages(rewards, values, next_values, terminated, truncated, gamma, lam)
  -> (advantages, returns)``; flags are bool arrays.
- ``importance_weights(target_logp, behavior_logp)``, ``is_estimate(f, weights)``,
  ``snis_estimate(f, weights)``, ``trajectory_importance_weights(target_logp, behavior_logp, mask)``,
  ``trajectory_is(rewards, target_logp, behavior_logp, mask, gamma)``,
  ``per_decision_is(rewards, target_logp, behavior_logp, mask, gamma)``.
- Tabular MDPs (``tabular.json``; float64 only, skipped under ``--dtype float32``), with ``P``
  ``[S, A, S]``, ``R`` ``[S, A]`` or ``[S, A, S]`` (reward on the transition), ``gamma`` a float,
  ``rho0`` ``[S]``, ``terminal`` a bool ``[S]``, policies ``[S, A]``:
  ``tabular_values(P, R, gamma, rho0, terminal, pi) -> (V, J)``;
  ``tabular_q_values(...same) -> Q``; ``tabular_advantages(...same) -> A``;
  ``tabular_state_occupancy(...same) -> (rho, d)`` (rho unnormalised, d = rho / sum rho);
  ``tabular_state_action_occupancy(...same) -> (rho, d)`` (``[S, A]``);
  ``tabular_optimal(P, R, gamma, rho0, terminal) -> (V_star, Q_star, pi_star)`` (``pi_star``: one
  action index per state, any action of the vector's ``optimal_actions`` passes);
  ``tabular_performance_difference(P, R, gamma, rho0, terminal, pi, pi_new) -> dict`` with the keys
  ``J_pi, J_pi_new, difference, expected_advantage, rho_pi, rho_pi_new, pdl_sum, surrogate,
  distribution_shift_penalty``. Inputs written ``"p/q"`` arrive correctly rounded
  (``float(Fraction("1/3"))``). Tolerance (the conditioning, not the generic rtol): policy
  evaluation solves ``(I - gamma P_pi) V = r_pi``, whose inverse has infinity norm
  ``kappa = 1/(1 - gamma)`` (at gamma = 1 the longest expected episode length under the policy,
  computed here from the inputs), so with ``b = 16 (S + A) 2^-53 kappa`` and the value scale
  ``s_V = expected.abs_scale`` if present, else ``(kappa + 1) max|R|`` (``|V| <= kappa max|r|``),
  ``eV = b s_V``: V, V*, J within ``2 eV``, Q, Q* ``2 eV``, A ``3 eV``; occupancies
  ``eRho = b (kappa + 1)`` for rho, ``2 eRho / sum(rho)`` for d; the performance-difference terms
  propagate these through the sums ``rho . abar`` (``_tabular_tolerances``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np

SCHEMA = "rl-oracle-golden-vectors"
SCHEMA_VERSION = 2

#: compute dtype -> (rtol, atol, floor) of SCHEMA.md "Numbers and tolerance"
TOLERANCES = {"float64": (1e-10, 1e-12, 2.0**-1068), "float32": (2.0**-14, 2.0**-14, 2.0**-140)}
#: flags whose numbers leave float32's range (skipped when checking a float32 implementation, as
#: are vectors with an input that float32 cannot hold exactly: the spec's value is then not the
#: float32 implementation's)
FLOAT32_SKIP = {"subnormal_input", "subnormal_result"}

FUNCTIONS = (
    "policy_loss",
    "policy_loss_conventions",
    "kl",
    "group_advantages",
    "token_logprobs",
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
    "tabular_values",
    "tabular_q_values",
    "tabular_advantages",
    "tabular_state_occupancy",
    "tabular_state_action_occupancy",
    "tabular_optimal",
    "tabular_performance_difference",
)

_PADDING = -5.5  # finite junk at padded positions unless the vector names a padding value


class SchemaError(ValueError):
    """The file is not a golden-vector file of the version this consumer reads."""


@dataclasses.dataclass(frozen=True)
class Failure:
    id: str
    flags: tuple[str, ...]
    message: str


@dataclasses.dataclass
class Report:
    checked: int = 0
    skipped: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def failing_flags(self) -> set[str]:
        return {f for failure in self.failures for f in failure.flags}

    def merge(self, other: Report) -> None:
        self.checked += other.checked
        self.skipped += other.skipped
        self.failures += other.failures

    def summary(self) -> str:
        lines = [
            f"{'PASS' if self.ok else 'FAIL'}: {self.checked} vectors checked, {self.skipped} skipped, "
            f"{len(self.failures)} failed"
        ]
        lines += [f"  {f.id} [{', '.join(f.flags)}]: {f.message}" for f in self.failures[:20]]
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20} more")
        return "\n".join(lines)


def load(path: str | Path) -> dict:
    """A vector file, after checking its schema and version (SchemaError, one line, otherwise)."""
    document = json.loads(Path(path).read_text())
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise SchemaError(f"{path}: not a golden-vector file (schema {SCHEMA!r} expected)")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: unsupported schema_version {version} (this consumer reads version "
            f"{SCHEMA_VERSION}; see specs/vectors/SCHEMA.md)"
        )
    return document


def _numbers(x):
    """Every decimal string under ``x`` (nested lists and dicts)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, list):
        for item in x:
            yield from _numbers(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _numbers(item)


def _exact_in(inputs: dict, dtype: str) -> bool:
    """Whether every numeric input string is exactly representable in ``dtype``."""
    for text in _numbers(inputs):
        try:
            value = float(text)
        except ValueError:  # a non-numeric string (e.g. a dtype name)
            continue
        if np.isfinite(value) and float(np.array(value, dtype=dtype)) != value:
            return False
    return True


def _array(values, dtype) -> np.ndarray:
    return np.array([float(v) for v in values], dtype=dtype)


def _grid(rows, dtype) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in rows], dtype=dtype).reshape(len(rows), -1)


def _padded(rows, dtype, fill: float = _PADDING) -> tuple[np.ndarray, np.ndarray]:
    width = max([len(r) for r in rows] + [1])
    x = np.full((len(rows), width), fill, dtype=dtype)
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, row in enumerate(rows):
        x[i, : len(row)] = [float(v) for v in row]
        mask[i, : len(row)] = True
    return x, mask


def _close(got, want, scale: float, dtype: str) -> np.ndarray:
    rtol, atol, floor = TOLERANCES[np.dtype(dtype).name]
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return np.abs(got - want) <= rtol * np.abs(want) + atol * scale + floor


def _compare(name: str, got, want_rows, scale: float, dtype: str, other_rows=None) -> str | None:
    """None when ``got`` matches (elementwise either ``want`` or ``other``), else a message."""
    want = np.array(_flatten(want_rows), dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    ok = _close(got, want, scale, dtype)
    if other_rows is not None:
        ok |= _close(got, np.array(_flatten(other_rows), dtype=np.float64), scale, dtype)
    if ok.all():
        return None
    k = int(np.argmin(ok))
    return f"{name}[{k}]: got {got[k]!r}, expected {want[k]!r}"


def _flatten(rows) -> list[float]:
    if isinstance(rows, str):
        return [float(rows)]
    out: list[float] = []
    for row in rows:
        out += _flatten(row) if isinstance(row, list) else [float(row)]
    return out


def _ragged(padded: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(padded)[mask]


# --------------------------------------------------------------------------------------------- families


def _policy_call(fn, vector: dict, dtype, kind: str):
    inputs = vector["inputs"]
    fill = _PADDING if inputs.get("padding_value") is None else float(inputs["padding_value"])
    logp, mask = _padded(inputs["logp"], dtype, fill)
    old, _ = _padded(inputs["old_logp"], dtype, fill)
    adv = _array(inputs["advantages"], dtype)
    ref = None if inputs["ref_logp"] is None else _padded(inputs["ref_logp"], dtype, fill)[0]
    if kind == "policy_loss":
        normalizer = None if inputs["normalizer"] is None else float(inputs["normalizer"])
        loss, grad = fn(logp, old, adv, mask, dict(vector["variant"]), ref_logp=ref, normalizer=normalizer)
    else:
        loss, grad = fn(
            logp,
            old,
            adv,
            mask,
            dict(vector["variant"]),
            vector["convention"],
            dict(vector["convention_flags"]),
            ref_logp=ref,
        )
    grad = np.asarray(grad, dtype=np.float64)
    if grad.shape != mask.shape:
        return None, f"grad_logp: shape {grad.shape}, expected {mask.shape}"
    if np.any(grad[~mask] != 0):
        return None, "grad_logp is not 0 at padded positions"
    return (loss, grad[mask]), None


def _check_policy(fn, vector, dtype, kind):
    (result, error) = _policy_call(fn, vector, dtype, kind)
    if error:
        return error
    loss, grad = result
    expected = vector["expected"]
    scale = float(expected["abs_scale"])
    return _compare("loss", [loss], [expected["loss"]], scale, dtype) or _compare(
        "grad_logp", grad, expected["grad_logp"], scale, dtype, expected.get("grad_logp_other_side")
    )


def _call_policy(fn, vector, dtype, kind):
    _policy_call(fn, vector, dtype, kind)


def _kl_args(vector, dtype):
    return (
        vector["estimator"],
        _array([vector["inputs"]["logp"]], dtype),
        _array([vector["inputs"]["ref_logp"]], dtype),
    )


def _check_kl(fn, vector, dtype):
    value, slope = fn(*_kl_args(vector, dtype))
    e = vector["expected"]
    scale = float(e["abs_scale"])
    return _compare("value", value, [e["value"]], scale, dtype) or _compare(
        "d_value_d_logp", slope, [e["d_value_d_logp"]], scale, dtype
    )


def _advantage_args(vector, dtype):
    return (
        _array(vector["inputs"]["rewards"], dtype),
        np.array(vector["inputs"]["group_ids"], dtype=np.int64),
    )


def _check_advantages(fn, vector, dtype):
    got = fn(*_advantage_args(vector, dtype), **vector["arguments"])
    e = vector["expected"]
    return _compare("advantages", got, e["advantages"], float(e["abs_scale"]), dtype)


def _logprob_args(vector, dtype):
    rows = vector["inputs"]["logits"]
    return _grid(rows, dtype) if rows else np.zeros((0, 0), dtype), np.array(
        vector["inputs"]["tokens"], np.int64
    )


def _check_logprobs(fn, vector, dtype):
    logp, grad = fn(*_logprob_args(vector, dtype))
    e = vector["expected"]
    scale = float(e["abs_scale"])
    return _compare("logp", logp, e["logp"], scale, dtype) or _compare(
        "grad_logits", grad, e["grad_logits"], scale, dtype
    )


def _returns_args(vector, dtype):
    inputs, args = vector["inputs"], vector["arguments"]
    r = _grid(inputs["rewards"], dtype)
    v = None if inputs["values"] is None else _grid(inputs["values"], dtype)
    nv = None if inputs["next_values"] is None else _grid(inputs["next_values"], dtype)
    term = np.array(inputs["terminated"], dtype=bool)
    trunc = np.array(inputs["truncated"], dtype=bool)
    g = args["gamma"]
    return {
        "discounted_returns": lambda: (r, term, trunc, g, nv),
        "n_step_returns": lambda: (r, nv, term, trunc, g, args.get("n")),
        "td_errors": lambda: (r, v, nv, term, g),
        "lambda_returns": lambda: (r, nv, term, trunc, g, args.get("lam")),
        "gae_advantages": lambda: (r, v, nv, term, trunc, g, args.get("lam")),
    }[vector["estimator"]]()


def _check_returns(fn, vector, dtype):
    out = fn(*_returns_args(vector, dtype))
    e = vector["expected"]
    scale = float(e["abs_scale"])
    if vector["estimator"] == "gae_advantages":
        adv, ret = out
        return _compare("advantages", adv, e["advantages"], scale, dtype) or _compare(
            "returns", ret, e["returns"], scale, dtype
        )
    key = "td_errors" if vector["estimator"] == "td_errors" else "returns"
    return _compare(key, out, e[key], scale, dtype)


def _importance_args(vector, dtype):
    inputs, estimator = vector["inputs"], vector["estimator"]
    if estimator in ("is_estimate", "snis_estimate"):
        return _array(inputs["f"], dtype), _array(inputs["weights"], dtype)
    t, b = _grid(inputs["target_logp"], dtype), _grid(inputs["behavior_logp"], dtype)
    if estimator == "importance_weights":
        return t, b
    mask = np.array(inputs["mask"], dtype=bool)
    if estimator == "trajectory_importance_weights":
        return t, b, mask
    return _grid(inputs["rewards"], dtype), t, b, mask, vector["arguments"]["gamma"]


def _check_importance(fn, vector, dtype):
    got = fn(*_importance_args(vector, dtype))
    e = vector["expected"]
    key = next(k for k in ("weights", "estimate", "estimates") if k in e)
    return _compare(key, got, e[key], float(e["abs_scale"]), dtype)


def _rational(text) -> float:
    """A tabular input string as float64: ``"p/q"`` correctly rounded (``Fraction``), else ``float``
    (decimals, ``"nan"``, ``"inf"``)."""
    return float(Fraction(text)) if isinstance(text, str) and "/" in text else float(text)


def _nested(x) -> np.ndarray:
    def rec(v):
        return [rec(item) for item in v] if isinstance(v, list) else _rational(v)

    return np.array(rec(x), dtype=np.float64)


_TABULAR_KEYS = {
    "values": ("V", "J"),
    "q_values": ("Q",),
    "advantages": ("A",),
    "state_occupancy": ("rho", "d"),
    "state_action_occupancy": ("rho", "d"),
    "optimal": ("V_star", "Q_star", "pi_star"),
}
_PDL_KEYS = ("J_pi", "J_pi_new", "difference", "expected_advantage", "rho_pi", "rho_pi_new", "pdl_sum",
             "surrogate", "distribution_shift_penalty")


def _tabular_args(vector, dtype):
    inputs = vector["inputs"]
    args = [_nested(inputs["P"]), _nested(inputs["R"]), _rational(inputs["gamma"]), _nested(inputs["rho0"]),
            np.array(inputs["terminal"], dtype=bool)]
    args += [_nested(inputs[k]) for k in ("pi", "pi_new") if k in inputs]
    return tuple(args)


def _kappa(P, gamma, terminal, pi) -> float:
    """``||(I - gamma P_pi)^-1||_inf``: 1/(1 - gamma), at gamma = 1 the longest expected episode
    length (solving for the expected number of steps from each non-terminal state)."""
    if gamma < 1:
        return 1.0 / (1.0 - gamma)
    live = ~terminal
    P_pi = np.einsum("sa,sat->st", pi, P)[np.ix_(live, live)]
    steps = np.linalg.solve(np.eye(int(live.sum())) - P_pi, np.ones(int(live.sum())))
    return float(np.max(steps, initial=1.0))


def _tabular_tolerances(vector) -> dict[str, float]:
    """The absolute tolerance of each expected key (module docstring; SCHEMA.md)."""
    P, R, gamma, _, terminal, *policies = _tabular_args(vector, np.float64)
    e, quantity = vector["expected"], vector["quantity"]
    S, A = P.shape[0], P.shape[1]
    r_max = float(np.max(np.abs(R), initial=0.0))
    if quantity == "optimal":
        policies = [np.eye(A)[np.array(e["pi_star"], dtype=np.int64)]]

    def bounds(pi):
        kappa = _kappa(P, gamma, terminal, pi)
        b = 16 * (S + A) * 2.0**-53 * kappa
        scale = float(e["abs_scale"]) if "abs_scale" in e else (kappa + 1) * r_max
        return b * scale, b * (kappa + 1)  # eV, eRho

    eV, eRho = bounds(policies[0])
    if quantity in ("state_occupancy", "state_action_occupancy"):
        total = float(np.sum(_nested(e["rho"])))
        return {"rho": eRho, "d": 2 * eRho / total if total else 0.0}
    if quantity != "performance_difference":
        return {"V": 2 * eV, "J": 2 * eV, "Q": 2 * eV, "A": 3 * eV, "V_star": 2 * eV, "Q_star": 2 * eV}
    eV_new, eRho_new = bounds(policies[1])
    abar_tol = 4 * eV  # sum_a pi'(a|s) A_pi(s, a), A to 3 eV
    a_max = float(np.max(np.abs(_nested(e["expected_advantage"]))))
    pdl = float(np.sum(_nested(e["rho_pi_new"]))) * abar_tol + eRho_new * a_max
    surrogate = 2 * eV + float(np.sum(_nested(e["rho_pi"]))) * abar_tol + eRho * a_max
    return {"J_pi": 2 * eV, "J_pi_new": 2 * eV_new, "difference": 2 * eV + 2 * eV_new,
            "expected_advantage": abar_tol, "rho_pi": eRho, "rho_pi_new": eRho_new, "pdl_sum": pdl,
            "surrogate": surrogate, "distribution_shift_penalty": pdl + surrogate}


def _check_tabular(fn, vector, dtype):
    out = fn(*_tabular_args(vector, dtype))
    quantity, e = vector["quantity"], vector["expected"]
    if quantity == "performance_difference":
        if not isinstance(out, dict):
            return f"expected a dict with keys {_PDL_KEYS}, got {type(out).__name__}"
        got = {key: out.get(key) for key in _PDL_KEYS}
    else:
        keys = _TABULAR_KEYS[quantity]
        out = (out,) if len(keys) == 1 else tuple(out)
        if len(out) != len(keys):
            return f"expected {len(keys)} results {keys}, got {len(out)}"
        got = dict(zip(keys, out, strict=True))
    if quantity == "optimal":
        chosen = np.asarray(got.pop("pi_star")).reshape(-1)
        if chosen.shape != (len(e["optimal_actions"]),):
            return f"pi_star: shape {chosen.shape}, expected ({len(e['optimal_actions'])},)"
        for s, (a, allowed) in enumerate(zip(chosen.tolist(), e["optimal_actions"], strict=True)):
            if a not in allowed:
                return f"pi_star[{s}]: got action {a}, optimal actions {allowed}"
    tol = _tabular_tolerances(vector)
    for key, value in got.items():
        if value is None:
            return f"{key}: missing"
        want = np.array(_flatten(e[key]), dtype=np.float64)
        value = np.asarray(value, dtype=np.float64).reshape(-1)
        if value.shape != want.shape:
            return f"{key}: shape {value.shape}, expected {want.shape}"
        bad = ~(np.abs(value - want) <= tol[key])
        if bad.any():
            k = int(np.argmax(bad))
            return f"{key}[{k}]: got {value[k]!r}, expected {want[k]!r} (tolerance {tol[key]:.3g})"
    return None


def _family(kind: str, vector: dict) -> str:
    """The implementation function a vector of ``kind`` calls."""
    if kind in ("returns", "importance"):
        return vector["estimator"]
    if kind == "tabular":
        return "tabular_" + vector["quantity"]
    return {"advantages": "group_advantages", "logprobs": "token_logprobs"}.get(kind, kind)


def _runner(kind: str) -> tuple[Callable, Callable]:
    """(check a valid / acceptable vector -> message or None, call with the vector's inputs)."""
    if kind in ("policy_loss", "policy_loss_conventions"):
        return (lambda fn, v, d: _check_policy(fn, v, d, kind)), (
            lambda fn, v, d: _call_policy(fn, v, d, kind)
        )
    if kind == "kl":
        return _check_kl, lambda fn, v, d: fn(*_kl_args(v, d))
    if kind == "advantages":
        return _check_advantages, lambda fn, v, d: fn(*_advantage_args(v, d), **v["arguments"])
    if kind == "logprobs":
        return _check_logprobs, lambda fn, v, d: fn(*_logprob_args(v, d))
    if kind == "returns":
        return _check_returns, lambda fn, v, d: fn(*_returns_args(v, d))
    if kind == "importance":
        return _check_importance, lambda fn, v, d: fn(*_importance_args(v, d))
    if kind == "tabular":
        return _check_tabular, lambda fn, v, d: fn(*_tabular_args(v, d))
    raise KeyError(kind)


def check_document(document: dict, implementation: dict[str, Callable], dtype: str = "float64") -> Report:
    """Check every vector of a loaded file against the implementation's functions."""
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype must be one of {tuple(TOLERANCES)}, got {dtype!r}")
    report = Report()
    kind = document["kind"]
    try:
        check, call = _runner(kind)
    except KeyError:
        report.skipped += len(document["vectors"])  # a kind this consumer does not know
        return report
    np_dtype = np.dtype(dtype)
    for vector in document["vectors"]:
        fn = implementation.get(_family(kind, vector))
        flags = tuple(vector["flags"])
        inexact = dtype != "float64" and (
            kind == "tabular" or FLOAT32_SKIP & set(flags) or not _exact_in(vector["inputs"], dtype)
        )
        if fn is None or inexact:
            report.skipped += 1
            continue
        report.checked += 1
        if vector["result"] == "invalid":
            try:
                with np.errstate(all="ignore"):
                    call(fn, vector, np_dtype)
            except Exception:  # noqa: BLE001 (any rejection counts: ValueError, TypeError, a custom error)
                continue
            report.failures.append(
                Failure(vector["id"], flags, f"accepted invalid input ({vector['reason']})")
            )
            continue
        try:
            with np.errstate(all="ignore"):
                message = check(fn, vector, np_dtype)
        except Exception as exc:  # noqa: BLE001
            message = f"raised {type(exc).__name__}: {exc}"
        if message:
            report.failures.append(Failure(vector["id"], flags, message))
    return report


def check_file(path: str | Path, implementation: dict[str, Callable], dtype: str = "float64") -> Report:
    return check_document(load(path), implementation, dtype)


def check_directory(
    directory: str | Path, implementation: dict[str, Callable], dtype: str = "float64"
) -> Report:
    """Every ``*.json`` vector file of a directory."""
    report = Report()
    for path in sorted(Path(directory).glob("*.json")):
        report.merge(check_file(path, implementation, dtype))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vectors", type=Path, help="the vector directory (specs/vectors) or one file")
    parser.add_argument("module", help="an importable module defining functions named as in FUNCTIONS")
    parser.add_argument("--dtype", default="float64", choices=tuple(TOLERANCES))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(args.module)
        implementation = {name: getattr(module, name) for name in FUNCTIONS if hasattr(module, name)}
        if args.vectors.is_dir():
            report = check_directory(args.vectors, implementation, args.dtype)
        else:
            report = check_file(args.vectors, implementation, args.dtype)
    except (ImportError, OSError, SchemaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The numpy consumer of the golden vectors (specs/vectors/*.json, schema version 2): it checks an
implementation given as plain functions that take and return numpy arrays, in any framework (JAX,
CuPy, a C extension...), against every vector. One file that needs only numpy and imports nothing
from this project: copy it anywhere, or run it from the installed package.

    python -m specs.numpy_consumer [VECTORS] MODULE [--only SELECTOR ...] [--dtype float32]
    refimpl vectors [VECTORS] MODULE ...                          (the same, as a subcommand)
    python tools/consumers/numpy_consumer.py [VECTORS] MODULE ... (from a checkout)

``MODULE`` (a module importable from the current directory, or a ``.py`` file) defines functions
under the names of ``SIGNATURES`` (a missing one skips its vectors); ``VECTORS`` is a vector
directory or one file (default: the ``vectors`` directory beside this file). Every file is checked
against the schema (``validate``) before any vector runs. Exit status 0 when every checked vector
passes, 1 when one fails, 2 on a usage error or when no vector is checked, 3 when a vector file is
invalid (one line each, naming the file, the vector and the field; the valid files are still
checked). ``--skip-unsupported``: a function raising NotImplementedError skips that vector (counted
and listed). From Python: ``check_directory(path, {"kl": my_kl, ...}).summary()``.

Each vector's ``result`` says what to check (SCHEMA.md): ``valid``: the values match ``expected``
within the tolerance of the compute dtype; ``invalid``: the call must raise ``ValueError`` (a
subclass counts; any other exception, ``NotImplementedError`` included, is a failure: it is not a
rejection of the input); ``acceptable``: each gradient entry may match either ``grad_logp`` or
``grad_logp_other_side`` (a ratio within one rounding of a clip bound). Tolerance:
``|got - want| <= rtol |want| + atol abs_scale + floor`` (``TOLERANCES``).

Tabular MDPs (``tabular.json``; float64 only, skipped under ``--dtype float32``): inputs written
``"p/q"`` arrive correctly rounded (``float(Fraction("1/3"))``). Tolerance (the conditioning, not
the generic rtol): policy evaluation solves ``(I - gamma P_pi) V = r_pi``, whose inverse has
infinity norm ``kappa = 1/(1 - gamma)`` (at gamma = 1 the longest expected episode length under the
policy, computed here from the inputs), so with ``b = 16 (S + A) 2^-53 kappa`` and the value scale
``s_V = expected.abs_scale`` if present, else ``(kappa + 1) max|R|`` (``|V| <= kappa max|r|``),
``eV = b s_V``: V, V*, J within ``2 eV``, Q, Q* ``2 eV``, A ``3 eV``; occupancies
``eRho = b (kappa + 1)`` for rho, ``2 eRho / sum(rho)`` for d; the performance-difference terms
propagate these through the sums ``rho . abar`` (``_tabular_tolerances``).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib
import importlib.util
import json
import sys
import textwrap
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = [
    "FUNCTIONS",
    "SIGNATURES",
    "TOLERANCES",
    "Failure",
    "Report",
    "SchemaError",
    "check_directory",
    "check_document",
    "check_file",
    "load",
    "main",
    "register",
    "selects",
    "validate",
]

SCHEMA = "rl-oracle-golden-vectors"
SCHEMA_VERSION = 2
#: the vectors shipped beside this file (specs/vectors), the default of ``VECTORS``
DEFAULT_VECTORS = Path(__file__).resolve().parent / "vectors"

#: compute dtype -> (rtol, atol, floor) of SCHEMA.md "Numbers and tolerance"
TOLERANCES = {"float64": (1e-10, 1e-12, 2.0**-1068), "float32": (2.0**-14, 2.0**-14, 2.0**-140)}
#: flags whose numbers leave float32's range (skipped when checking a float32 implementation, as
#: are vectors with an input that float32 cannot hold exactly: the spec's value is then not the
#: float32 implementation's)
FLOAT32_SKIP = {"subnormal_input", "subnormal_result"}

#: The functions an implementation may define (each checks the vectors of one family), with their
#: signatures. Arrays are numpy float arrays of the compute dtype; per-token ones ``[N, T]`` padded,
#: with the bool ``mask`` marking real tokens; flags are bool arrays.
SIGNATURES: dict[str, str] = {
    "policy_loss": "(logp, old_logp, advantages, mask, variant, *, ref_logp=None, normalizer=None)"
    " -> (loss, grad_logp); variant: the vector's dict of variant fields",
    "policy_loss_conventions": "(logp, old_logp, advantages, mask, variant, convention, flags, *,"
    " ref_logp=None) -> (loss, grad_logp)",
    "kl": "(estimator, logp, ref_logp) -> (value, d_value_d_logp); arrays of shape [1]",
    "group_advantages": "(rewards, group_ids, **arguments) -> advantages",
    "token_logprobs": "(logits, tokens) -> (logp, grad_logits); grad_logits of logp.sum()",
    "discounted_returns": "(rewards, terminated, truncated, gamma, next_values) -> returns [N, T]",
    "n_step_returns": "(rewards, next_values, terminated, truncated, gamma, n) -> returns [N, T]",
    "td_errors": "(rewards, values, next_values, terminated, gamma) -> td_errors [N, T]",
    "lambda_returns": "(rewards, next_values, terminated, truncated, gamma, lam) -> returns [N, T]",
    "gae_advantages": "(rewards, values, next_values, terminated, truncated, gamma, lam)"
    " -> (advantages, returns)",
    "importance_weights": "(target_logp, behavior_logp) -> weights",
    "is_estimate": "(f, weights) -> estimate",
    "snis_estimate": "(f, weights) -> estimate",
    "trajectory_importance_weights": "(target_logp, behavior_logp, mask) -> weights [N]",
    "trajectory_is": "(rewards, target_logp, behavior_logp, mask, gamma) -> estimates [N]",
    "per_decision_is": "(rewards, target_logp, behavior_logp, mask, gamma) -> estimates [N]",
    "tabular_values": "(P, R, gamma, rho0, terminal, pi) -> (V, J); P [S, A, S], R [S, A] or"
    " [S, A, S], rho0 [S], terminal bool [S], pi [S, A]",
    "tabular_q_values": "(P, R, gamma, rho0, terminal, pi) -> Q",
    "tabular_advantages": "(P, R, gamma, rho0, terminal, pi) -> A",
    "tabular_state_occupancy": "(P, R, gamma, rho0, terminal, pi) -> (rho, d); rho unnormalised,"
    " d = rho / sum(rho)",
    "tabular_state_action_occupancy": "(P, R, gamma, rho0, terminal, pi) -> (rho, d) [S, A]",
    "tabular_optimal": "(P, R, gamma, rho0, terminal) -> (V_star, Q_star, pi_star); pi_star: one"
    " action per state, any of the vector's optimal_actions",
    "tabular_performance_difference": "(P, R, gamma, rho0, terminal, pi, pi_new) -> dict with keys"
    " J_pi, J_pi_new, difference, expected_advantage, rho_pi, rho_pi_new, pdl_sum, surrogate,"
    " distribution_shift_penalty",
}
FUNCTIONS = tuple(SIGNATURES)

#: the exception an implementation raises on an invalid vector (SCHEMA.md "Common keys")
REJECTION = ValueError

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
    """What a run found: ``checked`` vectors (``failures`` among them: the implementation's),
    ``skipped`` ones (no function, or a dtype that cannot hold the inputs), ``unsupported`` ones
    (``--skip-unsupported``: the function raised NotImplementedError) and ``invalid_files`` (one
    line each: a vector file that breaks the schema, none of whose vectors ran)."""

    checked: int = 0
    skipped: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)
    unsupported: list[Failure] = dataclasses.field(default_factory=list)
    invalid_files: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.invalid_files

    def failing_flags(self) -> set[str]:
        return {f for failure in self.failures for f in failure.flags}

    def merge(self, other: Report) -> None:
        self.checked += other.checked
        self.skipped += other.skipped
        self.failures += other.failures
        self.unsupported += other.unsupported
        self.invalid_files += other.invalid_files

    def summary(self) -> str:
        first = (f"{'PASS' if self.ok else 'FAIL'}: {self.checked} vectors checked, {self.skipped} skipped, "
                 f"{len(self.failures)} failed")
        if self.unsupported:
            first += f", {len(self.unsupported)} unsupported (skipped)"
        if self.invalid_files:
            first += f", {len(self.invalid_files)} vector file{'s' * (len(self.invalid_files) > 1)} invalid"
        lines = [first] + [f"  invalid vector file: {text}" for text in self.invalid_files]
        for what, items in (("", self.failures), ("unsupported: ", self.unsupported)):
            lines += [f"  {what}{f.id} [{', '.join(f.flags)}]: {f.message}" for f in items[:20]]
            if len(items) > 20:
                lines.append(f"  ... and {len(items) - 20} more {what.rstrip(': ')}".rstrip())
        return "\n".join(lines)


def load(path: str | Path) -> dict:
    """A vector file, after checking its schema, its version and every vector against SCHEMA.md
    (``validate``): a SchemaError of one line naming the file (and the vector and field) otherwise,
    unreadable and truncated files included."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SchemaError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise SchemaError(f"{path}: not valid JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise SchemaError(f"{path}: not a golden-vector file (schema {SCHEMA!r} expected)")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: unsupported schema_version {version} (this consumer reads version "
            f"{SCHEMA_VERSION}; see specs/vectors/SCHEMA.md)"
        )
    problems = validate(document)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise SchemaError(f"{path}: {problems[0]}{more}")
    return document


# ------------------------------------------------------------------------------------------ the schema
#
# What every vector of a kind must hold (SCHEMA.md), checked before any vector runs, so that a
# corrupted file is reported as such and never passes or fails an implementation: the vector's own
# keys, its input keys (per estimator / quantity where they differ) and, for valid and acceptable
# vectors, its expected keys, each leaf a number (a decimal string, or "p/q" in tabular files).

_RESULTS = ("valid", "invalid", "acceptable")
_POLICY_INPUTS = ("logp", "old_logp", "advantages", "ref_logp", "padding_value")
_VECTOR_KEYS = {
    "policy_loss": ("variant",), "policy_loss_conventions": ("variant", "convention", "convention_flags"),
    "kl": ("estimator",), "advantages": ("arguments",), "logprobs": (), "returns": ("estimator", "arguments"),
    "importance": ("estimator",), "tabular": ("quantity",),
}
_IMPORTANCE_INPUTS = {
    "importance_weights": ("target_logp", "behavior_logp"),
    "is_estimate": ("f", "weights"),
    "snis_estimate": ("f", "weights"),
    "trajectory_importance_weights": ("target_logp", "behavior_logp", "mask"),
    "trajectory_is": ("rewards", "target_logp", "behavior_logp", "mask"),
    "per_decision_is": ("rewards", "target_logp", "behavior_logp", "mask"),
}
_IMPORTANCE_EXPECTED = {"importance_weights": "weights", "trajectory_importance_weights": "weights",
                        "is_estimate": "estimate", "snis_estimate": "estimate", "trajectory_is": "estimates",
                        "per_decision_is": "estimates"}
_RETURNS_EXPECTED = {"discounted_returns": ("returns",), "n_step_returns": ("returns",),
                     "lambda_returns": ("returns",), "td_errors": ("td_errors",),
                     "gae_advantages": ("advantages", "returns")}


def _keys(kind: str, vector: dict) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, tuple]]:
    """(input keys, expected keys, numeric arguments {key: required}) of a vector of ``kind``;
    ValueError naming the field when its estimator or quantity is unknown."""
    scale = ("abs_scale",)
    if kind in ("policy_loss", "policy_loss_conventions"):
        inputs = _POLICY_INPUTS + (("normalizer",) if kind == "policy_loss" else ())
        other = ("grad_logp_other_side",) if vector.get("result") == "acceptable" else ()
        return inputs, ("loss", "grad_logp", *other) + scale, {}
    if kind == "kl":
        return ("logp", "ref_logp"), ("value", "d_value_d_logp") + scale, {}
    if kind == "advantages":
        return ("rewards", "group_ids"), ("advantages",) + scale, {}
    if kind == "logprobs":
        return ("logits", "tokens"), ("logp", "grad_logits") + scale, {}
    estimator, quantity = vector.get("estimator"), vector.get("quantity")
    if kind == "returns":
        if estimator not in _RETURNS_EXPECTED:
            raise ValueError(f"estimator: unknown returns estimator {estimator!r}")
        arguments = {"gamma": True, "n": estimator == "n_step_returns", "lam": estimator in ("lambda_returns",
                                                                                       "gae_advantages")}
        inputs = ("rewards", "values", "next_values", "terminated", "truncated")
        return inputs, _RETURNS_EXPECTED[estimator] + scale, arguments
    if kind == "importance":
        if estimator not in _IMPORTANCE_INPUTS:
            raise ValueError(f"estimator: unknown importance estimator {estimator!r}")
        gamma = {"gamma": True} if estimator in ("trajectory_is", "per_decision_is") else {}
        return _IMPORTANCE_INPUTS[estimator], (_IMPORTANCE_EXPECTED[estimator],) + scale, gamma
    if quantity == "performance_difference":
        return ("P", "R", "gamma", "rho0", "terminal", "pi", "pi_new"), _PDL_KEYS, {}
    if quantity == "optimal":
        return ("P", "R", "gamma", "rho0", "terminal"), _TABULAR_KEYS[quantity] + ("optimal_actions",), {}
    if quantity not in _TABULAR_KEYS:
        raise ValueError(f"quantity: unknown tabular quantity {quantity!r}")
    return ("P", "R", "gamma", "rho0", "terminal", "pi"), _TABULAR_KEYS[quantity], {}


_FLAG_INPUTS = ("terminal", "terminated", "truncated", "mask")  # true / false or 0 / 1


def _number_problem(x, rational: bool, flag: bool = False) -> str | None:
    """None when ``x`` is a number of the schema (a JSON number or a decimal string; ``"p/q"``
    where ``rational``; true / false where ``flag``), else what it is."""
    if isinstance(x, bool) and flag:
        return None
    if isinstance(x, bool) or x is None or isinstance(x, (dict, list)):
        return f"{json.dumps(x)[:40]} is not a number"
    if isinstance(x, (int, float)):
        return None
    if isinstance(x, str):
        try:
            float(x)
            return None
        except ValueError:
            if rational and "/" in x:
                try:
                    Fraction(x)
                    return None
                except (ValueError, ZeroDivisionError):
                    pass
    return f"{json.dumps(x)[:40]} is not a number"


def _leaf_problem(x, field: str, rational: bool, flag: bool = False) -> str | None:
    """The first leaf of the nested lists / dicts ``x`` that is not a number, as ``field[i][j]: ...``."""
    if isinstance(x, list):
        for i, item in enumerate(x):
            problem = _leaf_problem(item, f"{field}[{i}]", rational, flag)
            if problem:
                return problem
        return None
    if isinstance(x, dict):
        for key, item in x.items():
            problem = _leaf_problem(item, f"{field}.{key}", rational, flag)
            if problem:
                return problem
        return None
    problem = _number_problem(x, rational, flag)
    return f"{field}: {problem}" if problem else None


def _vector_problem(kind: str, vector) -> str | None:
    """The first way ``vector`` breaks the schema of ``kind`` (``field: problem``), or None."""
    if not isinstance(vector, dict):
        return f"is a {type(vector).__name__}, not an object"
    if not isinstance(vector.get("id"), str) or not vector["id"]:
        return "id: missing or not a non-empty string"
    flags = vector.get("flags")
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return "flags: missing or not a list of names"
    result = vector.get("result")
    if result not in _RESULTS:
        return f"result: {json.dumps(result)} is not one of {', '.join(_RESULTS)}"
    if result != "valid" and not isinstance(vector.get("reason"), str):
        return f"reason: a {result} vector needs a reason (a string)"
    if kind not in _FAMILIES:
        return None  # a kind this consumer does not know: its vectors are skipped
    for key in _VECTOR_KEYS[kind]:
        if key not in vector:
            return f"{key}: missing"
    inputs = vector.get("inputs")
    if not isinstance(inputs, dict):
        return "inputs: missing or not an object"
    try:
        input_keys, expected_keys, arguments = _keys(kind, vector)
    except ValueError as exc:
        return str(exc)
    rational = kind == "tabular"
    for key in input_keys:
        if key not in inputs:
            return f"inputs.{key}: missing"
        if inputs[key] is not None:
            problem = _leaf_problem(inputs[key], f"inputs.{key}", rational, key in _FLAG_INPUTS)
            if problem:
                return problem
    args = vector.get("arguments", {})
    if not isinstance(args, dict):
        return "arguments: not an object"
    for key, required in arguments.items():
        if args.get(key) is None:
            if required:
                return f"arguments.{key}: missing"
            continue
        problem = _number_problem(args[key], False)
        if problem or isinstance(args[key], str):
            return f"arguments.{key}: {problem or 'a number must be a JSON number here'}"
    try:  # the arguments the implementation would receive (ragged where a grid belongs, ...)
        _FAMILIES[kind][0](vector, np.float64)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
        reason = " ".join(str(exc).split())
        return f"inputs: cannot be read as the {kind} arguments ({type(exc).__name__}: {reason})"
    if result == "invalid":
        return None
    expected = vector.get("expected")
    if not isinstance(expected, dict):
        return f"expected: missing or not an object (a {result} vector compares with it)"
    for key in expected_keys:
        if key not in expected:
            return f"expected.{key}: missing"
    return _leaf_problem(expected, "expected", rational)


def validate(document: dict) -> list[str]:
    """Every way a loaded file breaks the schema (SCHEMA.md), one line each (``vector ID: field:
    problem``); empty when every vector can be checked. A file with no vector is invalid (it could
    only pass by checking nothing), and so is a repeated id."""
    kind, vectors = document.get("kind"), document.get("vectors")
    if not isinstance(kind, str):
        return ["kind: missing or not a string"]
    if not isinstance(vectors, list) or not vectors:
        return [f"vectors: {'an empty list' if vectors == [] else 'missing or not a list'} (a file must hold "
                "at least one vector)"]
    problems, seen = [], set()
    for index, vector in enumerate(vectors):
        vid = vector.get("id") if isinstance(vector, dict) else None
        where = f"vector {vid}" if isinstance(vid, str) and vid else f"vector #{index} (no id)"
        problem = _vector_problem(kind, vector)
        if problem is None and vid in seen:
            problem = "id: repeated (ids are unique within a file)"
        if problem:
            problems.append(f"{where}: {problem}")
        seen.add(vid)
    return problems


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


def _plain(x) -> str:
    """A number as Python writes a float (``0.0``, ``-1.5e-19``, ``nan``), whatever its type."""
    return repr(float(x))


def _shape(x: np.ndarray) -> str:
    return "[" + ", ".join(str(int(n)) for n in x.shape) + "]"


def _leaf_index(rows, k: int) -> str:
    """``[i][t]`` of the ``k``-th number of the nested lists ``rows`` (``""`` for a scalar)."""
    if not isinstance(rows, list):
        return ""
    for i, row in enumerate(rows):
        size = len(_flatten(row)) if isinstance(row, list) else 1
        if k < size:
            return f"[{i}]" + _leaf_index(row, k)
        k -= size
    raise IndexError(k)


def _mismatch(name: str, rows, got: np.ndarray, want: np.ndarray, tol: np.ndarray, k: int) -> str:
    return (
        f"{name}{_leaf_index(rows, k)}: got {_plain(got[k])}, expected {_plain(want[k])} "
        f"(difference {abs(float(got[k]) - float(want[k])):.3g}, tolerance {float(tol[k]):.3g})"
    )


def _compare(name: str, got, want_rows, scale: float, dtype: str, other_rows=None) -> str | None:
    """None when ``got`` matches (elementwise either ``want`` or ``other``), else a message."""
    want = np.array(_flatten(want_rows), dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return f"{name}: {got.size} numbers, expected {want.size}"
    rtol, atol, floor = TOLERANCES[np.dtype(dtype).name]
    tol = rtol * np.abs(want) + atol * scale + floor
    ok = np.abs(got - want) <= tol
    if other_rows is not None:
        other = np.array(_flatten(other_rows), dtype=np.float64)
        ok |= np.abs(got - other) <= rtol * np.abs(other) + atol * scale + floor
    if ok.all():
        return None
    return _mismatch(name, want_rows, got, want, tol, int(np.argmin(ok)))


def _flatten(rows) -> list[float]:
    if not isinstance(rows, list):
        return [float(rows)]
    out: list[float] = []
    for row in rows:
        out += _flatten(row)
    return out


# --------------------------------------------------------------------------------------------- families
#
# Each family is a pair: ``arguments(vector, dtype) -> (args, kwargs)``, the call the implementation
# receives, and ``compare(out, vector, dtype, args) -> message or None`` for valid / acceptable
# vectors. The consumer builds the arguments before the call, so an exception the implementation
# raises is always its own.


def _results(*keys: str) -> Callable:
    """The comparison of a function that returns ``keys`` (one result, or a tuple of them), each
    against ``expected[key]`` on the vector's ``abs_scale``."""

    def compare(out, vector, dtype, args):
        e = vector["expected"]
        scale = float(e["abs_scale"])
        for key, got in zip(keys, (out,) if len(keys) == 1 else tuple(out), strict=True):
            message = _compare(key, got, e[key], scale, dtype)
            if message:
                return message
        return None

    return compare


def _policy_arguments(vector: dict, dtype, kind: str):
    inputs = vector["inputs"]
    fill = _PADDING if inputs.get("padding_value") is None else float(inputs["padding_value"])
    logp, mask = _padded(inputs["logp"], dtype, fill)
    old, _ = _padded(inputs["old_logp"], dtype, fill)
    adv = _array(inputs["advantages"], dtype)
    ref = None if inputs["ref_logp"] is None else _padded(inputs["ref_logp"], dtype, fill)[0]
    args = (logp, old, adv, mask, dict(vector["variant"]))
    if kind == "policy_loss":
        normalizer = None if inputs["normalizer"] is None else float(inputs["normalizer"])
        return args, {"ref_logp": ref, "normalizer": normalizer}
    return (*args, vector["convention"], dict(vector["convention_flags"])), {"ref_logp": ref}


def _policy_compare(out, vector, dtype, args):
    loss, grad = out
    mask = args[3]
    grad = np.asarray(grad, dtype=np.float64)
    if grad.shape != mask.shape:
        return f"grad_logp: shape {_shape(grad)}, expected {_shape(mask)}"
    if np.any(grad[~mask] != 0):
        return "grad_logp is not 0 at padded positions"
    expected = vector["expected"]
    scale = float(expected["abs_scale"])
    return _compare("loss", loss, expected["loss"], scale, dtype) or _compare(
        "grad_logp", grad[mask], expected["grad_logp"], scale, dtype, expected.get("grad_logp_other_side")
    )


def _kl_arguments(vector, dtype):
    inputs = vector["inputs"]
    return (vector["estimator"], _array([inputs["logp"]], dtype), _array([inputs["ref_logp"]], dtype)), {}


def _advantage_arguments(vector, dtype):
    inputs = vector["inputs"]
    args = (_array(inputs["rewards"], dtype), np.array(inputs["group_ids"], dtype=np.int64))
    return args, dict(vector["arguments"])


def _logprob_arguments(vector, dtype):
    rows = vector["inputs"]["logits"]
    logits = _grid(rows, dtype) if rows else np.zeros((0, 0), dtype)
    return (logits, np.array(vector["inputs"]["tokens"], np.int64)), {}


def _returns_arguments(vector, dtype):
    inputs, arguments = vector["inputs"], vector["arguments"]
    r = _grid(inputs["rewards"], dtype)
    v = None if inputs["values"] is None else _grid(inputs["values"], dtype)
    nv = None if inputs["next_values"] is None else _grid(inputs["next_values"], dtype)
    term = np.array(inputs["terminated"], dtype=bool)
    trunc = np.array(inputs["truncated"], dtype=bool)
    g = arguments["gamma"]
    args = {
        "discounted_returns": lambda: (r, term, trunc, g, nv),
        "n_step_returns": lambda: (r, nv, term, trunc, g, arguments.get("n")),
        "td_errors": lambda: (r, v, nv, term, g),
        "lambda_returns": lambda: (r, nv, term, trunc, g, arguments.get("lam")),
        "gae_advantages": lambda: (r, v, nv, term, trunc, g, arguments.get("lam")),
    }[vector["estimator"]]()
    return args, {}


def _returns_compare(out, vector, dtype, args):
    keys = {"gae_advantages": ("advantages", "returns"), "td_errors": ("td_errors",)}
    keys = keys.get(vector["estimator"], ("returns",))
    return _results(*keys)(out, vector, dtype, args)


def _importance_arguments(vector, dtype):
    inputs, estimator = vector["inputs"], vector["estimator"]
    if estimator in ("is_estimate", "snis_estimate"):
        return (_array(inputs["f"], dtype), _array(inputs["weights"], dtype)), {}
    t, b = _grid(inputs["target_logp"], dtype), _grid(inputs["behavior_logp"], dtype)
    if estimator == "importance_weights":
        return (t, b), {}
    mask = np.array(inputs["mask"], dtype=bool)
    if estimator == "trajectory_importance_weights":
        return (t, b, mask), {}
    return (_grid(inputs["rewards"], dtype), t, b, mask, vector["arguments"]["gamma"]), {}


def _importance_compare(out, vector, dtype, args):
    key = next(k for k in ("weights", "estimate", "estimates") if k in vector["expected"])
    return _results(key)(out, vector, dtype, args)


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


def _tabular_arguments(vector, dtype):
    inputs = vector["inputs"]
    args = [_nested(inputs["P"]), _nested(inputs["R"]), _rational(inputs["gamma"]), _nested(inputs["rho0"]),
            np.array(inputs["terminal"], dtype=bool)]
    args += [_nested(inputs[k]) for k in ("pi", "pi_new") if k in inputs]
    return tuple(args), {}


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
    (P, R, gamma, _, terminal, *policies), _ = _tabular_arguments(vector, np.float64)
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


def _tabular_compare(out, vector, dtype, args):
    quantity, e = vector["quantity"], vector["expected"]
    if quantity == "performance_difference":
        if not isinstance(out, dict):
            return f"expected a dict with keys {', '.join(_PDL_KEYS)}, got {type(out).__name__}"
        got = {key: out.get(key) for key in _PDL_KEYS}
    else:
        keys = _TABULAR_KEYS[quantity]
        out = (out,) if len(keys) == 1 else tuple(out)
        if len(out) != len(keys):
            return f"expected {len(keys)} results ({', '.join(keys)}), got {len(out)}"
        got = dict(zip(keys, out, strict=True))
    if quantity == "optimal":
        chosen = np.asarray(got.pop("pi_star")).reshape(-1)
        if chosen.shape != (len(e["optimal_actions"]),):
            return f"pi_star: {chosen.size} actions, expected {len(e['optimal_actions'])}"
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
            return f"{key}: {value.size} numbers, expected {want.size}"
        bad = ~(np.abs(value - want) <= tol[key])
        if bad.any():
            return _mismatch(key, e[key], value, want, np.full(want.shape, tol[key]), int(np.argmax(bad)))
    return None


_FAMILIES: dict[str, tuple[Callable, Callable]] = {
    "policy_loss": (lambda v, d: _policy_arguments(v, d, "policy_loss"), _policy_compare),
    "policy_loss_conventions": (
        lambda v, d: _policy_arguments(v, d, "policy_loss_conventions"),
        _policy_compare,
    ),
    "kl": (_kl_arguments, _results("value", "d_value_d_logp")),
    "advantages": (_advantage_arguments, _results("advantages")),
    "logprobs": (_logprob_arguments, _results("logp", "grad_logits")),
    "returns": (_returns_arguments, _returns_compare),
    "importance": (_importance_arguments, _importance_compare),
    "tabular": (_tabular_arguments, _tabular_compare),
}


def _function(kind: str, vector: dict) -> str:
    """The implementation function a vector of ``kind`` calls."""
    if kind in ("returns", "importance"):
        return vector["estimator"]
    if kind == "tabular":
        return "tabular_" + vector["quantity"]
    return {"advantages": "group_advantages", "logprobs": "token_logprobs"}.get(kind, kind)


# ------------------------------------------------------------------------------------------- selection


def selects(selector: str, kind: str, vector: dict) -> bool:
    """Whether ``--only SELECTOR`` selects the vector: a word names a file kind (``kl``,
    ``returns``), a function (``gae_advantages``, ``tabular_values``), a preset (``dapo``), a
    convention (``verl``), an estimator (``k3``) or a case class (``extreme_log_ratio``); a selector with a
    ``/`` is a vector id or an id prefix ending at a ``/`` (``policy_loss/dapo``,
    ``kl/k3/11``); one with ``*`` or ``?`` matches ids as a shell pattern (``policy_loss/*/dapo/*``)."""
    vid = vector["id"]
    if any(c in selector for c in "*?["):
        return fnmatch.fnmatchcase(vid, selector)
    if "/" in selector:
        return vid == selector or vid.startswith(selector.rstrip("/") + "/")
    words = {kind, _function(kind, vector)}
    words |= {vector.get(k) for k in ("preset", "convention", "estimator", "case_class")}
    return selector in words


def _selected(only: Iterable[str] | None, kind: str, vector: dict) -> bool:
    return only is None or any(selects(s, kind, vector) for s in only)


# ------------------------------------------------------------------------------------------- checking


class _Unsupported(str):
    """The message of a vector whose function raised NotImplementedError under --skip-unsupported."""


def _check_vector(
    fn: Callable, arguments: Callable, compare: Callable, vector: dict, dtype, skip_unsupported: bool = False
) -> str | None:
    """None when the vector passes, else the failure's message (an ``_Unsupported`` one when the
    function raised NotImplementedError and ``skip_unsupported`` is set)."""
    args, kwargs = arguments(vector, dtype)
    invalid = vector["result"] == "invalid"
    try:
        with np.errstate(all="ignore"):
            out = fn(*args, **kwargs)
    except REJECTION as exc:
        return None if invalid else f"raised {type(exc).__name__}: {exc}"
    except NotImplementedError as exc:
        what = f"raised NotImplementedError: {exc}" if str(exc) else "raised NotImplementedError"
        if skip_unsupported:
            return _Unsupported(what)
        return f"{what}, not ValueError ({vector['reason']})" if invalid else what
    except Exception as exc:  # noqa: BLE001 (the implementation's failure is reported, not raised)
        what = f"raised {type(exc).__name__}: {exc}"
        return f"{what}, not ValueError ({vector['reason']})" if invalid else what
    if invalid:
        return f"accepted invalid input ({vector['reason']})"
    with np.errstate(all="ignore"):
        try:
            return compare(out, vector, dtype, args)
        except (TypeError, ValueError, IndexError) as exc:  # e.g. a result of the wrong structure
            return f"returned a result the consumer cannot read ({type(exc).__name__}: {exc})"


def check_document(
    document: dict,
    implementation: dict[str, Callable],
    dtype: str = "float64",
    only: Iterable[str] | None = None,
    skip_unsupported: bool = False,
) -> Report:
    """Check every vector of a loaded file (those that ``only``'s selectors select, when given)
    against the implementation's functions. A document that breaks the schema raises SchemaError
    (``validate``) before any vector runs. ``skip_unsupported``: a function that raises
    NotImplementedError on a vector (a variant it does not implement) skips that vector, counted in
    ``Report.unsupported``, instead of failing it."""
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype must be one of {tuple(TOLERANCES)}, got {dtype!r}")
    problems = validate(document)
    if problems:
        raise SchemaError(problems[0])
    only = None if only is None else list(only)
    report = Report()
    kind = document["kind"]
    vectors = [v for v in document["vectors"] if _selected(only, kind, v)]
    if kind not in _FAMILIES:
        report.skipped += len(vectors)  # a kind this consumer does not know
        return report
    arguments, compare = _FAMILIES[kind]
    np_dtype = np.dtype(dtype)
    for vector in vectors:
        fn = implementation.get(_function(kind, vector))
        flags = tuple(vector["flags"])
        inexact = dtype != "float64" and (
            kind == "tabular" or FLOAT32_SKIP & set(flags) or not _exact_in(vector["inputs"], dtype)
        )
        if fn is None or inexact:
            report.skipped += 1
            continue
        message = _check_vector(fn, arguments, compare, vector, np_dtype, skip_unsupported)
        if isinstance(message, _Unsupported):
            report.unsupported.append(Failure(vector["id"], flags, str(message)))
            continue
        report.checked += 1
        if message:
            report.failures.append(Failure(vector["id"], flags, message))
    return report


def check_file(
    path: str | Path, implementation: dict[str, Callable], dtype: str = "float64", only=None,
    skip_unsupported: bool = False,
) -> Report:
    """Every vector of one file (``load``: a file that breaks the schema raises SchemaError)."""
    return check_document(load(path), implementation, dtype, only, skip_unsupported)


def _files(path: str | Path) -> list[Path]:
    path = Path(path)
    return sorted(path.glob("*.json")) if path.is_dir() else [path]


def check_directory(
    directory: str | Path, implementation: dict[str, Callable], dtype: str = "float64", only=None,
    skip_unsupported: bool = False,
) -> Report:
    """Every ``*.json`` vector file of a directory; a file that breaks the schema is one line of
    ``Report.invalid_files`` (and ``report.ok`` is False), the other files are still checked."""
    report = Report()
    documents = []
    for path in _files(directory):
        try:
            documents.append(load(path))
        except SchemaError as exc:
            report.invalid_files.append(str(exc))
    for document in documents:
        report.merge(check_document(document, implementation, dtype, only, skip_unsupported))
    return report


# ------------------------------------------------------------------------------------------ command line


def _load_module(name: str):
    """``name`` imported from the current directory, or a ``.py`` file loaded from its path."""
    path = Path(name)
    if path.suffix == ".py":
        if not path.is_file():
            raise ImportError(f"no file {name}")
        _importable(path.resolve().parent)  # its own sibling imports
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import would (dataclasses, pickle look it up)
        spec.loader.exec_module(module)
        return module
    _importable(Path.cwd())
    return importlib.import_module(name)


def _importable(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


_EPILOG = """\
selectors (--only, repeatable or comma-separated; a vector is checked when any selects it):
  a word            a file kind (kl, returns, tabular...), a function (gae_advantages), a preset
                    (dapo), a convention (verl), an estimator (k3) or a case class (extreme_log_ratio)
  a/b               a vector id, or every id under that prefix (policy_loss/dapo, kl/k3/11)
  a/*/b             ids matching a shell pattern (policy_loss/*/dapo/*)

functions MODULE may define (a missing one skips its vectors; arrays are numpy arrays of the
compute dtype, per-token ones [N, T] padded, with the bool mask marking real tokens):
{functions}

invalid vectors pass only when the call raises ValueError (a subclass counts);
NotImplementedError or any other exception fails them (specs/vectors/SCHEMA.md).

--skip-unsupported: a function that raises NotImplementedError on a vector (a variant it does not
implement) skips it, counted and listed as unsupported; without it that vector fails.

Every file is checked against the schema (specs/vectors/SCHEMA.md) before any vector runs: a file
that breaks it (not JSON, truncated, another schema version, a vector without id, result, inputs,
flags or an expected value, a non-numeric number, no vectors) is one line naming the file, the
vector and the field, and none of its vectors run; the other files are still checked.

exit status: 0 every checked vector passes, 1 one fails, 2 a usage error (an unknown option, a
module that cannot be imported or defines none of the functions, a selector that selects nothing)
or no vector checked, 3 a vector file is invalid (before 1: the run did not check what it was
asked to)."""


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG.format(
        functions="\n".join(
            textwrap.fill(name + signature, 96, initial_indent="  ", subsequent_indent="      ")
            for name, signature in SIGNATURES.items()
        )
    )
    parser.add_argument(
        "vectors",
        nargs="?",
        type=Path,
        default=DEFAULT_VECTORS,
        metavar="VECTORS",
        help=f"a vector directory or one vector file (default: {DEFAULT_VECTORS})",
    )
    parser.add_argument(
        "module",
        metavar="MODULE",
        help="the implementation: a module importable from the current directory, or a .py file",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="SELECTOR",
        help="check only the vectors a selector selects (below)",
    )
    parser.add_argument(
        "--dtype",
        default="float64",
        choices=tuple(TOLERANCES),
        help="the dtype MODULE computes in: its tolerance (SCHEMA.md); float32 skips the vectors "
        "whose inputs float32 cannot hold, and the tabular ones (default float64)",
    )
    parser.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="a function raising NotImplementedError on a vector skips it (counted and listed as "
        "unsupported) instead of failing it",
    )
    parser.set_defaults(func=_run)
    return parser


_DESCRIPTION = """\
Check MODULE's functions (numpy arrays in, numpy arrays out) against the golden vectors: every
selected vector of every file, valid ones compared within the dtype's tolerance, invalid ones
expected to raise ValueError."""


def _run(args: argparse.Namespace) -> int:
    only = None if args.only is None else [s for text in args.only for s in text.split(",") if s]
    report, documents = Report(), []
    try:
        files = _files(args.vectors)
        if not files or not any(p.is_file() for p in files):
            raise OSError(f"no vector files at {args.vectors}")
        for path in files:  # every file against the schema before any vector runs
            try:
                documents.append(load(path))
            except SchemaError as exc:
                report.invalid_files.append(str(exc))
        if only is not None and not report.invalid_files:
            unmatched = [
                s for s in only if not any(selects(s, d["kind"], v) for d in documents for v in d["vectors"])
            ]
            if unmatched:
                raise ValueError(f"--only {unmatched[0]} selects no vector (see --help for selectors)")
        module = _load_module(args.module)
    except (ImportError, OSError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 (the module raised while importing: one line, not a traceback)
        print(f"error: importing {args.module} raised {type(exc).__name__}: {' '.join(str(exc).split())}",
              file=sys.stderr)
        return 2
    implementation = {name: getattr(module, name) for name in FUNCTIONS if hasattr(module, name)}
    if not implementation:
        print(f"error: {args.module} defines none of the functions {', '.join(FUNCTIONS)}", file=sys.stderr)
        return 2
    for document in documents:
        report.merge(check_document(document, implementation, args.dtype, only, args.skip_unsupported))
    print(report.summary())
    if report.invalid_files:
        print(f"error: {len(report.invalid_files)} invalid vector file(s), listed above: none of their "
              "vectors ran", file=sys.stderr)
        return 3
    if report.checked == 0:
        print("error: no vector checked (every selected vector's function is missing, skipped or "
              "unsupported)", file=sys.stderr)
        return 2
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add the ``vectors`` subcommand (the ``refimpl.commands`` entry-point protocol of refimpl/cli.py)."""
    _configure(
        subparsers.add_parser(
            "vectors", help="check numpy functions against the golden vectors", description=_DESCRIPTION
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = _configure(argparse.ArgumentParser(description=_DESCRIPTION))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""``refimpl matrix``: write the conformance matrix, or ``--check`` it against the committed one.

What ``--check`` compares (docs/conformance.md, section 7): everything the kit decides (frameworks,
versions, source hashes, modes, profiles, verdicts per case class, departures, their explanations,
case ids and inputs, expected values, findings, notes) exactly, with decimals rounded to 10
significant digits (``matrix.normalised``: the kit's expected values are float64, whose last digits
depend on the CPU's vectorised kernels); and the values the *frameworks* return (a departure's
``got``, the ``got_loss`` of its case line) within ``measured_tolerance``: a framework computes in
float32 or half precision, so its digits past the dtype's unit roundoff depend on the CPU's
``exp`` / ``log`` kernels and summation order (AVX-512, AVX2 and ATen's scalar kernels differ from
the 7th significant digit in float32). A departure explained by ``compute_dtype`` (the framework's
rounding) may show on another smallest case on another CPU: its class and explanation are compared,
not the case it is shown on (``_rounding_departure``). A matrix generated on one machine therefore
checks on another. The Markdown is a rendering of the JSON: with ``--json`` the committed Markdown must be
exactly ``matrix_markdown`` of the committed JSON; without it, the Markdown is compared with the
measured values masked.

Writing never replaces a matrix with a poorer one: when a framework in scope is not installed, or
the file at ``--out`` lists an installed framework this run does not measure (``--framework``), it
refuses in one line (exit 2) unless ``--partial`` asks for exactly what was measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from .cli_args import REQUIRE_FRAMEWORKS_ENV, UserError, one_line
from .matrix import build_matrix, matrix_markdown, normalised

__all__ = ["MEASURED_ULPS", "UNIT_ROUNDOFF", "compare_matrices", "measured_tolerance", "run_matrix"]

#: unit roundoff of each dtype a case can hold (2^-p, p the significand's bits with the hidden one)
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}

#: how many units of roundoff, relative to max(|a|, |b|, 1), two machines' measured values may differ
#: by: the kit's cases pass through at most 8 rounded elementwise operations per term (the
#: half-precision bound's K, docs/conformance.md section 4) and sums of at most 64 terms, each
#: kernel within a few ulps of the correctly rounded result; 64 ulps covers that with the kit's
#: cases of order 1 (advantages and log-probabilities) and is still 2^-18 in float32.
MEASURED_ULPS = 64

_GOT_LOSS = re.compile(r"(; got_loss = )(\S+)$")
_GOT_TEXT = re.compile(r"(got )(-?(?:\d+\.\d+(?:e[-+]?\d+)?|\d+|nan|inf|n/a))")


def measured_tolerance(dtype: str) -> float:
    """The relative tolerance of a framework's value on a case of ``dtype``: ``MEASURED_ULPS`` units
    of the roundoff of ``dtype``, but never finer than float32's (a framework may compute a float64
    case in float32: ``compute_dtype='float32'`` profiles)."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {sorted(UNIT_ROUNDOFF)}, got {dtype!r}")
    return MEASURED_ULPS * max(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"])


def _agree(a, b, dtype: str) -> bool:
    """Two measured values of one case equal within ``measured_tolerance(dtype)`` (NaN equals NaN,
    an infinity only itself, None only None)."""
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= measured_tolerance(dtype) * max(abs(a), abs(b), 1.0)


def _split_case(case: str) -> tuple[str, str | None]:
    """A departure's case line without its ``got_loss`` (the framework's value), and that value."""
    match = _GOT_LOSS.search(case)
    return (case, None) if match is None else (case[: match.start(2)], match.group(2))


def _rounding_departure(old: dict, new: dict) -> bool:
    """Both departures are the rounding of a lower compute dtype (``compute_dtype=...``: a framework
    computing in float32 against the float64 reference) shown on different cases: which cases of a
    class fail the reference by rounding alone, and so which is the smallest, depends on the CPU's
    kernels, while the class and its explanation do not."""
    return (old.get("case_id") != new.get("case_id") and old.get("explanation") == new.get("explanation")
            and "compute_dtype=" in str(new.get("explanation")))


def _departure_differences(where: str, old: dict, new: dict) -> list[str]:
    if _rounding_departure(old, new):
        return []
    dtype = new.get("dtype") or old.get("dtype") or "float64"
    out = []
    keys = (set(old) | set(new)) - {"got", "case"}
    if normalised({k: old.get(k) for k in keys}) != normalised({k: new.get(k) for k in keys}):
        changed = sorted(k for k in keys if normalised(old.get(k)) != normalised(new.get(k)))
        out.append(f"{where}: {', '.join(changed)} changed")
    if not _agree(old.get("got"), new.get("got"), dtype):
        out.append(f"{where}: got {old.get('got')} -> {new.get('got')} "
                   f"(beyond {measured_tolerance(dtype):.1e} relative for {dtype})")
    old_case, old_got = _split_case(old.get("case", ""))
    new_case, new_got = _split_case(new.get("case", ""))
    if normalised(old_case) != normalised(new_case):
        out.append(f"{where}: case inputs changed")
    elif (old_got is None) != (new_got is None) or (
        old_got is not None and not _agree(_value(old_got), _value(new_got), dtype)
    ):
        out.append(f"{where}: got_loss {old_got} -> {new_got}")
    return out


def _value(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _mode_key(m: dict) -> tuple[str, str]:
    return m.get("kind", ""), m.get("mode", "")


def compare_matrices(committed: dict, fresh: dict) -> list[str]:
    """Every difference between two matrices' data (``build_matrix``) as one line each, comparing
    measured values within ``measured_tolerance`` and everything else exactly (module docstring)."""
    out = []
    old_fws = {f.get("framework"): f for f in committed.get("frameworks", [])}
    new_fws = {f.get("framework"): f for f in fresh.get("frameworks", [])}
    if list(old_fws) != list(new_fws):
        out.append(f"frameworks: {list(old_fws)} -> {list(new_fws)}")
    for name in old_fws.keys() & new_fws.keys():
        old, new = old_fws[name], new_fws[name]
        rest = (set(old) | set(new)) - {"modes"}
        for key in sorted(k for k in rest if normalised(old.get(k)) != normalised(new.get(k))):
            out.append(f"{name}: {key} changed")
        old_modes = {_mode_key(m): m for m in old.get("modes", [])}
        new_modes = {_mode_key(m): m for m in new.get("modes", [])}
        if list(old_modes) != list(new_modes):
            gone, added = old_modes.keys() - new_modes.keys(), new_modes.keys() - old_modes.keys()
            out.append(f"{name}: modes changed (removed {sorted(gone)}, added {sorted(added)}, or reordered)")
        for key in old_modes.keys() & new_modes.keys():
            out += _mode_differences(f"{name} {key[0]} {key[1]}", old_modes[key], new_modes[key])
    if normalised(committed.get("summary")) != normalised(fresh.get("summary")):
        out.append("summary changed")
    return out


def _mode_differences(where: str, old: dict, new: dict) -> list[str]:
    out = []
    for key in sorted((set(old) | set(new)) - {"reference"}):
        if normalised(old.get(key)) != normalised(new.get(key)):
            out.append(f"{where}: {key} changed")
    old_ref, new_ref = old.get("reference") or {}, new.get("reference") or {}
    if old_ref.get("ok") != new_ref.get("ok"):
        out.append(f"{where}: reference verdict changed")
    if old_ref.get("notes") != new_ref.get("notes"):
        out.append(f"{where}: reference notes changed")
    old_deps, new_deps = old_ref.get("departures", []), new_ref.get("departures", [])
    if [d.get("case_class") for d in old_deps] != [d.get("case_class") for d in new_deps]:
        out.append(f"{where}: departures {[d.get('case_class') for d in old_deps]} -> "
                   f"{[d.get('case_class') for d in new_deps]}")
        return out
    for old_d, new_d in zip(old_deps, new_deps, strict=True):
        out += _departure_differences(f"{where} departure {new_d.get('case_class')}", old_d, new_d)
    return out


def masked_markdown(text: str) -> str:
    """The Markdown with every measured value (``got X``) masked and decimals normalised: what a
    Markdown-only ``--check`` compares."""
    return normalised(_GOT_TEXT.sub(r"\1<measured>", text))


# ------------------------------------------------------------------------------------------------
# the command


_SUMMARY_ROW = re.compile(r"^\| \[(\w+)\]\(#\w+\) \| ([^|]+?) \|", re.M)


def installed_in(markdown: str) -> set[str]:
    """The frameworks a matrix's Markdown lists as installed (its summary rows with a version)."""
    return {name for name, version in _SUMMARY_ROW.findall(markdown) if version.strip() != "not installed"}


def _poorer(matrix: dict, out: str) -> str | None:
    """Why writing ``matrix`` to ``out`` would lose something (None when it would not)."""
    missing = [f["framework"] for f in matrix["frameworks"] if not f["available"]]
    if missing:
        return f"not installed: {', '.join(missing)} (refimpl frameworks install)"
    try:
        with open(out) as handle:
            existing = installed_in(handle.read())
    except OSError:
        return None
    lost = sorted(existing - {f["framework"] for f in matrix["frameworks"] if f["available"]})
    return f"{out} holds {', '.join(lost)}, which this run does not measure" if lost else None


def restricted(matrix: dict, names: set[str]) -> dict:
    """``matrix`` (``build_matrix``'s data) with only frameworks ``names``: their rows, and in the
    summary the entries of lists keyed by ``framework`` and of the per-framework counts (a count left
    with no framework is dropped, as ``build_matrix`` never writes one)."""
    every = {f["framework"] for f in matrix.get("frameworks", [])}

    def keep(value):
        if isinstance(value, list):
            return [keep(v) for v in value
                    if not (isinstance(v, dict) and v.get("framework") in every - names)]
        if isinstance(value, dict) and value and set(value) <= every:
            return {k: keep(v) for k, v in value.items() if k in names}
        if isinstance(value, dict):
            kept = {k: keep(v) for k, v in value.items()}
            return {k: v for k, v in kept.items() if v != {} or value[k] == {}}
        return value

    return keep(matrix)


def _check(args: argparse.Namespace, matrix: dict, text: str) -> int:
    regenerate = f"refimpl matrix --out {args.out}" + (f" --json {args.json}" if args.json else "")
    try:
        with open(args.out) as handle:
            committed = handle.read()
        committed_json = None
        if args.json:
            with open(args.json) as handle:
                committed_json = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"refimpl matrix: cannot read the committed matrix: {one_line(exc)}", file=sys.stderr)
        return 2
    not_named: list[str] = []
    if committed_json is not None:
        # `--framework A --framework B` checks those frameworks' rows of a matrix that holds more
        measured = {f["framework"] for f in matrix["frameworks"]}
        not_named = [f.get("framework") for f in committed_json.get("frameworks", [])
                     if f.get("framework") not in measured]
        compared = restricted(committed_json, measured) if args.framework and not_named else committed_json
        if not args.framework:
            not_named = []
        differences = compare_matrices(compared, json.loads(json.dumps(matrix)))
        if normalised(committed) != normalised(matrix_markdown(committed_json)):
            differences.append(f"{args.out} is not the rendering of {args.json}")
    else:
        differences = [] if masked_markdown(committed) == masked_markdown(text) else [f"{args.out} differs"]
    if differences:
        more = f"; and {len(differences) - 5} more" if len(differences) > 5 else ""
        shown = "; ".join(differences[:5]) + more
        print(f"refimpl matrix: out of date ({shown}); regenerate: {regenerate}", file=sys.stderr)
        return 1
    unchecked = f" (not checked, not named: {', '.join(not_named)})" if not_named else ""
    print(f"{' and '.join([args.out] + ([args.json] if args.json else []))} up to date{unchecked}")
    return 0


def run_matrix(args: argparse.Namespace) -> int:
    """The ``func`` of the ``matrix`` subcommand."""
    try:
        matrix = build_matrix(args.framework or None)
    except (UserError, ValueError) as exc:
        print(f"refimpl matrix: {exc}", file=sys.stderr)
        return 2
    missing = [f["framework"] for f in matrix["frameworks"] if not f["available"]]
    if missing and os.environ.get(REQUIRE_FRAMEWORKS_ENV) == "1":
        print(f"refimpl matrix: required frameworks not installed: {', '.join(missing)}", file=sys.stderr)
        return 1
    text = matrix_markdown(matrix)
    if args.check:
        if missing:
            print(f"refimpl matrix: cannot check, not installed: {', '.join(missing)} (refimpl frameworks "
                  "install)", file=sys.stderr)
            return 2
        if not args.out:
            print("refimpl matrix: --check needs --out (the committed matrix to compare)", file=sys.stderr)
            return 2
        return _check(args, matrix, text)
    if args.out and not args.partial:
        why = _poorer(matrix, args.out)
        if why is not None:
            print(f"refimpl matrix: not writing {args.out}: {why}; --partial writes what was measured",
                  file=sys.stderr)
            return 2
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    else:
        print(text)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(matrix, handle, indent=1)
            handle.write("\n")
    return 0

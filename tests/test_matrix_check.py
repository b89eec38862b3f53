"""``refimpl matrix --check`` compares what the kit decides exactly and what a framework measured within
a tolerance derived from the case's dtype (so a matrix generated on an AVX-512 CPU checks on an AVX2
one and back), and ``refimpl matrix --out`` never replaces a matrix with a poorer one
(refimpl/conformance/matrix_check.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from refimpl.conformance.cli import main
from refimpl.conformance.cli_args import REQUIRE_FRAMEWORKS_ENV
from refimpl.conformance.matrix import matrix_markdown
from refimpl.conformance.matrix_check import (
    MEASURED_ULPS,
    UNIT_ROUNDOFF,
    compare_matrices,
    installed_in,
    masked_markdown,
    measured_tolerance,
    restricted,
)
from tests import fake_framework

U32 = 2.0**-24


def departure(got: float, dtype: str = "float64", expected: float = 0.5) -> dict:
    return {"case_class": "outside_clip", "case_id": "outside_clip/0",
            "explanation": "flag compute_dtype='float32'", "expected": expected, "got": got, "dtype": dtype,
            "case": f"logp = torch.tensor([0.25]); expected_loss = {expected!r}; got_loss = {got!r}"}


def matrix_of(*departures: dict) -> dict:
    mode = {"kind": "policy_loss", "mode": "grpo", "preset": "grpo", "description": "d", "profile": {},
            "framework_config": {}, "own": {"ok": True, "classes": {"outside_clip": "ok"}},
            "reference": {"ok": not departures, "departures": list(departures)}}
    framework = {"framework": "trl", "available": True, "pinned_version": "1.0.0", "version": "1.0.0",
                 "source_hash": "abc", "modes": [mode], "unsupported": []}
    return {"frameworks": [framework], "summary": {"frameworks": [{"framework": "trl"}]}}


def moved(got: float, dtype: str, factor: float) -> float:
    """``got`` moved towards 0 by ``factor`` times the tolerance of ``dtype`` relative to max(|got|, 1),
    the larger magnitude of the two values (or 1), which the comparison scales by."""
    return got - math.copysign(factor * measured_tolerance(dtype) * max(abs(got), 1.0), got)


def test_the_tolerance_is_the_dtypes_roundoff_never_finer_than_float32():
    assert measured_tolerance("float32") == MEASURED_ULPS * U32
    assert measured_tolerance("float64") == MEASURED_ULPS * U32  # a float64 case may be computed in float32
    assert measured_tolerance("bfloat16") == MEASURED_ULPS * 2.0**-8
    assert measured_tolerance("float16") == MEASURED_ULPS * 2.0**-11
    assert UNIT_ROUNDOFF["float64"] == 2.0**-53
    with pytest.raises(ValueError, match=r"^dtype: expected one of"):
        measured_tolerance("int64")


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("got", [0.16128294169902802, -3.5, 2.5e10, 1e-9])
def test_a_measured_value_inside_the_tolerance_agrees_and_outside_differs(dtype, got):
    committed = matrix_of(departure(got, dtype))
    assert compare_matrices(committed, copy.deepcopy(committed)) == []
    inside = matrix_of(departure(moved(got, dtype, 0.99), dtype))
    assert compare_matrices(committed, inside) == []
    outside = matrix_of(departure(moved(got, dtype, 1.01), dtype))
    differences = compare_matrices(committed, outside)
    assert len(differences) == 2, differences  # the departure's got and its case line's got_loss
    assert "trl policy_loss grpo departure outside_clip: got" in differences[0]
    assert "got_loss" in differences[1]


def test_the_float32_digits_two_cpus_disagree_on_pass():
    # measured: Liger's grpo inside_clip/0 on AVX-512 vs AVX2 kernels differ from the 8th digit
    committed = matrix_of(departure(0.16128294169902802, "float64"))
    fresh = matrix_of(departure(0.16128295, "float64"))
    assert compare_matrices(committed, fresh) == []


def test_nan_equals_nan_and_an_infinity_only_itself():
    assert compare_matrices(matrix_of(departure(math.nan)), matrix_of(departure(math.nan))) == []
    assert compare_matrices(matrix_of(departure(math.inf)), matrix_of(departure(math.inf))) == []
    assert compare_matrices(matrix_of(departure(math.nan)), matrix_of(departure(0.5)))
    assert compare_matrices(matrix_of(departure(math.inf)), matrix_of(departure(-math.inf)))
    assert compare_matrices(matrix_of(departure(math.inf)), matrix_of(departure(1e300)))


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(explanation="unexplained"),
        lambda d: d.update(case_id="outside_clip/1"),
        lambda d: d.update(expected=0.5 + 1e-9),  # the kit's own float64 value: compared to 10 digits
        lambda d: d.update(case=d["case"].replace("0.25", "0.26")),  # the case's inputs
        lambda d: d.update(case=d["case"].split("; got_loss")[0]),  # the case lost its measured value
    ],
)
def test_what_the_kit_decides_is_compared_exactly(change):
    committed = matrix_of(departure(0.25))
    first = committed["frameworks"][0]["modes"][0]["reference"]["departures"][0]
    first["explanation"] = "flag empty_rows='keep'"
    fresh = copy.deepcopy(committed)
    change(fresh["frameworks"][0]["modes"][0]["reference"]["departures"][0])
    assert compare_matrices(committed, fresh)


def test_verdicts_modes_and_frameworks_are_compared_exactly():
    committed = matrix_of(departure(0.25))
    for edit in (
        lambda m: m["frameworks"][0]["modes"][0]["own"]["classes"].update(outside_clip="FAIL"),
        lambda m: m["frameworks"][0]["modes"][0]["reference"].update(ok=True),
        lambda m: m["frameworks"][0]["modes"][0]["reference"]["departures"].append(departure(0.25)),
        lambda m: m["frameworks"][0]["modes"][0].update(mode="dapo"),
        lambda m: m["frameworks"][0].update(version="1.0.1"),
        lambda m: m["frameworks"].append({"framework": "verl", "available": False}),
        lambda m: m["summary"]["frameworks"].append({"framework": "verl"}),
    ):
        fresh = copy.deepcopy(committed)
        edit(fresh)
        assert compare_matrices(committed, fresh), edit


def test_markdown_only_checks_mask_the_measured_values():
    text = "- `outside_clip`: flag x (case `outside_clip/0`: expected 0.5, got 0.2500001; candidate bug)\n"
    assert masked_markdown(text) == masked_markdown(text.replace("0.2500001", "0.25000013"))
    assert masked_markdown(text) != masked_markdown(text.replace("expected 0.5", "expected 0.6"))
    assert masked_markdown(text) != masked_markdown(text.replace("flag x", "flag z"))
    assert "got <measured>" in masked_markdown(text.replace("0.2500001", "nan"))


def test_installed_in_reads_the_summary_rows():
    text = matrix_markdown({"frameworks": [
        {"framework": "trl", "available": True, "version": "1.0.0", "pinned_version": "1.0.0",
         "source_hash": "a", "modes": [], "unsupported": []},
        {"framework": "verl", "available": False, "reason": "not installed: x", "pinned_version": "0.9.1"},
    ], "summary": {"frameworks": [
        {"framework": "trl", "available": True, "version": "1.0.0", "modes": 0, "pass": 0, "errors": 0,
         "departing": 0, "unexplained": 0, "unsupported": 0, "bugs": 0},
        {"framework": "verl", "available": False}], "departures_by_flag": {}, "findings": []}})
    assert installed_in(text) == {"trl"}


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_matrix_out_refuses_to_write_a_poorer_matrix(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv(REQUIRE_FRAMEWORKS_ENV, raising=False)  # CI requires the real ones: not these fakes
    fake_framework.install(monkeypatch, "trl")
    fake_framework.install(monkeypatch, "verl", available=False)
    out_md, out_json = tmp_path / "m.md", tmp_path / "m.json"
    out_md.write_text("the committed matrix\n")
    code, out, err = run(capsys, "matrix", "--framework", "trl", "--framework", "verl", "--out", str(out_md))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "not installed: verl" in err and "--partial" in err
    assert out_md.read_text() == "the committed matrix\n"  # untouched
    # --check cannot compare what it could not measure: one line, exit 2 (not "out of date")
    code, _, err = run(capsys, "matrix", "--framework", "verl", "--out", str(out_md), "--check")
    assert code == 2 and "cannot check, not installed: verl" in err and err.count("\n") == 1
    # --partial writes what was measured
    code, _, err = run(capsys, "matrix", "--framework", "trl", "--framework", "verl", "--out", str(out_md),
                       "--json", str(out_json), "--partial")
    assert code == 0 and "## verl" in out_md.read_text(), err
    # a run of a subset never replaces a file that holds more installed frameworks
    fake_framework.install(monkeypatch, "verl")
    code, _, _ = run(capsys, "matrix", "--framework", "trl", "--framework", "verl", "--out", str(out_md))
    assert code == 0 and installed_in(out_md.read_text()) == {"trl", "verl"}
    code, _, err = run(capsys, "matrix", "--framework", "trl", "--out", str(out_md))
    assert code == 2 and "holds verl, which this run does not measure" in err, err
    assert installed_in(out_md.read_text()) == {"trl", "verl"}


def test_matrix_check_with_json_tolerates_measured_digits_and_names_the_drift(monkeypatch, capsys, tmp_path):
    fake_framework.install(monkeypatch, "trl")
    out_md, out_json = tmp_path / "m.md", tmp_path / "m.json"
    assert run(capsys, "matrix", "--framework", "trl", "--out", str(out_md), "--json", str(out_json))[0] == 0
    check = ("matrix", "--framework", "trl", "--out", str(out_md), "--json", str(out_json), "--check")
    assert run(capsys, *check)[0] == 0
    data = json.loads(out_json.read_text())
    deps = [d for m in data["frameworks"][0]["modes"] for d in m["reference"]["departures"]
            if isinstance(d["got"], float) and math.isfinite(d["got"])]
    assert deps, "the fake framework has departures with finite measured values"
    # another CPU's last float32 digits: the committed JSON (and its rendering) hold them; still up to date
    for d in deps:
        d["got"] = moved(d["got"], d["dtype"], 0.5)
    out_json.write_text(json.dumps(data))
    out_md.write_text(matrix_markdown(data))
    code, out, err = run(capsys, *check)
    assert code == 0 and "up to date" in out, err
    # a real change of a measured value is drift, named in the one line
    deps[0]["got"] = moved(deps[0]["got"], deps[0]["dtype"], 4.0)
    out_json.write_text(json.dumps(data))
    out_md.write_text(matrix_markdown(data))
    code, _, err = run(capsys, *check)
    assert code == 1 and "out of date" in err and "got" in err and err.count("\n") == 1, err
    # a hand-edited Markdown that is not the rendering of the JSON is drift too
    deps[0]["got"] = moved(deps[0]["got"], deps[0]["dtype"], -4.0)
    out_json.write_text(json.dumps(data))
    out_md.write_text(matrix_markdown(data).replace("pass", "PASS"))
    code, _, err = run(capsys, *check)
    assert code == 1 and "is not the rendering of" in err, err


def test_a_rounding_departure_may_show_on_another_case_on_another_cpu():
    # measured: Liger's gspo extreme_log_ratio under MKL's AVX2 kernels fails the reference first on
    # case 0 (float32 rounding of 271.056...), under AVX-512 on case 1: same class, same explanation
    committed = matrix_of(departure(0.25))
    fresh = copy.deepcopy(committed)
    fresh["frameworks"][0]["modes"][0]["reference"]["departures"][0].update(
        case_id="outside_clip/1", expected=271.05609216840946, got=271.05609130859375,
        case="logp = torch.tensor([0.5]); expected_loss = 271.05609216840946; got_loss = 271.05609130859375")
    assert compare_matrices(committed, fresh) == []
    other_flag = copy.deepcopy(fresh)
    other_flag["frameworks"][0]["modes"][0]["reference"]["departures"][0]["explanation"] = "unexplained"
    assert compare_matrices(committed, other_flag)
    for d in (committed, fresh):  # a departure that is not a compute dtype's rounding keeps its case
        d["frameworks"][0]["modes"][0]["reference"]["departures"][0]["explanation"] = "flag empty_rows='keep'"
    assert compare_matrices(committed, fresh)


def test_restricted_keeps_the_named_frameworks_rows_and_summary_entries():
    """``refimpl matrix --check --framework A`` on a matrix of A and B compares A's part: the rows, the
    summary's lists keyed by framework and its per-framework counts (a count of B alone dropped)."""
    a, b = matrix_of(departure(0.25)), matrix_of()
    b["frameworks"][0]["framework"] = "verl"
    both = {"frameworks": a["frameworks"] + b["frameworks"],
            "summary": {"frameworks": [{"framework": "trl"}, {"framework": "verl"}],
                        "findings": [{"framework": "verl", "key": "k"}, {"framework": "trl", "key": "j"}],
                        "departures_by_flag": {"x": {"trl": 1, "verl": 2}, "y": {"verl": 1}}, "note": "n"}}
    assert restricted(both, {"trl"}) == {
        "frameworks": a["frameworks"],
        "summary": {"frameworks": [{"framework": "trl"}], "findings": [{"framework": "trl", "key": "j"}],
                    "departures_by_flag": {"x": {"trl": 1}}, "note": "n"}}
    assert restricted(both, {"trl", "verl"}) == both
    assert compare_matrices(restricted(both, {"verl"}), both) != []  # the restriction is not the whole


def test_the_rows_follow_one_order_whatever_the_order_of_framework_flags(monkeypatch):
    """`refimpl matrix --check --framework B --framework A` compares as `--framework A --framework B`
    does: the rows come in FRAMEWORKS + EXTRA_FRAMEWORKS order (not the order asked), so the committed
    matrix's order matches either way."""
    from refimpl.conformance import matrix as matrix_module
    from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS

    order = FRAMEWORKS + EXTRA_FRAMEWORKS
    monkeypatch.setattr(matrix_module, "load_driver", lambda name: (_ for _ in ()).throw(ImportError(name)))
    asked = [order[-1], order[0], order[-1]]
    rows = matrix_module.build_matrix(asked)["frameworks"]
    assert [r["framework"] for r in rows] == [order[0], order[-1]]

"""The kit's check loop and its report, pinned (issue 31): ``refimpl.conformance.engine`` (the loop,
the judgements, the case as text and as one line of Python) and ``refimpl.conformance.report`` (rows
per class, the smallest failing case, JSON, the table)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys

import pytest
import torch

from refimpl.conformance import user_code
from refimpl.conformance.case_types import KLCase, PolicyLossCase
from refimpl.conformance.contract import SignatureError
from refimpl.conformance.engine import (
    case_line,
    case_text,
    expected_on,
    judged,
    on_cpu,
    preflight,
    preflight_first,
    raised,
    run_cases,
    run_user,
    to_device,
    value_only,
)
from refimpl.conformance.report import CaseResult, CheckReport, nested_text, tensor_text, what_failed


def kl_case(index=0, logp=(0.5, -1.25)):
    return KLCase("cls", index, torch.tensor([list(logp)], dtype=torch.float64),
                  torch.tensor([[0.25, math.inf]], dtype=torch.float64))


def test_the_loop_judges_each_item_in_order_and_reports_what_raised():
    seen = []

    def call(item):
        if item == 2:
            raise ZeroDivisionError("two")
        return torch.tensor(float(item))

    def judge(item, expected, got, error):
        seen.append((item, expected, None if got is None else float(got), error))
        return item

    outcomes = run_cases([1, 2, 3], expect=lambda i: i * 10, call=call, judge=judge)
    assert [o.result for o in outcomes] == [1, 2, 3]
    assert [(o.item, o.expected, o.error) for o in outcomes][0] == (1, 10, None)
    assert seen[0] == (1, 10, 1.0, None) and seen[2] == (3, 30, 3.0, None)
    assert seen[1][:3] == (2, 20, None) and seen[1][3] == "ZeroDivisionError: two (call)"
    assert outcomes[1].got is None and outcomes[1].error == seen[1][3]


def test_a_signature_error_stops_the_loop():
    def call(item):
        raise SignatureError("wrong signature")

    with pytest.raises(SignatureError, match="^wrong signature$"):
        run_user(lambda: call(1))
    assert run_user(lambda: 5) == (5, None)


def test_items_move_to_the_device_and_back():
    case = kl_case()
    moved = to_device(case, "meta")
    assert moved.logp.device.type == "meta" and moved.case_id == "cls/0"
    pair = to_device((case, torch.ones(2), 3, None), "meta")
    assert pair[1].device.type == "meta" and pair[2:] == (3, None) and pair[0].logp.device.type == "meta"

    class OnDevice:
        def cpu(self):
            return "on the cpu"

    back = on_cpu([OnDevice(), (OnDevice(), 4)])
    assert back == ["on the cpu", ("on the cpu", 4)] and type(back[1]) is tuple
    x = torch.ones(2)
    assert on_cpu(x) is x and on_cpu(7) == 7


def test_preflight_stops_on_an_exception_or_a_wrong_output():
    def fn():
        pass

    prefix = r"^test_preflight_stops_on_an_exception_or_a_wrong_output.<locals>\.fn "
    raising = prefix + "fails on the plainest case with ValueError: bad; expected "
    with pytest.raises(SignatureError, match=raising):
        preflight("kl", fn, lambda: (_ for _ in ()).throw(ValueError("bad")), (2,))
    wrong_shape = prefix + r"returned shape \(3,\), expected a tensor of shape \(2,\): "
    with pytest.raises(SignatureError, match=wrong_shape):
        preflight("kl", fn, lambda: torch.ones(3), (2,))
    with pytest.raises(SignatureError, match=prefix + r"returned list, expected a tensor of shape \(2,\): "):
        preflight("kl", fn, lambda: [1.0, 2.0], (2,))
    preflight("kl", fn, lambda: torch.ones(2), (2,))  # passes


def test_the_case_as_text_and_as_one_line_of_python():
    case = kl_case()
    assert case_text(case, ["extra line"]) == (
        "  logp (float64, shape (1, 2)) = [[0.5, -1.25]]\n"
        "  ref_logp (float64, shape (1, 2)) = [[0.25, inf]]\n"
        "  extra line")
    line = case_line(case, {"expected": 0.5, "name": "x", "bad": -math.inf})
    assert line == ('logp = torch.tensor([[0.5, -1.25]], dtype=torch.float64); '
                    'ref_logp = torch.tensor([[0.25, float("inf")]], dtype=torch.float64); '
                    'expected = 0.5; name = \'x\'; bad = float("-inf")')
    namespace = {"torch": torch}
    exec(line, namespace)
    assert torch.equal(namespace["ref_logp"], case.ref_logp)
    ints = KLCase("c", 1, torch.tensor([1, 2]), torch.tensor([3, 4]))
    assert case_line(ints) == ("logp = torch.tensor([1, 2], dtype=torch.int64); "
                               "ref_logp = torch.tensor([3, 4], dtype=torch.int64)")


def test_the_three_judgements():
    case = kl_case(3)
    ok = judged(case, 1e-9, 2e-8, 1e-8, 1e-8, "d")
    assert (ok.case_id, ok.case_class, ok.size, ok.value_ok, ok.grad_ok, ok.detail) == (
        "cls/3", "cls", 2, True, False, "d")
    assert judged(case, 1e-8, 1e-8, 1e-8, 1e-8, "").ok  # on the bound: inside
    failed = raised(case, "detail", "boom")
    assert (failed.value_error, failed.grad_error, failed.value_ok, failed.grad_ok, failed.error) == (
        math.inf, math.inf, False, False, "boom")
    v = value_only(case, 0.5, True, "det", "err")
    assert (v.value_error, v.grad_error, v.value_ok, v.grad_ok, v.detail, v.error) == (0.5, None, True, None,
                                                                                      "det", "err")
    assert not v.ok and value_only(case, 0.5, True, "det").ok


def result(case_id, cls, size, ok=True, grad_ok=True, **kw):
    return CaseResult(case_id, cls, size, kw.pop("value_error", 0.0 if ok else 1.0),
                      kw.pop("grad_error", 0.5), ok, grad_ok, kw.pop("detail", f"detail of {case_id}"), **kw)


def test_report_rows_failures_and_json():
    results = (
        result("a/0", "a", 4, value_error=1e-9),
        result("b/0", "b", 9, ok=False, value_error=2.0, expected=1.0, got=3.0),
        result("b/1", "b", 5, ok=False, value_error=math.inf, grad_error=math.nan, error="E: x"),
        result("c/0", "c", 1, grad_ok=None, grad_error=None, departure="flag=1"),
        result("m/0", "masked_nonfinite", 1, ok=False, dtype="float64"),
        result("h/0", "h", 1, ok=False, dtype="bfloat16"),
    )
    report = CheckReport("title", results, ("n1",), ("head",))
    assert not report.ok and report.classes() == ["a", "b", "c", "masked_nonfinite", "h"]
    assert report.failing_classes() == ["b", "masked_nonfinite", "h"]
    b = report.case_class("b")
    assert (b.cases, b.value_ok, b.grad_ok, b.departures) == (2, False, False, ())
    assert b.max_value_error == math.inf
    assert b.max_grad_error == 0.5  # max(0.5, nan): the finite one
    c = report.case_class("c")
    assert (c.grad_ok, c.max_grad_error, c.departures, c.ok) == (None, None, ("flag=1",), True)
    with pytest.raises(KeyError, match=r"no case of class 'z' in this report \(classes: a, b, c, "):
        report.case_class("z")
    with pytest.raises(KeyError, match=r"classes: none\)"):
        CheckReport("t", ()).case_class("z")
    # float64 finite first, then the fewest elements: b/1 (size 5) before b/0 (9), masked and bf16 later
    assert report.smallest_failure().case_id == "b/1"
    assert [r.case_id for r in report.departures()] == ["c/0"]
    data = report.to_dict()
    assert data["smallest_failure"] == "b/1" and data["ok"] is False and data["notes"] == ["n1"]
    assert data["header"] == ["head"] and data["title"] == "title"
    assert data["classes"][1] == {"case_class": "b", "cases": 2, "ok": False, "value_ok": False,
                                  "grad_ok": False, "max_value_error": "inf", "max_grad_error": 0.5,
                                  "departures": []}
    assert data["cases"][2]["value_error"] == "inf" and data["cases"][1]["expected"] == 1.0
    assert data["cases"][0]["value_error"] == 1e-9 and data["cases"][3]["grad_error"] is None
    assert CheckReport("t", (result("a/0", "a", 1),)).to_dict()["smallest_failure"] is None
    message = report.failure_message("b")
    assert message.splitlines()[:4] == [
        "b failed: smallest failing case b/1: the function raised E: x", "head", "title",
        "case class b: 2 cases, value FAIL, gradient FAIL, max value err inf, max grad err 5.00e-01 "
        "(errors relative to max|expected| + s)"]
    assert report.failure_message("b").endswith("detail of b/1")
    only_b0 = CheckReport("t", results[1:2])
    first = only_b0.failure_message().splitlines()[0]
    assert first == ("b failed: smallest failing case b/0: value off by 2.00e+00 (relative); the gradient "
                     "is right; loss expected 1.0, got 3.0")
    # the headline names what failed and by how much (issue 27: a gradient 50 % off under equal losses)
    grad_only = CheckReport("t", (result("g/0", "g", 1, grad_ok=False, value_error=1e-17, grad_error=0.5,
                                         expected=0.25, got=0.25),))
    assert grad_only.failure_message().splitlines()[0] == (
        "g failed: smallest failing case g/0: gradient off by 5.00e-01 (relative to its largest entry); "
        "the value is right (1.00e-17); loss expected 0.25, got 0.25")
    assert "smallest failing case: g/0: gradient off by 5.00e-01" in grad_only.render()
    both = dataclasses.replace(grad_only.results[0], value_ok=False, value_error=0.1)
    assert what_failed(both) == "value off by 1.00e-01 and gradient off by 5.00e-01 (relative)"
    assert report.failure_message("a") == "" and report.failure_message("c") == ""


def test_report_table_render_and_long_lines():
    results = (result("a/0", "a", 4, value_error=1.5e-9),
               result("bb/0", "bb", 2, grad_ok=None, grad_error=None),
               result("c/0", "c", 1, departure="flag=1"))
    report = CheckReport("title", results, ("a note",), ("head",))
    assert report.table().splitlines() == [
        "case class  cases  value ok  gradient ok  max value err  max grad err  departure",
        "----------  -----  --------  -----------  -------------  ------------  ---------",
        "a           1      ok        ok           1.50e-09       5.00e-01",
        "bb          1      ok        n/a          0.00e+00       n/a",
        "c           1      ok        ok           0.00e+00       5.00e-01      flag=1",
    ]
    assert report.render().splitlines()[-3:] == [
        "note: a note", "departure from the spec, allowed by flag=1: c/0", "PASS: 3 cases in 3 case classes"]
    assert str(report) == report.render() and report.render().startswith("head\ntitle\n\ncase class")
    failing = CheckReport("t", (*results, result("d/0", "d", 3, ok=False, explanation="matches x",
                                                 error="E", detail="D")))
    assert failing.render().splitlines()[-5:] == [
        "FAIL: case classes d", "smallest failing case: d/0", "  the function raised: E",
        "  diagnosis: matches x", "D"]
    listed = CheckReport("t", failing.results, list_departures=True)
    assert listed.render().splitlines()[-4:] == ["FAIL: case classes d", "departure d (d/0): x",
                                                 "  the function raised: E", "D"]
    long = CheckReport("t", (result("e/0", "e", 1, ok=False, detail="x" * 70, case_line="y" * 5),))
    lines = long.failure_message(max_line=40).splitlines()
    assert "x" * 40 + " ... (30 more characters: CheckReport.to_dict() has them)" in lines
    assert lines[-2:] == ["the case as one line of Python:", "  yyyyy"]


def test_tensors_as_text():
    assert tensor_text("x", None) == "x = None"
    assert tensor_text("m", torch.tensor([[True, False]])) == "m (bool, shape (1, 2)) = [[True, False]]"
    assert tensor_text("h", torch.tensor([0.1], dtype=torch.float16)) == (
        "h (float16, shape (1,)) = [0.0999755859375]")
    assert nested_text([[1.0, 2], []], lambda v: f"<{v}>") == "[[<1.0>, 2], []]"


def test_preflight_first_calls_the_function_on_the_case_moved_to_the_device():
    seen = []

    def kl_fn(logp, ref_logp):
        seen.append((logp.device.type, logp is not case.logp))
        return logp

    case = kl_case()
    preflight_first("kl", kl_fn, None, case, ("logp", "ref_logp"), "logp")
    preflight_first("kl", kl_fn, None, case, ("logp", "ref_logp"), "logp", "meta")
    assert seen == [("cpu", True), ("meta", True)]  # cloned inputs, on the device asked for

    def adapter(fn, logp, ref_logp):
        return fn(logp, ref_logp)[:, :1]

    with pytest.raises(SignatureError, match=r"kl_fn returned shape \(1, 1\), expected a tensor of shape "
                                             r"\(1, 2\)"):
        preflight_first("kl", kl_fn, adapter, case, ("logp", "ref_logp"), "logp")


def test_the_loop_moves_each_case_to_its_device_and_the_text_of_a_policy_case():
    case = kl_case()
    def judge(item, expected, got, error):
        return item is case, expected, float(got[0, 0]), error

    out = run_cases([case], expect=lambda c: c.logp.device.type, call=lambda c: c.logp * 2, judge=judge)
    assert out[0].result == (True, "cpu", 1.0, None)
    meta = run_cases([case], expect=lambda c: c.logp.device.type, call=lambda c: c.logp.device.type,
                     judge=lambda item, expected, got, error: (item.logp.device.type, expected, got),
                     device="meta")
    assert meta[0].result == ("cpu", "meta", "meta")
    x = torch.tensor([[0.5]], dtype=torch.float64)
    policy = PolicyLossCase("p", 2, x, x, torch.tensor([1.0]), torch.tensor([[True]]), torch.tensor([1.0]),
                            torch.tensor([0]), None, ((0,),), "a note")
    assert case_text(policy, ["e"]).splitlines() == [
        "  (a note)", "  logp (float64, shape (1, 1)) = [[0.5]]",
        "  old_logp (float64, shape (1, 1)) = [[0.5]]",
        "  advantages (float32, shape (1,)) = [1.0]", "  mask (bool, shape (1, 1)) = [[True]]",
        "  rewards (float32, shape (1,)) = [1.0]", "  group_ids (int64, shape (1,)) = [0]",
        "  micro_batches = ((0,),)", "  e"]
    assert case_line(policy).endswith("; micro_batches = ((0,),)")


def test_every_judgement_names_its_case():
    case = kl_case(4)
    assert judged(case, 0.0, 3.0, 1.0, 2.0, "").grad_error == 3.0
    for r in (judged(case, 0.0, 0.0, 1.0, 1.0, ""), raised(case, "", None), value_only(case, 0.0, True, "")):
        assert (r.case_id, r.case_class, r.size) == ("cls/4", "cls", 2)


def test_a_case_result_as_json_and_the_rendering_of_long_names_and_nan():
    r = CaseResult("k/1", "k", 3, math.nan, -math.inf, False, None, "d", "E", "flag=2", "bfloat16", 0.5,
                   math.inf, "matches y", "line")
    assert r.to_dict() == {"case_id": "k/1", "case_class": "k", "ok": False, "value_ok": False,
                           "grad_ok": None, "value_error": "nan", "grad_error": "-inf", "dtype": "bfloat16",
                           "expected": 0.5,
                           "got": "inf", "error": "E", "departure": "flag=2", "explanation": "matches y",
                           "case": "line"}
    report = CheckReport("t", (result("masked_nonfinite/0", "masked_nonfinite", 1, value_error=math.nan),))
    assert report.table().splitlines() == [
        "case class        cases  value ok  gradient ok  max value err  max grad err  departure",
        "----------------  -----  --------  -----------  -------------  ------------  ---------",
        "masked_nonfinite  1      ok        ok           nan            5.00e-01"]
    assert CheckReport("t", ()).table().splitlines() == [
        "case class  cases  value ok  gradient ok  max value err  max grad err  departure",
        "----------  -----  --------  -----------  -------------  ------------  ---------"]


def test_the_listed_departures_take_each_class_s_most_diagnostic_case():
    results = (result("d/0", "d", 5, ok=False, explanation="matches x"), result("d/1", "d", 2, ok=False),
               result("e/0", "e", 1, ok=False, dtype="float16", explanation="matches z"),
               result("e/1", "e", 9, ok=False, explanation="matches w"))
    lines = CheckReport("t", results, list_departures=True).render().splitlines()
    assert lines[-4:] == ["departure d (d/1): unexplained", "detail of d/1", "departure e (e/1): w",
                          "detail of e/1"]


def test_a_line_is_cut_only_past_the_limit():
    exact = CheckReport("t", (result("e/0", "e", 1, ok=False, detail="x" * 4000),))
    assert "x" * 4000 in exact.failure_message().splitlines()
    longer = CheckReport("t", (result("e/0", "e", 1, ok=False, detail="x" * 4001),))
    assert "x" * 4000 + " ... (1 more characters: CheckReport.to_dict() has them)" in (
        longer.failure_message().splitlines())


def test_a_function_that_ends_the_process_is_named_and_the_progress_names_each_class():
    """The loop's name of the checked function in a failure that is no exception (engine ``run_cases``
    mutmut_3 / 4 / 27 / 29: the default "the function" changed, ``what`` dropped; ``run_user``
    mutmut_1: the message), and a progress line per case class (``run_cases`` 8 / 9 / 51), the class
    of a tuple item being its first element's and "cases" for an item without one (``_case_class``,
    reached only with a progress writer: mutmut_1-14)."""
    def call(item):
        sys.exit(3)

    out = run_cases([1], expect=lambda i: i, call=call, judge=lambda item, expected, got, error: error)
    assert out[0].result == "the function called sys.exit(3)"
    named = run_cases([1], expect=lambda i: i, call=call, judge=lambda item, expected, got, error: error,
                      what="my_loss")
    assert named[0].result == "my_loss called sys.exit(3)"
    lines = []
    items = [kl_case(0), kl_case(1), (_ClassOnly("p"), 2), 7]
    with user_code.settings(progress=lines.append):
        run_cases(items, expect=lambda i: None, call=lambda i: None, judge=lambda *a: None)
    assert [re.sub(r", [0-9.]+ s$", "", line) for line in lines] == [
        "[1/3] cls: 2 cases", "[2/3] p: 1 case", "[3/3] cases: 1 case"]


class _ClassOnly:
    """An item that names its case class and moves nowhere (no ``to``)."""

    def __init__(self, case_class):
        self.case_class = case_class


def test_the_expected_values_are_computed_on_the_device_asked_for():
    """engine ``expected_on`` mutmut_6 (the case moved to no device: it stayed on the CPU)."""
    case = kl_case()
    assert expected_on("meta", lambda c, k: (c.logp.device.type, k), case, 7) == ("meta", 7)


def test_preflight_names_a_callable_without_a_qualified_name_and_a_process_exit():
    """engine ``preflight`` mutmut_4 / 10 (the type's name of a callable without ``__qualname__``) and
    13 / 15 / 16 (the function's name in, and the text of, a failure that is no exception)."""
    def fn():
        pass

    partial = functools.partial(fn)
    with pytest.raises(SignatureError, match=r"^partial fails on the plainest case with ValueError: bad; "):
        preflight("kl", partial, lambda: (_ for _ in ()).throw(ValueError("bad")), (2,))
    with pytest.raises(SignatureError, match=r"^[\w.<>]+\.fn called sys\.exit\(3\) on the plainest case$"):
        preflight("kl", fn, lambda: sys.exit(3), (2,))


def test_the_first_line_of_a_failure_and_its_diagnosis():
    """report ``failure_message`` mutmut_15 / 16 (the losses printed only when both are known and the
    function did not raise) and 31 (the diagnosis line), ``what_failed`` 11 / 13 (a value failure of
    a kind without gradient says nothing of the gradient), ``render`` 3 / 10 / 16 and ``table`` 23 (the
    blank line after the table, the lists of cases, classes and departures)."""
    no_expected = CheckReport("t", (result("v/0", "v", 1, ok=False, grad_ok=None, grad_error=None, got=0.5),))
    assert no_expected.failure_message().splitlines()[0] == (
        "v failed: smallest failing case v/0: value off by 1.00e+00 (relative)")
    raising = CheckReport("t", (result("r/0", "r", 1, ok=False, error="E: x", expected=1.0, got=2.0),))
    assert raising.failure_message().splitlines()[0] == (
        "r failed: smallest failing case r/0: the function raised E: x")
    lines = CheckReport("t", (result("x/0", "x", 1, ok=False, explanation="matches a"),)).failure_message()
    assert "smallest failing case: x/0\n  diagnosis: matches a\ndetail of x/0" in lines
    passing = CheckReport("title", (result("a/0", "a", 1), result("c/0", "c", 1, departure="f=1"),
                                    result("c/1", "c", 1, departure="g=2"),
                                    result("c/2", "c", 1, departure="f=1")))
    assert passing.table().splitlines()[-1].endswith("5.00e-01      f=1, g=2")
    assert passing.render() == (f"title\n\n{passing.table()}\n\n"
                                "departure from the spec, allowed by f=1: c/0, c/2\n"
                                "departure from the spec, allowed by g=2: c/1\n"
                                "PASS: 4 cases in 2 case classes")
    failing = CheckReport("t", (result("a/0", "a", 1, ok=False), result("b/0", "b", 1, ok=False)))
    assert "\nFAIL: case classes a, b\n" in failing.render()
    assert "\nFAIL: case classes a, b\n" in dataclasses.replace(failing, list_departures=True).render()

"""The diagnosis's alternatives and its choice of cases, pinned (issue 31):
``refimpl.conformance.diagnosis``. Which alternatives are tried, in which order, with which labels;
which failing case of each class is diagnosed; and the re-run diagnosis of the kinds without one."""

from __future__ import annotations

import dataclasses

import refimpl.conformance.diagnosis as diagnosis
from refimpl.conformance.conventions import Convention
from refimpl.conformance.diagnosis import (
    diagnosis_candidates,
    explain_case,
    explained_by_rerun,
    mistakes,
    with_explanations,
)
from refimpl.conformance.engine import expected_on
from refimpl.conformance.expected import expected_policy_loss
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.conformance.policy_check import judge_policy
from refimpl.conformance.report import CaseResult, CheckReport
from refimpl.losses import get_preset

DAPO = get_preset("dapo")
REP = dataclasses.replace


def labels(alternatives):
    return [label for label, _, _ in alternatives]


def test_the_common_mistakes_and_what_each_computes():
    conv = Convention()
    kl = REP(DAPO, kl_coef=0.1, kl_estimator="k2")
    out = mistakes(kl, conv)
    assert labels(out) == ["eps_high = eps_low (no clip-higher)",
                           "float32 arithmetic (flag compute_dtype='float32')",
                           "no KL term (kl_coef 0)", "the KL estimator 'k1'", "the KL estimator 'k3'"]
    assert out[0][1] == REP(kl, eps_high=0.2) and out[0][2] is conv
    assert out[1][1] is kl and out[1][2] == Convention(compute_dtype="float32")
    assert out[2][1] == REP(kl, kl_coef=0.0)
    assert [v.kl_estimator for _, v, _ in out[3:]] == ["k1", "k3"]
    # no clip-higher to miss (eps_high = eps_low, or a side missing), already float32, no KL term
    assert mistakes(get_preset("ppo"), Convention(compute_dtype="float32")) == []
    assert mistakes(REP(DAPO, eps_low=None), Convention(compute_dtype="float32")) == []
    assert mistakes(REP(DAPO, eps_high=None), Convention(compute_dtype="float32")) == []
    assert labels(mistakes(get_preset("sapo"), conv)) == ["float32 arithmetic (flag compute_dtype='float32')"]


def test_the_alternatives_of_a_framework_mode_are_its_flags_one_then_two_at_a_time_then_the_aggregations():
    conv = Convention()
    out = diagnosis_candidates(DAPO, conv, {"empty_rows": "keep", "micro_batch": "local_mean",
                                            "no_such_flag": 1, "dual_clip": 0.5})
    assert labels(out)[:3] == ["flag empty_rows='keep'", "flag micro_batch='local_mean'",
                               "flags empty_rows='keep', micro_batch='local_mean'"]
    assert out[1][2] == Convention(micro_batch="local_mean") and out[0][1] is DAPO
    assert out[2][2] == Convention(empty_rows="keep", micro_batch="local_mean")
    aggregations = [v.aggregation for label, v, _ in out if label.startswith("aggregation")]
    assert aggregations == ["seq_mean_token_mean", "seq_sum", "seq_mean_token_sum", "seq_mean",
                            "seq_sqrt_token_mean"]
    lengths = [v.max_length for label, v, _ in out if label.startswith("aggregation")]
    assert lengths == [None, 16, None, None, None]
    # an unknown flag or an invalid value is skipped, alone and in pairs
    assert not any("no_such_flag" in label or "dual_clip" in label for label in labels(out))
    three = diagnosis_candidates(DAPO, conv, {"empty_rows": "keep", "token_sum_rows": "all", "micro_batch":
                                              "local_mean"})
    flags = [label for label in labels(three) if label.startswith("flag")]
    assert len(flags) == 6 and not any(label.count("=") == 3 for label in flags)  # never all three here
    one = diagnosis_candidates(DAPO, conv, {"empty_rows": "keep"})
    assert not any(label.startswith("flags ") for label in labels(one))
    assert "flag dual_clip=3.0" not in labels(one)  # the generic flags are for a user's function
    dr = diagnosis_candidates(REP(DAPO, aggregation="seq_sum", max_length=40), conv, {})
    assert [v.max_length for _, v, _ in dr if v.aggregation == "seq_sum"] == []
    assert "aggregation 'token_mean'" in labels(dr)


def test_a_departure_is_attributed_to_the_smallest_set_of_flags():
    """Issue 27: never "all of the mode's flags" when fewer reproduce it: a departure that two of four
    flags reproduce is named by those two (a pair), one that needs three by an irreducible three."""
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[1]  # 2 parts of 7 and 4 tokens
    stale = case.old_logp.clone()
    stale[0, 0] = case.logp[0, 0] - 25.0  # a log-ratio of 25 (A < 0: the unclipped branch counts it)
    case = REP(case, old_logp=stale, advantages=-case.advantages.abs())
    pair = {"log_ratio_clamp": 20.0, "micro_batch": "local_mean"}
    got = expected_policy_loss(case, DAPO, Convention(**pair))
    profile = {"empty_rows": "keep", **pair, "compute_dtype": "input", "token_sum_rows": "all"}
    for flag in pair:  # neither flag alone reproduces it
        alone = expected_policy_loss(case, DAPO, Convention(**{flag: pair[flag]}))
        assert not judge_policy(case, *got, *alone, DAPO, conv, 1e-8)[3]
    assert explain_case(case, *got, DAPO, conv, 1e-8, profile, (), judge_policy) == (
        "matches flags log_ratio_clamp=20.0, micro_batch='local_mean'")
    # the whole set shrunk one flag at a time keeps only what is needed
    assert diagnosis.minimal_flags(case, *got, DAPO, conv, 1e-8, profile, judge_policy) == pair
    # a got value no flag set reproduces: unexplained, not "all of the flags"
    assert explain_case(case, got[0] + 1.0, got[1], DAPO, conv, 1e-8, profile, (), judge_policy) is None


def test_the_alternatives_of_a_users_function_add_mistakes_generic_flags_and_candidates():
    extra = ("profile x", DAPO, Convention(name="x", kl_k3_form="naive"))
    out = diagnosis_candidates(DAPO, Convention(), None, (extra,))
    generic = ["flag empty_rows='keep'", "flag seq_sum_width='padded_width'", "flag token_sum_rows='all'",
               "flag log_ratio_clamp=20.0", "flag dual_clip=3.0", "flag sequence_ratio_gradient='token'",
               "flag masked_nonfinite='propagate'", "flag compute_dtype='input'",
               "flag micro_batch='local_mean'"]
    # single flags first (the generic values, then each shipped profile's values), so that a profile
    # is named by the flag that makes the difference
    assert labels(out)[:len(generic) + 1] == [*generic, "flag kl_k3_form='naive'"]
    assert out[-1] == extra
    mistakes_at = labels(out).index("eps_high = eps_low (no clip-higher)")
    assert labels(out)[mistakes_at + 1] == "float32 arithmetic (flag compute_dtype='float32')"
    # flags already set are not tried again; the micro-batch flag toggles
    conv = Convention(empty_rows="keep", micro_batch="local_mean", compute_dtype="input")
    out = labels(diagnosis_candidates(DAPO, conv, None))
    assert "flag empty_rows='keep'" not in out and "flag compute_dtype='input'" not in out
    assert "flag micro_batch='global'" in out


def test_explain_case_names_the_flag_the_sign_or_the_ignored_normaliser():
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[0]
    seq = REP(DAPO, aggregation="seq_mean_token_mean")
    got = expected_policy_loss(case, seq, conv)
    assert explain_case(case, *got, DAPO, conv, 1e-8, {}, (), judge_policy) == (
        "matches aggregation 'seq_mean_token_mean'")
    got = expected_policy_loss(case, DAPO, conv)
    neg = (-got[0], -got[1])
    assert explain_case(case, *neg, DAPO, conv, 1e-8, None, (), judge_policy) == (
        "matches the loss's sign flipped")
    assert explain_case(case, *neg, DAPO, conv, 1e-8, {}, (), judge_policy) is None  # a framework: no sign
    local = expected_policy_loss(case, DAPO, Convention(micro_batch="local_mean"))
    parts = len(case.micro_batches)
    summed = (local[0] * parts, local[1] * parts)
    assert explain_case(case, *summed, DAPO, conv, 1e-8, {"empty_rows": "keep"}, (), judge_policy) == (
        "matches local means per micro-batch: the normalizer argument is ignored")
    # under local means the kit passes no global normaliser: nothing to ignore
    assert explain_case(case, *summed, DAPO, Convention(micro_batch="local_mean"), 1e-8, {}, (),
                        judge_policy) is None
    plain = policy_loss_cases(DAPO, conv, classes=("inside_clip",))[0]
    flipped = REP(plain, advantages=-plain.advantages)
    got = expected_policy_loss(flipped, DAPO, conv)
    assert explain_case(plain, *got, DAPO, conv, 1e-8, None, (), judge_policy) == (
        "matches a flipped sign (of the advantages or of the loss: the same on this case)")
    outside = policy_loss_cases(DAPO, conv, classes=("outside_clip",))[0]
    got = expected_policy_loss(REP(outside, advantages=-outside.advantages), DAPO, conv)
    assert explain_case(outside, *got, DAPO, conv, 1e-8, None, (), judge_policy) == (
        "matches the advantages' sign flipped")
    got = expected_policy_loss(outside, DAPO, conv)
    assert explain_case(outside, got[0] + 1.0, got[1], DAPO, conv, 1e-8, None, (), judge_policy) is None


def _result(case_id, cls, size, ok):
    return CaseResult(case_id, cls, size, 0.0 if ok else 1.0, 0.0, ok, True)


def test_with_explanations_diagnoses_the_smallest_failing_case_of_each_class():
    conv = Convention()
    cases = {c.case_id: c for c in policy_loss_cases(DAPO, conv, classes=("inside_clip", "outside_clip"))}
    got = {cid: (c, *expected_policy_loss(REP(c, advantages=-c.advantages), DAPO, conv))
           for cid, c in cases.items()}
    results = [_result("outside_clip/0", "outside_clip", 12, False),
               _result("outside_clip/1", "outside_clip", 12, False),
               _result("inside_clip/0", "inside_clip", 20, True),
               _result("golden_vectors/0", "golden_vectors", 1, False)]
    out = with_explanations(results, got, DAPO, conv, "dapo", 1e-8, None, (), judge_policy)
    assert [r.explanation for r in out] == ["matches the advantages' sign flipped", None, None, None]
    framework = with_explanations(results, got, DAPO, conv, "dapo", 1e-8, {}, (), judge_policy)
    assert [r.explanation for r in framework] == ["unexplained", None, None, None]
    smaller = [_result("outside_clip/1", "outside_clip", 11, False), *results[:1]]
    out = with_explanations(smaller, got, DAPO, conv, "dapo", 1e-8, None, (), judge_policy)
    assert [r.explanation for r in out] == ["matches the advantages' sign flipped", None]


def test_explained_by_rerun_names_the_first_flag_that_passes_each_class():
    report = CheckReport("t", (_result("a/0", "a", 1, False), _result("b/0", "b", 1, False),
                               _result("c/0", "c", 1, False), _result("d/0", "d", 1, True)))

    def run(conv):
        passing = {"a"} if conv.empty_rows == "keep" else set()
        if conv.empty_rows == "keep" and conv.micro_batch == "local_mean":
            passing |= {"b"}
        return CheckReport("t", tuple(_result(f"{k}/0", k, 1, k in passing) for k in "abcd"))

    out = explained_by_rerun(report, Convention(), {"empty_rows": "keep", "micro_batch": "local_mean",
                                                     "bad_flag": 3}, run)
    assert out.list_departures is True
    # the valid pair still reproduces b: a bad flag spoils only the sets it is in
    assert [r.explanation for r in out.results] == [
        "flag empty_rows='keep'", "flags empty_rows='keep', micro_batch='local_mean'", "unexplained", None]
    out = explained_by_rerun(report, Convention(), {"empty_rows": "keep", "micro_batch": "local_mean"}, run)
    assert [r.explanation for r in out.results] == [
        "flag empty_rows='keep'", "flags empty_rows='keep', micro_batch='local_mean'", "unexplained", None]


def test_alternatives_are_computed_on_the_checks_device(monkeypatch):
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[0]
    loss, grad = expected_policy_loss(case, DAPO, conv)
    wrong = (loss + 1.0, grad)
    assert explain_case(case, *wrong, DAPO, conv, 1e-8, None, (), judge_policy, "the device") is None
    assert devices and set(devices) == {"the device"}


def test_a_framework_mode_is_not_diagnosed_with_a_users_mistakes_and_invalid_flags_are_skipped():
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("outside_clip",))[0]
    got = expected_policy_loss(case, REP(DAPO, eps_high=0.2), conv)
    assert explain_case(case, *got, DAPO, conv, 1e-8, None, (), judge_policy) == (
        "matches eps_high = eps_low (no clip-higher)")
    assert explain_case(case, *got, DAPO, conv, 1e-8, {}, (), judge_policy) is None
    out = diagnosis_candidates(DAPO, conv, {"no_such_flag": 1, "empty_rows": "keep"})
    assert labels(out)[0] == "flag empty_rows='keep'"


def test_golden_vectors_are_not_diagnosed_and_one_flag_is_one_rerun():
    conv = Convention()
    (case,) = policy_loss_cases(DAPO, conv, classes=("inside_clip",))
    golden = REP(case, case_class="golden_vectors")
    got = expected_policy_loss(REP(case, advantages=-case.advantages), DAPO, conv)
    results = [_result("golden_vectors/0", "golden_vectors", 1, False)]
    got_by_id = {"golden_vectors/0": (golden, *got)}
    out = with_explanations(results, got_by_id, DAPO, conv, "dapo", 1e-8, None, (), judge_policy)
    assert out[0].explanation is None
    calls = []

    def run(candidate):
        calls.append(candidate)
        return CheckReport("t", (_result("a/0", "a", 1, True),))

    report = CheckReport("t", (_result("a/0", "a", 1, False),))
    assert explained_by_rerun(report, conv, {"empty_rows": "keep"}, run).results[0].explanation == (
        "flag empty_rows='keep'")
    assert calls == [Convention(empty_rows="keep")]


def test_each_flag_set_is_rerun_once_and_a_passing_case_keeps_no_explanation():
    """``explained_by_rerun`` mutmut_15 / 16 / 17 (the sets tried: each flag, each pair, then all of
    three together, each once) and 44 (a passing case of a failing class gets no explanation)."""
    conv = Convention()
    flags = {"empty_rows": "keep", "micro_batch": "local_mean", "token_sum_rows": "all"}
    tried = []

    def run(candidate):
        tried.append(tuple(f for f in flags if getattr(candidate, f) != getattr(conv, f)))
        return CheckReport("t", (_result("a/0", "a", 1, len(tried[-1]) == 3), _result("a/1", "a", 1, True)))

    report = CheckReport("t", (_result("a/0", "a", 1, False), _result("a/1", "a", 1, True)))
    out = explained_by_rerun(report, conv, flags, run)
    a, b, c = flags
    assert tried == [(a,), (b,), (c,), (a, b), (a, c), (b, c), (a, b, c)]
    assert [r.explanation for r in out.results] == [
        "flags empty_rows='keep', micro_batch='local_mean', token_sum_rows='all'", None]
    tried.clear()
    explained_by_rerun(report, conv, {a: flags[a], b: flags[b]}, run)
    assert tried == [(a,), (b,), (a, b)]


def test_the_irreducible_subset_of_three_flags_its_device_and_its_use(monkeypatch):
    """``minimal_flags`` mutmut_14 (a set with an invalid flag reproduces nothing), 17 (computed on the
    check's device), 37 / 38 (a set of exactly three flags is shrunk); ``explain_case`` mutmut_25 / 30
    / 34 (its result names the departure; the check's convention and device are passed on)."""
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[1]
    stale = case.old_logp.clone()
    stale[0, 0] = case.logp[0, 0] - 25.0
    case = REP(case, old_logp=stale, advantages=-case.advantages.abs())
    pair = {"log_ratio_clamp": 20.0, "micro_batch": "local_mean"}
    got = expected_policy_loss(case, DAPO, Convention(**pair))
    three = {"empty_rows": "keep", **pair}
    assert diagnosis.minimal_flags(case, *got, DAPO, conv, 1e-8, three, judge_policy) == pair
    assert diagnosis.minimal_flags(case, *got, DAPO, conv, 1e-8, {**three, "no_such_flag": 1},
                                   judge_policy) is None
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    assert diagnosis.minimal_flags(case, *got, DAPO, conv, 1e-8, three, judge_policy, "the device") == pair
    assert devices and set(devices) == {"the device"}
    seen = []

    def minimal(case, got_loss, got_grad, v, conv, rtol, flags, judge, device):
        seen.append((conv, device))
        return {"empty_rows": "keep", "micro_batch": "local_mean"}

    monkeypatch.setattr(diagnosis, "minimal_flags", minimal)
    wrong = (got[0] + 1.0, got[1])  # no alternative reproduces it
    assert explain_case(case, *wrong, DAPO, conv, 1e-8, {"empty_rows": "keep"}, (), judge_policy,
                        "the device") == "matches flags empty_rows='keep', micro_batch='local_mean'"
    assert seen == [(conv, "the device")]


def test_the_kl_averaged_over_padding_under_local_means_and_on_the_checks_device(monkeypatch):
    """``_unmasked_kl`` mutmut_35 / 36 / 37 / 38 (the mistaken KL term of local means divided by the
    number of micro-batches), 49 (a case without reference log-probs cannot match), 51 (the
    check's device); ``explain_case`` mutmut_43 / 44 are in the test above."""
    import torch

    from refimpl.kl import kl_k3

    v = REP(DAPO, kl_coef=0.1, kl_estimator="k3")
    local = Convention(micro_batch="local_mean")
    case = policy_loss_cases(v, local, classes=("micro_batch",))[0]  # 3 parts of 2 rows
    loss, grad = expected_policy_loss(case, REP(v, kl_coef=0.0), local)
    logp = case.logp.detach().double().requires_grad_(True)
    parts = [list(p) for p in case.micro_batches]
    term = sum(kl_k3(logp[p], case.ref_logp.double()[p]).mean() * 0.1 for p in parts) / len(parts)
    (extra,) = torch.autograd.grad(term, logp)
    got = (loss + term.detach(), grad + extra)  # kl.mean() over every position of each part
    check = diagnosis._unmasked_kl(v, local, "cpu")
    assert check(case, *got, 1e-8, judge_policy) is True
    assert diagnosis._unmasked_kl(v, Convention(), "cpu")(case, *got, 1e-8, judge_policy) is False
    assert check(REP(case, ref_logp=None), *got, 1e-8, judge_policy) is False
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    assert diagnosis._unmasked_kl(v, local, "the device")(case, *got, 1e-8, judge_policy) is True
    assert devices == ["the device"]


def test_a_users_function_off_by_two_flags_together_is_named_by_the_pair(monkeypatch):
    """``_flag_pairs`` (mutmut_1-14, 25, 26, ...: its expected values, computed on the check's device,
    decide which flags can be paired): no single alternative reproduces a log-ratio clamp together
    with local means per micro-batch; the pair of the two does."""
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[1]
    stale = case.old_logp.clone()
    stale[0, 0] = case.logp[0, 0] - 25.0
    case = REP(case, old_logp=stale, advantages=-case.advantages.abs())
    got = expected_policy_loss(case, DAPO, Convention(log_ratio_clamp=20.0, micro_batch="local_mean"))
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    label = diagnosis._global_diagnosis([(case, *got)], DAPO, conv, 1e-8, (), judge_policy, "the device")
    assert label == "flags log_ratio_clamp=20.0, micro_batch='local_mean'"
    assert devices and set(devices) == {"the device"}


def test_only_flags_that_change_a_failing_case_are_paired_and_an_invalid_one_is_skipped():
    """``_flag_pairs`` mutmut_33 (an invalid flag value, a profile's ``adv_singleton='raw'`` under
    ``adv_scale='batch_rewards'``, is skipped, not the end of the flags), 47 (a flag whose expected
    value raises, GSPO-token with an importance-weighted KL, is no pair), 48 / 57 / 58 (a flag that
    changes nothing is no pair), 52 (one that changes only the gradient, ``kl_gradient='none'``, is)."""
    v = REP(get_preset("gspo"), kl_coef=0.1, kl_estimator="k3")
    conv = Convention(kl_importance_weight=True, adv_scale="batch_rewards")
    case = policy_loss_cases(v, conv, classes=("micro_batch",))[0]  # 3 parts of 2 rows, one row empty
    profile = ("profile x", v, Convention(name="x", adv_singleton="raw", kl_gradient="none"))
    flags = [flag for flag, _ in diagnosis._user_flag_values(conv, (profile,))]
    assert flags.index("adv_singleton") < flags.index("kl_gradient")  # the invalid value comes first
    failures = [(case, *expected_policy_loss(case, v, conv))]
    out = diagnosis._flag_pairs(v, conv, (profile,), "cpu", failures)
    pairs = [label for label, _ in out]
    # a pair's check on micro-batches says no (False), not "cannot tell" (_variant_check mutmut_1)
    assert out[1][1](case, failures[0][1] + 1.0, failures[0][2], 1e-8, judge_policy) is False  # global means
    useful = ["empty_rows='keep'", "micro_batch='local_mean'", "kl_importance_weight=False",
              "kl_gradient='none'"]
    assert pairs == [f"flags {a}, {b}" for i, a in enumerate(useful) for b in useful[i + 1:]]
    # kl_gradient='none' alone changes only the gradient (the KL term keeps its value)
    alone = expected_policy_loss(case, v, REP(conv, kl_gradient="none"))
    assert alone[0] == failures[0][1] and not alone[1].equal(failures[0][2])


def test_an_alternative_whose_expected_value_cannot_be_computed_is_no_match(monkeypatch):
    """``_unmasked_kl`` mutmut_57: an expected value that raises (here the device running out of
    memory) makes the alternative no match, not a match."""
    v = REP(DAPO, kl_coef=0.1, kl_estimator="k3")
    case = policy_loss_cases(v, Convention(), classes=("micro_batch",))[0]
    got = expected_policy_loss(case, v, Convention())

    def out_of_memory(device, expect, case, *args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(diagnosis, "expected_on", out_of_memory)
    assert diagnosis._unmasked_kl(v, Convention(), "cpu")(case, *got, 1e-8, judge_policy) is False


def test_the_first_alternative_reproducing_every_failure_and_its_label_for_several_cases():
    """``_first_reproducing`` mutmut_18 (an alternative that raises is skipped, not the end of the
    search), 15 / 16 (one that reproduces only the first failure is no match), 24 / 25 / 30-34 (the
    label says "on these cases" for two failures, "on this case" for one)."""
    def raises(case, loss, grad, rtol, judge):
        raise RuntimeError("out of memory")

    def matches(case, loss, grad, rtol, judge):
        return True

    def cannot_tell(case, loss, grad, rtol, judge):
        return None

    flip = "a flipped sign (of the advantages or of the loss: the same on this case)"
    def first_only(case, loss, grad, rtol, judge):
        return case == "first"

    alternatives = [("raises", raises), ("cannot tell", cannot_tell), ("first only", first_only),
                    (flip, matches)]
    two = [("first", None, None), ("second", None, None)]
    assert diagnosis._first_reproducing(alternatives, two, 1e-8, judge_policy) == (
        "a flipped sign (of the advantages or of the loss: the same on these cases)")
    assert diagnosis._first_reproducing(alternatives, two[1:], 1e-8, judge_policy) == flip
    assert diagnosis._first_reproducing(alternatives[:3], two, 1e-8, judge_policy) is None


def test_with_explanations_uses_the_device_orders_cheapest_first_and_says_when_nothing_matches(monkeypatch):
    """``with_explanations`` mutmut_22 / 32 / 48 (the alternatives of a framework mode and of a user's
    function are computed on the check's device), 37 / 39 / 40 (a user's failing classes are tried
    smallest case first), 58 (no alternative: ``NO_DIAGNOSIS``, not "matches None")."""
    conv = Convention()
    cases = {c.case_id: c for c in policy_loss_cases(DAPO, conv, classes=("inside_clip", "outside_clip"))}
    got = {cid: (c, *expected_policy_loss(REP(c, advantages=-c.advantages), DAPO, conv))
           for cid, c in cases.items()}
    results = [_result("outside_clip/0", "outside_clip", 12, False),
               _result("inside_clip/0", "inside_clip", 5, False)]
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    with_explanations(results, got, DAPO, conv, "dapo", 1e-8, {}, (), judge_policy, "the device")
    assert devices and set(devices) == {"the device"}
    devices.clear()
    with_explanations(results, got, DAPO, conv, "dapo", 1e-8, None, (), judge_policy, "the device")
    assert devices and set(devices) == {"the device"}
    tried = []

    def nothing_matches(failures, *args):
        tried.append([case.case_id for case, _, _ in failures])
        return None

    monkeypatch.setattr(diagnosis, "_global_diagnosis", nothing_matches)
    out = with_explanations(results, got, DAPO, conv, "dapo", 1e-8, None, (), judge_policy)
    assert tried == [["inside_clip/0", "outside_clip/0"]]
    assert [r.explanation for r in out] == [diagnosis.NO_DIAGNOSIS] * 2


def test_the_special_mistakes_each_reproduce_what_they_name(monkeypatch):
    """``_special_mistakes`` mutmut_48-85: no gradient at all (the gradient times 0); ``ratio.detach()``
    in the clipped branch (half the gradient on every token of the closed band [1 - eps_low, 1 + eps_high],
    its bounds included; no match on a case without such a token); the KL averaged over padding, only
    with a KL term, computed on the check's device."""
    import torch

    conv = Convention()
    kl = REP(DAPO, kl_coef=0.1, kl_estimator="k3")
    assert [label for label, _ in diagnosis._special_mistakes(DAPO, conv, "cpu")] == [
        "no gradient at all (a detached ratio or loss)",
        "ratio.detach() in the clipped branch (the gradient halved where the two branches tie)"]
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    (label, unmasked) = diagnosis._special_mistakes(kl, conv, "the device")[2]
    assert label == "the KL term averaged over every position, padding included (kl.mean())"
    case = policy_loss_cases(DAPO, conv, classes=("on_boundary",))[0]  # 7 tokens, 2 on each bound
    loss, grad = expected_policy_loss(case, DAPO, conv)
    r = torch.exp(case.logp - case.old_logp)
    assert int((case.mask & ((r == 0.8) | (r == 1.28))).sum()) == 4 and bool(grad[case.mask].ne(0).all())
    (_, none), (_, tied) = diagnosis._special_mistakes(DAPO, conv, "the device")
    assert tied(case, loss, torch.where(case.mask, 0.5, 1.0) * grad, 1e-8, judge_policy) is True
    # (on a kink the spec's own gradient passes against any alternative: the judge's subgradient note)
    inside = policy_loss_cases(DAPO, conv, classes=("inside_clip",))[0]  # 14 tokens strictly inside
    loss, grad = expected_policy_loss(inside, DAPO, conv)
    assert none(inside, loss, grad * 0.0, 1e-8, judge_policy) is True
    assert none(inside, loss, grad, 1e-8, judge_policy) is False
    assert tied(inside, loss, grad, 1e-8, judge_policy) is False
    outside = policy_loss_cases(DAPO, conv, classes=("outside_clip",))[0]  # no token in the band
    assert tied(outside, *expected_policy_loss(outside, DAPO, conv), 1e-8, judge_policy) is False
    from refimpl.kl import kl_k3

    mb = policy_loss_cases(kl, conv, classes=("micro_batch",))[0]  # 3 parts of 2 rows
    loss, grad = expected_policy_loss(mb, REP(kl, kl_coef=0.0), conv)
    logp = mb.logp.detach().double().requires_grad_(True)
    term = sum(kl_k3(logp[list(p)], mb.ref_logp.double()[list(p)]).mean() * 0.1 for p in mb.micro_batches)
    (extra,) = torch.autograd.grad(term, logp)
    assert unmasked(mb, loss + term.detach(), grad + extra, 1e-8, judge_policy) is True
    assert devices and set(devices) == {"the device"}


def test_a_users_alternatives_in_order_and_another_aggregation_on_micro_batches(monkeypatch):
    """``_alternatives`` mutmut_20 (the shipped profiles are tried, last), 31-33 (the special mistakes
    come right after the common ones), 47 / 48 (the ignored normaliser's label), 5 / 9 / 11 / 12 (another
    aggregation on micro-batches cannot tell, None, where a flag does not match, False), 27 (a framework's
    ignored normaliser is computed on the check's device)."""
    conv = Convention()
    extra = ("profile x", DAPO, Convention(name="x", kl_k3_form="naive"))
    alternatives = diagnosis._alternatives(DAPO, conv, None, (extra,), "cpu")
    base = labels(diagnosis_candidates(DAPO, conv, None, (extra,)))
    special = ["no gradient at all (a detached ratio or loss)",
               "ratio.detach() in the clipped branch (the gradient halved where the two branches tie)",
               "a flipped sign (of the advantages or of the loss: the same on this case)",
               "the advantages' sign flipped", "the loss's sign flipped",
               "local means per micro-batch: the normalizer argument is ignored"]
    assert [label for label, _ in alternatives] == [*base[:-1], *special, "profile x"]
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[0]
    loss, grad = expected_policy_loss(case, DAPO, conv)
    check = dict(alternatives)
    assert check["aggregation 'seq_mean_token_mean'"](case, loss + 1.0, grad, 1e-8, judge_policy) is None
    assert check["flag empty_rows='keep'"](case, loss + 1.0, grad, 1e-8, judge_policy) is False
    devices = []

    def recording(device, expect, case, *args):
        devices.append(device)
        return expected_on("cpu", expect, case, *args)

    monkeypatch.setattr(diagnosis, "expected_on", recording)
    label, ignored = diagnosis._alternatives(DAPO, conv, {}, (), "the device")[-1]
    assert label == special[-1] and ignored(case, loss + 1.0, grad, 1e-8, judge_policy) is False
    assert devices == ["the device"]


def test_an_alternative_past_float32s_range_cannot_tell_a_reduced_precision_case():
    """``_reproduces`` mutmut_2-15: for float32 inputs an alternative whose loss or gradient lies past
    float32's largest value (inf included) cannot tell (None); exactly the largest value, or any
    value for float64 inputs, is judged."""
    import types

    import torch

    calls = []

    def judge(case, got_loss, got_grad, exp_loss, exp_grad, ev, candidate, rtol):
        calls.append(float(exp_loss))
        return 0.0, 0.0, True, True, None

    f32 = types.SimpleNamespace(logp=torch.zeros(1, dtype=torch.float32))
    f64 = types.SimpleNamespace(logp=torch.zeros(1, dtype=torch.float64))
    top = torch.finfo(torch.float32).max
    small, grad = torch.tensor(1.0, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    for exp in ((torch.tensor(1e39, dtype=torch.float64), grad), (small, grad * 1e39),
                (small, grad * float("inf")), (torch.tensor(1e39, dtype=torch.float64), grad[:0])):
        assert diagnosis._reproduces(f32, small, grad, exp, DAPO, None, 1e-8, judge) is None
    assert calls == []
    for case, exp in ((f32, (torch.tensor(top, dtype=torch.float64), grad)), (f64, (small, grad * 1e39)),
                      (f32, (small, grad[:0]))):
        assert diagnosis._reproduces(case, small, grad, exp, DAPO, None, 1e-8, judge) is True
    assert calls == [top, 1.0, 1.0]


def test_another_aggregation_on_micro_batches_matches_as_summed_local_means_only_under_global_means():
    """``_variant_check`` mutmut_41-43 (under local means the kit passes no global normaliser: a
    mismatch is a mismatch, False) and 44 (the sum of the other aggregation's local means is a match)."""
    conv = Convention()
    case = policy_loss_cases(DAPO, conv, classes=("micro_batch",))[0]
    seq = REP(DAPO, aggregation="seq_mean_token_mean")
    local = expected_policy_loss(case, seq, Convention(micro_batch="local_mean"))
    parts = len(case.micro_batches)
    check = diagnosis._variant_check(seq, conv, "cpu", parts_local=True)
    assert check(case, local[0] * parts, local[1] * parts, 1e-8, judge_policy) is True
    loss, grad = expected_policy_loss(case, DAPO, conv)
    local_check = diagnosis._variant_check(seq, Convention(micro_batch="local_mean"), "cpu", parts_local=True)
    assert local_check(case, loss + 1.0, grad, 1e-8, judge_policy) is False


def test_the_halved_gradient_of_ratio_detach_is_on_the_band_only():
    """``_special_mistakes`` mutmut_53 / 63: a row with r = 1 (in the band [0.8, 1.28]) and r = e^0.5
    = 1.65 (above it; A < 0 keeps its gradient): the mistake halves the first token's gradient only."""
    import torch

    from refimpl.conformance.case_types import PolicyLossCase

    row = lambda xs: torch.tensor([xs], dtype=torch.float64)  # noqa: E731
    adv = torch.tensor([-0.5], dtype=torch.float64)
    case = PolicyLossCase("mixed", 0, row([0.5, 0.5]), row([0.5, 0.0]), adv,
                          torch.ones(1, 2, dtype=torch.bool), adv, torch.tensor([0]))
    loss, grad = expected_policy_loss(case, DAPO, Convention())
    assert bool(grad.ne(0).all())
    tied = diagnosis._special_mistakes(DAPO, Convention(), "cpu")[1][1]
    halved = grad * torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    assert tied(case, loss, halved, 1e-8, judge_policy) is True

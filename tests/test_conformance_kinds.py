"""The kind registry (refimpl/conformance/kinds): every kind's expected values equal the spec computed
independently in sympy (rationals: exact) on the kind's own cases, the reference function passes its
own check, planted mistakes fail the class they should and are attributed to the smallest set of
flags, and ``refimpl check kind`` runs a user's function."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
import sympy as sp
import torch

from refimpl.conformance.cli import main
from refimpl.conformance.kinds import KIND_REGISTRY, attribute, get_kind, run_kind_check
from refimpl.conformance.kinds.gae import GAEFlags, expected_gae
from refimpl.conformance.kinds.value_loss import ValueLossFlags, expected_value_loss
from refimpl.losses import value_loss
from refimpl.whitening import masked_whiten_reference
from specs.estimators import evaluate_float64, gae_exprs

# float64 of exact (rational / sympy) values after a handful of roundings: 1e-12 relative to the
# largest entry is ~5e3 unit roundoffs, far below any departure the kinds name (>= 1e-9)
TOL = 1e-12


def _rational(x: float) -> sp.Rational:
    return sp.Rational(x)  # the float's exact binary value


def _close(got: torch.Tensor, want: list[float], where: torch.Tensor) -> None:
    g = got[where].double()
    w = torch.tensor(want, dtype=torch.float64)
    scale = float(w.abs().max()) if w.numel() else 0.0
    torch.testing.assert_close(g, w, rtol=0, atol=TOL * max(scale, 1.0))


# ------------------------------------------------------------------------------------------------
# the expected values against the spec, computed independently


def _sympy_whiten(x, mask, *, mean="masked", std="population", weighting="token", eps=0,
                  placement="variance"):
    """advantages.md eq. (20)-(22), in exact arithmetic, on the counted entries (row-major order)."""
    rows = [[(_rational(float(x[i, t])), bool(mask[i, t])) for t in range(x.shape[1])]
            for i in range(x.shape[0])]
    counted = [(v, 1 if weighting == "token" else sp.Rational(1, sum(m for _, m in row)))
               for row in rows for v, m in row if m]
    n = len(counted)
    total = sum(w for _, w in counted)
    mu = (sum(v for row in rows for v, _ in row) / sum(len(r) for r in rows) if mean == "unmasked"
          else sum(w * v for v, w in counted) / total)
    var = sum(w * (v - mu) ** 2 for v, w in counted) / total
    if std == "sample":
        var = var * sp.Rational(n, n - 1)
    eps = sp.Rational(eps)
    s = {"variance": sp.sqrt(var + eps), "std": sp.sqrt(var) + eps,
         "floor": sp.sqrt(sp.Max(var, eps))}[placement]
    return [0.0 if s == 0 else float(((v - mu) / s).evalf(30)) for v, _ in counted]


@pytest.mark.parametrize("options", [
    {}, {"mean": "unmasked"}, {"std": "sample"}, {"weighting": "sequence"},
    {"eps": 1e-8, "placement": "variance"}, {"eps": 0.25, "placement": "std"},
    {"eps": 4.0, "placement": "floor"},
])
def test_the_whitening_reference_is_the_spec(options):
    kind = get_kind("whitening")
    for case in kind.cases(0):
        x, mask = case.inputs["advantages"], case.inputs["mask"]
        if not bool(torch.isfinite(x).all()) or int(mask.sum()) < 2:
            continue  # non-finite padding: the same values as another case; < 2 entries: the edges test
        want = _sympy_whiten(x, mask, **options)
        kwargs = {k: v for k, v in options.items() if k != "placement"}
        got = masked_whiten_reference(x, mask, eps_placement=options.get("placement", "variance"), **kwargs)
        _close(got, want, mask)
        assert torch.all(got[~mask] == 0)


def test_the_whitening_reference_edges():
    x = torch.tensor([[1.5, 1.5, 9.0], [1.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert torch.equal(masked_whiten_reference(x, mask), torch.zeros_like(x))  # constant: 0, not 0 / 0
    assert torch.equal(masked_whiten_reference(x, torch.zeros_like(mask)), torch.zeros_like(x))
    with pytest.raises(ValueError, match="std='sample' needs at least two"):
        one = mask & (torch.arange(3) == 0) & (torch.arange(2)[:, None] == 0)
        masked_whiten_reference(x, one, std="sample")
    with pytest.raises(ValueError, match="mean must be one of"):
        masked_whiten_reference(x, mask, mean="all")


def test_the_gae_kind_is_the_spec_row_by_row():
    """Each row an episode of L tokens: next value V_{t+1} inside it, then final_values when the row
    is truncated (bootstrapped) or nothing when it ended with an EOS (estimators.md eq. (4)-(5))."""
    for case in get_kind("gae").cases(0):
        x, gamma, lam = case.inputs, case.params["gamma"], case.params["lam"]
        expected = expected_gae(case, GAEFlags())
        for i in range(x["mask"].shape[0]):
            length = int(x["mask"][i].sum())
            if length == 0:
                continue
            r = [_rational(float(v)) for v in x["rewards"][i, :length]]
            v = [_rational(float(u)) for u in x["values"][i, :length]]
            truncated = bool(x["truncated"][i])
            nv = v[1:] + [_rational(float(x["final_values"][i])) if truncated else sp.Integer(0)]
            term = [False] * (length - 1) + [not truncated]
            trunc = [False] * (length - 1) + [truncated]
            adv = evaluate_float64(gae_exprs(r, v, nv, term, trunc, _rational(gamma), _rational(lam)))
            row = x["mask"][i:i + 1]
            _close(expected["advantages"].values[i:i + 1], adv, row)
            returns = [a + float(b) for a, b in zip(adv, v, strict=True)]
            _close(expected["returns"].values[i:i + 1], returns, row)


def _exact_value_loss(x, clip, *, aggregation="token_mean"):
    """policy_losses.md eq. (23) in exact rational arithmetic: max((V - R)^2, (V_c - R)^2) with
    V_c = V_old + clip(V - V_old, -c, c) per counted token, and its derivative in V (2 (V - R) on the
    first branch, 2 (V_c - R) inside the clip on the second; no sample sits on a kink), aggregated
    with exact weights (1 / n, or 1 / (rows x L_i))."""
    mask = x["mask"]
    c = Fraction(clip)
    rows = [int(r) for r in mask.sum(dim=-1)]
    nonempty, tokens = sum(1 for r in rows if r), sum(rows)
    loss, grad = Fraction(0), torch.zeros_like(x["values"])
    for i, t in zip(*torch.nonzero(mask, as_tuple=True), strict=True):
        v, old, ret = (Fraction(float(x[k][i, t])) for k in ("values", "old_values", "returns"))
        vc = old + min(max(v - old, -c), c)
        first, second = (v - ret) ** 2, (vc - ret) ** 2
        assert abs(v - old) != c and (first != second or vc == v)  # off every kink (inside the band V_c = V)
        weight = Fraction(1, tokens) if aggregation == "token_mean" else Fraction(1, nonempty * rows[i])
        loss += weight * max(first, second)
        slope = 2 * (v - ret) if first >= second else (2 * (vc - ret) if abs(v - old) < c else 0)
        grad[i, t] = float(weight * slope)
    return float(loss), grad


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_value_loss_kind_is_the_spec(aggregation):
    for case in get_kind("value_loss").cases(0):
        if case.case_class == "masked_nonfinite":
            continue  # the same finite values with non-finite padding: checked by the reference's own test
        want, want_grad = _exact_value_loss(case.inputs, case.params["clip"], aggregation=aggregation)
        got = expected_value_loss(case, ValueLossFlags(value_aggregation=aggregation))
        assert abs(float(got["loss"].values) - want) <= TOL * max(abs(want), 1.0), case.case_id
        torch.testing.assert_close(got["grad_values"].values, want_grad, rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------------------
# the check: the reference passes, planted mistakes fail and are attributed minimally


def _reference_whiten(x, mask):
    return masked_whiten_reference(x, mask)


def _reference_value_loss(values, old_values, returns, mask, *, clip):
    zero = torch.zeros((), dtype=values.dtype)
    return value_loss(torch.where(mask, values, zero), torch.where(mask, returns, zero), mask,
                      old_values=torch.where(mask, old_values, zero), clip_eps=clip)[0]


def test_every_kind_is_registered_with_distinct_prefixed_flags():
    seen = set()
    for name, kind in KIND_REGISTRY.items():
        assert kind.name == name and kind.case_classes()
        fields = {f.name for f in dataclasses.fields(kind.flags)}
        assert not fields & seen, f"{name} reuses a flag name"
        seen |= fields
    with pytest.raises(ValueError, match="kind must be one of"):
        get_kind("nope")


def test_the_reference_functions_pass_their_kinds():
    assert run_kind_check(get_kind("whitening"), _reference_whiten).ok
    assert run_kind_check(get_kind("value_loss"), _reference_value_loss).ok


def test_an_unmasked_mean_is_named_and_only_that_flag():
    """SkyRL's normalize_advantages_dict mistake, planted: the smallest flag set that reproduces it is
    the mean alone, though the trial set holds two flags."""
    kind = get_kind("whitening")

    def unmasked_mean(x, mask):
        mu = x.mean()
        var = (((x - mu) ** 2) * mask).sum() / mask.sum()
        return (x - mu) / var.sqrt()

    report = run_kind_check(kind, unmasked_mean)
    assert set(report.failing_classes()) >= {"ragged", "padding_junk", "empty_rows"}
    named = attribute(report, {"whiten_std": "sample", "whiten_mean": "unmasked"},
                      lambda flags: run_kind_check(kind, unmasked_mean, flags))
    why = {r.case_class: r.explanation for r in named.results if not r.ok}
    assert why["ragged"] == "flag whiten_mean='unmasked'"
    assert why["masked_nonfinite"] == "flag whiten_mean='unmasked'"  # NaN padding enters the plain mean


def test_a_one_pass_float32_variance_fails_the_large_offset_and_constant_classes():
    """E[x^2] - E[x]^2 in float32 on 1000 + k/64 cancels (and is 0 or negative on a constant batch); a
    two-pass float32 whitening passes (float32_rtol: the case's condition number)."""
    def one_pass(x, mask):
        m, x32 = mask.float(), torch.where(mask, x, 0.0).float()
        n = m.sum()
        mu = (x32 * m).sum() / n
        return (x32 - mu) / torch.sqrt((x32 * x32 * m).sum() / n - mu * mu)

    report = run_kind_check(get_kind("whitening"), one_pass)
    assert report.failing_classes() == ["large_offset", "constant", "single_token"]  # 0 / 0 on the last two
    flagged = run_kind_check(get_kind("whitening"), one_pass, {"whiten_one_pass": True},
                             classes=("large_offset",))
    assert flagged.ok

    def two_pass(x, mask):
        m, x32 = mask.float(), torch.where(mask, x, 0.0).float()
        mu = (x32 * m).sum() / m.sum()
        centred = (x32 - mu) * m
        return centred / torch.sqrt((centred * centred).sum() / m.sum())

    assert run_kind_check(get_kind("whitening"), two_pass, classes=("large_offset",)).ok


def test_a_halved_value_loss_and_an_ignored_truncation_are_named():
    kind = get_kind("value_loss")

    def halved(*args, clip):
        return 0.5 * _reference_value_loss(*args, clip=clip)

    report = run_kind_check(kind, halved)
    assert report.failing_classes() == ["inside_clip", "outside_clip", "ragged", "empty_rows",
                                        "masked_nonfinite"]
    named = attribute(report, {"value_scale": 0.5, "value_aggregation": "seq_mean_token_mean"},
                      lambda flags: run_kind_check(kind, halved, flags))
    assert {r.explanation for r in named.results if not r.ok} == {"flag value_scale=0.5"}

    gae = get_kind("gae")

    def terminate_always(rewards, values, mask, *, gamma, lam, truncated, final_values):
        out = expected_gae(dataclasses.replace(gae.cases(0)[0], inputs={
            "rewards": rewards, "values": values, "mask": mask, "truncated": torch.zeros_like(truncated),
            "final_values": final_values}, params={"gamma": gamma, "lam": lam}), GAEFlags())
        return out["advantages"].values, out["returns"].values

    assert run_kind_check(gae, terminate_always).failing_classes() == ["truncated"]
    assert run_kind_check(gae, terminate_always, {"gae_truncation": "terminate"}).ok


def test_a_wrong_output_is_one_failing_case_not_a_crash():
    report = run_kind_check(get_kind("gae"), lambda *a, **k: None)
    assert not report.ok and all(r.error and "TypeError" in r.error for r in report.results)
    assert math.isinf(report.results[0].value_error)


def test_the_command_line_checks_a_users_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_value.py").write_text(
        "import torch\n"
        "def vloss(values, old_values, returns, mask, *, clip):\n"
        "    v = torch.where(mask, values, 0.0)\n"
        "    r = torch.where(mask, returns, 0.0)\n"
        "    o = torch.where(mask, old_values, 0.0)\n"
        "    c = o + (v - o).clamp(-clip, clip)\n"
        "    per = torch.where(mask, torch.maximum((v - r) ** 2, (c - r) ** 2), 0.0)\n"
        "    return 0.5 * per.sum() / mask.sum().clamp(min=1)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "kind", "value_loss", "my_value:vloss"]) == 1
    assert "inside_clip" in capsys.readouterr().out
    assert main(["check", "kind", "value_loss", "my_value:vloss", "--flag", "value_scale=0.5"]) == 0
    assert main(["check", "kind", "value_loss", "my_value:vloss", "--flag", "value_scale=x"]) == 2
    assert main(["check", "kind", "nope", "my_value:vloss"]) == 2


def test_the_kl_reward_kind_is_the_spec():
    """Ouyang et al. 2022, eq. (2), in exact rationals: -beta (logp - ref) on every counted token, the
    score on the last one; k2 / k3 (kl.md eq. (3)-(4)) evaluated in sympy, clamped as the flag says."""
    from refimpl.conformance.kinds.kl_reward import KLRewardFlags, expected_kl_reward

    for case in get_kind("kl_reward").cases(0):
        x, beta = case.inputs, Fraction(case.params["kl_coef"])
        for flags in (KLRewardFlags(), KLRewardFlags(kl_reward_estimator="k2"),
                      KLRewardFlags(kl_reward_estimator="k3", kl_reward_value_clamp=10.0)):
            got = expected_kl_reward(case, flags)["rewards"].values
            mask = x["mask"]
            for i, t in zip(*torch.nonzero(mask, as_tuple=True), strict=True):
                d = _rational(float(x["logp"][i, t])) - _rational(float(x["ref_logp"][i, t]))  # -log r
                kl = {"k1": d, "k2": d ** 2 / 2, "k3": sp.exp(-d) + d - 1}[flags.kl_reward_estimator]
                if flags.kl_reward_value_clamp:
                    kl = sp.Min(sp.Max(kl, -10), 10)
                last = t == int(mask[i].sum()) - 1
                want = -sp.Rational(beta) * kl + (_rational(float(x["scores"][i])) if last else 0)
                want = float(sp.N(want, 30))
                assert abs(float(got[i, t]) - want) <= TOL * max(abs(want), 1.0), (case.case_id, flags)


def test_the_behavior_correction_kind_is_the_loop():
    """Decoupled PPO (policy_losses.md eq. (13)) by an obvious loop: the token mean of
    w * max(-A r, -A clip(r, 1 - eps, 1 + eps)), r = pi / pi_prox, w = pi_prox / pi_behave detached
    (capped as the flags say); value and gradient."""
    from refimpl.conformance.kinds.behavior import BehaviorFlags, expected_behavior

    for case in get_kind("behavior_correction").cases(0):
        x, eps = case.inputs, case.params["eps"]
        for flags in (BehaviorFlags(), BehaviorFlags(behavior_weight="dropped"),
                      BehaviorFlags(behavior_cap="truncate"), BehaviorFlags(behavior_cap="mask")):
            logp = x["logp"].clone().requires_grad_(True)
            terms = []
            for i, t in zip(*torch.nonzero(x["mask"], as_tuple=True), strict=True):
                r = torch.exp(logp[i, t] - x["prox_logp"][i, t])
                a = x["advantages"][i]
                w = math.exp(float(x["prox_logp"][i, t] - x["behave_logp"][i, t]))
                if flags.behavior_weight == "dropped":
                    w = 1.0
                elif flags.behavior_cap == "truncate":
                    w = min(w, flags.behavior_cap_value)
                elif flags.behavior_cap == "mask":
                    w = w if w <= flags.behavior_cap_value else 0.0
                terms.append(w * torch.maximum(-a * r, -a * r.clamp(1 - eps, 1 + eps)))
            loss = torch.stack(terms).sum() / len(terms) if terms else logp.sum() * 0
            (grad,) = torch.autograd.grad(loss, logp)
            got = expected_behavior(case, flags)
            # float64, a sum of <= 20 terms: 1e-12 relative is thousands of unit roundoffs
            want = float(loss.detach())
            assert abs(float(got["loss"].values) - want) <= TOL * max(abs(want), 1.0)
            torch.testing.assert_close(got["grad_logp"].values, grad, rtol=0, atol=TOL)

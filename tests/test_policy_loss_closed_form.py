"""The eager closed form that ``policy_loss`` runs (``refimpl.losses.closed_form``) against the readable
reference ``reference_policy_loss`` (md eq. (12), specs/policy_losses.md).

Both compute the same loss from the same inputs in the same dtype; they differ in the order of their
roundings, so loss, gradients and metrics agree within the bound of tests/test_policy_loss_fast.py
(64 units of the compute dtype's roundoff u on the scale of each result), in float64 and float32.
Every case class of the conformance kit, every part of the family
(hypothesis), the guards (each hands the batch to the reference, which raises or ignores padding), and
that ordinary batches really take the closed form (none of it is a silent fall back).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.conformance.checks import check_policy_loss, resolve_preset
from refimpl.losses import GRPO, PRESETS, policy_loss, reference_policy_loss
from refimpl.losses import closed_form as closed_form_module
from refimpl.losses.closed_form import closed_form_policy_loss
from tests import test_policy_loss_fast as fast_tests
from tests.test_policy_loss import BOUNDARY_SAFE, loss_batches

_NO_EXTRAS = {"ref_logp": None, "behavior_logp": None, "entropy": None, "kl": None}


def assert_same(v, logp, old, adv, mask, **kwargs) -> None:
    """policy_loss (closed form or reference, as it decides) equal to the reference."""
    fast_tests.assert_same_as_reference(v, logp, old, adv, mask, fast=policy_loss, **kwargs)


@pytest.mark.parametrize("name", list(PRESETS))
def test_policy_loss_equals_the_reference_on_every_case_class(name):
    seen = set()
    variants = fast_tests._kit_variants(name)
    for v in variants:
        for case_class, inputs, kwargs in fast_tests._kit_calls(v):
            assert_same(v, *inputs, **kwargs)
            seen.add(case_class)
    assert seen == fast_tests._expected_classes(variants)


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_reference_passes_the_conformance_kit(name):
    """The kit holds policy_loss to its expected values elsewhere; here the reference body itself."""
    _, v = resolve_preset(name, kl_coef=0.1)
    report = check_policy_loss(lambda *a, **k: reference_policy_loss(*a, v, **k), v)
    assert report.ok, report.render()


@pytest.mark.parametrize("name", sorted(BOUNDARY_SAFE))
@given(data=st.data())
def test_policy_loss_equals_the_reference_on_every_part_of_the_family(name, data):
    v = BOUNDARY_SAFE[name]
    if data.draw(st.booleans()):
        v = dataclasses.replace(v, entropy_coef=0.25, kl_coef=max(v.kl_coef, 0.125))
    logp, old, adv, mask, _ = data.draw(loss_batches(v))
    extras = fast_tests._extras(v, logp, data.draw(st.integers(0, 2**16)), exact_kl=data.draw(st.booleans()))
    if data.draw(st.booleans()) and not (v.kl_scale == "sequence" and v.aggregation == "token_mean"):
        extras["normalizer"] = data.draw(st.sampled_from([3.0, 7.5, torch.tensor(11.0)]))
    if data.draw(st.booleans()):  # float32, as the trainer and the benchmarks run it
        logp, old, adv = logp.float(), old.float(), adv.float()
        extras = {k: (x.float() if isinstance(x, torch.Tensor) and x.ndim == 2 else x)
                  for k, x in extras.items()}
    assert_same(v, logp, old, adv, mask, **extras)


def _batch(n=6, t=9, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([t, 1, 0, t - 3, 2, t][:n])
    mask = torch.arange(t) < lengths[:, None]
    old = -torch.rand(n, t, generator=g, dtype=dtype) * 2
    logp = old + 0.3 * torch.randn(n, t, generator=g, dtype=dtype)
    adv = torch.randn(n, generator=g, dtype=dtype)
    adv[4] = 0.0
    return logp, old, adv, mask


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("per_token", [False, True])
def test_ordinary_batches_take_the_closed_form(name, per_token):
    """Finite inputs, a bool or 0/1 float mask, a global normaliser or none: the closed form answers
    (it returns None only where the reference must), for every preset, with a KL term and an entropy
    bonus."""
    v = dataclasses.replace(PRESETS[name], kl_coef=0.1, entropy_coef=0.01)
    if name == "dr_grpo":
        v = dataclasses.replace(v, max_length=9)
    if per_token and v.ratio != "token":
        pytest.skip("per-token advantages need token-level ratios")
    logp, old, adv, mask = _batch()
    if per_token:
        adv = adv[:, None] * torch.linspace(-1, 1, logp.shape[1], dtype=logp.dtype)
    extras = {**_NO_EXTRAS, "ref_logp": old - 0.2, "entropy": torch.rand_like(logp)}
    for m in (mask, mask.double()):
        for normalizer in (None, 17.0):
            assert closed_form_policy_loss(logp, old, adv, m, v, extras, normalizer) is not None
            assert_same(v, logp, old, adv, m, ref_logp=extras["ref_logp"], entropy=extras["entropy"],
                        normalizer=normalizer)


def test_what_the_closed_form_leaves_to_the_reference():
    logp, old, adv, mask = _batch()
    nan_padding = logp.clone()
    nan_padding[1, 5] = float("nan")  # masked: the reference ignores it, the closed form hands it over
    overflow = logp.clone()
    overflow[0, 0] = old[0, 0] + 100.0  # exp(100) is beyond float32's range (the test runs it in float32)
    cases = [
        (GRPO, nan_padding, mask, None),
        (dataclasses.replace(GRPO, gate="log_clip"), logp, mask, None),
        (dataclasses.replace(GRPO, behavior_correction="truncate"), logp, mask, None),
        (GRPO, logp, mask.double() * 0.5, None),
        (GRPO, logp, mask, 0.0),
        (GRPO, logp, mask, torch.ones(2)),
        (dataclasses.replace(PRESETS["dr_grpo"], max_length=3), logp, mask, None),
        (PRESETS["dr_grpo"], logp, mask, None),
        (dataclasses.replace(GRPO, aggregation="seq_sqrt_token_mean"), logp, mask, None),
        (GRPO, overflow.float(), mask, None),
    ]
    for v, lp, m, normalizer in cases:
        o = old.float() if lp.dtype == torch.float32 else old
        a = adv.float() if lp.dtype == torch.float32 else adv
        assert closed_form_policy_loss(lp, o, a, m, v, _NO_EXTRAS, normalizer) is None, (v, normalizer)
    assert closed_form_policy_loss(logp.to("meta"), old.to("meta"), adv.to("meta"), mask.to("meta"), GRPO,
                                   _NO_EXTRAS, None) is None
    nan_adv = adv.clone()
    nan_adv[0] = float("nan")
    assert closed_form_policy_loss(logp, old, nan_adv, mask, GRPO, _NO_EXTRAS, None) is None
    # NaN padding: policy_loss still answers (through the reference), as the reference does
    assert_same(GRPO, nan_padding, old, adv, mask)


def test_ratio_extremes_when_every_unmasked_ratio_is_on_one_side_of_one():
    """The masked units hold r = 1: where every unmasked ratio is above (or below) 1, the extremes
    come from the masked units filled with the mean, as the reference fills them."""
    logp, old, adv, mask = _batch()
    for shift in (0.05, -0.05):
        up = old + shift * torch.rand_like(old).add(0.5)
        for v in (GRPO, PRESETS["gspo"], PRESETS["gspo_token"]):
            assert_same(v, up, old, adv, mask)
            assert_same(v, up, old, adv, torch.ones_like(mask))  # nothing masked


def test_gradients_flow_to_logp_entropy_and_kl_in_their_dtypes():
    logp, old, adv, mask = _batch()
    v = dataclasses.replace(GRPO, kl_coef=0.5, entropy_coef=0.25)
    x = logp.float().requires_grad_(True)
    ent = torch.rand(logp.shape, dtype=torch.bfloat16, requires_grad=True)
    kl = torch.rand(logp.shape, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(x, old, adv, mask, v, entropy=ent, kl=kl)
    (3.0 * loss).backward()
    assert (x.grad.dtype, ent.grad.dtype, kl.grad.dtype) == (torch.float32, torch.bfloat16, torch.float64)
    x2, ent2, kl2 = (y.detach().clone().requires_grad_(True) for y in (x, ent, kl))
    loss2, _ = reference_policy_loss(x2, old, adv, mask, v, entropy=ent2, kl=kl2)
    (3.0 * loss2).backward()
    u = torch.finfo(torch.float32).eps
    for a, b in ((x.grad, x2.grad), (ent.grad, ent2.grad), (kl.grad, kl2.grad)):
        scale = float(b.double().abs().max())
        tol = 64 * max(u, torch.finfo(b.dtype).eps) * scale
        assert float((a.double() - b.double()).abs().max()) <= tol
    no_grad = logp.detach()
    loss3, _ = policy_loss(no_grad, old, adv, mask, GRPO)
    assert not loss3.requires_grad


def test_the_module_imports_no_policy_module():
    """policy.py imports the closed form (no import circle): the closed form names no policy module."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(closed_form_module))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any("policy" in str(name) for name in names)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("t", [9, 50])
def test_blocks_of_rows_equal_the_reference(name, t, monkeypatch):
    """Blocks of a few rows (and of one row when a row exceeds the block), a last block that is
    smaller, float32 log-ratios on both sides of approx_kl's series bound (|l| <= 1/2) and in blocks
    without any beyond it, per-row and per-token advantages, a bool and a 0/1 float mask: the same
    values as the reference, and the closed form answers."""
    monkeypatch.setattr(closed_form_module, "_BLOCK_ELEMENTS", 37)
    v = PRESETS[name]
    if name == "dr_grpo":
        v = dataclasses.replace(v, max_length=t)
    g = torch.Generator().manual_seed(t)
    n = 11
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    old = -torch.rand(n, t, generator=g) * 3
    spread = torch.full((n, 1), 0.05)
    spread[::3] = 1.5  # rows with |l| > 1/2 in some blocks only
    logp = old + spread * torch.randn(n, t, generator=g)
    per_row = torch.randn(n, generator=g)
    advantage_kinds = [per_row] + ([per_row[:, None] * torch.randn(n, t, generator=g)] if v.ratio == "token"
                                   else [])
    for adv in advantage_kinds:
        for m in (mask, mask.float()):
            assert closed_form_policy_loss(logp, old, adv, m, v, _NO_EXTRAS, None) is not None
            assert_same(v, logp, old, adv, m)


@pytest.mark.parametrize("bound", [0.0, 1e-3, 0.05, 0.2, 0.3, 0.5, 0.9, 3.0])
def test_approx_kl_sum_is_float32_accurate_on_every_branch(bound):
    """The float32 sum of k3 = expm1(l) - l (kl.md eq. (4)) over a block, against 30-digit mpmath:
    Taylor terms (|l| <= 0.23), the minimax polynomial (up to 1/2) and the exp correction beyond,
    each within 2 units of float32's roundoff (each term's polynomial within 1.5 u, the series'
    truncation below u / 4, and a sum of same-sign terms)."""
    import math

    import mpmath

    mpmath.mp.dps = 30
    x = torch.linspace(-bound, bound, 401, dtype=torch.float32)
    got = float(closed_form_module._k3_sum(x, float(x.min()), float(x.max()), None))
    exact = math.fsum(float(mpmath.expm1(mpmath.mpf(float(v))) - mpmath.mpf(float(v))) for v in x)
    assert abs(got - exact) <= 2 * torch.finfo(torch.float32).eps * exact


def _run(v, logp, old, adv, mask):
    """(loss, metrics, d loss / d logp) of one policy_loss call, forward and backward."""
    leaf = logp.detach().clone().requires_grad_(True)
    loss, metrics = policy_loss(leaf, old, adv, mask, v)
    loss.backward()
    return loss.detach(), metrics, leaf.grad


def _equal(a, b) -> bool:
    """Bitwise: the same loss, metrics and gradient."""
    return (torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys()
            and all(torch.equal(a[1][k], b[1][k]) for k in a[1]) and torch.equal(a[2], b[2]))


@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo", "cispo"])
def test_calls_in_flight_share_no_memory(name, monkeypatch):
    """The blocks' temporaries live in scratch buffers: two forward passes before either backward (as in
    gradient accumulation) give each call's loss, metrics and gradient bit for bit as that call run
    alone (nothing saved for backward or returned is a view of the scratch)."""
    monkeypatch.setattr(closed_form_module, "_BLOCK_ELEMENTS", 20)  # 9 tokens a row: blocks of 2 rows
    v = PRESETS[name]
    if v.gate == "clip":  # gates open (GSPO's 4e-4 would close every row of these batches)
        v = dataclasses.replace(v, eps_low=0.9, eps_high=5.0)
    batches = [tuple(x.float() if x.is_floating_point() else x for x in _batch(seed=s)) for s in (1, 2)]
    alone = [_run(v, *b) for b in batches]
    assert all(bool((grad != 0).any()) for _, _, grad in alone)
    leaves = [b[0].detach().clone().requires_grad_(True) for b in batches]
    calls = [policy_loss(leaf, *b[1:], v) for leaf, b in zip(leaves, batches, strict=True)]
    assert all(closed_form_policy_loss(*b, v, _NO_EXTRAS, None) is not None for b in batches)
    (calls[0][0] + calls[1][0]).backward()
    for (loss, metrics), leaf, expected in zip(calls, leaves, alone, strict=True):
        assert _equal((loss.detach(), metrics, leaf.grad), expected)


def test_threads_computing_at_once_get_each_call_s_values(monkeypatch):
    """Two threads computing at once (ATen releases the GIL inside each operation) each get the values
    of the call run alone: no scratch buffer is shared between calls."""
    import threading

    monkeypatch.setattr(closed_form_module, "_BLOCK_ELEMENTS", 20)
    v = PRESETS["grpo"]
    batches = [tuple(x.float() if x.is_floating_point() else x for x in _batch(n=6, t=9, seed=s))
               for s in (3, 4)]
    expected = [_run(v, *b) for b in batches]
    failures = []

    def work(i):
        for _ in range(200):
            if not _equal(_run(v, *batches[i]), expected[i]):
                failures.append(i)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures

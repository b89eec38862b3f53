"""Invariances and numerics of policy_loss (spec: specs/policy_losses.md sections 4-5):
micro-batches and 2 real data-parallel ranks (gloo) sum to the full-batch gradient with the global
normaliser, for every aggregation; padding and permutation do not change the loss; low-precision
inputs; log-ratios up to |50|; empty rows and batches; bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from refimpl.kl import kl_k3
from refimpl.losses import (
    AGGREGATIONS,
    CISPO,
    DAPO,
    DR_GRPO,
    GRPO,
    GSPO,
    GSPO_TOKEN,
    PPO,
    PRESETS,
    SAPO,
    PolicyLossVariant,
    loss_normalizer,
    policy_loss,
)

# One variant per (ratio level, gate) family, each tried under every aggregation below.
FAMILY = {
    "token_clip_dual": dataclasses.replace(PPO, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01),
    "gspo": GSPO,
    "gspo_token": GSPO_TOKEN,
    "seq_product": PolicyLossVariant(ratio="sequence_product", gate="clip", aggregation="seq_mean"),
    "sapo": SAPO,
    "cispo_tis": dataclasses.replace(CISPO, behavior_correction="truncate"),
}


def _with_aggregation(v: PolicyLossVariant, aggregation: str) -> PolicyLossVariant:
    return dataclasses.replace(v, aggregation=aggregation, max_length=7 if aggregation == "seq_sum" else None,
                               group_size=4 if aggregation == "seq_sqrt_token_mean" else None)


def _random_batch(seed: int, n: int = 6, t: int = 5, dtype=torch.float64, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, t, generator=g) < 0.7
    mask[1] = False  # an all-masked row
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 2
    logp = old + spread * torch.randn(n, t, generator=g, dtype=torch.float64)
    return {
        "logp": logp.to(dtype),
        "old_logp": old.to(dtype),
        "advantages": torch.randn(n, generator=g, dtype=torch.float64).to(dtype),
        "mask": mask,
        "ref_logp": (old + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)).to(dtype),
        "entropy": torch.rand(n, t, generator=g, dtype=torch.float64).to(dtype),
        "behavior_logp": (old + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)).to(dtype),
    }


def _call(v, batch, rows=None, **kw):
    rows = slice(None) if rows is None else rows
    extras = {}
    if v.kl_coef > 0:
        extras["ref_logp"] = batch["ref_logp"][rows]
    if v.entropy_coef > 0:
        extras["entropy"] = batch["entropy"][rows]
    if v.behavior_correction != "none":
        extras["behavior_logp"] = batch["behavior_logp"][rows]
    return policy_loss(batch["logp"][rows], batch["old_logp"][rows], batch["advantages"][rows],
                       batch["mask"][rows], v, **extras, **kw)


def _loss_and_grad(v, batch, rows=None, **kw):
    leaf = batch["logp"].clone().requires_grad_(True)
    loss, metrics = _call(v, {**batch, "logp": leaf}, rows, **kw)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name", sorted(FAMILY))
@given(seed=st.integers(0, 2**20), cuts=st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True))
def test_micro_batches_sum_to_the_full_batch_with_the_global_normalizer(name, aggregation, seed, cuts):
    v = _with_aggregation(FAMILY[name], aggregation)
    batch = _random_batch(seed)
    full_loss, full_grad, _ = _loss_and_grad(v, batch)
    global_d = loss_normalizer(batch["mask"], v)
    bounds = [0, *sorted(cuts), 6]
    parts_d = sum(loss_normalizer(batch["mask"][a:b], v) for a, b in zip(bounds, bounds[1:], strict=False))
    assert float(parts_d) == float(global_d)  # the normaliser itself is additive
    total_loss, total_grad = 0.0, torch.zeros_like(full_grad)
    for a, b in zip(bounds, bounds[1:], strict=False):
        loss, grad, _ = _loss_and_grad(v, batch, slice(a, b), normalizer=global_d)
        total_loss += float(loss)
        total_grad += grad
    assert total_loss == pytest.approx(float(full_loss), rel=1e-12, abs=1e-14)
    assert torch.allclose(total_grad, full_grad, rtol=1e-12, atol=1e-15)


def test_micro_batches_without_the_global_normalizer_differ():
    """The reason for the normaliser: local means of unequal parts do not sum (or average) to the
    full-batch mean (DAPO's token mean over parts with 2 and 10 tokens)."""
    batch = _random_batch(4)
    batch["mask"][:] = False
    batch["mask"][0, :2] = True
    batch["mask"][2:, :] = True
    full, _, _ = _loss_and_grad(DAPO, batch)
    parts = [float(_loss_and_grad(DAPO, batch, r)[0]) for r in (slice(0, 2), slice(2, 6))]
    assert abs(sum(parts) / 2 - float(full)) > 1e-3


@pytest.mark.parametrize("name", sorted(PRESETS))
@given(seed=st.integers(0, 2**20), pad_cols=st.integers(0, 3), pad_rows=st.integers(0, 2),
       perm_seed=st.integers(0, 1000))
def test_padding_and_permutation_do_not_change_the_loss(name, seed, pad_cols, pad_rows, perm_seed):
    v = PRESETS[name] if name != "dr_grpo" else dataclasses.replace(DR_GRPO, max_length=9)
    batch = _random_batch(seed)
    loss, grad, _ = _loss_and_grad(v, batch)
    n, t = batch["mask"].shape
    padded = {}
    for key, x in batch.items():
        fill = False if key == "mask" else float("nan") if key == "logp" else 123.0
        big = torch.full((n + pad_rows, t + pad_cols), fill, dtype=x.dtype) if x.ndim == 2 else None
        if x.ndim == 1:
            big = torch.cat([x, torch.full((pad_rows,), -7.0, dtype=x.dtype)])
        else:
            big[:n, :t] = x
        padded[key] = big
    loss_p, grad_p, _ = _loss_and_grad(v, padded)
    assert float(loss_p) == pytest.approx(float(loss), rel=1e-13, abs=1e-15)
    assert torch.allclose(grad_p[:n, :t], grad, rtol=1e-13, atol=1e-16)
    assert torch.count_nonzero(grad_p[n:]) == 0 and torch.count_nonzero(grad_p[:, t:]) == 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed))
    loss_q, grad_q, _ = _loss_and_grad(v, {k: x[perm] for k, x in batch.items()})
    assert float(loss_q) == pytest.approx(float(loss), rel=1e-13, abs=1e-15)
    assert torch.allclose(grad_q, grad[perm], rtol=1e-13, atol=1e-16)


# ---------------------------------------------------------------------------------------------
# two real data-parallel ranks (gloo)


def _shared_parameter_batch(seed: int):
    """logp = base + features @ theta, with theta shared by every rank (as model weights are)."""
    g = torch.Generator().manual_seed(seed)
    batch = _random_batch(seed, n=8, t=6)
    features = torch.randn(8, 6, 3, generator=g, dtype=torch.float64)
    theta = 0.1 * torch.randn(3, generator=g, dtype=torch.float64)
    return batch, features, theta


def _theta_grad(v, batch, features, theta, rows, normalizer):
    th = theta.clone().requires_grad_(True)
    logp = batch["logp"][rows] + features[rows] @ th
    loss, _ = policy_loss(logp, batch["old_logp"][rows], batch["advantages"][rows], batch["mask"][rows], v,
                          ref_logp=batch["ref_logp"][rows] if v.kl_coef > 0 else None, normalizer=normalizer)
    loss.backward()
    return loss.detach(), th.grad


def _distributed_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for seed in (0, 1):
            batch, features, theta = _shared_parameter_batch(seed)
            rows = slice(rank * 4, rank * 4 + 4) if seed == 0 else slice(rank * 3, 3 + rank * 5)  # 3 + 5 rows
            for aggregation in AGGREGATIONS:
                for name, base in (("grpo_kl", dataclasses.replace(GRPO, kl_coef=0.05)), ("gspo", GSPO)):
                    v = _with_aggregation(base, aggregation)
                    local_d = loss_normalizer(batch["mask"][rows], v).to(torch.float64)
                    dist.all_reduce(local_d)  # the global normaliser
                    loss, grad = _theta_grad(v, batch, features, theta, rows, local_d)
                    packed = torch.cat([loss.reshape(1), grad])
                    dist.all_reduce(packed)  # DDP sums gradients (and we sum losses)
                    results[(seed, name, aggregation)] = packed
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_gloo_ranks_sum_to_the_full_batch_gradient(tmp_path):
    out_file = str(tmp_path / "results.pt")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), out_file), nprocs=2, join=True)
    results = torch.load(out_file)
    assert len(results) == 2 * 2 * len(AGGREGATIONS)
    for (seed, name, aggregation), packed in results.items():
        batch, features, theta = _shared_parameter_batch(seed)
        base = dataclasses.replace(GRPO, kl_coef=0.05) if name == "grpo_kl" else GSPO
        v = _with_aggregation(base, aggregation)
        loss, grad = _theta_grad(v, batch, features, theta, slice(None), None)
        expected = torch.cat([loss.reshape(1), grad])
        assert torch.allclose(packed, expected, rtol=1e-12, atol=1e-15), (seed, name, aggregation)


# ---------------------------------------------------------------------------------------------
# numerics


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize(("dtype", "unit"), [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)])
def test_low_precision_inputs_give_the_float32_result(name, dtype, unit):
    """Computation happens in float32: (a) bf16/fp16 inputs give exactly what float32 gives on
    the same (upcast) numbers, up to float32 rounding (rel 1e-5); (b) against the original float32
    inputs the loss moves by at most what rounding the inputs explains: each log-ratio moves by
    <= unit (|logp| + |old|) (relative rounding unit of the format), so each ratio by a factor
    exp(+-d) and the loss by <= sum |term| (exp(d) - 1) / D, with a margin of 2."""
    v = PRESETS[name] if name != "dr_grpo" else dataclasses.replace(DR_GRPO, max_length=5)
    batch32 = _random_batch(7, dtype=torch.float32, spread=0.1)
    low = {k: x.to(dtype) if x.is_floating_point() else x for k, x in batch32.items()}
    upcast = {k: x.to(torch.float32) if x.is_floating_point() else x for k, x in low.items()}
    loss_low, grad_low, _ = _loss_and_grad(v, low)
    loss_up, grad_up, _ = _loss_and_grad(v, upcast)
    assert loss_low.dtype == torch.float32 and grad_low.dtype == dtype
    assert float(loss_low) == pytest.approx(float(loss_up), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad_low.float(), grad_up.to(dtype).float(), rtol=0, atol=0)
    loss32, _, _ = _loss_and_grad(v, batch32)
    m = batch32["mask"]
    d = unit * float((batch32["logp"].abs() + batch32["old_logp"].abs())[m].max())
    ratio_max = math.exp(float((batch32["logp"] - batch32["old_logp"])[m].abs().max()) + d)
    adv_abs = batch32["advantages"].abs().unsqueeze(-1).expand_as(m)[m]
    logp_abs = float(batch32["logp"][m].abs().max()) + 1.0  # CISPO's term carries logp itself
    bound = 2 * float(adv_abs.sum()) * ratio_max * logp_abs * (math.exp(d) - 1 + unit) + 1e-6
    bound += unit * abs(float(loss32))
    assert abs(float(loss_low) - float(loss32)) <= bound


@pytest.mark.parametrize("name", [*sorted(PRESETS), "ppo_dual_kl_entropy", "seq_product"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_ratios_up_to_50_give_finite_loss_and_gradient(name, dtype):
    variants = {**PRESETS, "dr_grpo": dataclasses.replace(DR_GRPO, max_length=4),
                "ppo_dual_kl_entropy": dataclasses.replace(PPO, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.1),
                "seq_product": PolicyLossVariant(ratio="sequence_product", gate="clip",
                                                 aggregation="seq_mean")}
    v = variants[name]
    log_r = torch.tensor([[50.0, -50.0, 30.0, -30.0], [-50.0, 50.0, 0.0, 49.0]], dtype=torch.float64)
    old = torch.full((2, 4), -60.0, dtype=torch.float64)
    for adv in ([1.0, -1.0], [-2.0, 3.0]):
        batch = {"logp": (old + log_r).to(dtype), "old_logp": old.to(dtype),
                 "advantages": torch.tensor(adv, dtype=dtype), "mask": torch.ones(2, 4, dtype=torch.bool),
                 "ref_logp": old.to(dtype), "entropy": torch.ones(2, 4, dtype=dtype),
                 "behavior_logp": old.to(dtype)}
        loss, grad, metrics = _loss_and_grad(v, batch)
        assert torch.isfinite(loss) and bool(torch.isfinite(grad).all()), (name, adv)
        for key in ("policy_objective", "clip_fraction", "ratio_min"):
            assert torch.isfinite(metrics[key])


def test_all_masked_rows_count_for_nothing_and_an_empty_batch_gives_zero():
    """md section 5: an all-masked row contributes 0 and is not counted; a fully masked batch
    gives loss 0 with a zero gradient, ratio metrics 1 and other metrics 0 (locally or with a
    global normaliser)."""
    batch = _random_batch(2)
    for v in (GRPO, DAPO, GSPO, dataclasses.replace(DR_GRPO, max_length=5)):
        keep = batch["mask"].any(dim=-1)
        loss, grad, _ = _loss_and_grad(v, batch)
        loss_kept, grad_kept, _ = _loss_and_grad(v, {k: x[keep] for k, x in batch.items()})
        assert float(loss) == pytest.approx(float(loss_kept), rel=1e-14, abs=0.0)
        # a gradient entry is a product of its own row's factors and the integer token count: the
        # same few roundings in both batches (4 u of float64)
        assert torch.allclose(grad[keep], grad_kept, rtol=4 * 2.0**-53, atol=0.0)
        assert torch.count_nonzero(grad[~keep]) == 0
        empty = {**batch, "mask": torch.zeros_like(batch["mask"])}
        for normalizer in (None, 3.0):
            loss, grad, metrics = _loss_and_grad(v, empty, normalizer=normalizer)
            assert float(loss) == 0.0 and torch.count_nonzero(grad) == 0
            assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["ratio_min"]) == 1.0
            assert float(metrics["clip_fraction"]) == 0.0 and float(metrics["approx_kl"]) == 0.0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_batch_of_zero_sequences_gives_zero_loss_and_unit_ratio_metrics(name):
    """A micro-batch with N = 0 rows (e.g. a rank's share after filtering) behaves like a fully
    masked one: loss 0, an empty gradient, ratio metrics 1."""
    v = PRESETS[name]
    if v.aggregation == "seq_sum":
        v = dataclasses.replace(v, max_length=4)
    batch = {k: x[:0] for k, x in _random_batch(3).items()}
    loss, grad, metrics = _loss_and_grad(v, batch)
    assert float(loss) == 0.0 and grad.shape == (0, batch["logp"].shape[1])
    assert float(metrics["ratio_min"]) == 1.0 and float(metrics["ratio_max"]) == 1.0


def test_metrics_are_detached_tensors_with_the_documented_values():
    batch = _random_batch(9)
    v = dataclasses.replace(GRPO, kl_coef=0.1)
    _, _, metrics = _loss_and_grad(v, batch)
    m = batch["mask"]
    log_r = (batch["logp"] - batch["old_logp"])[m]
    r = torch.exp(log_r)
    adv = batch["advantages"].unsqueeze(-1).expand_as(m)[m]
    clipped = ((adv > 0) & (r > 1.2)) | ((adv <= 0) & (r < 0.8))
    assert all(isinstance(x, torch.Tensor) and not x.requires_grad for x in metrics.values())
    assert float(metrics["clip_fraction"]) == pytest.approx(
        float(clipped.double().mean()), rel=1e-14, abs=0.0
    )
    assert float(metrics["ratio_mean"]) == pytest.approx(float(r.mean()), rel=1e-14, abs=0.0)
    assert float(metrics["ratio_min"]) == pytest.approx(float(r.min()), rel=1e-14, abs=0.0)
    assert float(metrics["ratio_max"]) == pytest.approx(float(r.max()), rel=1e-14, abs=0.0)
    assert float(metrics["approx_kl"]) == pytest.approx(float((r - 1 - log_r).mean()), rel=1e-12, abs=0.0)
    kl = kl_k3(batch["logp"], batch["ref_logp"])[m]
    assert float(metrics["kl"]) == pytest.approx(float(kl.mean()), rel=1e-12, abs=0.0)
    assert float(metrics["normalizer"]) == float(m.any(dim=-1).sum())


def test_exact_kl_input_adds_beta_times_the_aggregated_kl():
    batch = _random_batch(12)
    kl = torch.rand(batch["mask"].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = dataclasses.replace(GRPO, kl_coef=0.3)
    without, _ = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"], GRPO)
    with_kl, metrics = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"], v,
                                   kl=kl)
    m = batch["mask"]
    rows = m.any(dim=-1)
    per_row = (kl * m).sum(-1)[rows] / m.sum(-1)[rows]
    assert float(with_kl - without) == pytest.approx(0.3 * float(per_row.mean()), rel=1e-12, abs=0.0)
    assert float(metrics["kl"]) == pytest.approx(float(kl[m].mean()), rel=1e-12, abs=0.0)


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_input_is_rejected_with_a_message_naming_the_argument():
    b = _random_batch(0)
    args = (b["logp"], b["old_logp"], b["advantages"], b["mask"])
    cases = [
        (lambda: policy_loss(*args, "grpo"), TypeError, r"variant must be a PolicyLossVariant .*got str$"),
        (lambda: policy_loss(b["logp"], b["old_logp"][:, :3], b["advantages"], b["mask"], GRPO), ValueError,
         "old_logp must have shape"),
        (lambda: policy_loss(b["logp"], b["old_logp"], b["advantages"][:3], b["mask"], GRPO), ValueError,
         "advantages must have shape"),
        (lambda: policy_loss(b["logp"], b["old_logp"], b["logp"], b["mask"], GSPO), ValueError,
         r"sequence-level and needs advantages of shape \(6,\), got \(6, 5\)$"),
        (lambda: policy_loss(*args, dataclasses.replace(GRPO, kl_coef=0.1)), ValueError,
         "needs ref_logp or kl"),
        (lambda: policy_loss(*args, GRPO, ref_logp=b["ref_logp"], kl=b["entropy"]), ValueError, "not both"),
        (lambda: policy_loss(*args, DR_GRPO), ValueError, "max_length"),
        (lambda: policy_loss(*args, GRPO, behavior_logp=b["behavior_logp"]), ValueError, "behavior_logp"),
        (lambda: policy_loss(*args, dataclasses.replace(GRPO, entropy_coef=0.1)), ValueError,
         "needs entropy"),
        (lambda: policy_loss(*args, GRPO, normalizer=0.0), ValueError, "normalizer must be finite and > 0"),
        (lambda: policy_loss(*args, GRPO, normalizer="3"), TypeError, "normalizer"),
        (lambda: policy_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"].double() * 2, GRPO),
         ValueError, "mask must contain only 0 and 1"),
        (lambda: policy_loss(b["logp"][0], b["old_logp"][0], b["advantages"], b["mask"][0], GRPO), ValueError,
         "logp must be 2-D"),
        (lambda: policy_loss(b["logp"].long(), b["old_logp"], b["advantages"], b["mask"], GRPO), TypeError,
         "logp must be a floating-point tensor"),
    ]
    nan_logp = b["logp"].clone()
    nan_logp[b["mask"]] = torch.where(torch.arange(int(b["mask"].sum())) == 0, float("nan"), 0.0).double()
    cases.append((lambda: policy_loss(nan_logp, *args[1:], GRPO), ValueError, "logp contains NaN or inf"))
    nan_adv = b["advantages"].clone()
    nan_adv[0] = float("inf")
    cases.append((lambda: policy_loss(b["logp"], b["old_logp"], nan_adv, b["mask"], GRPO), ValueError,
                  "advantages contains NaN or inf"))
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    # NaN / inf at masked positions (and in the advantage of an all-masked row) are ignored
    masked_nan = b["logp"].clone()
    masked_nan[~b["mask"]] = float("nan")
    adv = b["advantages"].clone()
    adv[1] = float("nan")  # row 1 is all-masked
    loss, _ = policy_loss(masked_nan, b["old_logp"], adv, b["mask"], GRPO)
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"ratio": "tokens"}, "variant.ratio"), ({"gate": "soft"}, "variant.gate"),
     ({"aggregation": "mean"}, "variant.aggregation"), ({"eps_low": 1.0}, "eps_low must be < 1"),
     ({"eps_high": -0.1}, "eps_high must be >= 0"), ({"dual_clip": 1.0}, "dual_clip must be > 1"),
     ({"dual_clip": 1.1}, "dual_clip must be >= 1 \\+ eps_high"), ({"tau_pos": 0.0}, "tau_pos"),
     ({"max_length": 0}, "max_length"), ({"kl_coef": -1.0}, "kl_coef"),
     ({"kl_estimator": "k4"}, "kl_estimator"),
     ({"behavior_correction": "clip"}, "behavior_correction"), ({"behavior_cap": 0.0}, "behavior_cap"),
     ({"eps_low": float("nan")}, "eps_low must be a finite real"),
     ({"gate": "sapo", "dual_clip": 3.0}, "dual_clip")],
)
def test_variant_rejects_bad_fields(fields, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PPO, **fields)


def test_device_follows_the_input():
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available (CI has no GPU)")
    batch = {k: x.to("cuda") for k, x in _random_batch(3).items()}
    loss, metrics = _call(GRPO, batch)
    assert loss.device == batch["logp"].device and all(x.device == loss.device for x in metrics.values())


@pytest.mark.parametrize("variant", [GSPO, GSPO_TOKEN], ids=["gspo", "gspo_token"])
def test_sequence_ratio_metrics_are_over_units(variant):
    """GSPO: units are non-empty sequences with ratio s_i; GSPO-token: tokens, each with ratio
    s_i of its row (so the mean weights rows by length); padding counts as neither."""
    batch = _random_batch(21)
    _, _, metrics = _loss_and_grad(variant, batch)
    m = batch["mask"]
    rows = m.any(dim=-1)
    log_s = ((batch["logp"] - batch["old_logp"]) * m).sum(-1)[rows] / m.sum(-1)[rows]
    s = torch.exp(log_s)
    per_unit = s if variant is GSPO else torch.repeat_interleave(s, m.sum(-1)[rows])
    assert float(metrics["ratio_mean"]) == pytest.approx(float(per_unit.mean()), rel=1e-13, abs=0.0)
    assert float(metrics["ratio_min"]) == pytest.approx(float(s.min()), rel=1e-14, abs=0.0)
    assert float(metrics["ratio_max"]) == pytest.approx(float(s.max()), rel=1e-14, abs=0.0)
    adv = batch["advantages"][rows]
    clipped = ((adv > 0) & (s > 1 + 4e-4)) | ((adv <= 0) & (s < 1 - 3e-4))
    closed = clipped.double()
    if variant is GSPO_TOKEN:
        closed = torch.repeat_interleave(closed, m.sum(-1)[rows])
    assert float(metrics["clip_fraction"]) == pytest.approx(float(closed.mean()), rel=1e-14, abs=0.0)


def test_gradients_flow_to_logp_entropy_and_kl_but_not_to_the_constants():
    batch = _random_batch(5)
    leaves = {k: batch[k].clone().requires_grad_(True)
              for k in ("logp", "old_logp", "advantages", "ref_logp", "entropy", "behavior_logp")}
    v = dataclasses.replace(GRPO, kl_coef=0.1, entropy_coef=0.2, behavior_correction="truncate")
    loss, _ = policy_loss(leaves["logp"], leaves["old_logp"], leaves["advantages"], batch["mask"], v,
                          ref_logp=leaves["ref_logp"], entropy=leaves["entropy"],
                          behavior_logp=leaves["behavior_logp"])
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = dict(zip(leaves, grads, strict=True))
    for constant in ("old_logp", "advantages", "ref_logp", "behavior_logp"):
        assert grads[constant] is None, constant
    m = batch["mask"]
    # d loss / d H[i,t] = -entropy_coef / (T_i * number of non-empty rows) on unmasked tokens
    mf = m.double()
    expected = -0.2 * mf / mf.sum(-1, keepdim=True).clamp(min=1) / float(m.any(-1).sum())
    assert torch.allclose(grads["entropy"], expected, rtol=1e-14, atol=0)
    kl = batch["entropy"].clone().requires_grad_(True)
    loss_kl, _ = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"], m,
                             dataclasses.replace(GRPO, kl_coef=0.3), kl=kl)
    (g,) = torch.autograd.grad(loss_kl, kl)
    assert torch.allclose(g, -expected / 0.2 * 0.3, rtol=1e-14, atol=0)

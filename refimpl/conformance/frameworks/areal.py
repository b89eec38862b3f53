"""Driver for the installed AReaL (1.0.4): its actor losses ``ppo_actor_loss_fn`` and ``sapo_loss_fn``
(areal/utils/functional/functional.py), called by the conformance kit as ``PPOActor``'s
``grpo_loss_fn`` and the FSDP engine call them. Its group normalisation, KL reward, whitening helper,
overlong penalty, critic loss and decoupled loss are in ``areal_kinds.py`` (``Normalization`` and
``KLEstimator`` executed from utils/data.py).

How AReaL is imported. AReaL pins torch < 2.11 and transformers <= 5.3 and its package ``__init__``
imports its whole infrastructure (aiohttp, uvloop, hydra, ...), so it is installed with
``--no-deps`` and the driver executes the one installed file it runs, ``utils/functional/functional.py``,
unchanged, as the private module ``_refimpl_areal.functional`` (``sources.load_source``). That file
imports ``RejectionSamplingConfig`` from ``areal.api.cli_args`` and ``KLEstimator`` from
``areal.utils.data`` (each pulling in the infrastructure); both serve only
``apply_rejection_sampling``: the config class as an annotation, ``KLEstimator`` for the KL metrics.
The policy-loss modes never reach it (``rejection_sampling=None``); the behaviour-correction modes
``decoupled/clamp`` and ``decoupled/mask`` (areal_kinds.py) do, with a plain config of metric 'ratio',
which uses neither name. So stand-ins serve those two names while the file executes and are removed
from ``sys.modules`` afterwards. Nothing in site-packages is edited.

What a call does. ``grpo_loss_fn`` (trainer/ppo/actor.py:408-480) calls
``ppo_actor_loss_fn(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask,
eps_clip_higher, c_clip, rejection_sampling=None, importance_sampling_level)`` or, with
``use_sapo_loss``, ``sapo_loss_fn(...)``, with per-token advantages and the bool loss mask; without
the decoupled loss the proximal log-probs are the old ones. Each returns the micro-batch's token mean
(``/ loss_mask.count_nonzero()``). The FSDP engine then scales it by ``local_weight /
total_loss_weight`` (engine/fsdp_engine.py:2062, 2120), the micro-batch's token count over the step's
count summed in float32 (engine/core/train_engine.py:54-60); the adapter applies that scaling, the only
arithmetic here that is not AReaL's own. The result is the step's global token mean (``micro_batch
"global"``), up to the float32 rounding of the weight ``n_mb / N`` (2^-24 relative), which no flag
expresses yet (``FLOAT32_WEIGHT``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import Mode, areal_kinds
from .areal_findings import AUDIT_FINDINGS, TRAINER_FINDINGS
from .areal_kinds import ADV_MODES, KIND_MODES, KIND_UNSUPPORTED
from .areal_sweep import SWEEP_FINDINGS
from .driver import find_mode
from .findings import Finding, dual_clip_tie_finding, ratio_overflow_finding
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
    stand_in,
    temporary_modules,
)

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "DISTRIBUTION",
    "MODES",
    "UNSUPPORTED",
    "PROFILE",
    "NOTES",
    "FINDINGS",
    "availability",
    "source_files",
    "loss_kwargs",
    "target",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
]

NAME = "areal"
PINNED_VERSION = "1.0.4"
DISTRIBUTION = "areal"
_PRIVATE = "_refimpl_areal"
_SOURCES = ("utils/functional/functional.py", "trainer/ppo/actor.py", "engine/fsdp_engine.py",
            "trainer/ppo/critic.py")
_INSTALL = "refimpl frameworks install areal"

# The profile (flags of conventions.Convention, as data):
# * compute_dtype "input": nothing is upcast (bf16 / fp16 log-probs give a bf16 / fp16 loss); the
#   trainer itself passes float32 log-probs (log_softmax of logits.float(), utils/functional/
#   vocab_parallel.py:18, 26; the rollout's are float32, workflow/rlvr.py:173), so this is the
#   function's behaviour on such inputs, not a dtype AReaL trains in;
# * masked_nonfinite "propagate": ppo_actor_loss_fn masks the ratio with torch.where *after* exp, so
#   a NaN / inf log-prob at a masked position makes exp's gradient NaN (0 * NaN) there, and
#   sapo_loss_fn exponentiates every position;
# * no log-ratio clamp anywhere (exp(logp - proximal_logp) as is);
# * normalizer_rounding "float32_weight": each micro-batch's token mean is weighted by
#   count_nonzero(mask_mb) / float32(sum of counts), a float32 quotient (train_engine.py:54-60,
#   fsdp_engine.py:2120): up to 2^-24 relative off the exact global token mean with micro-batches.
_COMMON = {"compute_dtype": "input", "masked_nonfinite": "propagate", "normalizer_rounding": "float32_weight",
           "ratio_overflow": "nan"}  # exp of the raw log-ratio (functional.py:509): 0 * inf = NaN

MODES = (
    Mode("ppo", preset="ppo", framework_config={"actor.eps_clip": 0.2}, convention=_COMMON,
         description="ppo_actor_loss_fn: clipped surrogate, token mean (engine: global token mean)"),
    Mode("ppo/clip-higher", preset="dapo",
         framework_config={"actor.eps_clip": 0.2, "actor.eps_clip_higher": 0.28},
         convention=_COMMON, description="eps_clip 0.2, eps_clip_higher 0.28 (DAPO's decoupled clip)"),
    Mode("ppo/dual-clip", preset="ppo", variant_overrides={"dual_clip": 3.0},
         framework_config={"actor.eps_clip": 0.2, "actor.c_clip": 3.0},
         convention={**_COMMON, "dual_clip_tie": "half"},
         description="dual clip c_clip 3.0: min(loss, sign(A) c A) = c |A| for A < 0"),
    Mode("gspo", preset="gspo",
         framework_config={"actor.eps_clip": 3e-4, "actor.eps_clip_higher": 4e-4,
                           "actor.importance_sampling_level": "sequence"},
         convention={**_COMMON, "fixed_aggregation": "token_mean"},
         description="importance_sampling_level='sequence': exp(mean log-ratio) with its exact gradient, "
         "advantages averaged per row, token mean over the step (rows weighted by their length; GSPO's "
         "seq_mean weighs each row 1 / N)"),
    Mode("sapo", preset="sapo",
         framework_config={"actor.use_sapo_loss": True, "actor.sapo_tau_pos": 1.0,
                           "actor.sapo_tau_neg": 1.05},
         convention={**_COMMON, "fixed_aggregation": "token_mean"},
         description="sapo_loss_fn: sigmoid gates 4/tau sigmoid(tau (r - 1)), token mean (the SAPO preset's "
         "seq_mean_token_mean is not an option)"),
    *ADV_MODES,
)

UNSUPPORTED = {
    "policy_loss": {
        "use_decoupled_loss / prox_logp_method": "needs the behaviour log-probs, which the policy-loss cases "
        "do not carry: driven as the behavior_correction kind (modes decoupled/...). With the shipped "
        "rejection_sampling=None the decoupled loss applies no pi_prox / pi_behave weight at all "
        "(functional.py:535-539 weighs only under rejection sampling): mode "
        "decoupled/rejection_sampling=None, "
        "flag behavior_weight='dropped'. prox_logp_method='loglinear' interpolates pi_prox between the "
        "behaviour and the current log-probs instead of recomputing it (finding prox_logp_loglinear).",
        "rejection_sampling (mask / clamp, token / sequence)": "token-level mask and clamp on the ratio are "
        "driven as the behavior_correction kind; sequence level and the KL metrics are not (the weight's "
        "level against the ratio's: finding rejection_sampling_level; metric 'kl_k3' filters on 1/r - 1 + "
        "log r where its help says r - log r - 1: finding rejection_kl_metric; a non-finite log-ratio "
        "becomes weight 1: finding rejection_nonfinite_weight; a ratio band with lower >= 1 rejects the "
        "on-policy tokens, and the filter acts without use_decoupled_loss although the start-up warning "
        "says it is ignored: finding config:rejection_sampling_lower).",
        "m2_threshold (M2PO)": "masks tokens by a second-moment rule over behaviour log-probs; no spec "
        "variant (its token count against the engine's weight: finding m2po_normalizer; without "
        "use_decoupled_loss the proximal log-probs are the old ones and it masks nothing: finding "
        "config:m2_threshold_coupled).",
        "sapo with importance_sampling_level='sequence'": "a sequence ratio under the sigmoid gate is not a "
        "preset.",
        "teacher_logp (KDRL)": "a distillation term against a teacher's log-probs; no spec variant. With "
        "rl_loss_weight != 0 it is k1 = logp - teacher_logp used as a loss term, zero expected gradient "
        "(finding distill_k1_loss); with 0, a per-token reward without return-to-go (finding "
        "distill_per_token_reward); a negative distill_loss_weight is accepted and drives the policy "
        "away from the teacher (finding config:distill_loss_weight).",
        "KL": "AReaL puts its KL into the rewards (kl_ctl * KLEstimator in compute_advantages), never into "
        "the actor loss; kl_estimator 'k2' / 'k3' are accepted for that reward, where only k1's "
        "score-function gradient is the KL's (finding config:kl_estimator).",
        "entropy and the logged statistics": "grpo_loss_fn detaches the entropy and only logs it "
        "(actor.py:434): no entropy term to drive; a logit of -inf makes the logged entropy NaN (finding "
        "entropy_masked_logit), and the logged approx_kl is log pi_theta - log pi_prox, minus the k1 "
        "estimate (finding approx_kl_sign). Under rejection_sampling 'mask' the logged importance_weight "
        "counts each rejected token as a ratio of 0 (finding importance_weight_rejected) and "
        "rs_filtered_fraction is an unweighted mean over micro-batches (finding rs_filtered_fraction_mean); "
        "with overlong_reward_penalty the logged task_reward is the penalised one (finding "
        "task_reward_overlong).",
        "actor.temperature": "the cases carry log-probs, not logits; the trainer's log-probs divide the "
        "logits by actor.temperature, the rollout samples at gconfig.temperature, and nothing compares the "
        "two (finding config:temperature).",
    },
    "kl": {
        "KLEstimator": "its estimates shape the reward (actor.py:202), not a differentiated loss term: "
        "driven "
        "as the kl_reward kind (modes KLEstimator/...).",
    },
    "group_advantages": {
        "mean_level / std_level 'batch'": "a batch statistic, not a group estimator (advantages.md eq. (14) "
        "is TRL's batch std of the raw rewards).",
        "mean_leave1out with std_level set": "the std is taken about each element's leave-one-out mean, "
        "so RLOO's n / (n - 1) cancels (finding adv_leave_one_out_std); no flag expresses that std.",
        "mean_level None with std_level set": "the std is the root mean square about 0 (finding "
        "adv_std_uncentred); no flag expresses it.",
        "mean_level 'batch' with std_level 'group'": "each group's std is taken about the batch mean, not "
        "the group's own (finding adv_std_batch_mean); no flag expresses it.",
        "eps <= 0, mean_leave1out without a mean": "NormConfig accepts both: eps 0 gives NaN for a group "
        "of equal rewards, a negative eps can flip the advantages (finding config:norm_eps); mean_leave1out "
        "with mean_level None does nothing (finding config:mean_leave1out).",
    },
}


# preset -> the mode whose flags are ``--convention areal --preset P``
PROFILE = {"ppo": ("ppo",), "bnpo": ("ppo",), "dapo": ("ppo/clip-higher",), "gspo": ("gspo",),
           "sapo": ("sapo",)}


#: Departures AReaL would likely want to change (the matrix lists them with the modes that show them).
FINDINGS = (
    dual_clip_tie_finding("utils/functional/functional.py:530", "pg_loss = torch.min(pg_loss, pg_loss3)",
                          "areal 1.0.4"),
    ratio_overflow_finding("utils/functional/functional.py:509",
                           "ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)",
                           "areal 1.0.4"),
    Finding(
        "behavior_weight", "bug",
        "with use_decoupled_loss=True and the shipped rejection_sampling=None, ppo_actor_loss_fn takes the "
        "ratio against pi_prox but applies no pi_prox / pi_behave weight (the weight is multiplied in only "
        "under rejection sampling): the decoupled objective without its behaviour correction "
        "(policy_losses.md eq. (13)). Nothing a user reads says so: use_decoupled_loss's help is 'Use the "
        "decoupled loss' (cli_args.py:1552), rejection_sampling's says None 'disables filtering' "
        "(cli_args.py:1559) and the start-up warning that 'staleness filtering is disabled' (:1623-1634); "
        "the weight is dropped, not only the filter. Stale tokens (w = e^0.5, e^-0.3): -0.5, -0.5 where "
        "the decoupled loss gives -0.824, -0.370.",
        where="utils/functional/functional.py:535", quote="if rejection_sampling is not None:",
        affected="areal 1.0.4",
        upstream="https://github.com/areal-project/AReaL/pull/1088 (merged: made rejection_sampling=None the "
        "default and added the start-up warning; it does not mention the dropped weight)",
    ),
    Finding(
        "config:c_clip", "validation",
        "ppo_actor_loss_fn asserts only c_clip > 1: a dual clip inside the clip band (c_clip < 1 + "
        "eps_high, eps_high being eps_clip_higher or, when that is None, eps_clip; e.g. 1.1 with eps_clip "
        "0.2) is accepted and clips A < 0 tokens that PPO's own clip leaves alone (the dual clip needs "
        "c >= 1 + eps_high, policy_losses.md eq. (7); c = 1 + eps_high itself is allowed).",
        where="utils/functional/functional.py:527", quote="assert c_clip > 1.0, c_clip",
        affected="areal 1.0.4",
    ),
    Finding(
        "adv_weighting", "bug",
        "adv_norm normalises the per-token advantages with the loss mask (trainer/ppo/actor.py:238-239), so "
        "Normalization's group mean and std count tokens: a response of T tokens weighs T in its group's "
        "baseline and std (GRPO's statistics are over responses). T = (3, 1), R = (1, 0), the default "
        "std_unbiased: (0.5, -1.5) instead of (0.707, -0.707); mean only: (0.25, -0.75) instead of (0.5, "
        "-0.5).",
        where="utils/data.py:1520", quote="x_masked = x * mask", affected="areal 1.0.4",
        function="_compute_mean",
    ),
    Finding(
        "adv_leave_one_out_unit", "bug",
        "with mean_leave1out on the per-token advantages, the baseline is (sum - x) / (count - mask) over "
        "the "
        "group's tokens: one token is left out, the rest of the response stays in its own baseline (RLOO's "
        "is the mean of the other responses). T = (3, 1), R = (1, 0): (0.333, -1.0) instead of (1, -1).",
        where="utils/data.py:1541", quote="leave_one_out_sum = x_sum_broadcast - x_masked",
        affected="areal 1.0.4",
    ),
    Finding(
        "adv_trailing_partial", "bug",
        "Normalization's group level loops over range(bs // group_size): the samples of a trailing group "
        "shorter than group_size (a batch size that is not a multiple, e.g. after dynamic filtering) keep "
        "mean 0 and std 0, so their advantage is R / eps (1e5 R with the default eps 1e-5).",
        where="utils/data.py:1424", quote="for i in range(0, bs // self.group_size):",
        affected="areal 1.0.4",
        upstream="https://github.com/areal-project/AReaL/issues/1419 (closed as stale, not fixed; fix "
        "proposed in pull request 1673, open)",
    ),
    Finding(
        "kl_reward_value_clamp", "bug",
        "KLEstimator clamps every estimate to [-10, 10] (apply_clamp defaults to True), k1 included, and the "
        "actor's KL reward is -kl_ctl times it (actor.py:202): where the policy has moved farthest from the "
        "reference (|log r| > 10 for k1, k3 > 10) the penalty stops growing.",
        where="utils/data.py:1655", quote="log_ratio = log_ratio.clamp(min=-10, max=10)",
        affected="areal 1.0.4",
    ),
    Finding(
        "whiten_one_pass_dtype", "bug",
        "masked_normalization, the whitening helper utils/functional exports (AReaL's own trainer normalises "
        "with Normalization), forms the variance in one pass, E[x^2] - E[x]^2, with eps outside the square "
        "root: float64 advantages 1e8 +- 1 give var 0 and +-inf (eps 0) or +-1e5 (eps 1e-5) instead of +-1, "
        "and a constant float64 batch of 0.1 a slightly negative var and NaN (the spec's two-pass form, "
        "advantages.md eq. (21), gives 0).",
        where="utils/functional/functional.py:50", quote="var = meansq - mean**2", affected="areal 1.0.4",
    ),
    Finding(
        "overlong_floor", "bug",
        "reward_overlong_penalty adds min(-(L - (max_new_tokens - overlong_tokens)) / overlong_tokens * "
        "factor, 0) to the reward with no floor: a response longer than max_new_tokens (a multi-turn "
        "rollout, a "
        "budget mismatch) gets less than -factor, -3 at L = 30 with max_new_tokens 20, overlong_tokens 5 "
        "(DAPO's soft punishment is -1 beyond the budget, advantages.md eq. (8)).",
        where="utils/functional/functional.py:797", quote="overlong_reward = min(", affected="areal 1.0.4",
    ),
    Finding(
        "fixed_aggregation", "bug",
        "ppo_actor_loss_fn and sapo_loss_fn always return the token mean (no aggregation option): GSPO "
        "(importance_sampling_level='sequence') and SAPO weigh each row by its length, where GSPO's "
        "seq_mean weighs each row 1 / N (d/d logp = -A / (N T_i)) and the SAPO preset is "
        "seq_mean_token_mean. T = (3, 1), A = 1, ratio 1: -0.25 on every token instead of -1/6 and -1/2.",
        where="utils/functional/functional.py:542",
        quote="pg_loss = torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count",
        affected="areal 1.0.4", function="ppo_actor_loss_fn",
        upstream="https://github.com/areal-project/AReaL/issues/1423 (filed as a feature request, closed as "
        "stale; pull request 1546 adds the option, open)",
    ),
)


FINDINGS += TRAINER_FINDINGS  # PPOActor's KL reward, EOS test, M2PO count, RS level (areal_findings.py)
FINDINGS += AUDIT_FINDINGS  # issue 27's audit: reward position, RS metric, Normalization, distillation, ...
FINDINGS += SWEEP_FINDINGS  # a sweep: settings accepted out of range or ignored, two logged values

NOTES: dict[str, str] = {}


# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code the driver runs or follows; [] when absent."""
    return installed_files("areal", _SOURCES)


@functools.cache
def _functional():
    """``utils/functional/functional.py`` executed from the installed file (module docstring)."""
    root = package_dir("areal")
    if root is None:
        raise ModuleNotFoundError(f"AReaL is not installed ({_INSTALL})")
    private_package(_PRIVATE)

    class _Unused:
        """Stands in for a name the driven losses never call (an annotation; rejection sampling's KL
        metrics, which no mode drives)."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError("rejection sampling's config class and KL metrics are not driven by refimpl's "
                               "AReaL driver")

    stand_ins = {
        "areal.api.cli_args": stand_in("areal.api.cli_args", RejectionSamplingConfig=_Unused),
        "areal.utils.data": stand_in("areal.utils.data", KLEstimator=_Unused),
    }
    with temporary_modules(stand_ins, only_if_missing=False):
        return load_source(f"{_PRIVATE}.functional", root / _SOURCES[0])


def availability() -> str | None:
    """None when AReaL's actor loss can be driven, else a one-line reason."""
    return load_failure("areal", _INSTALL, _functional)


# ----------------------------------------------------------------------------------------------
# Modes


def loss_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """Keyword arguments of ``ppo_actor_loss_fn`` / ``sapo_loss_fn`` that run ``variant`` in ``mode``
    (ValueError for a variant AReaL cannot express there)."""
    m = find_mode(MODES, mode, "AReaL")
    v = variant
    m.check_shape(v, "AReaL")
    if v.kl_coef > 0 or v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.kl_coef / entropy_coef / behavior_correction: not in AReaL's actor loss")
    if v.gate == "sapo":
        return {"tau_pos": v.tau_pos, "tau_neg": v.tau_neg, "importance_sampling_level": "token"}
    if v.eps_low is None or v.eps_high is None:
        raise ValueError("variant.eps_low / eps_high: AReaL's ppo_actor_loss_fn clips on both sides")
    return {
        "eps_clip": v.eps_low,
        "eps_clip_higher": None if v.eps_high == v.eps_low else v.eps_high,
        "c_clip": v.dual_clip,
        "importance_sampling_level": "sequence" if v.ratio == "sequence_mean" else "token",
    }


# ----------------------------------------------------------------------------------------------
# Target


def _engine_scale(call, token_normalizer: bool):
    """``local_weight / total_loss_weight`` of the FSDP engine for the call's micro-batch: its token
    count (int64) over the step's count as a float32 tensor (a quotient in float32). The step's token
    count is the kit's normaliser when the checked variant is a token mean (a golden vector's larger
    batch), else the batch's tokens: the engine counts tokens whatever the preset aggregates."""
    import torch

    local = call.mask.count_nonzero()
    total = getattr(call, "global_tokens", 0) or int(call.mask.sum())
    if call.normalizer is not None and token_normalizer:
        total = call.normalizer
    return local, local / torch.tensor(float(total), dtype=torch.float32, device=call.mask.device)


def _policy_target(m: Mode, variant) -> tuple[Callable, Callable]:
    module = _functional()
    kwargs = loss_kwargs(m, variant)
    sapo = variant.gate == "sapo"
    fn = module.sapo_loss_fn if sapo else module.ppo_actor_loss_fn

    def adapter(fn, call):
        advantages = call.advantages
        if advantages.ndim == 1:  # AReaL's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        mask = call.mask.bool()
        if sapo:
            loss, _stat = fn(logprobs=call.logp, old_logprobs=call.old_logp, advantages=advantages,
                             loss_mask=mask, **kwargs)
        else:  # without the decoupled loss the proximal log-probs are the old ones (actor.py:178-191)
            loss, _stat = fn(logprobs=call.logp, proximal_logprobs=call.old_logp, old_logprobs=call.old_logp,
                             advantages=advantages, loss_mask=mask, rejection_sampling=None, **kwargs)
        local, scale = _engine_scale(call, variant.aggregation == "token_mean")
        if local == 0:  # _compute_logprobs_and_loss: a micro-batch without tokens contributes 0 * logits
            return call.logp.sum() * 0.0
        return loss * scale

    adapter.scaled_for_accumulation = True
    return fn, adapter


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is AReaL's ``ppo_actor_loss_fn`` (``sapo_loss_fn`` for sapo) and
    ``adapter(fn, call)`` its micro-batch loss scaled as the FSDP engine scales it."""
    if mode.kind == "group_advantages":
        return areal_kinds.advantage_target(mode)
    if mode.kind != "policy_loss":
        raise ValueError(f"AReaL has no {mode.kind} mode in scope: {UNSUPPORTED[mode.kind]}")
    return _policy_target(mode, variant)


# ----------------------------------------------------------------------------------------------
# Outside the actor loss (areal_kinds.py): group advantages, the KL reward, the registry's kinds


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` of a registry-kind mode (``areal_kinds.kind_target``)."""
    return areal_kinds.kind_target(mode, _functional())
